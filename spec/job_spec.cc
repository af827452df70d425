#include "spec/job_spec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/closest_name.h"
#include "common/confined_path.h"
#include "common/echo_input.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "common/terminal_safe.h"
#include "google/protobuf/message.h"
#include "google/protobuf/unknown_field_set.h"
#include "google/protobuf/util/json_util.h"
#include "kernels/compress/codec_spec.h"
#include "worker/model/gpt_config.h"
#include "worker/model/tensor_parallel.h"
#include "worker/runtime/feedback_limits.h"
#include "worker/train/adamw_optimizer.h"
#include "worker/train/lr_schedule.h"

namespace pipetrain {
namespace {

// For "spec.<path><typed>: unknown field": the JSON name of the field of
// the message at `path` ("model." or "": proto field names, each followed
// by a dot) nearest `typed` (ClosestName), or "".
std::string NearestFieldName(absl::string_view path, absl::string_view typed) {
  const google::protobuf::Descriptor* message = v1::JobSpec::descriptor();
  for (absl::string_view part : absl::StrSplit(path, '.', absl::SkipEmpty())) {
    // The parser names the path by proto names.
    const google::protobuf::FieldDescriptor* field = message->FindFieldByName(std::string(part));
    if (field == nullptr || field->message_type() == nullptr) return "";
    message = field->message_type();
  }
  std::vector<std::string> names;
  for (int i = 0; i < message->field_count(); ++i) names.push_back(message->field(i)->json_name());
  return ClosestName(typed, names);
}

// Defaults documented in job.proto.
constexpr int kDefaultVocabSize = 256;
constexpr char kDefaultFormat[] = "auto";
constexpr double kDefaultValFraction = 0.1;
constexpr int64_t kDefaultSyntheticBytes = 2000000;
constexpr int kDefaultMicroBatches = 1;
constexpr float kDefaultLr = 3e-4f;
constexpr float kDefaultBeta1 = 0.9f;
constexpr float kDefaultBeta2 = 0.95f;
constexpr float kDefaultEps = 1e-8f;
constexpr float kDefaultWeightDecay = 0.1f;
constexpr char kDefaultDecay[] = "matrices";
constexpr uint64_t kDefaultSeed = 1;
constexpr int kDefaultEvalWindows = 16;  // TrainConfig's default

// The generated corpus is byte-level text.
constexpr int kByteVocabSize = 256;

absl::Status Invalid(absl::string_view path, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", why));
}

// Whether a field must be given (a missing one reads as proto3's zero), or
// has a default that was already filled in when it was missing: only the
// first is "required" in messages.
enum class Presence { kRequired, kDefaulted };

// Rejects sizes that are missing (proto3 zero) or negative.
absl::Status RequirePositive(absl::string_view path, int64_t value,
                             Presence presence = Presence::kRequired) {
  if (value >= 1) return absl::OkStatus();
  return Invalid(path, absl::StrCat(presence == Presence::kRequired ? "required, " : "",
                                    "must be >= 1, got ", value));
}

// A size in [1, limit]; zero of a field without a default reads as
// "required".
absl::Status RequireInRange(absl::string_view path, int64_t value, int64_t limit,
                            Presence presence = Presence::kRequired) {
  RETURN_IF_ERROR(RequirePositive(path, value, presence));
  if (value <= limit) return absl::OkStatus();
  return Invalid(path, absl::StrCat(value, " exceeds the limit of ", limit));
}

absl::Status RequireMaxBytes(absl::string_view path, const std::string& value, size_t limit) {
  if (value.size() <= limit) return absl::OkStatus();
  return Invalid(path, absl::StrCat(value.size(), " bytes exceeds the limit of ", limit));
}

// `value` with as many digits as it takes to read back as itself: a
// bound's refusal must not print 1000001 as "1e+06", inside [0, 1e6].
std::string Exact(double value) {
  for (int digits = 6; digits < 17; ++digits) {
    const std::string text = absl::StrFormat("%.*g", digits, value);
    if (std::strtod(text.c_str(), nullptr) == value) return text;
  }
  return absl::StrFormat("%.17g", value);
}

// The same for a float field: the digits that read back as the float
// (0.001f is "0.001", not its double's 0.0010000000474974513).
std::string Exact(float value) {
  for (int digits = 6; digits < 9; ++digits) {
    const std::string text = absl::StrFormat("%.*g", digits, value);
    if (std::strtof(text.c_str(), nullptr) == value) return text;
  }
  return absl::StrFormat("%.9g", value);
}

absl::Status RequireBeta(absl::string_view path, float value) {
  if (value >= 0 && value < 1) return absl::OkStatus();  // false for NaN
  return Invalid(path, absl::StrCat("must be in [0, 1), got ", Exact(value)));
}

absl::Status ResolveModel(v1::ModelSpec* model) {
  RETURN_IF_ERROR(RequireInRange("spec.model.n_layer", model->n_layer(), kMaxLayers));
  RETURN_IF_ERROR(RequireInRange("spec.model.n_head", model->n_head(), kMaxHeads));
  RETURN_IF_ERROR(RequireInRange("spec.model.d_model", model->d_model(), kMaxDModel));
  if (model->d_model() % model->n_head() != 0) {
    return Invalid(
        "spec.model.n_head",
        absl::StrCat(model->n_head(), " must divide spec.model.d_model ", model->d_model()));
  }
  if (!model->has_vocab_size()) model->set_vocab_size(kDefaultVocabSize);
  if (model->vocab_size() < 1 || model->vocab_size() > kMaxVocabSize) {
    return Invalid("spec.model.vocab_size",
                   absl::StrCat("must be in [1, ", kMaxVocabSize, "] (token ids are uint16), got ",
                                model->vocab_size()));
  }
  return absl::OkStatus();
}

// Shape and step counts; defaults of the optional sizes.
absl::Status ResolveTrainingSizes(v1::TrainingSpec* training) {
  RETURN_IF_ERROR(RequireInRange("spec.training.seq_len", training->seq_len(), kMaxTrainingSeqLen));
  RETURN_IF_ERROR(
      RequireInRange("spec.training.batch_size", training->batch_size(), kMaxBatchSize));
  const int64_t tokens = int64_t{training->batch_size()} * training->seq_len();
  if (tokens > kMaxTokensPerStep) {
    return Invalid("spec.training.batch_size",
                   absl::StrCat("batch_size * seq_len = ", tokens,
                                " tokens per step exceeds the limit of ", kMaxTokensPerStep));
  }
  if (!training->has_micro_batches()) training->set_micro_batches(kDefaultMicroBatches);
  if (training->micro_batches() < 1) {
    return Invalid("spec.training.micro_batches",
                   absl::StrCat("must be >= 1, got ", training->micro_batches()));
  }
  RETURN_IF_ERROR(RequireInRange("spec.training.micro_batches", training->micro_batches(),
                                 kMaxMicroBatches, Presence::kDefaulted));
  if (training->batch_size() % training->micro_batches() != 0) {
    return Invalid("spec.training.micro_batches",
                   absl::StrCat(training->micro_batches(), " must divide spec.training.batch_size ",
                                training->batch_size()));
  }
  RETURN_IF_ERROR(RequireInRange("spec.training.steps", training->steps(), kMaxSteps));
  if (!training->has_seed()) training->set_seed(kDefaultSeed);
  if (!training->has_eval_interval()) training->set_eval_interval(0);
  if (training->eval_interval() < 0 || training->eval_interval() > kMaxSteps) {
    return Invalid("spec.training.eval_interval",
                   absl::StrCat("must be in [0, ", kMaxSteps, "] (0 = never), got ",
                                training->eval_interval()));
  }
  if (!training->has_eval_windows()) training->set_eval_windows(kDefaultEvalWindows);
  RETURN_IF_ERROR(RequireInRange("spec.training.eval_windows", training->eval_windows(),
                                 kMaxEvalWindows, Presence::kDefaulted));
  return absl::OkStatus();
}

// Evaluation reads the validation split, which val_fraction 0 leaves empty.
absl::Status CheckEvalHasData(const v1::JobSpec& spec) {
  if (spec.training().eval_interval() == 0 || spec.data().val_fraction() > 0) {
    return absl::OkStatus();
  }
  return Invalid("spec.training.eval_interval",
                 "needs a validation split: spec.data.val_fraction is 0");
}

// Generated text (no data.path) is one token per byte: its splits are
// known now, and each must hold a window (seq_len + 1 tokens), as the
// workers' Dataset requires, the validation split whether or not anything
// evaluates. Checked here rather than failing every worker at its start.
absl::Status CheckGeneratedSplits(const v1::JobSpec& spec) {
  if (!spec.data().path().empty()) return absl::OkStatus();  // the workers know its size
  const int64_t total = spec.data().synthetic_bytes();
  const int64_t val =
      static_cast<int64_t>(std::floor(static_cast<double>(total) * spec.data().val_fraction()));
  const int64_t window = int64_t{spec.training().seq_len()} + 1;
  if (total - val < window) {
    return Invalid("spec.data.synthetic_bytes",
                   absl::StrCat(total, " bytes leave a train split of ", total - val,
                                " tokens; one window needs spec.training.seq_len + 1 = ", window));
  }
  if (spec.data().val_fraction() > 0 && val < window) {
    return Invalid("spec.data.val_fraction",
                   absl::StrCat(spec.data().val_fraction(), " of ", total,
                                " generated bytes is a validation split of ", val,
                                " tokens; one window needs spec.training.seq_len + 1 = ", window,
                                " (use more synthetic_bytes, or val_fraction 0)"));
  }
  return absl::OkStatus();
}

// AdamW hyperparameters and the decay policy.
absl::Status ResolveOptimizer(v1::TrainingSpec* training) {
  if (!training->has_lr()) training->set_lr(kDefaultLr);
  if (!training->has_beta1()) training->set_beta1(kDefaultBeta1);
  if (!training->has_beta2()) training->set_beta2(kDefaultBeta2);
  if (!training->has_eps()) training->set_eps(kDefaultEps);
  if (!training->has_weight_decay()) training->set_weight_decay(kDefaultWeightDecay);
  if (!training->has_decay()) training->set_decay(kDefaultDecay);
  if (!(std::isfinite(training->lr()) && training->lr() > 0)) {
    return Invalid("spec.training.lr",
                   absl::StrCat("must be finite and > 0, got ", training->lr()));
  }
  RETURN_IF_ERROR(RequireBeta("spec.training.beta1", training->beta1()));
  RETURN_IF_ERROR(RequireBeta("spec.training.beta2", training->beta2()));
  if (!(std::isfinite(training->eps()) && training->eps() > 0)) {
    return Invalid("spec.training.eps",
                   absl::StrCat("must be finite and > 0, got ", training->eps()));
  }
  if (!(std::isfinite(training->weight_decay()) && training->weight_decay() >= 0)) {
    return Invalid("spec.training.weight_decay",
                   absl::StrCat("must be finite and >= 0, got ", training->weight_decay()));
  }
  DecayPolicy unused;
  if (!ParseDecayPolicy(training->decay(), &unused).ok()) {
    return Invalid("spec.training.decay",
                   absl::StrCat("unknown policy \"", EchoInput(training->decay()),
                                "\"; accepted: matrices, all"));
  }
  if (!training->has_grad_clip()) training->set_grad_clip(0);
  if (!training->has_lr_schedule()) training->set_lr_schedule("constant");
  if (!training->has_warmup_steps()) training->set_warmup_steps(0);
  if (!training->has_min_lr()) training->set_min_lr(0);
  if (!(std::isfinite(training->grad_clip()) && training->grad_clip() >= 0 &&
        training->grad_clip() <= kMaxGradClip)) {
    return Invalid("spec.training.grad_clip",
                   absl::StrCat("must be in [0, 1e6], got ", Exact(training->grad_clip())));
  }
  LrSchedule schedule;
  if (!ParseLrSchedule("spec.training.lr_schedule", training->lr_schedule(), &schedule).ok()) {
    return Invalid("spec.training.lr_schedule",
                   absl::StrCat("unknown schedule \"", EchoInput(training->lr_schedule()),
                                "\"; accepted: constant, cosine"));
  }
  if (training->warmup_steps() < 0 || training->warmup_steps() > training->steps()) {
    return Invalid("spec.training.warmup_steps",
                   absl::StrCat("must be in [0, spec.training.steps ", training->steps(), "], got ",
                                training->warmup_steps()));
  }
  if (!(std::isfinite(training->min_lr()) && training->min_lr() >= 0 &&
        training->min_lr() <= training->lr())) {
    return Invalid("spec.training.min_lr",
                   absl::StrCat("must be in [0, spec.training.lr ", Exact(training->lr()),
                                "], got ", Exact(training->min_lr())));
  }
  return absl::OkStatus();
}

// max_seq_len defaults to, and must cover, the training sequence length.
absl::Status ResolveMaxSeqLen(v1::ModelSpec* model, int seq_len) {
  if (!model->has_max_seq_len()) model->set_max_seq_len(seq_len);
  if (model->max_seq_len() < seq_len) {
    return Invalid(
        "spec.model.max_seq_len",
        absl::StrCat(model->max_seq_len(), " must be >= spec.training.seq_len ", seq_len));
  }
  return RequireInRange("spec.model.max_seq_len", model->max_seq_len(), kMaxSeqLen,
                        Presence::kDefaulted);
}

// The whole model's size (kMaxParameters).
absl::Status CheckModelSize(const v1::ModelSpec& model) {
  GptConfig config;
  config.vocab_size = model.vocab_size();
  config.max_seq_len = model.max_seq_len();
  config.n_layer = model.n_layer();
  config.n_head = model.n_head();
  config.d_model = model.d_model();
  const int64_t parameters = CountParameters(config);
  if (parameters > kMaxParameters) {
    return Invalid("spec.model", absl::StrCat("the model has ", parameters,
                                              " parameters; the limit is ", kMaxParameters));
  }
  return absl::OkStatus();
}

// Lexical only: the file is resolved under the data roots of whoever reads
// it (common/confined_path.h), so no ".." may climb out of them. An
// absolute path is allowed; it must resolve inside a root.
absl::Status CheckDataPath(const std::string& path) {
  if (path.size() > kMaxSpecPathBytes) {
    return Invalid(
        "spec.data.path",
        absl::StrCat("path of ", path.size(), " bytes exceeds the limit of ", kMaxSpecPathBytes));
  }
  if (path.find('\0') != std::string::npos) return Invalid("spec.data.path", "contains a NUL byte");
  // A proto string: bytes that are not UTF-8 (a Latin-1 file name) do not
  // parse at the coordinator, whose answer is then INTERNAL with no word
  // of the path (`up` builds the spec from its --data argument).
  if (ValidUtf8(path) != path) {
    return Invalid("spec.data.path", absl::StrCat("is not valid UTF-8 (", EchoInput(path),
                                                  "): rename or copy the file to a UTF-8 name"));
  }
  // Logged by the coordinator and the workers, and shown in the job's
  // reason when the file cannot be read.
  if (const std::optional<size_t> at = FirstTerminalControl(path)) {
    return Invalid("spec.data.path",
                   absl::StrCat("has a control character at byte ", *at,
                                " (escape sequences, line breaks and bidirectional overrides "
                                "are not allowed: the path is logged)"));
  }
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part == "..") {
      return Invalid("spec.data.path",
                     "\"..\" components are not allowed (paths are resolved "
                     "under the workers' --data-root)");
    }
  }
  return absl::OkStatus();
}

