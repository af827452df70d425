// The plan's drawings (plan.proto: timeline_svg, chrome_trace_json and
// their measured twins): derived from the plan and the traces, and the bulk
// of a large plan's bytes (megabytes for thousands of micro-batches). The
// coordinator's store never keeps them, and ended jobs drop them from
// memory (JobManagerOptions::max_ended_jobs_with_drawings).
#ifndef PIPETRAIN_COORDINATOR_JOBS_PLAN_DRAWINGS_H_
#define PIPETRAIN_COORDINATOR_JOBS_PLAN_DRAWINGS_H_

#include "proto/pipetrain/v1/plan.pb.h"

namespace pipetrain {

// Empties `plan`'s drawings and frees their memory. (Protobuf's clear_*()
// keeps a string field's buffer for reuse, so the bytes would stay
// allocated as long as the plan.)
void DropPlanDrawings(v1::Plan& plan);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_JOBS_PLAN_DRAWINGS_H_
