// Which training steps the workers trace (ReportProgressRequest.trace,
// drawn as Plan.measured_timeline_svg): the plan's 11th step, when caches
// and allocators are warm (or its last, when it has fewer), then every
// 100th after it. Every worker of a plan applies the rule to the same
// start and step count, so they all trace the same steps.
#ifndef PIPETRAIN_WORKER_AGENT_STEP_TRACING_H_
#define PIPETRAIN_WORKER_AGENT_STEP_TRACING_H_

#include <algorithm>
#include <cstdint>

namespace pipetrain {

inline constexpr int64_t kFirstTracedStepOffset = 10;
inline constexpr int64_t kTracedStepInterval = 100;

// Whether iteration `iteration` of a plan that runs iterations
// [plan_start, steps) is traced.
inline bool IsTracedStep(int64_t iteration, int64_t plan_start, int64_t steps) {
  if (iteration < plan_start || iteration >= steps) return false;
  const int64_t first = plan_start + std::min(kFirstTracedStepOffset, steps - 1 - plan_start);
  return iteration >= first && (iteration - first) % kTracedStepInterval == 0;
}

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_AGENT_STEP_TRACING_H_
