// JobManager: the durable state (store::CoordinatorState): saving a job's
// record as it changes, retrying saves that failed, and Restore after a
// restart. Contracts: job_manager.h.
#include <algorithm>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/echo_input.h"
#include "common/logging.h"
#include "common/proto_time.h"
#include "common/status_macros.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/job_manager_internal.h"
#include "coordinator/jobs/plan_drawings.h"
#include "coordinator/jobs/stored_job_check.h"
#include "coordinator/jobs/stored_job_fit.h"
#include "coordinator/planner/planner.h"
#include "worker/model/gpt_config.h"

namespace pipetrain {
namespace {

// The wait after an expired checkpoint's `failed`-th failed removal (at
// least the first): kExpiredRemovalBackoff's, its last from then on.
absl::Duration ExpiredRemovalBackoff(int failed) {
  const int n = static_cast<int>(std::size(kExpiredRemovalBackoff));
  return kExpiredRemovalBackoff[std::clamp(failed, 1, n) - 1];
}

// The expired checkpoints of `all` whose removal was never tried: those
// that failed are tried again on their backoff (RetryExpiringLocked).
template <typename Expired>
std::vector<Expired> UntriedExpiring(const std::vector<Expired>& all) {
  std::vector<Expired> untried;
  for (const Expired& e : all) {
    if (e.failed_removals == 0) untried.push_back(e);
  }
  return untried;
}

// Each of `job`'s times that StoredTimeFits refuses at `now`, replaced by
// `now` (a restart's job may be shown and ordered by them).
void ReplaceUnfitTimes(v1::Job& job, absl::Time now) {
  std::vector<google::protobuf::Timestamp*> times = {job.mutable_create_time(),
                                                     job.mutable_update_time()};
  for (v1::PlanVersion& plan : *job.mutable_plan_history()) times.push_back(plan.mutable_time());
  for (google::protobuf::Timestamp* time : times) {
    if (!StoredTimeFits(*time, now)) *time = ToProtoTimestamp(now);
  }
}

// FAILED_PRECONDITION naming the first job in `stored` (of the store
// `store` describes) that has not ended and holds a spec field or profile
// key this build does not know (StoredFieldOfANewerBuild): state a newer
// coordinator wrote, as after a rollback or when a standby of the older
// build takes over. Restored, each such job would fail for good, and be
// saved so: refused, as a newer layout version is
// (CoordinatorState::Initialize), the jobs stay as stored for a build that
// knows them. An ended job is restored all the same: nothing fails it, and
// a newer build's ended jobs would otherwise bar a rollback until pruned.
absl::Status RefuseJobsOfANewerBuild(const std::vector<store::StoredJob>& stored,
                                     const std::string& store) {
  for (const store::StoredJob& s : stored) {
    // A record without an id: Restore skips it.
    if (s.job().id().empty() || IsTerminal(s.job().state())) continue;
    // (A job state this build does not know fails the job, saved so, as
    // before: Restore_UnknownStoredState_FailsEndedOnce.)
    std::string newer = StoredFieldOfANewerBuild(s.job().spec(), s.profile_json());
    // The submitted auto-layout parts a re-plan copies into the spec (a
    // one-replica layout drops them from the stored spec itself).
    const std::pair<const google::protobuf::Message*, const char*> beside[] = {
        {&s.auto_layout_data_parallel_compression(), "auto_layout_data_parallel_compression"},
        {&s.auto_layout_parallelism(), "auto_layout_parallelism"}};
    for (const auto& [part, name] : beside) {
      if (!newer.empty()) break;
      if (std::optional<UnknownField> field = FirstUnknownField(*part, name)) {
        newer = DescribeUnknownField(*field);
      }
    }
    if (newer.empty()) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        store, " holds job ", EchoInput(s.job().id()), " whose ", newer,
        ", which this coordinator does not know: a newer coordinator wrote it; run a "
        "coordinator at least as new as the one that wrote it (the job is left as stored)"));
  }
  return absl::OkStatus();
}

}  // namespace

