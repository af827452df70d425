// The softmax cross-entropy kernels' device code (cross_entropy.h's
// contract): included by cross_entropy.cu, which launches them, and by
// kernels/cuda/emulation's test, which runs them on the CPU through
// warp_emulation.h (PIPETRAIN_CUDA_EMULATION defined).
#ifndef PIPETRAIN_KERNELS_CUDA_CROSS_ENTROPY_KERNELS_CUH_
#define PIPETRAIN_KERNELS_CUDA_CROSS_ENTROPY_KERNELS_CUH_

#ifdef PIPETRAIN_CUDA_EMULATION
#include "kernels/cuda/emulation/warp_emulation.h"
#else
#include <cuda_bf16.h>
#endif

#include <cmath>
#include <cstdint>

#include "kernels/cuda/block_reduce.cuh"

namespace pipetrain {
namespace {

// One block per row. GPT-2's vocabulary (50257) gives each of 512 threads
// about 98 logits; a row is read twice (an online max-and-sum pass, then
// the probabilities), the second time partly from L2.
constexpr int kRowThreads = 512;
// The single block that averages the row losses (a power of two: the tree
// below halves it).
constexpr int kMeanThreads = 256;

using cuda_reduce::BlockReduce;
using cuda_reduce::MaxOp;
using cuda_reduce::SumOp;

// Column j's dlogits from its probability p: p * scale, minus scale at the
// target (NaN for a row whose target is out of range). __fmul_rn keeps the
// product rounded on its own (no FMA with the subtraction), as the CPU
// computes it, so both sides round identically.
__device__ __forceinline__ float Gradient(float p, int j, int32_t target, bool valid, float scale) {
  float g = __fmul_rn(p, scale);
  if (j == target) g -= scale;
  return valid ? g : NAN;
}

// Softmax of one row (stride ld) and its loss logsumexp - x[target]. The
// first pass keeps, per thread, the running maximum m of its logits and
// the sum s of exp(x - m), rescaling s by exp(m_old - m_new) when m grows
// (the online softmax normaliser of Milakov and Gimelshein, 2018); the
// block then takes the maximum M of the threads' m and sums their
// s * exp(m - M). So the row is read once for its normaliser instead of
// twice (max, then sum) as the CPU does; the sum rounds differently from
// the CPU's, within the parity tests' tolerances. expf (not the
// -use_fast_math __expf) stays within 2 ulp; the exponentials are
// recomputed in the last pass rather than stored, so that probs may alias
// logits.
//
// kBf16Gradient: instead of the probabilities, the last pass writes the
// mean loss's gradient (p - onehot(target)) * scale, rounded to bf16, into
// `gradient` (a buffer of its own), and +0 into each row's padding.
template <bool kBf16Gradient>
__global__ void SoftmaxCrossEntropyRowKernel(const float* logits, const int32_t* targets, int vocab,
                                             int64_t ld, float* probs, float scale,
                                             uint16_t* gradient, float* row_losses) {
  __shared__ float scratch[33];
  const int64_t row = blockIdx.x;
  const float* x = logits + row * ld;
  const int32_t target = targets[row];
  const bool valid = target >= 0 && target < vocab;
  // Read before any thread writes p (probs may alias logits): the barriers
  // in BlockReduce order this read before the last pass.
  const float target_logit = threadIdx.x == 0 && valid ? x[target] : 0.0f;
  float m = -INFINITY, s = 0.0f;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float v = x[j];
    if (v > m) {
      s = s * expf(m - v) + 1.0f;  // expf(-inf) = 0 for the first logit
      m = v;
    } else if (v != -INFINITY) {  // exp(-inf - -inf) would be NaN; NaN still adds NaN
      s += expf(v - m);
    }
  }
  const float row_max = BlockReduce(m, -INFINITY, scratch, MaxOp());
  // A thread with no logits (vocab < blockDim.x), or only -inf ones, adds
  // nothing; one whose logits were all NaN (m stays -inf: NaN > m is false)
  // adds its NaN, as the CPU's sum does: BlockReduce's max drops NaN, and a
  // NaN logit would otherwise leave the row's loss finite.
  s = m == -INFINITY ? (s != s ? s : 0.0f) : s * expf(m - row_max);  // s != s: NaN
  s = BlockReduce(s, 0.0f, scratch, SumOp());
  const float inv = 1.0f / s;
  if constexpr (kBf16Gradient) {
    uint16_t* g = gradient + row * ld;
    for (int j = threadIdx.x; j < ld; j += blockDim.x) {
      // The probability exactly as the fp32 pass stores it, then the
      // backward's Gradient: bitwise the two passes' values, rounded.
      const float v =
          j < vocab ? Gradient(expf(x[j] - row_max) * inv, j, target, valid, scale) : 0.0f;
      g[j] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    }
  } else {
    float* p = probs + row * ld;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) p[j] = expf(x[j] - row_max) * inv;
  }
  if (threadIdx.x == 0) {
    // -log p[target] = logsumexp - x[target]: exact even when p underflows.
    const float lse = row_max + logf(s);
    row_losses[row] = valid ? static_cast<float>(static_cast<double>(lse) - target_logit) : NAN;
  }
}

// *loss = mean of row_losses, summed in double (the CPU sums the unrounded
// double row losses; these were rounded to float, a difference far below
// the test's tolerance): each thread sums a
// fixed stride of rows in order, then a fixed halving tree. One block.
__global__ void MeanLossKernel(const float* row_losses, int n, float* loss) {
  __shared__ double partial[kMeanThreads];
  double sum = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) sum += row_losses[i];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int width = blockDim.x / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss = static_cast<float>(partial[0] / n);
}

__global__ void SoftmaxCrossEntropyBackwardKernel(const float* probs, const int32_t* targets,
                                                  int vocab, int64_t ld, float scale,
                                                  float* dlogits) {
  const int64_t row = blockIdx.x;
  const float* p = probs + row * ld;
  float* d = dlogits + row * ld;
  const int32_t target = targets[row];
  const bool valid = target >= 0 && target < vocab;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x)
    d[j] = Gradient(p[j], j, target, valid, scale);
}

}  // namespace
}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_CROSS_ENTROPY_KERNELS_CUH_
