// GPU token top-k selection against the CPU codec
// (kernels/compress/token_topk_codec.cc, raw f32 body).
//
// Tolerance: none. The kept set, the kept rows and the decoded tensor must
// equal the CPU's exactly (token_topk.h says why), so the tests compare the
// mask bit by bit and the floats by their bit patterns.
#include "kernels/cuda/token_topk.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/compress/elem_topk_codec.h"
#include "kernels/compress/linear_codec.h"
#include "kernels/compress/payload.h"
#include "kernels/compress/token_topk_codec.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/parity_testing.h"
#include "kernels/cuda/token_topk_payload.h"

namespace pipetrain {
namespace {

using testing::RandomNormal;

// The parts of a raw (no inner codec) CPU token_topk payload.
struct CpuSelection {
  int64_t kept = 0;
  std::vector<uint8_t> mask;   // one byte per token
  std::vector<uint32_t> rows;  // kept * d float bit patterns
};

CpuSelection ParsePayload(const std::string& payload, int rank, int64_t tokens, int64_t d) {
  CpuSelection s;
  ByteReader r(payload);
  absl::string_view skipped;
  float keep = 0;
  r.Bytes(HeaderBytes(rank), &skipped);
  r.F32(&keep);
  r.I64(&s.kept);
  absl::string_view mask_bytes;
  r.Bytes(PackedBytes(tokens, 1), &mask_bytes);
  BitReader bits(mask_bytes);
  for (int64_t t = 0; t < tokens; ++t) {
    uint32_t bit = 0;
    bits.Get(1, &bit);
    s.mask.push_back(static_cast<uint8_t>(bit));
  }
  for (int64_t i = 0; i < s.kept * d; ++i) {
    uint32_t word = 0;
    r.U32(&word);
    s.rows.push_back(word);
  }
  return s;
}

std::vector<uint32_t> Bits(const std::vector<float>& values) {
  std::vector<uint32_t> bits(values.size());
  if (!values.empty()) std::memcpy(bits.data(), values.data(), sizeof(float) * values.size());
  return bits;
}

// Scores with many exact ties (multiples of 0.5 in [-2, 2]), so the
// lower-index tie-break decides most of the boundary.
std::vector<float> TiedScores(uint64_t seed, int64_t n) {
  std::vector<float> s = RandomNormal(seed, n, 0.0f, 1.0f);
  for (float& v : s) v = std::round(std::fmax(-2.0f, std::fmin(2.0f, v)) * 2.0f) / 2.0f;
  return s;
}

struct Case {
  Shape shape;  // [.., d]
  double keep;
};

class TokenTopKCudaParityTest : public testing::CudaTest,
                                public ::testing::WithParamInterface<Case> {
 protected:
  // The GPU selection by `scores` (when non-null) or by norm; sets *kept.
  void Select(const float* x_dev, const std::vector<float>* scores, int64_t tokens, int64_t d,
              uint8_t* mask, int64_t* index, int64_t* kept) {
    if (scores == nullptr) {
      const absl::StatusOr<int64_t> count = TokenTopKKeptCount(GetParam().keep, tokens);
      ASSERT_TRUE(count.ok()) << count.status();
      *kept = *count;
      const absl::Status s = TokenTopKSelectByNormCuda(x_dev, tokens, d, *kept, mask, index);
      ASSERT_TRUE(s.ok()) << s;
      return;
    }
    auto s_dev = DeviceBuffer<float>::FromHost(*scores);
    ASSERT_TRUE(s_dev.ok()) << s_dev.status();
    const absl::StatusOr<int64_t> count =
        TokenTopKMaskCuda(s_dev->data(), tokens, GetParam().keep, mask, index);
    ASSERT_TRUE(count.ok()) << count.status();
    *kept = *count;
  }

  // Checks GPU mask, kept rows and scatter against the CPU payload/decode.
  // `scores` null: selection by norm (Encode), else EncodeWithScores.
  void ExpectParity(const Tensor& x, const std::vector<float>* scores) {
    const int64_t d = x.shape().back();
    const int64_t tokens = x.numel() / d;
    auto codec = MakeTokenTopKCodec(GetParam().keep);
    ASSERT_TRUE(codec.ok()) << codec.status();
    const absl::StatusOr<std::string> payload =
        scores == nullptr ? (*codec)->Encode(x, nullptr)
                          : (*codec)->EncodeWithScores(x, *scores, nullptr);
    ASSERT_TRUE(payload.ok()) << payload.status();
    const CpuSelection want = ParsePayload(*payload, x.rank(), tokens, d);

    auto x_dev = DeviceBuffer<float>::FromHost(std::vector<float>(x.data(), x.data() + x.numel()));
    auto mask = DeviceBuffer<uint8_t>::Create(tokens);
    auto index = DeviceBuffer<int64_t>::Create(tokens);
    ASSERT_TRUE(x_dev.ok() && mask.ok() && index.ok());
    int64_t kept = -1;
    Select(x_dev->data(), scores, tokens, d, mask->data(), index->data(), &kept);
    ASSERT_FALSE(HasFatalFailure());
    ASSERT_EQ(kept, want.kept);
    auto got_mask = mask->ToHost();
    ASSERT_TRUE(got_mask.ok()) << got_mask.status();
    EXPECT_EQ(*got_mask, want.mask);

    auto rows = DeviceBuffer<float>::Create(kept * d);
    auto out = DeviceBuffer<float>::Create(x.numel());
    ASSERT_TRUE(rows.ok() && out.ok());
    ASSERT_TRUE(TokenGatherCuda(x_dev->data(), d, index->data(), kept, rows->data()).ok());
    ASSERT_TRUE(TokenScatterCuda(rows->data(), d, index->data(), kept, tokens, out->data()).ok());
    auto got_rows = rows->ToHost();
    ASSERT_TRUE(got_rows.ok()) << got_rows.status();
    EXPECT_EQ(Bits(*got_rows), want.rows);
    const absl::StatusOr<Tensor> decoded = (*codec)->Decode(*payload);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    auto got_out = out->ToHost();
    ASSERT_TRUE(got_out.ok()) << got_out.status();
    EXPECT_EQ(Bits(*got_out),
              Bits(std::vector<float>(decoded->data(), decoded->data() + decoded->numel())));
  }
};

TEST_P(TokenTopKCudaParityTest, SelectByScores_RandomAndTied_MatchesCpuExactly) {
  const Shape& shape = GetParam().shape;
  const int64_t tokens = NumElements(shape) / shape.back();
  const Tensor x = Tensor::FromVector(shape, RandomNormal(1, NumElements(shape), 0.0f, 1.0f));
  const std::vector<float> random = RandomNormal(2, tokens, 0.0f, 1.0f);
  ExpectParity(x, &random);
  const std::vector<float> tied = TiedScores(3, tokens);
  ExpectParity(x, &tied);
  const std::vector<float> constant(tokens, 0.25f);
  ExpectParity(x, &constant);
}

TEST_P(TokenTopKCudaParityTest, SelectByNorm_RandomAndDuplicateRows_MatchesCpuExactly) {
  const Shape& shape = GetParam().shape;
  const int64_t d = shape.back();
  std::vector<float> values = RandomNormal(4, NumElements(shape), 0.0f, 1.0f);
  ExpectParity(Tensor::FromVector(shape, values), nullptr);
  // Every third token repeats token 0: equal norms, broken by index.
  for (int64_t t = 3; t * d < static_cast<int64_t>(values.size()); t += 3) {
    std::memcpy(&values[t * d], &values[0], sizeof(float) * d);
  }
  ExpectParity(Tensor::FromVector(shape, values), nullptr);
  ExpectParity(Tensor::Zeros(shape), nullptr);
}

// Token counts: 1, a partial warp, 300 (no multiple of the 256-wide tile),
// 4 x 1025 (several tiles and index chunks of 5 tokens).
INSTANTIATE_TEST_SUITE_P(Shapes, TokenTopKCudaParityTest,
                         ::testing::Values(Case{{1, 4}, 0.5}, Case{{1, 4}, 1.0}, Case{{7, 3}, 0.3},
                                           Case{{3, 100, 5}, 0.1}, Case{{3, 100, 5}, 1.0},
                                           Case{{4, 1025, 2}, 0.25}, Case{{4, 1025, 2}, 0.999}));

class TokenTopKCudaTest : public testing::CudaTest {};

TEST_F(TokenTopKCudaTest, TokenTopKMaskCuda_NanScore_SameErrorAsCpu) {
  std::vector<float> scores = RandomNormal(5, 600, 0.0f, 1.0f);
  scores[450] = -std::numeric_limits<float>::infinity();
  scores[333] = std::numeric_limits<float>::quiet_NaN();
  auto codec = MakeTokenTopKCodec(0.5);
  ASSERT_TRUE(codec.ok());
  const absl::Status want =
      (*codec)->EncodeWithScores(Tensor::Zeros({600, 2}), scores, nullptr).status();
  auto s_dev = DeviceBuffer<float>::FromHost(scores);
  auto mask = DeviceBuffer<uint8_t>::Create(600);
  auto index = DeviceBuffer<int64_t>::Create(600);
  ASSERT_TRUE(s_dev.ok() && mask.ok() && index.ok());
  const absl::Status got =
      TokenTopKMaskCuda(s_dev->data(), 600, 0.5, mask->data(), index->data()).status();
  EXPECT_NE(got.message().find("scores[333] is nan"), std::string::npos) << got;
  EXPECT_EQ(got, want);
}

// --- Argument checks before any CUDA call: run without a GPU. ---

TEST(TokenTopKCudaArgumentsTest, TokenTopKKeptCount_Keep_MatchesCpuRounding) {
  for (double keep : {0.1, 0.25, 1.0 / 3.0, 0.5, 0.999, 1.0}) {
    for (int64_t tokens : {0, 1, 3, 7, 10, 300, 4100}) {
      const absl::StatusOr<int64_t> kept = TokenTopKKeptCount(keep, tokens);
      ASSERT_TRUE(kept.ok()) << kept.status();
      EXPECT_EQ(*kept, TopKCount(keep, tokens)) << keep << " of " << tokens;
    }
  }
}

TEST(TokenTopKCudaArgumentsTest, TokenTopKKeptCount_KeepOutOfRange_InvalidArgument) {
  for (double keep : {0.0, -0.5, 1.5, std::nan("")}) {
    const absl::Status status = TokenTopKKeptCount(keep, 10).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("is out of range (0, 1]"), std::string::npos) << status;
  }
}

TEST(TokenTopKCudaArgumentsTest, Select_BadCounts_InvalidArgument) {
  const absl::Status too_many = TokenTopKSelectCuda(nullptr, 5, 6, nullptr, nullptr);
  EXPECT_EQ(too_many.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.message().find("kept=6 of tokens=5"), std::string::npos) << too_many;
  EXPECT_EQ(TokenTopKSelectByNormCuda(nullptr, 5, 0, 2, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokenGatherCuda(nullptr, 0, nullptr, 1, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokenScatterCuda(nullptr, 2, nullptr, 3, 2, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// An empty tensor goes to the host codec (the backend's rule): the GPU
// decode says so, before any CUDA call, whatever dimension is 0 but the
// last (tokens of width 0 are refused by the codec itself, CPU and GPU).
TEST(TokenTopKCudaArgumentsTest, PayloadOfEmptyTensor_InvalidArgument_GoesToTheHost) {
  auto codec = MakeTokenTopKCodec(0.5);
  ASSERT_TRUE(codec.ok()) << codec.status();
  EXPECT_EQ((*codec)->Encode(Tensor::Zeros({3, 0}), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (const Shape& shape : {Shape{0, 4}, Shape{2, 0, 5}, Shape{0, 0}}) {
    absl::StatusOr<std::string> payload = (*codec)->Encode(Tensor::Zeros(shape), nullptr);
    ASSERT_TRUE(payload.ok()) << payload.status();
    absl::StatusOr<Shape> decoded =
        TokenTopKDecodeCuda(*payload, 0.5, TokenTopKInner{}, nullptr, 0, nullptr);
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument) << decoded.status();
    EXPECT_NE(decoded.status().message().find("decode it on the host"), std::string::npos)
        << decoded.status();
  }
}

// A bad inner payload (a peer's bytes) is refused before anything reaches
// the device, with the CPU Decode's error: its magic, and a shape other
// than the kept rows' (announcing more values than the kept rows hold).
TEST(TokenTopKCudaArgumentsTest, BadInnerPayload_SameErrorAsCpu_BeforeCudaCalls) {
  absl::StatusOr<std::unique_ptr<Codec>> linear = MakeLinearCodec(8);
  ASSERT_TRUE(linear.ok()) << linear.status();
  absl::StatusOr<std::unique_ptr<TokenTopKCodec>> codec =
      MakeTokenTopKCodec(0.5, std::move(*linear));
  ASSERT_TRUE(codec.ok()) << codec.status();
  const Shape shape = {6, 4};
  absl::StatusOr<std::string> payload =
      (*codec)->Encode(Tensor::FromVector(shape, RandomNormal(17, 24, 0.0f, 1.0f)), nullptr);
  ASSERT_TRUE(payload.ok()) << payload.status();
  // The body ends with the inner payload: header "PTC1", id, rank 2, dims.
  // 3 of 6 tokens kept: bits, step, then 3 x 4 codes of one byte.
  const int64_t inner_bytes = HeaderBytes(2) + 1 + 4 + 3 * 4;
  ASSERT_GT(static_cast<int64_t>(payload->size()), inner_bytes);
  const size_t inner_at = payload->size() - static_cast<size_t>(inner_bytes);
  ASSERT_EQ(payload->substr(inner_at, 4), "PTC1");

  std::string bad_magic = *payload;
  bad_magic[inner_at] = 'X';
  std::string bad_shape = *payload;
  bad_shape[inner_at + 6] = 4;  // dims[0]: 4 kept rows instead of 3
  for (const std::string& bad : {bad_magic, bad_shape}) {
    absl::StatusOr<Tensor> cpu = (*codec)->Decode(bad);
    ASSERT_EQ(cpu.status().code(), absl::StatusCode::kInvalidArgument) << cpu.status();
    TokenTopKInner inner;
    inner.kind = TokenTopKInner::Kind::kLinear;
    inner.bits = 8;
    absl::StatusOr<Shape> gpu = TokenTopKDecodeCuda(bad, 0.5, inner, nullptr, 24, nullptr);
    EXPECT_EQ(gpu.status(), cpu.status());
  }
}

TEST(TokenTopKCudaArgumentsTest, EmptyInput_OkWithoutCudaCalls) {
  EXPECT_TRUE(TokenTopKSelectCuda(nullptr, 0, 0, nullptr, nullptr).ok());
  EXPECT_TRUE(TokenGatherCuda(nullptr, 4, nullptr, 0, nullptr).ok());
  EXPECT_TRUE(TokenScatterCuda(nullptr, 4, nullptr, 0, 0, nullptr).ok());
}

}  // namespace
}  // namespace pipetrain
