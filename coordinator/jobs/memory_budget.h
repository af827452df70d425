// How much memory the planner may give each worker of a plan: what the
// worker reported it may use, divided among the plan's workers that draw
// on the same memory.
//
// Every worker reports the memory it may use (DeviceInfo): a CPU worker
// the least of its host's RAM, its cgroup's limit and its --memory-limit;
// a GPU worker its GPU's memory. Where that bound is the host's RAM
// itself (no limit of the process's own below it) or the GPU's memory,
// every such worker of the host (or GPU) reports the same whole amount.
// Taken at its word, a plan of four CPU workers on one 24 GiB host may
// give each 24 GiB, and the host runs out of memory once training starts
// instead of the plan being refused. So those workers share it: each gets
// the whole, less the limits of the plan's workers on the host that have
// their own, divided by how many of this plan's workers draw on it.
//
// A GPU worker's plan is budgeted its GPU's memory, less the coordinator's
// --gpu-memory-reserve, and what it holds in its host's RAM beside that
// (a checkpoint's snapshot or read, the data-parallel gradients' sum, the
// final weights) is checked against the host's RAM (CheckGpuHostCopies).
//
// Thread-safety: pure functions.
#ifndef PIPETRAIN_COORDINATOR_JOBS_MEMORY_BUDGET_H_
#define PIPETRAIN_COORDINATOR_JOBS_MEMORY_BUDGET_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/pipetrain/v1/coordinator.pb.h"
#include "spec/job_spec.h"

