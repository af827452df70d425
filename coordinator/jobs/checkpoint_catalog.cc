#include "coordinator/jobs/checkpoint_catalog.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/checkpoint_manifest_file.h"
#include "common/confined_path.h"
#include "common/secrets.h"
#include "common/status_macros.h"
#include "common/temp_file.h"
#include "common/utf8_prefix.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint/checkpoint_manifest.h"

namespace pipetrain {
namespace {

std::string StepDir(const std::string& dir, int64_t step) {
  return absl::StrFormat("%s/step-%08d", dir, step);
}

std::string UnitFile(int unit) { return absl::StrFormat("unit-%04d.safetensors", unit); }

// A unit's entry as a report or the stored state may hold it: its own file
// name, a size in [1, kMaxUnitFileBytes] and a SHA-256 in hex.
bool WellFormedUnitFile(const v1::UnitFile& f) {
  return f.file() == UnitFile(f.unit()) && f.bytes() > 0 && f.bytes() <= kMaxUnitFileBytes &&
         IsSha256Hex(f.sha256());
}

// The largest a stored checkpoint of `units` units in `spec`'s directory
// can be (field by field at their largest), with its tag and length.
int64_t OneStoredCheckpointBytes(const v1::CheckpointSpec& spec, int units) {
  v1::ResumeFrom largest;
  largest.set_step(std::numeric_limits<int64_t>::max());
  largest.set_dir(StepDir(spec.dir(), std::numeric_limits<int64_t>::max()));
  for (int u = 0; u < units; ++u) {
    v1::UnitFile* f = largest.add_units();
    f->set_unit(u);
    f->set_file(UnitFile(u));
    f->set_bytes(kMaxUnitFileBytes);
    f->set_sha256(std::string(64, 'f'));
  }
  const int64_t size = static_cast<int64_t>(largest.ByteSizeLong());
  return size + 1 + 10;  // the field's tag and length
}

}  // namespace

int64_t StoredCheckpointBytes(const v1::CheckpointSpec& spec, int units) {
  return (std::max<int64_t>(spec.keep(), 0) + 2) * OneStoredCheckpointBytes(spec, units);
}

int MaxStoredKeep(const v1::CheckpointSpec& spec, int units) {
  return static_cast<int>(kMaxStoredCheckpointBytes / OneStoredCheckpointBytes(spec, units)) - 2;
}

CheckpointCatalog::CheckpointCatalog(const v1::CheckpointSpec& spec, const GptConfig& model,
                                     int64_t steps)
    : spec_(spec), num_units_(NumUnits(model)), steps_(steps) {}

absl::StatusOr<std::optional<v1::ResumeFrom>> CheckpointCatalog::Add(
    const v1::CheckpointWritten& report, const v1::UnitRange& owned) {
  const int64_t step = report.step();
  if (!IsCheckpointStep(step)) {
    return absl::InvalidArgumentError(absl::StrCat("ReportProgressRequest.checkpoint.step: ", step,
                                                   " is not a checkpoint step of the job "
                                                   "(multiples of ",
                                                   spec_.interval_steps(), " below ", steps_, ")"));
  }
  if (report.units_size() > num_units_) {
    return absl::InvalidArgumentError("ReportProgressRequest.checkpoint.units: too many units");
  }
  // Every stage owns a unit; an empty report would make a pending step
  // that counts against no stage's limit.
  if (report.units_size() == 0) {
    return absl::InvalidArgumentError("ReportProgressRequest.checkpoint.units: none listed");
  }
  std::set<int> listed;
  for (const v1::UnitFile& f : report.units()) {
    if (!listed.insert(f.unit()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ReportProgressRequest.checkpoint.units: unit ", f.unit(), " is listed twice"));
    }
    if (f.unit() < owned.begin() || f.unit() >= owned.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ReportProgressRequest.checkpoint.units: unit ", f.unit(),
          " is not one of this stage's units [", owned.begin(), ", ", owned.end(), ")"));
    }
    if (!WellFormedUnitFile(f)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ReportProgressRequest.checkpoint.units: unit ", f.unit(), " needs file ",
          UnitFile(f.unit()), ", a size in [1, ", kMaxUnitFileBytes, "] and a SHA-256 in hex"));
    }
  }
  // Only a valid report makes a pending entry.
  std::map<int, v1::UnitFile>& units = pending_[step];
  for (const v1::UnitFile& f : report.units()) {
    // Only the fields checked above: unknown ones would ride into the
    // stored job (over the store's value limit) and every assignment.
    units[f.unit()] = f;
    units[f.unit()].DiscardUnknownFields();
  }
  incomplete_.insert(step);
  // This stage's units in other incomplete steps, its oldest forgotten
  // first: what one stage reports never displaces another's.
  const auto owned_in = [&owned](const std::map<int, v1::UnitFile>& in) {
    auto first = in.lower_bound(owned.begin());
    return first != in.end() && first->first < owned.end();
  };
  int others = 0;
  for (const auto& [other, in] : pending_) others += other != step && owned_in(in);
  for (auto it = pending_.begin(); others >= kMaxPendingCheckpoints && it != pending_.end();) {
    if (it->first == step || !owned_in(it->second)) {
      ++it;
      continue;
    }
    --others;
    it->second.erase(it->second.lower_bound(owned.begin()), it->second.lower_bound(owned.end()));
    if (!it->second.empty()) {
      ++it;
      continue;
    }
    Abandon(it->first);
    it = pending_.erase(it);
  }
  auto it = pending_.find(step);
  if (static_cast<int>(it->second.size()) < num_units_) return std::optional<v1::ResumeFrom>();
  v1::ResumeFrom from;
  from.set_step(step);
  from.set_dir(StepDir(spec_.dir(), step));
  for (const auto& [unit, file] : it->second) *from.add_units() = file;
  // Older incomplete steps can no longer matter: a resume takes the newest.
  for (auto older = pending_.begin(); older != it; ++older) Abandon(older->first);
  pending_.erase(pending_.begin(), std::next(it));
  incomplete_.erase(step);
  if (!complete_.empty() && complete_.back().step() >= step) {
    return std::optional<v1::ResumeFrom>();  // a redone step completed again
  }
  complete_.push_back(from);
  ExpireBeyondKeep();
  return std::optional<v1::ResumeFrom>(from);
}

