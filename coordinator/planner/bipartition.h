// Bi-Partition (bipartition.txt, eq. 1-3): forward and backward passes cut
// at different places. Worker i (0-based, in pipeline order) runs the
// forward pass of a contiguous unit range F_i and the backward pass of B_i;
// F_0..F_{P-1} concatenated are [0, L) in order, and so are B_0..B_{P-1}; a
// range may be empty, but not both ranges of a worker. L units, P workers,
// m micro-batches per iteration.
//
// Objective "paper" (the paper's, reproduced exactly): the bottleneck
//   max( max_i (sum_{u in F_i} fwd(u) + sum_{u in B_i} bwd(u)) / speed_i,
//        max_{i < P-1} (a(s1)·[0 < s1 < L] + a(s2)·[0 < s2 < L]) / bandwidth )
// where s1 = F_i.end and s2 = B_i.end count the units whose forward and
// backward pass run at or before worker i (the cut after worker i hands over
// the output of unit s1 and the gradient at unit s2, 1-based as in the
// paper), and a() is activation_bytes; latency is ignored.
// Both objectives add to a worker's compute term, after the division by
// speed_i, the same sums of fwd_comm and bwd_comm (seconds a pass waits at
// any speed: a tensor-parallel rank's all-reduces; not the paper's, 0 when
// the lists are empty).
//
// Objective "full" (what the paper leaves out):
//   compute_i = (sum_{u in F_i} fwd[u] + sum_{u in B_i} bwd[u]
//                + sum_{u in B_i \ F_i} fwd[u]) / speed_i
//     (the last term: recompute of split units on the backward owner).
//   inbound_i = sum over the per-micro-batch tensors worker i RECEIVES of
//     (latency + bytes/bandwidth):
//       forward input a[F_i.begin-1] if F_i non-empty and F_i.begin > 0;
//       backward gradient a[B_i.end-1] if B_i non-empty and B_i.end < L;
//       routed input for recompute a[B_i.begin-1] if B_i non-empty,
//         B_i.begin > 0 and (F_i empty or B_i.begin < F_i.begin)  (the input
//         of the first recomputed unit comes from another worker; a run of
//         B_i \ F_i after F_i gets its input locally);
//     plus the weight sync amortised per micro-batch:
//       sum_{u in F_i \ B_i} (latency + weight_bytes[u]/bandwidth) / m.
//     With bandwidth <= 0 (unlimited) the bytes terms are 0 but latency
//     still counts.
//   bottleneck = max_i max(compute_i, inbound_i).
// One addition to the routed-input rule, to agree with the schedule
// compiler (RoutedInputUnit in schedule_compiler.cc): a run of B_i \ F_i
// that starts after a GAP behind F_i (F_i non-empty, B_i.begin > F_i.end)
// does not get its input locally either, so it is routed too. The condition
// used is therefore (F_i empty or B_i.begin < F_i.begin or B_i.begin > F_i.end).
//
// Memory (both objectives; the paper prunes plans over memory): a plan is
// infeasible (objective = +inf) when some worker with memory_bytes_i > 0 has
//   memory_i = sum_{u in F_i ∪ B_i} weight_bytes[u] + 3·sum_{u in B_i} weight_bytes[u]
//              + n_i · sum_{u in F_i ∩ B_i} stash_bytes[u]
//              + sum_{u in B_i \ F_i} stash_bytes[u]
//              + (n_i - 1) · activation_bytes[F_i.end - 1]   if F_i non-empty and
//                    B_i.begin <= F_i.end < B_i.end
//              + sum_{u in F_i \ B_i} weight_bytes[u]
//              + max(max_{u in F_i ∪ B_i} transient_bytes[u],
//                    max_{u in F_i \ B_i} (transient_bytes[u] + stash_bytes[u]))
//              - tied · ([F_i ∪ B_i holds units 0 and L-1] + 2 [B_i holds both])
//              + c_i · sum_{u in B_i} weight_bytes[u]
// above memory_bytes_i, where n_i = min(m, P - i) for 1F1B and m for GPipe
// (the micro-batches whose stash worker i holds at once). The last five
// terms are not the paper's. c_i (stepped_weight_copies): copies of the
// weights it steps that the worker holds beside these, a CPU worker's
// checkpoint snapshot (its stepped weights and both AdamW moments, per
// unit: a tied wte twice) and data-parallel error-feedback residuals. The kept outputs: a run of
// B_i \ F_i right after F_i recomputes from F_i's last output, which the worker keeps from each
// micro-batch's forward pass to its backward pass (n_i at once; the one being recomputed is in its
// first unit's stash). Other activations are freed after their last reader (a send, the forward
// pass they feed: StageRuntime), so no other term holds them. Not counted: a routed input (the full
// objective's a[B_i.begin-1]) waits in the receiver's mailbox from the sender's forward pass to the
// receiver's backward, up to the micro-batches in flight between them: host memory, a CPU worker's
// own (a term for it would break memory_i's monotonicity, which the solvers rely on). A recomputed
// unit (B_i \ F_i) holds its stash for one micro-batch at a time: the compiler's Recompute comes
// right before that micro-batch's Backward, which frees it. The last term: the most one pass of a
// unit allocates beyond its stash (the head's [B·T, vocab] logit gradient is as large as its
// stash), once, since a worker runs one unit at a time. A forward-only unit (F_i \ B_i) is charged
// its forward-and-backward transient plus its stash there: its forward pass fills a whole stash
// (UnitContext) that the runtime drops after the pass, so its peak is both; and its weights
// twice, as the runtime gives every parameter it holds a gradient buffer. The tied term: a
// worker holding both ends of the model shares the embedding's wte value
// with the head (TieHeadToEmbedding), and with both in B_i steps it once
// (one pair of AdamW moments; its two gradients stay); tied is
// tied_weight_bytes, at most the smaller of the two units' weight_bytes,
// which keeps memory_i non-decreasing as a range grows.
//
// Weight sync size (both objectives): a unit whose forward and backward run
// on different workers sends all its weights to its forward owner after each
// step as ONE tensor (UNIT_WEIGHTS), which a receiver refuses above the data
// plane's per-tensor limit (common/data_plane_limits.h). A plan is therefore
// also infeasible (objective = +inf) when some F_i \ B_i holds a unit with
// weight_bytes[u] > max_weight_sync_bytes: such a unit keeps both passes on
// one worker. (u in F_i \ B_i for its forward owner i exactly when its
// owners differ, so this per-worker term is the whole rule.) Unlike memory
// it is not monotone as B_i grows, so the solvers treat it as part of a
// worker's value, not of the monotone part they prune on.
//
// Every term depends only on worker i's own (F_i, B_i), which is what makes a
// DP over prefixes (workers used, forward end, backward end) exact. All
// functions here are pure and thread-safe.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_BIPARTITION_H_
#define PIPETRAIN_COORDINATOR_PLANNER_BIPARTITION_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/data_plane_limits.h"
#include "coordinator/planner/partition.h"

