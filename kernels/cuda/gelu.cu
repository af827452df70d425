#include "kernels/cuda/gelu.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch.h"

namespace pipetrain {
namespace {

// The constants of kernels/cpu/gelu.cc.
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

// tanhf (not the -use_fast_math approximation) keeps the result within a
// few ulp of the CPU reference; see gelu_test.cc for the tolerance.
__device__ __forceinline__ float Gelu(float v) {
  const float t = tanhf(kSqrt2OverPi * (v + kCubic * v * v * v));
  return 0.5f * v * (1.0f + t);
}

__global__ void GeluForwardKernel(const float* x, int64_t n, float* y) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] = Gelu(x[i]);
  }
}

__global__ void BiasGeluForwardKernel(const float* b, int64_t total, int c, float* y, float* g) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const float v = y[i] + b[i % c];
    y[i] = v;
    g[i] = Gelu(v);
  }
}

__global__ void GeluBackwardKernel(const float* x, const float* dy, int64_t n, float* dx) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float v = x[i];
    const float t = tanhf(kSqrt2OverPi * (v + kCubic * v * v * v));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * v * v);
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
}

}  // namespace

absl::Status GeluForwardCuda(const float* x, int64_t n, float* y, cudaStream_t stream) {
  absl::Status valid = CheckElementCount("GeluForwardCuda", n);
  if (!valid.ok() || n == 0) return valid;
  GeluForwardKernel<<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(x, n, y);
  CUDA_CHECK_LAUNCH("GeluForwardKernel");
  return absl::OkStatus();
}

absl::Status BiasGeluForwardCuda(const float* b, int n, int c, float* y, float* g,
                                 cudaStream_t stream) {
  if (n < 0 || c < 1) {
    return absl::InvalidArgumentError(absl::StrCat("BiasGeluForwardCuda: shape [", n, ", ", c,
                                                   "] needs n >= 0 rows and c >= 1 columns"));
  }
  if (n == 0) return absl::OkStatus();
  const int64_t total = static_cast<int64_t>(n) * c;
  BiasGeluForwardKernel<<<ElementwiseBlocks(total), kElementwiseThreads, 0, stream>>>(b, total, c,
                                                                                      y, g);
  CUDA_CHECK_LAUNCH("BiasGeluForwardKernel");
  return absl::OkStatus();
}

absl::Status GeluBackwardCuda(const float* x, const float* dy, int64_t n, float* dx,
                              cudaStream_t stream) {
  absl::Status valid = CheckElementCount("GeluBackwardCuda", n);
  if (!valid.ok() || n == 0) return valid;
  GeluBackwardKernel<<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(x, dy, n, dx);
  CUDA_CHECK_LAUNCH("GeluBackwardKernel");
  return absl::OkStatus();
}

}  // namespace pipetrain
