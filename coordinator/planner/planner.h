// Planner: from a resolved job spec and the chosen workers to a Plan (unit
// ranges per stage) and one compiled program per stage.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_PLANNER_H_
#define PIPETRAIN_COORDINATOR_PLANNER_PLANNER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/jobs/job_spec.h"
#include "proto/pipetrain/v1/plan.pb.h"

namespace pipetrain {

struct CompiledPlan {
  v1::Plan plan;
  std::vector<v1::Program> programs;  // per stage
};

// Requires worker_ids.size() == resolved.stages. Uses analytic unit costs
// (AnalyticUnitCosts) for pipedream and for predicted_iteration_seconds:
// the bottleneck stage's FLOPs per micro-batch times (m + stages - 1), the
// 1F1B/GPipe critical path, divided by `flops_per_second`, the slowest
// chosen worker's measured GEMM rate (an optimistic estimate: GEMM peak, no
// communication; profiles replace it in the planner issue). With
// flops_per_second <= 0 the prediction is 0 (unknown).
absl::StatusOr<CompiledPlan> PlanJob(const ResolvedJobSpec& resolved, const std::string& job_id,
                                     int64_t version, const std::vector<std::string>& worker_ids,
                                     double flops_per_second);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_PLANNER_H_
