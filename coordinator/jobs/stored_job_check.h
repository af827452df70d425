// Checks of a job's state as the state store hands it back
// (JobManager::Restore). The store is the coordinator's own, but one
// written by another version, or an etcd that others can write
// (docs/fuzzing.md), is input like any request: its numbers reach
// indexing, CHECKs (a unit past the model's end), divisions (the plan's
// degrees, in /metrics) and counters that later grow (a step, a
// recovery, a plan version). Each function returns "" when what it checks
// fits, else what does not, for the job's reason.
#ifndef PIPETRAIN_COORDINATOR_JOBS_STORED_JOB_CHECK_H_
#define PIPETRAIN_COORDINATOR_JOBS_STORED_JOB_CHECK_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/planner/profile.h"
#include "google/protobuf/timestamp.pb.h"
#include "proto/pipetrain/v1/job.pb.h"
#include "proto/pipetrain/v1/plan.pb.h"
#include "worker/model/gpt_config.h"

namespace pipetrain {

// The largest step, count or version a stored job may carry: far above
// any real job's (kMaxSteps steps, a plan version per membership change),
// and far enough below INT64_MAX that adding to it cannot overflow.
inline constexpr int64_t kMaxStoredCount = int64_t{1} << 53;
// The most recoveries (an int32 that grows by one per recovery).
inline constexpr int32_t kMaxStoredRecoveries = int32_t{1} << 30;

// A plan: version in [0, kMaxStoredCount]; data_parallel in [0,
// kMaxStages] and tensor_parallel in [0, kMaxTensorParallel]
// (spec/job_spec.h), with a whole number of stage entries per replica and
// tensor rank (0 counts as 1); with `units` (the job's model has that
// many; nullopt when its spec no longer resolves), every stage's forward
// and backward range inside [0, units].
std::string StoredPlanMismatch(const v1::Plan& plan, std::optional<int> units);

// A profile the planner will split `model` by: one unit per unit of the
// model, named as UnitName names it, in order.
std::string StoredProfileMismatch(const ModelProfile& profile, const GptConfig& model);

// What of a stored job this build does not know, as a newer coordinator
// stores it: the first field of `spec` (at any depth) unknown to this
// build ("spec.parallelism has field number 9999"), else the first key of
// `profile_json` ParseProfileJson does not know ("profile_json has key
// units[0].future_key"); "" when neither. Every stored spec is the
// resolved one, which sets each field it has, so a newer coordinator's
// jobs carry each field added since that they use (proto3 stores no
// scalar left at its default; a profile key only when above 0); restored,
// ResolveJobSpec and ParseProfileJson would refuse them, and the job fail
// for good. New values of known fields (a solver or codec name added
// later) are not found here: such a job still fails.
std::string StoredFieldOfANewerBuild(const v1::JobSpec& spec, const std::string& profile_json);

// The job's counters and its checkpoints' steps: plan_version,
// progress.step, val_step, loss_history_start, checkpoint_step,
// steps_redone, checkpoint_failures and every checkpoint's step in
// [0, kMaxStoredCount], and so the step of the checkpoint the job started
// from (`init_checkpoint`, null when it started from none); recoveries and
// `recoveries_without_progress` in [0, kMaxStoredRecoveries].
std::string StoredCountersMismatch(const v1::Job& job,
                                   const std::vector<v1::ResumeFrom>& checkpoints,
                                   const v1::ResumeFrom* init_checkpoint,
                                   int32_t recoveries_without_progress);

// How far past the restoring coordinator's clock a stored time may lie:
// coordinators' clocks (NTP) differ by seconds, not a day. A later time
// (stored by a coordinator whose clock ran further ahead, or read by one
// whose clock is behind) is replaced by the restoring coordinator's now,
// with a warning; the job is not failed for it.
inline constexpr absl::Duration kMaxStoredTimeAhead = absl::Hours(24);

// Whether `time` (a job's create_time, update_time or a plan's time) is
// one a coordinator could have made by `now`: nanos in [0, 1e9), seconds
// from the Unix epoch (no coordinator's clock reads earlier) to
// `now` + kMaxStoredTimeAhead, and within the Timestamp's range (to
// 9999-12-31T23:59:59Z). A later one is a damaged record (or a clock far
// off): a creation time dates every later job after it (they only
// increase, as list pages resume by them), so all go as far ahead; past
// 2262 the list pages' nanosecond keys saturate and tie, and past 9999, or
// with nanos outside the range, protobuf's JSON printer refuses each such
// job (the REST API answered 500).
bool StoredTimeFits(const google::protobuf::Timestamp& time, absl::Time now);

// The job's create_time, update_time and every plan_history[].time, by
// StoredTimeFits.
std::string StoredTimesMismatch(const v1::Job& job, absl::Time now);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_JOBS_STORED_JOB_CHECK_H_
