// Hyperparameters of a training run, shared by train-local and (later) the
// pipeline jobs, with one validation routine for both.
#ifndef PIPETRAIN_WORKER_TRAIN_TRAIN_CONFIG_H_
#define PIPETRAIN_WORKER_TRAIN_TRAIN_CONFIG_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/adamw.h"
#include "worker/model/gpt_config.h"
#include "worker/train/adamw_optimizer.h"

namespace pipetrain {

// How the learning rate moves over the steps (lr_schedule.h).
enum class LrSchedule { kConstant, kCosine };

struct TrainConfig {
  GptConfig model;
  int seq_len = 64;        // tokens per sequence; <= model.max_seq_len
  int batch_size = 8;      // sequences per optimizer step
  int micro_batches = 1;   // gradient accumulation: batch_size / micro_batches each
  int64_t steps = 100;
  AdamWConfig adam;
  DecayPolicy decay = DecayPolicy::kMatricesOnly;
  uint64_t seed = 1;       // initialisation and data order
  int eval_interval = 0;   // evaluate every N steps (and at the end); 0 = never
  int eval_windows = 16;   // validation windows per evaluation
  int threads = 1;         // OpenBLAS threads
  // Gradient clipping by the global L2 norm over every parameter (the
  // tied embedding once); 0 = off (grad_clip.h).
  float grad_clip = 0;
  // Learning rate: adam.lr after a linear warm-up of warmup_steps steps;
  // kCosine then decays it towards min_lr, reached one step after the last
  // (lr_schedule.h has the formula).
  LrSchedule lr_schedule = LrSchedule::kConstant;
  int64_t warmup_steps = 0;
  float min_lr = 0;
};

// INVALID_ARGUMENT naming the offending field and value: model shape (see
// ValidateGptConfig), seq_len < 1 or > max_seq_len, batch_size < 1,
// micro_batches < 1 or not dividing batch_size, a parameter (d_model) or a
// micro-batch's tensor (micro_batches) of more than kMaxTensorElements,
// steps < 0, lr <= 0 or not finite, betas outside [0, 1), eps <= 0 or not
// finite, weight_decay < 0 or not finite, eval_interval < 0,
// eval_windows < 1, threads < 1, grad_clip < 0 or not finite,
// warmup_steps outside [0, steps], min_lr outside [0, lr].
absl::Status ValidateTrainConfig(const TrainConfig& config);

// The most elements a tensor may hold: the kernels index with int.
inline constexpr double kMaxTensorElements = 2147483647.0;

// The largest tensors training `model` allocates, in elements, each to
// compare with kMaxTensorElements: a parameter (wte, wpe, an MLP matrix),
// and one of a micro-batch of `sequences` x `seq_len` tokens (logits, the
// MLP's hidden layer, a head's attention scores). In double: products of
// int32 factors can overflow int64, and a double is exact enough at 2^31.
struct LargestTensors {
  double parameter = 0;
  double activation = 0;
};
LargestTensors LargestTensorElements(const GptConfig& model, double sequences, int seq_len);

// RESOURCE_EXHAUSTED when the model's fp32 weights, their gradients and
// both AdamW moments (16 bytes a parameter) alone exceed `limit_bytes`
// (0: no limit), naming both sizes: a lower bound of what training needs,
// checked before anything is allocated (a failed allocation aborts).
absl::Status CheckWeightsFitMemory(const GptConfig& model, int64_t limit_bytes);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRAIN_TRAIN_CONFIG_H_