void CheckpointCatalog::SetReached(int64_t step) {
  reached_ = step;
  ExpireBeyondKeep();
}

void CheckpointCatalog::ExpireBeyondKeep() {
  const size_t keep = static_cast<size_t>(std::max(spec_.keep(), 1));
  // The newest at or before reached_: a resume's (LatestAtOrBefore).
  std::optional<int64_t> resumable;
  for (const v1::ResumeFrom& c : complete_) {
    if (c.step() <= reached_) resumable = c.step();
  }
  std::deque<v1::ResumeFrom> kept;
  for (size_t i = 0; i < complete_.size(); ++i) {
    const bool newest = complete_.size() - i <= keep;
    if (newest || complete_[i].step() == resumable) {
      kept.push_back(std::move(complete_[i]));
    } else {
      expired_.push_back(std::move(complete_[i]));
    }
  }
  complete_ = std::move(kept);
}

bool CheckpointCatalog::IsCheckpointStep(int64_t step) const {
  const bool on_interval = step % spec_.interval_steps() == 0 || allowed_.count(step) > 0;
  return step > 0 && step < steps_ && on_interval;
}

bool CheckpointCatalog::Failed(int64_t step) {
  if (Holds(step) || !IsCheckpointStep(step)) return false;
  // An entry of no units (unless stages reported some): a later
  // completion abandons it as any older pending step, and it displaces no
  // stage's units.
  pending_[step];
  incomplete_.insert(step);
  // At most kMaxPendingCheckpoints steps with no units, the oldest handed
  // over first: reports of failures (a peer's word) must not grow the
  // catalog without bound.
  int empty = 0;
  for (const auto& [other, units] : pending_) empty += units.empty();
  for (auto it = pending_.begin(); empty > kMaxPendingCheckpoints && it != pending_.end();) {
    if (!it->second.empty()) {
      ++it;
      continue;
    }
    --empty;
    Abandon(it->first);
    it = pending_.erase(it);
  }
  return true;
}

