#include "kernels/cuda/layernorm.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/cuda_status.h"

namespace pipetrain {
namespace {

// One block per row. 256 threads: c = 768 (GPT-2 small) gives each thread
// three elements; wider rows loop.
constexpr int kRowThreads = 256;

__device__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum of v over the block, returned to every thread, in a fixed order (so
// results are deterministic). blockDim.x must be a multiple of 32 and at
// most 1024; scratch holds 33 floats. All threads must call it.
__device__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  v = WarpSum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : 0.0f;
    w = WarpSum(w);
    if (lane == 0) scratch[32] = w;
  }
  __syncthreads();
  const float total = scratch[32];
  __syncthreads();  // the caller's next BlockSum reuses scratch
  return total;
}

__global__ void LayerNormForwardKernel(const float* x, const float* w, const float* b, int c,
                                       float eps, float* y, float* mean, float* rstd) {
  __shared__ float scratch[33];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * c;
  float* yr = y + row * c;
  // Two passes, as on the CPU: the centred squares avoid the cancellation of
  // E[x^2] - E[x]^2 when activations have a large mean.
  float sum = 0.0f;
  for (int j = threadIdx.x; j < c; j += blockDim.x) sum += xr[j];
  const float m = BlockSum(sum, scratch) / c;
  float sq = 0.0f;
  for (int j = threadIdx.x; j < c; j += blockDim.x) {
    const float d = xr[j] - m;
    sq += d * d;
  }
  // 1/sqrtf (correctly rounded by default) rather than rsqrtf (2 ulp).
  const float r = 1.0f / sqrtf(BlockSum(sq, scratch) / c + eps);
  for (int j = threadIdx.x; j < c; j += blockDim.x) yr[j] = (xr[j] - m) * r * w[j] + b[j];
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w, plus
// residual[row] when it is not null: one rounded addition after the rounded
// gradient (__fadd_rn: nvcc may not fuse it with the product), so bitwise
// the gradient followed by AddInPlaceCuda.
__global__ void LayerNormInputGradKernel(const float* x, const float* w, const float* mean,
                                         const float* rstd, const float* dy, const float* residual,
                                         int c, float* dx) {
  __shared__ float scratch[33];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * c;
  const float* dyr = dy + row * c;
  float* dxr = dx + row * c;
  const float* res = residual != nullptr ? residual + row * c : nullptr;
  const float m = mean[row];
  const float r = rstd[row];
  float g_sum = 0.0f;
  float gx_sum = 0.0f;
  for (int j = threadIdx.x; j < c; j += blockDim.x) {
    const float g = __fmul_rn(dyr[j], w[j]);  // rounded, as on the CPU (no fma into g_sum)
    g_sum += g;
    gx_sum += g * ((xr[j] - m) * r);
  }
  const float g_mean = BlockSum(g_sum, scratch) / c;
  const float gx_mean = BlockSum(gx_sum, scratch) / c;
  for (int j = threadIdx.x; j < c; j += blockDim.x) {
    const float xhat = (xr[j] - m) * r;
    // g rounded as in the sums above (__fmul_rn: nvcc may not fuse it into
    // fma(dy, w, -g_mean)), so g - g_mean cancels exactly where the CPU's
    // does: for c == 1 a fused g would leave rstd (~316) times g's rounding
    // error in dx, where the CPU has 0.
    const float g = __fmul_rn(dyr[j], w[j]);
    const float v = r * (g - g_mean - xhat * gx_mean);
    dxr[j] = res != nullptr ? __fadd_rn(v, res[j]) : v;
  }
}

// The terms of dw[j] += sum_i dy[i][j] * xhat[i][j] and db[j] += sum_i
// dy[i][j], summed by column_sums.cuh (fixed order, rows in parallel).
struct ParamGradTerms {
  const float* x;
  const float* mean;
  const float* rstd;
  const float* dy;
  int c;
  __device__ void operator()(int64_t i, int j, float* v) const {
    const int64_t at = i * c + j;
    v[0] = dy[at] * ((x[at] - mean[i]) * rstd[i]);
    v[1] = dy[at];
  }
};

absl::Status CheckShape(const char* op, int n, int c) {
  if (n >= 0 && c >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": shape [", n, ", ", c, "] needs n >= 0 rows and c >= 1 columns"));
}

}  // namespace

absl::Status LayerNormForwardCuda(const float* x, const float* w, const float* b, int n, int c,
                                  float eps, float* y, float* mean, float* rstd,
                                  cudaStream_t stream) {
  absl::Status valid = CheckShape("LayerNormForwardCuda", n, c);
  if (!valid.ok() || n == 0) return valid;
  LayerNormForwardKernel<<<n, kRowThreads, 0, stream>>>(x, w, b, c, eps, y, mean, rstd);
  CUDA_CHECK_LAUNCH("LayerNormForwardKernel");
  return absl::OkStatus();
}

absl::Status LayerNormBackwardCuda(const float* x, const float* w, const float* mean,
                                   const float* rstd, const float* dy, int n, int c, float* dx,
                                   float* dw, float* db, cudaStream_t stream) {
  return LayerNormBackwardResidualCuda(x, w, mean, rstd, dy, nullptr, n, c, dx, dw, db, stream);
}

absl::Status LayerNormBackwardResidualCuda(const float* x, const float* w, const float* mean,
                                           const float* rstd, const float* dy,
                                           const float* residual, int n, int c, float* dx,
                                           float* dw, float* db, cudaStream_t stream) {
  absl::Status valid = CheckShape(
      residual != nullptr ? "LayerNormBackwardResidualCuda" : "LayerNormBackwardCuda", n, c);
  if (!valid.ok() || n == 0) return valid;
  LayerNormInputGradKernel<<<n, kRowThreads, 0, stream>>>(x, w, mean, rstd, dy, residual, c, dx);
  CUDA_CHECK_LAUNCH("LayerNormInputGradKernel");
  return column_sums::ColumnSums<2>(ParamGradTerms{x, mean, rstd, dy, c}, n, c, dw, db, stream,
                                    "LayerNorm parameter gradient sums");
}

}  // namespace pipetrain
