// CheckpointCatalog: the checkpoints of one job as the coordinator tracks
// them (DESIGN.md §11, JobSpec.checkpoint).
//
// Stages report the unit files they wrote for step k
// (ReportProgressRequest.checkpoint); checkpoint k is complete once every
// unit of the model is in, and only then can a job resume from it. The
// catalog keeps the newest `keep` complete ones, and the newest at or
// before the step the job's loss reached (SetReached); the caller writes each
// completed checkpoint's manifest (WriteCheckpointManifest) and deletes the
// directories of those it expires (RemoveCheckpointDir). Reports are
// checked before anything is kept: a stage may report only units it owns,
// for a step that is a checkpoint step of the job, with a well-formed name
// and checksum. Each stage's units are kept in at most
// kMaxPendingCheckpoints incomplete steps (its oldest dropped: a step
// whose writer failed never completes), so that no stage's reports, a
// hostile one's of steps far ahead among them, displace another's. The
// directories of incomplete steps that can no longer complete are handed
// to the caller to remove (TakeAbandoned), as expired ones are, and at the
// job's end those of every step it never completed (TakeIncomplete).
//
// Not thread-safe (JobManager's lock guards it).
#ifndef PIPETRAIN_COORDINATOR_JOBS_CHECKPOINT_CATALOG_H_
#define PIPETRAIN_COORDINATOR_JOBS_CHECKPOINT_CATALOG_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/pipetrain/v1/coordinator.pb.h"
#include "proto/pipetrain/v1/job.pb.h"
#include "worker/model/gpt_config.h"

namespace pipetrain {

inline constexpr int kMaxPendingCheckpoints = 4;
// The largest unit file a report may claim: 1 PiB, far above any model's
// unit (weights and moments), and small enough that sums of them stay far
// from overflowing (they feed metrics and the manifest).
inline constexpr int64_t kMaxUnitFileBytes = int64_t{1} << 50;
// The most bytes a job's complete checkpoints may take in its stored record
// (store::StoredJob: every unit's file, size and SHA-256 per checkpoint),
// so that the record stays within the store's 1 MiB value limit with room
// for the rest (the spec, the plan, the loss history). Checked at submit.
inline constexpr int64_t kMaxStoredCheckpointBytes = 512 << 10;

// The most bytes the `spec.keep` complete checkpoints of a model of `units`
// units, the one a resume takes held beyond them (SetReached), and a
// spec.init.from checkpoint take in the stored record.
int64_t StoredCheckpointBytes(const v1::CheckpointSpec& spec, int units);
// The largest keep whose checkpoints fit kMaxStoredCheckpointBytes.
int MaxStoredKeep(const v1::CheckpointSpec& spec, int units);

class CheckpointCatalog {
 public:
  // `spec` resolved (dir set, keep >= 1, interval_steps > 0).
  CheckpointCatalog(const v1::CheckpointSpec& spec, const GptConfig& model, int64_t steps);

  // Also accepts checkpoints of `step` (a re-plan's step boundary, off the
  // interval).
  void AllowStep(int64_t step) { allowed_.insert(step); }

