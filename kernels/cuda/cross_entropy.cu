// The launches; the kernels are in cross_entropy_kernels.cuh.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/cross_entropy_kernels.cuh"
#include "kernels/cuda/cuda_status.h"

namespace pipetrain {
namespace {

absl::Status CheckShape(const char* op, int n, int vocab, int ld) {
  if (n >= 1 && vocab >= 1 && ld >= vocab) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": shape [", n, ", ", vocab,
                                                 "] with row stride ", ld,
                                                 " needs n >= 1 positions, vocab >= 1 classes "
                                                 "and a row stride >= vocab"));
}

}  // namespace

absl::Status SoftmaxCrossEntropyForwardCuda(const float* logits, const int32_t* targets, int n,
                                            int vocab, int ld, float* probs, float* row_losses,
                                            float* loss, cudaStream_t stream) {
  absl::Status valid = CheckShape("SoftmaxCrossEntropyForwardCuda", n, vocab, ld);
  if (!valid.ok()) return valid;
  SoftmaxCrossEntropyRowKernel<false>
      <<<n, kRowThreads, 0, stream>>>(logits, targets, vocab, ld, probs, 0.0f, nullptr, row_losses);
  CUDA_CHECK_LAUNCH("SoftmaxCrossEntropyRowKernel");
  MeanLossKernel<<<1, kMeanThreads, 0, stream>>>(row_losses, n, loss);
  CUDA_CHECK_LAUNCH("MeanLossKernel");
  return absl::OkStatus();
}

absl::Status SoftmaxCrossEntropyBackwardCuda(const float* probs, const int32_t* targets, int n,
                                             int vocab, int ld, float dloss, float* dlogits,
                                             cudaStream_t stream) {
  absl::Status valid = CheckShape("SoftmaxCrossEntropyBackwardCuda", n, vocab, ld);
  if (!valid.ok()) return valid;
  // The CPU's scale, computed the same way (float division on the host).
  const float scale = dloss / n;
  SoftmaxCrossEntropyBackwardKernel<<<n, kRowThreads, 0, stream>>>(probs, targets, vocab, ld, scale,
                                                                   dlogits);
  CUDA_CHECK_LAUNCH("SoftmaxCrossEntropyBackwardKernel");
  return absl::OkStatus();
}

absl::Status SoftmaxCrossEntropyForwardBf16GradientCuda(const float* logits, const int32_t* targets,
                                                        int n, int vocab, int ld,
                                                        uint16_t* gradient, float* row_losses,
                                                        float* loss, cudaStream_t stream) {
  absl::Status valid = CheckShape("SoftmaxCrossEntropyForwardBf16GradientCuda", n, vocab, ld);
  if (!valid.ok()) return valid;
  // SoftmaxCrossEntropyBackwardCuda's scale for dloss = 1.
  const float scale = 1.0f / n;
  SoftmaxCrossEntropyRowKernel<true><<<n, kRowThreads, 0, stream>>>(
      logits, targets, vocab, ld, nullptr, scale, gradient, row_losses);
  CUDA_CHECK_LAUNCH("SoftmaxCrossEntropyRowKernel");
  MeanLossKernel<<<1, kMeanThreads, 0, stream>>>(row_losses, n, loss);
  CUDA_CHECK_LAUNCH("MeanLossKernel");
  return absl::OkStatus();
}

}  // namespace pipetrain