// Format, split and corpus source. A path is checked for its form only
// (CheckDataPath): the workers, and a coordinator with --data-root, check
// that the file exists; an empty path means a generated byte-level corpus.
absl::Status ResolveData(v1::DataSpec* data, int vocab_size, DataFormat* format) {
  if (!data->has_format()) data->set_format(kDefaultFormat);
  if (!data->has_val_fraction()) data->set_val_fraction(kDefaultValFraction);
  if (!data->has_synthetic_bytes()) data->set_synthetic_bytes(kDefaultSyntheticBytes);
  RETURN_IF_ERROR(RequireMaxBytes("spec.data.format", data->format(), 32));
  absl::StatusOr<DataFormat> parsed = ParseDataFormat(data->format());
  if (!parsed.ok()) return Invalid("spec.data.format", parsed.status().message());
  *format = *parsed;
  if (!(data->val_fraction() >= 0 && data->val_fraction() < 1)) {
    return Invalid("spec.data.val_fraction",
                   absl::StrCat("must be in [0, 1), got ", Exact(data->val_fraction())));
  }
  // Bounded with a path too: unused then, but stored and shown (every
  // field a client sends has its bound).
  RETURN_IF_ERROR(RequireInRange("spec.data.synthetic_bytes", data->synthetic_bytes(),
                                 kMaxSyntheticBytes, Presence::kDefaulted));
  if (!data->path().empty()) {
    RETURN_IF_ERROR(CheckDataPath(data->path()));
  } else {
    if (*format == DataFormat::kUint16 || *format == DataFormat::kUint16Header) {
      return Invalid("spec.data.format", absl::StrCat(data->format(),
                                                      " needs spec.data.path; the generated "
                                                      "corpus is text (use auto or text)"));
    }
  }
  const bool byte_level = data->path().empty() || *format == DataFormat::kText;
  if (byte_level && vocab_size < kByteVocabSize) {
    return Invalid("spec.model.vocab_size",
                   absl::StrCat(vocab_size, " is too small for byte-level text (",
                                data->path().empty() ? "generated corpus" : "format text",
                                "); it must be >= ", kByteVocabSize));
  }
  return absl::OkStatus();
}

// Solver "manual": one stage per worker, each pass's ranges in order and
// covering every unit (the schedule compiler's contract).
absl::Status CheckManualStages(const v1::ParallelismSpec& p, int units) {
  const bool manual = p.solver() == kSolverManual;
  if (!manual && p.manual_stages_size() > 0) {
    return Invalid(
        "spec.parallelism.manual_stages",
        absl::StrCat("given but the solver is \"", EchoInput(p.solver()), "\"; use \"manual\""));
  }
  if (!manual) return absl::OkStatus();
  if (p.manual_stages_size() != p.stages()) {
    return Invalid("spec.parallelism.manual_stages",
                   absl::StrCat(p.manual_stages_size(), " entries for ", p.stages(), " stages"));
  }
  int forward = 0, backward = 0;
  for (int i = 0; i < p.manual_stages_size(); ++i) {
    const v1::ManualStage& s = p.manual_stages(i);
    const std::string field = absl::StrCat("spec.parallelism.manual_stages[", i, "]");
    if (s.forward_begin() != forward || s.forward_end() < s.forward_begin() ||
        s.backward_begin() != backward || s.backward_end() < s.backward_begin()) {
      return Invalid(field, absl::StrCat("forward [", s.forward_begin(), ", ", s.forward_end(),
                                         ") and backward [", s.backward_begin(), ", ",
                                         s.backward_end(), ") must start at ", forward, " and ",
                                         backward, " (ranges follow each other from unit 0)"));
    }
    if (s.forward_begin() == s.forward_end() && s.backward_begin() == s.backward_end()) {
      return Invalid(field, "both ranges are empty");
    }
    forward = s.forward_end();
    backward = s.backward_end();
  }
  if (forward != units || backward != units) {
    return Invalid("spec.parallelism.manual_stages",
                   absl::StrCat("forward ranges end at ", forward, " and backward at ", backward,
                                "; both must end at ", units, " (2 * n_layer + 2 units)"));
  }
  return absl::OkStatus();
}

