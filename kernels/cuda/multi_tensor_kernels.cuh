// The multi-tensor passes' device code (multi_tensor.h's contract), and
// how a table of tensors becomes a launch's batch: included by
// multi_tensor.cu, which launches them, and by kernels/cuda/emulation's
// test, which runs them on the CPU through warp_emulation.h
// (PIPETRAIN_CUDA_EMULATION defined).
#ifndef PIPETRAIN_KERNELS_CUDA_MULTI_TENSOR_KERNELS_CUH_
#define PIPETRAIN_KERNELS_CUDA_MULTI_TENSOR_KERNELS_CUH_

#ifdef PIPETRAIN_CUDA_EMULATION
#include "kernels/cuda/emulation/warp_emulation.h"
#endif

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/multi_tensor_layout.h"

namespace pipetrain {
namespace {

// Tensors per launch: their pointers and counts travel in the kernel's
// arguments (capped at 4 KiB), as AdamW's do.
constexpr int kTensorsPerLaunch = 64;

template <typename Pointer>
struct TensorBatch {
  Pointer data[kTensorsPerLaunch];
  int64_t n[kTensorsPerLaunch];
  int blocks[kTensorsPerLaunch];  // SquaresBlocks(n), computed on the host
};
static_assert(sizeof(TensorBatch<float*>) + 64 <= 4096, "kernel arguments are capped at 4 KiB");

static_assert(kMaxSquaresBlocks <= kSquaresThreads,
              "the second pass gives each thread at most one partial");
static_assert((kSquaresThreads & (kSquaresThreads - 1)) == 0, "the trees halve the block");

// The sum of v over the block's kSquaresThreads threads by a halving tree
// in shared memory (a fixed order), returned to thread 0. All threads call
// it.
__device__ double BlockSum(double v, double* partial) {
  partial[threadIdx.x] = v;
  __syncthreads();
  for (int width = kSquaresThreads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  return partial[0];
}

// Pass 1. Grid (blocks, tensors of the batch): block b of tensor t sums the
// squares of elements b * threads + thread, stepping by SquaresBlocks(n) *
// threads, into partials[(first + t) * kMaxSquaresBlocks + b]. Blocks past
// the tensor's own count have nothing to do.
__global__ void SquaresPartialsKernel(TensorBatch<const float*> batch, int first,
                                      double* partials) {
  __shared__ double partial[kSquaresThreads];
  const int t = blockIdx.y;
  const int64_t n = batch.n[t];
  const int blocks = batch.blocks[t];
  if (static_cast<int>(blockIdx.x) >= blocks) return;  // the whole block: no barrier is skipped
  const float* x = batch.data[t];
  const int64_t stride = int64_t{blocks} * kSquaresThreads;
  double sum = 0.0;
  for (int64_t i = int64_t{blockIdx.x} * kSquaresThreads + threadIdx.x; i < n; i += stride) {
    const double v = x[i];
    sum += v * v;
  }
  sum = BlockSum(sum, partial);
  if (threadIdx.x == 0) partials[int64_t{first + t} * kMaxSquaresBlocks + blockIdx.x] = sum;
}

// Pass 2. One block per tensor of the batch: its SquaresBlocks(n) partials
// by the same tree, into sums[first + t].
__global__ void SquaresTotalsKernel(TensorBatch<const float*> batch, int first,
                                    const double* partials, double* sums) {
  __shared__ double partial[kSquaresThreads];
  const int t = blockIdx.x;
  const int blocks = batch.blocks[t];
  const double v = static_cast<int>(threadIdx.x) < blocks
                       ? partials[int64_t{first + t} * kMaxSquaresBlocks + threadIdx.x]
                       : 0.0;
  const double total = BlockSum(v, partial);
  if (threadIdx.x == 0) sums[first + t] = total;
}

// x = op(x) for each element. Grid (blocks, tensors of the batch), grid
// stride over each tensor.
template <typename Op>
__global__ void ElementwiseKernel(TensorBatch<float*> batch, Op op) {
  const int t = blockIdx.y;
  float* x = batch.data[t];
  const int64_t n = batch.n[t];
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    x[i] = op(x[i]);
  }
}

struct ScaleOp {
  float scale;
  __device__ float operator()(float v) const { return __fmul_rn(v, scale); }
};

struct ZeroOp {  // the element is not read: the load is dead code
  __device__ float operator()(float) const { return 0.0f; }
};

// The tensors [first, first + kTensorsPerLaunch) of the table as a batch;
// *largest gets the largest count among them.
template <typename Pointer>
int FillBatch(Pointer const* tensors, const int64_t* counts, int count, int first,
              TensorBatch<Pointer>* batch, int64_t* largest) {
  const int in_batch = std::min(kTensorsPerLaunch, count - first);
  *largest = 0;
  for (int k = 0; k < in_batch; ++k) {
    batch->data[k] = tensors[first + k];
    batch->n[k] = counts[first + k];
    batch->blocks[k] = SquaresBlocks(counts[first + k]);
    *largest = std::max(*largest, counts[first + k]);
  }
  return in_batch;
}

}  // namespace
}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_MULTI_TENSOR_KERNELS_CUH_
