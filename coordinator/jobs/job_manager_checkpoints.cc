// JobManager: a job's checkpoints: the stages' reports of files written,
// expiring and sweeping checkpoint directories. Contracts: job_manager.h.
#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log_rate_limiter.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/utf8_prefix.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/job_manager_internal.h"

namespace pipetrain {

using job_manager_internal::kMaxReportedStepSeconds;
using job_manager_internal::RemoveCheckpointDirs;

namespace job_manager_internal {

void RemoveCheckpointDirs(const std::string& output_dir, const std::string& job_id,
                          const std::vector<v1::ResumeFrom>& dirs,
                          std::optional<absl::Time> written_before) {
  for (const v1::ResumeFrom& dir : dirs) {
    absl::Status removed = RemoveCheckpointDir(output_dir, dir, written_before);
    if (!removed.ok()) PT_LOG(WARNING) << "job " << job_id << ": " << removed;
  }
}

}  // namespace job_manager_internal

namespace {

// Removes the step directories of `checkpoint_dir` that have no manifest,
// but those named in `keep`: their files written before `written_before`
// (all of them without it). On io_.
void RemoveStepDirsWithoutManifest(const std::string& output_dir, const std::string& job_id,
                                   const std::string& checkpoint_dir,
                                   const std::set<std::string>& keep,
                                   std::optional<absl::Time> written_before) {
  std::vector<v1::ResumeFrom> doomed;
  for (v1::ResumeFrom& dir : StepDirsWithoutManifest(output_dir, checkpoint_dir)) {
    if (keep.count(dir.dir()) == 0) doomed.push_back(std::move(dir));
  }
  RemoveCheckpointDirs(output_dir, job_id, doomed, written_before);
}

}  // namespace

absl::Status JobManager::AddCheckpointLocked(JobRecord& record, int stage,
                                             const v1::CheckpointWritten& c) {
  if (record.checkpoints == nullptr) {
    return absl::InvalidArgumentError(
        "ReportProgressRequest.checkpoint: the job has no checkpoints (spec.checkpoint)");
  }
  if (!(c.write_seconds() >= 0 && c.write_seconds() <= kMaxReportedStepSeconds)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReportProgressRequest.checkpoint.write_seconds: ", c.write_seconds(),
                     " is outside [0, ", kMaxReportedStepSeconds, "]"));
  }
  // A report sent again after its answer was lost (ReportWithRetries)
  // changes nothing: it must not count twice in the metrics or the job.
  if (!c.error().empty()) {
    const std::string key = absl::StrCat(record.job.plan_version(), "/", c.step());
    std::string& last = record.last_checkpoint_error_by_stage[stage];
    if (last == key) return absl::OkStatus();
    last = key;
  } else {
    const v1::UnitRange& owned = record.plan.stages(stage).backward();
    const bool all_owned = std::all_of(c.units().begin(), c.units().end(), [&](const auto& f) {
      return f.unit() >= owned.begin() && f.unit() < owned.end();
    });
    if (all_owned && record.checkpoints->Repeats(c)) return absl::OkStatus();
  }
  if (!c.error().empty()) {
    // A step that is no checkpoint step of the job, or one already
    // complete, failed nowhere that matters (a stage's fault, or its
    // report of a step the others completed after all): not counted, not
    // shown, no alert. Else its files written before the failure, and the
    // other stages', are removed once a later checkpoint completes, or at
    // the job's end; the failed steps past the catalog's few go now (no
    // checkpoint may complete while the disk stays full, and they are
    // what fills it).
    if (!record.checkpoints->Failed(c.step())) return absl::OkStatus();
    // Rate-limited: a stage reporting failures of ever newer steps (a
    // fault, or a host not to be trusted) passes the repeat check above,
    // and each line carries up to 4 KiB of its text.
    static LogRateLimiter failures_log(10, absl::Seconds(10));
    if (int64_t dropped = 0; failures_log.Allow(&dropped)) {
      PT_LOG(WARNING) << "job " << record.job.id() << ": stage " << stage
                      << " could not write its checkpoint of step " << c.step() << ": "
                      << c.error().substr(0, 4096) << LogRateLimiter::Dropped(dropped);
    }
    if (std::vector<v1::ResumeFrom> abandoned = record.checkpoints->TakeAbandoned();
        !abandoned.empty()) {
      io_.Post(
          [output_dir = options_.output_dir, id = record.job.id(),
           abandoned = std::move(abandoned)] { RemoveCheckpointDirs(output_dir, id, abandoned); });
    }
    if (events_.checkpoint_failed) events_.checkpoint_failed();
    // Shown in the job (GetJob, `pipetrain job`), not only the log and a
    // counter: a job whose checkpoints all fail cannot recover as asked.
    v1::JobProgress* progress = record.job.mutable_progress();
    progress->set_checkpoint_failures(progress->checkpoint_failures() + 1);
    progress->set_checkpoint_error(
        absl::StrCat("step ", c.step(), ", stage ", stage, ": ", Utf8Prefix(c.error(), 1024)));
    // The job goes on, as at any step, unless the failed one is the step
    // boundary a drain or join waits for: every stage stops after it and
    // waits for a checkpoint that will never complete. Then the job
    // recovers from its latest complete checkpoint instead (the drained
    // worker left out, the joining one taken), redoing the steps since.
    if (record.stop_at > 0 && c.step() == record.stop_at &&
        record.job.state() == v1::JOB_STATE_RUNNING) {
      StartRecoveryLocked(
          record, "",
          absl::StrCat("the checkpoint of step ", c.step(), " (", record.boundary_reason,
                       ") failed on stage ", stage, ": ", Utf8Prefix(c.error(), 1024)),
          RecoveryKind::kCheckpointFailed);
    }
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::optional<v1::ResumeFrom> complete,
                   record.checkpoints->Add(c, record.plan.stages(stage).backward()));
  // A step written again and complete (redone after the checkpoints after
  // it were dropped or forgotten) whose old directory still waited for
  // removal (its save had failed): the directory is the new checkpoint's
  // now, not to be removed. Not before it completes: until then the old
  // manifest (old checksums) must still go, and the removal spares the
  // redo's files (written after that manifest: RemoveExpiring).
  if (complete.has_value()) {
    std::vector<ExpiredCheckpoint>& expiring = record.expiring;
    expiring.erase(
        std::remove_if(expiring.begin(), expiring.end(),
                       [&c](const ExpiredCheckpoint& e) { return e.from.step() == c.step(); }),
        expiring.end());
  }
  // Steps that can no longer complete: their files go, off the lock (the
  // stored state never names an incomplete step).
  if (std::vector<v1::ResumeFrom> abandoned = record.checkpoints->TakeAbandoned();
      !abandoned.empty()) {
    io_.Post(
        [output_dir = options_.output_dir, id = record.job.id(), abandoned = std::move(abandoned)] {
          RemoveCheckpointDirs(output_dir, id, abandoned);
        });
  }
  if (events_.checkpoint_written) {  // write_seconds checked above
    events_.checkpoint_written(c.write_seconds());
  }
  if (!complete.has_value()) return absl::OkStatus();
  record.job.mutable_progress()->set_checkpoint_step(complete->step());
  record.job.mutable_progress()->set_checkpoint_failures(0);
  record.job.mutable_progress()->clear_checkpoint_error();
  // Progress is a checkpoint beyond every earlier one: a step redone after
  // its checkpoint was dropped does not count, or recoveries that drop
  // and redo the same step would never give up.
  if (complete->step() > record.furthest_checkpoint_step) {
    record.furthest_checkpoint_step = complete->step();
    record.recoveries_without_progress = 0;
  }
  // Files off the lock, in order, after the state that lists the new
  // checkpoint is saved: the manifest (for people and tools; resuming needs
  // only the checksummed unit files), then the expired ones go, but only if
  // the save succeeded (else the stored state may still name them):
  // PersistLocked removes what `expiring` held when it saved. A failed
  // save holds the manifest back until one succeeds (manifests_after_save_).
  // Real time: the removal compares it with the files' modification times.
  const absl::Time expired_at = absl::Now();
  for (v1::ResumeFrom& expired : record.checkpoints->TakeExpired()) {
    record.expiring.push_back(ExpiredCheckpoint{std::move(expired), expired_at});
  }
  ManifestToWrite manifest{options_.output_dir, record.job.id(), record.resolved.spec.model(),
                           record.resolved.train.seed, *complete};
  manifest.fresh = true;  // written as soon as this save succeeds
  PersistLocked(record, [this, manifest = std::move(manifest)](const absl::Status& saved) {
    if (saved.ok()) {
      WriteManifestIfHeld(manifest);
      return;
    }
    PT_LOG(WARNING) << "job " << manifest.job_id << ": the manifest of step "
                    << manifest.complete.step()
                    << ", and the removal of expired checkpoints, wait for a later save: the "
                       "state that names the step was not saved";
    AnnotatedMutexLock lock(&mu_);
    std::vector<ManifestToWrite>& held = manifests_after_save_[manifest.job_id];
    // Only those of checkpoints still held (WriteManifestIfHeld writes no
    // other): at most `keep`, however long the store fails.
    if (const JobRecord* record = FindLocked(manifest.job_id);
        record != nullptr && record->checkpoints != nullptr) {
      held.erase(std::remove_if(held.begin(), held.end(),
                                [record](const ManifestToWrite& m) {
                                  return !record->checkpoints->Holds(m.complete.step());
                                }),
                 held.end());
    }
    // Written after a later save, which may come hours on: checked as a
    // retry is (its step may have been removed meanwhile), never made again.
    held.push_back(manifest);
    held.back().fresh = false;
  }).IgnoreError();  // logged, and retried (RetryUnsavedLocked)
  if (events_.checkpoint_completed) {
    int64_t bytes = 0;
    for (const v1::UnitFile& f : complete->units()) bytes += f.bytes();
    events_.checkpoint_completed(bytes);
  }
  PT_LOG(INFO) << "job " << record.job.id() << ": checkpoint of step " << complete->step()
               << " complete (" << complete->dir() << ")";
  MaybeReplanAtBoundaryLocked(record);
  return absl::OkStatus();
}

