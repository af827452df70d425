// Launch geometry and the element-count check shared by the element-wise
// kernels' launch wrappers (nvcc and C++ code).
#ifndef PIPETRAIN_KERNELS_CUDA_LAUNCH_H_
#define PIPETRAIN_KERNELS_CUDA_LAUNCH_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pipetrain {

// Threads per block of the element-wise kernels: a multiple of the 32-thread
// warp, small enough for several resident blocks per SM.
constexpr int kElementwiseThreads = 256;

// Upper bound on blocks for grid-stride loops: 1024 x 256 threads is about
// what an H100 (132 SMs x 2048 threads) holds at once. Larger inputs loop.
constexpr int64_t kMaxElementwiseBlocks = 1024;

// Blocks for a grid-stride loop over n >= 1 elements.
inline int ElementwiseBlocks(int64_t n) {
  const int64_t blocks = (n + kElementwiseThreads - 1) / kElementwiseThreads;
  return static_cast<int>(blocks < kMaxElementwiseBlocks ? blocks : kMaxElementwiseBlocks);
}

// OK for n >= 0; INVALID_ARGUMENT "<op>: element count <n> is negative"
// otherwise.
inline absl::Status CheckElementCount(const char* op, int64_t n) {
  if (n >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": element count ", n, " is negative"));
}

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_LAUNCH_H_
