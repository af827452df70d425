#include "worker/agent/coordinator_channel.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include <chrono>
#include <memory>

#include "absl/time/clock.h"
#include "common/grpc_server_limits.h"
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
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  ApplyGrpcServerLimits(builder, "coordinator-channel-test");
  grpc::CallbackGenericService nothing;  // a server needs a service; calls are not made
  builder.RegisterCallbackGenericService(&nothing);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_NE(port, 0);
  SilenceableRelay relay(port);
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
  server->Shutdown(std::chrono::system_clock::now());
}

}  // namespace
}  // namespace pipetrain
