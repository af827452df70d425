// Element-wise sums on the GPU, the CUDA twins of kernels/cpu/elementwise.h.
// The model uses them for the residual connections and gradient sums:
//   forward   y = x + f(x)           AddCuda(f_x, x, n, y)
//   backward  dx = dy + (f's input gradient)
//                                    AddInPlaceCuda(dx, dy, n), dx holding f's
//                                    input gradient (the skip passes dy as is)
// and to add a gradient arriving in parts (AddInPlaceCuda); SubtractCuda
// leaves error feedback's residual, meant minus delivered
// (kernels/compress/error_feedback.h), on the device.
// Kernels/cuda/elementwise_test.cc checks both against the CPU versions.
//
// Pointers are device pointers to n floats; n >= 0 (n == 0 launches
// nothing). Each is one correctly rounded fp32 addition (or subtraction) per
// element, so the
// results equal the CPU's bitwise. The work is queued on `stream` and these
// return before it finishes. INVALID_ARGUMENT if n < 0; INTERNAL if the
// launch fails. Thread-safe (no state).
#ifndef PIPETRAIN_KERNELS_CUDA_ELEMENTWISE_H_
#define PIPETRAIN_KERNELS_CUDA_ELEMENTWISE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace pipetrain {

// out[i] = a[i] + b[i]. out may be a or b (or both inputs the same buffer);
// otherwise the three must not overlap.
absl::Status AddCuda(const float* a, const float* b, int64_t n, float* out,
                     cudaStream_t stream = nullptr);

// acc[i] += x[i]. x may be acc (doubling it); otherwise they must not overlap.
absl::Status AddInPlaceCuda(float* acc, const float* x, int64_t n,
                            cudaStream_t stream = nullptr);

// out[i] = a[i] - b[i]. Aliasing as AddCuda.
absl::Status SubtractCuda(const float* a, const float* b, int64_t n, float* out,
                          cudaStream_t stream = nullptr);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_ELEMENTWISE_H_
