// ApplyGrpcServerLimits against a synchronous streaming service (as server
// reflection is): open calls past kMaxSyncServerThreads are answered
// RESOURCE_EXHAUSTED instead of each taking a thread of the process.
#include "common/grpc_server_limits.h"

#include <grpcpp/grpcpp.h>

#include <memory>

#include "common/testing/holding_sync_service.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(GrpcServerLimitsTest, SyncCallsPastTheThreadLimit_ResourceExhausted) {
  testing::HoldingSyncService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  ApplyGrpcServerLimits(builder, "test");
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  constexpr int kCalls = 2 * kMaxSyncServerThreads + 8;
  testing::HeldSyncCalls held = testing::HoldSyncThreads(port, kCalls);
  EXPECT_GE(held.served, 1);
  EXPECT_LE(service.most(), kMaxSyncServerThreads);
  EXPECT_EQ(held.other, 0);
  EXPECT_EQ(held.served + held.refused, kCalls);
  EXPECT_GE(held.refused, kCalls - kMaxSyncServerThreads);
  EXPECT_EQ(held.EndAll(), 0);
  server->Shutdown();
}

}  // namespace
}  // namespace pipetrain
