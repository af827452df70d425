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
// (AnalyticUnitCosts) for pipedream and for predicted_iteration_seconds,
// which is the bottleneck stage's FLOPs per micro-batch times
// (m + stages - 1), in FLOPs, not seconds, until profiles exist.
absl::StatusOr<CompiledPlan> PlanJob(const ResolvedJobSpec& resolved, const std::string& job_id,
                                     int64_t version, const std::vector<std::string>& worker_ids);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_PLANNER_H_
