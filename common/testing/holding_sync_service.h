// A synchronous streaming gRPC service whose calls each hold a server thread
// until the client goes away, as an unauthenticated server-reflection stream
// can: tests of the thread limit (common/grpc_server_limits.h) use it to
// take every synchronous thread a server has.
//
//   HoldingSyncService holding;
//   builder.RegisterService(&holding);   // beside the service under test
//   HeldSyncCalls held = HoldSyncThreads(port);
//   ASSERT_GE(held.refused, 1);          // every thread is taken
#ifndef PIPETRAIN_COMMON_TESTING_HOLDING_SYNC_SERVICE_H_
#define PIPETRAIN_COMMON_TESTING_HOLDING_SYNC_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <vector>

#include "proto/pipetrain/v1/dataplane.grpc.pb.h"

namespace pipetrain::testing {

// DataPlaneService.Stream, synchronously: each call says it is being served
// (one FrameError), then holds its thread until the client half-closes.
class HoldingSyncService final : public v1::DataPlaneService::Service {
 public:
  grpc::Status Stream(grpc::ServerContext*,
                      grpc::ServerReaderWriter<v1::FrameError, v1::TensorFrame>* stream) override;
  // The most calls served at once so far.
  int most() const { return most_.load(); }

 private:
  std::atomic<int> serving_{0};
  std::atomic<int> most_{0};
};

// Calls opened by HoldSyncThreads; they end (half-close, then Finish) at
// EndAll or when this is destroyed.
struct HeldSyncCalls {
  HeldSyncCalls() = default;
  HeldSyncCalls(HeldSyncCalls&&) = default;
  ~HeldSyncCalls() { EndAll(); }
  // Ends the served calls: how many of them did not end OK.
  int EndAll();

  int served = 0;   // calls answered: each holds a server thread
  int refused = 0;  // calls refused RESOURCE_EXHAUSTED (no thread left)
  int other = 0;    // calls that ended otherwise (a test failure)
  std::vector<std::unique_ptr<v1::DataPlaneService::Stub>> stubs;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReaderWriter<v1::TensorFrame, v1::FrameError>>> calls;
};

// Opens `calls` HoldingSyncService streams to 127.0.0.1:`port`, spread over
// enough connections that none is limited by its stream count, each
// waiting until served or refused.
HeldSyncCalls HoldSyncThreads(int port, int calls);

}  // namespace pipetrain::testing

#endif  // PIPETRAIN_COMMON_TESTING_HOLDING_SYNC_SERVICE_H_
