#include "cli/stage_times.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pipetrain {

namespace {

// "28.5 ms [18.7]", or "- [18.7]" without a measured step.
std::string Cell(double measured_seconds, int64_t steps, double predicted_seconds) {
  const std::string measured =
      steps > 0 ? absl::StrFormat("%.1f ms", 1e3 * measured_seconds / steps) : std::string("-");
  return absl::StrFormat("%s [%.1f]", measured, 1e3 * predicted_seconds);
}

// Whether the job's stage times are those of `plan`'s workers, in its order.
bool TimesMatchPlan(const v1::Job& job, const v1::Plan& plan) {
  const auto& times = job.progress().stage_times();
  if (times.empty() || times.size() != plan.stages_size()) return false;
  for (int g = 0; g < times.size(); ++g) {
    if (times[g].worker_id() != plan.stages(g).worker_id()) return false;  // another plan's
  }
  return true;
}

}  // namespace

double WorkersStepSeconds(const v1::Job& job, const v1::Plan& plan) {
  if (!TimesMatchPlan(job, plan)) return 0;
  double slowest = 0;
  for (const v1::StageTime& t : job.progress().stage_times()) {
    if (t.steps() == 0) continue;
    slowest = std::max(slowest, (t.busy_seconds() + t.idle_seconds()) / t.steps());
  }
  return slowest;
}

std::string PlanEntryLabel(const v1::Plan& plan, int g) {
  const int64_t tensor = std::max(1, plan.tensor_parallel());
  const int64_t replicas = std::max(1, plan.data_parallel());
  // The coordinator's plan, as it sent it: a layout that cannot hold the
  // entries (a faulty or hostile answer; their product overflowed int and
  // divided by zero) is labelled by index alone.
  if (tensor * replicas > plan.stages_size()) return absl::StrCat("entry ", g);
  const int64_t stages = std::max<int64_t>(1, plan.stages_size() / (tensor * replicas));
  std::string where = absl::StrCat("stage ", g / tensor % stages);
  if (replicas > 1) absl::StrAppend(&where, ", replica ", g / (tensor * stages));
  if (tensor > 1) absl::StrAppend(&where, ", rank ", g % tensor);
  return where;
}

std::string FormatStageTimes(const v1::Job& job, const v1::Plan& plan) {
  if (!TimesMatchPlan(job, plan)) return "";
  const auto& times = job.progress().stage_times();
  std::string out = "per step, measured [predicted]: busy, waiting (receives, collectives)\n";
  const int rows = std::min(times.size(), kMaxStageTimeRows);
  std::vector<std::string> where(rows);
  size_t width = 0;
  for (int g = 0; g < rows; ++g) {
    where[g] = PlanEntryLabel(plan, g);
    width = std::max(width, where[g].size());
  }
  for (int g = 0; g < rows; ++g) {
    const v1::StageTime& t = times[g];
    const v1::PlanStage& p = plan.stages(g);
    absl::StrAppendFormat(&out, "  %-6s %-*s  %-18s %s\n", t.worker_id(), static_cast<int>(width),
                          where[g], Cell(t.busy_seconds(), t.steps(), p.predicted_busy_seconds()),
                          Cell(t.idle_seconds(), t.steps(), p.predicted_idle_seconds()));
  }
  if (times.size() > rows) absl::StrAppend(&out, "  ... and ", times.size() - rows, " more\n");
  return out;
}

}  // namespace pipetrain
