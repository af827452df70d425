// ApplyGrpcServerLimits against a synchronous streaming service (as server
// reflection is): open calls past kMaxSyncServerThreads are answered
// RESOURCE_EXHAUSTED instead of each taking a thread of the process.
#include "common/grpc_server_limits.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "proto/pipetrain/v1/dataplane.grpc.pb.h"

namespace pipetrain {
namespace {

// Each call says it is being served (one FrameError), then holds its
// thread until the client goes away.
class HoldingService final : public v1::DataPlaneService::Service {
 public:
  grpc::Status Stream(grpc::ServerContext*,
                      grpc::ServerReaderWriter<v1::FrameError, v1::TensorFrame>* stream) override {
    const int now = ++serving_;
    int seen = most_.load();
    while (now > seen && !most_.compare_exchange_weak(seen, now)) {
    }
    stream->Write(v1::FrameError());
    v1::TensorFrame frame;
    while (stream->Read(&frame)) {
    }
    --serving_;
    return grpc::Status::OK;
  }
  int most() const { return most_.load(); }

 private:
  std::atomic<int> serving_{0};
  std::atomic<int> most_{0};
};

TEST(GrpcServerLimitsTest, SyncCallsPastTheThreadLimit_ResourceExhausted) {
  HoldingService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  ApplyGrpcServerLimits(builder, "test");
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  // Calls on two connections, fewer than kMaxStreamsPerConnection on each.
  constexpr int kCalls = 2 * kMaxSyncServerThreads + 8;
  static_assert(kCalls / 2 < kMaxStreamsPerConnection);
  std::vector<std::unique_ptr<v1::DataPlaneService::Stub>> stubs;
  for (int c = 0; c < 2; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("test.connection", c);  // distinct arguments: distinct connections
    stubs.push_back(v1::DataPlaneService::NewStub(grpc::CreateCustomChannel(
        "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(), args)));
  }
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReaderWriter<v1::TensorFrame, v1::FrameError>>> calls;
  int served = 0, refused = 0;
  for (int i = 0; i < kCalls; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    contexts.back()->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    calls.push_back(stubs[i % 2]->Stream(contexts.back().get()));
    // A served call answers at once; a refused one ends.
    v1::FrameError hello;
    if (calls.back()->Read(&hello)) {
      ++served;
      continue;
    }
    const grpc::Status status = calls.back()->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
    ++refused;
    calls.back().reset();
  }
  EXPECT_GE(served, 1);
  EXPECT_LE(service.most(), kMaxSyncServerThreads);
  EXPECT_EQ(served + refused, kCalls);
  EXPECT_GE(refused, kCalls - kMaxSyncServerThreads);
  for (auto& call : calls) {
    if (call == nullptr) continue;
    call->WritesDone();
    EXPECT_TRUE(call->Finish().ok());
  }
  server->Shutdown();
}

}  // namespace
}  // namespace pipetrain
