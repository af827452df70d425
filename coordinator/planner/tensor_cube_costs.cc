#include "coordinator/planner/tensor_cube_costs.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/planner/tensor_partitions.h"
#include "worker/cube/cube_blocks.h"
#include "worker/cube/cube_comm.h"
#include "worker/model/tensor_parallel.h"

namespace pipetrain {
namespace {

// Collectives one pass issues, by kind. Ring steps: an all-gather or a
// reduce-scatter over an axis of p takes p - 1, an all-reduce 2 (p - 1)
// (reduce-scatter then all-gather; eq. 3's c1 for the ring, as the 1-D
// costs count it), or one exchange when p = 2 (Collectives::AllReduce); a
// broadcast is the root's star (Collectives::Broadcast): every member
// waits for one message, so one step (the root's p - 1 sends are in the
// byte count).
struct CollectiveCount {
  int broadcasts = 0, all_gathers = 0, reduce_scatters = 0, all_reduces = 0;
  int64_t Steps(int p) const {
    const int64_t all_reduce_steps = p == 2 ? 1 : 2 * (p - 1);
    return broadcasts + int64_t{all_gathers + reduce_scatters} * (p - 1) +
           all_reduces * all_reduce_steps;
  }
};

// From worker/cube: a CubeVectorAllGather is a broadcast along the input
// axis then an all-gather along the weight axis; a CubeVectorReduceGrad a
// reduce-scatter then an all-reduce.
//   forward:  LayerNorm: 2 vector all-gathers (gamma, beta), 2 all-reduces
//             (row sums, centred squares); each linear: all-gather X and
//             W, reduce-scatter Y, 1 vector all-gather (bias). Totals: 4
//             broadcasts, 2 + 2 x 3 = 8 all-gathers, 2 reduce-scatters, 2
//             all-reduces.
//   backward: each linear (with dX): all-gather dY, X and W, reduce-
//             scatter dX and dW, 1 vector reduce-grad (bias); LayerNorm: 1
//             vector all-gather (gamma), 1 all-reduce (packed row sums), 2
//             vector reduce-grads (dgamma, dbeta). Totals: 1 broadcast, 7
//             all-gathers, 2 x 3 + 2 = 8 reduce-scatters, 2 + 1 + 2 = 5
//             all-reduces.
// Attention and MLP issue the same collectives (only the widths differ).
constexpr CollectiveCount kBlockForward{4, 8, 2, 2};
constexpr CollectiveCount kBlockBackward{1, 7, 8, 5};
// CubeBlockUnit::GatherFull: one all-gather along each axis.
constexpr CollectiveCount kGatherFull{0, 3, 0, 0};

absl::Status CheckDims(int tensor, int p, int64_t micro_batch_samples, int64_t seq_len,
                       int64_t d_model, int64_t n_head, double bandwidth, double latency) {
  const auto invalid = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("3-D tensor-parallel costs: ", parts...));
  };
  if (p == 0) {
    return invalid("a cube needs T = p^3 ranks with p >= 2 (8, 27, ...), not ", tensor);
  }
  if (micro_batch_samples < 1 || seq_len < 1 || d_model < 1 || n_head < 1) {
    return invalid("micro-batch samples ", micro_batch_samples, ", seq_len ", seq_len, ", d_model ",
                   d_model, " and n_head ", n_head, " must all be >= 1");
  }
  const int64_t pp = int64_t{p} * p;
  if (n_head % p != 0) return invalid("n_head ", n_head, " is not a multiple of p = ", p);
  if (d_model % pp != 0) return invalid("d_model ", d_model, " is not a multiple of p^2 = ", pp);
  if (d_model % n_head != 0) {
    return invalid("d_model ", d_model, " is not a multiple of n_head ", n_head);
  }
  if (micro_batch_samples % pp != 0) {
    return invalid("the micro-batch's ", micro_batch_samples,
                   " samples are not a multiple of p^2 = ", pp);
  }
  if (!std::isfinite(bandwidth) || bandwidth < 0) {
    return invalid("bandwidth ", bandwidth, " bytes/s must be finite and >= 0 (0: unlimited)");
  }
  if (!std::isfinite(latency) || latency < 0) {
    return invalid("latency ", latency, " s must be finite and >= 0");
  }
  return absl::OkStatus();
}

