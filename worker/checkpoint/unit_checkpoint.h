// Job checkpoints on disk (DESIGN.md §11, proto JobSpec.checkpoint): one
// safetensors file per unit, written by the stage that owns the unit's
// weights, in a directory per step:
//
//   <checkpoint root>/<spec.checkpoint.dir>/step-00000010/unit-0003.safetensors
//                                                        /manifest.json (the coordinator's)
//
// A unit file holds the unit's parameters under their Hugging Face GPT-2
// names (the head's tied copy of wte.weight included), the AdamW moments as
// "optimizer.m.<name>" / "optimizer.v.<name>", and in __metadata__:
// format=pipetrain-unit-checkpoint, version=1, job_id, unit, step (optimizer
// steps the weights have taken), optimizer_steps, seed and the model shape.
// A unit whose data-parallel gradients go compressed (selective stage
// compression, spec.compression.data_parallel) also holds the error
// feedback not yet sent: "feedback.<r>.<name>", replica r's residual of
// each compressed parameter (unsplit), with feedback_replicas=D in the
// metadata, and PowerSGD's warm starts: "powersgd.q.<name>" of the
// parameters one rank holds whole, "powersgd.q.ranks.<name>" (every tensor
// rank's) of those split across ranks. So a compressed job resumed on its
// own layout goes on exactly as one that never stopped, and on another
// layout no feedback is lost (StageRuntime::Restore folds the replicas).
// A stage whose pipeline links go through PowerSGD
// (spec.compression.forward/backward) keeps each link's warm start in the
// file of its first backward unit: "link.q.<replica>.<peer>.<kind>.<unit>",
// [cols, rank], replica r's Q of its sends to stage <peer> of tensor kind
// <kind> (v1::TensorKind's number) of unit <unit> (LinkCompressor's key).
// A tensor-parallel stage that measured its AccTFM partition counts
// (worker/runtime/partition_tuner.h) records its choice in that file's
// metadata too, as tuned_partitions (TunedPartitions, FormatTunedPartitions),
// so that the stage resumed on the same layout runs the same counts instead
// of measuring again.
// Because a file holds one unit whatever the plan was, a checkpoint loads
// under any other plan: a re-plan needs no resharding.
//
// Writes are atomic and durable: each file goes to a temporary name, is
// fsynced and renamed, then the directory is fsynced; a crash leaves either
// the old state or the whole file. Reads trust nothing: the file's size and
// SHA-256 must be those the coordinator recorded when the stage reported it
// (v1::UnitFile), and the metadata and every tensor's shape must match the
// model being resumed; anything else is an error naming the file, never a
// silent load.
//
// Thread-safe: the functions keep no state.
#ifndef PIPETRAIN_WORKER_CHECKPOINT_UNIT_CHECKPOINT_H_
#define PIPETRAIN_WORKER_CHECKPOINT_UNIT_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/safetensors.h"
#include "proto/pipetrain/v1/plan.pb.h"
#include "worker/model/gpt_config.h"

