// JobManager: the stages' progress reports (ReportProgress): their bounds,
// the loss history, a stage's end and the job's completion. Contracts:
// job_manager.h.
#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/enum_names.h"
#include "common/log_rate_limiter.h"
#include "common/logging.h"
#include "common/secrets.h"
#include "common/status_macros.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/job_manager_internal.h"
#include "coordinator/planner/measured_timeline.h"
#include "worker/model/gpt_config.h"
#include "worker/train/divergence.h"

namespace pipetrain {

using job_manager_internal::InOutputDir;
using job_manager_internal::kMaxReportedStepSeconds;

namespace {

// A worker's error text becomes the job's reason, which every GetJob returns.
constexpr size_t kMaxReportedErrorBytes = 16384;

v1::Assignment StopAssignment(const std::string& job_id, int64_t version) {
  v1::Assignment a;
  a.set_action(v1::Assignment::ACTION_STOP);
  a.set_job_id(job_id);
  a.set_plan_version(version);
  return a;
}

// "; not at the start barrier: 2=w-3 (check their logs first)": the stages
// whose ready[s] is false, by index and worker as the reason's "[stages: ]"
// list; "" when none. At most 8 named, then how many more: a job may have
// hundreds of stages, and the reason is in every GetJob.
std::string NotAtTheStartBarrier(const v1::Job& job, const std::vector<bool>& ready) {
  constexpr size_t kMaxNamed = 8;
  std::vector<std::string> named;
  int more = 0;
  for (int s = 0; s < job.worker_ids_size() && s < static_cast<int>(ready.size()); ++s) {
    if (ready[s]) continue;
    if (named.size() < kMaxNamed) {
      named.push_back(absl::StrCat(s, "=", job.worker_ids(s)));
    } else {
      ++more;
    }
  }
  if (named.empty()) return "";
  return absl::StrCat("; not at the start barrier: ", absl::StrJoin(named, ", "),
                      more > 0 ? absl::StrCat(" and ", more, " more") : "",
                      " (check their logs first)");
}

}  // namespace

absl::StatusOr<JobManager::JobRecord*> JobManager::ForWorkerLocked(const std::string& worker_id,
                                                                   const std::string& job_id) {
  RETURN_IF_ERROR(CheckIdArgument("job id", job_id));  // bounded before it is echoed
  JobRecord* record = FindLocked(job_id);
  if (record == nullptr) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  if (IsTerminal(record->job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " already ended (", EnumShortName(record->job.state()), ")"));
  }
  if (record->stage_of.count(worker_id) == 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("worker ", worker_id, " is not part of job ", job_id));
  }
  return record;
}

