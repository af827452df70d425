// GemmTolerance (testonly): how far a cuBLAS product may be from the CPU's
// in each GemmMode, for the GEMM parity tests (linear_test, lm_head_test).
//
// Why: an output sums k products. Inputs are drawn so a product term has
// standard deviation s (e.g. x, dy ~ N(0, 1); w ~ N(0, 1/in)), so the GEMM
// part of an output has std sqrt(k) s; seeded values (a bias, gradients
// accumulated onto) have std 1, and "scale" is the std of the whole output.
//  - fp32 mode: inputs are exact; both sides round the running sums, unit
//    roundoff u = 2^-24. With random-signed terms the partial sums grow like
//    sqrt(i), so the rounding error of the sum is about u * sqrt(k) * scale
//    (recursive summation; the blocked sums of cuBLAS and OpenBLAS do no
//    worse). rel = u * sqrt(k): about 1e-5 for k = 3072.
//  - TF32 mode: the tensor cores keep 10 of the 23 mantissa bits of each
//    input, an error up to 2^-10 if they truncate (2^-11 if they round), in
//    each of the two factors of every product, with random signs across the
//    k terms; that is about 2^-10 * sqrt(k) * s = 2^-10 * scale, on top of
//    the fp32 accumulation error above. The CPU reference has no such
//    error, so the bound is that of the GPU alone.
//  - bf16 mode: the same with 7 of the 23 mantissa bits kept, an error up
//    to 2^-7 per input if truncated (2^-8 if rounded): about 2^-7 * scale.
// kSafety = 16 covers the largest of ~10^6 samples (about 5 standard
// deviations), both sides' errors, and the two factors of TF32. Written
// without a GPU; every mode has since passed on an H200.
#ifndef PIPETRAIN_KERNELS_CUDA_GEMM_TOLERANCE_TESTING_H_
#define PIPETRAIN_KERNELS_CUDA_GEMM_TOLERANCE_TESTING_H_

#include <cmath>

#include "kernels/cuda/linear.h"

namespace pipetrain {
namespace testing {

struct Tolerance {
  float atol;
  float rtol;
};

// k products per output, each of std term_std, added onto values of std
// seeded_std (0 when nothing is accumulated onto).
inline Tolerance GemmTolerance(GemmMode mode, int k, float term_std, float seeded_std) {
  constexpr float kUnitRoundoff = 0x1p-24f;
  constexpr float kTf32InputError = 0x1p-10f;
  constexpr float kBf16InputError = 0x1p-7f;  // truncation, as TF32's
  constexpr float kSafety = 16.0f;
  const float sqrt_k = std::sqrt(static_cast<float>(k));
  const float inputs = mode == GemmMode::kTf32   ? kTf32InputError
                       : mode == GemmMode::kBf16 ? kBf16InputError
                                                 : 0.0f;
  const float rel = kSafety * (kUnitRoundoff * sqrt_k + inputs);
  const float gemm_std = sqrt_k * term_std;
  const float scale = std::sqrt(gemm_std * gemm_std + seeded_std * seeded_std);
  return {rel * scale, rel};
}

}  // namespace testing
}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_GEMM_TOLERANCE_TESTING_H_