store::StoredJob JobManager::StoredJobLocked(JobRecord& record) {
  store::StoredJob stored;
  *stored.mutable_job() = record.job;
  // Drawings, not state (plan.proto): a large job's would outgrow the
  // store's record limit, and every later save of the job would fail.
  // Left out of the copy, not copied and dropped: tens of megabytes at the
  // planning budget, under the lock, at every save (once a second).
  *stored.mutable_plan() = PlanCopyWithoutDrawings(record.plan);
  if (record.checkpoints != nullptr) {
    for (const v1::ResumeFrom& c : record.checkpoints->Complete()) *stored.add_checkpoints() = c;
  }
  // Step and directory only (the removal needs no more), and at most
  // kMaxStoredExpiring: the record must stay within the store's limit
  // however long saves fail while checkpoints expire. The rest are
  // removed all the same after a save; only a stop first would leave them.
  for (size_t i = 0; i < record.expiring.size() && i < kMaxStoredExpiring; ++i) {
    v1::ResumeFrom* e = stored.add_expiring();
    e->set_step(record.expiring[i].from.step());
    e->set_dir(record.expiring[i].from.dir());
  }
  // Built when the profile was set (SetProfileLocked), not here.
  if (record.profile.has_value()) stored.set_profile_json(record.profile_json);
  stored.set_profile_source(record.profile_source);
  if (record.profile_attention.has_value()) {
    stored.set_profile_attention(static_cast<int>(*record.profile_attention) + 1);
  }
  stored.set_reference_gflops(record.reference_gflops);
  stored.set_recoveries_without_progress(record.recoveries_without_progress);
  stored.set_furthest_checkpoint_step(record.furthest_checkpoint_step);
  // While the job recovers, and while it re-plans for that recovery: a
  // restart then (the planning budget allows minutes) kept only "the
  // coordinator restarted", the cause gone with the old process's log.
  const bool replanning_to_recover = record.job.state() == v1::JOB_STATE_PLANNING &&
                                     record.pending.has_value() &&
                                     record.pending->origin == PlacementOrigin::kRecovery;
  if (record.job.state() == v1::JOB_STATE_RECOVERING || replanning_to_recover) {
    stored.set_recovery_reason(record.recovery_reason);
  }
  stored.set_request_spec_sha256(record.request_spec_sha256);
  if (record.init_checkpoint.has_value())
    *stored.mutable_init_checkpoint() = *record.init_checkpoint;
  stored.set_init_weights(record.init_weights);
  stored.set_auto_layout_workers(record.auto_layout_workers);
  *stored.mutable_auto_layout_data_parallel_compression() = record.auto_layout_compression;
  if (record.auto_layout_workers > 0) {
    *stored.mutable_auto_layout_parallelism() = record.auto_layout_parallelism;
  }
  const std::string trimmed = FitStoredJob(MaxStoredJobBytes(), &stored);
  const absl::Time now = elapsed_clock_->Now();
  // Once per stretch of trimmed saves. One that cannot fit at all (its save
  // fails, and NoteFailedSaveLocked says so too) once a minute: at every
  // save, it was a line a second while the job ran.
  const bool unfit = stored.ByteSizeLong() > MaxStoredJobBytes();
  if (!unfit) record.unfit_saves = FailureStretch{};
  if (unfit ? NoteFailureLocked(record.unfit_saves)
            : !trimmed.empty() && !record.stored_record_trimmed) {
    PT_LOG(WARNING) << "job " << record.job.id() << ": the state store keeps less of it than "
                    << "this coordinator shows (a restart shows that): " << trimmed
                    << (unfit ? absl::StrCat(record.unfit_saves.InARow(now, "saves"),
                                             "; logged once a minute while it does not fit")
                              : "");
  }
  record.stored_record_trimmed = !trimmed.empty();
  record.last_persisted = now;
  return stored;
}

void JobManager::SetProfileLocked(JobRecord& record, ModelProfile profile) {
  // Compact: a 256-layer profile with tensor partitions takes about 200 KB
  // indented, less than half that without.
  record.profile_json = ProfileToJson(profile, /*indent=*/-1);
  record.profile = std::move(profile);
  ++profile_jsons_built_;
}

int64_t JobManager::ProfileJsonsBuiltForTesting() const {
  AnnotatedMutexLock lock(&mu_);
  return profile_jsons_built_;
}

absl::Status JobManager::SaveStoredJob(const store::StoredJob& job, bool log_failure) const {
  absl::Status saved = options_.state->SaveJob(job);
  if (saved.ok()) return saved;
  if (events_.state_save_failed) events_.state_save_failed();
  if (log_failure) {
    PT_LOG(ERROR) << "job " << job.job().id() << ": could not save its state: " << saved;
  }
  return saved;
}

bool JobManager::FailureStretch::Note(absl::Time now) {
  if (count++ == 0) since = now;
  if (now < next_log) return false;
  next_log = now + absl::Minutes(1);
  return true;
}

std::string JobManager::FailureStretch::InARow(absl::Time now, absl::string_view what) const {
  if (count <= 1) return "";
  return absl::StrCat(" (", count, " ", what, " in a row failed over ",
                      absl::FormatDuration(now - since), ")");
}

bool JobManager::NoteFailureLocked(FailureStretch& stretch) {
  return stretch.Note(elapsed_clock_->Now()) || stopping_;
}

void JobManager::NoteFailedSaveLocked(const std::string& id, const absl::Status& status) {
  // A running job saves every second, and so does the retry of any job.
  FailureStretch& failures = save_failures_[id];
  if (!NoteFailureLocked(failures)) return;
  PT_LOG(ERROR) << "job " << id << ": could not save its state"
                << failures.InARow(elapsed_clock_->Now(), "saves") << ": " << status
                << "; saving it again every second (logged once a minute until a save succeeds; "
                   "a restart meanwhile restores the job as last saved)";
}