namespace pipetrain {

enum class BiPartitionObjective { kPaper, kFull };

// The pipeline schedule, for the stash count n_i. Its own enum rather than
// schedule_compiler.h's Schedule: the compiler consumes Bi-Partition plans,
// so depending on it from here would invite a dependency cycle.
enum class BiPartitionSchedule { kOneFOneB, kGPipe };

struct BiPartitionProblem {
  std::vector<double> fwd;  // seconds per unit and micro-batch (speed 1)
  std::vector<double> bwd;
  std::vector<double> activation_bytes;  // output of each unit, per micro-batch
  std::vector<double> speeds;            // per worker, > 0; size = workers
  double bandwidth = 0;                  // bytes/s; <= 0 means unlimited
  std::vector<double> weight_bytes;      // per unit; empty: all 0
  std::vector<double> stash_bytes;       // per unit and micro-batch; empty: all 0
  std::vector<double> transient_bytes;   // per unit, above its stash; empty: all 0
  std::vector<double> memory_bytes;      // per worker, 0 = unlimited; empty: all unlimited
  // Per worker, in [0, 1e4]: memory_i's c_i, the copies of its stepped
  // weights it holds beside them (3 for a CPU worker's checkpoint snapshot
  // of weights and AdamW moments); empty: all 0.
  std::vector<double> stepped_weight_copies;
  // The tied wte's bytes (the head's copy of the embedding's; 0: none), for
  // the memory of a worker holding both ends (above).
  double tied_weight_bytes = 0;
  // The most weight_bytes a unit may have and still run its two passes on
  // different workers (> 0; +inf: no limit): the data plane's per-tensor
  // limit, as weight_bytes are the UNIT_WEIGHTS tensor's bytes (4 x the
  // parameters one tensor rank holds).
  double max_weight_sync_bytes = static_cast<double>(kMaxDataPlaneTensorBytes);
  double latency_seconds = 0;            // per message (full objective only)
  int micro_batches = 1;                 // m >= 1
  BiPartitionSchedule schedule = BiPartitionSchedule::kOneFOneB;
  BiPartitionObjective objective = BiPartitionObjective::kPaper;
  // Per worker, for messages only (empty: "worker <index>").
  std::vector<std::string> worker_names;
  // Per unit, seconds per micro-batch that speeds do not divide (above;
  // UnitProfile::fwd_comm_seconds); empty: all 0.
  std::vector<double> fwd_comm, bwd_comm;
};

// "797009024 bytes (0.74 GiB)": bytes in messages (StrCat of a double
// printed 7.97009e+08).
std::string BytesAndGiB(double bytes);

struct BiPartitionPlan {
  std::vector<Range> forward;  // per worker, [begin, end); begin == end: empty
  std::vector<Range> backward;
  double bottleneck = 0;  // the problem's objective for this plan
};

// INVALID_ARGUMENT when there are no units or no workers, sizes disagree
// (fwd, bwd, activation_bytes and, when non-empty, weight_bytes,
// stash_bytes, transient_bytes, fwd_comm and bwd_comm per unit; memory_bytes per worker), a
// cost, size, memory,
// latency or bandwidth is negative or not finite (bandwidth may be
// negative: unlimited; or +inf), a speed is <= 0, micro_batches < 1,
// max_weight_sync_bytes is not > 0, or workers > 2 * units (some worker
// would be idle).
absl::Status ValidateProblem(const BiPartitionProblem& problem);

// Per-worker terms of both objectives in O(1) each from prefix sums (and a
// sparse table for the largest transient_bytes of a range): the
// single definition every solver and objective function evaluates, so that
// they agree to the last bit. Construct from a problem that passes
// ValidateProblem; ranges are [begin, end) with 0 <= begin <= end <= L,
// worker in [0, P).
class BiPartitionCosts {
 public:
  explicit BiPartitionCosts(const BiPartitionProblem& problem);

