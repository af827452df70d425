// Device side of powersgd.h: the start-Q column fix-up and the one-block
// modified Gram-Schmidt. The GEMMs and the Philox start matrix are host code
// in powersgd.cc.
#include <cfloat>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/powersgd.h"

namespace pipetrain {
namespace {

constexpr int kOrthoThreads = 1024;
constexpr int kStartQThreads = 256;
// powersgd_codec.cc's kDependentColumn (a float there too).
constexpr float kDependentColumn = 1e-5f;

// Sum over the block of one double per thread, returned to every thread,
// in a fixed order (warp butterflies, then one warp over the warp sums).
// blockDim.x is kOrthoThreads; scratch holds 33 doubles.
__device__ double BlockSum(double v, double* scratch) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    double w = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : 0.0;
    for (int offset = 16; offset > 0; offset >>= 1) w += __shfl_xor_sync(0xffffffffu, w, offset);
    if (lane == 0) scratch[32] = w;
  }
  __syncthreads();
  const double total = scratch[32];
  __syncthreads();  // The next BlockSum reuses scratch.
  return total;
}

// sum_i double(p[i, a]) * p[i, b] over the block.
__device__ double ColumnDot(const float* p, int64_t rows, int r, int a, int b, double* scratch) {
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
    sum += static_cast<double>(p[i * r + a]) * p[i * r + b];
  }
  return BlockSum(sum, scratch);
}

// powersgd_codec.cc's Orthonormalise, per column: the same projections,
// roundings and dependence test; only the order of each sum differs.
// Launched with kOrthoThreads: the bound keeps nvcc's register use within
// what a block that large may have (else the launch fails for resources).
__global__ void __launch_bounds__(kOrthoThreads) OrthonormaliseKernel(float* p, int64_t rows,
                                                                      int r) {
  __shared__ double scratch[33];
  for (int c = 0; c < r; ++c) {
    const double before = sqrt(ColumnDot(p, rows, r, c, c, scratch));
    for (int pass = 0; pass < 2; ++pass) {
      for (int prev = 0; prev < c; ++prev) {
        const double dot = ColumnDot(p, rows, r, prev, c, scratch);
        for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
          p[i * r + c] -= static_cast<float>(dot * p[i * r + prev]);
        }
        __syncthreads();
      }
    }
    const double after = sqrt(ColumnDot(p, rows, r, c, c, scratch));
    // As powersgd_codec.cc: a column too small to scale to unit length in
    // float (1/after past FLT_MAX) counts as dependent, not Inf/NaN.
    const bool dependent =
        before == 0.0 || after <= kDependentColumn * before || 1.0 / after > FLT_MAX;
    const float scale = dependent ? 0.0f : static_cast<float>(1.0 / after);
    for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) p[i * r + c] *= scale;
    __syncthreads();
  }
}

// One block per column c: keep q_warm's column unless it is all zero.
__global__ void StartQKernel(const float* q_warm, const float* fresh, int64_t cols, int r,
                             float* q0) {
  const int c = blockIdx.x;
  int nonzero = 0;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    nonzero |= q_warm[i * r + c] != 0.0f ? 1 : 0;
  }
  const float* source = __syncthreads_or(nonzero) ? q_warm : fresh;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) q0[i * r + c] = source[i * r + c];
}

absl::Status CheckSizes(const char* op, int64_t n, const char* what, int rank) {
  if (n >= 1 && rank >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", what, "=", n, " rank=", rank, "; both must be >= 1"));
}

}  // namespace

absl::Status PowerSgdOrthonormaliseCuda(float* p, int64_t rows, int rank, cudaStream_t stream) {
  absl::Status valid = CheckSizes("PowerSgdOrthonormaliseCuda", rows, "rows", rank);
  if (!valid.ok()) return valid;
  OrthonormaliseKernel<<<1, kOrthoThreads, 0, stream>>>(p, rows, rank);
  CUDA_CHECK_LAUNCH("OrthonormaliseKernel");
  return absl::OkStatus();
}

absl::Status PowerSgdStartQCuda(const float* q_warm, const float* fresh, int64_t cols, int rank,
                                float* q0, cudaStream_t stream) {
  absl::Status valid = CheckSizes("PowerSgdStartQCuda", cols, "cols", rank);
  if (!valid.ok()) return valid;
  StartQKernel<<<rank, kStartQThreads, 0, stream>>>(q_warm, fresh, cols, rank, q0);
  CUDA_CHECK_LAUNCH("StartQKernel");
  return absl::OkStatus();
}

}  // namespace pipetrain
