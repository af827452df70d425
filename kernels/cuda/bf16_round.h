// Rounding fp32 to bf16 on the GPU, for the bf16 GEMM mode's operands
// (kernels/cuda/linear.cc): cuBLAS multiplies bf16 matrices on the tensor
// cores about twice as fast as fp32 matrices it narrows itself
// (CUBLAS_COMPUTE_32F_FAST_16BF), measured on an H200 (docs/benchmarks.md).
//
// Rounding is to nearest, ties to even (__float2bfloat16_rn): bitwise what
// kernels/cpu/flash_attention.h RoundToBf16 and the bf16 codec's
// FloatToBf16 give, which bf16_round_test checks. Inf and NaN stay Inf and
// NaN; a finite value beyond bf16's range becomes the infinity of its sign.
#ifndef PIPETRAIN_KERNELS_CUDA_BF16_ROUND_H_
#define PIPETRAIN_KERNELS_CUDA_BF16_ROUND_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/stream_scratch.h"

namespace pipetrain {

// y[i] = the bf16 bits of x[i] rounded, i in [0, n); device pointers, y
// not overlapping x. Queues the work on `stream` and returns.
// INVALID_ARGUMENT for n < 0 (n == 0 launches nothing); INTERNAL if the
// launch fails.
absl::Status RoundToBf16Cuda(const float* x, int64_t n, uint16_t* y, cudaStream_t stream);

// The same over `lines` lines of `length` elements each, line i of x at
// x + i * x_stride and of y at y + i * y_stride (strides >= length): how a
// matrix is copied into another leading dimension, e.g. padded so that
// every line starts 16-byte aligned. INVALID_ARGUMENT for a negative count
// or a stride below `length`; nothing is launched when lines or length is 0.
absl::Status RoundToBf16StridedCuda(const float* x, int64_t lines, int64_t length, int64_t x_stride,
                                    uint16_t* y, int64_t y_stride, cudaStream_t stream);

// x[0, count) rounded as RoundToBf16Cuda into new stream scratch
// (stream_scratch.h) of `count` bf16 values on `stream`: the copy a bf16
// GEMM multiplies. The scratch may go back once the work that reads it is
// queued on the same stream. Errors as RoundToBf16Cuda, or the scratch's.
absl::StatusOr<StreamScratch> Bf16CopyCuda(const float* x, int64_t count, cudaStream_t stream);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_BF16_ROUND_H_
