// What CoordinatorEndpoints logs as it moves between coordinators: the
// round robin's moves once a minute, a move to a named leader each time.
// (How it follows the leader: coordinator/api/leader_following_test.cc.)
#include "common/coordinator_endpoints.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/annotated_mutex.h"
#include "common/clock.h"

namespace pipetrain {
namespace {

// Never called: only the channels' addresses matter to these tests, and
// gRPC connects a channel only when a call is made on it.
constexpr char kSilent[] = "127.0.0.1:1";

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
}

int Occurrences(absl::string_view log, absl::string_view line) {
  int n = 0;
  for (size_t at = log.find(line); at != absl::string_view::npos; at = log.find(line, at + 1)) {
    ++n;
  }
  return n;
}

// Refuses every call of any method as a follower does: UNAVAILABLE,
// naming `leader` in the trailing metadata.
class Follower final : public grpc::CallbackGenericService {
 public:
  explicit Follower(std::string leader) : leader_(std::move(leader)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterCallbackGenericService(this);
    server_ = builder.BuildAndStart();
  }
  ~Follower() override { server_->Shutdown(); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    context->AddTrailingMetadata(kLeaderMetadataKey, leader_);
    return new Refusal;
  }

 private:
  // Finishes at once; deletes itself when gRPC is done with it.
  class Refusal final : public grpc::ServerGenericBidiReactor {
   public:
    Refusal() { Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "this one follows")); }
    void OnDone() override { delete this; }
  };

  const std::string leader_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// One unary call on `channel`: its status, and its context (the trailers).
struct Outcome {
  grpc::Status status;
  std::unique_ptr<grpc::ClientContext> context = std::make_unique<grpc::ClientContext>();
};

Outcome Call(const std::shared_ptr<grpc::Channel>& channel) {
  Outcome out;
  out.context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::GenericStub stub(channel);
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1), response;
  AnnotatedMutex mu;  // a hand-off TSan sees (absl::Notification's it does not)
  bool done = false;
  stub.UnaryCall(out.context.get(), "/pipetrain.v1.CoordinatorService/GetJob", {}, &request,
                 &response, [&](grpc::Status s) {
                   AnnotatedMutexLock lock(&mu);
                   out.status = std::move(s);
                   done = true;
                 });
  AnnotatedMutexLock lock(&mu);
  mu.AwaitWithTimeout([&] { return done; }, absl::InfiniteDuration());
  return out;
}

// Every listed coordinator out of reach: each failed call moves on to the
// next address, and each such move was a line (two a heartbeat interval
// on every worker). Logged once a minute, saying how many were not.
TEST(CoordinatorEndpointsTest, Failed_EveryAddressOutOfReach_RoundRobinLoggedOnceAMinute) {
  FakeClock clock;
  CoordinatorEndpoints endpoints({"127.0.0.1:1", "127.0.0.1:2"}, MakeChannel, &clock);
  const grpc::Status unavailable(grpc::StatusCode::UNAVAILABLE, "connection refused");
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 10; ++i) {
    grpc::ClientContext context;  // no trailers: no leader named
    EXPECT_FALSE(endpoints.Failed(unavailable, context, endpoints.channel()));
    EXPECT_EQ(endpoints.current(), i % 2 == 0 ? "127.0.0.1:2" : "127.0.0.1:1");
  }
  clock.Advance(absl::Seconds(61));
  grpc::ClientContext context;
  endpoints.Failed(unavailable, context, endpoints.channel());
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(Occurrences(log, "is not the leader or does not answer"), 2) << log;
  EXPECT_TRUE(absl::StrContains(log,
                                "coordinator 127.0.0.1:1 is not the leader or does not answer; "
                                "using 127.0.0.1:2 (logged at most once a minute)\n"))
      << log;
  EXPECT_TRUE(absl::StrContains(log,
                                "coordinator 127.0.0.1:1 is not the leader or does not answer; "
                                "using 127.0.0.1:2 (logged at most once a minute) (9 similar "
                                "messages not logged)"))
      << log;
}

// A move to the leader a follower named is rare and says where the calls
// went: logged each time, whatever the round robin's lines were.
TEST(CoordinatorEndpointsTest, Failed_ALeaderNamed_LoggedEachTime) {
  FakeClock clock;
  Follower follower(kSilent);
  CoordinatorEndpoints endpoints({follower.address(), kSilent}, MakeChannel, &clock);
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 3; ++i) {
    std::shared_ptr<grpc::Channel> channel = endpoints.channel();
    Outcome refused = Call(channel);
    ASSERT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_TRUE(endpoints.Failed(refused.status, *refused.context, channel));
    ASSERT_EQ(endpoints.current(), kSilent);
    // The named leader does not answer either: back to the follower.
    grpc::ClientContext silent;
    EXPECT_FALSE(endpoints.Failed(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "no answer"),
                                  silent, endpoints.channel()));
    ASSERT_EQ(endpoints.current(), follower.address());
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(Occurrences(
                log, absl::StrCat("coordinator ", follower.address(), " is not the leader; using ",
                                  kSilent, ", the leader it named\n")),
            3)
      << log;
  EXPECT_EQ(Occurrences(log, "is not the leader or does not answer"), 1) << log;
}

}  // namespace
}  // namespace pipetrain
