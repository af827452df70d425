#include "kernels/compress/token_topk_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/compress/elem_topk_codec.h"
#include "kernels/compress/payload.h"

namespace pipetrain {
namespace {

// Tokens = product of all but the last dimension. Requires rank >= 1.
int64_t TokenCount(const Shape& shape) {
  return NumElements(Shape(shape.begin(), shape.end() - 1));
}

absl::Status CheckRank(const Shape& shape) {
  if (shape.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token_topk: tensor ", ShapeToString(shape),
        " has rank < 2; tokens are all but the last dimension, so it needs [.., T, d]"));
  }
  // Tokens of no values: a payload's token count would then be bounded by
  // nothing its receiver checks (the tensor's size is 0), and the kept
  // tokens' indices cost 64 bytes per mask byte to decode.
  if (shape.back() == 0 && TokenCount(shape) > 0) {
    return absl::InvalidArgumentError(absl::StrCat("token_topk: tensor ", ShapeToString(shape),
                                                   " has tokens of width 0; nothing to select"));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<bool> SelectTokens(absl::Span<const double> score, int64_t kept) {
  std::vector<int64_t> order(score.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  auto before = [&score](int64_t a, int64_t b) {
    return score[a] != score[b] ? score[a] > score[b] : a < b;
  };
  std::nth_element(order.begin(), order.begin() + kept, order.end(), before);
  std::vector<bool> mask(score.size(), false);
  for (int64_t i = 0; i < kept; ++i) mask[order[i]] = true;
  return mask;
}

namespace {

// Reads the mask; fills the kept token indices (ascending).
absl::Status ReadMask(ByteReader* r, int64_t tokens, int64_t kept,
                      std::vector<int64_t>* kept_tokens) {
  absl::string_view bytes;
  if (!r->Bytes(PackedBytes(tokens, 1), &bytes)) {
    return absl::InvalidArgumentError("token_topk: payload truncated in the token mask");
  }
  // Counted before any index is stored: the indices take 64 bits per marked
  // token, so a wrong count must be refused before a peer's mask of n
  // bytes grows a vector of up to 64 n bytes.
  BitReader count(bytes);
  int64_t marked = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    uint32_t bit = 0;
    count.Get(1, &bit);  // The byte count was checked: this read succeeds.
    marked += bit;
  }
  uint32_t pad = 0;
  const int pad_bits = static_cast<int>(PackedBytes(tokens, 1) * 8 - tokens);
  if (pad_bits > 0 && count.Get(pad_bits, &pad) && pad != 0) {
    return absl::InvalidArgumentError("token_topk: mask padding bits are set; payload corrupted");
  }
  if (marked != kept) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token_topk: mask marks ", marked, " tokens, header says ", kept, "; payload corrupted"));
  }
  kept_tokens->reserve(static_cast<size_t>(kept));
  BitReader bits(bytes);
  for (int64_t t = 0; t < tokens; ++t) {
    uint32_t bit = 0;
    bits.Get(1, &bit);
    if (bit) kept_tokens->push_back(t);
  }
  return absl::OkStatus();
}

}  // namespace

void WriteTokenTopKPrefix(const Shape& shape, double keep, int64_t kept,
                          const std::vector<bool>& mask, std::string* out) {
  WriteHeader(CodecId::kTokenTopK, shape, out);
  ByteWriter w(out);
  w.F32(static_cast<float>(keep));
  w.I64(kept);
  BitWriter bits(out);
  for (bool m : mask) bits.Put(m ? 1 : 0, 1);
  bits.Finish();
}

absl::StatusOr<absl::string_view> TokenTopKInnerPayload(absl::string_view body, int64_t kept,
                                                        int64_t d) {
  ByteReader r(body);
  int64_t length = 0;
  if (!r.I64(&length) || length != r.remaining()) {
    return absl::InvalidArgumentError("token_topk: inner payload length does not match the body");
  }
  const absl::string_view inner = body.substr(8);
  absl::StatusOr<Shape> announced = PeekPayloadShape(inner);
  if (!announced.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token_topk: inner payload: ", announced.status().message()));
  }
  if (*announced != Shape{kept, d}) {
    return absl::InvalidArgumentError(absl::StrCat("token_topk: inner payload has shape ",
                                                   ShapeToString(*announced), ", expected ",
                                                   ShapeToString({kept, d})));
  }
  return inner;
}

absl::StatusOr<TokenTopKPrefix> ReadTokenTopKPrefix(ByteReader* r, double keep) {
  TokenTopKPrefix prefix;
  ASSIGN_OR_RETURN(prefix.shape, ReadHeader(CodecId::kTokenTopK, r));
  RETURN_IF_ERROR(CheckRank(prefix.shape));
  const int64_t tokens = TokenCount(prefix.shape);
  float payload_keep = 0;
  int64_t kept = 0;
  if (!r->F32(&payload_keep) || !r->I64(&kept)) {
    return absl::InvalidArgumentError("token_topk: payload truncated in its parameters");
  }
  if (payload_keep != static_cast<float>(keep) || kept != TopKCount(keep, tokens)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token_topk: payload has keep ", payload_keep, " and ", kept,
        " kept tokens; this codec has keep ", keep, " (", TopKCount(keep, tokens), " of ", tokens,
        "); codec mismatch or corruption"));
  }
  RETURN_IF_ERROR(ReadMask(r, tokens, kept, &prefix.kept_tokens));
  return prefix;
}

