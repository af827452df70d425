// Column sums over the rows of a row-major [n, c] array, on the GPU, in a
// fixed order (deterministic run to run, no atomics) and in parallel over
// rows as well as columns: the gradient reductions of LayerNorm's gain and
// bias and of a linear layer's bias. A kernel with one thread per column
// walking all n rows (what these were) keeps only ceil(c / 256) blocks
// busy: for GPT-2's [8192, 768] that is 3 of an H100's 132 SMs.
//
//   Stage 1: a block takes a tile of kTileCols columns and a chunk of rows;
//            each of its kLanes row lanes sums rows lane, lane + kLanes, ...
//            of the chunk in order, and the lanes are added in lane order:
//            partial[chunk][s][j].
//   Stage 2: out_s[j] = ((out_s[j] + partial[0][s][j]) + partial[1][s][j])
//            + ... in chunk order.
// So the order differs from the CPU's row by row sum (the results agree
// within the rounding of n additions; the shorter chains are, if anything,
// closer to the exact sum), and is the same on every run.
//
// ColumnSums<kSums>(term, n, c, out0, out1, stream, name): term(i, j, v)
// writes the kSums terms of row i, column j into v (device code); out0
// (and out1 when kSums == 2) receive the sums added onto their values.
// Requires n >= 1, c >= 1. Scratch (chunks * kSums * c floats) comes from
// the stream's cache (stream_scratch.h). Queues work only. INTERNAL if a
// launch fails; the scratch's error (RESOURCE_EXHAUSTED when the device is
// full) if it cannot be had.
//
// Included by .cu files only (templates of device code).
#ifndef PIPETRAIN_KERNELS_CUDA_COLUMN_SUMS_CUH_
#define PIPETRAIN_KERNELS_CUDA_COLUMN_SUMS_CUH_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/stream_scratch.h"

namespace pipetrain {
namespace column_sums {

constexpr int kTileCols = 32;       // one warp's coalesced row segment
constexpr int kLanes = 8;           // row lanes per block: 256 threads
constexpr int64_t kChunkRows = 256;  // rows per block (more if n needs it)
constexpr int64_t kMaxChunks = 65535;  // gridDim.y's limit
constexpr int kFinishThreads = 256;

template <int kSums, typename Term>
__global__ void __launch_bounds__(kTileCols* kLanes)
    PartialKernel(Term term, int64_t n, int c, int64_t rows_per_chunk, float* partial) {
  __shared__ float lanes[kSums][kLanes][kTileCols];
  const int j = blockIdx.x * kTileCols + threadIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < n ? begin + rows_per_chunk : n;
  float acc[kSums];
  for (int s = 0; s < kSums; ++s) acc[s] = 0.0f;
  if (j < c) {
    for (int64_t i = begin + threadIdx.y; i < end; i += kLanes) {
      float v[kSums];
      term(i, j, v);
      for (int s = 0; s < kSums; ++s) acc[s] += v[s];
    }
  }
  for (int s = 0; s < kSums; ++s) lanes[s][threadIdx.y][threadIdx.x] = acc[s];
  __syncthreads();
  if (threadIdx.y == 0 && j < c) {
    for (int s = 0; s < kSums; ++s) {
      float sum = 0.0f;
      for (int lane = 0; lane < kLanes; ++lane) sum += lanes[s][lane][threadIdx.x];
      partial[(static_cast<int64_t>(blockIdx.y) * kSums + s) * c + j] = sum;
    }
  }
}

template <int kSums>
__global__ void FinishKernel(const float* partial, int64_t chunks, int c, float* out0,
                             float* out1) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= c) return;
  for (int s = 0; s < kSums; ++s) {
    float* out = s == 0 ? out0 : out1;
    float acc = out[j];
    for (int64_t k = 0; k < chunks; ++k) acc += partial[(k * kSums + s) * c + j];
    out[j] = acc;
  }
}

template <int kSums, typename Term>
absl::Status ColumnSums(Term term, int64_t n, int c, float* out0, float* out1,
                        cudaStream_t stream, const char* name) {
  static_assert(kSums == 1 || kSums == 2, "one or two sums");
  const int64_t rows_per_chunk = std::max(kChunkRows, (n + kMaxChunks - 1) / kMaxChunks);
  const int64_t chunks = (n + rows_per_chunk - 1) / rows_per_chunk;
  ASSIGN_OR_RETURN(StreamScratch partial,
                   StreamScratch::Create(static_cast<size_t>(chunks * kSums * c) * sizeof(float),
                                         stream));
  const dim3 grid(static_cast<unsigned>((c + kTileCols - 1) / kTileCols),
                  static_cast<unsigned>(chunks));
  PartialKernel<kSums><<<grid, dim3(kTileCols, kLanes), 0, stream>>>(term, n, c, rows_per_chunk,
                                                                      partial.as<float>());
  CUDA_CHECK_LAUNCH(name);
  FinishKernel<kSums><<<(c + kFinishThreads - 1) / kFinishThreads, kFinishThreads, 0, stream>>>(
      partial.as<float>(), chunks, c, out0, out1);
  CUDA_CHECK_LAUNCH(name);
  // `partial` may go back to the cache now: only later work on this stream
  // gets it again (stream_scratch.h).
  return absl::OkStatus();
}

}  // namespace column_sums
}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_COLUMN_SUMS_CUH_
