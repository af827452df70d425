// LayerNorm over the last dimension on the GPU, the CUDA twin of
// kernels/cpu/layernorm.h (same formulas; kLayerNormEps = 1e-5 for GPT-2).
//
// Forward: for each of n rows of c values, y = (x - mean) * rstd * w + b with
// rstd = 1 / sqrt(var + eps) (biased variance, two-pass). Stores mean[n] and
// rstd[n] for the backward pass. Backward writes dx and ACCUMULATES into dw[c]
// and db[c], as the CPU version does.
//
// All pointers are device pointers: x, y, dy, dx hold n * c floats; w, b, dw,
// db hold c; mean, rstd hold n. Outputs must not overlap inputs. Work is
// queued on `stream`; these return before it finishes. Results are bitwise
// deterministic run to run (fixed reduction order, no atomics; dw and db
// are summed over chunks of rows in parallel, kernels/cuda/column_sums.cuh).
// INVALID_ARGUMENT if n < 0 or c < 1; INTERNAL if a launch fails;
// RESOURCE_EXHAUSTED if the backward's scratch cannot be had. n == 0
// launches nothing. Thread-safe (no state).
#ifndef PIPETRAIN_KERNELS_CUDA_LAYERNORM_H_
#define PIPETRAIN_KERNELS_CUDA_LAYERNORM_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace pipetrain {

absl::Status LayerNormForwardCuda(const float* x, const float* w, const float* b, int n, int c,
                                  float eps, float* y, float* mean, float* rstd,
                                  cudaStream_t stream = nullptr);

absl::Status LayerNormBackwardCuda(const float* x, const float* w, const float* mean,
                                   const float* rstd, const float* dy, int n, int c, float* dx,
                                   float* dw, float* db, cudaStream_t stream = nullptr);

// The backward fused with the residual connection around the LayerNorm's
// block (the GPU issue's residual + LayerNorm kernel): dx = the LayerNorm's
// input gradient + residual (n * c floats, the block's output gradient that
// the skip path passes on), in the same pass; dw and db as above. Bitwise
// LayerNormBackwardCuda followed by AddInPlaceCuda(dx, residual) (one
// rounded addition per element, not fused with the product before it),
// without that second pass over three tensors. residual must not overlap
// dx. A null residual is LayerNormBackwardCuda. Errors as above.
absl::Status LayerNormBackwardResidualCuda(const float* x, const float* w, const float* mean,
                                           const float* rstd, const float* dy,
                                           const float* residual, int n, int c, float* dx,
                                           float* dw, float* db, cudaStream_t stream = nullptr);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_LAYERNORM_H_
