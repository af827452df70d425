// How SumsOfSquaresCuda (multi_tensor.h) splits a tensor over blocks:
// plain C++, shared by the kernels' source (multi_tensor_kernels.cuh) and
// its CPU run in kernels/cuda/emulation, which have no CUDA headers.
#ifndef PIPETRAIN_KERNELS_CUDA_MULTI_TENSOR_LAYOUT_H_
#define PIPETRAIN_KERNELS_CUDA_MULTI_TENSOR_LAYOUT_H_

#include <cstdint>

namespace pipetrain {

// Threads per block of both passes, and the most blocks one tensor's sum
// is split over (the second tree's width: a power of two, at most the
// threads per block).
inline constexpr int kSquaresThreads = 256;
inline constexpr int kMaxSquaresBlocks = 256;

// Blocks that sum a tensor of n elements: one per 4 x kSquaresThreads
// elements, at least 1, at most kMaxSquaresBlocks. A function of n alone,
// which is what makes a tensor's sum independent of its batch.
inline int SquaresBlocks(int64_t n) {
  const int64_t per_block = int64_t{4} * kSquaresThreads;
  const int64_t blocks = (n + per_block - 1) / per_block;
  return blocks < 1 ? 1 : blocks > kMaxSquaresBlocks ? kMaxSquaresBlocks : static_cast<int>(blocks);
}

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_MULTI_TENSOR_LAYOUT_H_
