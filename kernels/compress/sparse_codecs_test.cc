#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/compress/elem_topk_codec.h"
#include "kernels/compress/error_feedback.h"
#include "kernels/compress/payload.h"
#include "kernels/compress/powersgd_codec.h"
#include "kernels/compress/token_topk_codec.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

// Deterministic values in [-1, 1) (raw mt19937 output is specified by the
// standard; the distributions are not).
Tensor RandomTensor(const Shape& shape, uint32_t seed) {
  std::mt19937 gen(seed);
  Tensor t = Tensor::Zeros(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = static_cast<float>(gen()) / 2147483648.0f - 1.0f;
  return t;
}

// Test-only inner codec: values rounded to multiples of 1/256 as int32, so
// decoded values are within 1/512 of the input.
class RoundingCodec : public Codec {
 public:
  static constexpr float kBound = 1.0f / 512;
  std::string name() const override { return "round256"; }
  absl::StatusOr<std::string> Encode(const Tensor& x, CodecState*) const override {
    std::string out;
    WriteHeader(CodecId::kLinear, x.shape(), &out);
    ByteWriter w(&out);
    for (int64_t i = 0; i < x.numel(); ++i) {
      w.U32(static_cast<uint32_t>(static_cast<int32_t>(std::lround(x[i] * 256.0f))));
    }
    return out;
  }
  absl::StatusOr<Tensor> Decode(absl::string_view payload) const override {
    ByteReader r(payload);
    absl::StatusOr<Shape> shape = ReadHeader(CodecId::kLinear, &r);
    if (!shape.ok()) return shape.status();
    if (r.remaining() != 4 * NumElements(*shape)) return absl::InvalidArgumentError("round256 body");
    Tensor out = Tensor::Zeros(*shape);
    for (int64_t i = 0; i < out.numel(); ++i) {
      uint32_t v = 0;
      r.U32(&v);
      out[i] = static_cast<float>(static_cast<int32_t>(v)) / 256.0f;
    }
    return out;
  }
  int64_t EncodedBytes(const Shape& shape) const override {
    return HeaderBytes(static_cast<int>(shape.size())) + 4 * NumElements(shape);
  }
};

// Every strict prefix of a valid payload is rejected with INVALID_ARGUMENT.
void ExpectPrefixesRejected(const Codec& codec, const std::string& payload) {
  for (size_t n = 0; n < payload.size(); ++n) {
    absl::StatusOr<Tensor> t = codec.Decode(absl::string_view(payload.data(), n));
    ASSERT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << "prefix length " << n;
  }
}

// Flipping any single byte never crashes and fails, if at all, with
// INVALID_ARGUMENT (a flipped value byte can decode to another valid tensor;
// ASan checks that no read leaves the payload).
void ExpectByteFlipsSafe(const Codec& codec, const std::string& payload) {
  for (size_t i = 0; i < payload.size(); ++i) {
    std::string bad = payload;
    bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    absl::StatusOr<Tensor> t = codec.Decode(bad);
    if (!t.ok()) {
      EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << "byte " << i;
    }
  }
}

double RelativeError(const Tensor& a, const Tensor& b) {
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    diff += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    norm += double{b[i]} * b[i];
  }
  return std::sqrt(diff / norm);
}

// ---------------------------------------------------------------- TopKCount