std::function<void()> JobManager::CheckpointSweepLocked(JobRecord& record, absl::Time ended) {
  // Steps that never completed (the one being written when the job was
  // cancelled or failed, those a recovery stopped short of) can no longer:
  // their files go. So do the other step directories without a manifest,
  // which no catalog of this process knows: a previous coordinator's, killed
  // while it wrote or expired them; but not while another live job shares
  // the directory (state stored before sharing was refused), nor the steps
  // this job or another whose directory overlaps (the job it took the
  // directory over from, or one that took it over since) holds complete (a
  // manifest whose write failed).
  // The directory stays this job's until the removal is done
  // (checkpoint_sweep_pending), and only files written before the end go.
  // (Manifests are written on io_ too, so those of checkpoints completed
  // before the end are in place when this runs, except one held by a failed
  // state save or waiting for its retry: its step is among those this job
  // holds complete, and kept.)
  if (record.checkpoints != nullptr && !options_.output_dir.empty()) {
    const std::string& checkpoint_dir = record.resolved.spec.checkpoint().dir();
    const bool shared = CheckpointDirUserLocked(checkpoint_dir) != nullptr;
    std::vector<v1::ResumeFrom> incomplete = record.checkpoints->TakeIncomplete();
    // Not for the second pass: the complete steps (kept) and the incomplete
    // ones (removed first, tried once).
    std::set<std::string> known = CompleteCheckpointsOverlappingLocked(checkpoint_dir);
    for (const v1::ResumeFrom& i : incomplete) known.insert(i.dir());
    // Stages stopping may still write a step or two after the end (a cancel
    // reaches them tens of ms later); those files come after `ended`, so
    // a second sweep removes them once the workers have stopped
    // (SweepStoppedJobsLocked). The soak test left a step directory for
    // most cancelled jobs before it.
    // A job that never ran (ended while queued) has no stages to wait for:
    // nothing was written after its end, and nothing would end the wait.
    const bool late_sweep = !shared && record.job.worker_ids_size() > 0;
    record.checkpoint_sweeps_pending = late_sweep ? 2 : 1;
    if (late_sweep) {
      record.late_sweep_workers.assign(record.job.worker_ids().begin(),
                                       record.job.worker_ids().end());
      record.late_sweep_since = clock_->Now();
      record.late_sweep_by = elapsed_clock_->Now() + kLateSweepWait;
    }
    return [this, output_dir = options_.output_dir, id = record.job.id(), checkpoint_dir, shared,
            known = std::move(known), incomplete = std::move(incomplete), ended] {
      RemoveCheckpointDirs(output_dir, id, incomplete, ended);
      if (!shared) RemoveStepDirsWithoutManifest(output_dir, id, checkpoint_dir, known, ended);
      AnnotatedMutexLock lock(&mu_);
      if (JobRecord* done = FindLocked(id)) --done->checkpoint_sweeps_pending;
    };
  }
  return nullptr;
}

