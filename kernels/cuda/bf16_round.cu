#include <cuda_bf16.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/bf16_round.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch.h"

namespace pipetrain {
namespace {

// Lines over the grid's y (grid-stride), each line's elements over its x
// (grid-stride); memory-bound (4 bytes read, 2 written per element), so
// plain coalesced loops are what it needs.
__global__ void RoundToBf16Kernel(const float* x, int64_t lines, int64_t length, int64_t x_stride,
                                  uint16_t* y, int64_t y_stride) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t line = blockIdx.y; line < lines; line += gridDim.y) {
    const float* from = x + line * x_stride;
    uint16_t* to = y + line * y_stride;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < length;
         i += stride) {
      to[i] = __bfloat16_as_ushort(__float2bfloat16_rn(from[i]));
    }
  }
}

// CUDA's limit on a grid's y dimension.
constexpr int64_t kMaxGridY = 65535;

}  // namespace

absl::Status RoundToBf16Cuda(const float* x, int64_t n, uint16_t* y, cudaStream_t stream) {
  absl::Status valid = CheckElementCount("RoundToBf16Cuda", n);
  if (!valid.ok()) return valid;
  return RoundToBf16StridedCuda(x, 1, n, n, y, n, stream);
}

absl::StatusOr<StreamScratch> Bf16CopyCuda(const float* x, int64_t count, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckElementCount("Bf16CopyCuda", count));
  ASSIGN_OR_RETURN(StreamScratch copy,
                   StreamScratch::Create(static_cast<size_t>(count) * sizeof(uint16_t), stream));
  RETURN_IF_ERROR(RoundToBf16Cuda(x, count, copy.as<uint16_t>(), stream));
  return copy;
}

absl::Status RoundToBf16StridedCuda(const float* x, int64_t lines, int64_t length, int64_t x_stride,
                                    uint16_t* y, int64_t y_stride, cudaStream_t stream) {
  if (lines < 0 || length < 0 || x_stride < length || y_stride < length) {
    return absl::InvalidArgumentError(
        absl::StrCat("RoundToBf16StridedCuda: lines ", lines, ", length ", length, ", strides ",
                     x_stride, " and ", y_stride, "; want counts >= 0 and strides >= length"));
  }
  if (lines == 0 || length == 0) return absl::OkStatus();
  // About as many threads as the element-wise kernels use in all, split
  // between a line's elements and the lines.
  const int x_blocks = ElementwiseBlocks(length);
  const int64_t y_blocks =
      std::min<int64_t>({lines, kMaxGridY, std::max<int64_t>(1, kMaxElementwiseBlocks / x_blocks)});
  const dim3 grid(x_blocks, static_cast<unsigned>(y_blocks));
  RoundToBf16Kernel<<<grid, kElementwiseThreads, 0, stream>>>(x, lines, length, x_stride, y,
                                                              y_stride);
  CUDA_CHECK_LAUNCH("RoundToBf16Kernel");
  return absl::OkStatus();
}

}  // namespace pipetrain