TEST(TopKCountTest, Rounding_CeilWithoutBinaryNoise) {
  EXPECT_EQ(TopKCount(0.3, 10), 3);
  EXPECT_EQ(TopKCount(0.3, 13), 4);
  EXPECT_EQ(TopKCount(0.01, 1), 1);
  EXPECT_EQ(TopKCount(1.0, 7), 7);
  EXPECT_EQ(TopKCount(0.5, 0), 0);
  EXPECT_EQ(TopKCount(0.1, 30), 3);  // 0.1 * 30 is 3.0000000000000004
  // Large counts: ceil(keep * n), not a whole element less (a slack
  // relative to keep * n alone was 2 elements at 2e9).
  EXPECT_EQ(TopKCount(1.0, 2'000'000'000), 2'000'000'000);
  EXPECT_EQ(TopKCount(0.5, 4'000'000'001), 2'000'000'001);
}

// ---------------------------------------------------------------- token_topk

std::unique_ptr<TokenTopKCodec> TokenCodec(double keep, std::unique_ptr<Codec> inner = nullptr) {
  auto codec = MakeTokenTopKCodec(keep, std::move(inner));
  EXPECT_TRUE(codec.ok()) << codec.status();
  return std::move(codec).value();
}

TEST(TokenTopKTest, Encode_KeepsLargestNormTokensExactlyAndZerosRest) {
  // [2, 3, 2]: token norms^2 are 1, 25, 4, 0.25, 100, 9.
  const Tensor x = Tensor::FromVector(
      {2, 3, 2}, {1, 0, 3, 4, 0, -2, 0.5f, 0, 6, -8, 0, 3});
  auto codec = TokenCodec(0.5);
  auto payload = codec->Encode(x, nullptr);
  ASSERT_TRUE(payload.ok()) << payload.status();
  EXPECT_EQ(static_cast<int64_t>(payload->size()), codec->EncodedBytes(x.shape()));
  auto y = codec->Decode(*payload);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->shape(), x.shape());
  // Kept: tokens 1 (25), 4 (100), 5 (9).
  EXPECT_EQ(y->ToVector(), (std::vector<float>{0, 0, 3, 4, 0, 0, 0, 0, 6, -8, 0, 3}));
}

TEST(TokenTopKTest, Encode_MaskIsCeilTokensOver8Bytes) {
  const Tensor x = RandomTensor({13, 5}, 1);
  auto codec = TokenCodec(0.3);  // 4 of 13 tokens.
  auto payload = codec->Encode(x, nullptr);
  ASSERT_TRUE(payload.ok());
  const int64_t mask_bytes = 2;  // ceil(13 / 8).
  EXPECT_EQ(static_cast<int64_t>(payload->size()), HeaderBytes(2) + 4 + 8 + mask_bytes + 4 * 4 * 5);
  EXPECT_EQ(static_cast<int64_t>(payload->size()), codec->EncodedBytes(x.shape()));
  int set = 0;
  for (int b = 0; b < mask_bytes; ++b) {
    set += __builtin_popcount(static_cast<uint8_t>((*payload)[HeaderBytes(2) + 12 + b]));
  }
  EXPECT_EQ(set, 4);
}

TEST(TokenTopKTest, Encode_TiesKeepLowerTokenIndex) {
  const Tensor x = Tensor::FromVector({4, 1}, {1, -1, 1, -1});
  auto codec = TokenCodec(0.5);
  auto y = codec->Decode(codec->Encode(x, nullptr).value());
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(y->ToVector(), (std::vector<float>{1, -1, 0, 0}));
}

TEST(TokenTopKTest, EncodeWithScores_SelectsByScoresNotNorm) {
  const Tensor x = Tensor::FromVector({1, 3, 1}, {5, 1, 2});
  auto codec = TokenCodec(0.34);  // ceil(1.02) = 2 tokens.
  const std::vector<float> scores = {0.1f, 0.9f, 0.5f};
  auto payload = codec->EncodeWithScores(x, scores, nullptr);
  ASSERT_TRUE(payload.ok()) << payload.status();
  EXPECT_EQ(codec->Decode(*payload).value().ToVector(), (std::vector<float>{0, 1, 2}));
}

TEST(TokenTopKTest, EncodeWithScores_BadScores_InvalidArgument) {
  const Tensor x = Tensor::Zeros({3, 2});
  auto codec = TokenCodec(0.5);
  const std::vector<float> short_scores = {1, 2};
  auto s = codec->EncodeWithScores(x, short_scores, nullptr);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("scores has 2 entries"));
  const std::vector<float> nan_scores = {1, NAN, 2};
  s = codec->EncodeWithScores(x, nan_scores, nullptr);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("scores[1]"));
}

