// The workers' measured timeline of one training step: their StepTraces
// (plan.proto; when each instruction of a worker's program ran) turned
// into the simulator's result type, so that timeline_render.h draws the
// measurement exactly as it draws the prediction (Plan.measured_timeline_svg
// beside Plan.timeline_svg).
//
// Lanes line up by the workers' wall clocks at the step's start
// (StepTrace.start_time): exact for workers on one host, off by the hosts'
// clock offsets otherwise. Drawn: forward, backward and recompute passes,
// optimizer steps, the waits in receives and for the data-parallel
// all-reduce, the fused embedding sync, and the sends' hand-offs to the
// data plane (kSendHandoff). Not drawn: transfers (a send returns once
// queued, so its time on the wire is not measured), the decoding after
// a receive's wait, and a compute pass's wait before it for queued sends
// to leave (a slow link: StageRuntime paces its sends; idle, left blank).
//
// Thread-safety: pure functions.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_MEASURED_TIMELINE_H_
#define PIPETRAIN_COORDINATOR_PLANNER_MEASURED_TIMELINE_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/planner/simulator.h"
#include "proto/pipetrain/v1/plan.pb.h"

namespace pipetrain {

// The most seconds a trace may span (as ReportProgressRequest's times).
inline constexpr double kMaxTracedStepSeconds = 1e6;

// Checks a worker's trace of `iteration` against its program, as
// ReportProgressRequest.trace documents: INVALID_ARGUMENT naming the field
// otherwise (e.g. "ReportProgressRequest.trace.instructions[3].end_seconds").
absl::Status CheckStepTrace(const v1::StepTrace& trace, int64_t iteration,
                            const v1::Program& program);

// The most instruction timings a measured timeline draws: at about 250
// bytes of SVG and 200 of Chrome trace each, a plan's reply stays near
// 25 MB, within the CLI's 64 MiB (coordinator_client.cc). A job whose
// workers' programs hold more is drawn for its first workers only.
inline constexpr int64_t kMaxMeasuredTimelineTimings = 50000;

// How many of the leading lanes fit: the largest k such that the first k
// of `timings` (instruction timings per worker, in lane order) sum to at
// most `max_timings`; at least 1 when there is a lane, so that a job is
// never drawn with none.
int LeadingLanesWithin(const std::vector<int>& timings, int64_t max_timings);

// One lane per worker: programs[w] ran as traces[w] says (both the same
// size, each trace checked by CheckStepTrace). Time 0 is the earliest
// start_time; iteration_seconds the last worker's end. busy_seconds[w] is
// the worker's step less its waits in receives and for the all-reduce,
// all_reduce_seconds[w] the latter; idle what is left of the iteration.
// INVALID_ARGUMENT when the sizes differ or there is no worker.
absl::StatusOr<SimulationResult> MeasuredTimeline(const std::vector<const v1::Program*>& programs,
                                                  const std::vector<const v1::StepTrace*>& traces);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_MEASURED_TIMELINE_H_