absl::Status ResolveParallelism(v1::ParallelismSpec* parallelism, int n_layer) {
  if (!parallelism->has_solver()) parallelism->set_solver(kSolverUniform);
  if (!parallelism->has_schedule()) parallelism->set_schedule(kSchedule1F1B);
  RETURN_IF_ERROR(RequireInRange("spec.parallelism.stages", parallelism->stages(), kMaxStages));
  const int64_t units = 2 * static_cast<int64_t>(n_layer) + 2;
  if (parallelism->stages() > units) {
    return Invalid("spec.parallelism.stages",
                   absl::StrCat(parallelism->stages(), " stages but the model has only ", units,
                                " units (2 * n_layer + 2)"));
  }
  const std::string& solver = parallelism->solver();
  if (solver != kSolverUniform && solver != kSolverPipeDream && solver != kSolverBiPartition &&
      solver != kSolverAuto && solver != kSolverManual) {
    return Invalid("spec.parallelism.solver",
                   absl::StrCat("unknown solver \"", EchoInput(solver), "\"; accepted: ",
                                absl::StrJoin({kSolverUniform, kSolverPipeDream, kSolverBiPartition,
                                               kSolverAuto, kSolverManual},
                                              ", "),
                                " (acctfm is not a pipeline solver: for AccTFM's per-layer "
                                "partitions of a tensor-parallel job set "
                                "spec.parallelism.tensor_partitions to 0)"));
  }
  if (!parallelism->has_objective()) parallelism->set_objective(kObjectivePaper);
  if (parallelism->objective() != kObjectivePaper && parallelism->objective() != kObjectiveFull) {
    return Invalid("spec.parallelism.objective",
                   absl::StrCat("unknown objective \"", EchoInput(parallelism->objective()),
                                "\"; accepted: paper, full"));
  }
  RETURN_IF_ERROR(CheckManualStages(*parallelism, static_cast<int>(units)));
  const std::string& schedule = parallelism->schedule();
  if (schedule != kSchedule1F1B && schedule != kScheduleGPipe) {
    return Invalid("spec.parallelism.schedule",
                   absl::StrCat("unknown schedule \"", EchoInput(schedule),
                                "\"; accepted: ", kSchedule1F1B, ", ", kScheduleGPipe));
  }
  return absl::OkStatus();
}

// spec.parallelism.data: the replicas, their workers and their shares of
// the step's micro-batches.
absl::Status ResolveDataParallel(v1::JobSpec* spec) {
  v1::ParallelismSpec* p = spec->mutable_parallelism();
  if (!p->has_data()) p->set_data(1);
  if (!p->has_fused_embedding_sync()) p->set_fused_embedding_sync(true);
  RETURN_IF_ERROR(
      RequireInRange("spec.parallelism.data", p->data(), kMaxStages, Presence::kDefaulted));
  const int64_t workers = int64_t{p->data()} * p->stages();
  if (workers > kMaxStages) {
    return Invalid("spec.parallelism.data",
                   absl::StrCat(p->data(), " replicas x ", p->stages(), " stages is ", workers,
                                " workers; at most ", kMaxStages));
  }
  const int micro_batches = spec->training().micro_batches();
  if (micro_batches % p->data() != 0) {
    return Invalid("spec.training.micro_batches",
                   absl::StrCat(micro_batches, " micro-batches cannot be shared evenly by ",
                                p->data(), " data-parallel replicas (spec.parallelism.data)"));
  }
  return absl::OkStatus();
}

// spec.parallelism.tensor: the split of every stage, and what does not
// work with it yet.
absl::Status ResolveTensorParallel(v1::JobSpec* spec) {
  v1::ParallelismSpec* p = spec->mutable_parallelism();
  if (!p->has_tensor()) p->set_tensor(1);
  if (p->tensor() == kTensorParallelAuto) {
    return Invalid("spec.parallelism.tensor",
                   "0 (auto) only with spec.parallelism.data 0 (auto), where the planner chooses "
                   "the whole layout of spec.parallelism.workers");
  }
  RETURN_IF_ERROR(RequireInRange("spec.parallelism.tensor", p->tensor(), kMaxTensorParallel,
                                 Presence::kDefaulted));
  const v1::ModelSpec& m = spec->model();
  GptConfig config;
  config.vocab_size = m.vocab_size();
  config.n_head = m.n_head();
  config.d_model = m.d_model();
  const char* kModeField = "spec.parallelism.tensor_mode";
  RETURN_IF_ERROR(RequireMaxBytes(kModeField, p->tensor_mode(), 16));
  if (!p->has_tensor_mode() || p->tensor_mode().empty()) p->set_tensor_mode("1d");
  if (p->tensor_mode() != "1d" && p->tensor_mode() != "3d") {
    return Invalid(kModeField, absl::StrCat("must be \"1d\" or \"3d\", got \"",
                                            absl::CEscape(p->tensor_mode()), "\""));
  }
  const bool cube = p->tensor_mode() == "3d";
  if (cube) {
    const int64_t samples = spec->training().batch_size() / spec->training().micro_batches();
    absl::Status splits = ValidateCubeTensorParallel(config, p->tensor(), samples);
    if (!splits.ok()) return Invalid("spec.parallelism.tensor", splits.message());
  } else {
    absl::Status splits = ValidateTensorParallel(config, p->tensor(), kMaxVocabSize);
    if (!splits.ok()) return Invalid("spec.parallelism.tensor", splits.message());
  }
  const int64_t workers = int64_t{p->data()} * p->stages() * p->tensor();
  if (workers > kMaxStages) {
    return Invalid("spec.parallelism.tensor",
                   absl::StrCat(p->data(), " replicas x ", p->stages(), " stages x ", p->tensor(),
                                " tensor ranks is ", workers, " workers; at most ", kMaxStages));
  }
  // Grown to spec.elastic.max_workers stages, the job must still fit: a
  // larger layout would be refused by every worker, and fail the job
  // because spare workers appeared.
  const int64_t grown = int64_t{p->data()} * spec->elastic().max_workers() * p->tensor();
  if (grown > kMaxStages) {
    return Invalid("spec.elastic.max_workers",
                   absl::StrCat(p->data(), " replicas x ", spec->elastic().max_workers(),
                                " stages x ", p->tensor(), " tensor ranks is ", grown,
                                " workers once grown; at most ", kMaxStages));
  }
  if (!p->has_tensor_partitions()) p->set_tensor_partitions(1);
  const int k = p->tensor_partitions();
  if (k != 0 && k != 1 && k != 2 && k != 4) {
    return Invalid("spec.parallelism.tensor_partitions",
                   absl::StrCat("must be 0 (Alg. 1 per layer), 1, 2 or 4, got ", k));
  }
  // AccTFM's hybrid compression: bounded before it is parsed; normalised.
  const char* kCompressionField = "spec.parallelism.tensor_compression";
  RETURN_IF_ERROR(RequireMaxBytes(kCompressionField, p->tensor_compression(), kMaxCodecSpecBytes));
  absl::StatusOr<TensorParallelCompression> compression =
      MakeTensorParallelCompression(p->tensor_compression(), kCompressionField);
  if (!compression.ok()) return compression.status();
  if (!compression->enabled()) p->set_tensor_compression("none");
  if (cube && k != 1) {
    return Invalid("spec.parallelism.tensor_partitions",
                   "must be 1 with spec.parallelism.tensor_mode 3d (AccTFM's partitions are not "
                   "built for the cube)");
  }
  const char* kTuneField = "spec.parallelism.tensor_partitions_tune_steps";
  if (!p->has_tensor_partitions_tune_steps()) {
    p->set_tensor_partitions_tune_steps(k == 0 && p->tensor() > 1 ? 2 : 0);
  }
  if (p->tensor_partitions_tune_steps() < 0 || p->tensor_partitions_tune_steps() > 16) {
    return Invalid(kTuneField,
                   absl::StrCat("must be 0..16, got ", p->tensor_partitions_tune_steps()));
  }
  if (cube && p->tensor_partitions_tune_steps() > 0) {
    return Invalid(kTuneField,
                   "must be 0 with spec.parallelism.tensor_mode 3d (AccTFM's partitions are not "
                   "built for the cube)");
  }
  if (p->tensor_partitions_tune_steps() > 0 && (k != 0 || p->tensor() == 1)) {
    return Invalid(kTuneField,
                   "needs spec.parallelism.tensor_partitions 0 (Alg. 1 per layer) and "
                   "spec.parallelism.tensor > 1");
  }
  if (cube && compression->enabled()) {
    return Invalid(kCompressionField,
                   "must be none with spec.parallelism.tensor_mode 3d (not built for the cube)");
  }
  if (p->tensor() == 1) {
    if (k != 1) {
      return Invalid("spec.parallelism.tensor_partitions",
                     "needs tensor parallelism (spec.parallelism.tensor > 1)");
    }
    if (compression->enabled()) {
      return Invalid(kCompressionField, "needs tensor parallelism (spec.parallelism.tensor > 1)");
    }
  }
  return absl::OkStatus();
}