bool CheckpointCatalog::Repeats(const v1::CheckpointWritten& report) const {
  if (report.units_size() == 0) return false;
  std::map<int, const v1::UnitFile*> recorded;
  if (auto it = pending_.find(report.step()); it != pending_.end()) {
    for (const auto& [unit, file] : it->second) recorded[unit] = &file;
  }
  for (const v1::ResumeFrom& c : complete_) {
    if (c.step() != report.step()) continue;
    for (const v1::UnitFile& file : c.units()) recorded[file.unit()] = &file;
  }
  for (const v1::UnitFile& f : report.units()) {
    auto it = recorded.find(f.unit());
    if (it == recorded.end() || it->second->file() != f.file() ||
        it->second->bytes() != f.bytes() || it->second->sha256() != f.sha256()) {
      return false;
    }
  }
  return true;
}

bool CheckpointCatalog::Holds(int64_t step) const {
  for (const v1::ResumeFrom& c : complete_) {
    if (c.step() == step) return true;
  }
  return false;
}

const v1::ResumeFrom* CheckpointCatalog::Latest() const {
  return complete_.empty() ? nullptr : &complete_.back();
}

const v1::ResumeFrom* CheckpointCatalog::LatestAtOrBefore(int64_t step) const {
  for (auto it = complete_.rbegin(); it != complete_.rend(); ++it) {
    if (it->step() <= step) return &*it;
  }
  return nullptr;
}

std::optional<v1::ResumeFrom> CheckpointCatalog::Drop(int64_t step) {
  for (auto it = complete_.begin(); it != complete_.end(); ++it) {
    if (it->step() != step) continue;
    v1::ResumeFrom dropped = std::move(*it);
    complete_.erase(it);
    incomplete_.insert(step);  // removed at the end unless redone
    return dropped;
  }
  return std::nullopt;
}

std::vector<v1::ResumeFrom> CheckpointCatalog::TakeExpired() {
  std::vector<v1::ResumeFrom> out;
  out.swap(expired_);
  return out;
}

void CheckpointCatalog::ClearPending() { pending_.clear(); }

void CheckpointCatalog::Abandon(int64_t step) {
  incomplete_.erase(step);
  if (Holds(step)) return;  // a step done again: its files are the checkpoint's
  v1::ResumeFrom gone;
  gone.set_step(step);
  gone.set_dir(StepDir(spec_.dir(), step));
  abandoned_.push_back(std::move(gone));
}

std::vector<v1::ResumeFrom> CheckpointCatalog::TakeAbandoned() {
  std::vector<v1::ResumeFrom> out;
  out.swap(abandoned_);
  return out;
}

std::vector<v1::ResumeFrom> CheckpointCatalog::ForgetAfter(int64_t step) {
  // The job goes back to `step`: until its loss reaches a later checkpoint
  // again, `step`'s is the one to keep.
  reached_ = std::min(reached_, step);
  std::vector<v1::ResumeFrom> forgotten;
  while (!complete_.empty() && complete_.back().step() > step) {
    forgotten.push_back(complete_.back());
    incomplete_.insert(complete_.back().step());
    complete_.pop_back();
  }
  return forgotten;
}

std::vector<v1::ResumeFrom> CheckpointCatalog::TakeIncomplete() {
  std::vector<v1::ResumeFrom> out;
  for (int64_t step : incomplete_) {
    if (Holds(step)) continue;  // redone and complete before
    v1::ResumeFrom gone;
    gone.set_step(step);
    gone.set_dir(StepDir(spec_.dir(), step));
    out.push_back(std::move(gone));
  }
  incomplete_.clear();
  pending_.clear();
  return out;
}

std::vector<v1::ResumeFrom> CheckpointCatalog::Complete() const {
  return std::vector<v1::ResumeFrom>(complete_.begin(), complete_.end());
}

