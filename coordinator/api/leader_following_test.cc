// How a client of highly available coordinators follows the leader
// (common/coordinator_endpoints.h) when coordinators refuse (FollowerService)
// or are dead, over real gRPC on loopback.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/annotated_mutex.h"
#include "common/coordinator_endpoints.h"
#include "coordinator/api/follower_service.h"

namespace pipetrain {
namespace {

// A FollowerService on a loopback port of its own, naming `leader`.
class Follower {
 public:
  explicit Follower(std::string leader)
      : service_([leader] { return leader; }, [] { return false; }) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterCallbackGenericService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~Follower() { server_->Shutdown(); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  FollowerService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// A newly elected leader still loading its state, which serves the
// FollowerService until then: it names itself.
class LoadingLeader {
 public:
  LoadingLeader()
      : service_(
            [this] {
              AnnotatedMutexLock lock(&mu_);
              return address_;
            },
            [] { return true; }) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterCallbackGenericService(&service_);
    server_ = builder.BuildAndStart();
    AnnotatedMutexLock lock(&mu_);
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  ~LoadingLeader() { server_->Shutdown(); }
  std::string address() const {
    AnnotatedMutexLock lock(&mu_);
    return address_;
  }

 private:
  mutable AnnotatedMutex mu_;
  std::string address_ ABSL_GUARDED_BY(mu_);
  FollowerService service_;
  std::unique_ptr<grpc::Server> server_;
};

// An address nobody listens on: a port the kernel handed out, then closed.
std::string DeadAddress() {
  Follower gone("");
  return gone.address();
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
}

// One unary call of any method on `channel`; its status and context, which
// Failed reads (a refusal's leader hint).
struct Outcome {
  grpc::Status status;
  std::unique_ptr<grpc::ClientContext> context = std::make_unique<grpc::ClientContext>();
};

Outcome Call(const std::shared_ptr<grpc::Channel>& channel) {
  Outcome out;
  out.context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::GenericStub stub(channel);
  grpc::Slice empty("");  // an empty GetJobRequest
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

TEST(LeaderFollowingTest, ARefusalNamingTheLeaderIsFollowed) {
  const std::string leader = DeadAddress();  // only its name matters here
  Follower follower(leader);
  CoordinatorEndpoints endpoints({follower.address(), leader}, MakeChannel);
  std::shared_ptr<grpc::Channel> channel = endpoints.channel();
  Outcome refused = Call(channel);
  ASSERT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(LeaderHint(*refused.context), leader);
  EXPECT_TRUE(endpoints.Failed(refused.status, *refused.context, channel));  // resend at once
  EXPECT_EQ(endpoints.current(), leader);
}

// A leader still loading its state refuses as a follower does, but names
// itself and says why: its clients ask it again. They moved on to the
// followers, which only sent them back, a round later.
TEST(LeaderFollowingTest, ALeaderStillLoading_NamesItselfAndIsAskedAgain) {
  LoadingLeader loading;
  Follower follower(loading.address());
  CoordinatorEndpoints endpoints({loading.address(), follower.address()}, MakeChannel);
  std::shared_ptr<grpc::Channel> channel = endpoints.channel();
  Outcome refused = Call(channel);
  ASSERT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(refused.status.error_message(),
            "this coordinator leads and is still loading its state; retry shortly");
  EXPECT_EQ(LeaderHint(*refused.context), loading.address());
  EXPECT_FALSE(endpoints.Failed(refused.status, *refused.context, channel));
  EXPECT_EQ(endpoints.current(), loading.address());
  EXPECT_EQ(endpoints.channel(), channel);
}

// The bug this guards against: the heartbeat and the assignment stream both
// saw the leader die; the first moved to the follower, the second moved on
// again, back to the dead leader, and in lockstep they kept doing so.
TEST(LeaderFollowingTest, SeveralCallsFailingOnTheSameDeadCoordinatorMoveOnOnce) {
  const std::string dead = DeadAddress();
  Follower follower(dead);
  CoordinatorEndpoints endpoints({dead, follower.address()}, MakeChannel);
  std::shared_ptr<grpc::Channel> channel = endpoints.channel();
  Outcome heartbeat = Call(channel);
  Outcome watch = Call(channel);
  ASSERT_EQ(heartbeat.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  ASSERT_EQ(watch.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_FALSE(endpoints.Failed(heartbeat.status, *heartbeat.context, channel));  // no hint
  EXPECT_EQ(endpoints.current(), follower.address());
  EXPECT_FALSE(endpoints.Failed(watch.status, *watch.context, channel));  // stale: ignored
  EXPECT_EQ(endpoints.current(), follower.address());
}

// A follower names a leader that has died (its lease has not run out yet):
// the dead one's failure goes on to the address after it in the list, so a
// third coordinator, the one that takes over, is reached.
TEST(LeaderFollowingTest, TheRoundRobinGoesOnFromAHintedDeadLeader) {
  const std::string dead = DeadAddress();
  Follower stale(dead);
  const std::string third = DeadAddress();
  CoordinatorEndpoints endpoints({stale.address(), dead, third}, MakeChannel);
  std::vector<std::string> visited = {endpoints.current()};
  for (int i = 0; i < 3; ++i) {
    std::shared_ptr<grpc::Channel> channel = endpoints.channel();
    Outcome failed = Call(channel);
    ASSERT_EQ(failed.status.error_code(), grpc::StatusCode::UNAVAILABLE);
    endpoints.Failed(failed.status, *failed.context, channel);
    visited.push_back(endpoints.current());
  }
  EXPECT_EQ(visited, (std::vector<std::string>{stale.address(), dead, third, stale.address()}));
}

// Whoever answers on a listed address must not be able to send the clients,
// and the bearer tokens on their calls, to a host of its choosing: a named
// leader outside the list is ignored, and the round robin goes on.
TEST(LeaderFollowingTest, AHintNotInTheListIsIgnored) {
  const std::string next = DeadAddress();
  Follower follower("attacker.example:443");
  std::vector<std::string> channels;  // every address a channel was made for
  CoordinatorEndpoints endpoints({follower.address(), next}, [&](const std::string& address) {
    channels.push_back(address);
    return MakeChannel(address);
  });
  std::shared_ptr<grpc::Channel> channel = endpoints.channel();
  Outcome refused = Call(channel);
  ASSERT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(LeaderHint(*refused.context), "attacker.example:443");
  EXPECT_EQ(ListedLeaderHint(*refused.context, {follower.address(), next}), "");
  EXPECT_FALSE(endpoints.Failed(refused.status, *refused.context, channel));
  EXPECT_EQ(endpoints.current(), next);
  EXPECT_EQ(channels, (std::vector<std::string>{follower.address(), next}));
}

TEST(LeaderFollowingTest, AHintOverTheLengthLimitIsNone) {
  const std::string listed = DeadAddress();
  for (size_t length : {kMaxLeaderHintBytes, kMaxLeaderHintBytes + 1}) {
    const std::string hint = listed + std::string(length - listed.size(), 'x');
    Follower follower(hint);
    Outcome refused = Call(MakeChannel(follower.address()));
    ASSERT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(LeaderHint(*refused.context), length <= kMaxLeaderHintBytes ? hint : "") << length;
  }
}

TEST(LeaderFollowingTest, AnAnswerThatIsNotARefusalChangesNothing) {
  const std::string dead = DeadAddress();
  Follower follower(dead);
  CoordinatorEndpoints endpoints({follower.address(), dead}, MakeChannel);
  std::shared_ptr<grpc::Channel> channel = endpoints.channel();
  grpc::ClientContext context;
  endpoints.Failed(grpc::Status(grpc::StatusCode::NOT_FOUND, "no such job"), context, channel);
  endpoints.Failed(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "bad token"), context, channel);
  EXPECT_EQ(endpoints.current(), follower.address());
}

// An address that answers UNIMPLEMENTED (a proxy in front of a coordinator
// answering 404 during a rollout) is left for the next listed one, as one
// that does not answer is: a worker registering again retried it forever.
TEST(LeaderFollowingTest, UnimplementedMovesToTheNextAddress) {
  const std::string dead = DeadAddress();
  Follower follower(dead);
  CoordinatorEndpoints endpoints({follower.address(), dead}, MakeChannel);
  std::shared_ptr<grpc::Channel> channel = endpoints.channel();
  grpc::ClientContext context;
  endpoints.Failed(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, ""), context, channel);
  EXPECT_EQ(endpoints.current(), dead);
}

TEST(LeaderFollowingTest, OneAddressIsAPlainChannel) {
  const std::string dead = DeadAddress();
  CoordinatorEndpoints endpoints({dead}, MakeChannel);
  std::shared_ptr<grpc::Channel> channel = endpoints.channel();
  Outcome failed = Call(channel);
  endpoints.Failed(failed.status, *failed.context, channel);
  EXPECT_EQ(endpoints.current(), dead);
  EXPECT_EQ(endpoints.channel(), channel);
}

}  // namespace
}  // namespace pipetrain