// Lexical only: the coordinator writes the file under its --output-dir
// (JobManager checks the directory itself).
absl::Status CheckOutput(const v1::OutputSpec& output) {
  const std::string& path = output.weights_path();
  if (path.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckConfinedName("spec.output.weights_path", path));
  // Such a file would be taken for a writer's leftover temporary and
  // removed when another job writing a file of that name ends.
  if (HasTemporarySuffix(path.substr(path.rfind('/') + 1))) {
    return Invalid("spec.output.weights_path",
                   absl::StrCat("\"", path,
                                "\" ends like a temporary file (.tmp.N.M), which the "
                                "coordinator removes as a writer's leftover; choose another name"));
  }
  return absl::OkStatus();
}

// A pipeline link's codec field: "" and "none" mean raw (normalised to
// "none"); anything else must be a codec spec kernels/compress accepts.
// The links carry [.., d_model] activations and gradients: PowerSGD's
// factors outgrow them unless its rank is below d_model (4r(rows + cols)
// bytes against 4 rows cols), and encoding costs rows x rank^2 (the size
// itself: CheckLinkCodecsSmaller, at submit).
absl::Status ResolveCodec(absl::string_view path, bool has, int d_model, std::string* codec) {
  if (!has || codec->empty()) *codec = kCodecNone;
  RETURN_IF_ERROR(RequireMaxBytes(path, *codec, kMaxCodecSpecBytes));
  if (*codec == kCodecNone) return absl::OkStatus();
  absl::StatusOr<std::vector<CodecStage>> parsed = ParseCodecSpec(*codec);
  if (!parsed.ok()) return Invalid(path, parsed.status().message());
  for (const CodecStage& stage : *parsed) {
    if (stage.name != "powersgd") continue;
    const double rank = stage.params.at("rank");  // required (ParseCodecSpec)
    if (rank >= d_model) {
      return Invalid(path, absl::StrCat("powersgd: rank ", rank, " is not below d_model ", d_model,
                                        ": its factors would be larger than the tensor"));
    }
  }
  return absl::OkStatus();
}

absl::Status ResolveCompression(v1::CompressionSpec* c, int d_model) {
  RETURN_IF_ERROR(
      ResolveCodec("spec.compression.forward", c->has_forward(), d_model, c->mutable_forward()));
  RETURN_IF_ERROR(
      ResolveCodec("spec.compression.backward", c->has_backward(), d_model, c->mutable_backward()));
  if (!c->has_error_feedback()) c->set_error_feedback(false);
  if (!c->has_epilogue_only()) c->set_epilogue_only(false);
  // Both act on the backward codec only; accepting them without one would
  // let a user believe a compression setting is in effect that is not.
  if (c->backward() == kCodecNone) {
    if (c->error_feedback()) {
      return Invalid("spec.compression.error_feedback",
                     "needs a backward codec (spec.compression.backward is none)");
    }
    if (c->epilogue_only()) {
      return Invalid("spec.compression.epilogue_only",
                     "needs a backward codec (spec.compression.backward is none)");
    }
  }
  return absl::OkStatus();
}

