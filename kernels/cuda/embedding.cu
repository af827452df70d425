#include <math_constants.h>

#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/launch.h"

namespace pipetrain {
namespace {

// Threads per block of the token-gradient kernel; each owns columns.
constexpr int kTokenGradThreads = 256;

// One thread per output element, grid-stride.
__global__ void EmbeddingForwardKernel(const int32_t* tokens, const float* wte, const float* wpe,
                                       int seq_len, int c, int vocab, int64_t total, float* out) {
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

// dwte[v, j] += dout[row, j] for every row of token v, rows in increasing
// order (the CPU's order, so the sums round identically), from the index
// GroupRowsByToken built (kernels/cpu/embedding.h). Block (g, y) owns group
// g's table row, and its threads own columns y * blockDim.x + threadIdx.x,
// strided by the grid's column span: no two threads write the same element,
// no atomics are needed, and each thread reads its rows' columns coalesced
// with its neighbours'. O(rows * c) work in all.
__global__ void TokenGradKernel(const int32_t* index, int groups, const float* dout, int c,
                                float* dwte) {
  const int g = static_cast<int>(blockIdx.x);
  const int32_t* starts = index + groups;
  const int32_t* rows = starts + groups + 1;
  const int32_t begin = starts[g];
  const int32_t end = starts[g + 1];
  float* dst = dwte + static_cast<int64_t>(index[g]) * c;
  const int span = static_cast<int>(gridDim.y * blockDim.x);
  for (int j = static_cast<int>(blockIdx.y * blockDim.x + threadIdx.x); j < c; j += span) {
    float acc = dst[j];
    for (int32_t k = begin; k < end; ++k) acc += dout[static_cast<int64_t>(rows[k]) * c + j];
    dst[j] = acc;
  }
}

// dwpe[t, j] += dout[b, t, j] for b = 0, 1, ... in order (as on the CPU).
// One thread per (t, j), grid-stride over seq_len * c elements.
__global__ void PositionGradKernel(const float* dout, int batch, int64_t positions, float* dwpe) {
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
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": batch ", batch, ", seq_len ", seq_len, ", c ", c, ", vocab ", vocab,
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

absl::Status EmbeddingBackwardCuda(const int32_t* token_rows, int groups, const float* dout,
                                   int batch, int seq_len, int c, float* dwte, float* dwpe,
                                   cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(batch) * seq_len;
  if (batch < 0 || seq_len < 0 || c < 1 || groups < 0 || groups > rows ||
      rows > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "EmbeddingBackwardCuda: batch ", batch, ", seq_len ", seq_len, ", c ", c, ", groups ",
        groups, " need batch >= 0, seq_len >= 0, c >= 1, 0 <= groups <= batch * seq_len <= ",
        std::numeric_limits<int32_t>::max()));
  }
  if (rows == 0) return absl::OkStatus();
  if (groups > 0) {
    const int column_blocks = static_cast<int>((c + kTokenGradThreads - 1) / kTokenGradThreads);
    TokenGradKernel<<<dim3(static_cast<unsigned>(groups),
                           static_cast<unsigned>(column_blocks < 65535 ? column_blocks : 65535)),
                      kTokenGradThreads, 0, stream>>>(token_rows, groups, dout, c, dwte);
    CUDA_CHECK_LAUNCH("TokenGradKernel");
  }
  const int64_t positions = static_cast<int64_t>(seq_len) * c;
  PositionGradKernel<<<ElementwiseBlocks(positions), kElementwiseThreads, 0, stream>>>(
      dout, batch, positions, dwpe);
  CUDA_CHECK_LAUNCH("PositionGradKernel");
  return absl::OkStatus();
}

}  // namespace pipetrain
