// The DeviceChannel (device_channel.h) of a CUDA backend: NCCL
// point-to-point between the GPUs of one device group (plan.proto
// DeviceGroup). Built only under --config=cuda; the CUDA backend's
// JoinDeviceGroup makes it.
//
// One two-rank communicator per link (ordered pair of members with device
// sends; plan.proto DeviceGroup.links), split from the group's, each with a
// stream of its own on both ends. NCCL runs a stream's operations in order
// and a send waits for its receive, so a shared stream would let a send to
// one peer hold up a receive from another, and two stages could each wait
// behind their own send (a deadlock the programs' per-link order cannot
// rule out). Per link, operations match in program order, which the
// coordinator checked (coordinator/planner/device_links.h). Setting up: the
// group's communicator (ncclCommInitRank), then one split per link in the
// group's order, by every member (collective), then the group's
// communicator is destroyed.
//
// Ordering with the backend's compute stream, without blocking the host:
//   Send: the direction's stream waits for the compute stream's work so far
//         (the tensor is written), then ncclSend. The tensor is kept until
//         an event after the send has completed: the caching allocator hands
//         a freed block to later compute work at once.
//   Recv: a block from the backend's allocator; the direction's stream waits
//         for the compute work so far (the block's earlier users), then
//         ncclRecv; the compute stream waits for it (later ops read it).
//
// Stopping: a peer that dies leaves a receive (and the compute stream
// behind it) waiting, as NCCL calls have no timeout here; when the job is
// stopped (the coordinator's lease fails it and sends STOP), Abort aborts
// the link communicators from the stopping thread, which ends their
// kernels. The join waits for the other members until group.join_deadline
// or group.join_cancelled (a non-blocking init, polled: NcclJoinLimits);
// the splits that follow it, once every member is there, block.
//
// Limits, plainly: only raw fp32; two ranks on one GPU are refused by NCCL,
// so on a one-GPU machine this class runs in no test
// (nccl_device_channel_test needs two GPUs).
#ifndef PIPETRAIN_WORKER_MODEL_NCCL_DEVICE_CHANNEL_H_
#define PIPETRAIN_WORKER_MODEL_NCCL_DEVICE_CHANNEL_H_

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "worker/model/device_channel.h"

namespace pipetrain {

// Joins `group` as `stage` (DeviceGroupRank's rules; group.id is
// NcclUniqueId::ToBytes of the group's id). Blocks until every member has
// called it, or until the group's join deadline or cancel check ends the
// wait (DEADLINE_EXCEEDED, CANCELLED). `compute` is the backend's stream on CUDA device `device`;
// `allocate` returns an uninitialised tensor of a shape on that device,
// reused in `compute`'s order (null storage after an allocation error).
// Both must outlive the channel. INVALID_ARGUMENT for bad stages or id;
// INTERNAL if CUDA or NCCL fails.
absl::StatusOr<std::unique_ptr<DeviceChannel>> CreateNcclDeviceChannel(
    const DeviceGroupSpec& group, int stage, int device, cudaStream_t compute,
    std::function<Tensor(const Shape&)> allocate);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_NCCL_DEVICE_CHANNEL_H_
