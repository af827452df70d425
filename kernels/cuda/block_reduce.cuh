// Deterministic in-block reductions for kernels that reduce a row per block
// (softmax, cross-entropy, attention). Header-only device code: the .cu
// files are compiled without relocatable device code (tools/cuda/cuda.bzl),
// so device functions cannot be linked across files and are shared by
// inclusion instead.
#ifndef PIPETRAIN_KERNELS_CUDA_BLOCK_REDUCE_CUH_
#define PIPETRAIN_KERNELS_CUDA_BLOCK_REDUCE_CUH_

namespace pipetrain {
namespace cuda_reduce {

struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// op over the 32 lanes of a warp (butterfly), returned to every lane.
template <typename Op>
__device__ inline float WarpReduce(float v, Op op) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// op over v of every thread of the block, returned to all of them, in a
// fixed order (warp butterflies, then one warp over the warp results), so
// the result is the same every run. blockDim.x must be a multiple of 32 and
// at most 1024; scratch holds 33 floats. All threads must call it.
template <typename Op>
__device__ inline float BlockReduce(float v, float identity, float* scratch, Op op) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  v = WarpReduce(v, op);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : identity;
    w = WarpReduce(w, op);
    if (lane == 0) scratch[32] = w;
  }
  __syncthreads();
  const float total = scratch[32];
  __syncthreads();  // the next BlockReduce reuses scratch
  return total;
}

}  // namespace cuda_reduce
}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_BLOCK_REDUCE_CUH_
