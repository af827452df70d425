// Baseline solvers: split units [0, n) into `stages` contiguous, non-empty
// ranges, forward and backward cut at the same place (the Bi-Partition
// solver, with separate cuts, arrives with the planner issue).
//
//  uniform    equal unit counts per stage; the first n % stages stages get
//             one more (GPipe's rule).
//  pipedream  minimises the bottleneck: the largest sum of unit costs
//             (forward + backward) over stages, by dynamic programming over
//             (units covered, stages used), O(stages * n^2). Ties go to the
//             partition whose first stages end earliest, so results are
//             deterministic.
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
absl::StatusOr<std::vector<Range>> PipeDreamPartition(const std::vector<UnitCost>& costs,
                                                      int stages);

// max over ranges of the summed total() cost: the objective pipedream minimises.
double BottleneckCost(const std::vector<UnitCost>& costs, const std::vector<Range>& ranges);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_PARTITION_H_
