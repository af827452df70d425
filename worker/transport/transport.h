// Transport: how a stage's program moves tensors to and from other stages.
//
// The runtime (worker/runtime) speaks only this interface; implementations
// are the in-process transport (tests, single-machine equivalence) and the
// gRPC data plane (grpc_transport.h). Receives are by address, not by
// arrival order, so send order between different tensors never matters.
#ifndef PIPETRAIN_WORKER_TRANSPORT_TRANSPORT_H_
#define PIPETRAIN_WORKER_TRANSPORT_TRANSPORT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tensor.h"
#include "proto/pipetrain/v1/plan.pb.h"

namespace pipetrain {

// Identifies one tensor of one job: (job, iteration, kind, micro-batch, unit).
struct TensorAddress {
  std::string job_id;
  int64_t iteration = 0;
  v1::TensorKind kind = v1::TENSOR_KIND_UNSPECIFIED;
  int32_t micro_batch = 0;
  int32_t unit = 0;

  // "ACTIVATION of unit 3, micro-batch 1, iteration 7 (job j-1)".
  std::string DebugString() const;
  bool operator<(const TensorAddress& o) const;
  bool operator==(const TensorAddress& o) const;
};

TensorAddress MakeAddress(const std::string& job_id, int64_t iteration,
                          const v1::TensorKey& key);

class Transport {
 public:
  virtual ~Transport() = default;

  // This transport's stage index.
  virtual int stage() const = 0;

  // Sends `tensor` (fp32, any shape) to `peer_stage`. Returns once the
  // tensor is handed to the transport (buffered or on the wire); the caller
  // may reuse `tensor` afterwards. UNAVAILABLE when the peer cannot be
  // reached (names the peer). Thread-safe.
  virtual absl::Status Send(int peer_stage, const TensorAddress& address,
                            const Tensor& tensor) = 0;

  // Waits up to `timeout` for the tensor `address` from `peer_stage` and
  // removes it from the mailbox. DEADLINE_EXCEEDED names the peer and the
  // tensor; ABORTED if the transport was shut down. Thread-safe.
  virtual absl::StatusOr<Tensor> Recv(int peer_stage, const TensorAddress& address,
                                      absl::Duration timeout) = 0;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRANSPORT_TRANSPORT_H_