std::string CheckpointCatalog::RestoreComplete(const std::vector<v1::ResumeFrom>& complete,
                                               int64_t reached) {
  complete_.clear();
  pending_.clear();
  int64_t previous = 0;
  for (const v1::ResumeFrom& c : complete) {
    if (c.step() <= previous) {
      return absl::StrCat("checkpoint of step ", c.step(), ": steps must ascend within [1, ",
                          steps_, ")");
    }
    previous = c.step();
    if (std::string mismatch = StepDirMismatch(c); !mismatch.empty()) return mismatch;
    const std::string which = absl::StrCat("checkpoint of step ", c.step());
    if (c.units_size() != num_units_) {
      return absl::StrCat(which, " lists ", c.units_size(), " units; the model has ", num_units_);
    }
    for (int u = 0; u < num_units_; ++u) {
      const v1::UnitFile& f = c.units(u);
      if (f.unit() != u || !WellFormedUnitFile(f)) {
        return absl::StrCat(which, ": its unit ", u, " entry is not unit ", u, "'s file ",
                            UnitFile(u), " with a size in [1, ", kMaxUnitFileBytes,
                            "] and a SHA-256");
      }
    }
  }
  complete_.assign(complete.begin(), complete.end());
  reached_ = reached;
  return "";
}

std::string CheckpointCatalog::StepDirMismatch(const v1::ResumeFrom& c) const {
  const std::string which = absl::StrCat("checkpoint of step ", c.step());
  if (c.step() < 1 || c.step() >= steps_) {
    return absl::StrCat(which, ": steps must ascend within [1, ", steps_, ")");
  }
  if (c.dir() != StepDir(spec_.dir(), c.step())) {
    return absl::StrCat(which, " names directory \"", Utf8Prefix(c.dir(), 256), "\", not \"",
                        StepDir(spec_.dir(), c.step()), "\"");
  }
  return "";
}

absl::Status WriteCheckpointManifest(const std::string& output_dir, const std::string& job_id,
                                     const v1::ModelSpec& model, uint64_t seed,
                                     const v1::ResumeFrom& from, bool create_step_dir) {
  nlohmann::json manifest = {{"format", "pipetrain-checkpoint-manifest"},
                             {"version", 1},
                             {"job_id", job_id},
                             {"step", from.step()},
                             {"seed", seed},
                             {"model",
                              {{"vocab_size", model.vocab_size()},
                               {"max_seq_len", model.max_seq_len()},
                               {"n_layer", model.n_layer()},
                               {"n_head", model.n_head()},
                               {"d_model", model.d_model()}}},
                             {"units", nlohmann::json::array()}};
  for (const v1::UnitFile& f : from.units()) {
    manifest["units"].push_back(
        {{"unit", f.unit()}, {"file", f.file()}, {"bytes", f.bytes()}, {"sha256", f.sha256()}});
  }
  const std::string text = manifest.dump(1) + "\n";
  ASSIGN_OR_RETURN(
      ConfinedParent parent,
      OpenConfinedParent(output_dir, kOutputDirFlag, "spec.checkpoint.dir",
                         absl::StrCat(from.dir(), "/", kCheckpointManifestName), create_step_dir));
  const std::string path = absl::StrCat(output_dir, "/", from.dir(), "/", kCheckpointManifestName);
  // Not made again: a step directory removed since holds none of the files
  // the manifest lists, and the manifest alone would pass it for complete.
  if (parent.dir.get() < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": its step directory is gone"));
  }
  // Unique: "manifest.json.tmp.<pid>" was unlinked and created again, so
  // two coordinators of one pid (containers sharing the volume) could
  // rename each other's half-written manifest into place. A crashed
  // attempt's temporary goes with the step directory (RemoveCheckpointDir).
  const std::string temp = TempNameFor(kCheckpointManifestName);
  const int dir = parent.dir.get();
  if (absl::Status written = WriteNewFileAt(dir, temp, text, 0600, /*sync=*/true); !written.ok()) {
    return absl::Status(written.code(), absl::StrCat(path, ": ", written.message()));
  }
  if (renameat(dir, temp.c_str(), dir, kCheckpointManifestName) != 0) {
    const int error = errno;
    unlinkat(dir, temp.c_str(), 0);
    return absl::ErrnoToStatus(error, absl::StrCat("cannot commit ", path));
  }
  // Renamed: the manifest is in place. EINVAL is a file system that cannot
  // sync directories (as the workers' unit commits and OpenConfinedParent
  // take it); reported as a failure, the same manifest was written again
  // every 5 s, moving the mtime that expiry dates the step's files by.
  if (fsync(dir) != 0 && errno != EINVAL) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot sync the directory of ", path));
  }
  return absl::OkStatus();
}