absl::Status JobManager::PersistLocked(JobRecord& record,
                                       std::function<void(const absl::Status&)> then) {
  if (options_.state == nullptr) {
    // On io_ all the same: `then` may take the lock, and does file work.
    // Nothing is stored that could name the expired checkpoints: they go
    // as after a save (those not tried yet: RetryExpiringLocked tries the
    // others again).
    io_.Post([this, then = std::move(then), id = record.job.id(),
              expired = UntriedExpiring(record.expiring)] {
      if (then) then(absl::OkStatus());
      if (!expired.empty()) RemoveExpiring(id, expired);
    });
    return absl::OkStatus();
  }
  // Off the lock, in order: a commit waits for the disk, and every stage's
  // report waits for the lock. A failed save must not stay the last word
  // (a job ends once: a cancelled one would come back RUNNING after a
  // restart), so it is noted for RetryUnsavedLocked; a later one that
  // succeeds clears the note (io_ runs saves in order).
  // One save of a job waits at a time: a call while one waits joins it,
  // and the save takes the job as it is when it runs. So saves slower
  // than the changes (a checkpoint completing every step, each wanting
  // one) cost one snapshot, not a queue of them (which grew the
  // coordinator by hundreds of MB).
  auto [queued, first] = queued_saves_.try_emplace(record.job.id());
  if (then) queued->second.push_back(std::move(then));
  if (!first) return absl::OkStatus();
  io_.Post([this, id = record.job.id()] {
    std::optional<store::StoredJob> stored;
    std::vector<std::function<void(const absl::Status&)>> thens;
    // Expired checkpoints the state saved here no longer names as complete.
    std::vector<ExpiredCheckpoint> expired;
    {
      AnnotatedMutexLock lock(&mu_);
      auto it = queued_saves_.find(id);
      thens = std::move(it->second);
      queued_saves_.erase(it);
      if (JobRecord* record = FindLocked(id)) {
        stored = StoredJobLocked(*record);
        expired = UntriedExpiring(record->expiring);
      }
    }
    // A job pruned meanwhile: its deletion is queued behind this.
    const absl::Status saved = stored.has_value()
                                   ? SaveStoredJob(*stored, /*log_failure=*/false)
                                   : absl::NotFoundError(absl::StrCat("job ", id, " was pruned"));
    std::vector<ManifestToWrite> held_manifests;  // of earlier failed saves
    if (stored.has_value()) {
      AnnotatedMutexLock lock(&mu_);
      if (saved.ok()) {
        unsaved_.erase(id);
        // An end is saved once a snapshot taken after it is (a job ends once).
        // A success or failure is counted ended only now, not by EndLocked
        // (a cancel, shown CANCELLED from its end, was): until this save a
        // failover restores it as last saved, and the leader that runs it
        // again counts it too.
        const v1::JobState state = stored->job().state();
        if (IsTerminal(state) && end_unsaved_.erase(id) > 0 && events_.ended &&
            state != v1::JOB_STATE_CANCELLED) {
          events_.ended(state);
        }
        if (auto it = save_failures_.find(id); it != save_failures_.end()) {
          PT_LOG(INFO) << "job " << id << ": its state is saved again, after " << it->second.count
                       << " failed saves over "
                       << absl::FormatDuration(elapsed_clock_->Now() - it->second.since);
          save_failures_.erase(it);
        }
        if (auto it = manifests_after_save_.find(id); it != manifests_after_save_.end()) {
          held_manifests = std::move(it->second);
          manifests_after_save_.erase(it);
        }
      } else {
        unsaved_.insert(id);
        // Not for a job pruned while it saved: nothing lists it any more.
        if (FindLocked(id) != nullptr) NoteFailedSaveLocked(id, saved);
      }
    } else {
      AnnotatedMutexLock lock(&mu_);
      manifests_after_save_.erase(id);  // pruned: its directory goes with it
    }
    // The state now names those checkpoints (the ones still held).
    for (const ManifestToWrite& m : held_manifests) WriteManifestIfHeld(m);
    for (const auto& then : thens) then(saved);
    // The expired checkpoints: the state just saved no longer names them
    // as complete, so their directories go now (those of earlier failed
    // saves too: a retry with no later checkpoint would otherwise leave
    // them for good, past `keep`). After the `thens`: a new checkpoint's
    // manifest comes first. Only those not tried yet: a failed removal is
    // tried again on its backoff (RetryExpiringLocked), not at each save
    // (every second while the job runs, and never after it ended).
    if (saved.ok() && !expired.empty()) RemoveExpiring(id, expired);
  });
  return absl::OkStatus();
}

