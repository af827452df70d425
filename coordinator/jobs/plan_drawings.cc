#include "coordinator/jobs/plan_drawings.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/enum_names.h"

namespace pipetrain {

void DropPlanDrawings(v1::Plan& plan) {
  // Swapping with an empty string hands the buffer to the temporary, which
  // frees it; the field keeps the empty string's inline storage.
  std::string().swap(*plan.mutable_timeline_svg());
  std::string().swap(*plan.mutable_chrome_trace_json());
  std::string().swap(*plan.mutable_measured_timeline_svg());
  std::string().swap(*plan.mutable_measured_chrome_trace_json());
}

v1::Plan PlanCopyWithoutDrawings(v1::Plan& plan) {
  std::string drawings[4];
  std::string* fields[4] = {plan.mutable_timeline_svg(), plan.mutable_chrome_trace_json(),
                            plan.mutable_measured_timeline_svg(),
                            plan.mutable_measured_chrome_trace_json()};
  for (int i = 0; i < 4; ++i) drawings[i].swap(*fields[i]);
  v1::Plan copy = plan;
  for (int i = 0; i < 4; ++i) drawings[i].swap(*fields[i]);
  return copy;
}

absl::Status NoTimelineError(const std::string& job_id, v1::JobState state, bool ended) {
  return absl::FailedPreconditionError(absl::StrCat(
      "job ", job_id, ended ? absl::StrCat(" ended ", EnumShortName(state), " and its") : "'s",
      " plan keeps no timeline: the coordinator keeps drawings in memory only, for jobs not "
      "ended and the 16 planned jobs that ended last, and a restart drops them (the plan's "
      "numbers stay)"));
}

absl::Status NoMeasuredTimelineError(const std::string& job_id, v1::JobState state, bool ended) {
  return absl::FailedPreconditionError(absl::StrCat(
      "job ", job_id,
      ended ? absl::StrCat(" ended ", EnumShortName(state),
                           " with no measured timeline: its workers trace the plan's 11th step "
                           "(or its last), and the coordinator keeps the trace in memory only, "
                           "for jobs not ended and the 16 planned jobs that ended last (a "
                           "restart loses it)")
            : std::string(" has no measured step yet: its workers trace the plan's 11th step "
                          "(or its last), then every 100th")));
}

}  // namespace pipetrain