void JobManager::SweepStoppedJobsLocked() {
  const absl::Time now = elapsed_clock_->Now();  // for late_sweep_by
  for (auto& [id, record] : jobs_) {
    if (record->late_sweep_workers.empty()) continue;
    // (A lambda may not name a structured binding in C++17: clang refuses.)
    const absl::Time since = record->late_sweep_since;
    const bool all_stopped =
        std::all_of(record->late_sweep_workers.begin(), record->late_sweep_workers.end(),
                    [&](const std::string& w) { return registry_->StoppedSince(w, since); });
    if (!all_stopped && now < record->late_sweep_by) continue;
    record->late_sweep_workers.clear();
    // Every step directory without a manifest but those this job or another
    // whose directory overlaps holds complete (a manifest whose write
    // failed; after a restart, also one of a job that took over this ended
    // job's directory, which Restore queued to write). Every file in them once
    // every worker has stopped: none writes there any more, and the
    // directory is still the job's (reserved until its sweeps end). A
    // time filter would compare this host's clock with the file system's
    // (the file server's, or the writing host's): one running ahead kept
    // the files for good. Files up to now when the wait ran out instead.
    std::set<std::string> complete =
        CompleteCheckpointsOverlappingLocked(record->resolved.spec.checkpoint().dir());
    std::optional<absl::Time> until;
    if (!all_stopped) until = absl::Now();
    io_.Post([this, output_dir = options_.output_dir, id = id,
              checkpoint_dir = record->resolved.spec.checkpoint().dir(),
              complete = std::move(complete), until] {
      RemoveStepDirsWithoutManifest(output_dir, id, checkpoint_dir, complete, until);
      AnnotatedMutexLock lock(&mu_);
      if (JobRecord* done = FindLocked(id)) --done->checkpoint_sweeps_pending;
    });
  }
}