TEST(TokenTopKTest, Encode_InnerCodec_KeptWithinInnerBoundRestZero) {
  const Tensor x = RandomTensor({2, 8, 6}, 2);
  auto codec = TokenCodec(0.25, std::make_unique<RoundingCodec>());
  EXPECT_EQ(codec->name(), "token_topk:keep=0.25+round256");
  auto raw = TokenCodec(0.25);
  const Tensor exact = raw->Decode(raw->Encode(x, nullptr).value()).value();
  auto payload = codec->Encode(x, nullptr);
  ASSERT_TRUE(payload.ok()) << payload.status();
  EXPECT_EQ(static_cast<int64_t>(payload->size()), codec->EncodedBytes(x.shape()));
  auto y = codec->Decode(*payload);
  ASSERT_TRUE(y.ok()) << y.status();
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (exact[i] == 0.0f) {
      EXPECT_EQ((*y)[i], 0.0f) << i;
    } else {
      EXPECT_NEAR((*y)[i], exact[i], RoundingCodec::kBound) << i;
    }
  }
  ExpectPrefixesRejected(*codec, *payload);
  ExpectByteFlipsSafe(*codec, *payload);
}

TEST(TokenTopKTest, Make_BadKeep_InvalidArgumentNamingKeep) {
  for (double keep : {0.0, -0.5, 1.5, static_cast<double>(NAN)}) {
    auto codec = MakeTokenTopKCodec(keep);
    EXPECT_EQ(codec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(codec.status().message(), HasSubstr("keep"));
  }
}

TEST(TokenTopKTest, Encode_RankOneOrNonFinite_InvalidArgument) {
  auto codec = TokenCodec(0.5);
  auto s = codec->Encode(Tensor::Zeros({4}), nullptr);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("rank < 2"));
  EXPECT_EQ(codec->EncodedBytes({4}), -1);
  for (float bad : {NAN, INFINITY}) {
    Tensor x = Tensor::Zeros({2, 2});
    x[3] = bad;
    s = codec->Encode(x, nullptr);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.status().message(), HasSubstr("element 3"));
  }
}

TEST(TokenTopKTest, Decode_TruncatedCorruptedOrForeign_InvalidArgument) {
  const Tensor x = RandomTensor({3, 5, 4}, 3);
  auto codec = TokenCodec(0.4);
  const std::string payload = codec->Encode(x, nullptr).value();
  ExpectPrefixesRejected(*codec, payload);
  ExpectByteFlipsSafe(*codec, payload);
  auto other = TokenCodec(0.5);
  EXPECT_EQ(other->Decode(payload).status().code(), absl::StatusCode::kInvalidArgument);
  std::string padded = payload;
  padded[HeaderBytes(3) + 12 + 1] |= static_cast<char>(0x80);  // Bit 15 of 15 tokens: padding.
  auto y = codec->Decode(padded);
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(y.status().message(), HasSubstr("padding"));
  auto elem = MakeElemTopKCodec(0.4).value();
  y = elem->Decode(payload);
  EXPECT_THAT(y.status().message(), HasSubstr("payload is for codec 5, not 6"));
}

// An inner payload announcing a far larger tensor than the kept tokens is
// rejected before the inner codec decodes (allocates) it: here 2^39
// elements from an elem_topk payload of one entry.
TEST(TokenTopKTest, Decode_InnerPayloadAnnouncingLargerShape_InvalidArgument) {
  auto codec = MakeTokenTopKCodec(0.5, MakeElemTopKCodec(1e-12).value()).value();
  std::string inner;
  WriteHeader(CodecId::kElemTopK, {int64_t{1} << 39}, &inner);
  ByteWriter iw(&inner);
  iw.I64(1);
  iw.U32(0);
  iw.F32(1.f);
  std::string payload;
  WriteTokenTopKPrefix({2, 4}, 0.5, /*kept=*/1, {true, false}, &payload);
  ByteWriter w(&payload);
  w.I64(static_cast<int64_t>(inner.size()));
  w.Bytes(inner);
  auto y = codec->Decode(payload);
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(y.status().message(),
              HasSubstr("inner payload has shape [549755813888], expected [1, 4]"));
}

