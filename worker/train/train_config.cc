#include "worker/train/train_config.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

absl::Status Invalid(const char* field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

}  // namespace

std::string TensorRanksNote(int tensor_parallel) {
  return tensor_parallel > 1 ? absl::StrCat(", on each of ", tensor_parallel, " tensor ranks")
                             : "";
}

LargestTensors LargestTensorElements(const GptConfig& model, double sequences, int seq_len,
                                     int tensor_parallel) {
  const double d = model.d_model, vocab = model.vocab_size;
  const double tokens = sequences * seq_len;
  // A rank's share of what the tensor ranks split (the largest one where T
  // does not divide), and its logits' row stride.
  const int64_t t = std::max(1, tensor_parallel);
  auto share = [t](int64_t whole) { return (whole + t - 1) / t; };
  constexpr int64_t kRowAlign = 64;  // CudaBackend::LogitsRowStride
  const double logits_ld =
      static_cast<double>((share(model.vocab_size) + kRowAlign - 1) / kRowAlign * kRowAlign);
  LargestTensors largest;
  largest.parameter = std::max({vocab * d, static_cast<double>(model.max_seq_len) * d, 4 * d * d});
  const struct {
    const char* name;
    double elements;
    bool split;
  } activations[] = {
      {"logits", tokens * logits_ld, true},
      {"MLP hidden layer", tokens * static_cast<double>(share(int64_t{4} * model.d_model)), true},
      {"attention scores", sequences * static_cast<double>(share(model.n_head)) * seq_len * seq_len,
       true},
      {"residual stream", tokens * d, false},
  };
  for (const auto& a : activations) {
    if (a.elements <= largest.activation) continue;
    largest.activation = a.elements;
    largest.activation_name = a.name;
    largest.activation_split = a.split;
  }
  return largest;
}

absl::Status CheckWeightsFitMemory(const GptConfig& model, int64_t limit_bytes) {
  const int64_t parameters = CountParameters(model);
  const double need = 16.0 * static_cast<double>(parameters);
  if (limit_bytes > 0 && need > static_cast<double>(limit_bytes)) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the model's %d parameters need %.2f GiB for weights, gradients and AdamW moments "
        "alone, but this process may use %.2f GiB (the least of RAM and its cgroup's limit); "
        "use fewer layers, a smaller d_model or vocabulary",
        parameters, need / (1 << 30), static_cast<double>(limit_bytes) / (1 << 30)));
  }
  return absl::OkStatus();
}

double BackwardActivationBytes(const GptConfig& model, double sequences, int seq_len) {
  const double d = model.d_model, vocab = model.vocab_size, t = seq_len;
  const double tokens = sequences * t;
  // In floats, per token: x, ln_out, qkv and att (6d) and the LayerNorm's
  // mean and rstd, then per head and row the probabilities; x, ln_out, fc
  // and act (10d) and the statistics; x, ln_out, the statistics and the
  // probabilities over the vocabulary.
  const double attention = tokens * (6 * d + 2) + sequences * model.n_head * t * t;
  const double mlp = tokens * (10 * d + 2);
  const double head = tokens * (2 * d + 2 + vocab);
  // The logit gradient and dln; or y, datt, dqkv, dln, dx and a [T, T]
  // scratch matrix.
  const double transient = std::max(tokens * (vocab + 2 * d), tokens * 7 * d + t * t);
  return 4 * (model.n_layer * (attention + mlp) + head + transient);
}

absl::Status CheckActivationsFitMemory(const TrainConfig& c, int64_t limit_bytes) {
  const double sequences = c.batch_size / c.micro_batches;
  const double weights = 16.0 * static_cast<double>(CountParameters(c.model));
  const double activations = BackwardActivationBytes(c.model, sequences, c.seq_len);
  if (limit_bytes <= 0 || weights + activations <= static_cast<double>(limit_bytes)) {
    return absl::OkStatus();
  }
  const double probabilities =
      4.0 * c.model.n_layer * sequences * c.model.n_head * c.seq_len * c.seq_len;
  constexpr double kGiB = 1 << 30;
  return absl::ResourceExhaustedError(absl::StrFormat(
      "a micro-batch of %g sequences of %d tokens keeps %.2f GiB of activations for its backward "
      "(%.2f GiB of them the attention's probabilities); with %.2f GiB for weights, gradients "
      "and AdamW moments that is %.2f GiB, but this process may use %.2f GiB (the least of RAM "
      "and its cgroup's limit); use a smaller batch_size, more micro_batches or a shorter seq_len",
      sequences, c.seq_len, activations / kGiB, probabilities / kGiB, weights / kGiB,
      (weights + activations) / kGiB, static_cast<double>(limit_bytes) / kGiB));
}

