// The fp16 and bf16 codecs on the GPU: payloads byte-identical to
// kernels/compress/fp16_codec.h's (read it for the format and the overflow
// policy), so a CUDA stage sends half the bytes of fp32 without an fp32
// copy crossing to the host, and reads such a payload into device memory.
//
// Rounding: CUDA's __float2half_rn and __float2bfloat16_rn round to nearest
// even as the CPU's bit manipulations do (subnormal results included; a
// float subnormal input gives a signed zero in fp16 and a bf16 subnormal in
// bf16, on both sides; the cvt instructions do not flush), and the
// widenings are exact; half_codec_test.cc compares every edge (ties, the largest
// finite values, subnormals) byte for byte.
//
// Errors, in the CPU codec's order and words: a non-finite input
// (NonFiniteError), then the first element that rounds to infinity
// (HalfOverflowError); decoding, a bad header or body length, a payload of
// more than `capacity` values, then the first element that widens to a
// non-finite value (HalfCorruptError). INTERNAL for CUDA failures.
//
// Synchronisation: both wait for `stream` (a payload is a host string).
// Scratch comes from the stream-keyed cache (stream_scratch.h).
// Thread-safety: no shared state.
#ifndef PIPETRAIN_KERNELS_CUDA_HALF_CODEC_H_
#define PIPETRAIN_KERNELS_CUDA_HALF_CODEC_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tensor.h"

namespace pipetrain {

enum class HalfFormat { kFp16, kBf16 };

// MakeFp16Codec()->Encode (or MakeBf16Codec()) of x (device, `shape`).
absl::StatusOr<std::string> HalfEncodeCuda(HalfFormat format, const float* x, const Shape& shape,
                                           cudaStream_t stream);

// Decodes such a payload into out[0, numel) (device) and returns its shape.
absl::StatusOr<Shape> HalfDecodeCuda(HalfFormat format, absl::string_view payload, float* out,
                                     int64_t capacity, cudaStream_t stream);

// --- Body kernels (device pointers; exposed for the codec and its tests) ---

// body[i] = x[i] rounded to the narrow format, i in [0, n); *first_bad
// (device) is lowered to the smallest i whose value rounds to infinity (the
// caller sets it to UINT64_MAX first; x must be finite). Queues work only.
// INVALID_ARGUMENT for n < 0; INTERNAL if the launch fails.
absl::Status HalfPackCuda(HalfFormat format, const float* x, int64_t n, uint16_t* body,
                          unsigned long long* first_bad, cudaStream_t stream);

// out[i] = body[i] widened exactly; *first_bad as above, for an element
// that widens to Inf or NaN. Queues work only; errors as HalfPackCuda.
absl::Status HalfUnpackCuda(HalfFormat format, const uint16_t* body, int64_t n, float* out,
                            unsigned long long* first_bad, cudaStream_t stream);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_HALF_CODEC_H_
