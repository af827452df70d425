#include "worker/agent/coordinator_channel.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/server_builder.h>

#include <chrono>
#include <memory>

#include "absl/time/clock.h"
#include "common/grpc_server_limits.h"
#include "common/testing/idle_grpc_server.h"
#include "common/testing/silenceable_relay.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// A coordinator whose host vanishes with the connection open (the relay
// goes silent): the channel's keepalive pings go unanswered and the
// connection is closed, so the next call connects afresh. Without them
// the channel stayed READY for as long as the kernel kept the connection
// (about 15 minutes), every call timing out on it.
TEST(CoordinatorChannelTest, PeerSilentWithTheConnectionOpen_ChannelLeavesReady) {
  IdleGrpcServer server(
      [](grpc::ServerBuilder& builder) { ApplyGrpcServerLimits(builder, "channel-test"); });
  SilenceableRelay relay(server.port());
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(relay.endpoint(), grpc::InsecureChannelCredentials(),
                                CoordinatorChannelArguments(absl::Milliseconds(300)));
  ASSERT_TRUE(
      channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10)));
  relay.Freeze();  // before the first ping
  ASSERT_EQ(channel->GetState(/*try_to_connect=*/false), GRPC_CHANNEL_READY);
  EXPECT_TRUE(channel->WaitForStateChange(
      GRPC_CHANNEL_READY, std::chrono::system_clock::now() + std::chrono::seconds(10)))
      << "still READY 10 s after the peer went silent";
  EXPECT_NE(channel->GetState(/*try_to_connect=*/false), GRPC_CHANNEL_READY);
}

}  // namespace
}  // namespace pipetrain
