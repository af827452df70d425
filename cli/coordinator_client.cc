#include "cli/coordinator_client.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/interrupt.h"
#include "common/clock.h"
#include "common/coordinator_endpoints.h"
#include "common/grpc_credentials.h"
#include "common/rpc_status.h"
#include "common/secrets.h"
#include "common/tls_credentials.h"
#include "worker/agent/coordinator_channel.h"

namespace pipetrain {

grpc::ChannelArguments CoordinatorClientChannelArguments() { return CoordinatorChannelArguments(); }

std::unique_ptr<v1::CoordinatorService::Stub> ConnectCoordinator(const std::string& address,
                                                                 const std::string& tls_ca,
                                                                 const std::string& user_token) {
  // A CA that cannot be read must not fall back to plaintext: TLS with the
  // system's roots then fails to verify our coordinator.
  return ConnectCoordinator(address,
                            ClientTlsCredentials(tls_ca, "", "")
                                .value_or(grpc::SslCredentials(grpc::SslCredentialsOptions())),
                            user_token);
}

namespace {

using Stub = v1::CoordinatorService::Stub;
using StubFactory = std::function<std::unique_ptr<Stub>(const std::string&)>;

StubFactory StubsWith(const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                      const std::string& user_token) {
  return [credentials, user_token](const std::string& one) {
    return v1::CoordinatorService::NewStub(
        BearerChannel(one, credentials, CoordinatorClientChannelArguments(), user_token));
  };
}

// The leader among `addresses` (two or more), within `timeout`
// (FindCoordinator's contract). A follower refuses at once, naming it (a
// name not in `addresses` is ignored, as CoordinatorEndpoints does; a
// leader still loading its state names itself, and is asked again); any
// other answer (even NOT_FOUND for this empty id) comes from the leader; a
// coordinator that does not answer is skipped. As CoordinatorEndpoints
// does: after a named leader that does not answer comes the address after
// it in the list, not the one that named it.
absl::StatusOr<std::unique_ptr<Stub>> FindLeader(const std::vector<std::string>& addresses,
                                                 const StubFactory& connect,
                                                 absl::Duration timeout) {
  const absl::Time give_up = MonotonicClock()->Now() + timeout;
  const absl::Duration each = timeout / static_cast<int64_t>(addresses.size());
  std::string candidate = addresses.front();
  size_t at = 0;        // where the round robin stands in addresses
  bool silent = false;  // a coordinator let its probe's deadline pass
  std::string last;     // the last refusal, "address: message"
  size_t tries = 0;
  do {
    auto stub = connect(candidate);
    auto context = WithDeadline(std::min(each, give_up - MonotonicClock()->Now()));
    v1::GetJobRequest probe;
    v1::Job job;
    grpc::Status s;
    {
      const CancelOnInterrupt cancel(context.get());  // Ctrl-C ends the search at once
      s = stub->GetJob(context.get(), probe, &job);
    }
    if (Interrupted()) return absl::CancelledError("interrupted while looking for the leader");
    // A coordinator that is stopping ends calls CANCELLED: not the leader
    // to send the command to (Ctrl-C was checked above).
    if (!CoordinatorOutcomeUnknown(ToAbsl(s))) return stub;
    silent = silent || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    last = absl::StrCat(candidate, ": ", s.error_message());
    // Only a listed leader: whoever answers on a listed address must not
    // be able to send the user token anywhere else.
    const std::string leader = ListedLeaderHint(*context, addresses);
    if (leader == candidate) {
      // It named itself: it leads, still loading its state. Asked again
      // after a pause; the others would only name it.
      absl::SleepFor(std::min(absl::Milliseconds(200), give_up - MonotonicClock()->Now()));
      continue;
    }
    if (!leader.empty()) {
      at = std::find(addresses.begin(), addresses.end(), leader) - addresses.begin();
      candidate = leader;
    } else {
      at = (at + 1) % addresses.size();
      candidate = addresses[at];
    }
    if (++tries % addresses.size() == 0) {  // a round: let a takeover proceed
      absl::SleepFor(std::min(absl::Milliseconds(200), give_up - MonotonicClock()->Now()));
    }
  } while (MonotonicClock()->Now() < give_up && !Interrupted());
  if (Interrupted()) return absl::CancelledError("interrupted while looking for the leader");
  const std::string why =
      absl::StrCat("no coordinator of ", absl::StrJoin(addresses, ", "), " led within ",
                   absl::FormatDuration(timeout), " (--timeout); the last refusal: ", last);
  return silent ? absl::DeadlineExceededError(why) : absl::UnavailableError(why);
}

}  // namespace

absl::StatusOr<std::unique_ptr<v1::CoordinatorService::Stub>> FindCoordinator(
    const std::string& flag, const std::string& address,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials, const std::string& user_token,
    absl::Duration timeout) {
  absl::StatusOr<std::vector<std::string>> addresses = ParseCoordinatorAddresses(flag, address);
  if (!addresses.ok()) return addresses.status();
  const StubFactory connect = StubsWith(credentials, user_token);
  if (addresses->size() == 1) return connect(addresses->front());
  return FindLeader(*addresses, connect, timeout);
}

std::unique_ptr<v1::CoordinatorService::Stub> ConnectCoordinator(
    const std::string& address, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    const std::string& user_token) {
  absl::StatusOr<std::unique_ptr<Stub>> found =
      FindCoordinator("address", address, credentials, user_token, absl::Seconds(10));
  if (found.ok()) return *std::move(found);
  // No leader (its calls will say so), or not a list: as given.
  absl::StatusOr<std::vector<std::string>> addresses =
      ParseCoordinatorAddresses("address", address);
  return StubsWith(credentials, user_token)(addresses.ok() ? addresses->front() : address);
}

absl::StatusOr<std::string> UserTokenFrom(const std::string& token_file) {
  if (!token_file.empty()) return ReadSecretFile("--token-file", token_file);
  const char* env = std::getenv("PIPETRAIN_TOKEN");
  if (env == nullptr || *env == '\0') return std::string();
  return CheckedSecret("PIPETRAIN_TOKEN", env);
}

std::unique_ptr<grpc::ClientContext> WithDeadline(absl::Duration timeout) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return context;
}

absl::Status ToAbsl(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

bool CoordinatorOutcomeUnknown(const absl::Status& status) {
  return OutcomeUnknown(status) || status.code() == absl::StatusCode::kCancelled;
}

absl::StatusOr<v1::Job> SubmitWithRetries(
    const std::function<absl::StatusOr<v1::Job>()>& submit, int attempts, absl::Duration backoff,
    const std::function<void(const absl::Status&, int, absl::Duration)>& on_retry,
    const std::function<bool(absl::Duration)>& wait) {
  for (int attempt = 1;; ++attempt) {
    absl::StatusOr<v1::Job> job = submit();
    if (job.ok() || !CoordinatorOutcomeUnknown(job.status()) || attempt >= attempts) return job;
    on_retry(job.status(), attempt, backoff);
    if (!wait(backoff)) return job;
    backoff *= 2;
  }
}

}  // namespace pipetrain
