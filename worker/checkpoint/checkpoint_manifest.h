// Reading a job checkpoint's manifest.json (DESIGN.md §11), the file the
// coordinator writes once every unit of a step is in
// (coordinator/jobs/checkpoint_catalog.h WriteCheckpointManifest):
//
//   {"format": "pipetrain-checkpoint-manifest", "version": 1,
//    "job_id": "...", "step": 10, "seed": 7,
//    "model": {"vocab_size", "max_seq_len", "n_layer", "n_head", "d_model"},
//    "units": [{"unit": 0, "file": "unit-0000.safetensors",
//               "bytes": 1234, "sha256": "<64 lowercase hex>"}, ...]}
//
// A manifest is a file on disk that may be truncated, edited or of another
// program, so nothing in it is trusted: every field's JSON type is checked,
// every number is bounded (the model by the JobSpec limits of
// spec/job_spec.h, so a manifest never makes the reader size
// anything a job could not have), and the unit list must name each unit of
// the model exactly once. Unknown keys are ignored.
//
// Thread-safe: the functions keep no state.
#ifndef PIPETRAIN_WORKER_CHECKPOINT_CHECKPOINT_MANIFEST_H_
#define PIPETRAIN_WORKER_CHECKPOINT_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/checkpoint_manifest_file.h"  // kCheckpointManifestName
#include "proto/pipetrain/v1/plan.pb.h"
#include "worker/model/gpt_config.h"

namespace pipetrain {

inline constexpr char kCheckpointManifestFormat[] = "pipetrain-checkpoint-manifest";
inline constexpr int kCheckpointManifestVersion = 1;
// Bounds of what a manifest may hold. The largest model within the JobSpec
// limits has 514 units, about 170 bytes each in the manifest.
inline constexpr int64_t kMaxCheckpointManifestBytes = int64_t{1} << 20;
inline constexpr size_t kMaxManifestJobIdBytes = 256;
// spec.model.vocab_size's limit (job_spec.cc: token ids are uint16).
inline constexpr int kMaxManifestVocabSize = 65536;

struct CheckpointManifest {
  std::string job_id;
  int64_t step = 0;  // optimizer steps the weights have taken, >= 1
  uint64_t seed = 0;
  GptConfig model;
  // One entry per unit of `model`; units[i].unit() == i.
  std::vector<v1::UnitFile> units;
};

// Parses and checks a manifest's text; `path` only names it in messages.
// Errors, all DATA_LOSS with a message starting "<path>: ": not JSON or not
// an object; "format" not kCheckpointManifestFormat or "version" not
// kCheckpointManifestVersion (a file of another program or version); a
// missing field or one of the wrong JSON type (named, e.g. "model.n_head");
// a number out of its bound (the bound in the message) or a model that
// ValidateGptConfig rejects or whose parameter count exceeds kMaxParameters;
// a unit outside the model, listed twice or missing ("has no entry for unit
// 3"); a file name other than UnitFileName(unit); a size < 1; a SHA-256 that
// is not 64 lowercase hex digits.
absl::StatusOr<CheckpointManifest> ParseCheckpointManifest(std::string_view text,
                                                           const std::string& path);

// Reads the manifest at `path` and parses it. NOT_FOUND naming `path` when
// it does not exist; DATA_LOSS when it is a symbolic link (not followed),
// not a regular file, or larger than kMaxCheckpointManifestBytes; other errno failures as
// absl::ErrnoToStatus; then as ParseCheckpointManifest.
absl::StatusOr<CheckpointManifest> ReadCheckpointManifest(const std::string& path);

// One checkpoint directory, split as ReadUnitCheckpoint takes it: the step
// directory is <root>/<dir>, `dir` a single path component.
struct CheckpointLocation {
  std::string root;  // absolute, symbolic links resolved
  std::string dir;   // e.g. "step-00000010"
  // DIR was a job's checkpoint directory and this is its newest step
  // directory that has a manifest.json.
  bool newest_of_job = false;
  std::string path() const { return root == "/" ? "/" + dir : root + "/" + dir; }
};

// Whether `name` is a checkpoint step directory's, "step-" and 1 to 18
// digits (the coordinator writes step-%08d); its step in `*step` if so.
bool ParseStepDirName(const std::string& name, int64_t* step);

// `dir` is a checkpoint when it is named step-<digits> or holds
// manifest.json (of any kind: reading it reports what is wrong); otherwise
// the step-<digits> directory in it with the highest step whose
// manifest.json exists (step-* links are neither followed nor listed).
// Errors: NOT_FOUND when
// `dir` does not exist, or when neither it nor any step-* directory in it
// has a manifest (the message names <dir>/manifest.json);
// INVALID_ARGUMENT when `dir` is not a directory or is "/";
// FAILED_PRECONDITION when `dir` holds the steps of more than one job;
// other errno failures as absl::ErrnoToStatus (EACCES PERMISSION_DENIED,
// EMFILE RESOURCE_EXHAUSTED, EIO UNKNOWN, ESTALE ABORTED): listing `dir`,
// and, when it is a job's directory, telling whether a step directory in it
// holds a manifest or reading one that does (never skipped: it may be the
// newest checkpoint, and an older one would be resumed; the message names
// it). A step directory or manifest removed meanwhile is skipped; a damaged
// manifest (DATA_LOSS) counts as a step but names no job for the
// two-jobs check, and reading it reports it.
absl::StatusOr<CheckpointLocation> LocateCheckpoint(const std::string& dir);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_CHECKPOINT_CHECKPOINT_MANIFEST_H_
