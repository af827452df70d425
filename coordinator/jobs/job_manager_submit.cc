// JobManager: admitting a job (Submit): its paths within the operator's
// roots and not another job's, the source of its initial weights, and the
// bounds a spec must meet before anything is kept. Contracts: job_manager.h.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/confined_path.h"
#include "common/echo_input.h"
#include "common/enum_names.h"
#include "common/logging.h"
#include "common/proto_time.h"
#include "common/rpc_status.h"
#include "common/secrets.h"
#include "common/status_macros.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/planner/planner.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "spec/job_spec.h"
#include "worker/checkpoint/checkpoint_manifest.h"
#include "worker/model/gpt_config.h"

namespace pipetrain {

namespace {

// Where the checkpoint directories of jobs that name none go:
// kDefaultCheckpointRoot/<job id>.
constexpr char kDefaultCheckpointRoot[] = "checkpoints";

// Whether `path` is `dir` or lies under it. Both are canonical relative
// names (CheckPaths' CheckConfinedName: no empty, "." or ".." component,
// no trailing '/'): one file, one spelling, so a prefix test is exact.
bool PathWithin(const std::string& path, const std::string& dir) {
  return path == dir || absl::StartsWith(path, absl::StrCat(dir, "/"));
}

// INVALID_ARGUMENT unless `id` is a valid SubmitJobRequest.request_id.
absl::Status CheckRequestId(const std::string& id) {
  if (id.size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id: ", id.size(), " bytes; at most ", kMaxRequestIdBytes));
  }
  for (const char c : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != ':' &&
        c != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat("request_id: character ", absl::CEscape(std::string(1, c)),
                       " is not allowed; use A-Z a-z 0-9 . _ : - (a UUID, for example)"));
    }
  }
  return absl::OkStatus();
}

// SHA-256 (hex) of `spec` as submitted, deterministically serialised: the
// same spec, sent again, has the same hash.
std::string RequestSpecSha256(const v1::JobSpec& spec) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    spec.SerializeToCodedStream(&coded);
  }
  return Sha256Hex(bytes);
}

// An ended job whose checkpoint directory is still reserved for its sweeps.
constexpr char kLeftoversBeingRemoved[] =
    ": its leftover files are being removed once its workers have stopped, within a minute; "
    "retry then";

}  // namespace

absl::Status JobManager::CheckOutputDirGiven(const ResolvedJobSpec& resolved) const {
  if (!options_.output_dir.empty()) return absl::OkStatus();
  if (!resolved.spec.output().weights_path().empty()) {
    return absl::InvalidArgumentError(
        "spec.output.weights_path: this coordinator writes no files (it was started without "
        "--output-dir); leave the field empty or ask the operator");
  }
  if (resolved.spec.checkpoint().interval_steps() > 0) {
    return absl::InvalidArgumentError(
        "spec.checkpoint: this coordinator keeps no checkpoints (it was started without "
        "--output-dir); leave spec.checkpoint out (interval_steps 0, no dir) or ask the "
        "operator");
  }
  return absl::OkStatus();
}

namespace {

// A filesystem error met checking a spec's paths, in the codes a submit
// answers: EACCES, EPERM or EROFS is the coordinator's own access
// (FAILED_PRECONDITION, not PERMISSION_DENIED, which tells a client its
// credential is at fault); EMFILE, ENOMEM, ENOSPC (RESOURCE_EXHAUSTED: not
// a quota of the client's), EINTR, EAGAIN (UNAVAILABLE), ESTALE (ABORTED)
// or EIO (UNKNOWN) a passing fault on its side: UNAVAILABLE, which the CLI
// retries. Submit checks its paths before it keeps anything, so the
// UNAVAILABLE says nothing was submitted: without it the CLI told its user
// the job might have been created.
absl::Status AsSubmitPathError(absl::Status status) {
  switch (status.code()) {
    case absl::StatusCode::kPermissionDenied:
      return absl::FailedPreconditionError(
          absl::StrCat(status.message(), " (the coordinator may not enter it: ask the operator)"));
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kUnknown:
      return absl::UnavailableError(absl::StrCat(status.message(), "; ", kNothingSubmitted));
    default:
      return status;
  }
}

constexpr char kInitFromField[] = "spec.init.from: ";

// An error met reading what spec.init.from names, as a submit answers it,
// naming the field: the path's own fault (NOT_FOUND, DATA_LOSS,
// INVALID_ARGUMENT, FAILED_PRECONDITION: missing, damaged, not a
// checkpoint, the steps of two jobs) is INVALID_ARGUMENT, the client's to
// fix; the coordinator's (EACCES, EMFILE, ENOMEM, EIO, ESTALE) as
// AsSubmitPathError maps it. All were INVALID_ARGUMENT: out of
// descriptors, a user was sent to fix a path that was fine, and the CLI
// did not retry.
absl::Status AsInitFromError(const absl::Status& status) {
  const std::string message = absl::StartsWith(status.message(), kInitFromField)
                                  ? std::string(status.message())
                                  : absl::StrCat(kInitFromField, status.message());
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
      return absl::InvalidArgumentError(message);
    default:
      return AsSubmitPathError(absl::Status(status.code(), message));
  }
}

// CheckNoLaterCheckpoints could not list spec.checkpoint.dir (`dir`): it
// fails closed, as what it cannot see may be a complete checkpoint the job
// would overwrite and delete. OpenConfinedParent's refusals (a link or a
// file on the way, the output directory gone) as CheckPaths answers them,
// EACCES FAILED_PRECONDITION (the operator's to fix), anything else
// (EMFILE, EIO) UNAVAILABLE: a retry may see the directory.
absl::Status CheckpointDirUnlisted(const std::string& dir, const absl::Status& status) {
  if (absl::IsInvalidArgument(status) || absl::IsFailedPrecondition(status)) return status;
  const std::string why =
      absl::StrCat("spec.checkpoint.dir: cannot tell whether \"", dir,
                   "\" holds a complete checkpoint this job would overwrite: ", status.message());
  if (absl::IsPermissionDenied(status)) return AsSubmitPathError(absl::PermissionDeniedError(why));
  return absl::UnavailableError(absl::StrCat(why, "; ", kNothingSubmitted));
}

