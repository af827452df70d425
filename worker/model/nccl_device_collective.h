// The DeviceCollective (device_collective.h) of a CUDA backend: NCCL's
// all-reduce between the GPUs of a stage's replicas on one host (plan.proto
// ReplicaDeviceGroup). Built only under --config=cuda; the CUDA backend's
// JoinDeviceCollective makes it.
//
// One communicator of all the replicas and a stream of its own, so a sum
// runs beside the compute stream's later work (the backward pass of the
// units not yet final). Joining is bounded by spec.join_deadline and
// spec.join_cancelled (a non-blocking communicator, polled: NcclJoinLimits),
// then one warm-up sum of one float connects the members, so no later sum
// waits on the host for a peer.
//
// A sum of several tensors: a flat block from the backend's allocator,
// the sum's stream waiting for the compute stream's work so far (the
// gradients are written; the block's earlier users are done), the tensors
// copied in, ncclAllReduce in place, copied back, an event recorded; one
// tensor is summed in place without the block. AwaitSums makes the compute
// stream wait for every event so far, and only then lets the blocks go
// back to the allocator (its cache is ordered by the compute stream).
//
// Summation order is NCCL's (ring or tree, picked for the topology and
// size), the same on every member, which all receive bitwise the same
// floats, and the same run to run on one machine with one NCCL
// configuration; with two members every order gives the same floats.
//
// Stopping as the device channel does (nccl_device_channel.h): Abort
// aborts the communicator from the stopping thread, which ends its
// kernels; Abort and the job thread's NCCL calls are serialised; a call
// waiting for NCCL's "in progress" gives up when Abort begins; destroying
// the collective waits for sums still under way up to spec.drain_timeout,
// then aborts them.
//
// Limits, plainly: NCCL refuses two ranks on one GPU, so this class runs
// only on a machine with a GPU per replica (nccl_device_collective_test
// needs two GPUs); on the CPU the in-process stand-in
// (worker/runtime/in_process_device_collective.h) takes its place in
// tests.
#ifndef PIPETRAIN_WORKER_MODEL_NCCL_DEVICE_COLLECTIVE_H_
#define PIPETRAIN_WORKER_MODEL_NCCL_DEVICE_COLLECTIVE_H_

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "worker/model/device_collective.h"

namespace pipetrain {

// Joins `spec` (CheckDeviceCollectiveSpec's rules; spec.id is
// NcclUniqueId::ToBytes of the group's id). Blocks until every member has
// called it, or until the join deadline or cancel check ends the wait
// (DEADLINE_EXCEEDED, CANCELLED). `compute` is the backend's stream on
// CUDA device `device`; `allocate` returns an uninitialised tensor of a
// shape on that device, reused in `compute`'s order (null storage after an
// allocation error). Both must outlive the collective. INVALID_ARGUMENT
// for a bad spec or id; INTERNAL if CUDA or NCCL fails.
absl::StatusOr<std::unique_ptr<DeviceCollective>> CreateNcclDeviceCollective(
    const DeviceCollectiveSpec& spec, int device, cudaStream_t compute,
    std::function<Tensor(const Shape&)> allocate);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_NCCL_DEVICE_COLLECTIVE_H_