void JobManager::RemoveExpiring(const std::string& id, const std::vector<ExpiredCheckpoint>& listed,
                                bool save_after) {
  // Only those still expiring: a step reported again since it was listed
  // (redone) writes into the same directory (AddCheckpointLocked). And
  // only those not tried since: two saves queued before either ran (no
  // store: PersistLocked lists them when it queues) tried each twice.
  std::vector<ExpiredCheckpoint> dirs;
  bool pruned = false;
  {
    AnnotatedMutexLock lock(&mu_);
    JobRecord* record = FindLocked(id);
    pruned = record == nullptr;
    for (const ExpiredCheckpoint& d : listed) {
      const bool still =
          record == nullptr ||
          std::any_of(
              record->expiring.begin(), record->expiring.end(), [&d](const ExpiredCheckpoint& e) {
                return e.from.dir() == d.from.dir() && e.failed_removals == d.failed_removals;
              });
      if (still) dirs.push_back(d);
    }
  }
  // A redo may have written files there and not reported them yet: only
  // the expired checkpoint's go, those written no later than its manifest
  // (the last of its files; one filesystem's clock, whichever hosts wrote
  // them). Without a manifest, those older than `at` (InfinitePast, none,
  // for one forgotten for a redo or restored: ExpiredCheckpoint). A
  // checkpoint dropped as unusable: those no newer than its files were when
  // it was dropped (DroppedFilesBound; the same one clock). A retry keeps
  // the first try's bound (the manifest may be gone). A manifest whose
  // time cannot be read (EMFILE, ESTALE) fails the try, and no bound is
  // kept: taken for none, `at` stood in for its time in every retry.
  // Those that could not be removed (a file system's passing error: ESTALE,
  // EIO) stay listed, and are tried again by the scheduling pass on a
  // backoff (RetryExpiringLocked) or at a restart, until
  // kMaxExpiredRemovalTries and kExpiredRemovalRetryFor are both spent:
  // forgotten at once, a whole checkpoint stayed on disk for good, manifest
  // and all (the end-of-job sweeps take only incomplete ones).
  std::set<std::string> removed;
  // dir -> the bound it was tried with (none: its manifest's time unread).
  std::map<std::string, std::optional<absl::Time>> failed;
  for (const ExpiredCheckpoint& d : dirs) {
    std::optional<absl::Time> files_before = d.at;
    absl::Status status = absl::OkStatus();
    if (d.files_before.has_value()) {
      files_before = *d.files_before;
    } else if (d.dropped_on_plan.has_value()) {
      files_before = DroppedFilesBound(id, d.from);
    } else if (absl::StatusOr<std::optional<absl::Time>> manifest =
                   CheckpointManifestTime(options_.output_dir, d.from);
               !manifest.ok()) {
      files_before = std::nullopt;
      status = manifest.status();
    } else if (manifest->has_value()) {
      files_before = **manifest + absl::Nanoseconds(1);
    }
    if (status.ok()) {
      status = RemoveCheckpointDir(options_.output_dir, d.from, *files_before,
                                   d.manifest_whatever_its_time);
    }
    if (status.ok()) {
      removed.insert(d.from.dir());
      continue;
    }
    failed[d.from.dir()] = files_before;
    const absl::Time now = elapsed_clock_->Now();
    const absl::Time first_failed = std::min(d.first_failed, now);
    const int tries = d.failed_removals + 1;
    // Pruned meanwhile: nothing would try it again.
    if (pruned ||
        (tries >= kMaxExpiredRemovalTries && now - first_failed >= kExpiredRemovalRetryFor)) {
      removed.insert(d.from.dir());  // given up
      PT_LOG(WARNING) << "job " << id << ": expired checkpoint " << d.from.dir()
                      << " not removed after " << tries << " tries over "
                      << absl::FormatDuration(now - first_failed)
                      << (pruned ? " (the job was pruned)" : "")
                      << "; given up (remove it by hand): " << status;
    } else {
      PT_LOG(WARNING) << "job " << id << ": expired checkpoint " << d.from.dir()
                      << " not removed (tried again in "
                      << absl::FormatDuration(ExpiredRemovalBackoff(tries)) << "): " << status;
    }
  }
  AnnotatedMutexLock lock(&mu_);
  JobRecord* record = FindLocked(id);
  if (record == nullptr) return;
  // The job's next save stops listing those removed (or given up).
  std::vector<ExpiredCheckpoint>& expiring = record->expiring;
  expiring.erase(std::remove_if(expiring.begin(), expiring.end(),
                                [&removed](const ExpiredCheckpoint& e) {
                                  return removed.count(e.from.dir()) > 0;
                                }),
                 expiring.end());
  const absl::Time now = elapsed_clock_->Now();
  for (ExpiredCheckpoint& e : expiring) {
    if (auto it = failed.find(e.from.dir()); it != failed.end()) {
      ++e.failed_removals;
      e.first_failed = std::min(e.first_failed, now);
      if (it->second.has_value()) e.files_before = it->second;
      e.next_try = now + ExpiredRemovalBackoff(e.failed_removals);
    }
  }
  if (save_after) PersistLocked(*record).IgnoreError();  // logged, and retried
}

void JobManager::RetryExpiringLocked() {
  const absl::Time now = elapsed_clock_->Now();
  for (auto& [id, record] : jobs_) {
    const auto due = [now](const ExpiredCheckpoint& e) {
      return e.failed_removals > 0 && now >= e.next_try;
    };
    if (std::none_of(record->expiring.begin(), record->expiring.end(), due)) continue;
    // An ended job's directory is free for another job once swept: one that
    // took it over may have written the same steps (their files are spared
    // by their times, but not a manifest that goes whatever its time).
    const bool taken_over =
        IsTerminal(record->job.state()) && OtherCheckpointDirUserLocked(*record) != nullptr;
    std::vector<ExpiredCheckpoint> retried;
    for (ExpiredCheckpoint& e : record->expiring) {
      if (!due(e)) continue;
      if (taken_over || InitSourceInLocked(e.from.dir()) != nullptr) {
        // Not tried, so not given up either: named when the job is pruned.
        e.next_try = now + ExpiredRemovalBackoff(e.failed_removals);
        continue;
      }
      e.next_try = absl::InfiniteFuture();  // until the try queued below has run
      retried.push_back(e);
    }
    if (retried.empty()) continue;
    // Saved after: nothing else saves an ended job, whose stored record
    // would list what is gone (a restart would try it again).
    io_.Post([this, id = id, retried = std::move(retried)] {
      RemoveExpiring(id, retried, /*save_after=*/true);
    });
  }
}

void JobManager::RetryUnsavedLocked() {
  const absl::Time now = elapsed_clock_->Now();
  if (unsaved_.empty() || now < next_save_retry_) return;
  next_save_retry_ = now + absl::Seconds(1);
  const std::set<std::string> ids = std::move(unsaved_);
  unsaved_.clear();
  for (const std::string& id : ids) {
    JobRecord* record = FindLocked(id);
    if (record == nullptr) continue;  // pruned: its deletion is queued
    // Unlogged: the failure's ERROR line says so, once a minute.
    PersistLocked(*record).IgnoreError();  // noted again if it fails
  }
}

int JobManager::JobsWithFailedSave() const {
  AnnotatedMutexLock lock(&mu_);
  return static_cast<int>(save_failures_.size());
}

int JobManager::JobsWithFailedDelete() const {
  AnnotatedMutexLock lock(&mu_);
  return static_cast<int>(delete_failures_.size());
}

absl::Status JobManager::DeleteFromStore(const std::string& id) const {
  absl::Status deleted = options_.state->DeleteJob(id);
  if (!deleted.ok() && events_.state_delete_failed) events_.state_delete_failed();
  return deleted;
}

std::string JobManager::NoteDeletedLocked(const std::string& id) {
  auto it = delete_failures_.find(id);
  if (it == delete_failures_.end()) return "";
  const std::string after =
      absl::StrCat(" (after ", it->second.count, " failed deletes over ",
                   absl::FormatDuration(elapsed_clock_->Now() - it->second.since), ")");
  delete_failures_.erase(it);
  return after;
}

