// The per-rank costs of a 3-D tensor-parallel job (spec.parallelism
// .tensor_mode 3d; DESIGN.md §12) for the planner and the simulator: the
// 3-D counterpart of TensorParallelUnitPasses (tensor_partitions.h), in
// the same TensorParallelUnitLanes form, so that TensorParallelCostsOf
// and AddTensorParallelLanes work unchanged.
//
// A stage's T = p^3 ranks form a p x p x p cube. Per unit, one rank, one
// micro-batch of B samples of T tokens (n = B T d floats of activation):
//   compute: the unit's fwd_seconds / T and bwd_seconds / T (the 3-D
//     linears and the local attention split the FLOPs evenly).
//   attention, MLP (worker/model/cube_units.h's CubeBlockUnit): the floats
//     the busiest rank sends (CubeAttentionSent / CubeMlpSent, direction
//     CubeDirection{} as the units use), times 4 bytes / bandwidth, plus
//     the latency once per step of the collectives the pass issues:
//       forward  4 broadcasts, 8 all-gathers, 2 reduce-scatters, 2
//                all-reduces: 4 + 14 (p - 1) steps;
//       backward 1 broadcast, 7 all-gathers, 8 reduce-scatters, 5
//                all-reduces: 1 + 25 (p - 1) steps;
//     (tensor_cube_costs.cc derives these counts; at p = 2 an all-reduce
//     is one step, not 2 (p - 1): 16 and 21 steps). The cube's collectives
//     are synchronous: one partition, the communication after the compute,
//     fully exposed (PassSeconds = compute + communication).
//   boundaries: a cube unit whose next unit is not a cube unit (the last
//     one before the head) all-gathers its output over the cube in its
//     forward, and one whose previous unit is not a cube unit (the first
//     after the embedding) all-gathers its input gradient in its backward:
//     three all-gathers (one per axis), (p - 1) n / p^3 + (p - 1) n / p^2
//     + (p - 1) n / p floats and 3 (p - 1) steps.
//   embed, head: exactly the 1-D costs of a group of T
//     (TensorParallelUnitPasses with one partition everywhere): they stay
//     vocabulary-parallel over all p^3 ranks.
//
// Known under-estimate: a pipeline stage cut between two cube units also
// makes the units on either side gather (the output of the one before,
// the input gradient of the one after), but the cuts are not known when
// these costs are computed, so each equal cut inside the blocks misses two
// full gathers. A Bi-Partition plan (different forward and backward cuts)
// misses more: every cube unit between a stage's two cuts (in its forward
// range or its backward range, not both) gathers its output in its forward
// and its recompute and its input gradient in the next unit's backward,
// none of it priced here, so such plans look cheaper than they run.
// Also approximate: every all-reduce is priced as a ring
// (2 (p - 1) steps) as the 1-D costs are, though the data plane runs
// small ones by recursive doubling (log2 p steps) when p is a power of
// two; and a unit's memory is the 1-D rank's share (TensorParallelCostsOf:
// the LayerNorm's tensors whole, the rest over T), although a cube unit
// keeps only its blocks (an over-estimate, on the safe side).
//
// Pure and thread-safe.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_TENSOR_CUBE_COSTS_H_
#define PIPETRAIN_COORDINATOR_PLANNER_TENSOR_CUBE_COSTS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/planner/profile.h"
#include "coordinator/planner/tensor_parallel_lanes.h"

namespace pipetrain {

// Per unit of `profile` (in model order; attention and MLP units are named
// "attn_*" and "mlp_*") the passes described above, for micro-batches of
// `micro_batch_samples` samples of `seq_len` tokens of a model of width
// `d_model` with `n_head` heads, on a link of `bandwidth_bytes_per_second`
// (0: unlimited, the bytes then cost nothing) and `latency_seconds` per
// step. INVALID_ARGUMENT (naming the value) when tensor is not p^3 with
// p >= 2, when p does not divide n_head, p^2 does not divide d_model or
// micro_batch_samples, n_head does not divide d_model, a size is < 1, the
// bandwidth or latency is negative or not finite, or
// TensorParallelUnitPasses refuses the profile.
absl::StatusOr<std::vector<TensorParallelUnitLanes>> CubeTensorParallelUnitPasses(
    const ModelProfile& profile, int tensor, int64_t micro_batch_samples, int64_t seq_len,
    int64_t d_model, int64_t n_head, double bandwidth_bytes_per_second, double latency_seconds);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_TENSOR_CUBE_COSTS_H_
