// Rounding for the quantizing codecs' per-value loops, without a libm call
// per value (std::lround/std::round/std::floor are calls on baseline x86-64,
// and they dominated the codecs' encode time).
//
// The results are exactly those of the standard functions in the stated
// ranges, so payloads do not change and the GPU kernels (kernels/cuda/
// quantize.cu, which use round/floor on doubles) still produce the same
// codes.
#ifndef PIPETRAIN_KERNELS_COMPRESS_ROUNDING_H_
#define PIPETRAIN_KERNELS_COMPRESS_ROUNDING_H_

#include <cstdint>

namespace pipetrain {

// == std::lround(x): nearest integer, halfway cases away from zero, for
// -2^31 < x < 2^31 - 0.5 (beyond, the int32 truncation or the +1 would
// overflow; the codecs clamp their ratios well inside). Exact: the fraction
// f = x - trunc(x) is representable for every double, and so is 2f, whose
// truncation is +1 exactly when f >= 0.5, -1 when f <= -0.5, else 0.
// Conversions only, no comparisons, so loops around it vectorise.
inline int32_t RoundHalfAwayFromZero(double x) {
  const int32_t t = static_cast<int32_t>(x);  // truncates toward zero
  const double fraction = x - static_cast<double>(t);
  return t + static_cast<int32_t>(fraction + fraction);
}

// == std::floor(x) for 0 <= x < 2^31 (truncation is the floor there).
inline int32_t FloorNonNegative(double x) { return static_cast<int32_t>(x); }

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_COMPRESS_ROUNDING_H_
