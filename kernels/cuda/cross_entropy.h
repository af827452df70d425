// Fused softmax + cross-entropy on the GPU, the CUDA twin of
// kernels/cpu/cross_entropy.h (same formulas; the forward's normaliser is
// summed online, in one read of the row, so it rounds differently):
//   probs[i, :]    = softmax(logits[i, :])          (max subtracted first)
//   row_losses[i]  = logsumexp(logits[i, :]) - logits[i, targets[i]]
//   *loss          = (1/n) sum_i row_losses[i]      (summed in double)
//   dlogits[i, :]  = (probs[i, :] - onehot(targets[i])) * dloss / n
//
// All pointers are device pointers: logits, probs, dlogits hold n rows of
// vocab floats, row i at i * ld (ld >= vocab; the floats between rows are
// neither read nor written); targets holds n int32; row_losses holds n
// floats (kept so the mean is reduced in a fixed order, and useful as
// per-position losses); loss is one float, left on the device so that the
// forward does not synchronise (copy it when the value is needed).
//
// Aliasing: probs may alias logits (softmax in place) and dlogits may alias
// probs, as on the CPU. Nothing else may overlap.
//
// Targets live on the device, so a target outside [0, vocab) cannot be
// reported as a Status without a copy to the host; instead the kernels never
// read out of bounds and make it visible as NaN: that row's loss (and so
// *loss) in the forward, that row of dlogits in the backward.
//
// Work is queued on `stream`; these return before it finishes. Results are
// bitwise deterministic run to run (fixed reduction order, no atomics).
// INVALID_ARGUMENT if n < 1 (the mean over no positions is undefined),
// vocab < 1 or ld < vocab; INTERNAL if a launch fails. Thread-safe (no state).
#ifndef PIPETRAIN_KERNELS_CUDA_CROSS_ENTROPY_H_
#define PIPETRAIN_KERNELS_CUDA_CROSS_ENTROPY_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace pipetrain {

absl::Status SoftmaxCrossEntropyForwardCuda(const float* logits, const int32_t* targets, int n,
                                            int vocab, int ld, float* probs, float* row_losses,
                                            float* loss, cudaStream_t stream = nullptr);

// dloss is the upstream gradient of the mean loss (1 for a plain loss).
absl::Status SoftmaxCrossEntropyBackwardCuda(const float* probs, const int32_t* targets, int n,
                                             int vocab, int ld, float dloss, float* dlogits,
                                             cudaStream_t stream = nullptr);

// The forward and the backward for dloss = 1 in one pass, for the LM
// head's bf16 products (lm_head.h's LmHeadBackwardBf16Cuda scales by the
// real dloss): row_losses and loss as SoftmaxCrossEntropyForwardCuda's
// (bitwise), and instead of the probabilities
//   gradient[i, :] = (probs[i, :] - onehot(targets[i])) / n
// rounded to bf16 (their bits; nearest even), bitwise
// SoftmaxCrossEntropyBackwardCuda's dlogits for dloss = 1 rounded as
// RoundToBf16Cuda does, with +0 in each row's ld - vocab padding columns.
// So the head keeps [n, ld] bf16 instead of fp32 probabilities, and its
// backward has no cross-entropy pass: llm.c fuses the two the same way.
// gradient must not overlap logits. Errors as the forward's.
absl::Status SoftmaxCrossEntropyForwardBf16GradientCuda(const float* logits, const int32_t* targets,
                                                        int n, int vocab, int ld,
                                                        uint16_t* gradient, float* row_losses,
                                                        float* loss, cudaStream_t stream = nullptr);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_CROSS_ENTROPY_H_