namespace pipetrain {

// The coordinator's --gpu-memory-reserve: GPU memory kept out of each GPU
// worker's plan for what the plans do not count, all per process: the
// CUDA context, the cuBLAS workspace, NCCL's communicator buffers, the
// streams' scratch (bf16 operand copies, PowerSGD's Q) and the caching
// allocator's slack. A worker's budget was the GPU's whole totalGlobalMem,
// and a plan packed close to it failed its first step's allocations, and
// every recovery re-planned the same. At most kMaxGpuMemoryReserveBytes.
inline constexpr int64_t kDefaultGpuMemoryReserveBytes = int64_t{1} << 30;
inline constexpr int64_t kMaxGpuMemoryReserveBytes = int64_t{1} << 40;

// One budget per worker, in order (bytes; 0: unlimited, as WorkerSpec's
// memory_bytes):
//  - GPU workers (gpu_model set): gpu_memory_bytes, shared by the plan's
//    workers on the same GPU (same hostname and gpu_pci_bus_id, or
//    gpu_index when no bus id is reported), less `gpu_reserve_bytes`
//    (--gpu-memory-reserve) each, at least 1 byte: taken after the sharing,
//    since what it is kept for is each worker process's own;
//  - CPU workers: memory_limit_bytes when reported, else memory_bytes. A
//    limit below memory_bytes is the process's own and is not shared; at
//    (or above) it, the host's RAM is, by the plan's CPU workers with the
//    same hostname that rely on it, less the own limits of the plan's
//    other workers on that host (at least 1 byte each: a budget of
//    nothing, never unlimited); either less its memory_reserve_bytes
//    (--memory-reserve: kept out of plans), at least 1 byte. Its own
//    limit claims the whole from the sharers, the reserve included.
// Workers that report no hostname share nothing (nothing says where they
// run). `shared` (may be null) gets what was divided, for messages, e.g.
// "host vm's RAM shared by 4 workers"; empty when nothing was.
std::vector<double> PlanMemoryBudgets(const std::vector<v1::Worker>& workers,
                                      std::string* shared = nullptr, int64_t gpu_reserve_bytes = 0);

// Each worker's share of its host's RAM in a plan (bytes; 0: unlimited),
// as PlanMemoryBudgets divides it among CPU workers, with GPU workers
// counted as CPU ones: a GPU worker's corpus and host copies live in the
// host's RAM, whatever its device's memory (Assignment.host_memory_budget_
// bytes). Eight GPU workers of a host without limits of their own each
// held their corpus to a third of the whole RAM. No reserve is taken out
// (the corpus is what it is kept for).
std::vector<double> HostRamBudgets(const std::vector<v1::Worker>& workers);

// How many copies of the weights it steps (its shard of them, the bytes
// CheckGpuHostCopies multiplies) the GPU worker at replica `replica`,
// tensor rank `rank` of a `resolved` job holds in its host's RAM at most:
// the most over the phases of its run, which follow one another (what
// lasts through several is counted in each: compressed data-parallel
// residuals, 1 from the first step on, and the writer's snapshot, written
// in the background while the next steps run):
//  - before the first step, at every position: with spec.init.from its
//    stage's tensors read unsplit, T, plus its own part of them cut at
//    Restore, 1; with checkpoints (a resume at any recovery) every unit's
//    weights and both moments read unsplit, 3T, plus that 1, and with
//    compression the residuals it folds, T + 1 (a checkpoint of this
//    layout's: one written by more replicas may give it more; a
//    forward-only unit's weights, read too, are not weights it steps);
//  - during a step, with replicas: the gradients' sum on the host, 1 (2
//    with a quantizer: what it dropped), at every replica, since a replica
//    device group (no host copy) is settled only once the plan is
//    committed;
//  - between steps, while a checkpoint is taken: the stage's writer,
//    replica 0's tensor rank 0, its snapshot of the whole stage, 3T plus T
//    per replica's residuals it keeps, and at T > 1 the buffer its own
//    shards of them arrive in, 1 per replica's, beside their unsplit
//    copies (as planner.h CpuSteppedWeightCopies counts it for every CPU
//    position); with compression each other position the residuals it
//    sends, 1, and replica 0's other ranks every replica's, gathered for
//    their rank 0;
//  - after the last step, at every position: the weights downloaded to
//    check them, 1; at replica 0 with spec.output.weights_path again for
//    the upload, 1, which its rank 0 gathers unsplit, T.
// So at least 1 (the final weights), and with checkpoints 3T + 1.
double GpuHostCopiesAt(const ResolvedJobSpec& resolved, int replica, int rank);

// A GPU worker's plan counts its device's memory only, but a checkpoint's
// snapshot (StageRuntime::Snapshot) downloads the weights it steps and
// both AdamW moments into its host's RAM, a tensor rank 0 its stage's
// ranks' gathered; a resume reads them back there at every position; a
// step without a replica device group sums the gradients there; so do
// compressed data-parallel residuals, the final weights, their gather and
// an unsplit spec.init.from. A CPU worker's plan counts these in its
// memory (planner.h CpuSteppedWeightCopies, the solver's c_i, the
// writer's for every position); a GPU worker's are checked here:
// copies[i] x stepped_weight_bytes[i] (what worker i holds of them at
// most, GpuHostCopiesAt) against its host's RAM. GPU workers that share it
// (no limit of their own below it) are checked together: the sum of their
// needs against the sum of their shares as PlanMemoryBudgets divides it
// among the plan's workers counted as CPU ones, less each one's
// --memory-reserve (a CPU worker there keeps its share); any other
// against its own limit less its reserve; unreported RAM (0) is not
// checked. Unchecked, the first checkpoint got the writer OOM-killed, and
// each recovery put the same plan back on the same workers.
// `workers`: a plan's, in position order; stages[i] the stage worker i
// runs (for the message); stepped_weight_bytes[i] the bytes of the weights
// it steps (its backward units', a tensor rank's share); sizes equal.
// `checkpoints`: the job takes them (spec.checkpoint.interval_steps > 0),
// for the refusal's advice. OK when every GPU worker's fit (CPU workers
// are not checked: their plan did); else RESOURCE_EXHAUSTED naming the
// first that does not (of a host's sharers, the one that needs the most),
// its stage, what it (and its host's sharers) need and what it (they)
// have, and advising more RAM, more stages, and with checkpoints turning
// them off.
absl::Status CheckGpuHostCopies(const std::vector<v1::Worker>& workers,
                                const std::vector<int>& stages,
                                const std::vector<double>& stepped_weight_bytes,
                                const std::vector<double>& copies, bool checkpoints);

// Which `count` of `workers` have the most memory for a plan: indices into
// `workers`, chosen greedily, each next the worker that leaves the chosen
// ones (itself included) the largest smallest budget as PlanMemoryBudgets
// divides them (a sharer divides its memory once more; a limit of its own
// leaves its host's sharers less), then the one whose own budget is the
// largest, then the earlier; an unlimited budget (0) counts as the
// largest. Fewer indices when there are fewer workers. `beside`: workers
// the plan has already (a recovering job's survivors), counted among the
// chosen from the start: a spare on a host they share divides its RAM
// with them too.
// `gpu_reserve_bytes`: --gpu-memory-reserve, taken off GPU workers' budgets
// as PlanMemoryBudgets does. A placement refused for memory is tried once
// more on these (JobManager).
std::vector<size_t> RoomiestWorkers(const std::vector<v1::Worker>& workers, int count,
                                    const std::vector<v1::Worker>& beside = {},
                                    int64_t gpu_reserve_bytes = 0);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_JOBS_MEMORY_BUDGET_H_
