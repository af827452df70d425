#include "common/testing/holding_sync_service.h"

#include <chrono>
#include <string>

namespace pipetrain::testing {

grpc::Status HoldingSyncService::Stream(
    grpc::ServerContext*, grpc::ServerReaderWriter<v1::FrameError, v1::TensorFrame>* stream) {
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

int HeldSyncCalls::EndAll() {
  int failed = 0;
  for (auto& call : calls) {
    if (call == nullptr) continue;
    call->WritesDone();
    if (!call->Finish().ok()) ++failed;
    call.reset();
  }
  return failed;
}

HeldSyncCalls HoldSyncThreads(int port, int calls) {
  // Fewer streams on each connection than a server allows
  // (kMaxStreamsPerConnection, 32): a stream past that would wait for one
  // to end rather than be served or refused.
  constexpr int kCallsPerConnection = 16;
  HeldSyncCalls held;
  const int connections = (calls + kCallsPerConnection - 1) / kCallsPerConnection;
  for (int c = 0; c < connections; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("test.connection", c);  // distinct arguments: distinct connections
    held.stubs.push_back(v1::DataPlaneService::NewStub(grpc::CreateCustomChannel(
        "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(), args)));
  }
  for (int i = 0; i < calls; ++i) {
    held.contexts.push_back(std::make_unique<grpc::ClientContext>());
    held.contexts.back()->set_deadline(std::chrono::system_clock::now() +
                                       std::chrono::seconds(120));
    held.calls.push_back(held.stubs[i % connections]->Stream(held.contexts.back().get()));
    // A served call answers at once; a refused one ends.
    v1::FrameError hello;
    if (held.calls.back()->Read(&hello)) {
      ++held.served;
      continue;
    }
    const grpc::Status status = held.calls.back()->Finish();
    ++(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ? held.refused : held.other);
    held.calls.back().reset();
  }
  return held;
}

}  // namespace pipetrain::testing
