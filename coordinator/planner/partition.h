// Baseline solvers: split units [0, n) into `stages` contiguous, non-empty
// ranges, forward and backward cut at the same place (the Bi-Partition
// solver, with separate cuts, arrives with the planner issue).
//
//  uniform    equal unit counts per stage; the first n % stages stages get
//             one more (GPipe's rule).
//  pipedream  minimises the bottleneck: the largest sum of unit costs
//             (forward + backward) over stages, by dynamic programming over
//             (units covered, stages used), O(stages * n^2). Among equal
//             bottlenecks the first found wins (the last stage's start
//             smallest, then the one before it, ...): deterministic, but
//             not the partition whose first stages end earliest.
//  speed-aware pipedream (what the coordinator's "pipedream" solver runs):
//             the same equal cuts, minimising the Bi-Partition "paper"
//             objective restricted to them: stage k's compute divided by
//             its worker's speed, and each cut's transfer (the activation
//             forward and its gradient back, 2 a(cut) / bandwidth),
//               max( max_k sum_{u in R_k} total(u) / speed_k,
//                    max_{cuts c} 2 a(c) / bandwidth ),
//             so that it is the honest equal-cut baseline for Bi-Partition
//             on mixed workers. Same DP, same tie rule.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_PARTITION_H_
#define PIPETRAIN_COORDINATOR_PLANNER_PARTITION_H_

#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/planner/unit_costs.h"

namespace pipetrain {

struct Range {
  int begin = 0;  // first unit
  int end = 0;    // one past the last unit
  bool operator==(const Range& o) const { return begin == o.begin && end == o.end; }
};

// INVALID_ARGUMENT unless 1 <= stages <= num_units.
absl::StatusOr<std::vector<Range>> UniformPartition(int num_units, int stages);
// Balances total() (the compute; comm_seconds is the speed-aware pair's).
absl::StatusOr<std::vector<Range>> PipeDreamPartition(const std::vector<UnitCost>& costs,
                                                      int stages);

// `speeds[k]` (> 0) is stage k's worker's relative speed (stages =
// speeds.size()), dividing each unit's total() but not its comm_seconds;
// `activation_bytes[u]` the output of unit u per micro-batch; `bandwidth`
// bytes/s (<= 0: unlimited, no transfer term).
absl::StatusOr<std::vector<Range>> SpeedAwarePipeDreamPartition(
    const std::vector<UnitCost>& costs, const std::vector<double>& speeds,
    const std::vector<double>& activation_bytes, double bandwidth);
// Its objective for `ranges` (the same arithmetic as the DP).
double SpeedAwareBottleneck(const std::vector<UnitCost>& costs, const std::vector<double>& speeds,
                            const std::vector<double>& activation_bytes, double bandwidth,
                            const std::vector<Range>& ranges);

// max over ranges of the summed total() cost: the objective pipedream minimises.
double BottleneckCost(const std::vector<UnitCost>& costs, const std::vector<Range>& ranges);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_PARTITION_H_