void JobManager::DeleteStoredJob(const std::string& id) {
  const absl::Status deleted = DeleteFromStore(id);
  AnnotatedMutexLock lock(&mu_);
  if (deleted.ok()) {
    if (const std::string after = NoteDeletedLocked(id); !after.empty()) {
      PT_LOG(INFO) << "job " << id << ": its stored state is deleted" << after;
    }
    return;
  }
  undeleted_.insert(id);
  // Tried again every second while the store fails (a line each, for
  // every pruned job, buried the cause).
  FailureStretch& failures = delete_failures_[id];
  if (!NoteFailureLocked(failures)) return;
  PT_LOG(WARNING) << "job " << id << ": pruned, but its stored state could not be deleted"
                  << failures.InARow(elapsed_clock_->Now(), "deletes") << ": " << deleted
                  << "; deleting it again every second (logged once a minute until a delete "
                     "succeeds; a restart meanwhile brings the job back)";
}

void JobManager::RetryDeletesLocked() {
  const absl::Time now = elapsed_clock_->Now();
  if (undeleted_.empty() || now < next_delete_retry_) return;
  next_delete_retry_ = now + absl::Seconds(1);
  for (const std::string& id : undeleted_) io_.Post([this, id] { DeleteStoredJob(id); });
  undeleted_.clear();
}

