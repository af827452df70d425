#include "worker/checkpoint/unit_checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/confined_path.h"
#include "common/errno_status.h"
#include "common/logging.h"
#include "common/secrets.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

constexpr char kFormat[] = "pipetrain-unit-checkpoint";
constexpr char kVersion[] = "1";
constexpr char kMomentM[] = "optimizer.m.";
constexpr char kMomentV[] = "optimizer.v.";
constexpr char kFeedback[] = "feedback.";  // + "<replica>.<name>"
constexpr char kWarmQ[] = "powersgd.q.";
constexpr char kWarmQRanks[] = "powersgd.q.ranks.";
// The most tensor ranks a per-rank warm start may have (kMaxStages, which
// bounds every parallelism degree of a spec).
constexpr int64_t kMaxWarmQRanks = 1024;
constexpr char kFeedbackReplicas[] = "feedback_replicas";
constexpr char kTunedPartitions[] = "tuned_partitions";
// Bounds of a recorded tuning's layout: tensor ranks (above the spec's
// kMaxTensorParallel, 64, so that the format need not change with it: a
// record of another T than the resuming stage's is never taken) and
// samples of a micro-batch (no spec's batch comes near).
constexpr int64_t kMaxTunedRanks = 1024;
constexpr int64_t kMaxTunedSamples = int64_t{1} << 20;
constexpr char kLinkWarmQ[] = "link.q.";  // + "<replica>.<peer>.<kind>.<unit>"
// The most peer stages a link may name (kMaxStages) and the largest rank of
// a link's PowerSGD (kernels/compress/powersgd_codec.h).
constexpr int64_t kMaxLinkPeers = 1024;
constexpr int64_t kMaxLinkWarmQRank = 65536;
// PowerSGD's rank bound (spec.compression.data_parallel.codec).
constexpr int64_t kMaxWarmQRank = 1024;

absl::Status Errno(int error, absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(error, absl::StrCat(what, " ", path));
}

// " is N bytes; the checkpoint recorded M (truncated or replaced)".
absl::Status SizeDiffers(const std::string& path, int64_t bytes, int64_t recorded) {
  return absl::DataLossError(absl::StrCat(path, " is ", bytes, " bytes; the checkpoint recorded ",
                                          recorded, " (truncated or replaced)"));
}

// This reader's trouble with a file, not the checkpoint's: UNAVAILABLE.
// absl maps errnos such as ENOTCONN (a FUSE daemon gone), EBUSY or ENXIO to
// FAILED_PRECONDITION or NOT_FOUND, which the job runner reports as an
// unusable checkpoint, and the coordinator then deletes a good one.
absl::Status ReaderTrouble(int error, absl::string_view what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", strerror(error),
                                             " (this worker's trouble, not the checkpoint's)"));
}

// Opens the file `name` in `dir_fd` (not through a symbolic link) to read
// it whole, and says its size. `recorded_bytes` >= 0: the size the file
// must have, checked before anything is read (DATA_LOSS otherwise). A
// missing file is NOT_FOUND and a symbolic link ELOOP's code (the
// checkpoint's fault); any other failure to open or stat is UNAVAILABLE
// (ReaderTrouble).
absl::StatusOr<ScopedFd> OpenToReadAt(int dir_fd, const std::string& name, const std::string& path,
                                      int64_t recorded_bytes, int64_t* size) {
  // O_NONBLOCK: a FIFO opens at once (and is refused as not a regular file)
  // instead of blocking until some writer comes; regular files ignore it.
  ScopedFd fd(openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) {
    const int error = errno;
    if (error == ENOENT || error == ELOOP) return Errno(error, "cannot open", path);
    return ReaderTrouble(error, "cannot open", path);
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ReaderTrouble(errno, "cannot stat", path);
  if (!S_ISREG(st.st_mode)) return absl::DataLossError(absl::StrCat(path, " is not a file"));
  // A file of another size than recorded is refused from its size alone,
  // not after reading (and allocating) up to kMaxReadableUnitFileBytes.
  if (recorded_bytes >= 0 && st.st_size != recorded_bytes) {
    return SizeDiffers(path, st.st_size, recorded_bytes);
  }
  // This reader's limit, not the file's fault: RESOURCE_EXHAUSTED, which
  // does not have the coordinator drop (and delete) a checkpoint that may
  // be whole. (The writer refuses to write one this large.)
  if (st.st_size > kMaxReadableUnitFileBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(path, " is ", st.st_size, " bytes, above the ", kMaxReadableUnitFileBytes,
                     " a worker reads back whole; a unit this large "
                     "cannot be resumed (its error-feedback "
                     "residuals: fewer compressed replicas)"));
  }
  *size = st.st_size;
  return fd;
}

