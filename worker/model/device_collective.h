// DeviceCollective: the data-parallel all-reduce of one stage's gradients
// between the GPUs of its replicas on one host (plan.proto
// ReplicaDeviceGroup; issue 21, scope 1: "NCCL for GPUs of one device
// group"). The gRPC collectives (worker/collectives/collectives.h) carry
// every other data-parallel reduction (compressed stages, the tied
// embedding's, the loss gather, clipping) and are the fallback.
//
// A sum is queued, not waited for: AllReduceSum returns once the work is
// handed to the device, and the backend's compute goes on beside it (the
// backward pass of the units not yet final), until AwaitSums orders the
// compute work queued after it (the optimizer step) behind every sum.
// Every member must issue the same sums, of the same element counts, in the
// same order: the replicas run one program, and StageRuntime fills its
// buckets in that program's order.
//
// Implementations: NCCL on CUDA backends (Backend::JoinDeviceCollective;
// worker/model/nccl_device_collective.h), and an in-process one over host
// tensors for tests on the CPU (worker/runtime/in_process_device_collective.h),
// which sums in member order.
//
// Thread-compatible: one thread (the stage's job thread) calls AllReduceSum
// and AwaitSums; Flush too; Abort may come from any thread.
#ifndef PIPETRAIN_WORKER_MODEL_DEVICE_COLLECTIVE_H_
#define PIPETRAIN_WORKER_MODEL_DEVICE_COLLECTIVE_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/tensor.h"

namespace pipetrain {

class DeviceCollective {
 public:
  virtual ~DeviceCollective() = default;

  // Queues, behind the backend's work so far, the sum over the members of
  // `tensors` (each on this member's device), written back into them: one
  // collective for the list (NCCL reduces it as one flat buffer). Until
  // AwaitSums the caller's device work must neither write nor read them;
  // the caller may drop its handles (the implementation keeps the storage
  // until the sum is done).
  // INVALID_ARGUMENT for a null tensor or, where the implementation can
  // tell, element counts that differ between members (NCCL cannot: the
  // replicas' programs agree by construction). Library and device errors
  // are INTERNAL, ABORTED after Abort. After any error the collective is
  // unusable (the members' sequences no longer match): the caller fails
  // the job.
  virtual absl::Status AllReduceSum(const std::vector<Tensor*>& tensors) = 0;

  // The backend's work queued after this call runs after every sum queued
  // so far has been written back; the host does not wait. Errors as
  // AllReduceSum.
  virtual absl::Status AwaitSums() = 0;

  // Waits on the host until every sum queued so far has completed: OK;
  // DEADLINE_EXCEEDED once `timeout` has passed (a member that never
  // joins its part: device collectives have no timeout of their own),
  // CANCELLED once `cancelled` (may be null; asked while waiting) says so,
  // ABORTED after Abort. The job thread calls it after its last step.
  virtual absl::Status Flush(absl::Duration timeout, const std::function<bool()>& cancelled) = 0;

  // For a job that stops or failed: ends the sums under way (on CUDA the
  // communicator is aborted, which ends its kernels; the tensors then hold
  // garbage), and later calls fail with ABORTED. Thread-safe, from any
  // thread, also while the job thread is inside another call; idempotent.
  virtual void Abort() = 0;
};

// A stage's replica group as a member joins it (plan.proto
// ReplicaDeviceGroup).
struct DeviceCollectiveSpec {
  std::string id;   // the communicator id's bytes
  int members = 0;  // every replica of the stage: the all-reduce's group
  int rank = 0;     // this member's: its replica
  // The join gives up with DEADLINE_EXCEEDED after this MonotonicClock()
  // reading (common/clock.h), and with CANCELLED once join_cancelled (asked
  // while waiting; may be null) says so.
  absl::Time join_deadline = absl::InfiniteFuture();
  std::function<bool()> join_cancelled;
  // How long destroying the collective waits for its sums still under way
  // (a member that stopped with one unmatched never ends them) before it
  // aborts them.
  absl::Duration drain_timeout = absl::InfiniteDuration();
};

// OK when `spec` names a group of at least two members, this one's rank
// among them, and a non-empty id; INVALID_ARGUMENT naming what is wrong.
absl::Status CheckDeviceCollectiveSpec(const DeviceCollectiveSpec& spec);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_DEVICE_COLLECTIVE_H_
