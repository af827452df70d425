// Element-level top-k sparsification: keeps the k = TopKCount(keep, numel)
// elements of largest magnitude and zeros the rest on decode.
//
// Selection: by |x| descending; equal magnitudes are broken by the lower
// flat index, so the kept set is deterministic.
//
// Payload: the common header (payload.h), then
//   int64  count (== TopKCount(keep, numel))
//   count x (uint32 flat index, f32 value), indices strictly increasing.
//   EncodedBytes(shape) = HeaderBytes(rank) + 8 + 8 * count.
// Kept values travel as exact float32 bits, so decode restores them exactly.
//
// Encode: INVALID_ARGUMENT for non-finite input, or numel > 2^32 (indices
// are uint32). Decode: INVALID_ARGUMENT for a bad header, a count that does
// not match the shape and keep, a body of the wrong length, indices out of
// range or not increasing, or a non-finite value.
//
// Thread-safety: immutable; share freely.
#ifndef PIPETRAIN_KERNELS_COMPRESS_ELEM_TOPK_CODEC_H_
#define PIPETRAIN_KERNELS_COMPRESS_ELEM_TOPK_CODEC_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/compress/codec.h"

namespace pipetrain {

// ceil(keep * n), clamped to [0, n]. The product is taken in double with a
// relative slack of 1e-9 before the ceiling, so that e.g. keep 0.3 of 10
// gives 3 (0.3 * 10 is 3.0000000000000004 in binary floating point).
// Shared by the top-k codecs. Requires keep in (0, 1], n >= 0.
int64_t TopKCount(double keep, int64_t n);

// name() "elem_topk:keep=<keep>". INVALID_ARGUMENT naming `keep` unless
// 0 < keep <= 1.
absl::StatusOr<std::unique_ptr<Codec>> MakeElemTopKCodec(double keep);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_COMPRESS_ELEM_TOPK_CODEC_H_
