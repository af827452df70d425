// FindCoordinator: finding the leader among highly available coordinators,
// against canned gRPC servers on loopback.
#include "cli/coordinator_client.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/annotated_mutex.h"
#include "common/coordinator_endpoints.h"
#include "common/secrets.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// Finishes at once; deletes itself when gRPC is done with it.
class Answer final : public grpc::ServerGenericBidiReactor {
 public:
  explicit Answer(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

// Answers every call of any method with `status`, naming `leader` in the
// trailing metadata when given (as a follower does); counts the calls.
class Canned final : public grpc::CallbackGenericService {
 public:
  Canned(grpc::Status status, std::string leader)
      : status_(std::move(status)), leader_(std::move(leader)) {}
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    calls_.fetch_add(1);
    if (!leader_.empty()) context->AddTrailingMetadata(kLeaderMetadataKey, leader_);
    return new Answer(status_);
  }
  int calls() const { return calls_.load(); }

 private:
  const grpc::Status status_;
  const std::string leader_;
  std::atomic<int> calls_{0};
};

// A Canned service on a loopback port of its own.
class Server {
 public:
  Server(grpc::Status status, std::string leader) : service_(std::move(status), std::move(leader)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterCallbackGenericService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~Server() { server_->Shutdown(); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int calls() const { return service_.calls(); }

 private:
  Canned service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// A newly elected leader still loading its state, as FollowerService
// answers for it: every call refused, naming its own address; counts the
// calls.
class LoadingLeader final : public grpc::CallbackGenericService {
 public:
  LoadingLeader() {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterCallbackGenericService(this);
    server_ = builder.BuildAndStart();
    AnnotatedMutexLock lock(&mu_);
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  ~LoadingLeader() { server_->Shutdown(); }
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    calls_.fetch_add(1);
    context->AddTrailingMetadata(kLeaderMetadataKey, address());
    return new Answer(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                   "this coordinator leads and is still loading its state"));
  }
  std::string address() const {
    AnnotatedMutexLock lock(&mu_);
    return address_;
  }
  int calls() const { return calls_.load(); }

 private:
  mutable AnnotatedMutex mu_;
  std::string address_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> calls_{0};
  std::unique_ptr<grpc::Server> server_;
};

const grpc::Status kRefused(grpc::StatusCode::UNAVAILABLE, "a follower");
const grpc::Status kLeaderAnswer(grpc::StatusCode::NOT_FOUND, "no job \"\"");

absl::StatusOr<std::unique_ptr<v1::CoordinatorService::Stub>> Find(const std::string& address,
                                                                   absl::Duration timeout) {
  return FindCoordinator("--coordinator", address, grpc::InsecureChannelCredentials(), "token",
                         timeout);
}

TEST(FindCoordinatorTest, MalformedList_InvalidArgumentNamingTheFlag) {
  for (const std::string list : {"", "a:1,,b:2", ","}) {
    auto found = Find(list, absl::Seconds(1));
    EXPECT_EQ(found.status().code(), absl::StatusCode::kInvalidArgument) << list;
    EXPECT_EQ(found.status().message(),
              absl::StrCat("--coordinator: \"", list,
                           "\" has an empty address (a comma-separated list of host:port)"));
  }
}

// A port gRPC would wrap (99999 is 34463 to it) or read as 0 is refused
// before any call: the calls carry the user token.
TEST(FindCoordinatorTest, PortOutOfRangeOrNotANumber_InvalidArgument) {
  for (const std::string list :
       {"127.0.0.1:99999", "127.0.0.1:abc", "127.0.0.1", "127.0.0.1:0", "a:1,b:65536", "host:"}) {
    auto found = Find(list, absl::Seconds(1));
    EXPECT_EQ(found.status().code(), absl::StatusCode::kInvalidArgument) << list;
    EXPECT_NE(found.status().message().find("is not host:port with a port in [1, 65535]"),
              std::string::npos)
        << found.status();
  }
  for (const std::string list : {"::1", "fe80::1:7070", "ipv6:::1:7070"}) {
    auto found = Find(list, absl::Seconds(1));
    EXPECT_EQ(found.status().code(), absl::StatusCode::kInvalidArgument) << list;
    EXPECT_NE(found.status().message().find("an IPv6 address without brackets"), std::string::npos)
        << found.status();
  }
  for (const std::string list :
       {"127.0.0.1:1", "[::1]:65535", "a:7070, b:7071", "unix:/run/c", "dns:///c.example:7070",
        "ipv4:10.0.0.1:7070", "ipv6:[::1]:7070"}) {
    EXPECT_TRUE(ParseCoordinatorAddresses("--coordinator", list).ok()) << list;
  }
}

// PIPETRAIN_TOKEN as a Kubernetes Secret gives it, with a line end: taken
// without it. Whitespace or control characters inside are refused (gRPC
// aborts the process on such a header value); so is an oversized value.
TEST(UserTokenFromTest, EnvironmentTokenCheckedAsAFileIs) {
  const char* before = std::getenv("PIPETRAIN_TOKEN");
  const std::string saved = before != nullptr ? before : "";
  setenv("PIPETRAIN_TOKEN", "abc123\n", 1);
  EXPECT_EQ(UserTokenFrom("").value(), "abc123");
  setenv("PIPETRAIN_TOKEN", "abc123\r\n", 1);
  EXPECT_EQ(UserTokenFrom("").value(), "abc123");
  for (const std::string& bad :
       std::vector<std::string>{"abc\n123", "a\tb",
                                "a\x01"
                                "b",
                                " abc", "abc ", std::string(kMaxSecretBytes + 1, 'x')}) {
    setenv("PIPETRAIN_TOKEN", bad.c_str(), 1);
    absl::StatusOr<std::string> token = UserTokenFrom("");
    EXPECT_EQ(token.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(token.status().message(), "PIPETRAIN_TOKEN ")) << token.status();
    EXPECT_EQ(token.status().message().find(bad), std::string::npos);  // not echoed
  }
  setenv("PIPETRAIN_TOKEN", "", 1);
  EXPECT_EQ(UserTokenFrom("").value(), "");  // none: an --insecure coordinator
  if (before != nullptr) {
    setenv("PIPETRAIN_TOKEN", saved.c_str(), 1);
  } else {
    unsetenv("PIPETRAIN_TOKEN");
  }
}

// The follower names the leader; the leader (any answer but a refusal)
// is the one the stub is for.
TEST(FindCoordinatorTest, FollowerNamesAListedLeader_ItIsFollowed) {
  Server leader(kLeaderAnswer, "");
  Server follower(kRefused, leader.address());
  auto found = Find(absl::StrCat(follower.address(), ",", leader.address()), absl::Seconds(10));
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(leader.calls(), 1);
  grpc::ClientContext context;
  v1::Job job;
  (*found)->GetJob(&context, v1::GetJobRequest(), &job);
  EXPECT_EQ(leader.calls(), 2);  // the stub is the leader's
}

// A listed coordinator naming an address outside the list is not followed:
// it could be anyone's, and the calls carry the user token.
TEST(FindCoordinatorTest, FollowerNamesAnUnlistedLeader_NeverContacted) {
  Server stranger(kLeaderAnswer, "");
  Server first(kRefused, stranger.address());
  Server second(kRefused, stranger.address());
  auto found = Find(absl::StrCat(first.address(), ",", second.address()), absl::Seconds(1));
  EXPECT_EQ(found.status().code(), absl::StatusCode::kUnavailable) << found.status();
  EXPECT_EQ(stranger.calls(), 0);
  EXPECT_GE(first.calls(), 1);
  EXPECT_GE(second.calls(), 1);
}

// A coordinator that is stopping ends calls CANCELLED: it is no leader to
// send the command to, and the next address is tried.
TEST(FindCoordinatorTest, StoppingCoordinatorAnswersCancelled_TheNextIsTheLeader) {
  Server stopping(grpc::Status(grpc::StatusCode::CANCELLED, "the server is shutting down"), "");
  Server leader(kLeaderAnswer, "");
  auto found = Find(absl::StrCat(stopping.address(), ",", leader.address()), absl::Seconds(10));
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(stopping.calls(), 1);
  EXPECT_EQ(leader.calls(), 1);
  grpc::ClientContext context;
  v1::Job job;
  (*found)->GetJob(&context, v1::GetJobRequest(), &job);
  EXPECT_EQ(leader.calls(), 2);  // the stub is the leader's
  EXPECT_EQ(stopping.calls(), 1);
}

// A leader still loading its state names itself: it is asked again, and
// the followers, which would only name it, are not (they were, a round
// each time).
TEST(FindCoordinatorTest, LeaderStillLoadingNamesItself_AskedAgainNotTheFollowers) {
  LoadingLeader loading;
  Server follower(kRefused, loading.address());
  auto found = Find(absl::StrCat(loading.address(), ",", follower.address()), absl::Seconds(1));
  EXPECT_EQ(found.status().code(), absl::StatusCode::kUnavailable) << found.status();
  EXPECT_GE(loading.calls(), 2);
  EXPECT_EQ(follower.calls(), 0);
}

TEST(FindCoordinatorTest, OnlyFollowers_UnavailableNamingTheAddresses) {
  Server first(kRefused, "");
  Server second(kRefused, "");
  const std::string list = absl::StrCat(first.address(), ",", second.address());
  auto found = Find(list, absl::Milliseconds(300));
  EXPECT_EQ(found.status().code(), absl::StatusCode::kUnavailable) << found.status();
  EXPECT_EQ(found.status().message().find(absl::StrCat("no coordinator of ", first.address(), ", ",
                                                       second.address(), " led within 300ms")),
            0u)
      << found.status();
}

// A submit whose outcome is unknown (UNAVAILABLE, DEADLINE_EXCEEDED, or
// CANCELLED by a coordinator that stops) is repeated, with a doubling
// wait; one the coordinator refused is not.
TEST(SubmitWithRetriesTest, RepeatsOnlyUnknownOutcomesWithDoublingWaits) {
  std::vector<absl::Status> answers = {
      absl::UnavailableError("leader changed"), absl::DeadlineExceededError("deadline"),
      absl::CancelledError("server shutting down"), absl::OkStatus()};
  int calls = 0;
  std::vector<absl::Duration> waits;
  std::vector<int> retried_attempts;
  const auto submit = [&]() -> absl::StatusOr<v1::Job> {
    const absl::Status answer = answers[calls++];
    if (!answer.ok()) return answer;
    v1::Job job;
    job.set_id("job-1");
    return job;
  };
  const auto on_retry = [&](const absl::Status&, int attempt, absl::Duration) {
    retried_attempts.push_back(attempt);
  };
  const auto wait = [&](absl::Duration d) {
    waits.push_back(d);
    return true;
  };
  absl::StatusOr<v1::Job> job = SubmitWithRetries(submit, 5, absl::Seconds(1), on_retry, wait);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->id(), "job-1");
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(waits,
            (std::vector<absl::Duration>{absl::Seconds(1), absl::Seconds(2), absl::Seconds(4)}));
  EXPECT_EQ(retried_attempts, (std::vector<int>{1, 2, 3}));

  // Refused: answered at once.
  calls = 0;
  waits.clear();
  answers = {absl::InvalidArgumentError("spec.model"), absl::OkStatus()};
  EXPECT_EQ(SubmitWithRetries(submit, 5, absl::Seconds(1), on_retry, wait).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(waits.empty());

  // Out of attempts: the last failure.
  calls = 0;
  answers = {absl::UnavailableError("a"), absl::UnavailableError("b"), absl::UnavailableError("c")};
  const absl::Status last = SubmitWithRetries(submit, 3, absl::Seconds(1), on_retry, wait).status();
  EXPECT_EQ(last.message(), "c");
  EXPECT_EQ(calls, 3);

  // A wait that gives up (Ctrl-C): no further call.
  calls = 0;
  answers = {absl::UnavailableError("a"), absl::OkStatus()};
  const absl::Status stopped =
      SubmitWithRetries(submit, 5, absl::Seconds(1), on_retry, [](absl::Duration) {
        return false;
      }).status();
  EXPECT_EQ(stopped.message(), "a");
  EXPECT_EQ(calls, 1);
}

// A coordinator back after an outage is reached within 2 s: the channel's
// reconnect backoff stays under that (gRPC's own grows to 2 minutes), and
// its calls keep the 64 MiB answers.
TEST(CoordinatorClientChannelArgumentsTest, ReconnectBackoffCappedAt2Seconds) {
  grpc_channel_args raw;
  const grpc::ChannelArguments args = CoordinatorClientChannelArguments();
  args.SetChannelArgs(&raw);
  std::map<std::string, int> ints;
  for (size_t i = 0; i < raw.num_args; ++i) {
    if (raw.args[i].type == GRPC_ARG_INTEGER) ints[raw.args[i].key] = raw.args[i].value.integer;
  }
  ASSERT_EQ(ints.count(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS), 1u);
  EXPECT_LE(ints[GRPC_ARG_MAX_RECONNECT_BACKOFF_MS], 2000);
  ASSERT_EQ(ints.count(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS), 1u);
  EXPECT_LE(ints[GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS], 2000);
  EXPECT_EQ(ints[GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH], 64 << 20);
}

}  // namespace
}  // namespace pipetrain
