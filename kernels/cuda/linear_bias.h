// The two bias kernels of the cuBLAS linear layer (kernels/cuda/linear.h):
// cuBLAS has no broadcast or column sum, so these are the project's own.
// Callers outside linear.cc should use LinearForwardCuda/LinearBackwardCuda.
//
// Row-major matrices of n rows and c columns; all pointers are device
// pointers (b and db hold c floats, y and dy hold n * c). n >= 0, c >= 1;
// n == 0 launches nothing. Work is queued on `stream` and these return
// before it finishes. INVALID_ARGUMENT for a bad shape; INTERNAL if the
// launch fails. Thread-safe (no state).
#ifndef PIPETRAIN_KERNELS_CUDA_LINEAR_BIAS_H_
#define PIPETRAIN_KERNELS_CUDA_LINEAR_BIAS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace pipetrain {

// y[i][j] = b[j] for every row i: seeds y so that a GEMM with beta = 1 adds
// x W onto the bias, as kernels/cpu/linear.cc does.
absl::Status BroadcastRowsCuda(const float* b, int n, int c, float* y, cudaStream_t stream);

// y[i][j] = residual[i][j] + b[j] (or residual[i][j] when b is null): the
// seed for a GEMM with beta = 1 that ends a residual block (y = residual +
// x W + b), so the residual needs no pass of its own. residual holds n * c
// floats and must not overlap y.
absl::Status ResidualRowsCuda(const float* residual, const float* b, int n, int c, float* y,
                              cudaStream_t stream);

// db[j] += dy[0][j] + dy[1][j] + ... + dy[n-1][j], in two fixed-order
// stages over chunks of rows (column_sums.cuh; not the CPU's row-by-row
// order): no atomics, so the result is bitwise deterministic run to run.
// db must not overlap dy. Also RESOURCE_EXHAUSTED when its scratch (a few
// floats per column and 256 rows) cannot be had.
absl::Status AddColumnSumsCuda(const float* dy, int n, int c, float* db, cudaStream_t stream);

// AddColumnSumsCuda, and in the same pass dy16[i] = the bf16 bits of dy[i]
// rounded to nearest even (i < n * c): the bias gradient and the bf16 copy
// of dy that the bf16 GEMM mode's two backward products read, for one read
// of dy instead of two. db is bitwise AddColumnSumsCuda's (the same sums in
// the same order) and dy16 bitwise RoundToBf16Cuda's (bf16_round.h).
// dy16 holds n * c values and overlaps neither dy nor db.
absl::Status AddColumnSumsRoundingCuda(const float* dy, int n, int c, float* db, uint16_t* dy16,
                                       cudaStream_t stream);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_LINEAR_BIAS_H_