// The size and SHA-256 of the open file `fd`, read in chunks of 1 MiB at
// offsets (its file offset is left alone); a failure to read is
// UNAVAILABLE.
absl::StatusOr<std::pair<int64_t, std::string>> SizeAndSha256Of(int fd, const std::string& path) {
  Sha256Stream sha;
  std::string chunk(size_t{1} << 20, '\0');
  int64_t done = 0;
  for (;;) {
    const ssize_t n = pread(fd, chunk.data(), chunk.size(), done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ReaderTrouble(errno, "cannot read", path);
    if (n == 0) break;
    sha.Update(absl::string_view(chunk.data(), static_cast<size_t>(n)));
    done += n;
  }
  return std::make_pair(done, sha.FinishHex());
}

// The size and SHA-256 of the file `name` in `dir_fd` (OpenToReadAt's
// checks and codes), read in chunks of 1 MiB: a unit file read back whole
// to hash it added its size to the writer's memory beside the stage's
// snapshot (3x the unit's weights), which the plan does not budget.
absl::StatusOr<std::pair<int64_t, std::string>> SizeAndSha256At(int dir_fd, const std::string& name,
                                                                const std::string& path) {
  int64_t size = 0;
  ASSIGN_OR_RETURN(ScopedFd fd, OpenToReadAt(dir_fd, name, path, -1, &size));
  return SizeAndSha256Of(fd.get(), path);
}

SafetensorsMetadata MetadataFor(const CheckpointIdentity& id, int unit, int64_t step,
                                int64_t optimizer_steps) {
  const GptConfig& m = id.model;
  return {{"format", kFormat},
          {"version", kVersion},
          {"job_id", id.job_id},
          {"unit", absl::StrCat(unit)},
          {"step", absl::StrCat(step)},
          {"optimizer_steps", absl::StrCat(optimizer_steps)},
          {"seed", absl::StrCat(id.seed)},
          {"vocab_size", absl::StrCat(m.vocab_size)},
          {"max_seq_len", absl::StrCat(m.max_seq_len)},
          {"n_layer", absl::StrCat(m.n_layer)},
          {"n_head", absl::StrCat(m.n_head)},
          {"d_model", absl::StrCat(m.d_model)}};
}

std::string Get(const SafetensorsMetadata& metadata, const std::string& key) {
  auto it = metadata.find(key);
  return it == metadata.end() ? "" : it->second;
}

// The replica r of a residual stored as "feedback.<r>.<name>", or -1 where
// r is not spelt as the writer spells it (ReadUnitCheckpoint looks no such
// name up).
int64_t FeedbackReplicaOf(absl::string_view stored) {
  stored.remove_prefix(strlen(kFeedback));
  const absl::string_view digits = stored.substr(0, stored.find('.'));
  int64_t r = 0;
  if (!absl::SimpleAtoi(digits, &r) || digits != absl::StrCat(r) || r < 0) return -1;
  return r;
}

std::string LinkWarmQName(const LinkWarmStart& link) {
  return absl::StrCat(kLinkWarmQ, link.replica, ".", link.peer, ".", link.kind, ".", link.unit);
}

// UNIMPLEMENTED for a file another pipetrain build wrote in a form this one
// does not read (ReadUnitCheckpoint): not corrupt, so not DATA_LOSS, which
// the coordinator answers by deleting the checkpoint; the build that wrote
// it may still resume from it (a rollback).
absl::Status WrittenByAnotherBuild(const std::string& path, absl::string_view what) {
  return absl::UnimplementedError(absl::StrCat(
      path, " ", what, " (written by another pipetrain build; the checkpoint is kept: resume the "
      "job with a build that reads it)"));
}

// UNIMPLEMENTED (WrittenByAnotherBuild) when `meta` names this format in
// another version spelt as a writer spells one (a canonical number >= 1):
// another build's file (a newer one's, read after a rollback; an older
// one's after an upgrade), not a corrupt one. OK otherwise.
absl::Status CheckNotAnotherVersion(const SafetensorsMetadata& meta, const std::string& path) {
  const std::string version = Get(meta, "version");
  int64_t number = 0;
  if (Get(meta, "format") != kFormat || version == kVersion ||
      !absl::SimpleAtoi(version, &number) || number < 1 || version != absl::StrCat(number)) {
    return absl::OkStatus();
  }
  return WrittenByAnotherBuild(path,
                               absl::StrCat("is a unit checkpoint of format version ", version,
                                            "; this build reads version ", kVersion, " only"));
}

// A read of a unit file that failed after its checksum matched (an errno's
// code): this worker's trouble, UNAVAILABLE, so that the coordinator keeps
// a checkpoint whose bytes just matched.
absl::Status ReadFailedAfterChecksum(const absl::Status& failed) {
  return absl::UnavailableError(
      absl::StrCat(failed.message(),
                   " (read after its checksum matched: this worker's trouble, the checkpoint "
                   "is kept)"));
}

// The answer to a unit file, hashed as recorded, that the strict read
// refused (`refused`: INVALID_ARGUMENT or DATA_LOSS): DATA_LOSS, the
// checkpoint's fault, unless its header, read again leniently from `fd`,
// names another version of this format (CheckNotAnotherVersion's
// UNIMPLEMENTED). A later version may store what this build's reader
// refuses before it looks at the metadata (an I8 tensor, a metadata value
// that is not a string), and DATA_LOSS would have the coordinator delete
// the checkpoint. The second read failing on an errno is UNAVAILABLE.
absl::Status RefusedUnitFile(int fd, const std::string& path, const absl::Status& refused) {
  const absl::StatusOr<SafetensorsMetadata> meta = ReadSafetensorsMetadataLeniently(fd, path);
  if (meta.ok()) {
    RETURN_IF_ERROR(CheckNotAnotherVersion(*meta, path));
  } else if (!absl::IsInvalidArgument(meta.status()) && !absl::IsDataLoss(meta.status())) {
    return ReadFailedAfterChecksum(meta.status());
  }
  return absl::DataLossError(refused.message());
}

// A stored link warm start (its name after kLinkWarmQ, and the tensor),
// checked against the bounds ReadUnitCheckpoint documents.
absl::StatusOr<LinkWarmStart> ParseLinkWarmStart(absl::string_view key, const Tensor& q,
                                                 const GptConfig& model, const std::string& path) {
  const std::vector<std::string> parts = absl::StrSplit(key, '.');
  std::vector<int64_t> n(parts.size());
  bool ok = parts.size() == 4;
  // Canonical numbers only, as LinkWarmQName writes them: "+1" or "01"
  // would name the same link as "1", and the second would replace the first.
  for (size_t i = 0; ok && i < parts.size(); ++i) {
    ok = absl::SimpleAtoi(parts[i], &n[i]) && parts[i] == absl::StrCat(n[i]);
  }
  // The kind's range before the cast: 2^32 + 1 would wrap to a valid kind.
  ok = ok && n[0] >= 0 && n[0] < kMaxFeedbackReplicas && n[1] >= 0 && n[1] < kMaxLinkPeers &&
       n[2] >= 0 && n[2] <= std::numeric_limits<int>::max() && n[3] >= 0 &&
       n[3] < NumUnits(model);
  const Shape& shape = q.shape();
  if (!ok || shape.size() != 2 || shape[0] < 1 || shape[0] > model.d_model || shape[1] < 1 ||
      shape[1] > kMaxLinkWarmQRank) {
    return absl::DataLossError(
        absl::StrCat(path, ": tensor ", kLinkWarmQ, key.substr(0, 64), " ", ShapeToString(shape),
                     " is no link warm start (replica.peer.kind.unit within bounds, [1..",
                     model.d_model, ", 1..", kMaxLinkWarmQRank, "])"));
  }
  // Sound but for a kind this build does not know: one a later build
  // added, not a corrupt file.
  if (!v1::TensorKind_IsValid(static_cast<int>(n[2]))) {
    return WrittenByAnotherBuild(
        path, absl::StrCat("holds a link warm start (tensor ", kLinkWarmQ, key, ") of tensor kind ",
                           n[2], ", which this build does not know (it knows kinds ",
                           v1::TensorKind_MIN, "..", v1::TensorKind_MAX, ")"));
  }
  return LinkWarmStart{static_cast<int>(n[0]), static_cast<int>(n[1]), static_cast<int>(n[2]),
                       static_cast<int>(n[3]), q};
}

// Marks CheckSnapshotFinite's refusal (IsSnapshotNotFinite); no value.
constexpr char kSnapshotNotFinitePayloadUrl[] = "type.pipetrain/snapshot-not-finite";

// OK when every weight, moment, error-feedback residual and warm start of
// `snapshot` is finite (ReadUnitCheckpoint refuses files that are not);
// otherwise FAILED_PRECONDITION naming the first tensor that is not,
// marked for IsSnapshotNotFinite.
absl::Status CheckSnapshotFinite(const StageSnapshot& snapshot) {
  for (const UnitState& unit : snapshot.units) {
    std::vector<std::pair<std::string, const Tensor*>> tensors;
    for (const NamedTensor& t : unit.values) tensors.push_back({"weight " + t.name, &t.tensor});
    for (const NamedTensor& t : unit.m) tensors.push_back({"moment m of " + t.name, &t.tensor});
    for (const NamedTensor& t : unit.v) tensors.push_back({"moment v of " + t.name, &t.tensor});
    for (size_t r = 0; r < unit.feedback.size(); ++r) {
      for (const NamedTensor& t : unit.feedback[r]) {
        tensors.push_back(
            {absl::StrCat("replica ", r, "'s error feedback of ", t.name), &t.tensor});
      }
    }
    for (const NamedTensor& t : unit.warm_q)
      tensors.push_back({"warm start of " + t.name, &t.tensor});
    for (const NamedTensor& t : unit.warm_q_ranks) {
      tensors.push_back({"warm starts of " + t.name, &t.tensor});
    }
    for (const LinkWarmStart& link : unit.link_warm_q) {
      tensors.push_back(
          {absl::StrCat("a link's warm start (replica ", link.replica, ", peer ", link.peer, ")"),
           &link.q});
    }
    for (const auto& [what, tensor] : tensors) {
      const std::string bad = DescribeFirstNonFinite(*tensor);
      if (bad.empty()) continue;
      absl::Status refused = absl::FailedPreconditionError(absl::StrCat(
          "not writing the checkpoint of step ", snapshot.step, ": ", what, " of unit ", unit.unit,
          " ", bad, " (training diverged; the previous checkpoint stays the latest)"));
      refused.SetPayload(kSnapshotNotFinitePayloadUrl, absl::Cord());
      return refused;
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string FormatTunedPartitions(const TunedPartitions& tuned) {
  std::string out =
      absl::StrCat(tuned.tensor_parallel, " ", tuned.samples, " ", tuned.forward_begin, " ",
                   tuned.forward_end, " ", tuned.backward_begin, " ", tuned.backward_end);
  for (size_t u = 0; u < tuned.forward.size() && u < tuned.backward.size(); ++u) {
    absl::StrAppend(&out, " ", tuned.forward[u], "/", tuned.backward[u]);
  }
  return out;
}

absl::StatusOr<TunedPartitions> ParseTunedPartitions(absl::string_view text,
                                                     const GptConfig& model) {
  const int units = NumUnits(model);
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(kTunedPartitions, " \"", text.substr(0, 64),
                                                   text.size() > 64 ? "..." : "", "\": ", why));
  };
  // The longest text FormatTunedPartitions writes for this model (6
  // numbers of at most 7 digits, then "4/4" per unit, space-separated),
  // checked before splitting: a header of megabytes of spaces would
  // otherwise become as many pieces.
  const size_t longest = 6 * 8 + static_cast<size_t>(units) * 4;
  if (text.size() > longest) return bad(absl::StrCat("longer than ", longest, " bytes"));
  const std::vector<absl::string_view> fields = absl::StrSplit(text, ' ');
  if (fields.size() != static_cast<size_t>(6 + units)) {
    return bad(absl::StrCat("want 6 numbers and ", units, " forward/backward pairs"));
  }
  // Canonical decimals only, as FormatTunedPartitions writes them.
  auto number = [](absl::string_view field, int64_t lo, int64_t hi, int* out) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(field, &n) || field != absl::StrCat(n) || n < lo || n > hi) return false;
    *out = static_cast<int>(n);
    return true;
  };
  TunedPartitions tuned;
  if (!number(fields[0], 2, kMaxTunedRanks, &tuned.tensor_parallel) ||
      !number(fields[1], 1, kMaxTunedSamples, &tuned.samples)) {
    return bad(absl::StrCat("tensor ranks 2..", kMaxTunedRanks, " and samples 1..",
                            kMaxTunedSamples, " first"));
  }
  int* bounds[] = {&tuned.forward_begin, &tuned.forward_end, &tuned.backward_begin,
                   &tuned.backward_end};
  for (int i = 0; i < 4; ++i) {
    if (!number(fields[2 + i], 0, units, bounds[i])) return bad("a unit range outside the model");
  }
  if (tuned.forward_begin > tuned.forward_end || tuned.backward_begin > tuned.backward_end) {
    return bad("a unit range that ends before it begins");
  }
  for (int u = 0; u < units; ++u) {
    const std::vector<absl::string_view> pair = absl::StrSplit(fields[6 + u], '/');
    int forward = 0, backward = 0;
    const auto is_count = [](int k) { return k == 1 || k == 2 || k == 4; };
    if (pair.size() != 2 || !number(pair[0], 1, 4, &forward) || !number(pair[1], 1, 4, &backward) ||
        !is_count(forward) || !is_count(backward)) {
      return bad(absl::StrCat("unit ", u, "'s counts are not <forward>/<backward> in {1, 2, 4}"));
    }
    tuned.forward.push_back(forward);
    tuned.backward.push_back(backward);
  }
  return tuned;
}

