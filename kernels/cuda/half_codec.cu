// Device side of half_codec.h: the element-wise casts. The payload framing
// is host code in half_codec.cc.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/half_codec.h"
#include "kernels/cuda/launch.h"

namespace pipetrain {
namespace {

__device__ uint16_t ToNarrow(HalfFormat format, float v) {
  if (format == HalfFormat::kFp16) return __half_as_ushort(__float2half_rn(v));
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

__device__ float ToFloat(HalfFormat format, uint16_t h) {
  if (format == HalfFormat::kFp16) return __half2float(__ushort_as_half(h));
  return __bfloat162float(__ushort_as_bfloat16(h));
}

// Inf or NaN in the narrow format: the exponent field all ones.
__device__ bool NarrowNonFinite(HalfFormat format, uint16_t h) {
  return format == HalfFormat::kFp16 ? (h & 0x7c00u) == 0x7c00u : (h & 0x7f80u) == 0x7f80u;
}

// A thread's indices increase, so its first bad one is its smallest;
// atomicMin on integers is order-independent.
__global__ void PackKernel(HalfFormat format, const float* x, int64_t n, uint16_t* body,
                           unsigned long long* first_bad) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const uint16_t h = ToNarrow(format, x[i]);
    body[i] = h;
    if (NarrowNonFinite(format, h)) {
      atomicMin(first_bad, static_cast<unsigned long long>(i));
      return;
    }
  }
}

__global__ void UnpackKernel(HalfFormat format, const uint16_t* body, int64_t n, float* out,
                             unsigned long long* first_bad) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const uint16_t h = body[i];
    out[i] = ToFloat(format, h);
    if (NarrowNonFinite(format, h)) {
      atomicMin(first_bad, static_cast<unsigned long long>(i));
      return;
    }
  }
}

}  // namespace

absl::Status HalfPackCuda(HalfFormat format, const float* x, int64_t n, uint16_t* body,
                          unsigned long long* first_bad, cudaStream_t stream) {
  absl::Status valid = CheckElementCount("HalfPackCuda", n);
  if (!valid.ok() || n == 0) return valid;
  PackKernel<<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(format, x, n, body,
                                                                      first_bad);
  CUDA_CHECK_LAUNCH("PackKernel");
  return absl::OkStatus();
}

absl::Status HalfUnpackCuda(HalfFormat format, const uint16_t* body, int64_t n, float* out,
                            unsigned long long* first_bad, cudaStream_t stream) {
  absl::Status valid = CheckElementCount("HalfUnpackCuda", n);
  if (!valid.ok() || n == 0) return valid;
  UnpackKernel<<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(format, body, n, out,
                                                                        first_bad);
  CUDA_CHECK_LAUNCH("UnpackKernel");
  return absl::OkStatus();
}

}  // namespace pipetrain