namespace pipetrain {

// PowerSGD's warm start of one compressed pipeline link of one replica:
// its sends to stage `peer` (of its replica) of tensor kind `kind`
// (v1::TensorKind) of unit `unit`, the key LinkCompressor keeps it by.
struct LinkWarmStart {
  int replica = 0;
  int peer = 0;
  int kind = 0;
  int unit = 0;
  Tensor q;  // [cols, rank] on the host
};

// A stage's measured choice of AccTFM partition counts (PartitionTuner)
// and the layout it was measured for: the stage's tensor ranks, the
// samples of a micro-batch and its forward and backward unit ranges
// [begin, end). forward[u] / backward[u]: the counts of every unit u of
// the model (model order; 1, 2 or 4).
struct TunedPartitions {
  int tensor_parallel = 0;
  int samples = 0;
  int forward_begin = 0, forward_end = 0, backward_begin = 0, backward_end = 0;
  std::vector<int> forward, backward;
  bool operator==(const TunedPartitions& o) const {
    return tensor_parallel == o.tensor_parallel && samples == o.samples &&
           forward_begin == o.forward_begin && forward_end == o.forward_end &&
           backward_begin == o.backward_begin && backward_end == o.backward_end &&
           forward == o.forward && backward == o.backward;
  }
};

// The metadata value: "<T> <samples> <forward begin> <forward end>
// <backward begin> <backward end> <f0>/<b0> <f1>/<b1> ...", one pair per
// unit of the model.
std::string FormatTunedPartitions(const TunedPartitions& tuned);
// Its inverse, for `model`: INVALID_ARGUMENT unless the text is exactly
// that form (canonical decimals, at most 48 + 4 x units bytes), T in
// 2..1024, samples in 1..2^20, each range within the model's units with
// begin <= end, and one pair of counts in {1, 2, 4} for every unit of
// the model.
absl::StatusOr<TunedPartitions> ParseTunedPartitions(absl::string_view text,
                                                     const GptConfig& model);

// One unit's state on the host.
struct UnitState {
  int unit = 0;
  std::vector<NamedTensor> values;  // the unit's parameters (UnitParameterShapes order)
  // AdamW moments, in the order of `values`; empty when not wanted (a
  // forward-only unit being loaded) or not yet created (before step 1).
  std::vector<NamedTensor> m, v;
  // Selective stage compression's state, of the parameters that have it
  // (in the order of `values`): feedback[r] holds replica r's error-feedback
  // residuals (unsplit), one entry per replica of the job that wrote it,
  // filled only for the replicas the reader folds (ReadUnitCheckpoint's
  // r mod replicas == replica; empty for the others);
  // warm_q PowerSGD's warm starts Q [cols, rank] (the same on every
  // replica) of matrices one rank held whole, warm_q_ranks those of
  // matrices split across T tensor ranks: [T, rows, rank], rank t's Q
  // [cols of its shard, rank] in the first rows of block t (zeros after).
  // All empty when the unit's gradients go uncompressed.
  std::vector<std::vector<NamedTensor>> feedback;
  std::vector<NamedTensor> warm_q;
  std::vector<NamedTensor> warm_q_ranks;
  // The pipeline links' PowerSGD warm starts of the stage that wrote this
  // unit as its first backward one, every replica's; empty otherwise.
  std::vector<LinkWarmStart> link_warm_q;
  // The AccTFM partition counts the stage that wrote this unit as its
  // first backward one measured and kept; absent otherwise (it did not
  // tune, or had not decided by the checkpoint's step), and not read
  // where the moments are not (ReadUnitCheckpoint without with_moments,
  // or a checkpoint before the first optimizer step).
  std::optional<TunedPartitions> tuned_partitions;
};

// The most replicas a checkpoint's feedback may name (kMaxStages, the
// bound of spec.parallelism.data).
inline constexpr int kMaxFeedbackReplicas = 1024;

// What a stage's checkpoint after `step` optimizer steps holds.
struct StageSnapshot {
  int64_t step = 0;
  int64_t optimizer_steps = 0;
  std::vector<UnitState> units;
};

// Whose checkpoint: recorded in every file. A load checks the model's
// shape and the seed; the job id is recorded to tell whose a file is, not
// checked (spec.init.from may name another job's checkpoint), and the
// manifest's SHA-256 of each file ties it to its checkpoint.
struct CheckpointIdentity {
  std::string job_id;
  GptConfig model;
  uint64_t seed = 0;
};

// "step-00000010": a checkpoint's directory name.
std::string StepDirName(int64_t step);
// "unit-0003.safetensors".
std::string UnitFileName(int unit);

// Writes every unit of `snapshot` under <root>/<dir>/<StepDirName(step)>
// (directories created 0700 as needed, never through a symbolic link:
// common/confined_path.h), files 0600. Returns each file's name, size and
// SHA-256 for the coordinator. `dir` is a relative name (spec.checkpoint.dir).
// Errors: FAILED_PRECONDITION when `root` does not exist, is not a
// directory or may not be entered (ENOENT, ENOTDIR, EACCES; other failures
// to open it, their errno's code); INVALID_ARGUMENT for a bad `dir`, or a
// link or directory at a unit's file name; the errno's code for an I/O failure (a full disk is
// RESOURCE_EXHAUSTED), naming the file, its step directory and `root` as this worker's
// --checkpoint-root (the volume to look at). Nothing is reported on failure, so a
// partial checkpoint is never recorded complete. RESOURCE_EXHAUSTED before
// a unit file of more than kMaxUnitFileTensorBytes of tensors is written. A
// snapshot whose weights,
// moments, error-feedback residuals or warm starts hold a NaN or an
// infinity is FAILED_PRECONDITION before any
// file is written (IsSnapshotNotFinite): an infinite gradient element makes NaN weights while
// its step's loss is still finite (the next step's loss stops the job,
// worker/train/divergence.h), and such a checkpoint would become the
// latest, the one a resume or an export takes. A finite gradient element
// past about 8e19 overflows AdamW's second moment alone, weights and loss
// staying finite: no loss tells it, and a job stops on this refusal
// (JobRunner). `stopped` (may be empty)
// is asked before each unit and each tensor: once true, CANCELLED, the
// unit file in progress removed, and no more files nor directories (the stage stopped: the
// coordinator takes no report of this write, and an ended job's step directories are swept, which a
// write going on would create again).
// kMaxReadableUnitFileBytes and kMaxUnitFileTensorBytes (64 GiB, less the
// safetensors header's room) are in common/safetensors.h, where
// ResolveJobSpec reads them too (a spec whose unit files would pass them
// is refused at submit).
absl::StatusOr<std::vector<v1::UnitFile>> WriteStageCheckpoint(
    const std::string& root, const std::string& dir, const StageSnapshot& snapshot,
    const CheckpointIdentity& identity, const std::function<bool()>& stopped = nullptr);

// Whether `status` is WriteStageCheckpoint's refusal of a snapshot that is
// not finite (training diverged), told apart from its other
// FAILED_PRECONDITION errors (a root missing or not entered) by a payload:
// a job fails on the one and only counts the others, as train-local's
// SaveCheckpoint tells them by its `diverged`. A status reworded with
// WithMessage (common/errno_status.h) keeps the mark, one made anew drops it.
bool IsSnapshotNotFinite(const absl::Status& status);

// Reads unit `expected.unit` of checkpoint `from` (from.dir relative to
// `root`), checking in order: the root and the directories on the way
// open (UNAVAILABLE: this reader's trouble, e.g. too many open files or a
// missing root, not the checkpoint's; INVALID_ARGUMENT for a link or a
// non-directory on the way), the file exists (NOT_FOUND), at most
// kMaxReadableUnitFileBytes (RESOURCE_EXHAUSTED: this reader's limit), its size and
// SHA-256 equal `expected`'s and it parses (DATA_LOSS: truncated or
// corrupt), its metadata names this format (DATA_LOSS) in a version this
// build reads (UNIMPLEMENTED naming the version found and the one read:
// another build's file, not corrupt, which no caller may drop; also when
// the file does not parse, as a later format's dtype or metadata would
// not, but its raw metadata names another version), its unit and step
// (DATA_LOSS), the model shape and seed are `identity`'s
// (FAILED_PRECONDITION: a checkpoint of another model), every tensor
// decoded is finite and every second moment (optimizer.v.*) at least 0
// (DATA_LOSS naming the tensor: WriteStageCheckpoint writes no other), and every parameter
// of the unit is there with its shape (DATA_LOSS), with its moments and
// its error feedback when `with_moments` (feedback_replicas in
// 1..kMaxFeedbackReplicas, every replica's residual of a parameter there,
// those decoded with the parameter's shape, a warm start Q of the parameter's columns
// and at most 1024 columns of rank, per-rank ones of 2..1024 ranks and at
// most the parameter's columns of rows, a link's warm start named with a
// replica below kMaxFeedbackReplicas, a peer below 1024, a tensor kind
// 0..INT_MAX and a unit of the model, [1..d_model, 1..65536], and measured
// partition counts as ParseTunedPartitions takes them, else DATA_LOSS; a
// link's warm start otherwise sound but of a tensor kind this build does not
// know is UNIMPLEMENTED, another build's, as another version).
// Every message names the file. `*optimizer_steps` (may be null) gets the
// file's optimizer step count.
// Only what the caller uses is decoded (the checksum still covers the
// whole file): the parameters; with `with_moments` also the moments, the
// warm starts (powersgd.q.*, link.q.*, every replica's) and the residuals
// of the old replicas r with r mod `replicas` == `replica` (this replica
// of the new layout's `replicas`: those StageRuntime::Restore folds into
// it), so a resume holds no other replica's residuals and a forward-only
// unit its weights alone. The defaults (0 of 1) keep every residual.
// INVALID_ARGUMENT unless 0 <= replica < replicas.
absl::StatusOr<UnitState> ReadUnitCheckpoint(const std::string& root, const v1::ResumeFrom& from,
                                             const v1::UnitFile& expected,
                                             const CheckpointIdentity& identity, bool with_moments,
                                             int64_t* optimizer_steps, int replica = 0,
                                             int replicas = 1);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_CHECKPOINT_UNIT_CHECKPOINT_H_