// spec.compression.data_parallel: "none" or "powersgd:rank=R" (R <= 1024),
// on stages of a replica, with data-parallel replicas to compress for.
absl::Status ResolveDataParallelCompression(v1::JobSpec* spec, int* rank, std::string* quantizer) {
  v1::DataParallelCompressionSpec* c = spec->mutable_compression()->mutable_data_parallel();
  *rank = 0;
  quantizer->clear();
  if (c->codec().empty()) c->set_codec(kCodecNone);
  RETURN_IF_ERROR(
      RequireMaxBytes("spec.compression.data_parallel.codec", c->codec(), kMaxCodecSpecBytes));
  if (c->codec() == kCodecNone) {
    if (c->stages_size() > 0) {
      return Invalid("spec.compression.data_parallel.stages",
                     "names stages but spec.compression.data_parallel.codec is none");
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<CodecStage>> parsed = ParseCodecSpec(c->codec());
  if (!parsed.ok()) {
    return Invalid("spec.compression.data_parallel.codec", parsed.status().message());
  }
  // PowerSGD's factors add up across replicas; a quantizer's payloads are
  // decoded before they are summed (Collectives::AllReduceEncoded). Top-k
  // codecs select by row, which a flat gradient does not have.
  if (parsed->size() != 1 || (*parsed)[0].name != "powersgd") {
    absl::StatusOr<std::unique_ptr<Codec>> codec = MakeQuantizer(c->codec());
    if (!codec.ok()) {
      return Invalid("spec.compression.data_parallel.codec",
                     absl::StrCat(codec.status().message(),
                                  "; an all-reduce compresses with powersgd:rank=R or one of "
                                  "these quantizers"));
    }
    *quantizer = (*codec)->name();
  } else {
    const double r = (*parsed)[0].params.count("rank") ? (*parsed)[0].params.at("rank") : 4;
    if (r < 1 || r > 1024) {
      return Invalid("spec.compression.data_parallel.codec",
                     absl::StrCat("powersgd: rank ", r, " is out of range 1..1024"));
    }
    *rank = static_cast<int>(r);
  }
  if (spec->parallelism().data() < 2) {
    return Invalid("spec.compression.data_parallel",
                   "needs data-parallel replicas (spec.parallelism.data >= 2)");
  }
  std::set<int> seen;
  for (int stage : c->stages()) {
    if (stage < 0 || stage >= spec->parallelism().stages() || !seen.insert(stage).second) {
      return Invalid("spec.compression.data_parallel.stages",
                     absl::StrCat("stage ", stage, " is repeated or not in [0, ",
                                  spec->parallelism().stages(), ")"));
    }
  }
  return absl::OkStatus();
}

// spec.scheduling.queue_timeout: default and range.
absl::Status ResolveScheduling(v1::SchedulingSpec* scheduling, absl::Duration* timeout) {
  if (!scheduling->has_queue_timeout()) {
    scheduling->mutable_queue_timeout()->set_seconds(kDefaultQueueTimeoutSeconds);
  }
  const google::protobuf::Duration& d = scheduling->queue_timeout();
  if (d.seconds() < 1 || d.seconds() > kMaxQueueTimeoutSeconds || d.nanos() < 0 ||
      d.nanos() > 999999999 || (d.seconds() == kMaxQueueTimeoutSeconds && d.nanos() > 0)) {
    return Invalid("spec.scheduling.queue_timeout",
                   absl::StrCat("must be in [1s, ", kMaxQueueTimeoutSeconds, "s], got ",
                                d.seconds(), "s + ", d.nanos(), "ns"));
  }
  *timeout = absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
  return absl::OkStatus();
}

// spec.checkpoint and spec.elastic: defaults and ranges. The default
// checkpoint dir names the job, so JobManager fills it in at submit.
absl::Status ResolveElasticity(v1::JobSpec* spec) {
  v1::CheckpointSpec* c = spec->mutable_checkpoint();
  if (c->interval_steps() < 0 || c->interval_steps() > kMaxCheckpointInterval) {
    return Invalid(
        "spec.checkpoint.interval_steps",
        absl::StrCat("must be in [0, ", kMaxCheckpointInterval, "], got ", c->interval_steps()));
  }
  if (!c->has_keep()) c->set_keep(kDefaultCheckpointKeep);
  if (c->keep() < 1 || c->keep() > kMaxCheckpointKeep) {
    return Invalid("spec.checkpoint.keep",
                   absl::StrCat("must be in [1, ", kMaxCheckpointKeep, "], got ", c->keep()));
  }
  if (!c->dir().empty()) {
    RETURN_IF_ERROR(CheckConfinedName("spec.checkpoint.dir", c->dir()));
    // Its files are confined paths too, under the same limit.
    if (c->dir().size() > kMaxCheckpointDirBytes) {
      return Invalid("spec.checkpoint.dir",
                     absl::StrCat("path of ", c->dir().size(), " bytes exceeds the limit of ",
                                  kMaxCheckpointDirBytes, " (the files under it, such as ",
                                  kLongestCheckpointFileSuffix, ", must stay within ",
                                  kMaxSpecPathBytes, ")"));
    }
  }
  if (!spec->init().from().empty()) {
    RETURN_IF_ERROR(CheckConfinedName("spec.init.from", spec->init().from()));
  }
  const int stages = spec->parallelism().stages();
  const bool manual = spec->parallelism().solver() == kSolverManual;
  v1::ElasticSpec* e = spec->mutable_elastic();
  if (!e->has_min_workers()) e->set_min_workers(manual ? stages : 1);
  if (!e->has_max_workers()) e->set_max_workers(stages);
  if (e->min_workers() < 1 || e->min_workers() > stages) {
    return Invalid("spec.elastic.min_workers",
                   absl::StrCat("must be in [1, spec.parallelism.stages ", stages, "], got ",
                                e->min_workers()));
  }
  const int units = 2 * spec->model().n_layer() + 2;
  if (e->max_workers() < stages || e->max_workers() > units) {
    return Invalid("spec.elastic.max_workers",
                   absl::StrCat("must be in [spec.parallelism.stages ", stages, ", the model's ",
                                units, " units], got ", e->max_workers()));
  }
  if (manual && (e->min_workers() != stages || e->max_workers() != stages)) {
    return Invalid("spec.elastic",
                   "solver manual pins the stages: min_workers and max_workers must equal "
                   "spec.parallelism.stages");
  }
  return absl::OkStatus();
}

TrainConfig DeriveTrainConfig(const v1::JobSpec& spec) {
  TrainConfig config;
  config.model.vocab_size = spec.model().vocab_size();
  config.model.max_seq_len = spec.model().max_seq_len();
  config.model.n_layer = spec.model().n_layer();
  config.model.n_head = spec.model().n_head();
  config.model.d_model = spec.model().d_model();
  const v1::TrainingSpec& t = spec.training();
  config.seq_len = t.seq_len();
  config.batch_size = t.batch_size();
  config.micro_batches = t.micro_batches();
  config.tensor_parallel = spec.parallelism().tensor();  // resolved: >= 1
  config.steps = t.steps();
  config.adam = AdamWConfig{t.lr(), t.beta1(), t.beta2(), t.eps(), t.weight_decay()};
  // Checked by ResolveOptimizer.
  ParseDecayPolicy(t.decay(), &config.decay).IgnoreError();
  config.seed = t.seed();
  config.eval_interval = t.eval_interval();
  config.eval_windows = t.eval_windows();
  config.grad_clip = t.grad_clip();
  // Checked by ResolveOptimizer.
  ParseLrSchedule("lr_schedule", t.lr_schedule(), &config.lr_schedule).IgnoreError();
  config.warmup_steps = t.warmup_steps();
  config.min_lr = t.min_lr();
  return config;
}

// The largest tensor a tensor rank allocates for one micro-batch (some
// kernel sizes are int: kMaxTensorElements), named by the field that
// shrinks it: seq_len once a micro-batch is one sequence (more
// micro-batches are impossible then), else micro_batches.
// ValidateTrainConfig checks it too, but as spec.training.
absl::Status CheckMicroBatchTensors(const TrainConfig& train) {
  const int sequences = train.batch_size / train.micro_batches;
  const LargestTensors largest =
      LargestTensorElements(train.model, sequences, train.seq_len, train.tensor_parallel);
  if (largest.activation <= kMaxTensorElements) return absl::OkStatus();
  const std::string tensor =
      absl::StrFormat("a tensor of %.0f elements (the %s%s), above 2^31 - 1", largest.activation,
                      largest.activation_name, TensorRanksNote(train.tensor_parallel));
  // The residual stream is whole on every rank: no use naming the ranks.
  const char* ranks =
      largest.activation_split ? " or more tensor ranks (spec.parallelism.tensor)" : "";
  if (sequences == 1) {
    return Invalid("spec.training.seq_len",
                   absl::StrCat("one sequence of ", train.seq_len, " tokens needs ", tensor,
                                ", and a micro-batch is already one sequence (micro_batches = "
                                "batch_size); use a shorter seq_len",
                                ranks));
  }
  return Invalid("spec.training.micro_batches",
                 absl::StrCat("a micro-batch of ", sequences, " sequences of ", train.seq_len,
                              " tokens needs ", tensor, "; use more micro-batches, a shorter "
                              "seq_len", ranks));
}

// What a checkpoint keeps of a unit's data-parallel error feedback
// (StageRuntime's snapshot): `residuals` copies of each compressed
// parameter, and PowerSGD's warm starts.
struct UnitFeedback {
  int residuals = 0;      // 0: no codec on the unit's stage, or no checkpoints
  int powersgd_rank = 0;  // 0 with residuals: a quantizer, which compresses every gradient
  int tensor = 1;         // tensor ranks of a stage
  bool cube = false;      // spec.parallelism.tensor_mode 3d
};

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The values of `f` a unit file keeps for parameter `p`. The tied wte is
// all-reduced exact (StageRuntime::TiedHolder), so has none. PowerSGD
// compresses a matrix whose tensor rank's shard its factors make smaller
// (StageRuntime::PowerSgdPays); a cube's blocks are priced as the whole
// matrix, which pays whenever a block does.
int64_t FeedbackValues(const ParameterShape& p, const UnitFeedback& f) {
  if (f.residuals == 0 || p.name == kTokenEmbeddingName) return 0;
  const int64_t numel = Elements(p.shape);
  if (f.powersgd_rank == 0) return f.residuals * numel;
  std::vector<int64_t> shard = p.shape;
  const bool split = p.split_dim >= 0 && f.tensor > 1 && !f.cube;
  if (split) shard[p.split_dim] /= f.tensor;
  const int64_t rank = f.powersgd_rank;
  if (shard.size() != 2 || rank * (shard[0] + shard[1]) >= shard[0] * shard[1]) return 0;
  // The warm start Q, [columns, rank] of each rank's shard (rank 0 gathers
  // them where split); a cube's fewer values than the matrix (rank is below
  // a paying block's rows).
  const int64_t warm = f.cube ? numel : (split ? f.tensor : 1) * shard[1] * rank;
  return f.residuals * numel + warm;
}

// The bytes of tensors in unit `unit`'s checkpoint file (WriteStageCheckpoint):
// its parameters unsplit (tensor rank 0 gathers the shards) and both AdamW
// moments, fp32, and `f`'s feedback. Left out: the pipeline links' PowerSGD
// warm starts, a few [d_model, rank] factors per replica in a stage's
// first unit, which the writer's own check still catches.
int64_t UnitFileBytes(const GptConfig& model, int unit, const UnitFeedback& f) {
  int64_t values = 0;
  for (const ParameterShape& p : UnitParameterShapes(model, unit)) {
    values += 3 * Elements(p.shape) + FeedbackValues(p, f);
  }
  return values * static_cast<int64_t>(sizeof(float));
}

// Whether unit `unit`'s stage may compress its data-parallel all-reduce as
// far as the spec tells: solver manual with listed stages pins the units
// of each; otherwise the planner places the units (and picks the stages
// when none are listed), so any may.
bool UnitMayCompress(const v1::JobSpec& spec, int unit) {
  const v1::ParallelismSpec& p = spec.parallelism();
  const auto& listed = spec.compression().data_parallel().stages();
  if (p.solver() != kSolverManual || listed.empty()) return true;
  return std::any_of(listed.begin(), listed.end(), [&p, unit](int s) {
    return unit >= p.manual_stages(s).backward_begin() && unit < p.manual_stages(s).backward_end();
  });
}

// spec.parallelism.tensor as a submitted spec means it: unset is 1.
int SpecTensor(const v1::ParallelismSpec& p) { return p.has_tensor() ? p.tensor() : 1; }

// Whether `spec` sets a field that only a stage of tensor ranks takes.
const char* TensorRankFieldSet(const v1::ParallelismSpec& p) {
  if (p.has_tensor_partitions() && p.tensor_partitions() != 1) {
    return "spec.parallelism.tensor_partitions";
  }
  if (!p.tensor_compression().empty() && p.tensor_compression() != "none") {
    return "spec.parallelism.tensor_compression";
  }
  if (p.has_tensor_partitions_tune_steps() && p.tensor_partitions_tune_steps() != 0) {
    return "spec.parallelism.tensor_partitions_tune_steps";
  }
  return nullptr;
}

// An auto spec (data 0) as one of its layouts (ResolveDataParallelLayout's
// contract): a layout of one replica has no all-reduce to compress, and
// one of one rank per stage of a spec searching T takes no tensor fields.
v1::JobSpec LayoutSpec(const v1::JobSpec& auto_spec, const LayoutDegrees& layout) {
  v1::JobSpec one = auto_spec;
  v1::ParallelismSpec* p = one.mutable_parallelism();
  const bool searches_tensor = SpecTensor(*p) == kTensorParallelAuto;
  p->set_data(layout.data_parallel);
  p->set_stages(layout.stages);
  p->set_tensor(layout.tensor_parallel);
  p->clear_workers();
  if (layout.data_parallel == 1) one.mutable_compression()->clear_data_parallel();
  if (layout.tensor_parallel == 1 && searches_tensor) {
    p->clear_tensor_partitions();
    p->clear_tensor_compression();
    p->clear_tensor_partitions_tune_steps();
  }
  return one;
}

// The spec of the first of `layouts` that `picked` takes and ResolveJobSpec
// accepts; when it accepts none, the first one's error. A layout that
// fails is one the planner skips (ChooseJobLayout), not a reason to refuse
// the job: with tensor 0 the layouts start at T = 1, where a long
// context's attention scores can pass 2^31 elements that each of T ranks'
// shares stays under. Requires `picked` to take at least one layout.
absl::StatusOr<ResolvedJobSpec> ResolveFirstLayout(const v1::JobSpec& auto_spec,
                                                   const std::vector<LayoutDegrees>& layouts,
                                                   bool (*picked)(const LayoutDegrees&)) {
  std::optional<absl::Status> first_error;
  for (const LayoutDegrees& layout : layouts) {
    if (!picked(layout)) continue;
    absl::StatusOr<ResolvedJobSpec> resolved = ResolveJobSpec(LayoutSpec(auto_spec, layout));
    if (resolved.ok()) return resolved;
    if (!first_error.has_value()) first_error = resolved.status();
  }
  return first_error.value_or(absl::InternalError("ResolveFirstLayout: no layout picked"));
}

bool AnyLayout(const LayoutDegrees&) { return true; }
bool ReplicatedLayout(const LayoutDegrees& l) { return l.data_parallel >= 2; }
bool RankedLayout(const LayoutDegrees& l) { return l.tensor_parallel >= 2; }

// spec.parallelism.data 0 (auto): what needs a known D is refused; the
// rest is resolved as the first layout's spec that resolves, then marked
// auto again.
absl::StatusOr<ResolvedJobSpec> ResolveAutoLayout(const v1::JobSpec& spec) {
  const v1::ParallelismSpec& p = spec.parallelism();
  if (!p.has_workers()) {
    return Invalid("spec.parallelism.workers",
                   "required with spec.parallelism.data 0 (auto): the job's workers, which the "
                   "planner splits into replicas of stages");
  }
  RETURN_IF_ERROR(RequireInRange("spec.parallelism.workers", p.workers(), kMaxStages));
  if (p.stages() != 0) {
    return Invalid("spec.parallelism.stages",
                   "is chosen by the planner with spec.parallelism.data 0 (auto): leave it unset "
                   "(spec.parallelism.workers counts the job's workers)");
  }
  // The search covers data x stages, and the tensor ranks per stage too
  // with tensor 0 (auto).
  const int tensor = SpecTensor(p);
  const bool searches_tensor = tensor == kTensorParallelAuto;
  if (!searches_tensor) {
    RETURN_IF_ERROR(RequireInRange("spec.parallelism.tensor", tensor, kMaxTensorParallel));
    if (p.workers() % tensor != 0) {
      return Invalid("spec.parallelism.workers",
                     absl::StrCat(p.workers(), " is not a multiple of spec.parallelism.tensor ",
                                  tensor, ": every stage takes ", tensor, " workers"));
    }
  }
  if (p.solver() == kSolverManual) {
    return Invalid("spec.parallelism.solver",
                   "manual pins every stage's units, so the planner cannot choose the stages: not "
                   "with spec.parallelism.data 0 (auto)");
  }
  const v1::DataParallelCompressionSpec& dp = spec.compression().data_parallel();
  if (dp.stages_size() > 0) {
    return Invalid("spec.compression.data_parallel.stages",
                   "name stages of a known layout: leave them empty with spec.parallelism.data 0 "
                   "(auto), and the planner picks them in the layout it chooses");
  }
  if (spec.elastic().has_min_workers() || spec.elastic().has_max_workers()) {
    return Invalid("spec.elastic",
                   "min_workers and max_workers count one replica's stages, which "
                   "spec.parallelism.data 0 (auto) leaves to the planner: leave them unset "
                   "(defaults 1 and the chosen stages)");
  }
  RETURN_IF_ERROR(RequireMaxBytes("spec.parallelism.tensor_mode", p.tensor_mode(), 16));
  // The units, micro-batches and vocabulary, resolved as the layouts'
  // specs will be.
  v1::JobSpec sized = spec;
  RETURN_IF_ERROR(ResolveModel(sized.mutable_model()));
  RETURN_IF_ERROR(ResolveTrainingSizes(sized.mutable_training()));
  const int units = 2 * sized.model().n_layer() + 2;
  const int micro_batches = sized.training().micro_batches();
  const std::vector<LayoutDegrees> layouts = AutoLayoutDegrees(sized, p.workers());
  if (layouts.empty()) {
    const std::string groups = tensor == 1 ? "workers" : "groups";
    // With T searched, why each T that divides the workers split no model:
    // the field to change is in its reason (a cube's p^3 rule among them).
    std::vector<std::string> unsplit;
    if (searches_tensor) {
      for (const auto& [t, why] : UnsplitTensorRanks(sized, p.workers())) {
        unsplit.push_back(absl::StrCat("T ", t, ": ", why));
      }
    }
    const bool cube = p.tensor_mode() == "3d";
    return Invalid(
        "spec.parallelism.workers",
        searches_tensor
            ? absl::StrCat(
                  "no layout of ", p.workers(), " workers: the tensor ranks T must ",
                  cube ? "be a cube p^3 (8, 27, ...) that divides" : "divide",
                  " the workers and split the model (spec.parallelism.tensor",
                  cube ? ", tensor_mode 3d" : "",
                  "), and the replicas D both the workers / T and "
                  "spec.training.micro_batches ",
                  micro_batches, ", with workers / (D x T) stages at most the model's ", units,
                  " units",
                  unsplit.empty() ? "" : absl::StrCat(" (", absl::StrJoin(unsplit, "; "), ")"))
            : absl::StrCat(
                  "no layout of ", p.workers(), " workers",
                  tensor > 1 ? absl::StrCat(" in groups of ", tensor, " tensor ranks") : "",
                  ": the replicas D must divide both the ", groups,
                  " and spec.training.micro_batches ", micro_batches, ", with ", groups,
                  " / D stages at most the model's ", units, " units"));
  }
  // The rest is checked as the first layout's spec that resolves; the
  // data-parallel codec, which a layout of one replica drops, as the first
  // such layout's with replicas, and the tensor fields, which a layout of
  // one rank per stage drops, as the first's with tensor ranks
  // (ResolveDataParallelLayout). Refused with the first layout's error
  // when none resolves.
  ASSIGN_OR_RETURN(ResolvedJobSpec resolved, ResolveFirstLayout(spec, layouts, AnyLayout));
  if (!dp.codec().empty() && dp.codec() != kCodecNone) {
    if (std::none_of(layouts.begin(), layouts.end(), ReplicatedLayout)) {
      return Invalid(
          "spec.compression.data_parallel.codec",
          absl::StrCat("compresses the replicas' all-reduce, but every layout of ", p.workers(),
                       " workers has one replica (2 replicas or more "
                       "must divide the workers and spec.training.micro_batches ",
                       micro_batches, ")"));
    }
    ASSIGN_OR_RETURN(const ResolvedJobSpec with_codec,
                     ResolveFirstLayout(spec, layouts, ReplicatedLayout));
    *resolved.spec.mutable_compression()->mutable_data_parallel() =
        with_codec.spec.compression().data_parallel();
  }
  v1::ParallelismSpec* out = resolved.spec.mutable_parallelism();
  if (searches_tensor) {
    const bool ranked = std::any_of(layouts.begin(), layouts.end(), RankedLayout);
    if (const char* field = TensorRankFieldSet(p); field != nullptr && !ranked) {
      return Invalid(field, absl::StrCat("applies to stages of tensor ranks, but every layout of ",
                                         p.workers(), " workers has one rank per stage"));
    }
    if (ranked) {
      ASSIGN_OR_RETURN(const ResolvedJobSpec with_ranks,
                       ResolveFirstLayout(spec, layouts, RankedLayout));
      const v1::ParallelismSpec& r = with_ranks.spec.parallelism();
      out->set_tensor_partitions(r.tensor_partitions());
      out->set_tensor_compression(r.tensor_compression());
      out->set_tensor_partitions_tune_steps(r.tensor_partitions_tune_steps());
      resolved.tensor_partitions = with_ranks.tensor_partitions;
      resolved.tensor_compression = with_ranks.tensor_compression;
      resolved.tensor_partitions_tune_steps = with_ranks.tensor_partitions_tune_steps;
    }
    out->set_tensor(kTensorParallelAuto);
    resolved.tensor_parallel = kTensorParallelAuto;
  }
  out->set_data(kDataParallelAuto);
  out->set_stages(0);
  out->set_workers(p.workers());
  resolved.spec.mutable_elastic()->clear_min_workers();
  resolved.spec.mutable_elastic()->clear_max_workers();
  resolved.stages = 0;
  resolved.data_parallel = kDataParallelAuto;
  resolved.layout_workers = p.workers();
  return resolved;
}

}  // namespace

// With checkpoints on, the largest unit file must stay within what a worker
// reads back (kMaxUnitFileTensorBytes): a stage refuses to write a larger
// one, every checkpoint of the job then fails, and a lost worker cannot be
// recovered. The residuals (one per replica up to kMaxFeedbackReplicasKept,
// else their sum) are what grows a unit past it: within kMaxParameters, a
// unit's weights and moments stay within 48 GiB.
absl::Status CheckUnitFileSizes(const ResolvedJobSpec& resolved) {
  const v1::JobSpec& spec = resolved.spec;
  if (spec.checkpoint().interval_steps() == 0) return absl::OkStatus();
  const GptConfig& model = resolved.train.model;
  const int data = spec.parallelism().data();
  const bool codec =
      resolved.data_parallel_powersgd_rank > 0 || !resolved.data_parallel_quantizer.empty();
  UnitFeedback f;
  f.powersgd_rank = resolved.data_parallel_powersgd_rank;
  f.tensor = spec.parallelism().tensor();
  f.cube = spec.parallelism().tensor_mode() == "3d";
  int unit = 0, residuals = 0;
  int64_t bytes = -1;
  for (int u = 0; u < NumUnits(model); ++u) {
    f.residuals = !codec || !UnitMayCompress(spec, u) ? 0
                  : data <= kMaxFeedbackReplicasKept  ? data
                                                      : 1;
    const int64_t b = UnitFileBytes(model, u, f);
    if (b > bytes) unit = u, residuals = f.residuals, bytes = b;
  }
  if (bytes <= kMaxUnitFileTensorBytes) return absl::OkStatus();
  const std::string file = absl::StrFormat(
      "with checkpoints, unit %s's file would hold %d bytes of tensors (%.1f GiB: its weights, "
      "both AdamW moments",
      UnitName(model, unit), bytes, static_cast<double>(bytes) / (int64_t{1} << 30));
  const std::string limit = absl::StrCat(
      "), above the ", kMaxUnitFileTensorBytes,
      " a worker reads back (64 GiB less the file's header), so no checkpoint could complete");
  if (residuals == 0) {  // beyond today's model bounds
    return Invalid("spec.model.d_model", absl::StrCat(file, limit, "; use a smaller d_model"));
  }
  return Invalid("spec.compression.data_parallel",
                 absl::StrCat(file, " and ", residuals, " replicas' error-feedback residuals of ",
                              spec.compression().data_parallel().codec(), limit,
                              "; use fewer compressed replicas (spec.parallelism.data; past ",
                              kMaxFeedbackReplicasKept,
                              " a checkpoint keeps their sum, one), no codec, or a smaller "
                              "spec.model.d_model"));
}

std::optional<UnknownField> FirstUnknownField(const google::protobuf::Message& m,
                                              const std::string& path) {
  const google::protobuf::Reflection* reflection = m.GetReflection();
  const google::protobuf::UnknownFieldSet& unknown = reflection->GetUnknownFields(m);
  if (!unknown.empty()) return UnknownField{path, unknown.field(0).number()};
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  reflection->ListFields(m, &fields);
  for (const google::protobuf::FieldDescriptor* field : fields) {
    if (field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    const std::string inner = absl::StrCat(path, ".", field->name());
    if (!field->is_repeated()) {
      if (auto found = FirstUnknownField(reflection->GetMessage(m, field), inner)) return found;
      continue;
    }
    for (int i = 0; i < reflection->FieldSize(m, field); ++i) {
      if (auto found = FirstUnknownField(reflection->GetRepeatedMessage(m, field, i),
                                         absl::StrCat(inner, "[", i, "]"))) {
        return found;
      }
    }
  }
  return std::nullopt;
}

std::string DescribeUnknownField(const UnknownField& field) {
  return absl::StrCat(field.message, " has field number ", field.number);
}

absl::Status CheckMinLrHasACosine(const v1::JobSpec& spec) {
  if (spec.training().min_lr() <= 0 || spec.training().lr_schedule() == "cosine") {
    return absl::OkStatus();
  }
  return Invalid("spec.training.min_lr",
                 "the cosine schedule's floor, with no effect under spec.training.lr_schedule "
                 "constant; set spec.training.lr_schedule to cosine or spec.training.min_lr to 0");
}

absl::Status CheckLinkCodecsSmaller(const ResolvedJobSpec& resolved) {
  const v1::JobSpec& spec = resolved.spec;
  const int64_t micro_batch_size =
      spec.training().batch_size() / std::max(1, spec.training().micro_batches());
  const int64_t seq_len = spec.training().seq_len();
  const int64_t d_model = spec.model().d_model();
  const int64_t raw = 4 * micro_batch_size * seq_len * d_model;
  const std::pair<const char*, const std::string*> links[] = {
      {"spec.compression.forward", &spec.compression().forward()},
      {"spec.compression.backward", &spec.compression().backward()}};
  for (const auto& [path, codec] : links) {
    if (codec->empty() || *codec == kCodecNone) continue;
    absl::StatusOr<std::unique_ptr<Codec>> made = MakeCodec(*codec);
    if (!made.ok()) return Invalid(path, made.status().message());
    const int64_t encoded = (*made)->EncodedBytes({micro_batch_size, seq_len, d_model});
    if (encoded >= raw) {
      return Invalid(path, absl::StrCat("\"", *codec, "\" sends ", encoded,
                                        " bytes for each link tensor [", micro_batch_size, ", ",
                                        seq_len, ", ", d_model, "], more than its ", raw,
                                        " bytes in fp32: lower the rank (PowerSGD is smaller "
                                        "only below rows x cols / (rows + cols)), or use none"));
    }
  }
  return absl::OkStatus();
}

int JobWorkers(const ResolvedJobSpec& resolved) {
  if (resolved.data_parallel == kDataParallelAuto) return resolved.layout_workers;
  return resolved.data_parallel * resolved.stages * resolved.tensor_parallel;
}

std::vector<int> DataParallelDegrees(int workers, int micro_batches, int units, int tensor) {
  std::vector<int> degrees;
  if (tensor < 1 || workers % tensor != 0) return degrees;
  const int groups = workers / tensor;  // one per stage of one replica's
  for (int d = 1; d <= groups; ++d) {
    if (groups % d == 0 && micro_batches % d == 0 && groups / d <= units) degrees.push_back(d);
  }
  return degrees;
}

absl::Status TensorSplitStatus(const v1::JobSpec& spec, int tensor_parallel) {
  GptConfig config;
  config.vocab_size = spec.model().vocab_size();
  config.n_head = spec.model().n_head();
  config.d_model = spec.model().d_model();
  const int micro_batches = std::max(1, spec.training().micro_batches());
  const int64_t samples = spec.training().batch_size() / micro_batches;
  return spec.parallelism().tensor_mode() == "3d"
             ? ValidateCubeTensorParallel(config, tensor_parallel, samples)
             : ValidateTensorParallel(config, tensor_parallel, kMaxVocabSize);
}

std::vector<std::pair<int, std::string>> UnsplitTensorRanks(const v1::JobSpec& spec, int workers) {
  // Other counts are no candidates by number alone: saying why their
  // split fails would be noise.
  const bool cube = spec.parallelism().tensor_mode() == "3d";
  std::vector<std::pair<int, std::string>> unsplit;
  for (int t = 2; t <= std::min(workers, kMaxTensorParallel); ++t) {
    if (workers % t != 0 || (cube && CubeEdge(t) == 0)) continue;
    const absl::Status split = TensorSplitStatus(spec, t);
    if (!split.ok()) unsplit.emplace_back(t, std::string(split.message()));
  }
  return unsplit;
}

std::vector<LayoutDegrees> AutoLayoutDegrees(const v1::JobSpec& spec, int workers) {
  const v1::ParallelismSpec& p = spec.parallelism();
  const int units = 2 * spec.model().n_layer() + 2;
  const int micro_batches = spec.training().micro_batches();
  std::vector<int> tensors;
  if (SpecTensor(p) != kTensorParallelAuto) {
    tensors.push_back(SpecTensor(p));
  } else if (micro_batches >= 1) {
    for (int t = 1; t <= std::min(workers, kMaxTensorParallel); ++t) {
      if (workers % t == 0 && TensorSplitStatus(spec, t).ok()) tensors.push_back(t);
    }
  }
  std::vector<LayoutDegrees> layouts;
  for (int t : tensors) {
    for (int d : DataParallelDegrees(workers, micro_batches, units, t)) {
      layouts.push_back(LayoutDegrees{d, workers / (d * t), t});
    }
  }
  return layouts;
}

absl::StatusOr<ResolvedJobSpec> ResolveAsAutoLayout(
    const v1::JobSpec& spec, int workers,
    const v1::DataParallelCompressionSpec& data_parallel_compression,
    const v1::ParallelismSpec* submitted_parallelism) {
  v1::JobSpec automatic = spec;
  v1::ParallelismSpec* p = automatic.mutable_parallelism();
  if (submitted_parallelism != nullptr) {
    p->set_tensor(SpecTensor(*submitted_parallelism));
    p->set_tensor_partitions(submitted_parallelism->tensor_partitions());
    p->set_tensor_compression(submitted_parallelism->tensor_compression());
    p->set_tensor_mode(submitted_parallelism->tensor_mode());
    p->set_tensor_partitions_tune_steps(submitted_parallelism->tensor_partitions_tune_steps());
  }
  const std::vector<LayoutDegrees> layouts = AutoLayoutDegrees(automatic, workers);
  // The codec, unless no layout of these workers has replicas to
  // compress (a job going on after losses is not refused for it); the
  // tensor fields alike, unless no layout has tensor ranks to apply them.
  automatic.mutable_compression()->clear_data_parallel();
  if (std::any_of(layouts.begin(), layouts.end(),
                  [](const LayoutDegrees& l) { return l.data_parallel >= 2; })) {
    *automatic.mutable_compression()->mutable_data_parallel() = data_parallel_compression;
    automatic.mutable_compression()->mutable_data_parallel()->clear_stages();
  }
  if (SpecTensor(*p) == kTensorParallelAuto &&
      std::none_of(layouts.begin(), layouts.end(),
                   [](const LayoutDegrees& l) { return l.tensor_parallel >= 2; })) {
    p->clear_tensor_partitions();
    p->clear_tensor_compression();
    p->clear_tensor_partitions_tune_steps();
  }
  p->set_data(kDataParallelAuto);
  p->set_stages(0);
  p->set_workers(workers);
  automatic.mutable_elastic()->clear_min_workers();
  automatic.mutable_elastic()->clear_max_workers();
  return ResolveJobSpec(automatic);
}

absl::StatusOr<ResolvedJobSpec> ResolveDataParallelLayout(const ResolvedJobSpec& auto_spec,
                                                          const LayoutDegrees& layout) {
  if (auto_spec.data_parallel != kDataParallelAuto) {
    return Invalid("spec.parallelism.data", "the job's replicas are already chosen");
  }
  const int workers = auto_spec.layout_workers;
  const std::vector<LayoutDegrees> layouts = AutoLayoutDegrees(auto_spec.spec, workers);
  if (std::find(layouts.begin(), layouts.end(), layout) == layouts.end()) {
    std::vector<std::string> accepted;
    for (const LayoutDegrees& l : layouts) {
      accepted.push_back(absl::StrCat(l.data_parallel, " x ", l.stages, " x ", l.tensor_parallel));
    }
    return Invalid(
        "spec.parallelism.data",
        absl::StrCat(layout.data_parallel, " replicas x ", layout.stages, " stages x ",
                     layout.tensor_parallel, " tensor ranks is not a layout of ", workers,
                     " workers (accepted: ", absl::StrJoin(accepted, ", "), ")"));
  }
  return ResolveJobSpec(LayoutSpec(auto_spec.spec, layout));
}

absl::StatusOr<ResolvedJobSpec> ResolveDataParallelLayout(const ResolvedJobSpec& auto_spec,
                                                          int data_parallel) {
  if (auto_spec.data_parallel != kDataParallelAuto) {
    return Invalid("spec.parallelism.data", "the job's replicas are already chosen");
  }
  if (auto_spec.tensor_parallel == kTensorParallelAuto) {
    return Invalid("spec.parallelism.tensor",
                   "0 (auto): the layout names its tensor ranks too (LayoutDegrees)");
  }
  const int workers = auto_spec.layout_workers;
  const int tensor = auto_spec.tensor_parallel;
  const std::vector<int> degrees = DataParallelDegrees(
      workers, auto_spec.train.micro_batches, 2 * auto_spec.train.model.n_layer + 2, tensor);
  if (std::find(degrees.begin(), degrees.end(), data_parallel) == degrees.end()) {
    return Invalid("spec.parallelism.data",
                   absl::StrCat(data_parallel, " replicas is not a layout of ", workers,
                                " workers (accepted: ", absl::StrJoin(degrees, ", "), ")"));
  }
  return ResolveDataParallelLayout(
      auto_spec, LayoutDegrees{data_parallel, workers / (data_parallel * tensor), tensor});
}

absl::StatusOr<ResolvedJobSpec> ResolveJobSpec(const v1::JobSpec& spec) {
  // A binary spec (gRPC) may carry fields this coordinator does not know:
  // they would be stored and sent back with the job (up to the request's
  // 4 MiB each time) while meaning nothing here. JSON specs are parsed
  // refusing unknown names already.
  if (std::optional<UnknownField> unknown = FirstUnknownField(spec, "spec")) {
    return Invalid(unknown->message, absl::StrCat("has field number ", unknown->number,
                                                  ", which this coordinator does not know (a "
                                                  "newer client's field?); remove it"));
  }
  if (!spec.has_model()) return Invalid("spec.model", "required (n_layer, n_head, d_model)");
  if (!spec.has_training()) {
    return Invalid("spec.training", "required (seq_len, batch_size, steps)");
  }
  if (!spec.has_parallelism()) return Invalid("spec.parallelism", "required (stages)");
  RETURN_IF_ERROR(RequireMaxBytes("spec.name", spec.name(), kMaxJobNameBytes));
  // Listed on every user's terminal (pipetrain jobs).
  if (const std::optional<size_t> at = FirstTerminalControl(spec.name())) {
    return Invalid("spec.name",
                   absl::StrCat("has a control character at byte ", *at,
                                " (escape sequences, line breaks and bidirectional overrides "
                                "are not allowed: others' terminals list the name)"));
  }
  if (spec.parallelism().has_data() && spec.parallelism().data() == kDataParallelAuto) {
    return ResolveAutoLayout(spec);
  }
  if (spec.parallelism().has_workers()) {
    return Invalid("spec.parallelism.workers",
                   "only with spec.parallelism.data 0 (auto); otherwise the job's workers are "
                   "data x stages x tensor");
  }
  ResolvedJobSpec resolved;
  resolved.spec = spec;
  v1::JobSpec& out = resolved.spec;
  RETURN_IF_ERROR(ResolveModel(out.mutable_model()));
  RETURN_IF_ERROR(ResolveTrainingSizes(out.mutable_training()));
  RETURN_IF_ERROR(ResolveOptimizer(out.mutable_training()));
  RETURN_IF_ERROR(ResolveMaxSeqLen(out.mutable_model(), out.training().seq_len()));
  RETURN_IF_ERROR(CheckModelSize(out.model()));
  RETURN_IF_ERROR(ResolveData(out.mutable_data(), out.model().vocab_size(), &resolved.data_format));
  RETURN_IF_ERROR(ResolveParallelism(out.mutable_parallelism(), out.model().n_layer()));
  RETURN_IF_ERROR(ResolveDataParallel(&out));
  RETURN_IF_ERROR(CheckEvalHasData(out));
  RETURN_IF_ERROR(CheckGeneratedSplits(out));
  RETURN_IF_ERROR(CheckOutput(out.output()));
  RETURN_IF_ERROR(ResolveCompression(out.mutable_compression(), out.model().d_model()));
  RETURN_IF_ERROR(ResolveDataParallelCompression(&out, &resolved.data_parallel_powersgd_rank,
                                                 &resolved.data_parallel_quantizer));
  RETURN_IF_ERROR(ResolveScheduling(out.mutable_scheduling(), &resolved.queue_timeout));
  RETURN_IF_ERROR(ResolveElasticity(&out));
  RETURN_IF_ERROR(ResolveTensorParallel(&out));

  resolved.train = DeriveTrainConfig(out);
  RETURN_IF_ERROR(CheckMicroBatchTensors(resolved.train));
  absl::Status backstop = ValidateTrainConfig(resolved.train);
  if (!backstop.ok()) return Invalid("spec.training", backstop.message());
  resolved.val_fraction = out.data().val_fraction();
  resolved.synthetic_bytes = out.data().synthetic_bytes();
  resolved.stages = out.parallelism().stages();
  resolved.data_parallel = out.parallelism().data();
  resolved.tensor_parallel = out.parallelism().tensor();
  resolved.tensor_partitions = out.parallelism().tensor_partitions();
  resolved.tensor_compression = out.parallelism().tensor_compression();
  resolved.tensor_mode = out.parallelism().tensor_mode();
  resolved.tensor_partitions_tune_steps = out.parallelism().tensor_partitions_tune_steps();
  resolved.solver = out.parallelism().solver();
  resolved.objective = out.parallelism().objective();
  resolved.schedule = out.parallelism().schedule();
  return resolved;
}

absl::StatusOr<v1::JobSpec> JobSpecFromJson(std::string_view json) {
  // The parser's own words for nothing at all ("Unexpected end of string.
  // Expected a value.") say little to a client that sent no body.
  if (std::all_of(json.begin(), json.end(), absl::ascii_isspace)) {
    return absl::InvalidArgumentError(
        "spec: the JSON text is empty; send a JobSpec object (docs/api.md), e.g. {}");
  }
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;  // a misspelt field must not be silently dropped
  v1::JobSpec spec;
  // protobuf 3.21 returns its own util::Status, not absl::Status: convert.
  google::protobuf::util::Status status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &spec, options);
  if (!status.ok()) {
    // "(model.n_layer): invalid value ..." names the field as a path of
    // proto names: "spec.model.n_layer: ...", as the checks after parsing
    // name theirs, so the BadRequest violation names it too.
    const std::string text = status.message().ToString();
    // "(model) nLayers: Cannot find field." ("nLayers: ..." at the top):
    // named as the other checks name fields, so that the BadRequest
    // violation names the unknown field itself.
    constexpr absl::string_view kUnknown = ": Cannot find field.";
    if (absl::EndsWith(text, kUnknown) && text.size() <= 512) {
      absl::string_view head(text.data(), text.size() - kUnknown.size());
      std::string path;
      const size_t paren = head.find(") ");
      if (!head.empty() && head[0] == '(' && paren != absl::string_view::npos) {
        path = absl::StrCat(head.substr(1, paren - 1), ".");
        head.remove_prefix(paren + 2);
      }
      const std::string field = absl::StrCat(path, head);
      if (!head.empty() && std::all_of(field.begin(), field.end(), [](char c) {
            return absl::ascii_isalnum(c) || c == '_' || c == '.';
          })) {
        const std::string near = NearestFieldName(path, head);
        return absl::InvalidArgumentError(
            absl::StrCat("spec.", field, ": unknown field",
                         near.empty() ? "" : absl::StrCat("; did you mean ", near, "?"),
                         " (proto/pipetrain/v1/job.proto lists JobSpec's fields)"));
      }
    }
    const size_t close = text.find("): ");
    if (!text.empty() && text[0] == '(' && close != std::string::npos && close <= 256 &&
        close > 1 && std::all_of(text.begin() + 1, text.begin() + close, [](char c) {
          return absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '_' || c == '.';
        })) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.", text.substr(1, close - 1), ": ", text.substr(close + 3)));
    }
    return absl::InvalidArgumentError(absl::StrCat("spec: ", text));
  }
  return spec;
}

std::string JobSpecToJson(const v1::JobSpec& spec) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  std::string json;
  google::protobuf::util::Status status =
      google::protobuf::util::MessageToJsonString(spec, &json, options);
  // Printing a generated message without Any fields cannot fail; an empty
  // result would be the only sign if it ever did.
  if (!status.ok()) return std::string();
  return json;
}

}  // namespace pipetrain
