#include <cuda_bf16.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/linear_bias.h"

namespace pipetrain {
namespace {

__global__ void BroadcastRowsKernel(const float* b, int64_t total, int c, float* y) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    y[i] = b[i % c];
  }
}

__global__ void ResidualRowsKernel(const float* residual, const float* b, int64_t total, int c,
                                   float* y) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    y[i] = b != nullptr ? residual[i] + b[i % c] : residual[i];
  }
}

// The terms of db[j] += sum_i dy[i][j], summed by column_sums.cuh.
struct BiasGradTerm {
  const float* dy;
  int c;
  __device__ void operator()(int64_t i, int j, float* v) const { v[0] = dy[i * c + j]; }
};

// BiasGradTerm, also writing the term's bf16 bits: the column sums visit
// every element once, so the copy costs no read of its own.
struct BiasGradRoundingTerm {
  const float* dy;
  int c;
  uint16_t* rounded;
  __device__ void operator()(int64_t i, int j, float* v) const {
    const int64_t at = i * c + j;
    v[0] = dy[at];
    rounded[at] = __bfloat16_as_ushort(__float2bfloat16_rn(v[0]));
  }
};

absl::Status CheckShape(const char* op, int n, int c) {
  if (n >= 0 && c >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": shape [", n, ", ", c, "] needs n >= 0 rows and c >= 1 columns"));
}

}  // namespace

absl::Status BroadcastRowsCuda(const float* b, int n, int c, float* y, cudaStream_t stream) {
  absl::Status valid = CheckShape("BroadcastRowsCuda", n, c);
  if (!valid.ok() || n == 0) return valid;
  const int64_t total = static_cast<int64_t>(n) * c;
  BroadcastRowsKernel<<<ElementwiseBlocks(total), kElementwiseThreads, 0, stream>>>(b, total, c, y);
  CUDA_CHECK_LAUNCH("BroadcastRowsKernel");
  return absl::OkStatus();
}

absl::Status ResidualRowsCuda(const float* residual, const float* b, int n, int c, float* y,
                              cudaStream_t stream) {
  absl::Status valid = CheckShape("ResidualRowsCuda", n, c);
  if (!valid.ok() || n == 0) return valid;
  const int64_t total = static_cast<int64_t>(n) * c;
  ResidualRowsKernel<<<ElementwiseBlocks(total), kElementwiseThreads, 0, stream>>>(residual, b,
                                                                                   total, c, y);
  CUDA_CHECK_LAUNCH("ResidualRowsKernel");
  return absl::OkStatus();
}

absl::Status AddColumnSumsCuda(const float* dy, int n, int c, float* db, cudaStream_t stream) {
  absl::Status valid = CheckShape("AddColumnSumsCuda", n, c);
  if (!valid.ok() || n == 0) return valid;
  return column_sums::ColumnSums<1>(BiasGradTerm{dy, c}, n, c, db, nullptr, stream,
                                    "bias gradient sums");
}

absl::Status AddColumnSumsRoundingCuda(const float* dy, int n, int c, float* db, uint16_t* dy16,
                                       cudaStream_t stream) {
  absl::Status valid = CheckShape("AddColumnSumsRoundingCuda", n, c);
  if (!valid.ok() || n == 0) return valid;
  return column_sums::ColumnSums<1>(BiasGradRoundingTerm{dy, c, dy16}, n, c, db, nullptr, stream,
                                    "bias gradient sums with dy's bf16 copy");
}

}  // namespace pipetrain