// spec.checkpoint.dir given while interval_steps is 0: no checkpoint
// would be taken, and a user who named where to keep them would learn it
// only when a lost worker fails the job. (Not keep: a job's spec as Get
// shows it has keep filled in, and may be submitted again as it is.) At
// submit only: a job stored before this check existed runs on as it was.
absl::Status CheckCheckpointDirHasAnInterval(const v1::CheckpointSpec& checkpoint) {
  if (checkpoint.interval_steps() > 0 || checkpoint.dir().empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "spec.checkpoint.dir: given, but spec.checkpoint.interval_steps is 0, so no checkpoint "
      "would be taken; set interval_steps (1 to ",
      kMaxCheckpointInterval, ") or leave dir out"));
}

// A job grows onto joining workers only at a checkpoint boundary (and
// recovers only from a checkpoint): without checkpoints,
// spec.elastic.max_workers above the stages was silently ignored, while
// the planning budget still counted every stage it allowed. At submit
// only, as the checks above.
absl::Status CheckGrowthHasCheckpoints(const v1::JobSpec& spec) {
  if (spec.checkpoint().interval_steps() > 0 ||
      spec.elastic().max_workers() <= spec.parallelism().stages()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "spec.elastic.max_workers: ", spec.elastic().max_workers(),
      " is above spec.parallelism.stages ", spec.parallelism().stages(),
      ", but the job takes no checkpoints (spec.checkpoint.interval_steps 0), and a job grows "
      "onto joining workers only at a checkpoint; set spec.checkpoint.interval_steps and dir, "
      "or leave max_workers out"));
}

// The bytes of a job's final weights file: every parameter tensor once
// (wte, tied to the head, once), as fp32; the header's few KiB left out.
double FinalWeightsBytes(const GptConfig& model) {
  std::set<std::string> seen;
  double bytes = 0;
  for (int u = 0; u < NumUnits(model); ++u) {
    for (const ParameterShape& p : UnitParameterShapes(model, u)) {
      if (!seen.insert(p.name).second) continue;
      double numel = 1;
      for (int64_t d : p.shape) numel *= static_cast<double>(d);
      bytes += 4 * numel;
    }
  }
  return bytes;
}

// The deepest directory on the way to `relative` (its components but the
// last) that exists under `root`, opened following no link, and its name
// under `root` ("" for `root` itself); a closed descriptor when `root`
// cannot be opened. Where the write of `relative` makes the missing ones.
struct ExistingDir {
  ScopedFd fd;
  std::string name;
};
ExistingDir DeepestExistingDir(const std::string& root, const std::string& relative) {
  ExistingDir deepest{ScopedFd(open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)), ""};
  std::vector<std::string> parts = absl::StrSplit(relative, '/');
  parts.pop_back();
  for (const std::string& part : parts) {
    if (deepest.fd.get() < 0) break;
    ScopedFd next(
        openat(deepest.fd.get(), part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (next.get() < 0) break;  // ENOENT: the write makes it (others: as the walk found)
    deepest.fd = std::move(next);
    deepest.name = deepest.name.empty() ? part : absl::StrCat(deepest.name, "/", part);
  }
  return deepest;
}

// PERMISSION_DENIED "spec.output.weights_path: <what> is not writable by
// the coordinator: <strerror>" when the coordinator may not create a file
// in `dir`: EACCES (its mode), EROFS (a read-only mount) or EPERM (an
// immutable directory). OK when it may, and when that cannot be told (the
// write then says): ENOSYS (faccessat with AT_EACCESS unavailable), EPERM
// for F_OK as well (a seccomp filter refusing the call, not the
// directory: every weights path would be refused), EIO.
absl::Status CheckDirWritable(int dir, const std::string& what) {
  if (faccessat(dir, ".", W_OK | X_OK, AT_EACCESS) == 0) return absl::OkStatus();
  const int error = errno;
  if (error != EACCES && error != EROFS && error != EPERM) return absl::OkStatus();
  if (error == EPERM && faccessat(dir, ".", F_OK, AT_EACCESS) != 0 && errno == EPERM) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat("spec.output.weights_path: ", what,
                   " is not writable by the coordinator: ", std::strerror(error)));
}

}  // namespace

absl::Status JobManager::CheckWeightsNameReplaceable(const ConfinedParent& parent,
                                                     const std::string& weights) const {
  if (parent.dir.get() < 0) {
    // A directory on the way is still to be made: the write makes it in
    // the deepest one there, which was accepted unchecked, and a job
    // failed after every step when that one was read-only.
    const ExistingDir deepest = DeepestExistingDir(options_.output_dir, weights);
    if (deepest.fd.get() < 0) return absl::OkStatus();  // cannot tell: the write says
    return CheckDirWritable(
        deepest.fd.get(),
        absl::StrCat(deepest.name.empty() ? kOutputDirFlag : absl::StrCat("\"", deepest.name, "\""),
                     ", where the directories of \"", weights, "\" would be made,"));
  }
  struct stat st;
  if (fstatat(parent.dir.get(), parent.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
      !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.output.weights_path: \"", weights,
        "\" exists and is not a regular file (a FIFO, socket or device); the weights replace "
        "only a regular file: remove it or name another path"));
  }
  return CheckDirWritable(parent.dir.get(), absl::StrCat("the directory of \"", weights, "\""));
}