bool IsSnapshotNotFinite(const absl::Status& status) {
  return status.code() == absl::StatusCode::kFailedPrecondition &&
         status.GetPayload(kSnapshotNotFinitePayloadUrl).has_value();
}

std::string StepDirName(int64_t step) { return absl::StrFormat("step-%08d", step); }

std::string UnitFileName(int unit) { return absl::StrFormat("unit-%04d.safetensors", unit); }

absl::StatusOr<std::vector<v1::UnitFile>> WriteStageCheckpoint(
    const std::string& root, const std::string& dir, const StageSnapshot& snapshot,
    const CheckpointIdentity& identity, const std::function<bool()>& stopped) {
  RETURN_IF_ERROR(CheckSnapshotFinite(snapshot));
  const std::string step_dir = absl::StrCat(dir, "/", StepDirName(snapshot.step));
  std::vector<v1::UnitFile> files;
  ScopedFd last_dir;
  for (const UnitState& unit : snapshot.units) {
    if (stopped && stopped()) {
      return absl::CancelledError(absl::StrCat("checkpoint ", step_dir,
                                               ": the stage stopped after ", files.size(), " of ",
                                               snapshot.units.size(), " unit files"));
    }
    const std::string relative = absl::StrCat(step_dir, "/", UnitFileName(unit.unit));
    ASSIGN_OR_RETURN(ConfinedParent parent,
                     OpenConfinedParent(root, kCheckpointRootFlag, "spec.checkpoint.dir", relative,
                                        /*create_dirs=*/true));
    const std::string path = absl::StrCat(root, "/", relative);
    std::vector<NamedTensor> tensors = unit.values;
    for (size_t i = 0; i < unit.m.size(); ++i) {
      tensors.push_back({kMomentM + unit.m[i].name, unit.m[i].tensor});
      tensors.push_back({kMomentV + unit.v[i].name, unit.v[i].tensor});
    }
    SafetensorsMetadata metadata =
        MetadataFor(identity, unit.unit, snapshot.step, snapshot.optimizer_steps);
    if (!unit.feedback.empty()) {
      metadata[kFeedbackReplicas] = absl::StrCat(unit.feedback.size());
      for (size_t r = 0; r < unit.feedback.size(); ++r) {
        for (const NamedTensor& e : unit.feedback[r]) {
          tensors.push_back({absl::StrCat(kFeedback, r, ".", e.name), e.tensor});
        }
      }
    }
    for (const NamedTensor& q : unit.warm_q) tensors.push_back({kWarmQ + q.name, q.tensor});
    for (const NamedTensor& q : unit.warm_q_ranks) {
      tensors.push_back({kWarmQRanks + q.name, q.tensor});
    }
    for (const LinkWarmStart& link : unit.link_warm_q) {
      tensors.push_back({LinkWarmQName(link), link.q});
    }
    if (unit.tuned_partitions.has_value()) {
      metadata[kTunedPartitions] = FormatTunedPartitions(*unit.tuned_partitions);
    }
    // A writer of this unit file that died mid-write (a killed worker whose
    // step is redone here) left its temporary, up to the whole file's size:
    // nothing else removes it once the step completes, and a kept
    // checkpoint would carry it for good. Unlocked temporaries only
    // (RemoveAbandonedTemporaries): a living writer's stays, unless it is
    // in another process and has not locked its file yet, or on another
    // host where locks are host-local (a stopped plan's slow writer of the
    // same step); that write then fails, and nothing is corrupted.
    for (const std::string& removed : RemoveAbandonedTemporaries(parent.dir.get(), parent.name)) {
      PT_LOG(INFO) << "checkpoint " << step_dir << ": removed " << removed
                   << ", left by a writer that died mid-write";
    }
    // One no worker would read back (kMaxReadableUnitFileBytes) is not written: the
    // coordinator would record it complete, and every resume from it fail.
    // With room for the length and the header (kMaxUnitFileTensorBytes): the
    // reader bounds the whole file. ResolveJobSpec refuses a spec that comes
    // here; this stays for what it does not count (the links' warm starts).
    int64_t data_bytes = 0;
    for (const NamedTensor& t : tensors) data_bytes += t.tensor.size_bytes();
    if (data_bytes > kMaxUnitFileTensorBytes) {
      // More stages do not help: a unit's file is the unit's, whole.
      return absl::ResourceExhaustedError(absl::StrCat(
          "checkpoint ", step_dir, ": unit ", unit.unit, "'s file would hold ", data_bytes,
          " bytes of tensors, above the ", kMaxReadableUnitFileBytes,
          " a worker reads back whole (each data-parallel replica's error-feedback residual is "
          "kept: fewer compressed replicas, or no spec.compression.data_parallel)"));
    }
    // The writer names the file alone; say where it is (a full disk is this
    // worker's checkpoint volume), keeping the code and any errno.
    const absl::Status written =
        WriteSafetensorsAt(parent.dir.get(), parent.name, tensors, metadata, 0600, stopped);
    if (!written.ok()) {
      return WithMessage(
          written, absl::StrCat("checkpoint ", step_dir, " under ", kCheckpointRootFlag, " ", root,
                                ": ", written.message()));
    }
    // Checksummed as written to disk (read back from the page cache).
    ASSIGN_OR_RETURN(const auto size_and_sha, SizeAndSha256At(parent.dir.get(), parent.name, path));
    v1::UnitFile file;
    file.set_unit(unit.unit);
    file.set_file(parent.name);
    file.set_bytes(size_and_sha.first);
    file.set_sha256(size_and_sha.second);
    files.push_back(std::move(file));
    last_dir = std::move(parent.dir);
  }
  // The renames are durable once the directory is. EINVAL: the file system
  // cannot sync directories, where every file was synced and renamed all
  // the same (OpenConfinedParent and CommitTemporary accept it alike).
  if (last_dir.get() >= 0 && fsync(last_dir.get()) != 0 && errno != EINVAL) {
    return Errno(errno, "cannot sync directory", absl::StrCat(root, "/", step_dir));
  }
  return files;
}

