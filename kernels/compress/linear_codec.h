// Linear (uniform, symmetric) quantization, acctfm §4.3.2 eq. (4)-(5).
//
//   step = max|R| / (2^(bits-1) - 1)          eq. (4), computed in double and
//                                             stored as float32 (LinearStep)
//   q    = round(val / step)                  eq. (5); |q| <= 2^(bits-1) - 1
//   Qval = q * step                           eq. (5), decode
//
// Guarantee: |Qval - val| <= step / 2 per element (plus the float32 rounding
// of the decoded product, at most half an ulp of Qval). An all-zero tensor has
// step 0 and decodes to exact zeros.
//
// Payload: the common header (payload.h), then
//   uint8  bits (2..16)
//   f32    step (finite, >= 0)
//   body   numel codes of `bits` bits each, LSB-first (BitWriter), offset
//          binary: code = q + 2^(bits-1) - 1, so codes lie in 0..2^bits - 2
//          (the all-ones code is never written and is rejected on decode).
//   EncodedBytes(shape) = HeaderBytes(rank) + 1 + 4 + ceil(bits * numel / 8).
//
// Subnormal corner: if max|R| is so small (below ~1e-34 at 16 bits) that the
// float32 step loses precision or underflows, the guarantee is only
// |Qval - val| <= max|R| (with step 0 everything decodes to 0).
//
// Encode: INVALID_ARGUMENT for non-finite input (CheckFinite).
// Decode: INVALID_ARGUMENT for a bad header, bits other than this codec's,
// a non-finite or negative step, a body length other than the shape implies,
// or an out-of-range code.
//
// Thread-safety: immutable; share freely.
#ifndef PIPETRAIN_KERNELS_COMPRESS_LINEAR_CODEC_H_
#define PIPETRAIN_KERNELS_COMPRESS_LINEAR_CODEC_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/compress/codec.h"

namespace pipetrain {

inline constexpr int kLinearMinBits = 2;
inline constexpr int kLinearMaxBits = 16;

// eq. (4): max|R| / (2^(bits-1) - 1) in double, as float32, one ulp
// smaller where rounding up made qmax x step overflow float32 (max|R| =
// FLT_MAX: the largest code would decode beyond the float range, which
// Decode refuses); the guarantee above holds with either. The CUDA encoder
// (kernels/cuda/quantize.h) uses it too. Requires finite max_abs >= 0 and
// 2 <= bits <= 16.
float LinearStep(float max_abs, int bits);

// name() "linear:bits=<bits>", codec id kLinear. INVALID_ARGUMENT naming
// "bits" unless 2 <= bits <= 16.
absl::StatusOr<std::unique_ptr<Codec>> MakeLinearCodec(int bits);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_COMPRESS_LINEAR_CODEC_H_
