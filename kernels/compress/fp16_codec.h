// Half-precision casts on the wire: fp16 (IEEE binary16) and bf16 (the top 16
// bits of a float32). Both round to nearest, ties to even.
//
// Payload: the common header (payload.h), then one little-endian uint16 per
// element in row-major order; no codec parameters.
//   EncodedBytes(shape) = HeaderBytes(rank) + 2 * numel.
//
// Overflow policy: inputs are finite (CheckFinite), but a finite float32 may
// round to infinity in the narrow format (fp16: |x| >= 65520, the halfway
// point above the largest fp16 65504; bf16: |x| above the halfway point past
// 3.3895e38). Encode rejects such an element with INVALID_ARGUMENT naming its
// index instead of saturating: a silently clipped activation or gradient would
// be a wrong value the receiver cannot detect. Values below the smallest
// subnormal round to (signed) zero, as a cast does.
//
// Decode returns INVALID_ARGUMENT for a bad header (payload.h), a body whose
// length is not exactly 2 * numel, or an element that decodes to Inf/NaN
// (only a corrupted payload can hold one).
//
// Thread-safety: the codecs are immutable; share them freely.
#ifndef PIPETRAIN_KERNELS_COMPRESS_FP16_CODEC_H_
#define PIPETRAIN_KERNELS_COMPRESS_FP16_CODEC_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/compress/codec.h"
#include "kernels/compress/payload.h"

namespace pipetrain {

// name() "fp16", codec id kFp16.
std::unique_ptr<Codec> MakeFp16Codec();
// name() "bf16", codec id kBf16.
std::unique_ptr<Codec> MakeBf16Codec();

// The codecs' errors (INVALID_ARGUMENT), also for their GPU twin
// (kernels/cuda/half_codec.h): element `index` = `value` rounds to infinity
// in `codec` ("fp16" or "bf16"); element `index` of a payload decodes to a
// non-finite value.
absl::Status HalfOverflowError(absl::string_view codec, int64_t index, float value);
absl::Status HalfCorruptError(absl::string_view codec, int64_t index);

// A payload's shape and body (2 bytes per value, little-endian), checked as
// Decode checks them (the header for codec `id`, named `codec`; the body's
// length): Decode's reader, shared with the GPU twin.
struct HalfPayload {
  Shape shape;
  absl::string_view body;
};
absl::StatusOr<HalfPayload> ReadHalfPayload(absl::string_view codec, CodecId id,
                                            absl::string_view payload);

// Scalar conversions used by the codecs, exposed for tests. The From*
// functions are exact. The To* functions round to nearest even and return
// false (leaving *out unspecified) when the rounded value is not finite.
bool FloatToFp16(float x, uint16_t* out);
float Fp16ToFloat(uint16_t h);
bool FloatToBf16(float x, uint16_t* out);
float Bf16ToFloat(uint16_t h);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_COMPRESS_FP16_CODEC_H_
