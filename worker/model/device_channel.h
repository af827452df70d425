// DeviceChannel: tensors between the stages of one device group, device to
// device (Instruction LINK_PATH_DEVICE; plan.proto DeviceGroup; the CUDA
// issue, scope 5: NCCL p2p inside a node, the gRPC data plane across nodes
// and as the fallback).
//
// Unlike the wire transport (worker/transport/transport.h), which matches a
// receive to a send by the tensor's address, a channel matches in issue
// order: the k-th Recv from stage p gets the k-th tensor p sent to this
// stage. The coordinator marks a link LINK_PATH_DEVICE only where the two
// programs name the same tensors in the same order
// (coordinator/planner/device_links.h), so the runtime never reorders. The
// receiver names the shape; what arrives is only raw fp32 (links that
// compress stay on the wire).
//
// Implementations: NCCL between CUDA backends (Backend::JoinDeviceGroup;
// one communicator and stream per link, so a tensor waiting for its
// receiver holds up only later tensors of the same link:
// nccl_device_channel.h), and an in-process one over host tensors for tests
// on the CPU (worker/runtime/in_process_device_channel.h).
//
// Thread-compatible: one thread (the stage's job thread) calls Send and
// Recv, in program order; Abort may come from any thread.
#ifndef PIPETRAIN_WORKER_MODEL_DEVICE_CHANNEL_H_
#define PIPETRAIN_WORKER_MODEL_DEVICE_CHANNEL_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tensor.h"

namespace pipetrain {

class DeviceChannel {
 public:
  virtual ~DeviceChannel() = default;

  // Queues `t` (on this stage's device) for stage `peer_stage`, behind the
  // work queued so far on the backend that made it; returns without waiting
  // for the peer. The channel keeps `t` alive until the peer has it; the
  // caller must not write `t` afterwards (the send may still be reading it:
  // nothing orders the caller's later work after it, which would let a
  // send wait for a send of the peer's).
  // INVALID_ARGUMENT if `peer_stage` is this stage or outside the group;
  // the device's or library's error (INTERNAL) otherwise. After an error
  // the channel is unusable (the peer's matching receive may never come):
  // the caller fails the job.
  virtual absl::Status Send(int peer_stage, const Tensor& t) = 0;

  // The next tensor `peer_stage` sent to this stage, as a tensor of `shape`
  // on this stage's device; work the caller queues afterwards runs after it
  // has arrived. Errors as Send; where the implementation can tell, a tensor
  // of another element count is INVALID_ARGUMENT (NCCL cannot: sizes must
  // agree by construction, which the coordinator's order check provides).
  virtual absl::StatusOr<Tensor> Recv(int peer_stage, const Shape& shape) = 0;

  // Waits until every transfer handed to the channel so far has completed
  // (each send taken by its peer, each receive arrived): OK;
  // DEADLINE_EXCEEDED once `timeout` has passed (a peer that never takes
  // or sends its part: device transfers have no timeout of their own),
  // CANCELLED once `cancelled` (asked while waiting; may be null) says so,
  // ABORTED after Abort. The job thread calls it where it must know its
  // transfers are done: before reporting its last step finished.
  virtual absl::Status Flush(absl::Duration timeout, const std::function<bool()>& cancelled) = 0;

  // For a job that stops or failed, whose peers may never send or receive
  // again: ends the transfers under way and queued (a waiting Recv returns
  // ABORTED; on CUDA the NCCL communicators are aborted, which ends their
  // kernels, so a compute stream waiting for a receive goes on, with
  // garbage), and later calls fail with ABORTED. Thread-safe, from any
  // thread, also while the job thread is inside Send or Recv; idempotent.
  virtual void Abort() = 0;
};

// A device group as its members join it (plan.proto DeviceGroup), and how
// long a member waits for the others to join.
struct DeviceGroupSpec {
  std::string id;  // the communicator id's bytes
  // Ascending; rank r is stages[r]. Numbered as the runtime addresses
  // peers: by worker (with replicas, replica r's stage s is r * num_stages
  // + s; the stage itself with one replica).
  std::vector<int> stages;
  std::vector<std::pair<int, int>> links;  // (from, to) stages, in the group's order
  // The join gives up with DEADLINE_EXCEEDED after this MonotonicClock()
  // reading (common/clock.h), and with CANCELLED once join_cancelled (asked
  // while waiting; may be null) says so.
  absl::Time join_deadline = absl::InfiniteFuture();
  std::function<bool()> join_cancelled;
  // How long destroying the channel waits for its transfers still under
  // way (a peer that stopped with one of ours unmatched never ends them)
  // before it aborts them.
  absl::Duration drain_timeout = absl::InfiniteDuration();
};

// The rank of `stage` in `group`, after checking the group: at least two
// distinct non-negative stages in ascending order, `stage` among them, and
// links between two different members each, none listed twice; else
// INVALID_ARGUMENT naming what is wrong.
absl::StatusOr<int> DeviceGroupRank(const DeviceGroupSpec& group, int stage);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_DEVICE_CHANNEL_H_
