// GELU on the GPU, the CUDA twin of kernels/cpu/gelu.h (same tanh
// approximation and formula):
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   dx = dy * gelu'(x)
// Kernels/cuda/gelu_test.cc checks both against the CPU versions.
//
// Pointers are device pointers to n floats; n >= 0 (n == 0 launches nothing).
// y may alias x and dx may alias dy (each element is read before it is
// written by the same thread). The work is queued on `stream` and these
// return before it finishes. INVALID_ARGUMENT if n < 0; INTERNAL if the
// launch fails. Thread-safe (no state).
#ifndef PIPETRAIN_KERNELS_CUDA_GELU_H_
#define PIPETRAIN_KERNELS_CUDA_GELU_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace pipetrain {

absl::Status GeluForwardCuda(const float* x, int64_t n, float* y, cudaStream_t stream = nullptr);

absl::Status GeluBackwardCuda(const float* x, const float* dy, int64_t n, float* dx,
                              cudaStream_t stream = nullptr);

// The GPU issue's fused bias + GELU, for a linear layer's output computed
// without its bias: y[i][j] += b[j] (in place, the add LinearForward does)
// and g[i][j] = gelu(y[i][j]) in one pass over y [n, c] (rows of c);
// GeluForwardCuda's formula, so g is bitwise what it gives for the new y.
// b holds c floats; g must not overlap y or b. INVALID_ARGUMENT if n < 0 or
// c < 1; n == 0 launches nothing.
absl::Status BiasGeluForwardCuda(const float* b, int n, int c, float* y, float* g,
                                 cudaStream_t stream = nullptr);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_GELU_H_