absl::Status ValidateTrainConfig(const TrainConfig& c) {
  RETURN_IF_ERROR(ValidateGptConfig(c.model));
  if (c.seq_len < 1) return Invalid("seq_len", absl::StrCat("must be >= 1, got ", c.seq_len));
  if (c.seq_len > c.model.max_seq_len) {
    return Invalid("seq_len", absl::StrCat(c.seq_len, " exceeds the model's max_seq_len ",
                                           c.model.max_seq_len));
  }
  if (c.batch_size < 1) {
    return Invalid("batch_size", absl::StrCat("must be >= 1, got ", c.batch_size));
  }
  if (c.micro_batches < 1 || c.batch_size % c.micro_batches != 0) {
    return Invalid("micro_batches", absl::StrCat(c.micro_batches, " must be >= 1 and divide "
                                                 "batch_size ", c.batch_size));
  }
  if (c.tensor_parallel < 1) {
    return Invalid("tensor_parallel", absl::StrCat("must be >= 1, got ", c.tensor_parallel));
  }
  // Some kernel sizes are int (kMaxTensorElements): no parameter, and no
  // tensor a rank allocates for a micro-batch, may reach 2^31 elements (the
  // profiler checks the same, unit_profiler.cc).
  const double sequences = c.batch_size / c.micro_batches;
  const LargestTensors largest =
      LargestTensorElements(c.model, sequences, c.seq_len, c.tensor_parallel);
  if (largest.parameter > kMaxTensorElements) {
    return Invalid("d_model", absl::StrCat("a parameter tensor would hold ", largest.parameter,
                                           " elements, above 2^31 - 1; shrink d_model, "
                                           "vocab_size or max_seq_len"));
  }
  if (largest.activation > kMaxTensorElements) {
    const std::string tensor = absl::StrFormat(
        "a tensor of %.0f elements (the %s%s), above 2^31 - 1", largest.activation,
        largest.activation_name, TensorRanksNote(c.tensor_parallel));
    // More micro-batches cannot help once each is one sequence. (Jobs hear
    // of tensor ranks from ResolveJobSpec; train-local has none.)
    if (sequences == 1) {
      return Invalid("seq_len", absl::StrCat("one sequence of ", c.seq_len, " tokens needs ",
                                             tensor, ", and a micro-batch is already one "
                                             "sequence; use a shorter seq_len"));
    }
    return Invalid("micro_batches",
                   absl::StrCat("a micro-batch of ", sequences, " sequences of ", c.seq_len,
                                " tokens needs ", tensor,
                                "; use more micro-batches or a shorter seq_len"));
  }
  if (c.steps < 0) return Invalid("steps", absl::StrCat("must be >= 0, got ", c.steps));
  // Finite too, as the job spec and the flags require: an infinite rate
  // or epsilon turns the first update into NaN weights.
  if (!(c.adam.lr > 0) || !std::isfinite(c.adam.lr)) {
    return Invalid("lr", absl::StrCat("must be > 0 and finite, got ", c.adam.lr));
  }
  if (!(c.adam.beta1 >= 0 && c.adam.beta1 < 1)) {
    return Invalid("beta1", absl::StrCat("must be in [0, 1), got ", c.adam.beta1));
  }
  if (!(c.adam.beta2 >= 0 && c.adam.beta2 < 1)) {
    return Invalid("beta2", absl::StrCat("must be in [0, 1), got ", c.adam.beta2));
  }
  if (!(c.adam.eps > 0) || !std::isfinite(c.adam.eps)) {
    return Invalid("eps", absl::StrCat("must be > 0 and finite, got ", c.adam.eps));
  }
  if (!(c.adam.weight_decay >= 0) || !std::isfinite(c.adam.weight_decay)) {
    return Invalid("weight_decay",
                   absl::StrCat("must be >= 0 and finite, got ", c.adam.weight_decay));
  }
  if (c.eval_interval < 0) {
    return Invalid("eval_interval", absl::StrCat("must be >= 0, got ", c.eval_interval));
  }
  if (c.eval_windows < 1) {
    return Invalid("eval_windows", absl::StrCat("must be >= 1, got ", c.eval_windows));
  }
  if (c.threads < 1) return Invalid("threads", absl::StrCat("must be >= 1, got ", c.threads));
  if (!(c.grad_clip >= 0) || !std::isfinite(c.grad_clip)) {
    return Invalid("grad_clip", absl::StrCat("must be >= 0 and finite, got ", c.grad_clip));
  }
  if (c.warmup_steps < 0 || c.warmup_steps > c.steps) {
    return Invalid("warmup_steps",
                   absl::StrCat("must be in [0, steps ", c.steps, "], got ", c.warmup_steps));
  }
  if (!(c.min_lr >= 0) || !(c.min_lr <= c.adam.lr)) {
    return Invalid("min_lr", absl::StrCat("must be in [0, lr ", c.adam.lr, "], got ", c.min_lr));
  }
  return absl::OkStatus();
}

}  // namespace pipetrain