absl::StatusOr<v1::ReportProgressResponse> JobManager::ReportProgress(
    const v1::ReportProgressRequest& r, ProgressCounted* counted) {
  ProgressCounted ignored;
  if (counted == nullptr) counted = &ignored;
  *counted = ProgressCounted();
  AnnotatedMutexLock lock(&mu_);
  v1::ReportProgressResponse response;
  ASSIGN_OR_RETURN(JobRecord * record, ForWorkerLocked(r.worker_id(), r.job_id()));
  if (r.plan_version() != record->plan.version()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "plan version ", r.plan_version(), " is stale; current is ", record->plan.version()));
  }
  RETURN_IF_ERROR(CheckProgressBounds(r, *record));
  const int stage_index = record->stage_of.at(r.worker_id());
  // A recovering job drops traces (below), and one restored from the store
  // has no assignments to check them against until it is planned again.
  const bool stopped = record->job.state() == v1::JOB_STATE_RECOVERING ||
                       record->job.state() == v1::JOB_STATE_PLANNING || record->writing_weights;
  if (r.has_trace() && !stopped) {
    if (stage_index >= static_cast<int>(record->assignments.size())) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", r.job_id(), " has no program for stage ", stage_index, " yet"));
    }
    RETURN_IF_ERROR(
        CheckStepTrace(r.trace(), r.iteration(), record->assignments[stage_index].program));
  }
  response.set_stop_after_step(record->stop_at);
  // Data parallelism: replica 0 speaks for all (the replicas hold the same
  // weights, and its loss stage reports every replica's losses); tensor
  // parallelism: rank 0 for its stage's ranks (they compute the same loss).
  const bool replica_zero = stage_index < StagesPerReplica(*record);
  const bool speaks = replica_zero && stage_index % TensorRanks(*record) == 0;
  if (r.has_checkpoint()) {
    if (!replica_zero) {
      return absl::PermissionDeniedError(absl::StrCat(
          "ReportProgressRequest.checkpoint: ", r.worker_id(),
          " runs a data-parallel replica other than 0, whose stages write no checkpoints"));
    }
    // Every tensor rank of a stage holds the same units; rank 0 writes
    // their files, and a report from another could replace its checksums.
    if (const int rank = stage_index % TensorRanks(*record); rank != 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("ReportProgressRequest.checkpoint: ", r.worker_id(), " runs tensor rank ",
                       rank, " of its stage; only rank 0 writes and reports checkpoints"));
    }
    // A writer of the stopped plan that finished after the job stopped: a
    // checkpoint it completed now could expire the one the re-plan resumes
    // from (kept: spec.checkpoint.keep), so it counts for nothing.
    if (stopped) {
      // Rate-limited, as below: a worker's retries come at RPC rate.
      static LogRateLimiter ignored_log(10, absl::Seconds(10));
      if (int64_t dropped = 0; ignored_log.Allow(&dropped)) {
        PT_LOG(INFO) << "job " << r.job_id() << ": checkpoint of step " << r.checkpoint().step()
                     << " from " << r.worker_id() << " ignored: the job is "
                     << EnumShortName(record->job.state()) << LogRateLimiter::Dropped(dropped);
      }
      response.set_all_ready(true);
      return response;
    }
    RETURN_IF_ERROR(AddCheckpointLocked(*record, stage_index, r.checkpoint()));
    response.set_all_ready(true);
    return response;
  }
  // The stopped plan's last words: its steps will be redone, or (being
  // re-planned at a boundary) it stopped after the boundary's step, or it
  // finished and its weights are being written.
  if (stopped) return response;
  if (!r.error().empty()) {
    StageFailedLocked(*record, stage_index, r);
    return response;
  }
  // Only a stage that runs the model's last unit forward computes a loss
  // (and a validation loss). One from any other is a fault or a lie, and
  // refused before anything of the report is applied: the job's loss is
  // taken from replica 0's loss stage alone.
  RETURN_IF_ERROR(CheckLossStage(r, *record, stage_index));
  // The tokens every stage trains on: the first digest a job hears is its
  // own (the first plan's stages are compared with each other here, before
  // any of them passes the start barrier); later plans' stages check theirs
  // against it themselves (Assignment.data_sha256), and here again.
  if (!TakeDataDigestLocked(*record, r)) return response;  // ended: other tokens
  StageProgress& stage = record->stages[stage_index];
  // The slowest stage's checkpoint load: sent with the start barrier, or
  // (a plan without one) with the first iteration's report.
  const double load = r.resume_load_seconds();
  if (std::isfinite(load) && load > 0 && load < 1e6 && record->job.plan_history_size() > 0) {
    v1::PlanVersion* v = record->job.mutable_plan_history(record->job.plan_history_size() - 1);
    v->set_resume_load_seconds(std::max(v->resume_load_seconds(), load));
  }
  if (r.ready()) {
    stage.ready = true;
    response.set_all_ready(std::all_of(record->stages.begin(), record->stages.end(),
                                       [](const StageProgress& s) { return s.ready; }));
    return response;
  }
  // A stage reports its iterations in order, each once: one already counted
  // is a retry whose answer was lost (JobRunner::ReportWithRetries), answered
  // as before but not applied again (its loss and times added twice).
  if (r.iteration() < stage.iterations_done) {
    // At most 10 lines per 10 s: a worker that repeats a report in a loop
    // (a fault, or a host not to be trusted) must not flood the log.
    static LogRateLimiter repeats_log(10, absl::Seconds(10));
    if (int64_t dropped = 0; repeats_log.Allow(&dropped)) {
      PT_LOG(INFO) << "job " << r.job_id() << ": " << r.worker_id() << "'s report of iteration "
                   << r.iteration() << " came again; counted once"
                   << LogRateLimiter::Dropped(dropped);
    }
    return response;
  }
  stage.iterations_done = r.iteration() + 1;
  record->join_crashes.erase(r.worker_id());  // it took part: no longer a crashing joiner
  counted->stage_time = true;
  counted->worker_index = stage_index;
  counted->workers = record->job.worker_ids_size();
  counted->replicas = std::max(1, record->job.spec().parallelism().data());
  counted->tensor = std::max(1, record->job.spec().parallelism().tensor());
  if (r.has_trace()) AddTraceLocked(*record, stage_index, r.trace());
  if (stage_index < record->job.progress().stage_times_size()) {
    v1::StageTime* time = record->job.mutable_progress()->mutable_stage_times(stage_index);
    time->set_steps(time->steps() + 1);
    time->set_busy_seconds(time->busy_seconds() + r.busy_seconds());
    time->set_idle_seconds(time->idle_seconds() + r.idle_seconds());
  }
  stage.finished = stage.finished || r.finished();
  if (r.finished()) stage.weights_digest = r.weights_digest();
  if (r.micro_batch_losses_size() > 0 && speaks && !RecordStepLossLocked(*record, r, counted)) {
    return response;  // diverged: the job ended
  }
  if (r.has_val_loss() && speaks && !RecordValLossLocked(*record, r)) {
    return response;  // diverged: the job ended
  }
  TouchLocked(*record);
  MaybeCompleteLocked(*record);
  // Last: a re-plan replaces the stages (and `stage`).
  MaybeReplanAtBoundaryLocked(*record);
  response.set_all_ready(true);
  return response;
}