absl::Status JobManager::CheckRoomForFinalWeights(const ConfinedParent& parent,
                                                  const GptConfig& model) const {
  // The directory the file goes into, or, where a directory on its way is
  // not there yet (the write creates it), the output directory itself.
  ScopedFd root;
  int dir = parent.dir.get();
  if (dir < 0) {
    root = ScopedFd(open(options_.output_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    dir = root.get();
  }
  std::optional<double> free_bytes;
  if (options_.free_bytes_for_testing) {
    free_bytes = options_.free_bytes_for_testing(dir);
  } else if (struct statvfs fs; dir >= 0 && fstatvfs(dir, &fs) == 0) {
    free_bytes = static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize);
  }
  const double need = FinalWeightsBytes(model);
  if (!free_bytes.has_value() || need <= *free_bytes)
    return absl::OkStatus();  // unknown: the write says
  return absl::FailedPreconditionError(absl::StrCat(
      "spec.output.weights_path: the final weights take ", static_cast<int64_t>(need),
      " bytes, but the file system of ", kOutputDirFlag, " has ", static_cast<int64_t>(*free_bytes),
      " free: the job would train to its end and fail writing them; free space there (ask the "
      "operator) or leave weights_path out"));
}

absl::Status JobManager::CheckPaths(const ResolvedJobSpec& resolved) const {
  RETURN_IF_ERROR(CheckOutputDirGiven(resolved));
  return AsSubmitPathError(CheckPathsConfined(resolved));
}

absl::Status JobManager::CheckPathsConfined(const ResolvedJobSpec& resolved) const {
  const std::string& weights = resolved.spec.output().weights_path();
  if (!weights.empty()) {
    ASSIGN_OR_RETURN(
        const ConfinedParent parent,
        OpenConfinedParent(options_.output_dir, kOutputDirFlag, "spec.output.weights_path", weights,
                           /*create_dirs=*/false));
    RETURN_IF_ERROR(CheckWeightsNameReplaceable(parent, weights));
    RETURN_IF_ERROR(CheckRoomForFinalWeights(parent, resolved.train.model));
  }
  const v1::CheckpointSpec& checkpoint = resolved.spec.checkpoint();
  if (checkpoint.interval_steps() > 0 && !checkpoint.dir().empty()) {
    RETURN_IF_ERROR(OpenConfinedParent(options_.output_dir, kOutputDirFlag, "spec.checkpoint.dir",
                                       absl::StrCat(checkpoint.dir(), "/manifest.json"),
                                       /*create_dirs=*/false)
                        .status());
  }
  const std::string& data = resolved.spec.data().path();
  if (!data.empty() && !options_.data_roots.empty()) {
    RETURN_IF_ERROR(ResolveUnderRoots("spec.data.path", data, options_.data_roots).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<JobManager::InitSource> JobManager::ResolveInit(
    const ResolvedJobSpec& resolved) const {
  InitSource init;
  const std::string& from = resolved.spec.init().from();
  if (from.empty()) return init;
  if (options_.output_dir.empty()) {
    return absl::InvalidArgumentError(
        "spec.init.from: this coordinator has no --output-dir to find it under");
  }
  // Resolved (links followed), it must still lie under the output directory.
  std::unique_ptr<char, void (*)(void*)> root(realpath(options_.output_dir.c_str(), nullptr),
                                              std::free);
  if (root == nullptr) {
    const int error = errno;
    return AsInitFromError(
        absl::ErrnoToStatus(error, absl::StrCat("cannot resolve ", kOutputDirFlag)));
  }
  std::unique_ptr<char, void (*)(void*)> real(
      realpath(absl::StrCat(options_.output_dir, "/", from).c_str(), nullptr), std::free);
  // Missing, a file on the way, a link loop, too long: the path's fault.
  // EACCES on a directory on the way, ENOMEM: the coordinator's.
  if (const int error = errno; real == nullptr && error != ENOENT && error != ENOTDIR &&
                               error != ELOOP && error != ENAMETOOLONG) {
    return AsInitFromError(absl::ErrnoToStatus(error, absl::StrCat("cannot resolve ", from)));
  }
  if (real == nullptr ||
      !absl::StartsWith(std::string(real.get()), std::string(root.get()) + "/")) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.init.from: ", from,
                     " is not a checkpoint directory or weights file under the "
                     "coordinator's --output-dir"));
  }
  const std::string path = real.get();
  // Saved with the job (init_weights, init_checkpoint.dir: the part under
  // the output directory) and sent in assignments as proto3 strings, which
  // must be UTF-8: a stored job that is not would not parse back, and no
  // coordinator would start. `from` is UTF-8 (a proto string), but a link
  // under it may lead to any bytes.
  if (const std::string under = path.substr(std::strlen(root.get()) + 1);
      ValidUtf8(under) != under) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.init.from: ", from, " resolves to ", ValidUtf8(under),
                     ", a path that is not UTF-8; a job's paths are saved and sent as UTF-8: "
                     "rename it, or name it through no link"));
  }
  const GptConfig& model = resolved.train.model;
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    if (!absl::EndsWith(path, ".safetensors")) {
      return absl::InvalidArgumentError(
          "spec.init.from: names a file that is not .safetensors (Hugging Face GPT-2 weights) "
          "nor a checkpoint directory");
    }
    // Every tensor the model needs, with its shape: checked now, so a job
    // never starts on weights that do not fit. From the header alone: the
    // file may be gigabytes, and Submit is a user's request.
    // Opened following no link: a directory on the way swapped for a link
    // out of the output directory since realpath is refused, not read.
    absl::StatusOr<ScopedFd> file = OpenRealPathNoLinks("spec.init.from", path);
    if (!file.ok()) return AsInitFromError(file.status());
    absl::StatusOr<std::vector<SafetensorsShape>> contents =
        ReadSafetensorsShapesFrom(*std::move(file), path);
    if (!contents.ok()) return AsInitFromError(contents.status());
    auto find = [&contents](const std::string& name) -> const Shape* {
      for (const SafetensorsShape& s : *contents) {
        if (s.name == name) return &s.shape;
      }
      return nullptr;
    };
    for (int u = 0; u < NumUnits(model); ++u) {
      for (const ParameterShape& p : UnitParameterShapes(model, u)) {
        const Shape* t = find(p.name);
        const Shape* prefixed = find("transformer." + p.name);
        // The workers refuse a file holding both (FindParameterTensor):
        // refused here, before the job starts.
        if (t != nullptr && prefixed != nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat("spec.init.from: ", from, " holds both '", p.name, "' and 'transformer.",
                           p.name, "': which one to load is ambiguous; keep one"));
        }
        if (t == nullptr) t = prefixed;
        // A padded vocabulary takes the file's rows (gpt_config.h).
        const Shape shape(p.shape.begin(), p.shape.end());
        const std::string wanted = ShapeToString(shape);
        if (t == nullptr) {
          return absl::InvalidArgumentError(absl::StrCat("spec.init.from: ", from,
                                                         " has no tensor ", p.name,
                                                         " (this model's is ", wanted, ")"));
        }
        if (!CheckFitsParameter(p.name, shape, *t).ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat("spec.init.from: ", from, " has ", p.name, " of shape ",
                           ShapeToString(*t), ", which does not fit this model's ", wanted));
        }
      }
    }
    // Resolved and relative to the output directory (the workers' root), as
    // a checkpoint's directory is: one file, one name, which other jobs'
    // paths are compared with.
    init.weights = path.substr(std::strlen(root.get()) + 1);
    return init;
  }
  absl::StatusOr<CheckpointLocation> at = LocateCheckpoint(path);
  if (!at.ok()) return AsInitFromError(at.status());
  absl::StatusOr<CheckpointManifest> manifest =
      ReadCheckpointManifest(absl::StrCat(at->path(), "/", kCheckpointManifestName));
  if (!manifest.ok()) return AsInitFromError(manifest.status());
  const GptConfig& m = manifest->model;
  if (m.vocab_size != model.vocab_size || m.max_seq_len != model.max_seq_len ||
      m.n_layer != model.n_layer || m.n_head != model.n_head || m.d_model != model.d_model ||
      manifest->seed != resolved.train.seed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.init.from: ", from, " is a checkpoint of another model or seed (vocab ", m.vocab_size,
        ", max_seq_len ", m.max_seq_len, ", ", m.n_layer, " layers, ", m.n_head, " heads, d_model ",
        m.d_model, ", seed ", manifest->seed, "); this job's must equal it"));
  }
  if (manifest->step >= resolved.train.steps) {
    return absl::InvalidArgumentError(absl::StrCat("spec.init.from: the checkpoint has taken ",
                                                   manifest->step, " steps; spec.training.steps (",
                                                   resolved.train.steps, ") must be larger"));
  }
  // Its directory relative to the output directory (the workers' root).
  const std::string step_dir = at->path();
  if (!absl::StartsWith(step_dir, std::string(root.get()) + "/")) {
    return absl::InvalidArgumentError("spec.init.from: not under the coordinator's --output-dir");
  }
  // Each unit file there, of the size the manifest records: a stat each,
  // so a truncated or missing file is refused now rather than when the job
  // starts (its contents' SHA-256 is checked by the worker that loads it).
  for (const v1::UnitFile& f : manifest->units) {
    const std::string unit_path = absl::StrCat(step_dir, "/", f.file());
    struct stat unit;
    const bool found = lstat(unit_path.c_str(), &unit) == 0;
    // EIO, ESTALE, ENOMEM: whether it is there cannot be told, which is
    // not the checkpoint's fault (it was "damaged", and not retried).
    if (const int error = errno; !found && error != ENOENT && error != ENOTDIR) {
      return AsInitFromError(
          absl::ErrnoToStatus(error, absl::StrCat(from, ": cannot stat ", f.file())));
    }
    if (!found || !S_ISREG(unit.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec.init.from: ", from, ": its manifest lists ", f.file(),
          ", which is missing or not a regular file; the checkpoint is damaged (give an "
          "earlier step-* directory)"));
    }
    if (unit.st_size != f.bytes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.init.from: ", from, ": ", f.file(), " is ", unit.st_size,
                       " bytes, its manifest records ", f.bytes(),
                       "; the checkpoint is damaged (give an earlier step-* directory)"));
    }
  }
  v1::ResumeFrom checkpoint;
  checkpoint.set_step(manifest->step);
  checkpoint.set_dir(step_dir.substr(std::strlen(root.get()) + 1));
  // The workers open each unit file by this resolved name under their
  // root, which must pass the checks every name a job gives does (no
  // control character, at most kMaxSpecPathBytes): a link may lead to one
  // that does not, and the job would fail at its first load instead.
  for (const v1::UnitFile& f : manifest->units) {
    if (absl::Status name =
            CheckConfinedName("the resolved path", absl::StrCat(checkpoint.dir(), "/", f.file()));
        !name.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.init.from: ", from,
                       " resolves to a directory whose files the workers cannot open (",
                       name.message(), "); rename it, or name it through no link"));
    }
  }
  for (const v1::UnitFile& f : manifest->units) *checkpoint.add_units() = f;
  init.checkpoint = std::move(checkpoint);
  return init;
}