namespace {

// The names of the entries of the directory open at `dir` (`path`, as
// errors name it), "." and ".." among them; the errno's code when it
// cannot be read through (EMFILE, ENOMEM, EIO, ESTALE): a listing cut
// short would pass for the whole directory.
absl::StatusOr<std::vector<std::string>> DirEntryNames(int dir, const std::string& path) {
  const int listed = dup(dir);
  DIR* stream = listed < 0 ? nullptr : fdopendir(listed);
  if (stream == nullptr) {
    const int error = errno;
    if (listed >= 0) close(listed);
    return absl::ErrnoToStatus(error, absl::StrCat("cannot list ", path));
  }
  std::vector<std::string> names;
  int error = 0;
  for (;;) {
    errno = 0;  // readdir's end and its failure both return null
    const dirent* entry = readdir(stream);
    if (entry == nullptr) {
      error = errno;
      break;
    }
    names.push_back(entry->d_name);
  }
  closedir(stream);
  if (error != 0) return absl::ErrnoToStatus(error, absl::StrCat("cannot list ", path));
  return names;
}

// The entries of the directory open at `dir` (<checkpoint_dir>, as errors
// name it) named as step directories, by step; DirEntryNames' errors.
absl::StatusOr<std::map<int64_t, std::string>> StepDirNames(int dir,
                                                            const std::string& checkpoint_dir) {
  ASSIGN_OR_RETURN(const std::vector<std::string> entries, DirEntryNames(dir, checkpoint_dir));
  std::map<int64_t, std::string> names;
  for (const std::string& entry : entries) {
    int64_t step = 0;
    if (ParseStepDirName(entry, &step)) names.emplace(step, entry);
  }
  return names;
}

// The step directories directly in <output_dir>/<checkpoint_dir> that hold
// a manifest (`complete`) or none, by step; links neither followed nor
// listed; none when the directory does not exist. An error when it cannot
// be listed, and, for the complete ones, when a step directory cannot be
// told to hold a manifest or not: left out, a complete checkpoint would
// pass for none. For the incomplete ones such a step is left out (as
// "no manifest", a sweep would remove a complete checkpoint).
absl::StatusOr<std::vector<v1::ResumeFrom>> StepDirsByManifest(const std::string& output_dir,
                                                               const std::string& checkpoint_dir,
                                                               bool complete) {
  ASSIGN_OR_RETURN(const ConfinedParent parent,
                   OpenConfinedParent(output_dir, kOutputDirFlag, "spec.checkpoint.dir",
                                      absl::StrCat(checkpoint_dir, "/", kCheckpointManifestName),
                                      /*create_dirs=*/false));
  std::vector<v1::ResumeFrom> out;
  if (parent.dir.get() < 0) return out;
  ASSIGN_OR_RETURN(const auto names, StepDirNames(parent.dir.get(), checkpoint_dir));
  for (const auto& [step, name] : names) {
    const std::string dir = absl::StrCat(checkpoint_dir, "/", name);
    absl::StatusOr<std::optional<bool>> holds =
        HoldsCheckpointManifest(parent.dir.get(), name, dir);
    if (!holds.ok() && complete) return holds.status();
    if (!holds.ok() || !holds->has_value() || **holds != complete) continue;
    v1::ResumeFrom from;
    from.set_step(step);
    from.set_dir(dir);
    out.push_back(std::move(from));
  }
  return out;
}

// The names in the step directory open at `dir` (`path`, as errors name
// it) that a checkpoint's writers leave: the units, the manifest, and
// their temporaries ("unit-0003.safetensors.tmp.<pid>"); DirEntryNames'
// errors.
absl::StatusOr<std::vector<std::string>> CheckpointFileNames(int dir, const std::string& path) {
  ASSIGN_OR_RETURN(const std::vector<std::string> entries, DirEntryNames(dir, path));
  std::vector<std::string> names;
  for (const std::string& name : entries) {
    if (absl::StartsWith(name, "unit-") || absl::StartsWith(name, kCheckpointManifestName)) {
      names.push_back(name);
    }
  }
  return names;
}

}  // namespace

