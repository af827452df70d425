// What JobManager's source files (job_manager*.cc) share beyond the class
// itself: a bound and the helpers used by more than one of them. Not for
// use outside JobManager.
#ifndef PIPETRAIN_COORDINATOR_JOBS_JOB_MANAGER_INTERNAL_H_
#define PIPETRAIN_COORDINATOR_JOBS_JOB_MANAGER_INTERNAL_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/planner/profile.h"
#include "proto/pipetrain/v1/coordinator.pb.h"
#include "proto/pipetrain/v1/plan.pb.h"
#include "proto/pipetrain/v1/profile.pb.h"
#include "worker/model/gpt_config.h"

namespace pipetrain::job_manager_internal {

// ReportProgressRequest.busy_seconds and idle_seconds: one step's, at most.
// Also a checkpoint's write_seconds.
inline constexpr double kMaxReportedStepSeconds = 1e6;

// The sizes `model`'s shape gives each unit for `request` on workers that
// run attention as `attention` (the analytic profile's), and its FLOPs as
// seconds at kModelSizesFlopsPerSecond: what a worker's profile must agree
// with (CheckWorkerProfile), the transient bytes a device profile does not
// measure (FromProto), and the memory of workers of another kind than the
// profile's (ProfileForAttentions). (job_manager_profiling.cc)
ModelProfile ModelSizes(const GptConfig& model, const v1::ProfileRequest& request,
                        AnalyticAttention attention);

// Whether `marks` (worker id -> incarnation: a job's unfit or
// refused_for_memory workers, the drained ones) holds `worker_id` in this
// very incarnation; one that registered anew since is another worker.
inline bool MarkedInIncarnation(const std::map<std::string, int64_t>& marks,
                                const std::string& worker_id, int64_t incarnation) {
  auto it = marks.find(worker_id);
  return it != marks.end() && it->second == incarnation;
}

// Whether a worker as the registry answered for it is gone: unknown
// (forgotten), LOST or LEFT.
inline bool IsGoneWorker(const absl::StatusOr<v1::Worker>& worker) {
  return !worker.ok() || worker->state() == v1::WORKER_STATE_LOST ||
         worker->state() == v1::WORKER_STATE_LEFT;
}

// The ids in `ids` that are not in `among` (a job's worker_ids, its
// survivors, a placement's joiners), in the order of `ids`: the workers a
// new set adds, or those it leaves out.
template <typename Ids>
std::vector<std::string> NotAmong(const std::vector<std::string>& ids, const Ids& among) {
  std::vector<std::string> out;
  for (const std::string& id : ids) {
    if (std::find(among.begin(), among.end(), id) == among.end()) out.push_back(id);
  }
  return out;
}

// `failed`, an error of a job's final weights file's writer, which names
// the file alone ("cannot fsync final.safetensors"), saying where the file
// is: a full disk or quota is the output directory's. Reworded keeping the
// code and the errno, which the passing-shortage check reads. OK stays OK
// (and costs nothing: a chunk's every write passes here).
// (job_manager_weights.cc)
absl::Status InOutputDir(const absl::Status& failed, const std::string& output_dir,
                         const std::string& name);

// Removes each checkpoint directory of job `job_id` (RemoveCheckpointDir,
// with `written_before`), logging the ones that fail. On io_.
// (job_manager_checkpoints.cc)
void RemoveCheckpointDirs(const std::string& output_dir, const std::string& job_id,
                          const std::vector<v1::ResumeFrom>& dirs,
                          std::optional<absl::Time> written_before = std::nullopt);

}  // namespace pipetrain::job_manager_internal

#endif  // PIPETRAIN_COORDINATOR_JOBS_JOB_MANAGER_INTERNAL_H_
