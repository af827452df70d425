// Bi-Partition (bipartition.txt, eq. 1-3): forward and backward passes cut
// at different places. Worker i (in pipeline order) runs the forward pass of
// a contiguous unit range F_i and the backward pass of B_i; both sequences
// are ordered along the model and together cover every unit; a range may be
// empty, but not both ranges of a worker.
//
// Objective "paper" (the paper's, reproduced exactly): the bottleneck
//   max( max_i (sum_{u in F_i} fwd(u) + sum_{u in B_i} bwd(u)) / speed_i,
//        max_{i < P} (a(s1)·[0 < s1 < L] + a(s2)·[0 < s2 < L]) / bandwidth )
// where s1 and s2 count the units whose forward and backward pass run at or
// before worker i (so the cut after worker i hands over the output of unit
// s1 and the gradient at unit s2), and a() is activation_bytes; latency is
// ignored. This file holds the objective, a brute-force enumerator (the test
// reference) and the prefix DP solver; the full objective, memory limits,
// the literal interval DP and the BSA speed-up are further steps of the
// planner issue.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_BIPARTITION_H_
#define PIPETRAIN_COORDINATOR_PLANNER_BIPARTITION_H_

#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/planner/partition.h"

namespace pipetrain {

struct BiPartitionProblem {
  std::vector<double> fwd;               // seconds per unit (speed 1)
  std::vector<double> bwd;
  std::vector<double> activation_bytes;  // output of each unit
  std::vector<double> speeds;            // per worker, > 0; size = workers
  double bandwidth = 0;                  // bytes/s; <= 0 means unlimited
};

struct BiPartitionPlan {
  std::vector<Range> forward;   // per worker, [begin, end); begin == end: empty
  std::vector<Range> backward;
  double bottleneck = 0;        // the paper objective of this plan
};

// INVALID_ARGUMENT when sizes disagree, a cost is negative or not finite,
// a speed is <= 0, or there are no workers or no units.
absl::Status ValidateProblem(const BiPartitionProblem& problem);

// The paper objective of `plan` (which must satisfy the constraints above).
double PaperObjective(const BiPartitionProblem& problem, const BiPartitionPlan& plan);

// Exact solution by dynamic programming over prefixes: best[k][f][b] is the
// smallest bottleneck with workers 1..k running the forward passes of units
// [0, f) and the backward passes of [0, b); worker k+1 then takes
// F = [f, f'), B = [b, b'), not both empty. O(P · L^4). Ties go to the plan
// whose earlier workers end first (forward, then backward). INVALID_ARGUMENT
// as ValidateProblem, and when workers > 2 * units (someone would be idle).
absl::StatusOr<BiPartitionPlan> SolveBiPartition(const BiPartitionProblem& problem);

// Enumerates every valid plan: the reference for tests (small L and P only).
BiPartitionPlan BruteForceBiPartition(const BiPartitionProblem& problem);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_BIPARTITION_H_