absl::Status JobManager::CheckNoLaterCheckpoints(const ResolvedJobSpec& resolved,
                                                 const InitSource& init) const {
  const v1::CheckpointSpec& checkpoint = resolved.spec.checkpoint();
  // An empty dir becomes checkpoints/<this job's id>, a name no job had.
  if (checkpoint.interval_steps() == 0 || checkpoint.dir().empty() || options_.output_dir.empty()) {
    return absl::OkStatus();
  }
  const int64_t start = init.checkpoint.has_value() ? init.checkpoint->step() : 0;
  const absl::StatusOr<std::vector<v1::ResumeFrom>> complete =
      StepDirsWithManifest(options_.output_dir, checkpoint.dir());
  if (!complete.ok()) return CheckpointDirUnlisted(checkpoint.dir(), complete.status());
  for (const v1::ResumeFrom& held : *complete) {
    if (held.step() <= start) continue;  // this job writes only later steps
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.checkpoint.dir: \"", checkpoint.dir(), "\" holds the complete checkpoint \"",
        held.dir(), "\" of step ", held.step(), ", which this job, starting at step ", start,
        ", would overwrite file by file and then delete; start from it (spec.init.from), or give "
        "this job a directory of its own"));
  }
  return absl::OkStatus();
}

const JobManager::JobRecord* JobManager::CheckpointDirUserLocked(const std::string& dir) const {
  for (const auto* jobs : {&jobs_, &submitting_}) {
    for (const auto& [id, record] : *jobs) {
      if (record->checkpoints == nullptr) continue;
      if (EndedForOthersLocked(record->job) && record->checkpoint_sweeps_pending == 0) continue;
      const std::string& theirs = record->job.spec().checkpoint().dir();
      if (PathWithin(dir, theirs) || PathWithin(theirs, dir)) return record.get();
    }
  }
  return nullptr;
}

const JobManager::JobRecord* JobManager::OtherCheckpointDirUserLocked(
    const JobRecord& record) const {
  const std::string& mine = record.job.spec().checkpoint().dir();
  const absl::Time created = FromProtoTimestamp(record.job.create_time());
  for (const auto* jobs : {&jobs_, &submitting_}) {
    for (const auto& [id, other] : *jobs) {
      if (other.get() == &record || other->checkpoints == nullptr) continue;
      // Ended and created before: it wrote there only before `record` was
      // accepted (Submit refuses a directory whose job has not ended, or
      // is being swept), so the directory is `record`'s, not its.
      if (EndedForOthersLocked(other->job) &&
          FromProtoTimestamp(other->job.create_time()) < created) {
        continue;
      }
      const std::string& theirs = other->job.spec().checkpoint().dir();
      if (PathWithin(mine, theirs) || PathWithin(theirs, mine)) return other.get();
    }
  }
  return nullptr;
}

