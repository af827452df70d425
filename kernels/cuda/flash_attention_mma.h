// Internal to flash_attention.cu: FlashKernel::kMma's kernels
// (flash_attention_mma.cu). Same formulas, layouts, precision and
// arguments as flash_attention.h's functions, which check the shapes and
// compute D (row_dots) before calling these. hd = c / heads <=
// kFlashAttentionMaxHeadDim; batch >= 1. INTERNAL if a launch fails.
#ifndef PIPETRAIN_KERNELS_CUDA_FLASH_ATTENTION_MMA_H_
#define PIPETRAIN_KERNELS_CUDA_FLASH_ATTENTION_MMA_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace pipetrain {

absl::Status FlashMmaForward(const float* qkv, int batch, int seq_len, int c, int heads, float* out,
                             float* lse, cudaStream_t stream);

// dqkv from qkv, dout, the forward's lse and D = rowsum(dout * out).
absl::Status FlashMmaGradients(const float* qkv, const float* dout, const float* lse,
                               const float* row_dots, int batch, int seq_len, int c, int heads,
                               float* dqkv, cudaStream_t stream);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_FLASH_ATTENTION_MMA_H_
