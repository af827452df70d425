#include "kernels/cuda/embedding.h"

#include <math_constants.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch.h"

namespace pipetrain {
namespace {

// Threads per block of the token-gradient kernel, which is also the number
// of token ids staged in shared memory at a time.
constexpr int kTableThreads = 256;

// One thread per output element, grid-stride.
__global__ void EmbeddingForwardKernel(const int32_t* tokens, const float* wte,
                                       const float* wpe, int seq_len, int c, int vocab,
                                       int64_t total, float* out) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t row = i / c;
    const int64_t j = i - row * c;
    const int32_t token = tokens[row];
    if (token < 0 || token >= vocab) {
      out[i] = CUDART_NAN_F;  // see embedding.h: a visible error, not a wild read
      continue;
    }
    const int64_t t = row % seq_len;
    out[i] = wte[static_cast<int64_t>(token) * c + j] + wpe[t * c + j];
  }
}

// dwte[v, :] += dout[row, :] for every row with tokens[row] == v, rows in
// increasing order (the CPU's order, so the sums round identically). Block v
// owns row v of dwte and its threads own columns, so no two threads write
// the same element and no atomics are needed. The block stages token ids in
// shared memory; the match test is uniform across the block (no divergence).
__global__ void TokenGradKernel(const int32_t* tokens, const float* dout, int64_t rows, int c,
                                float* dwte) {
  __shared__ int32_t tile[kTableThreads];
  const int32_t v = static_cast<int32_t>(blockIdx.x);
  float* dst = dwte + static_cast<int64_t>(v) * c;
  for (int64_t start = 0; start < rows; start += kTableThreads) {
    const int64_t left = rows - start;
    const int count = left < kTableThreads ? static_cast<int>(left) : kTableThreads;
    if (static_cast<int>(threadIdx.x) < count) tile[threadIdx.x] = tokens[start + threadIdx.x];
    __syncthreads();
    for (int k = 0; k < count; ++k) {
      if (tile[k] != v) continue;
      const float* src = dout + (start + k) * c;
      for (int j = threadIdx.x; j < c; j += blockDim.x) dst[j] += src[j];
    }
    __syncthreads();  // the next tile overwrites `tile`
  }
}

// dwpe[t, j] += dout[b, t, j] for b = 0, 1, ... in order (as on the CPU).
// One thread per (t, j), grid-stride over seq_len * c elements.
__global__ void PositionGradKernel(const float* dout, int batch, int64_t positions,
                                   float* dwpe) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < positions;
       i += stride) {
    float acc = dwpe[i];
    for (int b = 0; b < batch; ++b) acc += dout[b * positions + i];
    dwpe[i] = acc;
  }
}

absl::Status CheckShape(const char* op, int batch, int seq_len, int c, int vocab) {
  if (batch >= 0 && seq_len >= 0 && c >= 1 && vocab >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      op, ": batch ", batch, ", seq_len ", seq_len, ", c ", c, ", vocab ", vocab,
      " need batch >= 0, seq_len >= 0, c >= 1 and vocab >= 1"));
}

}  // namespace

absl::Status EmbeddingForwardCuda(const int32_t* tokens, const float* wte, const float* wpe,
                                  int batch, int seq_len, int c, int vocab, float* out,
                                  cudaStream_t stream) {
  absl::Status valid = CheckShape("EmbeddingForwardCuda", batch, seq_len, c, vocab);
  const int64_t total = static_cast<int64_t>(batch) * seq_len * c;
  if (!valid.ok() || total == 0) return valid;
  EmbeddingForwardKernel<<<ElementwiseBlocks(total), kElementwiseThreads, 0, stream>>>(
      tokens, wte, wpe, seq_len, c, vocab, total, out);
  CUDA_CHECK_LAUNCH("EmbeddingForwardKernel");
  return absl::OkStatus();
}

absl::Status EmbeddingBackwardCuda(const int32_t* tokens, const float* dout, int batch,
                                   int seq_len, int c, int vocab, float* dwte, float* dwpe,
                                   cudaStream_t stream) {
  absl::Status valid = CheckShape("EmbeddingBackwardCuda", batch, seq_len, c, vocab);
  const int64_t rows = static_cast<int64_t>(batch) * seq_len;
  if (!valid.ok() || rows == 0) return valid;
  TokenGradKernel<<<vocab, kTableThreads, 0, stream>>>(tokens, dout, rows, c, dwte);
  CUDA_CHECK_LAUNCH("TokenGradKernel");
  const int64_t positions = static_cast<int64_t>(seq_len) * c;
  PositionGradKernel<<<ElementwiseBlocks(positions), kElementwiseThreads, 0, stream>>>(
      dout, batch, positions, dwpe);
  CUDA_CHECK_LAUNCH("PositionGradKernel");
  return absl::OkStatus();
}

}  // namespace pipetrain