  int units() const { return units_; }
  int workers() const { return static_cast<int>(speeds_.size()); }
  BiPartitionObjective objective() const { return objective_; }

  // The compute term of `worker` under the problem's objective (the full
  // objective adds the recompute of B \ F). Non-decreasing as either range
  // grows.
  double Compute(int worker, const Range& f, const Range& b) const;
  // The paper's term for the cut after `worker` (0 after the last worker).
  double PaperCut(int worker, const Range& f, const Range& b) const;
  // The full objective's inbound_i.
  double Inbound(int worker, const Range& f, const Range& b) const;
  // memory_i (non-decreasing as either range grows); Fits: memory_i <=
  // memory_bytes_i, or the worker is unlimited.
  double Memory(int worker, const Range& f, const Range& b) const;
  bool Fits(int worker, const Range& f, const Range& b) const;
  // Whether F \ B holds no unit above max_weight_sync_bytes (the weight
  // sync rule above). Not monotone in the ranges.
  bool SyncsFit(const Range& f, const Range& b) const;
  // 0 for an unlimited worker, else memory_i / memory_bytes_i.
  double MemoryRatio(int worker, const Range& f, const Range& b) const;
  // The worker's share of the objective: max(compute, cut) for the paper,
  // max(compute, inbound) for the full objective; +inf when it does not fit
  // in memory or a weight sync is over the limit.
  double WorkerCost(int worker, const Range& f, const Range& b) const;
  // One message carrying `unit`'s output: latency + a[unit] / bandwidth.
  double Transfer(int unit) const;

 private:
  int units_ = 0;
  BiPartitionObjective objective_;
  std::vector<double> speeds_, memory_, stash_count_, stepped_copies_;
  std::vector<double> pf_, pb_, pw_, pstash_, psync_;  // prefix sums
  std::vector<double> pfc_, pbc_;  // prefix sums of fwd_comm and bwd_comm
  std::vector<double> poversized_;  // prefix counts of units above max_weight_sync_bytes
  // The largest of per-unit values over a range, in O(1) (a sparse table:
  // level k holds the largest of each run of 2^k units).
  class RangeMax {
   public:
    explicit RangeMax(std::vector<double> values);
    double Of(const Range& r) const;  // 0 for an empty range (end <= begin)
    // The largest over the units of x that are not in y (SumMinus's twin).
    double OfMinus(const Range& x, const Range& y) const;

