// The per-worker table `pipetrain up` prints after a job: each worker's
// measured compute and waiting time per step (Job.progress's
// stage_times) next to what the plan's simulation predicted for its stage
// position (Plan.stages' predicted_busy_seconds, predicted_idle_seconds),
// so that a user sees which stage set the step time and where the
// prediction went wrong.
#ifndef PIPETRAIN_CLI_STAGE_TIMES_H_
#define PIPETRAIN_CLI_STAGE_TIMES_H_

#include <string>

#include "proto/pipetrain/v1/job.pb.h"
#include "proto/pipetrain/v1/plan.pb.h"

namespace pipetrain {

// At most this many workers are listed (then "... and N more").
inline constexpr int kMaxStageTimeRows = 32;

// Where plan entry `g` (Plan.stages' index: replica-major, then stage,
// then tensor rank) sits: "stage s", with ", replica r" and ", rank t"
// where the plan has replicas or tensor ranks. Requires 0 <= g.
std::string PlanEntryLabel(const v1::Plan& plan, int g);

// A header line and one line per worker of the current plan, e.g.
//   "per step, measured [predicted]: busy, waiting in receives\n"
//   "  w-2    stage 1  28.5 ms [18.7]     7.7 ms [4.3]\n"
// with ", replica r" and ", rank t" where the plan has replicas or tensor
// ranks (the column as wide as its longest entry), and "-" where a worker reported no step yet.
// Busy is everything but idle (StageTime): computing, and also handing sends over and waiting for
// the last ones at the step's end, which the simulation's compute does not count. Idle, the
// second column, is waiting in receives and blocked in collectives with other stages or replicas
// (the data-parallel all-reduce, which the prediction counts in neither, the clipping's norm
// broadcasts, the loss gather).
// Empty when the job has no stage times or they do not match the plan (a re-plan since).
std::string FormatStageTimes(const v1::Job& job, const v1::Plan& plan);

// The step time the workers measured on the current plan: the largest of
// their (busy + idle) / steps (a step's wall time on each worker; they run
// in lockstep), over the plan's steps so far, its first ones included. 0
// when no worker has a step yet or the stage times are another plan's.
double WorkersStepSeconds(const v1::Job& job, const v1::Plan& plan);

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_STAGE_TIMES_H_
