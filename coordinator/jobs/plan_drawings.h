// The plan's drawings (plan.proto: timeline_svg, chrome_trace_json and
// their measured twins): derived from the plan and the traces, and the bulk
// of a large plan's bytes (megabytes for thousands of micro-batches). The
// coordinator's store never keeps them, and ended jobs drop them from
// memory (JobManagerOptions::max_ended_jobs_with_drawings).
#ifndef PIPETRAIN_COORDINATOR_JOBS_PLAN_DRAWINGS_H_
#define PIPETRAIN_COORDINATOR_JOBS_PLAN_DRAWINGS_H_

#include <string>

#include "absl/status/status.h"
#include "proto/pipetrain/v1/job.pb.h"
#include "proto/pipetrain/v1/plan.pb.h"

namespace pipetrain {

// Empties `plan`'s drawings and frees their memory. (Protobuf's clear_*()
// keeps a string field's buffer for reuse, so the bytes would stay
// allocated as long as the plan.)
void DropPlanDrawings(v1::Plan& plan);

// A copy of `plan` without its drawings, which are set aside for the copy
// and put back (O(1) swaps): a save or a GetPlan without drawings copied
// tens of megabytes of a large plan to throw them away. `plan` is as it
// was on return.
v1::Plan PlanCopyWithoutDrawings(v1::Plan& plan);

// FAILED_PRECONDITION for a request of job `job_id`'s timeline (the REST
// service's timeline.svg, the CLI's --timeline) when its plan has none:
// dropped as above, or by a coordinator restart. `ended`: the job ended
// (in `state`).
absl::Status NoTimelineError(const std::string& job_id, v1::JobState state, bool ended);
// The same for the measured timeline, which a job also lacks until its
// workers have reported a traced step.
absl::Status NoMeasuredTimelineError(const std::string& job_id, v1::JobState state, bool ended);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_JOBS_PLAN_DRAWINGS_H_