absl::Time JobManager::DroppedFilesBound(const std::string& id, const v1::ResumeFrom& from) {
  // Read first, then checked under the lock: the redo writes the step only
  // on a plan handed out after the drop (the dropped plan's stages were
  // loading it, and resume past it), and a plan is handed out under mu_
  // with its version. If the job is still on the plan of the drop once
  // the read is done, no redo had written there by then: a file written
  // since is newer by the clock that dated these, however far this host's
  // is from it.
  const absl::StatusOr<absl::Time> read = CheckpointFilesBound(options_.output_dir, from);
  AnnotatedMutexLock lock(&mu_);
  JobRecord* record = FindLocked(id);
  if (record == nullptr) return absl::InfinitePast();  // pruned: no bound to trust
  auto dropped = std::find_if(record->expiring.begin(), record->expiring.end(),
                              [&from](const ExpiredCheckpoint& e) {
                                return e.from.dir() == from.dir() && e.dropped_on_plan.has_value();
                              });
  // Gone from the list: redone and complete (the directory is the new
  // checkpoint's), or removed already.
  if (dropped == record->expiring.end()) return absl::InfinitePast();
  if (dropped->files_before.has_value()) return *dropped->files_before;  // read before
  if (read.ok() && record->plan.version() == *dropped->dropped_on_plan) {
    dropped->files_before = *read;
  } else {
    // Its unit files stay (its manifest goes): a redo's may be among them.
    // The redo's checkpoint writes them over; the job's end sweep takes
    // the directory if it never completes.
    dropped->files_before = absl::InfinitePast();
    PT_LOG(WARNING) << "job " << id << ": the unit files of dropped checkpoint " << from.dir()
                    << " are left in place: "
                    << (read.ok() ? std::string("a new plan ran before their times were read")
                                  : absl::StrCat("their times could not be read (",
                                                 read.status().ToString(), ")"));
  }
  return *dropped->files_before;
}

