// Vectorisable exp and tanh for the element-wise kernels.
//
// glibc's expf/tanhf are scalar calls that stop GCC from vectorising the
// GELU, softmax and cross-entropy loops, which then cost as much as the
// GEMMs. These inline versions use only +, *, and bit casts, so loops over
// them vectorise. Accuracy (checked in fast_math_test): relative error of
// FastExp below 4e-7 on [-87, 88]; absolute error of FastTanh below 3e-7.
//
// Always inlined: the kernels that call them are compiled per target
// (PT_TARGET_CLONES: the x86-64-v4 and -v3 ISA levels and the baseline),
// and GCC does not inline a function of another target into one of them
// on its own, so the AVX-512 and AVX2 clones called FastExp once per
// element, unvectorised (docs/benchmarks.md, "The element-wise kernels'
// AVX-512 and AVX2 code"). The clones also need -fno-trapping-math
// (KERNEL_COPTS in kernels/cpu/BUILD) to if-convert FastExp's clamp, and
// -ffp-contract=off to round as the baseline does. fast_math_test checks
// the accuracy of each vectorised form, and that each is bitwise the
// scalar code.
#ifndef PIPETRAIN_KERNELS_CPU_FAST_MATH_H_
#define PIPETRAIN_KERNELS_CPU_FAST_MATH_H_

#include <cstdint>
#include <cstring>

// inline, and inlined into every caller whatever its target.
#define PT_ALWAYS_INLINE __attribute__((always_inline)) inline

namespace pipetrain {

// e^x. Inputs are clamped to [-87, 88] (e^-87 ~ 1.6e-38 is the smallest
// normal-range result; e^88 ~ 1.7e38 the largest finite one); NaN gives NaN.
PT_ALWAYS_INLINE float FastExp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // x = n ln2 + r with |r| <= ln2/2; round to nearest with the 1.5*2^23
  // trick (exact under the default rounding mode, and vectorisable).
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kRound = 12582912.0f;  // bit pattern 0x4B400000
  const float shifted = x * kLog2e + kRound;
  const float n = shifted - kRound;
  // ln2 split in a high part with few mantissa bits (Cody-Waite) so n*hi is exact.
  float r = x - n * 0.693359375f - n * -2.12194440e-4f;
  // Taylor polynomial of e^r to degree 7: truncation error < (ln2/2)^8/8! ~ 5e-9.
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n from the integer n held in the low mantissa bits of `shifted`, in
  // unsigned arithmetic: defined even for NaN input, which then propagates
  // through p instead of hitting an undefined float-to-int conversion.
  uint32_t shifted_bits;
  std::memcpy(&shifted_bits, &shifted, sizeof(shifted_bits));
  const uint32_t bits = (shifted_bits - 0x4B400000u + 127u) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// tanh(x) = 1 - 2 / (e^{2x} + 1): saturates cleanly to +-1 at the clamp.
PT_ALWAYS_INLINE float FastTanh(float x) { return 1.0f - 2.0f / (FastExp(2.0f * x) + 1.0f); }

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CPU_FAST_MATH_H_