std::vector<v1::ResumeFrom> StepDirsWithoutManifest(const std::string& output_dir,
                                                    const std::string& checkpoint_dir) {
  absl::StatusOr<std::vector<v1::ResumeFrom>> dirs =
      StepDirsByManifest(output_dir, checkpoint_dir, /*complete=*/false);
  return dirs.ok() ? *std::move(dirs) : std::vector<v1::ResumeFrom>();
}

absl::StatusOr<std::vector<v1::ResumeFrom>> StepDirsWithManifest(
    const std::string& output_dir, const std::string& checkpoint_dir) {
  return StepDirsByManifest(output_dir, checkpoint_dir, /*complete=*/true);
}

absl::StatusOr<std::optional<absl::Time>> CheckpointManifestTime(const std::string& output_dir,
                                                                 const v1::ResumeFrom& from) {
  ASSIGN_OR_RETURN(ConfinedParent parent,
                   OpenConfinedParent(output_dir, kOutputDirFlag, "spec.checkpoint.dir",
                                      absl::StrCat(from.dir(), "/", kCheckpointManifestName),
                                      /*create_dirs=*/false));
  if (parent.dir.get() < 0) return std::nullopt;  // the directory is gone
  struct stat st;
  if (fstatat(parent.dir.get(), kCheckpointManifestName, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    const int error = errno;  // before StrCat allocates
    if (error == ENOENT) return std::nullopt;
    return absl::ErrnoToStatus(error, absl::StrCat("cannot read ", output_dir, "/", from.dir(), "/",
                                                   kCheckpointManifestName));
  }
  if (!S_ISREG(st.st_mode)) return std::nullopt;
  return absl::TimeFromTimespec(st.st_mtim);
}

absl::StatusOr<absl::Time> CheckpointFilesBound(const std::string& output_dir,
                                                const v1::ResumeFrom& from) {
  ASSIGN_OR_RETURN(ConfinedParent parent,
                   OpenConfinedParent(output_dir, kOutputDirFlag, "spec.checkpoint.dir",
                                      absl::StrCat(from.dir(), "/", kCheckpointManifestName),
                                      /*create_dirs=*/false));
  if (parent.dir.get() < 0) return absl::InfinitePast();  // gone: no file to take
  const std::string path = absl::StrCat(output_dir, "/", from.dir());
  ASSIGN_OR_RETURN(const std::vector<std::string> names,
                   CheckpointFileNames(parent.dir.get(), path));
  absl::Time bound = absl::InfinitePast();
  for (const std::string& name : names) {
    struct stat st;
    if (fstatat(parent.dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;  // removed since it was listed
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", path, "/", name));
    }
    bound = std::max(bound, absl::TimeFromTimespec(st.st_mtim) + absl::Nanoseconds(1));
  }
  return bound;
}

absl::Status CheckUnitFiles(const std::string& output_dir, const v1::ResumeFrom& from) {
  ASSIGN_OR_RETURN(ConfinedParent parent,
                   OpenConfinedParent(output_dir, kOutputDirFlag, "spec.checkpoint.dir",
                                      absl::StrCat(from.dir(), "/", kCheckpointManifestName),
                                      /*create_dirs=*/false));
  if (parent.dir.get() < 0) return absl::NotFoundError("its directory is gone");
  for (const v1::UnitFile& f : from.units()) {
    struct stat st;
    const bool found = fstatat(parent.dir.get(), f.file().c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
    if (!found && errno != ENOENT) {  // EIO, ESTALE: cannot tell
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat ", f.file()));
    }
    if (!found || !S_ISREG(st.st_mode)) {
      return absl::DataLossError(absl::StrCat(f.file(), " is missing or not a regular file"));
    }
    if (st.st_size != f.bytes()) {
      return absl::DataLossError(
          absl::StrCat(f.file(), " is ", st.st_size, " bytes, not the ", f.bytes(), " recorded"));
    }
  }
  return absl::OkStatus();
}

absl::Status RemoveCheckpointDir(const std::string& output_dir, const v1::ResumeFrom& from,
                                 std::optional<absl::Time> written_before,
                                 bool manifest_whatever_its_time) {
  ASSIGN_OR_RETURN(ConfinedParent parent,
                   OpenConfinedParent(output_dir, kOutputDirFlag, "spec.checkpoint.dir",
                                      absl::StrCat(from.dir(), "/", kCheckpointManifestName),
                                      /*create_dirs=*/false));
  if (parent.dir.get() < 0) return absl::OkStatus();  // already gone
  // Whether `st` is a file this removal may take.
  const auto removable = [&written_before](const struct stat& st) {
    if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) return false;
    if (!written_before.has_value()) return true;
    return absl::TimeFromTimespec(st.st_mtim) < *written_before;
  };
  // The manifest first: a checkpoint without it is visibly incomplete. One
  // whose time cannot be read (EIO, ESTALE) fails the removal: kept, it
  // would name the files removed below.
  bool take_manifest = !written_before.has_value() || manifest_whatever_its_time;
  if (struct stat st; !take_manifest) {
    if (fstatat(parent.dir.get(), kCheckpointManifestName, &st, AT_SYMLINK_NOFOLLOW) == 0) {
      take_manifest = removable(st);
    } else if (errno != ENOENT) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", output_dir, "/", from.dir(),
                                                     "/", kCheckpointManifestName));
    }
  }
  if (take_manifest) {
    // A manifest left would name the files removed below: a checkpoint
    // that looks complete and is not.
    if (unlinkat(parent.dir.get(), kCheckpointManifestName, 0) != 0 && errno != ENOENT) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot remove ", output_dir, "/", from.dir(),
                                                     "/", kCheckpointManifestName));
    }
  }
  // Then every file a writer left there: the units, and temporary files of
  // writers that died mid-write ("unit-0003.safetensors.tmp.<pid>"). A
  // listing that fails (EMFILE, ENOMEM, EIO, ESTALE) fails the removal, to
  // be tried again: the directory would stay non-empty, which with
  // `written_before` reads as files kept on purpose.
  ASSIGN_OR_RETURN(
      const std::vector<std::string> names,
      CheckpointFileNames(parent.dir.get(), absl::StrCat(output_dir, "/", from.dir())));
  // A file that cannot be read or unlinked (a passing I/O error) fails the
  // removal: the directory then stays non-empty, which with
  // `written_before` would read as files kept on purpose.
  int unlink_errno = 0;
  for (const std::string& name : names) {
    struct stat st;
    if (fstatat(parent.dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno != ENOENT && unlink_errno == 0) unlink_errno = errno;
      continue;
    }
    if (removable(st) && unlinkat(parent.dir.get(), name.c_str(), 0) != 0 && errno != ENOENT &&
        unlink_errno == 0) {
      unlink_errno = errno;
    }
  }
  if (unlink_errno != 0) {
    return absl::ErrnoToStatus(
        unlink_errno, absl::StrCat("cannot remove a file of ", output_dir, "/", from.dir()));
  }
  // Then the (now empty) step directory itself, from its parent: ".." of a
  // directory reached without following links is its real parent.
  ScopedFd up(openat(parent.dir.get(), "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  const std::string& relative = from.dir();
  const size_t slash = relative.rfind('/');
  const std::string name = slash == std::string::npos ? relative : relative.substr(slash + 1);
  if (up.get() < 0 || unlinkat(up.get(), name.c_str(), AT_REMOVEDIR) != 0) {
    // Files written since `written_before` stay, and so does the directory.
    if (up.get() >= 0 && errno == ENOTEMPTY && written_before.has_value()) {
      return absl::OkStatus();
    }
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot remove ", output_dir, "/", relative));
  }
  return absl::OkStatus();
}

}  // namespace pipetrain