// The most floats any rank of the cube sends in a forward and (apart) in a
// backward of the block. The cube's collectives are synchronous, so a pass
// ends when its busiest sender is done: the diagonal ranks, which root
// the vector broadcasts, send more than the others, and everyone waits
// for them. The maximum, not the average, is the time the pass takes.
CubeBlockSentFloats BusiestRank(bool attention, const CubeBlockDims& dims, int p) {
  CubeBlockSentFloats most;
  for (int r = 0; r < p * p * p; ++r) {
    const CubeCoord coord = CubeCoordOf(r, p);
    const CubeBlockSentFloats sent = attention ? CubeAttentionSent(dims, p, coord, CubeDirection{})
                                               : CubeMlpSent(dims, p, coord, CubeDirection{});
    most.forward = std::max(most.forward, sent.forward);
    most.backward = std::max(most.backward, sent.backward);
  }
  return most;
}

}  // namespace

absl::StatusOr<std::vector<TensorParallelUnitLanes>> CubeTensorParallelUnitPasses(
    const ModelProfile& profile, int tensor, int64_t micro_batch_samples, int64_t seq_len,
    int64_t d_model, int64_t n_head, double bandwidth_bytes_per_second, double latency_seconds) {
  const int p = CubeEdge(tensor);
  RETURN_IF_ERROR(CheckDims(tensor, p, micro_batch_samples, seq_len, d_model, n_head,
                            bandwidth_bytes_per_second, latency_seconds));
  // Embed and head: the 1-D group's costs, unchanged.
  const std::vector<int> whole(profile.units.size(), 1);
  ASSIGN_OR_RETURN(
      std::vector<TensorParallelUnitLanes> out,
      TensorParallelUnitPasses(profile, tensor, whole, whole, bandwidth_bytes_per_second,
                               latency_seconds, 1.0, 0.0, false, micro_batch_samples * seq_len));
  const double seconds_per_float =
      bandwidth_bytes_per_second > 0 ? sizeof(float) / bandwidth_bytes_per_second : 0.0;
  const auto seconds = [&](int64_t floats, const CollectiveCount& collectives) {
    return static_cast<double>(floats) * seconds_per_float +
           latency_seconds * static_cast<double>(collectives.Steps(p));
  };
  const CubeBlockDims dims{micro_batch_samples, seq_len, d_model, n_head};
  const CubeBlockSentFloats attention = BusiestRank(true, dims, p);
  const CubeBlockSentFloats mlp = BusiestRank(false, dims, p);
  const int64_t n = micro_batch_samples * seq_len * d_model;  // the full activation
  const int64_t pp = int64_t{p} * p;
  const int64_t gather_floats = (p - 1) * (n / (pp * p) + n / pp + n / p);
  const int units = static_cast<int>(profile.units.size());
  for (int u = 0; u < units; ++u) {
    const UnitProfile& in = profile.units[u];
    if (!IsTensorParallelBlockUnit(in)) continue;
    const CubeBlockSentFloats& sent = absl::StartsWith(in.name, "attn_") ? attention : mlp;
    TensorParallelUnitLanes& lanes = out[u];
    lanes.forward = {in.fwd_seconds / tensor, 1, seconds(sent.forward, kBlockForward)};
    lanes.backward = {in.bwd_seconds / tensor, 1, seconds(sent.backward, kBlockBackward)};
    // The full activation leaves the cube after the last unit of a run of
    // cube units, and its gradient after the first (see the header).
    if (u + 1 == units || !IsTensorParallelBlockUnit(profile.units[u + 1])) {
      lanes.forward.all_reduce_seconds += seconds(gather_floats, kGatherFull);
    }
    if (u == 0 || !IsTensorParallelBlockUnit(profile.units[u - 1])) {
      lanes.backward.all_reduce_seconds += seconds(gather_floats, kGatherFull);
    }
  }
  return out;
}

}  // namespace pipetrain