void JobManager::StageFailedLocked(JobRecord& record, int stage_index,
                                   const v1::ReportProgressRequest& r) {
  // Errors name peers by stage; say which worker runs each stage.
  std::vector<std::string> stages;
  for (int s = 0; s < record.job.worker_ids_size(); ++s) {
    stages.push_back(absl::StrCat(s, "=", record.job.worker_ids(s)));
  }
  std::string reason = absl::StrCat("worker ", r.worker_id(), ": ", r.error(),
                                    " [stages: ", absl::StrJoin(stages, ", "), "]");
  // A stage that failed waiting at the start barrier (its wait runs from
  // its own arrival, so the first to give up is the first that came: a
  // healthy one) cannot say which peer kept it waiting; the coordinator
  // can. Named, so that the operator reads that worker's log, and a drain
  // is not aimed at the one that waited. (One that failed before it was
  // ready failed on its own: its error says why.)
  if (record.stages[stage_index].ready) {
    std::vector<bool> ready;
    for (const StageProgress& stage : record.stages) ready.push_back(stage.ready);
    absl::StrAppend(&reason, NotAtTheStartBarrier(record.job, ready));
  }
  // A stage says its plan's resume point is unusable while it loads it,
  // before its first iteration (JobRunner; a stage of a device or replica
  // group passes the start barrier first, as the group's join needs every
  // member). Only then is the claim taken, and only that checkpoint
  // dropped: said at any other time it is an error like any other, so that
  // one worker cannot drop a job's checkpoints one after another.
  const JobRecord::AssignedStage* assigned =
      stage_index < static_cast<int>(record.assignments.size()) ? &record.assignments[stage_index]
                                                                : nullptr;
  std::optional<v1::ResumeFrom> dropped;
  if (r.checkpoint_unusable() && record.checkpoints != nullptr && assigned != nullptr &&
      assigned->resume.has_value() && record.stages[stage_index].iterations_done == 0 &&
      !record.stages[stage_index].finished) {
    dropped = record.checkpoints->Drop(assigned->resume->step());
  }
  if (dropped.has_value()) {
    // Its files go, manifest first: kept, `init.from: <the job's
    // directory>` and `checkpoint export` would take it for the newest
    // complete checkpoint. As an expired one's, only after a save that no
    // longer names it (the recovery's, below): removed before, a save that
    // failed (or a coordinator stopped first) left a stored state whose
    // newest checkpoint was gone, and every recovery from it failed on
    // the missing directory until the job gave up, older checkpoints
    // intact. Its unit files only if written before this drop: the redo
    // writes the step again after a re-plan, possibly before the removal
    // runs. The manifest whatever its time: its write may run late on io_
    // too, and a redo's manifest is queued on io_ after the removal (a
    // redo that completes first takes the directory off the list).
    // "Before" by the file system's clock, which dates the files: this
    // host's (absl::Now()) deleted a redo's units written on a file server
    // whose clock is behind. Their newest time, read by the first io_ task
    // that asks after this drop (the one queued here, or an earlier
    // queued save's removal: io_ runs in order), before the redo writes:
    // that takes a new plan, handed out under mu_ after this, and the
    // reading counts only if the plan is still this one once it is done
    // (DroppedFilesBound). Not here: file IO stays off the lock.
    if (!options_.output_dir.empty()) {
      ExpiredCheckpoint gone{*dropped, absl::Now()};
      gone.dropped_on_plan = record.plan.version();
      gone.manifest_whatever_its_time = true;
      record.expiring.push_back(std::move(gone));
      io_.Post([this, id = record.job.id(), from = *dropped] { DroppedFilesBound(id, from); });
    }
    record.job.mutable_progress()->set_checkpoint_step(
        record.checkpoints->Latest() != nullptr ? record.checkpoints->Latest()->step() : 0);
    StartRecoveryLocked(
        record, "",
        absl::StrCat("checkpoint ", dropped->dir(), " could not be loaded (", reason, ")"),
        RecoveryKind::kCheckpointUnusable);
  } else if (!r.peer_failure() && !r.checkpoint_unusable() && record.checkpoints != nullptr &&
             !record.stages[stage_index].ready && record.stages[stage_index].iterations_done == 0 &&
             JoinedThisPlanLocked(record, r.worker_id())) {
    // A worker this re-plan brought in (a joiner, a new replacement) failed
    // before the start barrier, where a stage sets itself up (its data, a
    // checkpoint it loads: JobRunner), and not for want of a peer nor for
    // the checkpoint's sake: its own setup (no --checkpoint-root, the data
    // file missing or another copy on its host). An error after the
    // barrier may be the plan's (every member of a compressed all-reduce
    // refuses alike) and is not taken so. The job ran on the others, so it
    // goes on without it, from the same checkpoint, and the worker is not
    // offered to it again unless it registers anew (as a spare a re-plan
    // was refused with). Failing the job instead ended a healthy one, and
    // the next elastic job to grow into the worker after it.
    record.unfit[r.worker_id()] =
        r.incarnation() > 0 ? r.incarnation() : IncarnationOf(r.worker_id());
    StartRecoveryLocked(record, r.worker_id(),
                        absl::StrCat(reason, "; going on without ", r.worker_id(),
                                     ", which failed as it joined the job"),
                        RecoveryKind::kReplanRefused);
  } else if (r.peer_failure()) {
    StartRecoveryLocked(record, "", reason, RecoveryKind::kPeerFailure);
  } else {
    EndLocked(record, v1::JOB_STATE_FAILED, reason);
  }
}