absl::Status CheckTokenTopKRank(const Shape& shape) { return CheckRank(shape); }

absl::Status CheckTokenTopKScores(absl::Span<const float> scores, const Shape& shape) {
  const int64_t tokens = TokenCount(shape);
  if (static_cast<int64_t>(scores.size()) != tokens) {
    return absl::InvalidArgumentError(absl::StrCat("token_topk: scores has ", scores.size(),
                                                   " entries, but ", ShapeToString(shape),
                                                   " has ", tokens, " tokens"));
  }
  for (size_t t = 0; t < scores.size(); ++t) {
    if (!std::isfinite(scores[t])) {
      return absl::InvalidArgumentError(absl::StrCat("token_topk: scores[", t, "] is ",
                                                     double{scores[t]}, "; scores must be finite"));
    }
  }
  return absl::OkStatus();
}

TokenTopKCodec::TokenTopKCodec(double keep, std::unique_ptr<Codec> inner)
    : keep_(keep), inner_(std::move(inner)) {}

std::string TokenTopKCodec::name() const {
  std::string n = absl::StrCat("token_topk:keep=", keep_);
  if (inner_ != nullptr) absl::StrAppend(&n, "+", inner_->name());
  return n;
}

absl::StatusOr<std::string> TokenTopKCodec::Encode(const Tensor& x, CodecState* state) const {
  RETURN_IF_ERROR(CheckRank(x.shape()));
  RETURN_IF_ERROR(CheckFinite(x, "token_topk"));
  const int64_t tokens = TokenCount(x.shape());
  const int64_t d = x.shape().back();
  std::vector<double> score(static_cast<size_t>(tokens), 0.0);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = x.data() + t * d;
    double sum = 0;
    for (int64_t j = 0; j < d; ++j) sum += double{row[j]} * row[j];
    score[t] = sum;  // Squared norm: same order as the norm.
  }
  const int64_t kept = TopKCount(keep_, tokens);
  return EncodeSelected(x, SelectTokens(score, kept), kept, state);
}

absl::StatusOr<std::string> TokenTopKCodec::EncodeWithScores(const Tensor& x,
                                                             absl::Span<const float> scores,
                                                             CodecState* state) const {
  RETURN_IF_ERROR(CheckRank(x.shape()));
  RETURN_IF_ERROR(CheckFinite(x, "token_topk"));
  const int64_t tokens = TokenCount(x.shape());
  RETURN_IF_ERROR(CheckTokenTopKScores(scores, x.shape()));
  std::vector<double> score(scores.begin(), scores.end());
  const int64_t kept = TopKCount(keep_, tokens);
  return EncodeSelected(x, SelectTokens(score, kept), kept, state);
}

