// A submitted JobSpec resolved into the configuration a pipeline job runs
// with: every default documented in proto/pipetrain/v1/job.proto made
// explicit, every field validated, and the single-process trainer's
// TrainConfig derived from it.
//
// Every rejection is INVALID_ARGUMENT whose message starts with the proto
// path of the offending field ("spec.training.micro_batches: ..."), so the
// REST and gRPC front ends can return it verbatim. All functions here are
// thread-safe: they share no state.
#ifndef PIPETRAIN_SPEC_JOB_SPEC_H_
#define PIPETRAIN_SPEC_JOB_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/confined_path.h"
#include "google/protobuf/message.h"
#include "kernels/compress/codec_spec.h"
#include "proto/pipetrain/v1/job.pb.h"
#include "worker/data/token_file.h"
#include "worker/train/train_config.h"

namespace pipetrain {

// A message holding a field unknown to this build: where, and the field.
struct UnknownField {
  std::string message;  // its path, e.g. "spec.training"
  int number = 0;
};

// The first message in `m` (named `path`), itself included, that holds a
// field unknown to this build, and that field's number; nullopt when none.
// ResolveJobSpec refuses a spec with one; a stored spec with one was
// written by a newer coordinator (coordinator/jobs/stored_job_check.h).
std::optional<UnknownField> FirstUnknownField(const google::protobuf::Message& m,
                                              const std::string& path);
// "<message> has field number <number>".
std::string DescribeUnknownField(const UnknownField& field);

// Accepted values of spec.parallelism.solver and .schedule.
inline constexpr char kSolverUniform[] = "uniform";
inline constexpr char kSolverPipeDream[] = "pipedream";
inline constexpr char kSolverBiPartition[] = "bipartition";
inline constexpr char kSolverAuto[] = "auto";
inline constexpr char kSolverManual[] = "manual";
inline constexpr char kObjectivePaper[] = "paper";
inline constexpr char kObjectiveFull[] = "full";
inline constexpr char kSchedule1F1B[] = "1f1b";
inline constexpr char kScheduleGPipe[] = "gpipe";
// spec.compression.forward/backward "send raw fp32" is kCodecNone
// (kernels/compress/codec_spec.h).

// Bounds of a JobSpec, checked by ResolveJobSpec before anything is sized
// from them (docs/operations.md "Bounds" lists them; a value just beyond any is
// INVALID_ARGUMENT naming the field and the limit). They keep one request
// from making the coordinator allocate or compute without end; what a job
// may really use is then the planner's and the workers' memory check.
inline constexpr size_t kMaxJobNameBytes = 128;
inline constexpr int kMaxLayers = 256;           // model.n_layer
inline constexpr int kMaxHeads = 1024;           // model.n_head
// model.vocab_size: token ids are stored as uint16 (worker/data/token_file.h).
inline constexpr int kMaxVocabSize = 65536;
inline constexpr int kMaxDModel = 16384;         // model.d_model
inline constexpr int kMaxSeqLen = 65536;         // model.max_seq_len (position rows)
// training.seq_len: one sequence's attention scores hold seq_len^2 values
// per head, and cuBLAS and the kernels' launches take int sizes
// (ValidateTrainConfig checks one tensor rank's tensors against 2^31 - 1):
// 65536^2 could never be trained.
inline constexpr int kMaxTrainingSeqLen = 32768;
inline constexpr int kMaxBatchSize = 65536;      // training.batch_size
inline constexpr int kMaxMicroBatches = 4096;    // training.micro_batches
inline constexpr int64_t kMaxSteps = 100000000;  // training.steps, training.eval_interval
// The longest name a checkpoint file has under spec.checkpoint.dir (a step
// of kMaxSteps, a unit of a model of 256 layers), and so the longest dir
// whose files stay within kMaxSpecPathBytes.
inline constexpr char kLongestCheckpointFileSuffix[] = "/step-100000000/unit-0513.safetensors";
inline constexpr size_t kMaxCheckpointDirBytes =
    kMaxSpecPathBytes - (sizeof(kLongestCheckpointFileSuffix) - 1);
inline constexpr int kMaxEvalWindows = 65536;    // training.eval_windows
inline constexpr double kMaxGradClip = 1e6;      // training.grad_clip
inline constexpr int64_t kMaxSyntheticBytes = int64_t{1} << 30;  // data.synthetic_bytes
inline constexpr int kMaxStages = 1024;            // parallelism.stages (and <= units)
inline constexpr int kMaxTensorParallel = 64;      // parallelism.tensor
// compression.forward, .backward and the other codec specs: at most
// kMaxCodecSpecBytes (kernels/compress/codec_spec.h).
// Derived: parameters of the whole model (what one request may make
// workers hold, stream and checkpoint; checkpoint manifests and train-local
// share the bound) and tokens per optimizer step.
inline constexpr int64_t kMaxParameters = int64_t{1} << 32;
inline constexpr int64_t kMaxTokensPerStep = int64_t{1} << 26;  // batch_size * seq_len
// scheduling.queue_timeout: default and range, seconds.
inline constexpr int64_t kDefaultQueueTimeoutSeconds = 3600;
inline constexpr int64_t kMaxQueueTimeoutSeconds = 7 * 24 * 3600;

// spec.checkpoint: interval range, and the default and range of keep.
inline constexpr int kMaxCheckpointInterval = 1000000;
inline constexpr int kDefaultCheckpointKeep = 2;
inline constexpr int kMaxCheckpointKeep = 100;

// spec.parallelism.data's "auto": the planner chooses D for
// spec.parallelism.workers (ResolveDataParallelLayout below).
inline constexpr int kDataParallelAuto = 0;
// spec.parallelism.tensor's "auto" (with data auto only): the planner
// chooses T too (AutoLayoutDegrees below).
inline constexpr int kTensorParallelAuto = 0;

// A JobSpec with every default filled in, plus the configs derived from it.
struct ResolvedJobSpec {
  // Defaults made explicit: has_* is true for every optional field, and data
  // is always present.
  v1::JobSpec spec;
  // Model, hyperparameters and evaluation; threads keeps TrainConfig's
  // default (a JobSpec does not set it).
  TrainConfig train;
  DataFormat data_format = DataFormat::kAuto;  // parsed spec.data.format
  double val_fraction = 0;                     // spec.data.val_fraction
  int64_t synthetic_bytes = 0;                 // spec.data.synthetic_bytes (path empty)
  int stages = 0;                              // spec.parallelism.stages (per replica)
  int data_parallel = 1;                       // spec.parallelism.data: replicas
  // spec.parallelism.workers with data kDataParallelAuto (then stages is 0
  // until ResolveDataParallelLayout picks D); 0 otherwise.
  int layout_workers = 0;
  // spec.parallelism.tensor: ranks per stage; kTensorParallelAuto with
  // data kDataParallelAuto and tensor 0 (until a layout is chosen).
  int tensor_parallel = 1;
  int tensor_partitions = 1;  // spec.parallelism.tensor_partitions (0: Alg. 1 per layer)
  std::string tensor_compression = "none";  // spec.parallelism.tensor_compression
  std::string tensor_mode = "1d";           // spec.parallelism.tensor_mode: "1d" | "3d"
  int tensor_partitions_tune_steps = 0;     // spec.parallelism.tensor_partitions_tune_steps
  // spec.compression.data_parallel's PowerSGD rank, or its quantizer (a
  // codec spec: fp16, bf16, linear:bits=N, piecewise:bits=N); 0 and empty:
  // exact all-reduce. At most one of the two is set.
  int data_parallel_powersgd_rank = 0;
  std::string data_parallel_quantizer;
  std::string solver;            // uniform | pipedream | bipartition | auto | manual
  std::string objective;         // paper | full
  std::string schedule;          // "1f1b" | "gpipe"
  absl::Duration queue_timeout;  // spec.scheduling.queue_timeout
};

// Fills the defaults of job.proto and validates `spec`.
//
// Defaults: model.vocab_size 256, model.max_seq_len = training.seq_len,
// data.format "auto", data.val_fraction 0.1, data.synthetic_bytes 2000000,
// training.micro_batches 1, lr 3e-4, beta1 0.9, beta2 0.95, eps 1e-8,
// weight_decay 0.1, decay "matrices", seed 1, eval_interval 0 (never),
// eval_windows 16, parallelism.solver "uniform",
// parallelism.schedule "1f1b", parallelism.objective "paper",
// compression.forward and .backward "none" (an empty codec too),
// compression.error_feedback and .epilogue_only false,
// scheduling.queue_timeout 3600s, checkpoint.interval_steps 0 (none),
// checkpoint.keep 2, elastic.min_workers 1 (manual: stages),
// elastic.max_workers = parallelism.stages. checkpoint.dir stays empty when
// unset (JobManager makes it "checkpoints/<job id>").
//
// Data parallelism: parallelism.data defaults to 1 and
// parallelism.fused_embedding_sync to true; data >= 1, data x
// stages <= kMaxStages workers, and data divides training.micro_batches
// (INVALID_ARGUMENT naming spec.training.micro_batches otherwise).
//
// Data parallelism "auto" (data 0): parallelism.workers N in 1..kMaxStages
// is required, stages must be unset (0), tensor T (default 1) must divide
// N (each layout is D replicas of N / (D x T) stages of T ranks), and a
// solver other than manual, no compression.data_parallel stages (its codec
// is allowed: the planner picks the stages of the layout it chooses) and no
// elastic bounds; at least one layout in AutoLayoutDegrees (INVALID_ARGUMENT
// naming spec.parallelism.workers otherwise). tensor 0 (kTensorParallelAuto,
// only with data 0) searches T as well: every T of AutoLayoutDegrees.
// The rest is checked as for the first layout that resolves (the first
// one's error when none does); a data-parallel codec as for
// the first with D >= 2 (INVALID_ARGUMENT naming
// spec.compression.data_parallel.codec when there is none); with tensor 0,
// tensor_partitions other than 1, a tensor_compression or
// tensor_partitions_tune_steps as for the first with T >= 2
// (INVALID_ARGUMENT naming the field when there is none; layouts of one
// rank per stage drop them). The result keeps data 0, stages 0, workers N,
// tensor as given, the codec and the elastic bounds unset (resolving it
// again gives the same spec), with data_parallel kDataParallelAuto,
// stages 0, layout_workers N and tensor_parallel T or kTensorParallelAuto
// (and no data_parallel_powersgd_rank or quantizer: those come with a
// layout). parallelism.workers, or tensor 0, with any other data is
// INVALID_ARGUMENT.
//
// Tensor parallelism: parallelism.tensor defaults to 1; 1 <= tensor <=
// kMaxTensorParallel, tensor divides model.n_head, d_model and vocab_size,
// data x stages x tensor <= kMaxStages workers; tensor_partitions 1
// (default), 2, 4 or 0 (Alg. 1), other than 1 only with tensor > 1.
// tensor_compression: "none" (default, also for "") or a spec
// MakeTensorParallelCompression accepts, at most kMaxCodecSpecBytes, only
// with tensor > 1. tensor_mode: "1d" (default, also for "") or "3d"; 3d
// replaces the divisibility rules by ValidateCubeTensorParallel's (tensor
// = p^3, p | n_head, p^2 | d_model, p^3 | vocab_size, p^2 | the samples of
// a micro-batch; named spec.parallelism.tensor) and needs
// tensor_partitions 1 and tensor_compression none (INVALID_ARGUMENT naming
// that field); token_topk on the stage links is accepted with it.
// data x elastic.max_workers x tensor <= kMaxStages too (the layout it may
// grow to; named spec.elastic.max_workers).
// tensor_partitions_tune_steps: 0..16, default 2 with tensor_partitions 0
// and tensor > 1, else 0; non-zero only there.
//
// spec.compression.data_parallel: codec "none" (default, also for an empty
// one; then no stages), "powersgd:rank=R" with R in 1..1024 (rank is
// required: a bare "powersgd" is refused), or one quantizer ("fp16", "bf16", "linear:bits=N",
// "piecewise:bits=N", as MakeCodec accepts it), only with data >= 2; its stages distinct and below
// parallelism.stages (empty: auto, chosen by the planner).
//
// Elasticity: min_workers in [1, stages], max_workers in [stages, units]
// (with data > 1 they count the stages of one replica: a re-plan keeps the
// replicas and gives each as many stages as the READY workers allow);
// solver manual needs both equal to stages (its stages are pinned).
//
// Bounds: every field within the limits above (kMax...), strings included;
// a value's echo in an error message is cut short.
//
// Compression: forward and backward are "none" or a codec spec that
// kernels/compress/codec_spec.h accepts (its message, naming the codec
// parameter, follows the field path: "spec.compression.backward: powersgd:
// rank 0 is out of range ..."); error_feedback and epilogue_only need a
// backward codec.
//
// Solver "manual" requires one manual_stages entry per stage whose forward
// ranges, and separately backward ranges, follow each other from unit 0 to
// the last unit, no stage with both empty; other solvers reject
// manual_stages.
//
// Required: model (n_layer, n_head, d_model >= 1, n_head divides d_model),
// training (seq_len, batch_size, steps >= 1), parallelism (1 <= stages <=
// 2 * n_layer + 2 units).
//
// Paths are checked lexically only; no file is looked at here (see
// common/confined_path.h): spec.output.weights_path must be a relative name
// without ".." (CheckConfinedName; JobManager writes it under the
// coordinator's --output-dir), and so must spec.checkpoint.dir when set;
// spec.data.path must have no ".." component
// and at most kMaxSpecPathBytes bytes (workers read it under their
// --data-root).
//
// Errors: INVALID_ARGUMENT, message "<proto path>: <what is wrong>", e.g.
// "spec.training.micro_batches: 3 must divide spec.training.batch_size 8".
// The first violation found is reported.
absl::StatusOr<ResolvedJobSpec> ResolveJobSpec(const v1::JobSpec& spec);

// With checkpoints on (interval_steps > 0), every unit's checkpoint file
// must stay within what a worker reads back (kMaxUnitFileTensorBytes,
// common/safetensors.h): its weights, both AdamW moments and, for a unit
// that may be on a compressed stage, each kept replica's residual (past
// kMaxFeedbackReplicasKept their sum) and PowerSGD's warm start. OK, or
// INVALID_ARGUMENT naming spec.compression.data_parallel, the unit and the
// size. Not part of ResolveJobSpec, which also runs on restore and on
// workers: applied at submit and to each layout the planner chooses, so a
// job stored before the check runs on as it was.
absl::Status CheckUnitFileSizes(const ResolvedJobSpec& resolved);

// OK when each pipeline link codec of `resolved` (compression.forward,
// .backward) encodes a link's tensor, [batch_size / micro_batches,
// seq_len, d_model], in fewer bytes than its fp32 ones; INVALID_ARGUMENT
// naming the field and both sizes otherwise: such a codec costs bandwidth
// and accuracy for nothing (the link has no raw fallback; PowerSGD's
// factors are smaller only below rank rows x cols / (rows + cols)). Checked
// at submit (and by `up`), not by ResolveJobSpec: a stored job of an
// earlier version that fails it would otherwise fail at the next restart.
absl::Status CheckLinkCodecsSmaller(const ResolvedJobSpec& resolved);

// spec.training.min_lr floors the cosine schedule: given (above 0) with
// the constant one it would be silently ignored, the job at lr throughout:
// INVALID_ARGUMENT naming both fields. For a resolved spec (lr_schedule
// set). At submit and by `up`, as above: a stored job runs on as it was.
absl::Status CheckMinLrHasACosine(const v1::JobSpec& spec);

// The workers a job is placed on: layout_workers with data
// kDataParallelAuto, else data_parallel x stages x tensor_parallel.
int JobWorkers(const ResolvedJobSpec& resolved);

// The data-parallel degrees a job of `workers` workers, each stage on
// `tensor` of them (spec.parallelism.tensor), may take, ascending: D
// divides workers / tensor and micro_batches, and workers / (D x tensor)
// stages are at most `units` (a stage holds a unit at least). Empty when
// none does, or when tensor does not divide workers.
std::vector<int> DataParallelDegrees(int workers, int micro_batches, int units, int tensor = 1);

// One layout of an auto job's workers: D replicas of `stages` stages, each
// on T tensor ranks (D x stages x T workers).
struct LayoutDegrees {
  int data_parallel = 1;    // D
  int stages = 1;           // per replica
  int tensor_parallel = 1;  // T
  bool operator==(const LayoutDegrees& o) const {
    return data_parallel == o.data_parallel && stages == o.stages &&
           tensor_parallel == o.tensor_parallel;
  }
};

// The layouts an auto job (data 0) may take on `workers` workers, ascending
// T, then D: T is spec.parallelism.tensor (default 1), or with tensor 0
// (kTensorParallelAuto) every T in 1..kMaxTensorParallel that divides the
// workers and splits the model in spec.parallelism.tensor_mode (1d:
// ValidateTensorParallel; 3d: ValidateCubeTensorParallel with the samples
// of a micro-batch); for each T, every D of DataParallelDegrees. `spec`'s
// model and training sizes must be resolved (vocab_size, micro_batches).
// Empty when there is none.
std::vector<LayoutDegrees> AutoLayoutDegrees(const v1::JobSpec& spec, int workers);

// Whether `tensor_parallel` ranks split `spec`'s model in its
// parallelism.tensor_mode, as AutoLayoutDegrees asks: OK, or
// ValidateTensorParallel's (1d) or ValidateCubeTensorParallel's (3d)
// INVALID_ARGUMENT saying what does not divide. `spec`'s model and
// training sizes must be resolved.
absl::Status TensorSplitStatus(const v1::JobSpec& spec, int tensor_parallel);

// Why an auto layout of `workers` workers that searches T (tensor 0) has no
// candidate at the counts it could take by number: every T in
// 2..min(workers, kMaxTensorParallel) that divides the workers (and under
// tensor_mode 3d is a cube p^3) but does not split `spec`'s model, with
// TensorSplitStatus's message, ascending T. `spec`'s model and training
// sizes must be resolved.
std::vector<std::pair<int, std::string>> UnsplitTensorRanks(const v1::JobSpec& spec, int workers);

// `spec` (a resolved spec, auto or naming its layout) as data 0 (auto) over
// `workers` workers: data 0, stages unset, workers set, the elastic bounds
// cleared, compression.data_parallel set to `data_parallel_compression`
// without stages (the submitted auto spec's, which a layout of one replica
// drops) if some layout of `workers` has replicas, else cleared (so a job
// left with workers for one replica goes on), then ResolveJobSpec; its
// errors (e.g. no layout of that many workers) pass through. `spec`'s
// training and model sizes must be resolved.
// `submitted_parallelism`, when given, is the submitted auto spec's
// resolved parallelism: its tensor fields (tensor, tensor_partitions,
// tensor_compression, tensor_mode, tensor_partitions_tune_steps) replace
// spec's, which name the chosen layout's T, so a job submitted with tensor
// 0 searches T again; with tensor 0 they are cleared to their defaults
// when no layout of `workers` has T >= 2 (a job left with too few workers
// for tensor ranks goes on).
absl::StatusOr<ResolvedJobSpec> ResolveAsAutoLayout(
    const v1::JobSpec& spec, int workers,
    const v1::DataParallelCompressionSpec& data_parallel_compression = {},
    const v1::ParallelismSpec* submitted_parallelism = nullptr);

// An auto job's spec (data kDataParallelAuto, as ResolveJobSpec returns it)
// as `layout`: data D, stages and tensor T set, workers cleared, and the
// elastic bounds at their defaults (1 and the stages);
// compression.data_parallel cleared when D is 1 (nothing to all-reduce),
// and with T = 1 the tensor fields at their defaults (tensor_partitions 1,
// tensor_compression none, tensor_partitions_tune_steps 0; only a spec
// searching T has others then); everything else as in `auto_spec`.
// Requires auto_spec.data_parallel == kDataParallelAuto. INVALID_ARGUMENT
// when `layout` is not one of AutoLayoutDegrees, or ResolveJobSpec refuses
// the result.
absl::StatusOr<ResolvedJobSpec> ResolveDataParallelLayout(const ResolvedJobSpec& auto_spec,
                                                          const LayoutDegrees& layout);
// The same with the spec's own T (spec.parallelism.tensor not 0): D
// replicas of layout_workers / (D x T) stages.
absl::StatusOr<ResolvedJobSpec> ResolveDataParallelLayout(const ResolvedJobSpec& auto_spec,
                                                          int data_parallel);

// Parses a JobSpec from proto3 canonical JSON; lowerCamel ("nLayer") and
// original ("n_layer") field names are both accepted, as are the strings
// "NaN"/"Infinity" for floats (ResolveJobSpec rejects them). Only parses: the
// result is not validated.
// Errors: INVALID_ARGUMENT "spec: <protobuf's parser message>" for malformed
// JSON, unknown fields and values of the wrong type (the parser's message
// names the field).
absl::StatusOr<v1::JobSpec> JobSpecFromJson(std::string_view json);

// Canonical (lowerCamel) JSON of `spec`, indented. Fields without presence
// that hold their zero value are omitted, as proto3 JSON does; optional fields
// that are set are printed even when zero, so the result parses back to an
// equal message. Printing a JobSpec cannot fail in practice (it holds no Any);
// should protobuf ever report an error, the result is empty.
std::string JobSpecToJson(const v1::JobSpec& spec);

}  // namespace pipetrain

#endif  // PIPETRAIN_SPEC_JOB_SPEC_H_