std::set<std::string> JobManager::CompleteCheckpointsOverlappingLocked(
    const std::string& dir) const {
  std::set<std::string> complete;
  for (const auto& [id, record] : jobs_) {
    if (record->checkpoints == nullptr) continue;
    const std::string& theirs = record->job.spec().checkpoint().dir();
    if (!PathWithin(dir, theirs) && !PathWithin(theirs, dir)) continue;
    for (const v1::ResumeFrom& c : record->checkpoints->Complete()) complete.insert(c.dir());
  }
  return complete;
}

const JobManager::JobRecord* JobManager::CheckpointDirHoldingLocked(const std::string& path) const {
  for (const auto* jobs : {&jobs_, &submitting_}) {
    for (const auto& [id, record] : *jobs) {
      if (record->checkpoints == nullptr) continue;
      if (EndedForOthersLocked(record->job) && record->checkpoint_sweeps_pending == 0) continue;
      if (PathWithin(path, record->job.spec().checkpoint().dir())) return record.get();
    }
  }
  return nullptr;
}

const JobManager::JobRecord* JobManager::InitSourceInLocked(const std::string& dir) const {
  for (const auto* jobs : {&jobs_, &submitting_}) {
    for (const auto& [id, record] : *jobs) {
      if (EndedForOthersLocked(record->job) || record->init_source.empty()) continue;
      if (PathWithin(record->init_source, dir)) return record.get();
    }
  }
  return nullptr;
}

const JobManager::JobRecord* JobManager::InitSourceHoldingLocked(const std::string& path) const {
  for (const auto* jobs : {&jobs_, &submitting_}) {
    for (const auto& [id, record] : *jobs) {
      if (EndedForOthersLocked(record->job) || record->init_source.empty()) continue;
      if (PathWithin(path, record->init_source)) return record.get();
    }
  }
  return nullptr;
}

const JobManager::JobRecord* JobManager::WeightsPathInLocked(const std::string& dir) const {
  for (const auto* jobs : {&jobs_, &submitting_}) {
    for (const auto& [id, record] : *jobs) {
      if (EndedForOthersLocked(record->job)) continue;
      const std::string& weights = record->job.spec().output().weights_path();
      if (!weights.empty() && PathWithin(weights, dir)) return record.get();
    }
  }
  return nullptr;
}

const JobManager::JobRecord* JobManager::WeightsPathUserLocked(const std::string& path) const {
  // Canonical relative names too (CheckPaths).
  for (const auto* jobs : {&jobs_, &submitting_}) {
    for (const auto& [id, record] : *jobs) {
      if (EndedForOthersLocked(record->job)) continue;
      const std::string& theirs = record->job.spec().output().weights_path();
      if (!theirs.empty() && (PathWithin(path, theirs) || PathWithin(theirs, path))) {
        return record.get();
      }
    }
  }
  return nullptr;
}

namespace {

// How `path` stands to `other`, which it equals or nests with, for a
// refusal: "is", "lies under" or "holds".
const char* NestingOf(const std::string& path, const std::string& other) {
  if (path == other) return "is";
  return PathWithin(path, other) ? "lies under" : "holds";
}

}  // namespace

std::string JobManager::HolderStateLocked(const JobRecord& record) const {
  if (record.unsettled) {
    return "its submit failed unconfirmed; the coordinator is deleting it from the state store";
  }
  // As Get shows it (ShowUnsavedEndLocked).
  if (EndShownRunningLocked(record.job)) {
    return absl::StrCat(EnumShortName(ShownStateLocked(record.job)),
                        record.job.state() == v1::JOB_STATE_SUCCEEDED
                            ? ", finishing: its end waits to be saved to the state store"
                            : ", ending: its failure waits to be saved to the state store");
  }
  if (CancelUnsavedLocked(record.job)) {
    return "CANCELLED, but that waits to be saved to the state store: a coordinator that stops "
           "before restores it and runs it again";
  }
  return std::string(EnumShortName(record.job.state()));
}

std::string JobManager::HolderStateAndAdviceLocked(const JobRecord& record,
                                                   absl::string_view live_advice) const {
  if (EndedForOthersLocked(record.job)) {
    return absl::StrCat(" (", HolderStateLocked(record), kLeftoversBeingRemoved, ")");
  }
  // FilesInUseErrorLocked says to retry.
  if (CancelUnsavedLocked(record.job)) return absl::StrCat(" (", HolderStateLocked(record), ")");
  return absl::StrCat(" (", HolderStateLocked(record), ")", live_advice);
}

absl::Status JobManager::FilesInUseErrorLocked(const JobRecord& holder,
                                               const std::string& message) const {
  if (holder.unsettled) {
    return absl::UnavailableError(absl::StrCat(message,
                                               "; or retry once the coordinator has deleted job ",
                                               holder.job.id(), " (", kNothingSubmitted, ")"));
  }
  if (EndedForOthersLocked(holder.job)) {
    return absl::UnavailableError(absl::StrCat(message, "; ", kNothingSubmitted));
  }
  if (CancelUnsavedLocked(holder.job)) {
    return absl::UnavailableError(absl::StrCat(message, "; or retry once the cancel of job ",
                                               holder.job.id(),
                                               " is saved (the coordinator "
                                               "saves it again every second; ",
                                               kNothingSubmitted, ")"));
  }
  return absl::InvalidArgumentError(message);
}

absl::StatusOr<const JobManager::JobRecord*> JobManager::EarlierSubmitLocked(
    const std::string& request_id, const std::string& spec_sha256) const {
  if (request_id.empty()) return nullptr;
  for (const auto& [id, record] : submitting_) {
    if (record->job.request_id() != request_id) continue;
    if (record->unsettled) {
      // A new job now could meet the first again after a restart: two
      // jobs of one request.
      return absl::UnavailableError(absl::StrCat(
          "request_id \"", request_id, "\": whether the state store holds job ", id,
          " of that request is not known yet (the coordinator is making sure it drops it); "
          "retry"));
    }
    return absl::UnavailableError(absl::StrCat("request_id \"", request_id, "\": job ", id,
                                               " of that request is being saved; retry"));
  }
  for (const std::string& id : order_) {
    const JobRecord& record = *jobs_.at(id);
    if (record.job.request_id() != request_id) continue;
    if (record.request_spec_sha256 != spec_sha256) {
      return absl::AlreadyExistsError(absl::StrCat(
          "request_id \"", request_id, "\" was submitted as job ", id,
          " with another spec; a retry must send the same spec, a new job a new request_id"));
    }
    return &record;
  }
  return nullptr;
}

