#include "coordinator/planner/planner.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/planner/partition.h"
#include "coordinator/planner/schedule_compiler.h"
#include "coordinator/planner/unit_costs.h"

namespace pipetrain {

absl::StatusOr<CompiledPlan> PlanJob(const ResolvedJobSpec& r, const std::string& job_id,
                                     int64_t version, const std::vector<std::string>& worker_ids,
                                     double flops_per_second) {
  if (static_cast<int>(worker_ids.size()) != r.stages) {
    return absl::InvalidArgumentError(
        absl::StrCat(worker_ids.size(), " workers for ", r.stages, " stages"));
  }
  const TrainConfig& t = r.train;
  const int units = NumUnits(t.model);
  const int micro = t.micro_batches;
  const auto costs = AnalyticUnitCosts(t.model, t.seq_len, t.batch_size / micro);
  std::vector<Range> ranges;
  if (r.solver == kSolverPipeDream) {
    ASSIGN_OR_RETURN(ranges, PipeDreamPartition(costs, r.stages));
  } else {
    ASSIGN_OR_RETURN(ranges, UniformPartition(units, r.stages));
  }
  ASSIGN_OR_RETURN(Schedule schedule, ParseSchedule(r.schedule));
  CompiledPlan out;
  ASSIGN_OR_RETURN(out.programs, CompilePrograms(ranges, units, micro, schedule));
  v1::Plan& plan = out.plan;
  plan.set_job_id(job_id);
  plan.set_version(version);
  plan.set_solver(r.solver);
  plan.set_schedule(r.schedule);
  plan.set_micro_batches(micro);
  for (size_t s = 0; s < ranges.size(); ++s) {
    v1::PlanStage* stage = plan.add_stages();
    stage->set_worker_id(worker_ids[s]);
    for (v1::UnitRange* range : {stage->mutable_forward(), stage->mutable_backward()}) {
      range->set_begin(ranges[s].begin);
      range->set_end(ranges[s].end);
    }
  }
  const double critical_path_flops = BottleneckCost(costs, ranges) * (micro + r.stages - 1);
  plan.set_predicted_iteration_seconds(
      flops_per_second > 0 ? critical_path_flops / flops_per_second : 0.0);
  return out;
}

}  // namespace pipetrain