// Tokens of width 0: refused by the encoder and by the decoder, which
// would otherwise allocate from a token count no size limit bounds.
TEST(TokenTopKTest, TokensOfWidthZero_InvalidArgument) {
  auto codec = TokenCodec(0.5);
  const auto encoded = codec->Encode(Tensor::Zeros({8, 0}), nullptr);
  EXPECT_EQ(encoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(encoded.status().message(), HasSubstr("tokens of width 0"));
  std::string payload;
  std::vector<bool> mask(1 << 16, false);
  for (int i = 0; i < (1 << 15); ++i) mask[i] = true;
  WriteTokenTopKPrefix({1 << 16, 0}, 0.5, 1 << 15, mask, &payload);
  const auto decoded = codec->Decode(payload);
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(decoded.status().message(), HasSubstr("tokens of width 0"));
}

TEST(TokenTopKTest, Encode_EmptyTokens_RoundTrips) {
  auto codec = TokenCodec(0.5);
  auto payload = codec->Encode(Tensor::Zeros({0, 4}), nullptr);
  ASSERT_TRUE(payload.ok());
  EXPECT_EQ(static_cast<int64_t>(payload->size()), codec->EncodedBytes({0, 4}));
  EXPECT_EQ(codec->Decode(*payload).value().shape(), (Shape{0, 4}));
}

// ---------------------------------------------------------------- elem_topk

TEST(ElemTopKTest, Encode_KeepsLargestMagnitudesExactly) {
  const Tensor x = Tensor::FromVector({2, 3}, {0.5f, -7, 2, 2, -0.25f, 3});
  auto codec = MakeElemTopKCodec(0.5).value();
  EXPECT_EQ(codec->name(), "elem_topk:keep=0.5");
  auto payload = codec->Encode(x, nullptr);
  ASSERT_TRUE(payload.ok());
  EXPECT_EQ(static_cast<int64_t>(payload->size()), HeaderBytes(2) + 8 + 3 * 8);
  EXPECT_EQ(static_cast<int64_t>(payload->size()), codec->EncodedBytes(x.shape()));
  // |2| at index 2 and 3 tie for the third place: index 2 wins.
  EXPECT_EQ(codec->Decode(*payload).value().ToVector(),
            (std::vector<float>{0, -7, 2, 0, 0, 3}));
}

TEST(ElemTopKTest, Encode_RandomTensor_KeptExactCountCeil) {
  const Tensor x = RandomTensor({7, 9}, 4);
  auto codec = MakeElemTopKCodec(0.1).value();  // ceil(6.3) = 7.
  const Tensor y = codec->Decode(codec->Encode(x, nullptr).value()).value();
  int kept = 0;
  float smallest_kept = INFINITY, largest_dropped = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (y[i] != 0.0f) {
      ++kept;
      EXPECT_EQ(y[i], x[i]);
      smallest_kept = std::min(smallest_kept, std::fabs(x[i]));
    } else {
      largest_dropped = std::max(largest_dropped, std::fabs(x[i]));
    }
  }
  EXPECT_EQ(kept, 7);
  EXPECT_GE(smallest_kept, largest_dropped);
}

// The payload's kept indices, in payload order.
std::vector<uint32_t> KeptIndices(const std::string& payload, int rank) {
  ByteReader r(absl::string_view(payload).substr(HeaderBytes(rank)));
  int64_t count = 0;
  EXPECT_TRUE(r.I64(&count));
  std::vector<uint32_t> indices(count);
  for (auto& index : indices) {
    float value;
    EXPECT_TRUE(r.U32(&index));
    EXPECT_TRUE(r.F32(&value));
  }
  return indices;
}