bool JobManager::JoinedThisPlanLocked(const JobRecord& record, const std::string& worker_id) {
  const int versions = record.job.plan_history_size();
  if (versions < 2) return false;  // the first plan: every worker is new
  const v1::PlanVersion& before = record.job.plan_history(versions - 2);
  return std::find(before.worker_ids().begin(), before.worker_ids().end(), worker_id) ==
         before.worker_ids().end();
}

absl::Status JobManager::CheckLossStage(const v1::ReportProgressRequest& r, const JobRecord& record,
                                        int stage_index) {
  if ((r.micro_batch_losses_size() > 0 || r.has_val_loss()) &&
      !(stage_index < record.plan.stages_size() &&
        record.plan.stages(stage_index).forward().end() == NumUnits(record.resolved.train.model))) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReportProgressRequest.", r.has_val_loss() ? "val_loss" : "micro_batch_losses",
                     ": ", r.worker_id(), "'s stage ", stage_index,
                     " does not run the model's last unit, so it computes no loss"));
  }
  return absl::OkStatus();
}

bool JobManager::TakeDataDigestLocked(JobRecord& record, const v1::ReportProgressRequest& r) {
  if (r.data_sha256().empty() || r.data_sha256() == record.job.data_sha256()) return true;
  if (!record.job.data_sha256().empty()) {
    EndLocked(record, v1::JOB_STATE_FAILED,
              absl::StrCat("worker ", r.worker_id(), " read other tokens from spec.data",
                           record.resolved.spec.data().path().empty()
                               ? " (generated text)"
                               : absl::StrCat(".path ", record.resolved.spec.data().path()),
                           " (SHA-256 ", r.data_sha256(), ") than the job trains on (",
                           record.job.data_sha256(),
                           ", Job.data_sha256): the file differs on that host, or was "
                           "changed or replaced since the job began"));
    return false;
  }
  record.job.set_data_sha256(r.data_sha256());
  PersistLocked(record).IgnoreError();  // logged; saved again with the next change
  return true;
}

