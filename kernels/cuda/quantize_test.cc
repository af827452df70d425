// GPU linear and piecewise quantization against the CPU codecs
// (kernels/compress/linear_codec.cc, piecewise_codec.cc).
//
// Tolerance: none. The payload bytes and the decoded floats must be
// bit-identical (quantize.h says why that is achievable), so the tests
// compare bytes and float bit patterns, not values within a bound.
#include "kernels/cuda/quantize.h"

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
#include "kernels/compress/linear_codec.h"
#include "kernels/compress/payload.h"
#include "kernels/compress/piecewise_codec.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/parity_testing.h"

namespace pipetrain {
namespace {

using testing::RandomNormal;

enum class Kind { kLinear, kPiecewise };

struct Case {
  Kind kind;
  int bits;
};

std::string CaseName(const Case& c) {
  return absl::StrCat(c.kind == Kind::kLinear ? "linear" : "piecewise", c.bits);
}

std::unique_ptr<Codec> CpuCodec(const Case& c) {
  auto codec = c.kind == Kind::kLinear ? MakeLinearCodec(c.bits) : MakePiecewiseCodec(c.bits);
  return codec.ok() ? std::move(*codec) : nullptr;
}

absl::StatusOr<std::string> GpuEncode(const Case& c, const float* x, const Shape& shape) {
  return c.kind == Kind::kLinear ? LinearEncodeCuda(x, shape, c.bits)
                                 : PiecewiseEncodeCuda(x, shape, c.bits);
}

absl::StatusOr<Shape> GpuDecode(const Case& c, absl::string_view payload, float* out,
                                int64_t capacity) {
  return c.kind == Kind::kLinear ? LinearDecodeCuda(payload, c.bits, out, capacity)
                                 : PiecewiseDecodeCuda(payload, c.bits, out, capacity);
}

std::vector<uint32_t> Bits(const float* values, int64_t n) {
  std::vector<uint32_t> bits(static_cast<size_t>(n));
  if (n > 0) std::memcpy(bits.data(), values, sizeof(float) * n);
  return bits;
}

// Index of the first differing byte, for a readable failure.
int64_t FirstDifference(const std::string& a, const std::string& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return a.size() == b.size() ? -1 : static_cast<int64_t>(std::min(a.size(), b.size()));
}

// (a) GPU encode == CPU encode, byte for byte; (b) GPU decode of the CPU
// payload == CPU decode, bit for bit.
void ExpectParity(const Case& c, const Tensor& x) {
  SCOPED_TRACE(absl::StrCat(CaseName(c), " shape ", ShapeToString(x.shape())));
  std::unique_ptr<Codec> cpu = CpuCodec(c);
  ASSERT_NE(cpu, nullptr);
  const absl::StatusOr<std::string> want = cpu->Encode(x, nullptr);
  ASSERT_TRUE(want.ok()) << want.status();

  const std::vector<float> host(x.data(), x.data() + x.numel());
  auto x_dev = DeviceBuffer<float>::FromHost(host);
  ASSERT_TRUE(x_dev.ok()) << x_dev.status();
  const absl::StatusOr<std::string> got = GpuEncode(c, x_dev->data(), x.shape());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), want->size());
  EXPECT_EQ(FirstDifference(*got, *want), -1) << "payloads differ (first differing byte)";

  const absl::StatusOr<Tensor> cpu_values = cpu->Decode(*want);
  ASSERT_TRUE(cpu_values.ok()) << cpu_values.status();
  auto out = DeviceBuffer<float>::Create(x.numel());
  ASSERT_TRUE(out.ok()) << out.status();
  const absl::StatusOr<Shape> shape = GpuDecode(c, *want, out->data(), x.numel());
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(*shape, x.shape());
  auto gpu_values = out->ToHost();
  ASSERT_TRUE(gpu_values.ok()) << gpu_values.status();
  EXPECT_EQ(Bits(gpu_values->data(), x.numel()), Bits(cpu_values->data(), x.numel()));
}

const Case kCases[] = {
    {Kind::kLinear, 2},    {Kind::kLinear, 3},    {Kind::kLinear, 8},
    {Kind::kLinear, 11},   {Kind::kLinear, 16},   {Kind::kPiecewise, 1},
    {Kind::kPiecewise, 2}, {Kind::kPiecewise, 3}, {Kind::kPiecewise, 7},
    {Kind::kPiecewise, 8},
};

class QuantizeCudaParityTest : public testing::CudaTest,
                               public ::testing::WithParamInterface<Case> {};

