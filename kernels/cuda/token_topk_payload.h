// The token_topk codec on the GPU, alone or with a linear or piecewise
// inner codec ("token_topk:keep=0.5+piecewise:bits=3"): payloads
// byte-identical to kernels/compress/token_topk_codec.h's, so a CUDA stage
// sends the CPU's payload without an fp32 copy crossing to the host, and
// reads one into device memory. Built from the selection, gather and
// scatter kernels (token_topk.h), the quantize codecs (quantize.h), and the
// CPU codec's own prefix writer and reader (header, keep, kept, mask), so
// the two cannot drift apart.
//
// Synchronisation: both wait for `stream` (the payload is a host string).
// Scratch comes from the device's stream-keyed cache (stream_scratch.h).
// Thread-safety: no shared state.
#ifndef PIPETRAIN_KERNELS_CUDA_TOKEN_TOPK_PAYLOAD_H_
#define PIPETRAIN_KERNELS_CUDA_TOKEN_TOPK_PAYLOAD_H_

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/tensor.h"

namespace pipetrain {

// The inner codec of the kept tokens: none (raw f32), or one the quantize
// kernels have.
struct TokenTopKInner {
  enum class Kind { kRaw, kLinear, kPiecewise };
  Kind kind = Kind::kRaw;
  int bits = 0;  // linear: bits per value; piecewise: clusters N
};

// MakeTokenTopKCodec(keep, inner)->Encode of x (device, `shape`), or
// EncodeWithScores with `scores` (host, one per token) when non-empty.
// The CPU's INVALID_ARGUMENT errors (rank < 2, a non-finite value or score,
// a score count other than the token count, keep out of range), and one for
// an empty tensor (encode it on the host); INTERNAL on CUDA failures.
absl::StatusOr<std::string> TokenTopKEncodeCuda(const float* x, const Shape& shape, double keep,
                                                const TokenTopKInner& inner,
                                                absl::Span<const float> scores,
                                                cudaStream_t stream);

// Decodes such a payload into out[0, numel) (device; kept tokens' values,
// zeros elsewhere) and returns its shape. The CPU Decode's INVALID_ARGUMENT
// errors, and one for a payload of more than `capacity` values or of an
// empty tensor (decode it on the host); INTERNAL on CUDA failures.
absl::StatusOr<Shape> TokenTopKDecodeCuda(absl::string_view payload, double keep,
                                          const TokenTopKInner& inner, float* out,
                                          int64_t capacity, cudaStream_t stream);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_TOKEN_TOPK_PAYLOAD_H_
