// Compression codecs for tensors on the wire between stages (DESIGN.md §6;
// the Compression issue). One interface for all codecs: Encode turns a
// float32 tensor into a self-describing, bit-packed payload (payload.h
// defines the common header: magic, codec id, shape, codec parameters);
// Decode turns a payload back into a tensor of the original shape.
//
// Contracts every codec keeps:
//  - Encode rejects non-finite input (NaN or Inf) with INVALID_ARGUMENT naming
//    the first bad index; it never encodes it silently.
//  - Decode never reads outside the payload: a truncated, corrupted or
//    foreign payload is INVALID_ARGUMENT (bad header, wrong codec, sizes that
//    do not add up), never a crash (tests run under ASan).
//  - Decode allocates the shape the payload's header announces (at most
//    2^40 elements), which a sparse or low-rank payload may announce from a
//    few bytes: receivers check it against the shape they expect first
//    (PeekPayloadShape in payload.h).
//  - The encoded size is a documented function of the shape and parameters
//    (EncodedBytes), equal to Encode's output size.
//  - Deterministic: equal inputs (and state) give equal payloads.
//
// State: codecs that carry something from call to call on one link (PowerSGD's
// warm-started Q) keep it in a CodecState owned by the caller, one per link
// and direction; stateless codecs ignore it. Error feedback (adding the
// previous residual before encoding) is the caller's, see error_feedback.h.
//
// Thread-safety: a Codec is immutable and may be shared; a CodecState is not.
#ifndef PIPETRAIN_KERNELS_COMPRESS_CODEC_H_
#define PIPETRAIN_KERNELS_COMPRESS_CODEC_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tensor.h"

namespace pipetrain {

// Per-link state a codec may keep between calls (owned by the caller).
struct CodecState {
  Tensor powersgd_q;  // PowerSGD: the previous call's Q, reused as the start
};

class Codec {
 public:
  virtual ~Codec() = default;

  // The codec's spec string, e.g. "piecewise:bits=3" (codec_spec.h).
  virtual std::string name() const = 0;

  // Encodes `x` (any shape; numel may be 0). `state` may be null for
  // stateless codecs. INVALID_ARGUMENT for non-finite values.
  virtual absl::StatusOr<std::string> Encode(const Tensor& x, CodecState* state) const = 0;

  // Decodes a payload produced by this codec (same parameters).
  virtual absl::StatusOr<Tensor> Decode(absl::string_view payload) const = 0;

  // The exact size Encode produces for a tensor of `shape`.
  virtual int64_t EncodedBytes(const Shape& shape) const = 0;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_COMPRESS_CODEC_H_
