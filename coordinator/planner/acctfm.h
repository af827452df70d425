// AccTFM partition sizes (acctfm.txt §3.3 eq. 3, §4.2, Algorithm 1): each
// layer of an intra-layer (tensor) parallel group splits its batch into
// K in {1, 2, 4} micro-partitions, so that the all-reduce of one
// micro-partition overlaps the compute of the next.
//
// Timeline model (Alg. 1 lines 19-36, reproduced exactly; one compute stream
// and one communication stream, both in order). For a layer with K
// micro-partitions of compute t_cp and all-reduce t_cm each, given the
// previous layer's compute end E_cp and the all-reduce ends E_cm[1..K'] of
// its K' micro-partitions:
//   dep[i]   = E_cm[ceil(i * K' / K)]     SplitOrMerge (lines 30-36): a
//              micro-partition waits for the previous-layer pieces it
//              contains or is contained in
//   cp_i     = max(dep[i], cp_{i-1}) + t_cp         (line 25), cp_0 = E_cp
//   cm_i     = max(cp_i, cm_{i-1}) + t_cm           (line 26), cm_0 = E_cm[K']
// Compute of micro-partition i thus overlaps the all-reduce of i - 1, and a
// layer's all-reduces queue behind the previous layer's. The pass starts
// from E_cp = 0, E_cm = [0] and ends at the last layer's cm_K.
//
// Algorithm 1 (lines 5-17): a frontier per size i holds the (E_cp, E_cm) of
// the best chain ending in size i; layer l tries every predecessor frontier j
// for every size i (lines 7-8) and keeps the best, comparing candidates by
// the end of their last all-reduce, ties by compute end, further ties by the
// smaller predecessor size. The listing's indentation is garbled: the
// frontier is replaced (lines 9-10) after all sizes of a layer are
// evaluated, and the final argmin and backtracking (lines 11-17) run after
// the layer loop. Backward runs the same algorithm over the layers in
// reverse order with the backward compute costs (§4.2.2, last paragraph).
//
// The frontier keeps one state per size and compares states by a scalar, so
// Alg. 1 is a heuristic, not an exact DP: a discarded chain with a later
// last all-reduce but an earlier compute end (or earlier other all-reduces)
// can finish the next layer sooner (acctfm_test's
// ScalarFrontierLosesToUniform case). Faithfully implemented, it can lose to
// a uniform size (16 of 1000 passes in acctfm_compare), so SolveAccTfm
// returns the better of Alg. 1 and the best uniform size and says which.
//
// All functions are pure and thread-safe.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_ACCTFM_H_
#define PIPETRAIN_COORDINATOR_PLANNER_ACCTFM_H_

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pipetrain {

// The partition sizes of Alg. 1 (input 5: pn = 3, ps = [1, 2, 4]); every
// per-size array below is indexed like this.
inline constexpr std::array<int, 3> kAccTfmSizes = {1, 2, 4};
inline constexpr int kAccTfmMaxBruteForceLayers = 8;

// ---- Eq. 3: T_comm(m) = alpha * c1 + beta * c2 * m ----------------------
//
// The paper leaves c1 (iterations) and c2 (summed message fraction) to the
// algorithm. Standard values for a group of n (Thakur, Rabenseifner, Gropp,
// "Optimization of Collective Communication Operations in MPICH", IJHPCA
// 2005; Patarasuk, Yuan, JPDC 2009 for the ring):
//   ring: reduce-scatter then all-gather, n - 1 steps each moving m / n:
//         c1 = 2 (n - 1), c2 = 2 (n - 1) / n
//   recursive doubling: log2 n steps each exchanging the whole message:
//         c1 = c2 = log2 n; when n is not a power of two, MPICH folds the
//         n - 2^floor(log2 n) extra ranks in with one step before and one
//         after: c1 = c2 = floor(log2 n) + 2.
// n = 1 gives c1 = c2 = 0 (nothing to reduce). The reduction's arithmetic
// (MPICH's gamma term) is not part of eq. 3 and is left out.
enum class AllReduceAlgorithm { kRing, kRecursiveDoubling };

struct AllReduceCoefficients {
  double c1 = 0;  // communication iterations
  double c2 = 0;  // sum over iterations of the message fraction sent
};

// INVALID_ARGUMENT when group_size < 1.
absl::StatusOr<AllReduceCoefficients> AllReduceCoefficientsFor(AllReduceAlgorithm algorithm,
                                                               int group_size);

struct AllReduceModel {
  double alpha_seconds = 0;          // latency (startup) per iteration
  double beta_seconds_per_byte = 0;  // 1 / bandwidth
  int group_size = 2;                // devices in the tensor-parallel group
  AllReduceAlgorithm algorithm = AllReduceAlgorithm::kRing;
};

// Eq. 3 for a message of `bytes`. INVALID_ARGUMENT naming the field when
// alpha, beta or bytes is negative or not finite, or group_size < 1.
absl::StatusOr<double> AllReduceSeconds(const AllReduceModel& model, double bytes);

// ---- The problem --------------------------------------------------------

struct AccTfmLayer {
  // Seconds of ONE micro-partition at sizes 1, 2, 4 (three entries each;
  // Alg. 1 line 1's T_cp). The backward entry covers both backward matmuls
  // (loss and gradient), which §4.2.2 treats as one operation.
  std::vector<double> fwd_compute_seconds;
  std::vector<double> bwd_compute_seconds;
  // All-reduce seconds of one micro-partition at sizes 1, 2, 4 (Alg. 1's
  // T_cm). Given here, or left empty when the problem has an AllReduceModel.
  // Both passes use them: the paper all-reduces each layer's output forward
  // and its loss tensor backward (§3.2), of the same shape for transformer
  // layers.
  std::vector<double> allreduce_seconds;
  // Bytes the whole batch all-reduces for this layer; with an AllReduceModel
  // a micro-partition of size K all-reduces output_bytes / K (eq. 3's m).
  double output_bytes = 0;
};

struct AccTfmProblem {
  std::vector<AccTfmLayer> layers;          // model order
  std::optional<AllReduceModel> allreduce;  // set: T_cm from eq. 3
};

// Bounds of a problem (as a model profile's, profile.h): every cost, size
// and coefficient at most 1e18, and at most as many layers as a profile has
// units, so that every sum the solvers form is finite.
inline constexpr double kMaxAccTfmValue = 1e18;
inline constexpr int kMaxAccTfmLayers = 2 * 256 + 2;

// INVALID_ARGUMENT, naming the layer and field ("layers[2].fwd_compute_seconds[1]
// is -1; ..."), when there are no layers or more than kMaxAccTfmLayers, an
// array does not have 3 entries, allreduce_seconds is given together with an
// AllReduceModel or missing without one, a value is negative, not finite or
// over kMaxAccTfmValue, or the model is invalid.
absl::Status ValidateAccTfmProblem(const AccTfmProblem& problem);

// ---- Solvers ------------------------------------------------------------

enum class AccTfmPass { kForward, kBackward };

struct AccTfmPassPlan {
  std::vector<int> partition_sizes;  // per layer, in model order, each 1, 2 or 4
  double seconds = 0;                // the timeline model's end time
};

// The end time of the pass when layer l uses sizes[l] (model order; the
// backward pass runs from the last layer to the first): the timeline model
// above. INVALID_ARGUMENT as ValidateAccTfmProblem, or when sizes has the
// wrong length or an entry outside {1, 2, 4}.
absl::StatusOr<double> EvaluateSizes(const AccTfmProblem& problem, AccTfmPass pass,
                                     const std::vector<int>& sizes);

// Algorithm 1 as listed (no uniform fallback). O(L). Its `seconds` equals
// EvaluateSizes of its sizes. INVALID_ARGUMENT as ValidateAccTfmProblem.
absl::StatusOr<AccTfmPassPlan> RunAlgorithm1(const AccTfmProblem& problem, AccTfmPass pass);

// End times with every layer at size 1, 2 and 4 (indexed like kAccTfmSizes).
absl::StatusOr<std::array<double, 3>> UniformSizes(const AccTfmProblem& problem, AccTfmPass pass);

// The optimum over all 3^L assignments; ties go to the first in
// lexicographic order of size indices. INVALID_ARGUMENT as
// ValidateAccTfmProblem, or when L > kAccTfmMaxBruteForceLayers.
absl::StatusOr<AccTfmPassPlan> BruteForceAccTfm(const AccTfmProblem& problem, AccTfmPass pass);

struct AccTfmPassResult {
  AccTfmPassPlan plan;                      // the better of algorithm1 and uniform
  AccTfmPassPlan algorithm1;                // RunAlgorithm1's answer
  std::array<double, 3> uniform_seconds{};  // UniformSizes
  bool used_uniform = false;                // a uniform size beat Alg. 1 strictly
};

struct AccTfmSolution {
  AccTfmPassResult forward;
  AccTfmPassResult backward;
};

// Alg. 1 forward and, over the reversed layers, backward; each pass falls
// back to the best uniform size (smallest size on ties) when that is
// strictly faster. INVALID_ARGUMENT as ValidateAccTfmProblem.
absl::StatusOr<AccTfmSolution> SolveAccTfm(const AccTfmProblem& problem);

// ---- Random instances (the property test and acctfm_compare) ------------
//
// A deterministic instance for (seed, index): 1 to 8 layers; full-batch
// forward compute 0.5-20 ms per layer, backward 1.6-2.4x forward; a
// micro-partition costs its share plus a fixed 0-15 % of the full-batch
// time (small batches use the device less well). Regime by index % 3:
// 0 compute-bound (all-reduce 0.1-0.6x forward compute), 1 comm-bound
// (1.5-4x), 2 mixed (0.1-4x per layer, log-uniform). Odd indices give
// all-reduce costs as arrays (a share plus 2-30 % latency), even ones use
// eq. 3 with a random algorithm, group of 2, 4 or 8, alpha 5-50 us and a
// 10 or 100 Gb/s link.
AccTfmProblem RandomAccTfmProblem(uint64_t seed, uint32_t index);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_ACCTFM_H_