// Shapes: one element, a partial warp, a rank-3 tensor that is no multiple
// of the 256-thread block, and 2^20 + 3 (grid-stride loops, odd tail byte).
TEST_P(QuantizeCudaParityTest, EncodeDecode_RandomInput_MatchesCpuExactly) {
  const std::vector<Shape> shapes = {{1}, {7}, {3, 5, 67}, {(int64_t{1} << 20) + 3}};
  uint64_t seed = 10;
  for (const Shape& shape : shapes) {
    ExpectParity(GetParam(), Tensor::FromVector(shape, RandomNormal(seed++, NumElements(shape),
                                                                     0.0f, 2.0f)));
  }
}

TEST_P(QuantizeCudaParityTest, EncodeDecode_ZerosConstantsAndEmpty_MatchCpuExactly) {
  ExpectParity(GetParam(), Tensor::Zeros({1000}));
  ExpectParity(GetParam(), Tensor::Zeros({0}));
  ExpectParity(GetParam(), Tensor::Zeros({2, 0, 3}));
  ExpectParity(GetParam(), Tensor::FromVector({513}, std::vector<float>(513, -0.75f)));
  ExpectParity(GetParam(), Tensor::FromVector({1}, {3.5f}));
  // Signed zeros, exact cluster edges (M / N k) and the extremes +-M.
  ExpectParity(GetParam(), Tensor::FromVector({9}, {-0.0f, 0.0f, 1.0f, -1.0f, 0.5f, 0.25f,
                                                    0.125f, 0.375f, 0.875f}));
}

TEST_P(QuantizeCudaParityTest, Encode_TinyAndHugeMagnitudes_MatchesCpuExactly) {
  std::vector<float> tiny = RandomNormal(40, 300, 0.0f, 1.0f);
  for (float& v : tiny) v *= 1e-38f;  // Subnormal steps and levels.
  ExpectParity(GetParam(), Tensor::FromVector({300}, tiny));
  std::vector<float> huge = RandomNormal(41, 300, 0.0f, 1.0f);
  for (float& v : huge) v *= 1e37f;
  ExpectParity(GetParam(), Tensor::FromVector({300}, huge));
}

TEST_P(QuantizeCudaParityTest, Encode_NonFinite_SameErrorAsCpu) {
  std::vector<float> values = RandomNormal(50, 10000, 0.0f, 1.0f);
  values[7000] = std::numeric_limits<float>::infinity();
  values[5003] = std::numeric_limits<float>::quiet_NaN();
  const Tensor x = Tensor::FromVector({10000}, values);
  const absl::Status want = CpuCodec(GetParam())->Encode(x, nullptr).status();
  auto x_dev = DeviceBuffer<float>::FromHost(values);
  ASSERT_TRUE(x_dev.ok()) << x_dev.status();
  const absl::Status got = GpuEncode(GetParam(), x_dev->data(), x.shape()).status();
  EXPECT_EQ(got.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(got.message().find("element 5003 is nan"), std::string::npos) << got;
  EXPECT_EQ(got, want);
}

INSTANTIATE_TEST_SUITE_P(Codecs, QuantizeCudaParityTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return CaseName(info.param);
                         });

class QuantizeCudaTest : public testing::CudaTest {};

TEST_F(QuantizeCudaTest, LinearDecodeCuda_AllOnesCode_SameErrorAsCpu) {
  auto cpu = MakeLinearCodec(5);
  ASSERT_TRUE(cpu.ok());
  const Tensor x = Tensor::FromVector({300}, RandomNormal(60, 300, 0.0f, 1.0f));
  absl::StatusOr<std::string> payload = (*cpu)->Encode(x, nullptr);
  ASSERT_TRUE(payload.ok()) << payload.status();
  // Element 100's 5-bit code starts at body bit 500: byte 62, bit 4.
  const size_t body = HeaderBytes(1) + 1 + 4;
  (*payload)[body + 62] = static_cast<char>((*payload)[body + 62] | 0xf0);
  (*payload)[body + 63] = static_cast<char>((*payload)[body + 63] | 0x01);
  const absl::Status want = (*cpu)->Decode(*payload).status();
  auto out = DeviceBuffer<float>::Create(300);
  ASSERT_TRUE(out.ok()) << out.status();
  const absl::Status got = LinearDecodeCuda(*payload, 5, out->data(), 300).status();
  EXPECT_NE(got.message().find("element 100 has out-of-range code 31"), std::string::npos)
      << got;
  EXPECT_EQ(got, want);
}

