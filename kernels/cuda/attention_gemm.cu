// Device side of attention_gemm.h: the causal softmax row kernels. The
// GEMMs are host calls in attention_gemm.cc.
#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention_gemm.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_status.h"

namespace pipetrain {
namespace {

// As attention.cu's row kernels: 128 threads, eight keys each at seq_len
// 1024.
constexpr int kRowThreads = 128;

using cuda_reduce::BlockReduce;
using cuda_reduce::MaxOp;
using cuda_reduce::SumOp;

// One row per block; each thread reads and writes only its own entries, so
// the in-place update needs no barrier beyond the reductions'.
__global__ void CausalSoftmaxRowsKernel(float* s, int seq_len) {
  __shared__ float scratch[33];
  const int64_t row = blockIdx.x;
  const int t = static_cast<int>(row % seq_len);
  float* r = s + row * seq_len;
  float m = -INFINITY;
  for (int j = threadIdx.x; j <= t; j += blockDim.x) m = fmaxf(m, r[j]);
  m = BlockReduce(m, -INFINITY, scratch, MaxOp());
  float sum = 0.0f;
  for (int j = threadIdx.x; j <= t; j += blockDim.x) {
    r[j] = expf(r[j] - m);
    sum += r[j];
  }
  const float inv = 1.0f / BlockReduce(sum, 0.0f, scratch, SumOp());
  for (int j = threadIdx.x; j <= t; j += blockDim.x) r[j] *= inv;
  for (int j = t + 1 + threadIdx.x; j < seq_len; j += blockDim.x) r[j] = 0.0f;
}

__global__ void CausalSoftmaxBackwardRowsKernel(const float* p, float* d, int seq_len,
                                                float scale) {
  __shared__ float scratch[33];
  const int64_t row = blockIdx.x;
  const int t = static_cast<int>(row % seq_len);
  const float* pr = p + row * seq_len;
  float* dr = d + row * seq_len;
  float dot = 0.0f;
  for (int j = threadIdx.x; j <= t; j += blockDim.x) dot += dr[j] * pr[j];
  dot = BlockReduce(dot, 0.0f, scratch, SumOp());
  for (int j = threadIdx.x; j <= t; j += blockDim.x) dr[j] = scale * pr[j] * (dr[j] - dot);
  for (int j = t + 1 + threadIdx.x; j < seq_len; j += blockDim.x) dr[j] = 0.0f;
}

absl::Status CheckRows(const char* op, int64_t rows, int seq_len) {
  if (rows >= 0 && seq_len >= 1 && rows <= std::numeric_limits<int32_t>::max()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", rows, " rows of ", seq_len,
                                                 " need rows in 0..2^31-1 and seq_len >= 1"));
}

}  // namespace

absl::Status CausalSoftmaxRowsCuda(float* s, int64_t rows, int seq_len, cudaStream_t stream) {
  absl::Status valid = CheckRows("CausalSoftmaxRowsCuda", rows, seq_len);
  if (!valid.ok() || rows == 0) return valid;
  CausalSoftmaxRowsKernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(s, seq_len);
  CUDA_CHECK_LAUNCH("CausalSoftmaxRowsKernel");
  return absl::OkStatus();
}

absl::Status CausalSoftmaxBackwardRowsCuda(const float* p, float* d, int64_t rows, int seq_len,
                                           float scale, cudaStream_t stream) {
  absl::Status valid = CheckRows("CausalSoftmaxBackwardRowsCuda", rows, seq_len);
  if (!valid.ok() || rows == 0) return valid;
  CausalSoftmaxBackwardRowsKernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
      p, d, seq_len, scale);
  CUDA_CHECK_LAUNCH("CausalSoftmaxBackwardRowsKernel");
  return absl::OkStatus();
}

}  // namespace pipetrain