bool JobManager::RecordStepLossLocked(JobRecord& record, const v1::ReportProgressRequest& r,
                                      ProgressCounted* counted) {
  double sum = 0.0;  // as LocalTrainer: double sum, divided, as float
  for (float l : r.micro_batch_losses()) sum += l;
  const float loss = static_cast<float>(sum / r.micro_batch_losses_size());
  v1::JobProgress* p = record.job.mutable_progress();
  // As train-local: a diverged job stops here rather than train on NaNs.
  // Checked first: the job shows its last finite step (a NaN loss reads as
  // the string "NaN" in JSON, where clients expect a number, and would
  // reach the pipetrain_job_loss gauge); the reason names the step.
  if (absl::Status finite = CheckLossFinite(r.iteration() + 1, loss); !finite.ok()) {
    EndLocked(record, v1::JOB_STATE_FAILED, std::string(finite.message()));
    return false;
  }
  p->set_step(r.iteration() + 1);
  p->set_loss(loss);
  p->add_loss_history(loss);
  counted->step = true;
  if (record.checkpoints != nullptr) {
    // A checkpoint held back for the steps the loss had not reached yet
    // may expire now: removed after the next save, as at a completion.
    record.checkpoints->SetReached(p->step());
    const absl::Time expired_at = absl::Now();
    for (v1::ResumeFrom& expired : record.checkpoints->TakeExpired()) {
      record.expiring.push_back(ExpiredCheckpoint{std::move(expired), expired_at});
    }
  }
  if (p->loss_history_size() > kMaxLossHistory) {
    const int drop = p->loss_history_size() - kMaxLossHistory;
    p->mutable_loss_history()->erase(p->mutable_loss_history()->begin(),
                                     p->mutable_loss_history()->begin() + drop);
    p->set_loss_history_start(p->loss_history_start() + drop);
  }
  const absl::Time now = elapsed_clock_->Now();
  // The step's wall time, less the validation pass the loss stage ran
  // after it (training throughput, not evaluation).
  const double seconds = absl::ToDoubleSeconds(now - record.last_step_time) - r.eval_seconds();
  const TrainConfig& t = record.resolved.train;
  // The first step of a plan includes its start (and a resumed plan's,
  // loading the checkpoint): not throughput.
  const bool first_after_recovery = record.recovering_since.has_value();
  const bool first_of_plan = !record.stepped_on_plan;
  record.stepped_on_plan = true;
  // The last step's report comes after the final weights' gather and
  // upload and the last checkpoint's write (job_runner.cc): not throughput
  // either, and a large model's upload would be what the job shows last.
  if (seconds > 0 && !first_after_recovery && !first_of_plan && !r.finished()) {
    p->set_tokens_per_second(double(t.batch_size) * t.seq_len / seconds);
  }
  record.last_step_time = now;
  if (now - record.last_persisted >= absl::Seconds(1)) PersistLocked(record).IgnoreError();
  if (first_after_recovery) {
    const double total = absl::ToDoubleSeconds(now - *record.recovering_since);
    const double restart = absl::ToDoubleSeconds(now - record.replanned_at);
    if (events_.recovered) {
      events_.recovered(total, record.recovery_waiting_seconds, record.recovery_planning_seconds,
                        restart);
    }
    PT_LOG(INFO) << "job " << record.job.id() << " recovered in " << total << " s (waiting "
                 << record.recovery_waiting_seconds << " s, planning "
                 << record.recovery_planning_seconds << " s, load and first step " << restart
                 << " s)";
    record.recovering_since.reset();
  }
  return true;
}