  // A stage's report of its units for one step. INVALID_ARGUMENT naming the
  // field when the step is not one of the job's checkpoint steps (or
  // allowed), a unit is
  // outside `owned` (the stage's backward units) or reported twice, or a
  // file name, size or SHA-256 is malformed. Returns the checkpoint this
  // report completed, if it did.
  absl::StatusOr<std::optional<v1::ResumeFrom>> Add(const v1::CheckpointWritten& report,
                                                    const v1::UnitRange& owned);
  // Whether `report` repeats what the catalog has: it lists at least one
  // unit, and each of its units is recorded for its step (pending, or in the
  // complete checkpoint) with the same file, size and SHA-256. A stage that
  // sends its report again after a lost answer sends such a one; within one
  // plan nothing else does (a redone step's checkpoint was forgotten,
  // ForgetAfter, and a re-plan clears pending steps).
  bool Repeats(const v1::CheckpointWritten& report) const;
  // A stage could not write its units of `step` (a full disk): the step
  // will not complete, but the units written before the failure, its own
  // and other stages', stay in its directory. It counts as incomplete: its
  // directory is handed over (TakeAbandoned) once a later step completes
  // (every stage has finished writing it by then), or at the job's end
  // (TakeIncomplete). Before, a step every stage failed was in neither
  // list, and its files stayed until the job ended, each a full disk's
  // leftovers keeping the next checkpoints from fitting. Nothing for a
  // step not allowed, or one the catalog holds complete: returns false
  // then (the report counts for nothing), else true.
  bool Failed(int64_t step);
  // Whether a complete checkpoint of `step` is in the catalog (not expired
  // or dropped).
  bool Holds(int64_t step) const;
  // The newest complete checkpoint; null when none.
  const v1::ResumeFrom* Latest() const;
  // The newest complete checkpoint of at most `step` steps (a job resumes
  // only where its loss history reaches); null when none.
  const v1::ResumeFrom* LatestAtOrBefore(int64_t step) const;
  // Forgets the complete checkpoint of `step` (a stage could not load it):
  // a resume then takes the one before, and the step is incomplete again
  // (TakeIncomplete) unless it is redone. Returns what was dropped; nullopt
  // when no complete checkpoint has that step.
  std::optional<v1::ResumeFrom> Drop(int64_t step);
  // Complete checkpoints beyond `keep`, oldest first, no longer in the
  // catalog: the caller removes their directories. The newest one at or
  // before the step the job has reached (SetReached) is never expired,
  // whatever `keep` says (so up to keep + 1 are held).
  std::vector<v1::ResumeFrom> TakeExpired();
  // The job's loss reached `step` (JobProgress.step): a resume takes the
  // newest complete checkpoint at or before it (LatestAtOrBefore), which
  // stays until a newer one is at or before the step reached; those
  // beyond keep it held back are expired now (TakeExpired). A checkpoint
  // completes when every unit is written, which does not wait for the loss
  // stage's report when the loss stage writes no units (a forward-only
  // head under Bi-Partition), so the stages ahead completed `keep` newer
  // ones, and expiry deleted the last one a recovery could resume from:
  // the job started again from step 0.
  void SetReached(int64_t step);
  // A recovery resumes from `step`: the complete checkpoints beyond it (a
  // later one whose last loss never arrived) are forgotten, their steps
  // redone. The redo writes their files again (other bytes under another
  // layout) and completes them anew; their directories count as
  // incomplete until then (TakeIncomplete). Returns them, newest first: the
  // caller removes their directories (their manifests would otherwise name
  // the old checksums while the redo replaces the files).
  std::vector<v1::ResumeFrom> ForgetAfter(int64_t step);
  // Forgets incomplete steps (a re-plan: the new plan's stages report again).
  // Their directories stay: the new plan may be writing the same steps;
  // TakeIncomplete hands them over at the job's end unless they complete.
  void ClearPending();
  // At the job's end: every step that had units reported and neither
  // completed nor was handed over by TakeAbandoned (incomplete now, or
  // forgotten by ClearPending), none of them a complete checkpoint's step;
  // dir and step only. The caller removes their directories.
  std::vector<v1::ResumeFrom> TakeIncomplete();
  // Incomplete steps dropped for good (a stage's oldest beyond its limit,
  // or older than a step that completed), none of them a complete
  // checkpoint's step: the caller removes their directories.
  std::vector<v1::ResumeFrom> TakeAbandoned();
  // The complete checkpoints, oldest first (for the durable state), and
  // taking them back after a restart (replacing what the catalog holds).
  // A stored list is not trusted (a damaged or hostile store): the catalog
  // expires and deletes what it holds, and resumes from it. It is taken
  // only if its steps ascend within the job's, each names this job's step
  // directory (StepDir of spec.dir), and lists every unit in order with its
  // own file name, a size in [1, kMaxUnitFileBytes] and a SHA-256; else
  // nothing is taken and the reason is returned ("" when taken).
  std::vector<v1::ResumeFrom> Complete() const;
  // `reached`: the job's step as stored (SetReached's, without expiring).
  std::string RestoreComplete(const std::vector<v1::ResumeFrom>& complete, int64_t reached);
  // Why `c` does not name one of this job's step directories (a step in
  // [1, steps), its StepDir), or "" when it does: a stored expired
  // checkpoint (StoredJob.expiring) is removed after a restart only then.
  std::string StepDirMismatch(const v1::ResumeFrom& c) const;

 private:
  // A step in [1, steps) on the interval, or allowed (AllowStep).
  bool IsCheckpointStep(int64_t step) const;
  // Moves the complete checkpoints beyond keep, but the newest at or
  // before reached_, to expired_.
  void ExpireBeyondKeep();

  const v1::CheckpointSpec spec_;
  const int num_units_;
  const int64_t steps_;
  std::map<int64_t, std::map<int, v1::UnitFile>> pending_;  // step -> unit -> file
  std::deque<v1::ResumeFrom> complete_;                     // oldest first
  std::vector<v1::ResumeFrom> expired_;
  std::vector<v1::ResumeFrom> abandoned_;  // dir and step only
  std::set<int64_t> allowed_;
  // Steps with units reported that have not completed or been abandoned
  // since (pending_'s keys, and those ClearPending forgot).
  std::set<int64_t> incomplete_;
  int64_t reached_ = 0;  // SetReached

