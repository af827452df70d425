// Facts about a job's state that the coordinator and the CLI both need.
#ifndef PIPETRAIN_COMMON_JOB_STATE_H_
#define PIPETRAIN_COMMON_JOB_STATE_H_

#include "proto/pipetrain/v1/job.pb.h"

namespace pipetrain {

// Whether a job in `state` has ended for good: SUCCEEDED, FAILED or
// CANCELLED. Every other state (RECOVERING included) may still change.
bool IsTerminal(v1::JobState state);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_JOB_STATE_H_
