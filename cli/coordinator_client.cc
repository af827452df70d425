#include "cli/coordinator_client.h"

#include <algorithm>
#include <cstdlib>

#include "common/coordinator_endpoints.h"
#include "common/grpc_credentials.h"
#include "common/secrets.h"
#include "common/tls_credentials.h"

namespace pipetrain {

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

std::unique_ptr<v1::CoordinatorService::Stub> ConnectCoordinator(
    const std::string& address, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    const std::string& user_token) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto connect = [&](const std::string& one) {
    return v1::CoordinatorService::NewStub(BearerChannel(one, credentials, args, user_token));
  };
  absl::StatusOr<std::vector<std::string>> addresses =
      ParseCoordinatorAddresses("--coordinator", address);
  if (!addresses.ok() || addresses->size() == 1) return connect(address);
  // Several coordinators: find the leader. A follower refuses at once,
  // naming it; any other answer (even NOT_FOUND for this empty id) comes
  // from the leader; a coordinator that does not answer is skipped. During
  // a takeover none may answer for a moment: rounds repeat for up to 10 s.
  // As CoordinatorEndpoints does: after a named leader that does not answer
  // comes the address after it in the list, not the one that named it.
  std::string candidate = addresses->front();
  size_t at = 0;  // where the round robin stands in *addresses
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  for (size_t tries = 0; absl::Now() < give_up; ++tries) {
    auto stub = connect(candidate);
    auto context = WithDeadline(absl::Seconds(3));
    v1::GetJobRequest probe;
    v1::Job job;
    const grpc::Status s = stub->GetJob(context.get(), probe, &job);
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE &&
        s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      return stub;
    }
    const std::string leader = LeaderHint(*context);
    if (!leader.empty() && leader != candidate) {
      const auto listed = std::find(addresses->begin(), addresses->end(), leader);
      if (listed != addresses->end()) at = listed - addresses->begin();
      candidate = leader;
    } else {
      at = (at + 1) % addresses->size();
      candidate = (*addresses)[at];
    }
    if ((tries + 1) % addresses->size() == 0) absl::SleepFor(absl::Milliseconds(200));
  }
  return connect(candidate);  // none answered: its calls will say so
}

absl::StatusOr<std::string> UserTokenFrom(const std::string& token_file) {
  if (!token_file.empty()) return ReadSecretFile("--token-file", token_file);
  const char* env = std::getenv("PIPETRAIN_TOKEN");
  return std::string(env != nullptr ? env : "");
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

}  // namespace pipetrain
