// Hyperparameters of a training run, shared by train-local and (later) the
// pipeline jobs, with one validation routine for both.
#ifndef PIPETRAIN_WORKER_TRAIN_TRAIN_CONFIG_H_
#define PIPETRAIN_WORKER_TRAIN_TRAIN_CONFIG_H_

#include <cstdint>
#include <string>

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
  // The tensor ranks each stage is split over (spec.parallelism.tensor, 1-D
  // or a 3-D cube; 1: whole units, as train-local runs them): what one
  // rank's tensors hold (LargestTensorElements).
  int tensor_parallel = 1;
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
// micro_batches < 1 or not dividing batch_size, tensor_parallel < 1, a
// parameter (d_model) or a tensor one rank allocates for a micro-batch of
// more than kMaxTensorElements (micro_batches; seq_len when a micro-batch
// is already one sequence), steps < 0, lr <= 0 or not finite, betas
// outside [0, 1), eps <= 0 or not finite, weight_decay < 0 or not finite,
// eval_interval < 0, eval_windows < 1, threads < 1, grad_clip < 0 or not
// finite, warmup_steps outside [0, steps], min_lr outside [0, lr].
absl::Status ValidateTrainConfig(const TrainConfig& config);

// The most elements one tensor may hold. The kernels' offsets are int64,
// but they take some sizes as int: cuBLAS's m, n, k and leading
// dimensions, and a launch's rows (batch x heads x seq_len blocks for the
// attention's row kernels). Each is at most the elements of a tensor it
// describes, so this bound keeps all of them in range.
inline constexpr double kMaxTensorElements = 2147483647.0;

// The largest tensors training `model` allocates, in elements, each to
// compare with kMaxTensorElements: a parameter (wte, wpe, an MLP matrix;
// whole, as checkpoints gather them), and one that a tensor rank allocates
// for a micro-batch of `sequences` x `seq_len` tokens when each stage is
// split over `tensor_parallel` ranks. Such a rank holds the residual
// stream [tokens, d_model] whole, but only its share of what the ranks
// split (attention_unit.cc, mlp_unit.cc, head_unit.cc; a 3-D cube's
// blocks hold the same 1/T: n_head / p heads of samples / p^2): the
// logits [tokens, vocab / T] (rows padded to 64 floats, as the CUDA
// backend's), the MLP's hidden layer [tokens, 4 d_model / T] and the
// attention scores [sequences, n_head / T, seq_len, seq_len]. Shares
// round up where T does not divide. In double: products of int32 factors
// can overflow int64, and a double is exact enough at 2^31.
struct LargestTensors {
  double parameter = 0;
  double activation = 0;
  // Which tensor `activation` is ("attention scores", "logits", ...), and
  // whether more tensor ranks would shrink it.
  const char* activation_name = "";
  bool activation_split = false;
};
LargestTensors LargestTensorElements(const GptConfig& model, double sequences, int seq_len,
                                     int tensor_parallel = 1);
// ", on each of T tensor ranks" for T > 1, else "": where a message names
// the activation LargestTensorElements found.
std::string TensorRanksNote(int tensor_parallel);

// RESOURCE_EXHAUSTED when the model's fp32 weights, their gradients and
// both AdamW moments (16 bytes a parameter) alone exceed `limit_bytes`
// (0: no limit), naming both sizes: a lower bound of what training needs,
// checked before anything is allocated (a failed allocation aborts).
absl::Status CheckWeightsFitMemory(const GptConfig& model, int64_t limit_bytes);

// The bytes a micro-batch of `sequences` x `seq_len` tokens keeps alive on
// the CPU backend at its backward's peak: what each unit's forward saves
// for its backward (an attention layer's B·H·T² softmax probabilities, its
// input, LayerNorm output and statistics, q, k, v and the heads' output;
// an MLP's input, LayerNorm output and both [B·T, 4d] hidden layers; the
// head's [B·T, vocab] probabilities), plus the larger pass's temporaries
// (the head's logit gradient, or an attention backward's). The terms of
// the planner's AnalyticProfile with AnalyticAttention::kCpu
// (coordinator/planner/solve_plan.cc), which worker code does not depend
// on. Kernels' scratch vectors are not counted: a lower bound. In double,
// as LargestTensorElements.
double BackwardActivationBytes(const GptConfig& model, double sequences, int seq_len);

// RESOURCE_EXHAUSTED when the 16 bytes a parameter of CheckWeightsFitMemory
// plus the BackwardActivationBytes of one micro-batch (batch_size /
// micro_batches sequences) exceed `limit_bytes` (0: no limit), naming both
// sizes and the fields that shrink a micro-batch (batch_size,
// micro_batches, seq_len). Requires a config ValidateTrainConfig accepts.
// Checked, as CheckWeightsFitMemory, before anything is allocated: the
// attention's probabilities alone can be hundreds of times the weights.
absl::Status CheckActivationsFitMemory(const TrainConfig& config, int64_t limit_bytes);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRAIN_TRAIN_CONFIG_H_