// Large tensors narrow the search with a strided sample (elem_topk_codec.cc);
// the selection must still be exactly the k largest magnitudes, ties to the
// lower index, as brute force finds them. Inputs chosen against the sample:
// sorted both ways (the sample sees an unrepresentative spread), few distinct
// values (huge ties), a spike block the stride skips, large values only at
// the sampled positions (the narrowing misses), and random.
TEST(ElemTopKTest, Encode_LargeTensors_SameSelectionAsBruteForce) {
  const int64_t n = 300007;
  std::mt19937 gen(8);
  std::vector<std::vector<float>> inputs(7, std::vector<float>(n));
  for (int64_t i = 0; i < n; ++i) {
    inputs[0][i] = static_cast<float>(i);                 // ascending
    inputs[1][i] = static_cast<float>(n - i) * -0.5f;     // descending, negative
    inputs[2][i] = static_cast<float>(gen() % 4);         // 4 values: ties everywhere
    inputs[3][i] = (i / 7) % 2 ? 1.0f : -1.0f;            // one magnitude
    inputs[4][i] = static_cast<float>(gen()) / 4294967296.0f;
    inputs[5][i] = static_cast<float>(gen() % 1000) / 1000.0f;
    // Large exactly where a stride-18 sample looks (n / 16384 = 18): the
    // sample overrates the threshold, so the narrowed search misses and
    // the full one must run.
    inputs[6][i] = i % 18 == 0 ? 10.0f : static_cast<float>(gen() % 1000) / 1000.0f;
  }
  for (int64_t i = 1000; i < 1000 + 5000; ++i) inputs[4][i] = 100.0f + i % 3;  // spike block
  for (double keep : {0.001, 0.1, 0.5, 0.9}) {
    auto codec = MakeElemTopKCodec(keep).value();
    for (size_t c = 0; c < inputs.size(); ++c) {
      const std::vector<float>& v = inputs[c];
      const int64_t k = TopKCount(keep, n);
      std::vector<uint32_t> order(n);
      for (int64_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
      std::stable_sort(order.begin(), order.end(), [&v](uint32_t a, uint32_t b) {
        return std::fabs(v[a]) > std::fabs(v[b]);
      });
      order.resize(k);
      std::sort(order.begin(), order.end());
      const std::string payload = codec->Encode(Tensor::FromVector({n}, v), nullptr).value();
      EXPECT_EQ(KeptIndices(payload, 1), order) << "keep " << keep << " input " << c;
    }
  }
}

TEST(ElemTopKTest, Make_BadKeep_InvalidArgument) {
  auto codec = MakeElemTopKCodec(0.0);
  EXPECT_EQ(codec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(codec.status().message(), HasSubstr("keep 0"));
}

TEST(ElemTopKTest, Encode_NonFinite_InvalidArgument) {
  auto codec = MakeElemTopKCodec(0.5).value();
  Tensor x = Tensor::Zeros({4});
  x[1] = -INFINITY;
  auto s = codec->Encode(x, nullptr);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("element 1"));
}

TEST(ElemTopKTest, Decode_TruncatedOrCorrupted_InvalidArgument) {
  const Tensor x = RandomTensor({5, 6}, 5);
  auto codec = MakeElemTopKCodec(0.2).value();
  const std::string payload = codec->Encode(x, nullptr).value();
  ExpectPrefixesRejected(*codec, payload);
  ExpectByteFlipsSafe(*codec, payload);
  std::string swapped = payload;  // Make the second index equal the first.
  const size_t first = HeaderBytes(2) + 8;
  swapped.replace(first + 8, 4, payload.substr(first, 4));
  auto y = codec->Decode(swapped);
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(y.status().message(), HasSubstr("entry 1"));
}

// ---------------------------------------------------------------- powersgd

// rows x cols matrix of rank `rank` (sum of outer products of random vectors).
Tensor LowRank(int64_t rows, int64_t cols, int rank, uint32_t seed) {
  const Tensor u = RandomTensor({rows, rank}, seed);
  const Tensor v = RandomTensor({cols, rank}, seed + 100);
  Tensor m = Tensor::Zeros({rows, cols});
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      for (int k = 0; k < rank; ++k) m[i * cols + j] += u[i * rank + k] * v[j * rank + k];
    }
  }
  return m;
}

Tensor RoundTrip(const Codec& codec, const Tensor& x, CodecState* state) {
  auto payload = codec.Encode(x, state);
  EXPECT_TRUE(payload.ok()) << payload.status();
  EXPECT_EQ(static_cast<int64_t>(payload->size()), codec.EncodedBytes(x.shape()));
  auto y = codec.Decode(*payload);
  EXPECT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->shape(), x.shape());
  return *y;
}

TEST(PowerSgdTest, Encode_RankAtMostR_ReproducedToFp32Precision) {
  for (int r : {1, 2, 4}) {
    for (int true_rank = 1; true_rank <= r; ++true_rank) {
      auto codec = MakePowerSgdCodec(r).value();
      const Tensor m = LowRank(24, 10, true_rank, 7 + true_rank);
      EXPECT_LT(RelativeError(RoundTrip(*codec, m, nullptr), m), 1e-5)
          << "r " << r << " true rank " << true_rank;
    }
  }
}

