#include "worker/train/train_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

absl::Status Invalid(const char* field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

}  // namespace

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
  if (c.steps < 0) return Invalid("steps", absl::StrCat("must be >= 0, got ", c.steps));
  if (!(c.adam.lr > 0)) return Invalid("lr", absl::StrCat("must be > 0, got ", c.adam.lr));
  if (!(c.adam.beta1 >= 0 && c.adam.beta1 < 1)) {
    return Invalid("beta1", absl::StrCat("must be in [0, 1), got ", c.adam.beta1));
  }
  if (!(c.adam.beta2 >= 0 && c.adam.beta2 < 1)) {
    return Invalid("beta2", absl::StrCat("must be in [0, 1), got ", c.adam.beta2));
  }
  if (!(c.adam.eps > 0)) return Invalid("eps", absl::StrCat("must be > 0, got ", c.adam.eps));
  if (!(c.adam.weight_decay >= 0)) {
    return Invalid("weight_decay", absl::StrCat("must be >= 0, got ", c.adam.weight_decay));
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