  // Notes `step`'s directory for TakeAbandoned unless it is a complete one.
  void Abandon(int64_t step);
};

// Writes <output_dir>/<from.dir>/manifest.json (0600, temporary name,
// fsync, rename, directory fsync): what `pipetrain checkpoint export` and an
// operator read to know the checkpoint is whole. Never through a symbolic
// link (common/confined_path.h). The step directory is created (0700, with
// any missing on the way) only with `create_step_dir`; otherwise a missing
// one is NOT_FOUND, as is one removed during the write (ENOENT).
absl::Status WriteCheckpointManifest(const std::string& output_dir, const std::string& job_id,
                                     const v1::ModelSpec& model, uint64_t seed,
                                     const v1::ResumeFrom& from, bool create_step_dir = false);

// The step directories ("step-" and digits) directly in
// <output_dir>/<checkpoint_dir> that hold no manifest: checkpoints never
// completed or half removed, whether or not a catalog knows them (one that
// a coordinator was writing or expiring when it was killed is known to no
// catalog after the restart). Each with its dir (under output_dir) and the
// step its name gives. Symbolic links are neither followed nor listed;
// none when the directory does not exist or cannot be read.
std::vector<v1::ResumeFrom> StepDirsWithoutManifest(const std::string& output_dir,
                                                    const std::string& checkpoint_dir);
// The same for the step directories that hold a manifest: complete
// checkpoints (or ones being removed, manifest first), by step. It fails
// closed, as a check that no complete checkpoint is there needs: none when
// the directory does not exist, but an error naming it when it cannot be
// listed or a step directory in it cannot be told to hold a manifest or not
// (EACCES, EMFILE, EIO: the errno's code); OpenConfinedParent's errors for
// the directory itself (INVALID_ARGUMENT: a link or a file on the way).
absl::StatusOr<std::vector<v1::ResumeFrom>> StepDirsWithManifest(const std::string& output_dir,
                                                                 const std::string& checkpoint_dir);

// Removes the manifest and the unit files in `from`'s directory, then the
// directory (left in place if anything else is in it). With
// `written_before`, files modified at or after it are left too (another
// job may have taken the directory since), the manifest as well unless
// `manifest_whatever_its_time`. Never follows a symbolic link. OK when the
// directory is already gone, and with `written_before` when it is left
// non-empty; the errno's code when it cannot be listed or a file in it read
// or removed (EMFILE, ENOMEM, EIO, ESTALE), for the caller to try again.
absl::Status RemoveCheckpointDir(const std::string& output_dir, const v1::ResumeFrom& from,
                                 std::optional<absl::Time> written_before = std::nullopt,
                                 bool manifest_whatever_its_time = false);

// When `from`'s manifest was last modified, by the clock of the filesystem
// that holds it (the one its unit files' times come from, whichever host
// wrote them); nullopt when it has none (it or its directory is gone, or
// it is not a regular file). Its complete checkpoint's unit files were all
// written before it; a later write there is another's (a redo of the
// step). The errno's code when that cannot be told (EMFILE, EIO, ESTALE),
// not nullopt: a caller would take another clock's bound instead;
// OpenConfinedParent's (INVALID_ARGUMENT) for a link on the way, or a
// link or directory in its place.
absl::StatusOr<std::optional<absl::Time>> CheckpointManifestTime(const std::string& output_dir,
                                                                 const v1::ResumeFrom& from);
// Just past the newest modification time among the files RemoveCheckpointDir
// takes in `from`'s directory (manifest, units, their temporaries) as they
// are now, by the clock of the file system that holds them: as its
// `written_before`, it takes those and spares any written there later,
// however far that clock is from this host's (an NFS server's; this host's
// own, stepped back). InfinitePast when the directory holds none or is
// gone. The errno's code when it cannot be listed or a file's time read
// (EMFILE, EIO, ESTALE); OpenConfinedParent's for a link on the way.
absl::StatusOr<absl::Time> CheckpointFilesBound(const std::string& output_dir,
                                                const v1::ResumeFrom& from);
// Whether `from`'s unit files are the ones it records (a stat each): OK
// when each is there at its recorded size; NOT_FOUND when its directory is
// gone; DATA_LOSS naming a file missing, not a regular file, or of another
// size. Other codes when that cannot be told: OpenConfinedParent's for the
// directory (a link on the way, EACCES, EMFILE), the errno's for a file
// (EIO, ESTALE). Contents are not read: a redo under the same layout writes
// files of the same sizes.
absl::Status CheckUnitFiles(const std::string& output_dir, const v1::ResumeFrom& from);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_JOBS_CHECKPOINT_CATALOG_H_