void JobManager::WriteManifestIfHeld(const ManifestToWrite& m) {
  // Not for a checkpoint already gone from the catalog (expired while
  // saves waited: checkpoints completing faster than manifests are
  // written, two fsyncs each, would otherwise queue a manifest each ahead
  // of every later save and every cancel). On io_, in order with the
  // removals of expired checkpoints, so the check stays true for the write.
  const std::pair<std::string, std::string> key(m.job_id, m.complete.dir());
  std::string unwritable;  // why this manifest is dropped, if it is
  bool first_try = false;
  {
    AnnotatedMutexLock lock(&mu_);
    JobRecord* record = FindLocked(m.job_id);
    if (record == nullptr || record->checkpoints == nullptr ||
        !record->checkpoints->Holds(m.complete.step())) {
      manifest_failures_.erase(key);
      return;
    }
    // An ended job's directory is free for another job once swept: one that
    // took it over (init.from, a continued run) may have written this step
    // since, and this manifest would name the wrong checksums over its
    // files (the guard RetryExpiringLocked and Restore use).
    if (IsTerminal(record->job.state()) && OtherCheckpointDirUserLocked(*record) != nullptr) {
      unwritable = "another job has used its checkpoint directory since this one ended";
    }
    first_try = m.fresh && manifest_failures_.count(key) == 0;
  }
  // A retry comes seconds to hours later (an ended job's, until it is
  // pruned), and so may a manifest that is not fresh (held by a failed
  // save, or written at a restore): the step directory may have been
  // emptied or removed since (an operator freeing space), so it is written
  // only over the files it records (CheckUnitFiles), and the directory is
  // never made again. What cannot be checked (EIO, EMFILE) counts as a
  // failed write, tried again. A fresh one's first try is not checked (a
  // stat per unit file on every checkpoint): the stages reported those
  // files written just before, and it may create the step directory (they
  // did; reports in tests come without it).
  absl::Status written = absl::OkStatus();
  if (unwritable.empty() && !first_try) {
    written = CheckUnitFiles(m.output_dir, m.complete);
    if (absl::IsNotFound(written) || absl::IsDataLoss(written)) {
      unwritable = std::string(written.message());
    }
  }
  if (unwritable.empty() && written.ok()) {
    written = WriteCheckpointManifest(m.output_dir, m.job_id, m.model, m.seed, m.complete,
                                      /*create_step_dir=*/first_try);
    if (absl::IsNotFound(written)) unwritable = std::string(written.message());
  }
  AnnotatedMutexLock lock(&mu_);
  const absl::Time now = elapsed_clock_->Now();
  auto failures = manifest_failures_.find(key);
  if (!unwritable.empty()) {
    // Dropped, not retried (so logged once), and no longer holding the
    // job: export and init.from take an older step. A restart writes it
    // if its files are back and the directory is still the job's (Restore).
    PT_LOG(WARNING) << "job " << m.job_id << ": the manifest of checkpoint " << m.complete.dir()
                    << " is not written: " << unwritable;
    if (failures != manifest_failures_.end()) manifest_failures_.erase(failures);
    return;
  }
  if (written.ok()) {
    if (failures != manifest_failures_.end()) {
      PT_LOG(INFO) << "job " << m.job_id << ": the manifest of checkpoint " << m.complete.dir()
                   << " is written, after " << failures->second.count << " failed writes over "
                   << absl::FormatDuration(now - failures->second.since);
      manifest_failures_.erase(failures);
    }
    return;
  }
  if (unwritten_manifests_.empty()) next_manifest_retry_ = now + absl::Seconds(5);
  // A retry from now on: checked, never making the step directory.
  unwritten_manifests_.push_back(m);
  unwritten_manifests_.back().fresh = false;
  // Tried every 5 s while the volume fails (full, read-only): a line each,
  // for every manifest held, buried the cause.
  FailureStretch& stretch = manifest_failures_[key];
  if (!NoteFailureLocked(stretch)) return;
  PT_LOG(WARNING) << "job " << m.job_id << ": " << written
                  << stretch.InARow(now, "writes of this manifest")
                  << "; trying again every 5 s (logged once a minute until a write succeeds)";
}

void JobManager::RetryManifestsLocked() {
  const absl::Time now = elapsed_clock_->Now();
  if (unwritten_manifests_.empty() || now < next_manifest_retry_) return;
  next_manifest_retry_ = now + absl::Seconds(5);
  for (ManifestToWrite& m : unwritten_manifests_) {
    io_.Post([this, m = std::move(m)] { WriteManifestIfHeld(m); });
  }
  unwritten_manifests_.clear();
}

}  // namespace pipetrain