TEST_F(QuantizeCudaTest, MaxAbsScanCuda_NegativeMaximum_ReturnsItsMagnitude) {
  auto x = DeviceBuffer<float>::FromHost({0.5f, -7.25f, 3.0f, -0.0f});
  ASSERT_TRUE(x.ok()) << x.status();
  const absl::StatusOr<MaxAbsScan> scan = MaxAbsScanCuda(x->data(), 4);
  ASSERT_TRUE(scan.ok()) << scan.status();
  EXPECT_EQ(scan->max_abs, 7.25f);
  EXPECT_EQ(scan->first_non_finite, -1);
}

// --- Argument and payload checks that happen before any CUDA call: these
// run without a GPU. ---

TEST(QuantizeCudaArgumentsTest, LinearEncodeCuda_BitsOutOfRange_InvalidArgument) {
  const absl::Status status = LinearEncodeCuda(nullptr, {4}, 17).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("linear codec: bits=17 is out of range"), std::string::npos)
      << status;
}

TEST(QuantizeCudaArgumentsTest, PiecewiseEncodeCuda_ClustersOutOfRange_InvalidArgument) {
  const absl::Status status = PiecewiseEncodeCuda(nullptr, {4}, 0).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("piecewise codec: bits=0"), std::string::npos) << status;
}

TEST(QuantizeCudaArgumentsTest, PackAndUnpack_BadArguments_InvalidArgument) {
  EXPECT_EQ(LinearPackCuda(nullptr, -1, 8, 1.0f, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status step = LinearPackCuda(nullptr, 4, 8, -1.0f, nullptr);
  EXPECT_EQ(step.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(step.message().find("LinearPackCuda: step -1 is not finite"), std::string::npos)
      << step;
  EXPECT_EQ(PiecewiseUnpackCuda(nullptr, 4, 9, 1.0f, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MaxAbsScanCuda(nullptr, -2).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(QuantizeCudaArgumentsTest, EmptyInput_OkWithoutCudaCalls) {
  EXPECT_TRUE(LinearPackCuda(nullptr, 0, 8, 0.0f, nullptr).ok());
  EXPECT_TRUE(PiecewiseUnpackCuda(nullptr, 0, 3, 0.0f, nullptr).ok());
  const absl::StatusOr<MaxAbsScan> scan = MaxAbsScanCuda(nullptr, 0);
  ASSERT_TRUE(scan.ok()) << scan.status();
  EXPECT_EQ(scan->max_abs, 0.0f);
}

// A CPU payload, corrupted in each way the CPU Decode rejects before the
// body: the GPU decode returns the identical status (no GPU needed).
TEST(QuantizeCudaArgumentsTest, DecodeCuda_BadPayloads_SameErrorsAsCpu) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(CaseName(c));
    std::unique_ptr<Codec> cpu = CpuCodec(c);
    const Tensor x = Tensor::FromVector({2, 3}, {1, -2, 3, -4, 5, -6});
    const absl::StatusOr<std::string> good = cpu->Encode(x, nullptr);
    ASSERT_TRUE(good.ok()) << good.status();
    const size_t params = HeaderBytes(2);
    std::string wrong_bits = *good;
    wrong_bits[params] = static_cast<char>(c.bits == 1 ? 2 : 1);
    std::string negative_scale = *good;
    negative_scale[params + 4] = static_cast<char>(0xbf);  // Sign bit of the f32.
    const std::vector<std::string> bad = {
        "", "XXXX", good->substr(0, params + 2), wrong_bits, negative_scale,
        good->substr(0, good->size() - 1), *good + "x"};
    for (const std::string& payload : bad) {
      const absl::Status want = cpu->Decode(payload).status();
      ASSERT_FALSE(want.ok());
      EXPECT_EQ(GpuDecode(c, payload, nullptr, 6).status(), want);
    }
  }
}

TEST(QuantizeCudaArgumentsTest, DecodeCuda_OutputTooSmall_InvalidArgument) {
  auto cpu = MakePiecewiseCodec(3);
  ASSERT_TRUE(cpu.ok());
  const absl::StatusOr<std::string> payload =
      (*cpu)->Encode(Tensor::FromVector({2, 3}, {1, 2, 3, 4, 5, 6}), nullptr);
  ASSERT_TRUE(payload.ok()) << payload.status();
  const absl::Status status = PiecewiseDecodeCuda(*payload, 3, nullptr, 5).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("holds 6 values, the output buffer only 5"), std::string::npos)
      << status;
}

}  // namespace
}  // namespace pipetrain
