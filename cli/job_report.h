// The report printed when a followed job ends, by `pipetrain up` and by
// `pipetrain submit --follow`: how it ended (final loss, the mean of its
// last steps, validation, weights), the layout an auto job's planner chose,
// the stages whose data-parallel all-reduce went compressed, the tensor
// partitions, the step time measured next to the plan's prediction, and
// the per-worker table (stage_times.h). Everything comes from the
// coordinator's Job and Plan, so a client of a remote cluster sees what
// `up` shows (`up` adds what it reads from its own workers' metrics).
#ifndef PIPETRAIN_CLI_JOB_REPORT_H_
#define PIPETRAIN_CLI_JOB_REPORT_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "proto/pipetrain/v1/job.pb.h"
#include "proto/pipetrain/v1/plan.pb.h"

namespace pipetrain {

// Steps averaged for the smoothed final loss.
inline constexpr int kLossTailSteps = 20;

// When the steps went by, as a client polling the job saw them: the first
// sighting at or past a tenth of the steps (start-up, profiling and the
// first steps' warm-up left out) and the last one, of the job's last plan
// (a re-plan starts them again: the prediction is that plan's).
struct StepTiming {
  absl::Time first_time, last_time;
  int64_t first_step = -1, last_step = -1;
  // Records a sighting of `step` (of `steps`) at `now` while the job runs.
  void Saw(int64_t step, int64_t steps, absl::Time now);
  // Seconds per step between the two sightings; 0 when too few steps.
  double SecondsPerStep() const;
};

// "job ID SUCCEEDED after N steps, final loss L (mean of the last 20 steps M)\n"
// (a job still going: "job ID RUNNING at step N of S, loss L ..."; before
// its first step "job ID QUEUED, no step yet"),
// then "validation loss ..." when the job validated, "reason: ..." when it
// has one, and "weights: PATH" when it wrote them. `end` should be a
// JOB_VIEW_FULL Job (the mean needs the loss history; left out without it).
std::string FormatJobOutcome(const v1::Job& end);

// What the plan the job ended on did, one line per fact that applies:
//   "layout: 2 replicas x 2 stages ... chosen by ..." (an auto layout; "(last
//     plan)" after a re-plan),
//   "data-parallel all-reduce: powersgd rank 4 on stages [0] of 2",
//   "tensor partitions per unit: forward [...], backward [...]",
//   "step time: measured 0.0310 s (steps 80-799), predicted 0.0285 s by
//     the plan's simulation (-8%; <profile source>)" (when the plan has a
//     prediction: measured by `timing` when it has two sightings, else by
//     the workers' stage times, WorkersStepSeconds in stage_times.h),
// then FormatStageTimes' table and FormatPassTimes' (pass_times.h).
std::string FormatPlanReport(const v1::Job& end, const v1::Plan& plan, const StepTiming& timing);

// A plan's micro-batches as its layout splits them: "8 micro-batches", "4
// micro-batches per replica x 2 replicas" (plan.micro_batches is per
// replica: alone, a re-plan onto another D read as a change of the global
// batch), then ", 2 tensor ranks per stage" with tensor parallelism.
std::string FormatPlanMicroBatches(const v1::Plan& plan);

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_JOB_REPORT_H_
