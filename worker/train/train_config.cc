#include "worker/train/train_config.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

absl::Status Invalid(const char* field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

}  // namespace

LargestTensors LargestTensorElements(const GptConfig& model, double sequences, int seq_len) {
  const double d = model.d_model, vocab = model.vocab_size;
  const double tokens = sequences * seq_len;
  return {std::max({vocab * d, static_cast<double>(model.max_seq_len) * d, 4 * d * d}),
          std::max({tokens * vocab, tokens * 4 * d, tokens * model.n_head * seq_len})};
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
  // The kernels index tensors with int: no parameter, and no tensor a
  // micro-batch's passes allocate, may reach 2^31 elements (the profiler
  // checks the same, unit_profiler.cc).
  const double sequences = c.batch_size / c.micro_batches;
  const LargestTensors largest = LargestTensorElements(c.model, sequences, c.seq_len);
  if (largest.parameter > kMaxTensorElements) {
    return Invalid("d_model", absl::StrCat("a parameter tensor would hold ", largest.parameter,
                                           " elements, above 2^31 - 1; shrink d_model, "
                                           "vocab_size or max_seq_len"));
  }
  if (largest.activation > kMaxTensorElements) {
    return Invalid("micro_batches",
                   absl::StrCat("a micro-batch of ", sequences, " sequences of ", c.seq_len,
                                " tokens needs a tensor of ", largest.activation,
                                " elements (logits, MLP or attention scores), above 2^31 - 1; "
                                "use more micro-batches or a shorter seq_len"));
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
