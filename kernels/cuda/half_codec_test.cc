// GPU fp16 and bf16 codecs against the CPU ones (kernels/compress/
// fp16_codec.cc).
//
// Tolerance: none. Both round to nearest even in the same format and widen
// exactly, so payloads must be byte-identical and decoded floats
// bit-identical; the edge values below (ties at every exponent, the largest
// finite values and the first ones that overflow, subnormal results, float
// subnormal inputs, signed zeros) are where a different rounding would show.
#include "kernels/cuda/half_codec.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/compress/fp16_codec.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/parity_testing.h"

namespace pipetrain {
namespace {

using testing::RandomNormal;

std::unique_ptr<Codec> CpuCodec(HalfFormat format) {
  return format == HalfFormat::kFp16 ? MakeFp16Codec() : MakeBf16Codec();
}

std::string Name(HalfFormat format) { return format == HalfFormat::kFp16 ? "fp16" : "bf16"; }

std::vector<uint32_t> Bits(const std::vector<float>& values) {
  std::vector<uint32_t> bits(values.size());
  if (!values.empty()) std::memcpy(bits.data(), values.data(), sizeof(float) * values.size());
  return bits;
}

float FromBits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

// Values where rounding decides: ties to even and odd neighbours around
// several exponents (in units of the narrow format's last place), subnormal
// results, float subnormals, signed zeros, the largest values that stay
// finite. Scaled into range for each format by the caller's choice.
std::vector<float> EdgeValues(HalfFormat format) {
  std::vector<float> v = {0.0f, -0.0f, FromBits(1), FromBits(0x80000001u), FromBits(0x007fffffu)};
  // mantissa bits dropped: fp16 13, bf16 16.
  const int dropped = format == HalfFormat::kFp16 ? 13 : 16;
  const uint32_t half_ulp = 1u << (dropped - 1);
  for (const float base : {1.0f, 3.0f, 1e-3f, 1000.0f, 6.0e-8f, 6.1e-5f}) {
    uint32_t u;
    std::memcpy(&u, &base, sizeof(u));
    u &= ~((1u << dropped) - 1);  // a representable value
    for (const uint32_t delta : {half_ulp, half_ulp - 1, half_ulp + 1, 3 * half_ulp}) {
      v.push_back(FromBits(u + delta));
      v.push_back(-FromBits(u + delta));
    }
  }
  if (format == HalfFormat::kFp16) {
    v.insert(v.end(), {65504.0f, -65504.0f, 65519.99f, 5.96e-8f, 2.98e-8f, 2.99e-8f});
  } else {
    v.insert(v.end(), {3.38e38f, -3.38e38f, 1e-39f});
  }
  return v;
}

class HalfCodecCudaTest : public testing::CudaTest,
                          public ::testing::WithParamInterface<HalfFormat> {};

TEST_P(HalfCodecCudaTest, EncodeDecode_RandomAndEdgeValues_ByteIdenticalToCpu) {
  const HalfFormat format = GetParam();
  const std::unique_ptr<Codec> cpu = CpuCodec(format);
  std::vector<std::pair<Shape, std::vector<float>>> cases;
  for (const Shape& shape : std::vector<Shape>{{1}, {7, 5}, {3, 33, 65}, {1 << 20}}) {
    cases.push_back({shape, RandomNormal(40 + shape.size(), NumElements(shape), 0.0f, 100.0f)});
  }
  const std::vector<float> edges = EdgeValues(format);
  cases.push_back({{static_cast<int64_t>(edges.size())}, edges});
  for (const auto& [shape, values] : cases) {
    SCOPED_TRACE(absl::StrCat(Name(format), " ", ShapeToString(shape)));
    const std::string want = cpu->Encode(Tensor::FromVector(shape, values), nullptr).value();
    auto x = DeviceBuffer<float>::FromHost(values);
    ASSERT_TRUE(x.ok()) << x.status();
    absl::StatusOr<std::string> got = HalfEncodeCuda(format, x->data(), shape, nullptr);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, want);
    auto out = DeviceBuffer<float>::Create(NumElements(shape));
    ASSERT_TRUE(out.ok()) << out.status();
    absl::StatusOr<Shape> decoded =
        HalfDecodeCuda(format, want, out->data(), NumElements(shape), nullptr);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, shape);
    EXPECT_EQ(Bits(out->ToHost().value()), Bits(cpu->Decode(want).value().ToVector()));
  }
}

