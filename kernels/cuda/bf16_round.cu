#include <cuda_bf16.h>

#include "kernels/cuda/bf16_round.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch.h"

namespace pipetrain {
namespace {

// Grid-stride; memory-bound (4 bytes read, 2 written per element), so the
// plain coalesced loop is what it needs.
__global__ void RoundToBf16Kernel(const float* x, int64_t n, uint16_t* y) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
  }
}

}  // namespace

absl::Status RoundToBf16Cuda(const float* x, int64_t n, uint16_t* y, cudaStream_t stream) {
  absl::Status valid = CheckElementCount("RoundToBf16Cuda", n);
  if (!valid.ok() || n == 0) return valid;
  RoundToBf16Kernel<<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(x, n, y);
  CUDA_CHECK_LAUNCH("RoundToBf16Kernel");
  return absl::OkStatus();
}

}  // namespace pipetrain
