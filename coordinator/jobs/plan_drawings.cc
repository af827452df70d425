#include "coordinator/jobs/plan_drawings.h"

#include <string>

namespace pipetrain {

void DropPlanDrawings(v1::Plan& plan) {
  // Swapping with an empty string hands the buffer to the temporary, which
  // frees it; the field keeps the empty string's inline storage.
  std::string().swap(*plan.mutable_timeline_svg());
  std::string().swap(*plan.mutable_chrome_trace_json());
  std::string().swap(*plan.mutable_measured_timeline_svg());
  std::string().swap(*plan.mutable_measured_chrome_trace_json());
}

}  // namespace pipetrain
