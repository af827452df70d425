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
// coordinator checked (coordinator/planner/device_links.h).
//
// Setting up, every step bounded by group.join_deadline and
// group.join_cancelled (DEADLINE_EXCEEDED, CANCELLED): the group's
// communicator (non-blocking init, polled: NcclJoinLimits), one split per
// link in the group's order by every member (collective; the parts are
// non-blocking too), the streams, then one float over every link in the
// group's order: NCCL connects a link's ends at their first exchange, which
// needs both, so connecting them all here means no later send waits on the
// host for its peer. The group's communicator is then destroyed. A failed
// step aborts every communicator made so far (one NCCL group abort), as the
// other members may still be waiting in a step with us.
//
// Ordering with the backend's compute stream, without blocking the host:
//   Send: the link's stream waits for the compute stream's work so far (the
//         tensor is written), then ncclSend. The tensor is kept until an
//         event after the send has completed: the caching allocator hands a
//         freed block to later compute work at once.
//   Recv: a block from the backend's allocator; the link's stream waits for
//         the compute work so far (the block's earlier users), then
//         ncclRecv; the compute stream waits for it (later ops read it).
//
// Stopping: a peer that dies leaves a receive (and the compute stream
// behind it) waiting, as NCCL transfers have no timeout; when the job is
// stopped (the coordinator's lease fails it and sends STOP), Abort aborts
// the link communicators together from the stopping thread, which ends
// their kernels. Abort and the job thread's NCCL calls are serialised (NCCL
// frees an aborted communicator at once); a call waiting for NCCL's "in
// progress" gives up when Abort begins. Destroying the channel waits for
// sends still under way up to group.drain_timeout, then aborts them (a peer
// that stopped first never takes them).
//
// Limits, plainly: only raw fp32; two ranks on one GPU are refused by NCCL,
// so on a one-GPU machine this class runs in no test
// (nccl_device_channel_test needs two GPUs). Memory freed with cudaFree
// while a link's kernel waits for its peer (the caching allocator's
// out-of-memory retry, a growing scratch buffer) waits for that kernel:
// size the device's memory so that does not happen mid-job.
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