   private:
    std::vector<std::vector<double>> levels_;
  };
  // transient_bytes; and, for a forward-only unit, its pass's peak:
  // transient_bytes + stash_bytes (its forward fills a stash it drops).
  RangeMax transient_max_, forward_only_peak_max_;
  std::vector<double> activation_, transfer_;          // transfer_[u] = Transfer(u)
  double tied_ = 0;                                    // tied_weight_bytes, clamped (see memory_i)
  double bandwidth_ = 0, latency_ = 0, micro_batches_ = 1;
};

// The objectives of `plan` (which must be valid for `problem`, and
// `problem` must pass ValidateProblem); +inf when a worker exceeds its
// memory or a weight sync is over the limit. Objective() picks by problem.objective.
double PaperObjective(const BiPartitionProblem& problem, const BiPartitionPlan& plan);
double FullObjective(const BiPartitionProblem& problem, const BiPartitionPlan& plan);
double Objective(const BiPartitionProblem& problem, const BiPartitionPlan& plan);

// The fast exact solver, for either objective. The optimum T* is the
// smallest t such that some plan has every worker's value <= t. Feasibility
// DPs over (workers used, forward end, backward end) answer that for one t
// in O(P·L^3) at worst: per target state they try source rows nearest
// first; compute and memory, both monotone in the ranges, cut each row to
// the sources b >= bmin, among which the largest reachable one decides
// (paper), or one candidate per case of where B starts relative to F
// decides (full: inbound is not monotone, but is fixed plus a transfer or
// a growing weight sync within each case). Bisection between a lower bound
// and the value of the best plan found narrows T* to within 1/64; then one
// exact min-max DP over the states and transitions with values <= the
// bracket's top yields T* and its plan (O(P·L^4) at worst, far less in
// practice: compute and transfer lower bounds prune it). Where values are
// sparse near T* (transfer-dominated problems), a feasibility DP just
// below a plan's value proves that value optimal instead. The result
// equals BruteForceBiPartition and SolveBiPartitionReference: bit for bit
// for integer costs; for real-valued costs up to rounding of the order of
// one ulp in how sums over split ranges are formed (the monotonicity the
// pruning relies on holds exactly only for exact sums). Ties: one optimal
// plan, deterministic.
// Errors: as ValidateProblem; RESOURCE_EXHAUSTED when no plan fits in
// memory, naming the tightest worker (the one with the highest
// memory_i / memory_bytes_i in the plan, among those whose weight syncs fit,
// that minimises that ratio), or when every plan syncs a unit over
// max_weight_sync_bytes (more workers than units leaves some unit split).
// `stats` (optional) receives the search's counters.
struct BiPartitionSolveStats {
  int probes = 0;  // DP passes run (feasibility and exact)
};
absl::StatusOr<BiPartitionPlan> SolveBiPartition(const BiPartitionProblem& problem,
                                                 BiPartitionSolveStats* stats = nullptr);

// The plain prefix DP (the first solver): best[k][f][b] is the smallest
// bottleneck with workers 0..k-1 running the forward passes of units [0, f)
// and the backward passes of [0, b); worker k then takes F = [f, f'),
// B = [b, b'), not both empty. O(P·L^4); the middle baseline. Ties go to the
// plan whose earlier workers end first (forward, then backward). Errors as
// SolveBiPartition.
absl::StatusOr<BiPartitionPlan> SolveBiPartitionReference(const BiPartitionProblem& problem);

// Enumerates every valid plan: the reference for tests (small L and P only).
// `problem` must pass ValidateProblem. bottleneck is +inf (and the ranges
// are unspecified) when no plan fits in memory and the weight sync limit.
BiPartitionPlan BruteForceBiPartition(const BiPartitionProblem& problem);

// The RESOURCE_EXHAUSTED status SolveBiPartition returns when no plan fits
// (shared with the other solvers). Requires: `problem` valid.
absl::Status NoPlanFitsError(const BiPartitionProblem& problem);

// The first unit whose forward and backward run on different workers of the
// plan (forward, backward: per worker, valid for `problem`) and whose
// weight_bytes exceed problem.max_weight_sync_bytes, or -1 when none: for
// plans made elsewhere (a manual plan). Requires: `problem` valid.
int FirstOversizedWeightSync(const BiPartitionProblem& problem, const std::vector<Range>& forward,
                             const std::vector<Range>& backward);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_BIPARTITION_H_