TEST(PowerSgdTest, Encode_WarmStart_StaysExactAndStoresQ) {
  auto codec = MakePowerSgdCodec(3).value();
  CodecState state;
  const Tensor a = LowRank(16, 12, 3, 20);
  const Tensor cold = RoundTrip(*codec, a, nullptr);
  EXPECT_LT(RelativeError(RoundTrip(*codec, a, &state), a), 1e-5);
  EXPECT_EQ(state.powersgd_q.shape(), (Shape{12, 3}));
  const Tensor warm = RoundTrip(*codec, a, &state);  // Warm-started now.
  EXPECT_LT(RelativeError(warm, a), 1e-5);
  EXPECT_LT(RelativeError(warm, cold), 1e-5);
  const Tensor b = LowRank(16, 12, 2, 30);
  EXPECT_LT(RelativeError(RoundTrip(*codec, b, &state), b), 1e-5);
}

TEST(PowerSgdTest, Encode_WarmQFromDeficientInput_ReseedsZeroColumns) {
  auto codec = MakePowerSgdCodec(2).value();
  CodecState state;
  const Tensor rank1 = LowRank(9, 8, 1, 40);
  RoundTrip(*codec, rank1, &state);
  // The rank-1 input leaves Q with a zero column; without reseeding the
  // next rank-2 input could only be approximated by rank 1.
  int zero_columns = 0;
  for (int c = 0; c < 2; ++c) {
    bool zero = true;
    for (int64_t i = 0; i < 8; ++i) zero = zero && state.powersgd_q[i * 2 + c] == 0.0f;
    zero_columns += zero;
  }
  EXPECT_EQ(zero_columns, 1);
  const Tensor rank2 = LowRank(9, 8, 2, 41);
  EXPECT_LT(RelativeError(RoundTrip(*codec, rank2, &state), rank2), 1e-5);
}

TEST(PowerSgdTest, Encode_StateOfOtherShape_IgnoredAndReplaced) {
  auto codec = MakePowerSgdCodec(2).value();
  CodecState state;
  state.powersgd_q = Tensor::Zeros({3, 3});
  const Tensor m = LowRank(5, 4, 2, 50);
  EXPECT_LT(RelativeError(RoundTrip(*codec, m, &state), m), 1e-5);
  EXPECT_EQ(state.powersgd_q.shape(), (Shape{4, 2}));
}

TEST(PowerSgdTest, EncodedBytes_MatrixViewOfShapes) {
  auto codec = MakePowerSgdCodec(2).value();
  EXPECT_EQ(codec->name(), "powersgd:rank=2");
  EXPECT_EQ(codec->EncodedBytes({2, 3, 4}), HeaderBytes(3) + 4 + 4 * 2 * (6 + 4));
  EXPECT_EQ(codec->EncodedBytes({7}), HeaderBytes(1) + 4 + 4 * 2 * (1 + 7));
  EXPECT_EQ(codec->EncodedBytes({}), HeaderBytes(0) + 4 + 4 * 2 * 2);
  // A rank-3 tensor of matrix rank 1 and a rank-1 tensor (one row) are exact.
  const Tensor t = LowRank(6, 4, 1, 60).Reshape({2, 3, 4});
  EXPECT_LT(RelativeError(RoundTrip(*codec, t, nullptr), t), 1e-5);
  const Tensor v = RandomTensor({7}, 61);
  EXPECT_LT(RelativeError(RoundTrip(*codec, v, nullptr), v), 1e-5);
  const Tensor s = Tensor::FromVector({}, {3.5f});
  EXPECT_LT(RelativeError(RoundTrip(*codec, s, nullptr), s), 1e-6);
  EXPECT_EQ(RoundTrip(*codec, Tensor::Zeros({0, 5}), nullptr).shape(), (Shape{0, 5}));
  EXPECT_EQ(RoundTrip(*codec, Tensor::Zeros({3, 4}), nullptr).ToVector(),
            std::vector<float>(12, 0.0f));
}