bool JobManager::RecordValLossLocked(JobRecord& record, const v1::ReportProgressRequest& r) {
  // As the training loss: a NaN or infinite validation loss is a
  // diverged model, not a number to show.
  if (absl::Status finite = CheckLossFinite(r.iteration() + 1, r.val_loss()); !finite.ok()) {
    EndLocked(record, v1::JOB_STATE_FAILED,
              absl::StrCat("the validation loss: ", finite.message()));
    return false;
  }
  v1::JobProgress* p = record.job.mutable_progress();
  p->set_val_loss(r.val_loss());
  p->set_val_step(r.iteration() + 1);
  return true;
}

absl::Status JobManager::CheckProgressBounds(const v1::ReportProgressRequest& r,
                                             const JobRecord& record) {
  const int micro_batches = record.resolved.train.micro_batches;
  if (r.micro_batch_losses_size() > micro_batches) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReportProgressRequest.micro_batch_losses: ", r.micro_batch_losses_size(),
                     " losses for a job of ", micro_batches, " micro-batches"));
  }
  if (r.iteration() < 0 || r.iteration() >= record.resolved.train.steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReportProgressRequest.iteration: ", r.iteration(),
                     " is outside the job's [0, ", record.resolved.train.steps, ")"));
  }
  // A stage finishes with the job's last step (JobRunner: it + 1 == steps):
  // "finished" at any other would end the job early, its weights taken from
  // a model trained part of the way.
  if (r.finished() && r.iteration() + 1 != record.resolved.train.steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReportProgressRequest.finished: at iteration ", r.iteration(),
                     "; a stage finishes with the job's last, ", record.resolved.train.steps - 1));
  }
  for (const auto& [field, seconds] :
       {std::pair<const char*, double>{"busy_seconds", r.busy_seconds()},
        std::pair<const char*, double>{"idle_seconds", r.idle_seconds()},
        std::pair<const char*, double>{"eval_seconds", r.eval_seconds()}}) {
    if (!(seconds >= 0 && seconds <= kMaxReportedStepSeconds)) {
      return absl::InvalidArgumentError(absl::StrCat("ReportProgressRequest.", field, ": ", seconds,
                                                     " is outside [0, ", kMaxReportedStepSeconds,
                                                     "]"));
    }
  }
  // Quoted in a failed job's reason (cut to 12 characters, which must not
  // split a multi-byte one: a stored reason that is not UTF-8 does not
  // parse, and the coordinator would not restart).
  if (!r.weights_digest().empty() && !IsSha256Hex(r.weights_digest())) {
    return absl::InvalidArgumentError(
        "ReportProgressRequest.weights_digest: not 64 lowercase hex digits");
  }
  // Shown to users (Job.data_sha256) and compared byte for byte.
  if (!r.data_sha256().empty() && !IsSha256Hex(r.data_sha256())) {
    return absl::InvalidArgumentError(
        "ReportProgressRequest.data_sha256: not 64 lowercase hex digits");
  }
  if (r.error().size() > kMaxReportedErrorBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReportProgressRequest.error: ", r.error().size(),
                     " bytes exceeds the limit of ", kMaxReportedErrorBytes));
  }
  if (r.checkpoint().error().size() > kMaxReportedErrorBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReportProgressRequest.checkpoint.error: ", r.checkpoint().error().size(),
                     " bytes exceeds the limit of ", kMaxReportedErrorBytes));
  }
  return absl::OkStatus();
}

