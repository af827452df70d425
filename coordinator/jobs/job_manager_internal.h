// What JobManager's source files (job_manager*.cc) share beyond the class
// itself: a bound and two helpers used by more than one of them. Not for
// use outside JobManager.
#ifndef PIPETRAIN_COORDINATOR_JOBS_JOB_MANAGER_INTERNAL_H_
#define PIPETRAIN_COORDINATOR_JOBS_JOB_MANAGER_INTERNAL_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "proto/pipetrain/v1/coordinator.pb.h"
#include "proto/pipetrain/v1/plan.pb.h"

namespace pipetrain::job_manager_internal {

// ReportProgressRequest.busy_seconds and idle_seconds: one step's, at most.
// Also a checkpoint's write_seconds.
inline constexpr double kMaxReportedStepSeconds = 1e6;

// The GEMM rate `w`'s cores reach: on the CPU, the best start-up probe of
// the workers in `workers` on w's host (they compute on the same cores; a
// probe taken while others probed too measures that contention, which the
// planner models itself, coordinator/planner/host_sharing.h); on a GPU,
// w's own. (job_manager_placement.cc)
double HostGflops(const std::vector<v1::Worker>& workers, const v1::Worker& w);

// Removes each checkpoint directory of job `job_id` (RemoveCheckpointDir,
// with `written_before`), logging the ones that fail. On io_.
// (job_manager_checkpoints.cc)
void RemoveCheckpointDirs(const std::string& output_dir, const std::string& job_id,
                          const std::vector<v1::ResumeFrom>& dirs,
                          std::optional<absl::Time> written_before = std::nullopt);

}  // namespace pipetrain::job_manager_internal

#endif  // PIPETRAIN_COORDINATOR_JOBS_JOB_MANAGER_INTERNAL_H_
