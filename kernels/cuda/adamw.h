// AdamW on the GPU, the CUDA twin of kernels/cpu/adamw.h: the same update,
// bias correction and decoupled weight decay, with the same arguments
// (AdamWConfig is shared with the CPU version):
//   p <- p * (1 - lr * weight_decay)          (only if apply_decay)
//   m <- beta1 m + (1 - beta1) g,   v <- beta2 v + (1 - beta2) g^2
//   p <- p - lr * (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps)
// `step` is the 1-based count of updates including this one; the bias
// corrections are computed on the host in double, as on the CPU.
// Kernels/cuda/adamw_test.cc checks it against the CPU version (run on an
// H200: docs/gpu-results/).
//
// param, grad, m, v are device pointers to n floats each, pairwise
// non-overlapping. One thread per element (grid-stride), so the result does
// not depend on the launch geometry and is bitwise reproducible run to run.
// The work is queued on `stream`; the call returns before it finishes.
// INVALID_ARGUMENT if n < 0, step < 1, or beta1 or beta2 is outside [0, 1)
// (the bias correction would divide by zero or flip sign); INTERNAL if the
// launch fails. n == 0 launches nothing. Thread-safe (no state).
#ifndef PIPETRAIN_KERNELS_CUDA_ADAMW_H_
#define PIPETRAIN_KERNELS_CUDA_ADAMW_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/adamw.h"

namespace pipetrain {

absl::Status AdamWUpdateCuda(float* param, const float* grad, float* m, float* v, int64_t n,
                             int64_t step, const AdamWConfig& config, bool apply_decay,
                             cudaStream_t stream = nullptr);

// Tensors per launch of AdamWUpdateAllCuda (their pointers travel in the
// kernel's arguments, which CUDA caps at 4 KiB).
inline constexpr int kAdamWTensorsPerLaunch = 48;

// AdamWUpdateCuda of every tensor (the GPU issue's multi-tensor step): one
// launch per kAdamWTensorsPerLaunch tensors. AdamWUpdateCuda is this with
// one tensor (the same kernel), so the results are bitwise its. Errors as
// AdamWUpdateCuda's, INVALID_ARGUMENT naming the tensor's index for a
// negative count, all checked before anything is launched.
absl::Status AdamWUpdateAllCuda(const AdamWTensor* tensors, int count, int64_t step,
                                const AdamWConfig& config, cudaStream_t stream = nullptr);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_ADAMW_H_