TEST_P(HalfCodecCudaTest, Errors_SameAsCpu) {
  const HalfFormat format = GetParam();
  const std::unique_ptr<Codec> cpu = CpuCodec(format);
  const Shape shape = {4, 300};
  // A NaN, then an element that overflows: the CPU's first error is the NaN;
  // without the NaN, the overflow (the first of two).
  std::vector<float> values = RandomNormal(50, NumElements(shape), 0.0f, 1.0f);
  const float too_big = format == HalfFormat::kFp16 ? 65520.0f : 3.4e38f;
  values[900] = too_big;
  values[1100] = -too_big;
  values[1000] = std::numeric_limits<float>::quiet_NaN();
  for (int round = 0; round < 2; ++round) {
    if (round == 1) values[1000] = 0.5f;
    const absl::Status want = cpu->Encode(Tensor::FromVector(shape, values), nullptr).status();
    ASSERT_FALSE(want.ok());
    auto x = DeviceBuffer<float>::FromHost(values);
    ASSERT_TRUE(x.ok()) << x.status();
    EXPECT_EQ(HalfEncodeCuda(format, x->data(), shape, nullptr).status(), want) << round;
  }
  // Decoding: truncated, too little room, an Inf in the body.
  const std::vector<float> fine = RandomNormal(51, NumElements(shape), 0.0f, 1.0f);
  std::string payload = cpu->Encode(Tensor::FromVector(shape, fine), nullptr).value();
  auto out = DeviceBuffer<float>::Create(NumElements(shape));
  ASSERT_TRUE(out.ok()) << out.status();
  const std::string truncated = payload.substr(0, payload.size() - 1);
  EXPECT_EQ(HalfDecodeCuda(format, truncated, out->data(), 1200, nullptr).status(),
            cpu->Decode(truncated).status());
  EXPECT_EQ(HalfDecodeCuda(format, payload, out->data(), 1199, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  const size_t body = payload.size() - 2 * 1200;
  const uint16_t inf = format == HalfFormat::kFp16 ? 0x7c00 : 0x7f80;
  payload[body + 2 * 777] = static_cast<char>(inf & 0xff);
  payload[body + 2 * 777 + 1] = static_cast<char>(inf >> 8);
  EXPECT_EQ(HalfDecodeCuda(format, payload, out->data(), 1200, nullptr).status(),
            cpu->Decode(payload).status());
}

INSTANTIATE_TEST_SUITE_P(Formats, HalfCodecCudaTest,
                         ::testing::Values(HalfFormat::kFp16, HalfFormat::kBf16),
                         [](const auto& info) { return Name(info.param); });

// Argument checks before any CUDA call: run without a GPU.
TEST(HalfCodecCudaArgumentsTest, NegativeCount_InvalidArgument) {
  EXPECT_EQ(HalfPackCuda(HalfFormat::kFp16, nullptr, -1, nullptr, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HalfUnpackCuda(HalfFormat::kBf16, nullptr, -3, nullptr, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HalfPackCuda(HalfFormat::kFp16, nullptr, 0, nullptr, nullptr, nullptr).ok());
}

TEST(HalfCodecCudaArgumentsTest, EmptyTensor_HeaderOnlyLikeCpu) {
  const std::string want = MakeBf16Codec()->Encode(Tensor::Zeros({0, 4}), nullptr).value();
  absl::StatusOr<std::string> got = HalfEncodeCuda(HalfFormat::kBf16, nullptr, {0, 4}, nullptr);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, want);
}

}  // namespace
}  // namespace pipetrain