absl::StatusOr<UnitState> ReadUnitCheckpoint(const std::string& root, const v1::ResumeFrom& from,
                                             const v1::UnitFile& expected,
                                             const CheckpointIdentity& identity, bool with_moments,
                                             int64_t* optimizer_steps, int replica, int replicas) {
  if (replicas < 1 || replica < 0 || replica >= replicas) {
    return absl::InvalidArgumentError(
        absl::StrCat("reading a unit checkpoint for replica ", replica, " of ", replicas));
  }
  const std::string relative = absl::StrCat(from.dir(), "/", expected.file());
  const std::string path = absl::StrCat(root, "/", relative);
  if (expected.unit() < 0 || expected.unit() >= NumUnits(identity.model)) {
    return absl::DataLossError(absl::StrCat("checkpoint ", from.dir(), " names unit ",
                                            expected.unit(), " of a model of ",
                                            NumUnits(identity.model), " units"));
  }
  if (expected.file() != UnitFileName(expected.unit())) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint ", from.dir(), " names \"", expected.file().substr(0, 64), "\" for unit ",
        expected.unit(), "; expected ", UnitFileName(expected.unit())));
  }
  absl::StatusOr<ConfinedParent> opened =
      OpenConfinedParent(root, kCheckpointRootFlag, "checkpoint unit file", relative,
                         /*create_dirs=*/false);
  if (!opened.ok() && !absl::IsInvalidArgument(opened.status())) {
    // The root or a directory on the way could not be opened (missing root,
    // no access, too many open files): this worker's trouble, UNAVAILABLE,
    // not the checkpoint's. A link or a non-directory on the way stays
    // INVALID_ARGUMENT, the checkpoint's.
    return absl::UnavailableError(opened.status().message());
  }
  if (!opened.ok()) {
    // A link or a non-directory on the way to the job's checkpoint
    // directory (spec.checkpoint.dir: an operator moved it to another
    // volume and left a link) is on the way to every checkpoint of the
    // job: UNAVAILABLE, not this checkpoint's fault, so that the job does
    // not drop its checkpoints one after another and start again from
    // step 0. Only one in the step directory or at the file is this one's.
    // The probe walks to the job's directory and names in it an entry no
    // checkpoint puts there (unit files live in the step directories): an
    // existing directory or link at the final name would be refused too.
    const size_t slash = from.dir().rfind('/');
    if (slash != std::string::npos && slash > 0) {
      const std::string job_dir = from.dir().substr(0, slash);
      const absl::Status shared =
          OpenConfinedParent(root, kCheckpointRootFlag, "spec.checkpoint.dir",
                             absl::StrCat(job_dir, "/", UnitFileName(0)), /*create_dirs=*/false)
              .status();
      if (absl::IsInvalidArgument(shared)) {
        return absl::UnavailableError(
            absl::StrCat(shared.message(), " (on the way to every checkpoint of the job, under ",
                         kCheckpointRootFlag, "; the checkpoint is kept)"));
      }
    }
    return opened.status();
  }
  ConfinedParent parent = *std::move(opened);
  if (parent.dir.get() < 0) {
    // The coordinator listed this step as complete, so a directory missing
    // as a whole is most likely this worker's view of the volume (another
    // --checkpoint-root than the shared --output-dir): UNAVAILABLE, this
    // worker's trouble, so the checkpoint is not dropped (and its files
    // removed) on its word. A file missing inside the directory is the
    // checkpoint's (NOT_FOUND below).
    return absl::UnavailableError(
        absl::StrCat("checkpoint directory of ", path,
                     " is missing; is this worker's --checkpoint-root the volume the coordinator's "
                     "--output-dir is?"));
  }
  // The recorded size first (a negative one matches no file but an empty one).
  int64_t size = 0;
  ASSIGN_OR_RETURN(ScopedFd fd, OpenToReadAt(parent.dir.get(), parent.name, path,
                                             std::max<int64_t>(expected.bytes(), 0), &size));
  ASSIGN_OR_RETURN(const auto hashed, SizeAndSha256Of(fd.get(), path));
  if (hashed.first != expected.bytes()) {  // it shrank while read
    return SizeDiffers(path, hashed.first, expected.bytes());
  }
  if (hashed.second != expected.sha256()) {
    return absl::DataLossError(
        absl::StrCat(path, ": SHA-256 differs from the one recorded (corrupt)"));
  }
  // Decoded from the same open file, a tensor at a time: the bytes hashed
  // (a writer replaces a unit file by a rename, never in place), never the
  // whole file beside its fp32 copies. Read whole, a unit's weights,
  // moments and every replica's residuals were held twice at the resume's
  // peak, which the plan does not budget (a worker admitted to a close
  // plan was killed loading, at every recovery).
  //
  // Only what the caller uses is decoded: the unit's parameters, and
  // with its moments also the moments, the warm starts and the residuals
  // of the old replicas r = replica mod replicas (those Restore folds into
  // this replica's). Decoding every tensor held about (3 + D_old) unsplit
  // copies of the stage's weights until Restore, where the plan budgets
  // 3 + D_new shards (weights alone for a forward-only unit): a recovery
  // that shrank D was killed loading, at every attempt. Every residual's
  // name is kept, decoded or not, to check that a parameter has every
  // replica's or none.
  std::set<std::string> parameters;
  for (const ParameterShape& p : UnitParameterShapes(identity.model, expected.unit())) {
    parameters.insert(p.name);
  }
  std::set<std::string> residuals;  // every "feedback.<r>.<name>" the file holds
  const auto wanted = [&](std::string_view view) {
    const absl::string_view name(view.data(), view.size());
    if (absl::StartsWith(name, kFeedback)) {
      residuals.emplace(name);
      const int64_t r = FeedbackReplicaOf(name);
      return with_moments && r >= 0 && r % replicas == replica;
    }
    if (absl::StartsWith(name, kMomentM) || absl::StartsWith(name, kMomentV) ||
        absl::StartsWith(name, kWarmQ) || absl::StartsWith(name, kLinkWarmQ)) {
      return with_moments;
    }
    return parameters.count(std::string(name)) > 0;
  };
  // The strict read takes its descriptor over; this one stays to read the
  // header again if that read refuses the file (RefusedUnitFile).
  const ScopedFd again(fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
  if (again.get() < 0) return ReaderTrouble(errno, "cannot duplicate the descriptor of", path);
  absl::StatusOr<SafetensorsContents> parsed =
      ReadSafetensorsTensorsFrom(std::move(fd), path, wanted);
  if (!parsed.ok()) {
    // The file hashed as recorded: a file that does not parse (its format:
    // INVALID_ARGUMENT; shrunk in place: DATA_LOSS) is the checkpoint's,
    // unless it names another format version; a read that fails now (an
    // errno's code) is this worker's trouble, as above.
    if (absl::IsInvalidArgument(parsed.status()) || absl::IsDataLoss(parsed.status())) {
      return RefusedUnitFile(again.get(), path, parsed.status());
    }
    return ReadFailedAfterChecksum(parsed.status());
  }
  const SafetensorsContents& contents = *parsed;
  const SafetensorsMetadata& meta = contents.metadata;
  RETURN_IF_ERROR(CheckNotAnotherVersion(meta, path));
  if (Get(meta, "format") != kFormat || Get(meta, "version") != kVersion) {
    return absl::DataLossError(absl::StrCat(path, " is not a pipetrain unit checkpoint (format \"",
                                            Get(meta, "format"), "\" version \"",
                                            Get(meta, "version"), "\")"));
  }
  if (Get(meta, "unit") != absl::StrCat(expected.unit()) ||
      Get(meta, "step") != absl::StrCat(from.step())) {
    return absl::DataLossError(absl::StrCat(path, " holds unit ", Get(meta, "unit"), " at step ",
                                            Get(meta, "step"), "; expected unit ", expected.unit(),
                                            " at step ", from.step()));
  }
  const SafetensorsMetadata want = MetadataFor(identity, expected.unit(), from.step(), 0);
  for (const char* key : {"seed", "vocab_size", "max_seq_len", "n_layer", "n_head", "d_model"}) {
    if (Get(meta, key) != Get(want, key)) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " is a checkpoint of another model: ", key, " ", Get(meta, key),
                       " in the file, ", Get(want, key), " in this job"));
    }
  }
  // Finite numbers only, as WriteStageCheckpoint writes, and AdamW's v is
  // a mean of squares: anything else (a file written by hand, with its
  // manifest) would turn the resumed weights to NaN at the first step.
  // (Of the tensors decoded: the others are not used.)
  for (const NamedTensor& t : contents.tensors) {
    std::string bad = DescribeFirstNonFinite(t.tensor);
    if (bad.empty() && absl::StartsWith(t.name, kMomentV)) bad = DescribeFirstNegative(t.tensor);
    if (!bad.empty()) {
      return absl::DataLossError(
          absl::StrCat(path, ": tensor ", t.name.substr(0, 96), " ", bad, " (not resumable)"));
    }
  }
  int64_t steps = 0;
  // At most one optimizer step an iteration: more would be a file not
  // written by a stage (and INT64_MAX would overflow AdamW's step count).
  if (!absl::SimpleAtoi(Get(meta, "optimizer_steps"), &steps) || steps < 0 || steps > from.step()) {
    return absl::DataLossError(absl::StrCat(path, ": bad optimizer_steps \"",
                                            Get(meta, "optimizer_steps").substr(0, 32),
                                            "\" (want 0 .. step ", from.step(), ")"));
  }
  if (optimizer_steps != nullptr) *optimizer_steps = steps;
  auto find = [&](const std::string& name, const std::vector<int64_t>& shape,
                  std::vector<NamedTensor>* out, const std::string& stored) -> absl::Status {
    const Tensor* t = contents.Find(stored);
    if (t == nullptr || t->shape() != Shape(shape.begin(), shape.end())) {
      return absl::DataLossError(absl::StrCat(path, ": tensor ", stored,
                                              t == nullptr ? " is missing" : " has another shape"));
    }
    out->push_back({name, *t});
    return absl::OkStatus();
  };
  UnitState state;
  state.unit = expected.unit();
  // Error feedback: written only after a step, by a job that compressed.
  int64_t file_replicas = 0;
  const std::string replicas_text = Get(meta, kFeedbackReplicas);
  if (with_moments && steps > 0 && !replicas_text.empty()) {
    if (!absl::SimpleAtoi(replicas_text, &file_replicas) || file_replicas < 1 ||
        file_replicas > kMaxFeedbackReplicas) {
      return absl::DataLossError(absl::StrCat(path, ": bad ", kFeedbackReplicas, " \"",
                                              replicas_text.substr(0, 32), "\" (1..",
                                              kMaxFeedbackReplicas, ")"));
    }
    state.feedback.resize(static_cast<size_t>(file_replicas));
  }
  for (const ParameterShape& p : UnitParameterShapes(identity.model, expected.unit())) {
    RETURN_IF_ERROR(find(p.name, p.shape, &state.values, p.name));
    if (with_moments && steps > 0) {
      RETURN_IF_ERROR(find(p.name, p.shape, &state.m, kMomentM + p.name));
      RETURN_IF_ERROR(find(p.name, p.shape, &state.v, kMomentV + p.name));
    }
    if (file_replicas == 0) continue;
    // Every replica's residual of a compressed parameter, or none: a file
    // with some replicas' alone (not written by a stage) would resume the
    // others without theirs, silently. Those this replica does not fold
    // were not decoded: checked by name.
    bool any_feedback = false;
    for (int64_t r = 0; r < file_replicas && !any_feedback; ++r) {
      any_feedback = residuals.count(absl::StrCat(kFeedback, r, ".", p.name)) > 0;
    }
    for (int64_t r = 0; any_feedback && r < file_replicas; ++r) {
      const std::string stored = absl::StrCat(kFeedback, r, ".", p.name);
      if (r % replicas == replica) {
        RETURN_IF_ERROR(find(p.name, p.shape, &state.feedback[static_cast<size_t>(r)], stored));
      } else if (residuals.count(stored) == 0) {
        return absl::DataLossError(absl::StrCat(path, ": tensor ", stored, " is missing"));
      }
    }
    if (const Tensor* q = contents.Find(kWarmQ + p.name); q != nullptr) {
      const Shape& shape = q->shape();
      if (p.shape.size() != 2 || shape.size() != 2 || shape[0] != p.shape[1] || shape[1] < 1 ||
          shape[1] > kMaxWarmQRank) {
        return absl::DataLossError(absl::StrCat(path, ": tensor ", kWarmQ, p.name, " is ",
                                                ShapeToString(shape), "; expected [",
                                                p.shape.back(), ", rank <= ", kMaxWarmQRank, "]"));
      }
      state.warm_q.push_back({p.name, *q});
    }
    if (const Tensor* q = contents.Find(kWarmQRanks + p.name); q != nullptr) {
      const Shape& shape = q->shape();
      if (p.shape.size() != 2 || shape.size() != 3 || shape[0] < 2 || shape[0] > kMaxWarmQRanks ||
          shape[1] < 1 || shape[1] > p.shape[1] || shape[2] < 1 || shape[2] > kMaxWarmQRank) {
        return absl::DataLossError(absl::StrCat(
            path, ": tensor ", kWarmQRanks, p.name, " is ", ShapeToString(shape), "; expected [2..",
            kMaxWarmQRanks, " ranks, rows <= ", p.shape.back(), ", rank <= ", kMaxWarmQRank, "]"));
      }
      state.warm_q_ranks.push_back({p.name, *q});
    }
  }
  // The pipeline links' warm starts, in the owned units of a job that
  // compressed its links with PowerSGD.
  if (with_moments && steps > 0) {
    for (const NamedTensor& t : contents.tensors) {
      if (!absl::StartsWith(t.name, kLinkWarmQ)) continue;
      ASSIGN_OR_RETURN(LinkWarmStart link,
                       ParseLinkWarmStart(absl::string_view(t.name).substr(strlen(kLinkWarmQ)),
                                          t.tensor, identity.model, path));
      state.link_warm_q.push_back(std::move(link));
    }
    if (const std::string tuned = Get(meta, kTunedPartitions); !tuned.empty()) {
      absl::StatusOr<TunedPartitions> parsed_tuning = ParseTunedPartitions(tuned, identity.model);
      if (!parsed_tuning.ok()) {
        return absl::DataLossError(absl::StrCat(path, ": ", parsed_tuning.status().message()));
      }
      state.tuned_partitions = *std::move(parsed_tuning);
    }
  }
  return state;
}

}  // namespace pipetrain