absl::Status JobManager::Restore() {
  if (options_.state == nullptr) return absl::OkStatus();
  // Oldest save first: the cache then evicts the least recently saved, not
  // the alphabetically first key (ProfileCache says what a restart loses).
  ASSIGN_OR_RETURN(auto profiles, options_.state->LoadProfilesBySave());
  ASSIGN_OR_RETURN(std::vector<store::StoredJob> stored, options_.state->LoadJobs());
  // Before anything is restored, changed or saved (a profile evicted
  // below is deleted from the store).
  RETURN_IF_ERROR(RefuseJobsOfANewerBuild(stored, options_.state->Describe()));
  for (const auto& [key, profile] : profiles) DropStoredProfiles(profiles_.Put(key, profile));
  const absl::Time now = clock_->Now();
  // By creation, one that does not fit (StoredTimeFits) as of now, as it is
  // restored (below): list pages resume by creation time, in this order.
  const auto created = [now](const store::StoredJob& s) {
    return StoredTimeFits(s.job().create_time(), now) ? FromProtoTimestamp(s.job().create_time())
                                                      : now;
  };
  std::sort(stored.begin(), stored.end(),
            [&created](const store::StoredJob& a, const store::StoredJob& b) {
              return created(a) < created(b);
            });
  AnnotatedMutexLock lock(&mu_);
  const absl::Time elapsed_now = elapsed_clock_->Now();
  int resumed = 0;
  // Failed by this restart, and whether its checkpoints' leftovers go.
  std::vector<std::pair<std::string, bool>> failed_by_restart;
  std::vector<std::string> ended_with_checkpoints;
  for (store::StoredJob& s : stored) {
    auto record = std::make_unique<JobRecord>();
    record->job = std::move(*s.mutable_job());
    const std::string id = record->job.id();
    if (id.empty() || jobs_.count(id) > 0) continue;
    const bool ended_before = IsTerminal(record->job.state());
    absl::StatusOr<ResolvedJobSpec> resolved = ResolveJobSpec(record->job.spec());
    // As at Submit: a job re-plans (a recovery, elastic growth) with no
    // later check of what planning it costs.
    if (resolved.ok()) {
      if (absl::Status budget = CheckPlanningBudget(*resolved); !budget.ok()) resolved = budget;
    }
    const bool spec_resolves = resolved.ok();
    if (!resolved.ok()) {  // a spec this version no longer accepts
      if (!IsTerminal(record->job.state())) {
        record->job.set_state(v1::JOB_STATE_FAILED);
        record->job.set_reason(
            absl::StrCat("after a coordinator restart, the spec is no longer "
                         "valid: ",
                         resolved.status().message()));
      }
      resolved = ResolvedJobSpec{};
      resolved->spec = record->job.spec();
    }
    record->resolved = std::move(*resolved);
    // Restarted without the --output-dir its weights or checkpoints need:
    // it would train to the end and fail there (Submit refuses such a job).
    if (absl::Status paths = CheckOutputDirGiven(record->resolved);
        spec_resolves && !paths.ok() && !IsTerminal(record->job.state())) {
      record->job.set_state(v1::JOB_STATE_FAILED);
      record->job.set_reason(absl::StrCat("after a coordinator restart: ", paths.message()));
    }
    // What the store holds is checked before anything is indexed, divided
    // or counted by it (stored_job_check.h): a job whose state does not
    // fit fails, unless it has ended already.
    auto fail_unfit = [&record](const std::string& what, const std::string& mismatch) {
      if (IsTerminal(record->job.state())) return;
      record->job.set_state(v1::JOB_STATE_FAILED);
      record->job.set_reason(
          absl::StrCat("after a coordinator restart, the stored ", what, ": ", mismatch));
    };
    record->plan = std::move(*s.mutable_plan());
    // Which stage owns which weights comes from the plan's unit ranges and
    // the model's parameter shapes. Without the job's own model (its spec
    // no longer resolves: the default model stands in) or with ranges past
    // it, that lookup would CHECK-fail and stop the coordinator from
    // starting; a plan whose degrees do not hold would divide by zero in
    // /metrics. Such a plan is dropped, whatever the job's state.
    const std::string plan_mismatch = StoredPlanMismatch(
        record->plan,
        spec_resolves ? std::optional<int>(NumUnits(record->resolved.train.model)) : std::nullopt);
    if (!plan_mismatch.empty()) {
      fail_unfit("plan does not fit the model", plan_mismatch);
      record->plan.Clear();
    }
    const std::string counters_mismatch = StoredCountersMismatch(
        record->job, {s.checkpoints().begin(), s.checkpoints().end()},
        s.has_init_checkpoint() ? &s.init_checkpoint() : nullptr, s.recoveries_without_progress());
    if (!counters_mismatch.empty()) fail_unfit("progress is out of range", counters_mismatch);
    // A time that does not fit is replaced by now, whatever the job's
    // state (an ended one's too): kept, one far ahead dated every job
    // submitted later after it (last_create_time_), and one past 9999 made
    // the REST API refuse each of them. The job is not failed for it: a
    // clock stepped by more than a day (a VM resumed with a wrong clock, a
    // host whose clock is not synced yet at boot) gives healthy records
    // such times, and replacing them is all that is needed.
    if (const std::string times_mismatch = StoredTimesMismatch(record->job, now);
        !times_mismatch.empty()) {
      PT_LOG(WARNING) << "job " << record->job.id() << ": stored " << times_mismatch
                      << "; replaced by now (check this coordinator's clock)";
      ReplaceUnfitTimes(record->job, now);
    }
    const bool owners_known = spec_resolves && plan_mismatch.empty();
    for (int st = 0; st < record->plan.stages_size(); ++st) {
      record->stage_of[record->plan.stages(st).worker_id()] = st;
      if (owners_known) RecordWeightOwners(*record, st);
    }
    record->stages.assign(record->plan.stages_size(), StageProgress{});
    // A re-plan splits the model by the profile's units: one that does not
    // parse or fit is dropped (a job that needs it fails below).
    std::string profile_mismatch;
    if (!s.profile_json().empty()) {
      absl::StatusOr<ModelProfile> profile = ParseProfileJson(s.profile_json());
      if (!profile.ok()) {
        profile_mismatch = std::string(profile.status().message());
      } else if (spec_resolves) {
        profile_mismatch = StoredProfileMismatch(*profile, record->resolved.train.model);
      }
      if (profile_mismatch.empty()) SetProfileLocked(*record, *std::move(profile));
    }
    record->profile_source = s.profile_source();
    switch (s.profile_attention()) {
      case static_cast<int>(AnalyticAttention::kCpu) + 1:
        record->profile_attention = AnalyticAttention::kCpu;
        break;
      case static_cast<int>(AnalyticAttention::kCudaGemm) + 1:
        record->profile_attention = AnalyticAttention::kCudaGemm;
        break;
      case static_cast<int>(AnalyticAttention::kCudaFlash) + 1:
        record->profile_attention = AnalyticAttention::kCudaFlash;
        break;
      default:  // stored before it was kept: not known
        break;
    }
    record->reference_gflops = s.reference_gflops();
    record->recoveries_without_progress = s.recoveries_without_progress();
    record->request_spec_sha256 = s.request_spec_sha256();
    if (s.has_init_checkpoint()) {
      record->init_checkpoint = s.init_checkpoint();
      record->init_step = s.init_checkpoint().step();
    }
    record->init_weights = s.init_weights();
    record->init_source =
        record->init_checkpoint.has_value() ? record->init_checkpoint->dir() : record->init_weights;
    // Bounded as spec.parallelism.workers is: a stored value is not
    // trusted (MinJobWorkers searches layouts up to it, under the lock).
    record->auto_layout_workers =
        record->resolved.data_parallel == kDataParallelAuto
            ? record->resolved.layout_workers
            : std::clamp(s.auto_layout_workers(), 0, static_cast<int32_t>(kMaxStages));
    record->auto_layout_compression = record->resolved.data_parallel == kDataParallelAuto
                                          ? record->resolved.spec.compression().data_parallel()
                                          : s.auto_layout_data_parallel_compression();
    // A job stored before tensor 0 existed has none: its T was fixed.
    record->auto_layout_parallelism =
        record->resolved.data_parallel != kDataParallelAuto && s.has_auto_layout_parallelism()
            ? s.auto_layout_parallelism()
            : record->resolved.spec.parallelism();
    const v1::CheckpointSpec& checkpoint = record->resolved.spec.checkpoint();
    if (checkpoint.interval_steps() > 0 && !checkpoint.dir().empty()) {
      record->checkpoints = std::make_unique<CheckpointCatalog>(
          checkpoint, record->resolved.train.model, record->resolved.train.steps);
      const std::string checkpoints_mismatch = record->checkpoints->RestoreComplete(
          {s.checkpoints().begin(), s.checkpoints().end()}, record->job.progress().step());
      // None is taken then: expiring them would delete what they name.
      if (!checkpoints_mismatch.empty()) {
        fail_unfit("checkpoints do not fit the job", checkpoints_mismatch);
      }
      // A stored step past the job's end is not one it reached.
      record->furthest_checkpoint_step =
          std::clamp<int64_t>(s.furthest_checkpoint_step(), 0, record->resolved.train.steps);
      if (record->checkpoints->Latest() != nullptr) {
        record->furthest_checkpoint_step =
            std::max(record->furthest_checkpoint_step, record->checkpoints->Latest()->step());
      }
      // Expired ones whose removal a crash may have cut short: removed once
      // every job is restored (below), if they name this job's own step
      // directories.
      for (const v1::ResumeFrom& e : s.expiring()) {
        const std::string mismatch = record->checkpoints->StepDirMismatch(e);
        if (spec_resolves && mismatch.empty()) {
          // When it expired is not stored, nor how it left (dropped,
          // forgotten): with no manifest its unit files stay. The restart
          // was no bound: this host's clock, not the file server's that
          // dates them, deleted a redo's written after it on a server
          // whose clock is behind.
          record->expiring.push_back(ExpiredCheckpoint{e, absl::InfinitePast()});
        } else if (!mismatch.empty()) {
          PT_LOG(WARNING) << "job " << id << ": a stored expired " << mismatch
                          << "; its files are left in place";
        }
      }
    }
    // A state this version does not know (another version's, a damaged
    // store): nothing would schedule, fail or prune the job.
    if (record->job.state() == v1::JOB_STATE_UNSPECIFIED ||
        !v1::JobState_IsValid(record->job.state())) {
      record->job.set_reason(absl::StrCat("after a coordinator restart, the stored state ",
                                          static_cast<int>(record->job.state()),
                                          " is not one this version knows"));
      record->job.set_state(v1::JOB_STATE_FAILED);
    }
    const v1::JobState state = record->job.state();
    // Not planned yet: it waits again (a first plan that was being made
    // was never stored).
    if (state == v1::JOB_STATE_PROFILING ||
        (state == v1::JOB_STATE_PLANNING && record->job.plan_version() == 0)) {
      record->job.set_state(v1::JOB_STATE_QUEUED);
    }
    // Restored waiting: its workers get the grace period to register again
    // before a queue timeout that passed while the coordinator was down
    // fails it (its wait counts from its creation).
    // As long ago as its create_time says (no clock survives a restart).
    record->queued_since =
        elapsed_now -
        std::max(absl::ZeroDuration(), now - FromProtoTimestamp(record->job.create_time()));
    if (record->job.state() == v1::JOB_STATE_QUEUED) {
      record->restart_grace_until = elapsed_now + options_.restart_grace;
    } else if (state == v1::JOB_STATE_PLANNING || state == v1::JOB_STATE_RUNNING ||
               state == v1::JOB_STATE_RECOVERING) {
      if (!profile_mismatch.empty()) {
        fail_unfit("profile does not fit the model", profile_mismatch);
      } else if (record->checkpoints == nullptr || !record->profile.has_value()) {
        record->job.set_state(v1::JOB_STATE_FAILED);
        record->job.set_reason(
            "the coordinator restarted while the job ran, and the job has no checkpoints "
            "(spec.checkpoint) to resume from");
      } else {
        // As a recovery from the loss of every worker, which get the grace
        // period to come back.
        // A recovery under way keeps its cause: a later failure (its queue
        // timeout) named only the restart, the cause left in the old
        // process's log. Once: a cause that is itself a restart is kept
        // as it is, not nested at every restart.
        std::string why = "the coordinator restarted";
        const std::string cause =
            ValidUtf8(s.recovery_reason().substr(0, kMaxStoredRecoveryReason));
        // Stored while it recovered or re-planned for it (StoredJobLocked).
        if ((state == v1::JOB_STATE_RECOVERING || state == v1::JOB_STATE_PLANNING) &&
            !cause.empty()) {
          why = absl::StartsWith(cause, why)
                    ? cause
                    : absl::StrCat(why, " (while recovering: ", cause, ")");
        }
        record->job.set_state(v1::JOB_STATE_RECOVERING);
        record->recovery_reason = why;
        record->job.set_reason(absl::StrCat("recovering: ", why));
        record->recovery_started = elapsed_now;
        record->restart_grace_until = elapsed_now + options_.restart_grace;
        record->survivors.assign(record->job.worker_ids().begin(), record->job.worker_ids().end());
        NoteSurvivorHeartbeatsLocked(*record);
        ++resumed;
        if (events_.recovery_started) events_.recovery_started(RecoveryKind::kCoordinatorRestart);
      }
    }
    // Failed by this restart: ended once every job is restored (below).
    if (!ended_before && record->job.state() == v1::JOB_STATE_FAILED) {
      // Ended now, whatever failed it (a spec, plan, counters, times or
      // profile that no longer fit, or no checkpoints). Its update_time
      // says when it ended (the retention of ended jobs counts from it):
      // the stored one, from before a long outage, would have it pruned
      // at the first scheduling pass, its reason never seen.
      TouchLocked(*record);
      // Its checkpoints' leftovers go too, once every job is restored (the
      // sweep skips a directory another live job shares), and the failure
      // is saved. Not the leftovers when the spec no longer resolves: its
      // checkpoint directory was not checked again, and a job of the
      // version that stored it (rolled back to) could still start from
      // them (spec.init.from).
      failed_by_restart.push_back({id, spec_resolves});
    }
    // Ended before the restart: its late sweep (SweepStoppedJobsLocked) was
    // not stored, and stages may have written a step after the end.
    if (ended_before && spec_resolves && record->checkpoints != nullptr) {
      ended_with_checkpoints.push_back(id);
    }
    if (events_.restored) events_.restored(id, record->job.progress().step());
    last_create_time_ = std::max(last_create_time_, FromProtoTimestamp(record->job.create_time()));
    order_.push_back(id);
    jobs_[id] = std::move(record);
  }
  for (const std::string& id : ended_with_checkpoints) {
    JobRecord& record = *jobs_[id];
    // No workers (ended before it ran): nothing was written. A live job
    // sharing the directory: its steps are not ours to judge. Another
    // ended job's sweep armed here: one per directory, which keeps every
    // overlapping job's complete checkpoints.
    if (options_.output_dir.empty() || record.job.worker_ids_size() == 0 ||
        CheckpointDirUserLocked(record.resolved.spec.checkpoint().dir()) != nullptr) {
      continue;
    }
    // The second sweep again, of what the ended job's stages wrote after
    // its end, once they have stopped (or kLateSweepWait from now); its
    // directory stays reserved until then (checkpoint_sweeps_pending).
    record.checkpoint_sweeps_pending = 1;
    record.late_sweep_workers.assign(record.job.worker_ids().begin(),
                                     record.job.worker_ids().end());
    record.late_sweep_since = now;
    record.late_sweep_by = elapsed_now + kLateSweepWait;
  }
  // Expired checkpoints a restart found listed: the coordinator may have
  // stopped between the save that expired them and their removal, which
  // left them on disk with nothing else naming them. Removed now, unless
  // another job's checkpoint directory overlaps and it may have written
  // there since (it has not ended, or took over this ended job's directory
  // and may have written the same steps) or a job starts from one.
  for (const std::string& id : order_) {
    JobRecord& record = *jobs_[id];
    if (record.expiring.empty()) continue;
    std::vector<ExpiredCheckpoint> doomed;
    if (!options_.output_dir.empty() && OtherCheckpointDirUserLocked(record) == nullptr) {
      for (const ExpiredCheckpoint& e : record.expiring) {
        if (InitSourceInLocked(e.from.dir()) == nullptr) doomed.push_back(e);
      }
    }
    record.expiring = doomed;  // the others stay as they are
    if (doomed.empty()) {
      PersistLocked(record).IgnoreError();  // stops listing them
      continue;
    }
    PT_LOG(INFO) << "job " << id << ": removing " << doomed.size()
                 << " expired checkpoint(s) left by the previous coordinator";
    io_.Post([this, id, doomed] { RemoveExpiring(id, doomed, /*save_after=*/true); });
  }
  // Complete checkpoints without a manifest: the previous coordinator
  // stopped between the save that completed one and its manifest's write,
  // or while a failed write waited for its retry (held in memory only).
  // Without it, export and init.from on the directory take an older step,
  // and a new job could reuse the directory over it. Written now, unless
  // another job's checkpoint directory overlaps and it may have written the
  // same steps since (OtherCheckpointDirUserLocked). An ended job created
  // before does not count: this one took its directory over (and that
  // job's sweep keeps this one's complete checkpoints).
  for (const std::string& id : order_) {
    const JobRecord& record = *jobs_[id];
    if (options_.output_dir.empty() || record.checkpoints == nullptr ||
        record.checkpoints->Latest() == nullptr ||
        OtherCheckpointDirUserLocked(record) != nullptr) {
      continue;
    }
    std::vector<ManifestToWrite> manifests;
    for (const v1::ResumeFrom& c : record.checkpoints->Complete()) {
      manifests.push_back(ManifestToWrite{options_.output_dir, id, record.resolved.spec.model(),
                                          record.resolved.train.seed, c, /*fresh=*/false});
    }
    io_.Post([this, manifests = std::move(manifests)] {
      for (const ManifestToWrite& m : manifests) {
        // One whose time cannot be read (EIO, EMFILE) may be missing: the
        // checks below tell, and an error there retries the write.
        const absl::StatusOr<std::optional<absl::Time>> written =
            CheckpointManifestTime(m.output_dir, m.complete);
        if (written.ok() && written->has_value()) continue;
        // Only over the files it records: not for a directory removed
        // since (an operator's, or a removal the save did not follow), nor
        // one with a file missing or of another size. Contents are not
        // read (a redo under the same layout writes the same sizes): the
        // workers check every file's SHA-256 when they resume from it.
        const absl::Status checked = CheckUnitFiles(m.output_dir, m.complete);
        if (absl::IsNotFound(checked) || absl::IsDataLoss(checked)) {
          PT_LOG(WARNING) << "job " << m.job_id << ": checkpoint " << m.complete.dir()
                          << " has no manifest, and none is written: " << checked.message();
          continue;
        }
        // A check that cannot tell (EIO, ESTALE, EMFILE) is no damage: WriteManifestIfHeld checks
        // again (`m` is not fresh) and counts such a failure as a failed write, tried every 5 s.
        PT_LOG(INFO) << "job " << m.job_id << ": writing the missing manifest of checkpoint "
                     << m.complete.step();
        WriteManifestIfHeld(m);
      }
    });
  }
  for (const auto& [id, sweeps] : failed_by_restart) {
    JobRecord& record = *jobs_[id];
    // Failed here, not by EndLocked: its only other trace is the API.
    PT_LOG(WARNING) << "job " << id << " FAILED: " << record.job.reason();
    std::function<void()> sweep =
        sweeps ? CheckpointSweepLocked(record, absl::Now()) : std::function<void()>();
    // An end as EndLocked's, unsaved until a save of it succeeds: the store
    // says it runs, and a failover meanwhile restores it as saved (a
    // standby given the --output-dir this leader lacks resumes it). Shown
    // not ended, holding its paths, and counted ended once saved
    // (PersistLocked): it was shown FAILED at once, and counted again by
    // the next leader that failed it too. Marked after the sweep is armed,
    // as EndLocked does.
    end_unsaved_.insert(id);
    // Else the store says RUNNING, and every restart fails it again.
    PersistLocked(record).IgnoreError();  // logged
    // What the old coordinator was uploading goes, as EndLocked removes it,
    // after the save: a hung output volume must not hold it.
    RemoveAbandonedWeightsOf(record);
    if (sweep) io_.Post(std::move(sweep));
  }
  PT_LOG(INFO) << "restored " << jobs_.size() << " jobs (" << resumed << " to resume) and "
               << profiles.size() << " profiles from " << options_.state->Describe();
  return absl::OkStatus();
}

}  // namespace pipetrain