void JobManager::StopWorkerLocked(const JobRecord& record, const std::string& worker) {
  // The hub keeps one assignment per worker: a STOP of this job must not
  // replace the RUN of another job that has taken the worker since (a
  // boundary left it out, or it came back in a new incarnation).
  const absl::StatusOr<v1::Worker> now = registry_->Get(worker);
  if (now.ok() && !now->job_id().empty() && now->job_id() != record.job.id()) return;
  hub_->Set(worker, StopAssignment(record.job.id(), record.plan.version()));
}

bool JobManager::StageDone(const JobRecord& record, size_t g) {
  const StageProgress& s = record.stages[g];
  if (!s.finished) return false;
  // Only replica 0's stages upload, tensor rank 0 of each (RecordWeightOwners).
  const bool uploads =
      static_cast<int>(g) < StagesPerReplica(record) && g % TensorRanks(record) == 0;
  return !uploads || s.weights_done || record.resolved.spec.output().weights_path().empty();
}

void JobManager::MaybeCompleteLocked(JobRecord& record) {
  if (record.writing_weights) return;  // complete already; the file is being written
  const bool want_weights = !record.resolved.spec.output().weights_path().empty();
  const int uploading = StagesPerReplica(record);
  for (size_t g = 0; g < record.stages.size(); ++g) {
    if (!StageDone(record, g)) return;
  }
  // Replicas must end bitwise identical: each stage's copies agree.
  for (size_t g = uploading; g < record.stages.size(); ++g) {
    const std::string& mine = record.stages[g].weights_digest;
    const std::string& zero = record.stages[g % uploading].weights_digest;
    if (mine.empty() || mine != zero) {
      return EndLocked(
          record, v1::JOB_STATE_FAILED,
          absl::StrCat("data-parallel replicas diverged: stage ", g % uploading, " of replica ",
                       g / uploading, " (", record.job.worker_ids(g), ") ends with weights ",
                       mine.empty() ? "unreported" : mine.substr(0, 12), ", replica 0's (",
                       record.job.worker_ids(g % uploading), ") with ", zero.substr(0, 12)));
    }
  }
  if (want_weights) {
    int64_t total = 0;
    if (record.weights_file != nullptr) {
      for (const SafetensorsTensorSpec& t : record.weights_file->tensors()) {
        const int64_t numel = NumElements(t.shape);
        if (record.weights_covered[t.name].covered() < numel) {
          return EndLocked(
              record, v1::JOB_STATE_FAILED,
              absl::StrCat("incomplete upload of ", t.name, ": ",
                           record.weights_covered[t.name].covered(), " of ", numel, " values"));
        }
        total += numel;
      }
    }
    const int64_t expected = CountParameters(record.resolved.train.model);
    if (total != expected) {
      return EndLocked(
          record, v1::JOB_STATE_FAILED,
          absl::StrCat("uploaded weights hold ", total, " values; the model has ", expected));
    }
    const std::string name = record.resolved.spec.output().weights_path();
    const std::string path = absl::StrCat(options_.output_dir, "/", name);
    if (stopping_) {  // no background work starts now: committed here
      // Worded as FinishWritingWeights words its failure.
      const absl::Status committed =
          InOutputDir(record.weights_file->Commit(), options_.output_dir, name);
      if (!committed.ok()) {
        return EndLocked(record, v1::JOB_STATE_FAILED,
                         absl::StrCat("cannot write the final weights: ", committed.message()));
      }
      record.job.set_weights_path(path);
      return EndLocked(record, v1::JOB_STATE_SUCCEEDED, "");
    }
    // Synced off the lock (GPT-2 124M is 0.5 GB to sync): the job stays
    // RUNNING until the file is in (FinishWritingWeights syncs and renames
    // it). The task holds the last reference to `file`: a job cancelled
    // meanwhile leaves no temporary once the task is done.
    record.writing_weights = true;
    record.job.set_reason(absl::StrCat("every stage finished; writing the weights to ", name));
    TouchLocked(record);
    std::shared_ptr<SafetensorsFileWriter> file = record.weights_file;
    DropWeightsFile(record);
    return RunWeightsSyncLocked(
        [this, id = record.job.id(), path, file] { FinishWritingWeights(id, path, *file); });
  }
  EndLocked(record, v1::JOB_STATE_SUCCEEDED, "");
}

}  // namespace pipetrain