absl::StatusOr<std::string> TokenTopKCodec::EncodeSelected(const Tensor& x,
                                                           const std::vector<bool>& mask,
                                                           int64_t kept, CodecState* state) const {
  const int64_t d = x.shape().back();
  Tensor values = Tensor::Zeros({kept, d});
  int64_t row = 0;
  for (size_t t = 0; t < mask.size(); ++t) {
    if (!mask[t]) continue;
    std::memcpy(values.data() + row * d, x.data() + t * d, sizeof(float) * d);
    ++row;
  }
  std::string out;
  WriteTokenTopKPrefix(x.shape(), keep_, kept, mask, &out);
  ByteWriter w(&out);
  if (inner_ == nullptr) {
    w.F32s(values.data(), values.numel());
    return out;
  }
  ASSIGN_OR_RETURN(std::string inner, inner_->Encode(values, state));
  w.I64(static_cast<int64_t>(inner.size()));
  w.Bytes(inner);
  return out;
}

absl::StatusOr<Tensor> TokenTopKCodec::Decode(absl::string_view payload) const {
  ByteReader r(payload);
  ASSIGN_OR_RETURN(TokenTopKPrefix prefix, ReadTokenTopKPrefix(&r, keep_));
  const Shape& shape = prefix.shape;
  const std::vector<int64_t>& kept_tokens = prefix.kept_tokens;
  const int64_t kept = static_cast<int64_t>(kept_tokens.size());
  absl::string_view body;
  r.Bytes(r.remaining(), &body);
  const int64_t d = shape.back();
  ASSIGN_OR_RETURN(Tensor values, DecodeValues(body, kept, d));
  Tensor out = Tensor::Zeros(shape);
  for (int64_t i = 0; i < kept; ++i) {
    std::memcpy(out.data() + kept_tokens[i] * d, values.data() + i * d, sizeof(float) * d);
  }
  return out;
}

absl::StatusOr<Tensor> TokenTopKCodec::DecodeValues(absl::string_view body, int64_t kept,
                                                     int64_t d) const {
  Tensor values;
  ByteReader r(body);
  if (inner_ == nullptr) {
    if (r.remaining() != 4 * kept * d) {
      return absl::InvalidArgumentError(absl::StrCat("token_topk: body is ", r.remaining(),
                                                     " bytes, expected ", 4 * kept * d));
    }
    values = Tensor::Zeros({kept, d});
    r.F32s(values.data(), values.numel());  // The length was checked above.
    RETURN_IF_ERROR(CheckFinite(values, "token_topk decode"));
  } else {
    ASSIGN_OR_RETURN(const absl::string_view inner, TokenTopKInnerPayload(body, kept, d));
    ASSIGN_OR_RETURN(values, inner_->Decode(inner));
    if (values.shape() != Shape{kept, d}) {
      return absl::InvalidArgumentError(absl::StrCat("token_topk: inner payload has shape ",
                                                     ShapeToString(values.shape()), ", expected ",
                                                     ShapeToString({kept, d})));
    }
  }
  return values;
}

int64_t TokenTopKCodec::EncodedBytes(const Shape& shape) const {
  if (shape.size() < 2) return -1;
  const int64_t tokens = TokenCount(shape);
  const int64_t kept = TopKCount(keep_, tokens);
  const int64_t d = shape.back();
  const int64_t body = inner_ == nullptr ? 4 * kept * d : 8 + inner_->EncodedBytes({kept, d});
  return HeaderBytes(static_cast<int>(shape.size())) + 4 + 8 + PackedBytes(tokens, 1) + body;
}

absl::StatusOr<std::unique_ptr<TokenTopKCodec>> MakeTokenTopKCodec(double keep,
                                                                   std::unique_ptr<Codec> inner) {
  if (!(keep > 0.0 && keep <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("token_topk: keep ", keep, " is out of range (0, 1]"));
  }
  return std::make_unique<TokenTopKCodec>(keep, std::move(inner));
}

}  // namespace pipetrain
