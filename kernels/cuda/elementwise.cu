#include "kernels/cuda/elementwise.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch.h"

namespace pipetrain {
namespace {

// Each element is read before it is written by the same thread, so out may
// alias a or b. Memory-bound: one load per input and one store per element.
__global__ void AddKernel(const float* a, const float* b, int64_t n, float* out) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = a[i] + b[i];
  }
}

__global__ void AddInPlaceKernel(float* acc, const float* x, int64_t n) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    acc[i] += x[i];
  }
}

__global__ void SubtractKernel(const float* a, const float* b, int64_t n, float* out) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = a[i] - b[i];
  }
}

}  // namespace

absl::Status AddCuda(const float* a, const float* b, int64_t n, float* out,
                     cudaStream_t stream) {
  absl::Status valid = CheckElementCount("AddCuda", n);
  if (!valid.ok() || n == 0) return valid;
  AddKernel<<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(a, b, n, out);
  CUDA_CHECK_LAUNCH("AddKernel");
  return absl::OkStatus();
}

absl::Status AddInPlaceCuda(float* acc, const float* x, int64_t n, cudaStream_t stream) {
  absl::Status valid = CheckElementCount("AddInPlaceCuda", n);
  if (!valid.ok() || n == 0) return valid;
  AddInPlaceKernel<<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(acc, x, n);
  CUDA_CHECK_LAUNCH("AddInPlaceKernel");
  return absl::OkStatus();
}

absl::Status SubtractCuda(const float* a, const float* b, int64_t n, float* out,
                          cudaStream_t stream) {
  absl::Status valid = CheckElementCount("SubtractCuda", n);
  if (!valid.ok() || n == 0) return valid;
  SubtractKernel<<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(a, b, n, out);
  CUDA_CHECK_LAUNCH("SubtractKernel");
  return absl::OkStatus();
}

}  // namespace pipetrain