absl::StatusOr<v1::Job> JobManager::Submit(const v1::JobSpec& spec, const std::string& request_id) {
  RETURN_IF_ERROR(CheckRequestId(request_id));
  const std::string request_sha256 = request_id.empty() ? "" : RequestSpecSha256(spec);
  // A retry is answered before the spec is checked again: its answer must
  // not depend on what changed since (the planning budget, or the output
  // dir of a restarted coordinator). Checked again below, under the lock
  // that adds the job, for a repeat arriving meanwhile.
  if (!request_id.empty()) {
    AnnotatedMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(const JobRecord* earlier, EarlierSubmitLocked(request_id, request_sha256));
    if (earlier != nullptr) {
      v1::Job shown = earlier->job;  // a repeat sees what Get shows
      ShowUnsavedEndLocked(shown);
      return shown;
    }
  }
  ASSIGN_OR_RETURN(ResolvedJobSpec resolved, ResolveJobSpec(spec));
  RETURN_IF_ERROR(CheckUnitFileSizes(resolved));  // at submit only, as the next
  RETURN_IF_ERROR(CheckCheckpointDirHasAnInterval(resolved.spec.checkpoint()));
  RETURN_IF_ERROR(CheckGrowthHasCheckpoints(resolved.spec));
  RETURN_IF_ERROR(CheckMinLrHasACosine(resolved.spec));
  RETURN_IF_ERROR(CheckLinkCodecsSmaller(resolved));
  RETURN_IF_ERROR(CheckPlanningBudget(resolved));
  RETURN_IF_ERROR(CheckPaths(resolved));
  ASSIGN_OR_RETURN(InitSource init, ResolveInit(resolved));
  RETURN_IF_ERROR(CheckNoLaterCheckpoints(resolved, init));
  std::string job_id;
  std::optional<store::StoredJob> stored;
  {
    AnnotatedMutexLock lock(&mu_);
    // Again: the same request may have come in meanwhile.
    ASSIGN_OR_RETURN(const JobRecord* earlier, EarlierSubmitLocked(request_id, request_sha256));
    if (earlier != nullptr) {
      v1::Job shown = earlier->job;  // a repeat sees what Get shows
      ShowUnsavedEndLocked(shown);
      return shown;
    }
    int pending = static_cast<int>(submitting_.size());
    for (const auto& [id, other] : jobs_) pending += EndedForOthersLocked(other->job) ? 0 : 1;
    if (pending >= options_.max_pending_jobs) {
      return absl::ResourceExhaustedError(
          absl::StrCat(pending,
                       " jobs are already queued or running (the coordinator's limit); wait for "
                       "some to end or cancel them"));
    }
    auto record = std::make_unique<JobRecord>();
    // An id no job has: a restored job may hold the next one (a restart
    // without an epoch, or one whose clock-made epoch repeats an earlier
    // start's), and a second record under its id would replace it. Taken
    // (next_id_ moved past it) only once the job is accepted below: a
    // refused request changes nothing.
    int64_t n = next_id_;
    do {
      record->job.set_id(options_.id_epoch.empty()
                             ? absl::StrCat("job-", n++)
                             : absl::StrCat("job-", options_.id_epoch, "-", n++));
    } while (jobs_.count(record->job.id()) > 0 || submitting_.count(record->job.id()) > 0);
    // Both would write the file, and the last to finish would replace the
    // other's weights while both reported the path as theirs.
    // Nor may the paths nest: the first to write would make a directory of
    // the other's file name (or a file of its directory), and the other job
    // would fail at its end, its whole run's weights unwritten.
    const std::string& weights = resolved.spec.output().weights_path();
    if (!weights.empty() && PathWithin(weights, kDefaultCheckpointRoot)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec.output.weights_path: \"", weights, "\" ",
          weights == kDefaultCheckpointRoot ? "is" : "lies in", " \"", kDefaultCheckpointRoot,
          "\", which holds the checkpoint directories of jobs that name none (",
          kDefaultCheckpointRoot, "/<job id>); write it elsewhere"));
    }
    if (const JobRecord* other = weights.empty() ? nullptr : WeightsPathUserLocked(weights)) {
      const std::string& theirs = other->job.spec().output().weights_path();
      return FilesInUseErrorLocked(
          *other, absl::StrCat("spec.output.weights_path: \"", weights, "\" ",
                               weights == theirs ? "is the output"
                                                 : absl::StrCat(NestingOf(weights, theirs), " \"",
                                                                theirs, "\", the output"),
                               " of job ", other->job.id(), " (", HolderStateLocked(*other),
                               CancelUnsavedLocked(other->job) ? "), which may yet run again"
                                                               : "), which has not ended",
                               "; give this job a file of its own"));
    }
    // A checkpoint directory's files are replaced by each checkpoint and
    // its step directories deleted as they expire: weights there are lost.
    // And a weights file where a checkpoint directory goes stops its writes.
    if (const JobRecord* other = weights.empty() ? nullptr : CheckpointDirUserLocked(weights)) {
      const std::string& theirs = other->job.spec().checkpoint().dir();
      const bool inside = PathWithin(weights, theirs);
      return FilesInUseErrorLocked(
          *other,
          absl::StrCat(
              "spec.output.weights_path: \"", weights, "\" ", inside ? "lies in" : "holds",
              " the checkpoint directory \"", theirs, "\" of job ", other->job.id(),
              HolderStateAndAdviceLocked(
                  *other, inside ? ", whose checkpoints would replace or delete it; write "
                                   "it elsewhere"
                                 : ", whose checkpoints it would stop; write it elsewhere")));
    }
    // Where it starts from, resolved (links followed): a live job expires
    // its older checkpoints, and this job resumes from that one until it has
    // a checkpoint of its own.
    const std::string init_source =
        init.checkpoint.has_value() ? init.checkpoint->dir() : init.weights;
    const JobRecord* init_holder =
        init_source.empty() ? nullptr : CheckpointDirHoldingLocked(init_source);
    // An ended job's sweeps remove only steps without a manifest: a complete
    // checkpoint of its directory may be started from at once (a weights
    // file there may lie in a step they remove).
    if (init_holder != nullptr && init.checkpoint.has_value() &&
        EndedForOthersLocked(init_holder->job)) {
      init_holder = nullptr;
    }
    if (init_holder != nullptr) {
      return FilesInUseErrorLocked(
          *init_holder,
          absl::StrCat(
              "spec.init.from: \"", resolved.spec.init().from(),
              "\" lies in the checkpoint directory \"", init_holder->job.spec().checkpoint().dir(),
              "\" of job ", init_holder->job.id(),
              HolderStateAndAdviceLocked(*init_holder,
                                         ", which deletes its older checkpoints as it goes; start "
                                         "from it once that job has ended, or from a copy "
                                         "outside that directory")));
    }
    // A live job reloads what it started from at each recovery before its
    // first checkpoint: this job's weights must not replace it (or a unit
    // file of the checkpoint it is), nor this job start from weights a live
    // job replaces at its end.
    if (const JobRecord* other = weights.empty() ? nullptr : InitSourceHoldingLocked(weights)) {
      return FilesInUseErrorLocked(
          *other,
          absl::StrCat(
              "spec.output.weights_path: \"", weights, "\" ",
              weights == other->init_source ? "is" : "lies in", " \"", other->init_source,
              "\", where job ", other->job.id(), " (", HolderStateLocked(*other),
              ") started from (spec.init.from) and restarts from until its first checkpoint; "
              "write it elsewhere"));
    }
    if (const JobRecord* other = init_source.empty() ? nullptr : WeightsPathInLocked(init_source)) {
      return FilesInUseErrorLocked(
          *other,
          absl::StrCat(
              "spec.init.from: \"", resolved.spec.init().from(), "\" ",
              other->job.spec().output().weights_path() == init_source ? "is" : "holds", " \"",
              other->job.spec().output().weights_path(), "\", the weights file of job ",
              other->job.id(), " (", HolderStateLocked(*other),
              "), which replaces it when it ends; start from it once that job has ended, or from a "
              "copy"));
    }
    v1::CheckpointSpec* checkpoint = resolved.spec.mutable_checkpoint();
    if (checkpoint->interval_steps() > 0) {
      // "checkpoints" holds the default directories (checkpoints/<job
      // id>): given as a job's own, it would overlap every later job that
      // names none, and refuse them for a field they never set.
      if (checkpoint->dir() == kDefaultCheckpointRoot) {
        return absl::InvalidArgumentError(
            absl::StrCat("spec.checkpoint.dir: \"", kDefaultCheckpointRoot,
                         "\" holds the directories of jobs "
                         "that name none (",
                         kDefaultCheckpointRoot, "/<job id>); name one of its own, e.g. ",
                         kDefaultCheckpointRoot, "/my-run"));
      }
      const bool dir_defaulted = checkpoint->dir().empty();
      if (dir_defaulted) {
        checkpoint->set_dir(absl::StrCat(kDefaultCheckpointRoot, "/", record->job.id()));
      }
      // Two live jobs writing step-N directories in one place would
      // overwrite each other's files, and each would expire (delete) the
      // other's: refused while the other has not ended.
      if (const JobRecord* other = CheckpointDirUserLocked(checkpoint->dir())) {
        const std::string& theirs = other->job.spec().checkpoint().dir();
        return FilesInUseErrorLocked(
            *other, absl::StrCat("spec.checkpoint.dir: \"", checkpoint->dir(), "\" ",
                                 dir_defaulted ? "(the default, as the spec names none) " : "",
                                 theirs == checkpoint->dir()
                                     ? "is in use by job"
                                     : absl::StrCat("overlaps \"", theirs, "\", that of job"),
                                 " ", other->job.id(),
                                 HolderStateAndAdviceLocked(
                                     *other, "; give this job a directory of its own")));
      }
      if (const JobRecord* other = InitSourceInLocked(checkpoint->dir())) {
        return FilesInUseErrorLocked(
            *other,
            absl::StrCat(
                "spec.checkpoint.dir: \"", checkpoint->dir(), "\" holds \"", other->init_source,
                "\", where job ", other->job.id(), " (", HolderStateLocked(*other),
                ") started from (spec.init.from), which this job's checkpoints could replace or "
                "delete; give this job a directory of its own"));
      }
      if (const JobRecord* other = WeightsPathUserLocked(checkpoint->dir())) {
        const std::string& theirs = other->job.spec().output().weights_path();
        return FilesInUseErrorLocked(
            *other,
            absl::StrCat("spec.checkpoint.dir: \"", checkpoint->dir(), "\" ",
                         NestingOf(checkpoint->dir(), theirs), " \"", theirs,
                         "\", the weights file of job ", other->job.id(), " (",
                         HolderStateLocked(*other), "); give this job a directory of its own"));
      }
      if (!weights.empty() && PathWithin(checkpoint->dir(), weights)) {
        return absl::InvalidArgumentError(
            absl::StrCat("spec.output.weights_path: \"", weights,
                         "\" holds this job's own checkpoint directory \"", checkpoint->dir(),
                         "\", which could then not be made; write it elsewhere"));
      }
      if (!weights.empty() && PathWithin(weights, checkpoint->dir())) {
        return absl::InvalidArgumentError(
            absl::StrCat("spec.output.weights_path: \"", weights,
                         "\" lies in this job's own checkpoint directory \"", checkpoint->dir(),
                         "\", whose checkpoints would replace or delete it; write it elsewhere"));
      }
      // Every kept checkpoint lists each unit's file in the job's stored
      // record, which must stay within the store's value limit.
      const int units = NumUnits(resolved.train.model);
      if (StoredCheckpointBytes(*checkpoint, units) > kMaxStoredCheckpointBytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "spec.checkpoint.keep: ", checkpoint->keep(), " checkpoints of this ", units,
            "-unit model take up to ", StoredCheckpointBytes(*checkpoint, units),
            " bytes of the coordinator's stored state for the job (each unit's file and "
            "checksum), over the ",
            kMaxStoredCheckpointBytes, " it allows; keep at most ",
            std::max(1, MaxStoredKeep(*checkpoint, units))));
      }
      record->checkpoints = std::make_unique<CheckpointCatalog>(*checkpoint, resolved.train.model,
                                                                resolved.train.steps);
    }
    *record->job.mutable_spec() = resolved.spec;
    record->job.set_request_id(request_id);
    record->request_spec_sha256 = request_sha256;
    record->init_weights = init.weights;
    record->init_source = init_source;
    if (init.checkpoint.has_value()) {
      record->init_checkpoint = init.checkpoint;
      record->init_step = init.checkpoint->step();
      record->job.mutable_progress()->set_step(record->init_step);
      record->job.mutable_progress()->set_loss_history_start(record->init_step);
    }
    record->job.set_state(v1::JOB_STATE_QUEUED);
    record->job.set_reason(absl::StrCat("waiting for ", JobWorkers(resolved), " READY workers"));
    record->auto_layout_workers = resolved.layout_workers;
    if (resolved.data_parallel == kDataParallelAuto) {
      record->auto_layout_compression = resolved.spec.compression().data_parallel();
      record->auto_layout_parallelism = resolved.spec.parallelism();
    }
    // Strictly increasing, whatever the clock does (a step back): list
    // pages resume after the last job's creation time (page_cursor.h), and
    // a later job dated before an earlier one could be skipped.
    absl::Time created = clock_->Now();
    if (created <= last_create_time_) created = last_create_time_ + absl::Nanoseconds(1);
    last_create_time_ = created;
    *record->job.mutable_create_time() = ToProtoTimestamp(created);
    record->queued_since = elapsed_clock_->Now();
    TouchLocked(*record);
    record->resolved = std::move(resolved);
    if (options_.state != nullptr) stored = StoredJobLocked(*record);
    job_id = record->job.id();
    next_id_ = n;
    // Held here while it is saved: it claims its weights path and
    // checkpoint directory and counts as pending, but nothing schedules,
    // lists or cancels it before the store has it.
    submitting_[job_id] = std::move(record);
  }
  // Saved off the lock: a commit waits for the disk (or etcd), and every
  // stage's report and every API call wait for the lock. No other save of
  // this job can come first: nothing else sees it yet.
  const absl::Status saved = stored.has_value() ? SaveStoredJob(*stored) : absl::OkStatus();
  // A failed commit may still have been applied (etcd: a deadline passed,
  // the leader changed): the job would come back after a restart or a
  // failover although the caller was told otherwise. It is deleted again;
  // only when that commits is "nothing was submitted" sure.
  const absl::Status forgotten = saved.ok() ? absl::OkStatus() : DeleteFromStore(job_id);
  {
    AnnotatedMutexLock lock(&mu_);
    if (saved.ok()) {
      // Listed after every older submit still being saved (REST saves in
      // parallel): listed first, this job would end a page whose token then
      // resumes past the older one, listed before it later. The wait is
      // bounded by the older save's own (the store's deadlines).
      const JobRecord& mine = *submitting_.at(job_id);
      auto listable = [this, &mine]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !OlderSubmitSavingLocked(mine);
      };
      if (!listable() && options_.before_submit_waits) options_.before_submit_waits(job_id);
      mu_.AwaitWithTimeout(listable, absl::InfiniteDuration());
    }
    auto it = submitting_.find(job_id);
    if (!saved.ok() && !forgotten.ok()) {
      // Kept, claiming what it claimed, until the store surely dropped it:
      // a job that comes back after a restart must not meet another one
      // given its paths or its request meanwhile.
      it->second->unsettled = true;
      // The first failed delete of a stretch SettleSubmitsLocked goes on
      // with (the caller is told; the log was not).
      if (NoteFailureLocked(delete_failures_[job_id])) {
        PT_LOG(WARNING) << "job " << job_id << ": its submit failed (" << saved
                        << "), and the state store may hold it after all: deleting it failed ("
                        << forgotten
                        << "); deleting it again every second (logged once a minute until a "
                           "delete succeeds)";
      }
      return absl::UnavailableError(absl::StrCat(
          "could not record the job durably (", saved.message(),
          ") nor make sure the state store dropped it (", forgotten.message(),
          "): it is not running, but may come back as ", job_id,
          " after a coordinator restart or failover; the coordinator keeps deleting it, and "
          "holds its paths",
          request_id.empty() ? "" : " and request_id",
          " until that succeeds; look for it before submitting again"));
    }
    std::unique_ptr<JobRecord> record = std::move(it->second);
    submitting_.erase(it);
    if (!saved.ok()) {
      return absl::UnavailableError(absl::StrCat("could not record the job durably; ",
                                                 kNothingSubmitted, ": ", saved.message()));
    }
    // By creation time, not by when the save returned: at the end, as no
    // older submit is still being saved (the wait above).
    const absl::Time created = FromProtoTimestamp(record->job.create_time());
    auto at = order_.end();
    while (at != order_.begin() &&
           FromProtoTimestamp(jobs_.at(*std::prev(at))->job.create_time()) > created) {
      --at;
    }
    order_.insert(at, job_id);
    jobs_[job_id] = std::move(record);
  }
  ScheduleQueued();
  return Get(job_id);
}

