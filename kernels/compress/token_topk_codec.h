// Token-level top-k sparsification (acctfm §4.3.1): of the tokens of an
// activation [B, T, d] (any rank >= 2: the tokens are all but the last
// dimension, each token a row of d values), keep the
// kept = TopKCount(keep, tokens) most important ones and zero the rest.
//
// Importance: by default each token's L2 norm. A caller that has the
// paper's attention score (the column sums An of the attention matrix,
// all-reduced so every device selects the same tokens) passes it to
// EncodeWithScores instead. Higher score = more important; equal scores are
// broken by the lower token index, so selection is deterministic.
//
// Payload: the common header (payload.h), then
//   f32    keep (must equal this codec's keep)
//   int64  kept
//   ceil(tokens / 8) bytes: the token mask, bit t set iff token t is kept
//          (LSB first, BitWriter; padding bits zero)
//   body:  raw codec: kept * d f32 values, kept tokens in index order;
//          inner codec: int64 length, then the inner codec's payload of the
//          [kept, d] tensor of kept tokens (this is "token_topk+piecewise").
//   EncodedBytes(shape) = HeaderBytes(rank) + 4 + 8 + ceil(tokens / 8)
//                         + (raw ? 4 * kept * d : 8 + inner.EncodedBytes({kept, d})),
//   and -1 for rank < 2 (not encodable).
// Decode restores kept tokens exactly (raw) or within the inner codec's
// bound, and zeros the others.
//
// Errors (INVALID_ARGUMENT): Encode for rank < 2, non-finite input, a score
// vector whose size is not `tokens` or that holds a non-finite score, and any
// error of the inner codec. Decode for a bad header, keep or kept that do not
// match, a mask whose popcount is not kept or with padding bits set, body
// lengths that do not add up, and the inner codec's errors (or a shape other
// than [kept, d] from it).
//
// Thread-safety: immutable; share freely. The CodecState passed to Encode is
// handed on to the inner codec.
#ifndef PIPETRAIN_KERNELS_COMPRESS_TOKEN_TOPK_CODEC_H_
#define PIPETRAIN_KERNELS_COMPRESS_TOKEN_TOPK_CODEC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/compress/codec.h"
#include "kernels/compress/payload.h"

namespace pipetrain {

class TokenTopKCodec : public Codec {
 public:
  // Use MakeTokenTopKCodec (validates keep). `inner` may be null (raw f32).
  TokenTopKCodec(double keep, std::unique_ptr<Codec> inner);

  // "token_topk:keep=<keep>" or "token_topk:keep=<keep>+<inner name>".
  std::string name() const override;
  // Selects tokens by L2 norm.
  absl::StatusOr<std::string> Encode(const Tensor& x, CodecState* state) const override;
  // Selects tokens by `scores` (one per token, row-major over all but the
  // last dimension of x).
  absl::StatusOr<std::string> EncodeWithScores(const Tensor& x, absl::Span<const float> scores,
                                               CodecState* state) const;
  absl::StatusOr<Tensor> Decode(absl::string_view payload) const override;
  int64_t EncodedBytes(const Shape& shape) const override;

  double keep() const { return keep_; }

 private:
  absl::StatusOr<std::string> EncodeSelected(const Tensor& x, const std::vector<bool>& mask,
                                             int64_t kept, CodecState* state) const;
  // The [kept, d] values of the kept tokens from the body.
  absl::StatusOr<Tensor> DecodeValues(absl::string_view body, int64_t kept, int64_t d) const;

  double keep_;
  std::unique_ptr<Codec> inner_;
};

// The mask of the `kept` (<= score.size()) tokens of highest score, equal
// scores going to the lower index: the codec's selection, also AccTFM's
// per-sample choice of the tensor-parallel all-reduce's tokens.
std::vector<bool> SelectTokens(absl::Span<const double> score, int64_t kept);

// INVALID_ARGUMENT naming `keep` unless 0 < keep <= 1.
absl::StatusOr<std::unique_ptr<TokenTopKCodec>> MakeTokenTopKCodec(
    double keep, std::unique_ptr<Codec> inner = nullptr);

// The payload's parts before the body, shared with the GPU twin
// (kernels/cuda/token_topk_payload.h) so that both write and check them
// alike.
// Appends the header, keep, kept and the token mask of a `shape` tensor.
void WriteTokenTopKPrefix(const Shape& shape, double keep, int64_t kept,
                          const std::vector<bool>& mask, std::string* out);
struct TokenTopKPrefix {
  Shape shape;
  std::vector<int64_t> kept_tokens;  // ascending
};
// Reads them for a codec of `keep`, leaving `r` at the body; Decode's
// errors for them.
absl::StatusOr<TokenTopKPrefix> ReadTokenTopKPrefix(ByteReader* r, double keep);
// The body after the prefix of a payload with an inner codec: its length
// (int64) and then the inner payload, whose header must announce
// [kept, d]; returns the inner payload (a view into `body`), checked before
// it is decoded (and so allocated: it could announce a far larger tensor).
// Decode's INVALID_ARGUMENT errors for them.
absl::StatusOr<absl::string_view> TokenTopKInnerPayload(absl::string_view body, int64_t kept,
                                                        int64_t d);
// OK, or Encode's INVALID_ARGUMENT for a tensor of rank < 2.
absl::Status CheckTokenTopKRank(const Shape& shape);
// OK, or EncodeWithScores' INVALID_ARGUMENT for `scores` of a tensor of
// `shape` (rank >= 2): not one per token, or one not finite.
absl::Status CheckTokenTopKScores(absl::Span<const float> scores, const Shape& shape);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_COMPRESS_TOKEN_TOPK_CODEC_H_