TEST(PowerSgdTest, Encode_Deterministic) {
  auto codec = MakePowerSgdCodec(3).value();
  const Tensor x = RandomTensor({10, 6}, 70);
  EXPECT_EQ(codec->Encode(x, nullptr).value(), codec->Encode(x, nullptr).value());
}

TEST(PowerSgdTest, Make_BadRank_InvalidArgument) {
  auto codec = MakePowerSgdCodec(0);
  EXPECT_EQ(codec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(codec.status().message(), HasSubstr("rank 0"));
}

TEST(PowerSgdTest, Encode_NonFinite_InvalidArgument) {
  auto codec = MakePowerSgdCodec(1).value();
  Tensor x = Tensor::Zeros({2, 2});
  x[2] = NAN;
  EXPECT_EQ(codec->Encode(x, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

// A gradient of a few subnormal entries: P's column is too small to scale
// to unit length in float (1/|p| past FLT_MAX). It counts as dependent
// (zero), not Inf/NaN: the payload decodes, and the warm start Q kept for
// the next call stays finite, so later calls on the link still work.
TEST(PowerSgdTest, Encode_TinyInput_FiniteFactorsAndWarmStart) {
  auto codec = MakePowerSgdCodec(1).value();
  CodecState state;
  for (float tiny : {1e-40f, 2e-38f}) {
    SCOPED_TRACE(tiny);
    Tensor x = Tensor::Zeros({4, 4});
    x[0] = tiny;
    absl::StatusOr<std::string> payload = codec->Encode(x, &state);
    ASSERT_TRUE(payload.ok()) << payload.status();
    absl::StatusOr<Tensor> decoded = codec->Decode(*payload);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    ASSERT_EQ(state.powersgd_q.shape(), (Shape{4, 1}));  // the warm start was kept
    for (float v : state.powersgd_q.ToVector()) EXPECT_TRUE(std::isfinite(v));
  }
  const Tensor normal = LowRank(4, 4, 1, 90);
  EXPECT_LT(RelativeError(RoundTrip(*codec, normal, &state), normal), 1e-5);
}

// Entries near FLT_MAX overflow Q = X^T P: refused, the warm start kept.
TEST(PowerSgdTest, Encode_FactorOverflow_RefusedStateKept) {
  auto codec = MakePowerSgdCodec(1).value();
  CodecState state;
  const Tensor normal = LowRank(4, 4, 1, 91);
  RoundTrip(*codec, normal, &state);
  const std::vector<float> kept = state.powersgd_q.ToVector();
  Tensor huge = Tensor::Zeros({4, 4});
  for (int64_t i = 0; i < huge.numel(); ++i) huge[i] = 3e38f;
  const absl::StatusOr<std::string> payload = codec->Encode(huge, &state);
  EXPECT_EQ(payload.status().code(), absl::StatusCode::kInvalidArgument) << payload.status();
  EXPECT_EQ(state.powersgd_q.ToVector(), kept);
}

// Finite factors whose product is beyond float32 (1e30 x 1e30): refused, as
// every other decoder refuses to produce a non-finite value.
TEST(PowerSgdTest, Decode_ProductOverflows_InvalidArgument) {
  auto codec = MakePowerSgdCodec(1).value();
  const std::vector<float> p = {1e30f, 1e30f}, q = {1e30f, 1e30f};
  const absl::StatusOr<Tensor> y =
      codec->Decode(WritePowerSgdPayload({2, 2}, 1, p.data(), q.data()));
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument) << y.status();
  EXPECT_THAT(y.status().message(), HasSubstr("powersgd decode (P Q^T)"));
  // Large but representable products decode.
  const std::vector<float> big = {1e18f, 1e18f};
  const absl::StatusOr<Tensor> ok =
      codec->Decode(WritePowerSgdPayload({2, 2}, 1, big.data(), big.data()));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_FLOAT_EQ((*ok)[0], 1e36f);
}

TEST(PowerSgdTest, Decode_TruncatedCorruptedOrOtherRank_InvalidArgument) {
  auto codec = MakePowerSgdCodec(2).value();
  const std::string payload = codec->Encode(RandomTensor({4, 5}, 80), nullptr).value();
  ExpectPrefixesRejected(*codec, payload);
  ExpectByteFlipsSafe(*codec, payload);
  auto other = MakePowerSgdCodec(3).value();
  auto y = other->Decode(payload);
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(y.status().message(), HasSubstr("rank 2"));
}

// ---------------------------------------------------------------- error feedback

void ExpectTelescopes(const Codec& codec, const Shape& shape) {
  ErrorFeedback feedback;
  CodecState state;
  Tensor sum_in = Tensor::Zeros(shape), sum_out = Tensor::Zeros(shape);
  for (uint32_t k = 0; k < 6; ++k) {
    const Tensor x = RandomTensor(shape, 90 + k);
    auto payload = feedback.Compress(x, codec, &state);
    ASSERT_TRUE(payload.ok()) << payload.status();
    const Tensor y = codec.Decode(*payload).value();
    for (int64_t i = 0; i < x.numel(); ++i) {
      sum_in[i] += x[i];
      sum_out[i] += y[i];
    }
  }
  ASSERT_TRUE(feedback.has_residual());
  const Tensor residual = feedback.Flush();
  EXPECT_FALSE(feedback.has_residual());
  for (int64_t i = 0; i < sum_in.numel(); ++i) {
    // Six fp32 additions of values below ~4 in magnitude: 1e-5 is ~20 ulps.
    EXPECT_NEAR(sum_out[i] + residual[i], sum_in[i], 1e-5) << codec.name() << " element " << i;
  }
}

TEST(ErrorFeedbackTest, Compress_SumOfDecodedPlusResidual_EqualsSumOfInputs) {
  ExpectTelescopes(*MakeElemTopKCodec(0.2).value(), {6, 5});
  ExpectTelescopes(*MakePowerSgdCodec(1).value(), {6, 5});
  ExpectTelescopes(*TokenCodec(0.5), {2, 3, 5});
}

TEST(ErrorFeedbackTest, Compress_ShapeChangeWithoutFlush_InvalidArgument) {
  ErrorFeedback feedback;
  auto codec = MakeElemTopKCodec(0.5).value();
  ASSERT_TRUE(feedback.Compress(RandomTensor({4}, 1), *codec, nullptr).ok());
  auto s = feedback.Compress(RandomTensor({5}, 2), *codec, nullptr);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("call Flush()"));
  EXPECT_EQ(feedback.Flush().shape(), (Shape{4}));
  EXPECT_TRUE(feedback.Compress(RandomTensor({5}, 2), *codec, nullptr).ok());
}

TEST(ErrorFeedbackTest, Compress_RelativeError_IsResidualNormOverInputNorm) {
  ErrorFeedback feedback;
  auto codec = MakeElemTopKCodec(0.5).value();
  double error = -1;
  // Keeps one of two values, the larger magnitude -4: residual {3, 0}, 3 / 5.
  ASSERT_TRUE(feedback.Compress(Tensor::FromVector({2}, {3, -4}), *codec, nullptr, &error).ok());
  EXPECT_NEAR(error, 0.6, 1e-7);
  // Zero input plus residual {3, 0}: sent exactly, error 0.
  ASSERT_TRUE(feedback.Compress(Tensor::Zeros({2}), *codec, nullptr, &error).ok());
  EXPECT_EQ(error, 0.0);
  // All zeros and no residual left: defined as 0, not NaN.
  error = -1;
  ASSERT_TRUE(feedback.Compress(Tensor::Zeros({2}), *codec, nullptr, &error).ok());
  EXPECT_EQ(error, 0.0);
}

TEST(ErrorFeedbackTest, Compress_CodecError_KeepsResidual) {
  ErrorFeedback feedback;
  auto codec = MakeElemTopKCodec(0.5).value();
  const Tensor x = Tensor::FromVector({2}, {1, 0.5f});
  ASSERT_TRUE(feedback.Compress(x, *codec, nullptr).ok());
  Tensor bad = Tensor::FromVector({2}, {NAN, 0});
  EXPECT_EQ(feedback.Compress(bad, *codec, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(feedback.Flush().ToVector(), (std::vector<float>{0, 0.5f}));
  EXPECT_TRUE(feedback.Flush().is_null());
}

}  // namespace
}  // namespace pipetrain