bool JobManager::OlderSubmitSavingLocked(const JobRecord& record) const {
  const absl::Time created = FromProtoTimestamp(record.job.create_time());
  return std::any_of(submitting_.begin(), submitting_.end(), [&](const auto& entry) {
    const JobRecord& other = *entry.second;
    return !other.unsettled && FromProtoTimestamp(other.job.create_time()) < created;
  });
}

void JobManager::SettleSubmitsLocked() {
  const absl::Time now = elapsed_clock_->Now();
  if (now < next_settle_) return;
  bool any = false;
  for (const auto& [id, record] : submitting_) {
    if (!record->unsettled || record->settling) continue;
    any = true;
    record->settling = true;
    io_.Post([this, id = id] {
      const absl::Status deleted = DeleteFromStore(id);
      AnnotatedMutexLock lock(&mu_);
      auto it = submitting_.find(id);
      if (it == submitting_.end()) return;
      if (!deleted.ok()) {
        it->second->settling = false;  // tried again next second
        // A line at each try, for every such submit, buried the cause
        // while the store failed.
        FailureStretch& failures = delete_failures_[id];
        if (!NoteFailureLocked(failures)) return;
        PT_LOG(WARNING) << "job " << id << ": still cannot make sure the state store dropped it "
                        << "after its submit failed"
                        << failures.InARow(elapsed_clock_->Now(), "deletes") << ": " << deleted
                        << "; deleting it again every second (logged once a minute until a "
                           "delete succeeds)";
        return;
      }
      PT_LOG(INFO) << "job " << id << ": the state store dropped it after its submit failed"
                   << NoteDeletedLocked(id) << "; its paths are free";
      submitting_.erase(it);
    });
  }
  if (any) next_settle_ = now + absl::Seconds(1);
}

}  // namespace pipetrain
