// RoundToBf16Cuda against the CPU's rounding (kernels/cpu/flash_attention.h
// RoundToBf16): bitwise, since both round to nearest with ties to even.
#include "kernels/cuda/bf16_round.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/cpu/flash_attention.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/parity_testing.h"
#include "kernels/cuda/stream_scratch.h"

namespace pipetrain {
namespace {

using testing::RandomNormal;

uint16_t CpuBits(float x) {
  const float rounded = RoundToBf16(x);
  uint32_t bits = 0;
  std::memcpy(&bits, &rounded, sizeof(bits));
  return static_cast<uint16_t>(bits >> 16);
}

std::vector<uint16_t> RoundOnGpu(const std::vector<float>& x) {
  auto x_dev = DeviceBuffer<float>::FromHost(x);
  EXPECT_TRUE(x_dev.ok()) << x_dev.status();
  auto y_dev = DeviceBuffer<uint16_t>::Create(static_cast<int64_t>(x.size()));
  EXPECT_TRUE(y_dev.ok()) << y_dev.status();
  if (!x_dev.ok() || !y_dev.ok()) return {};
  const absl::Status queued =
      RoundToBf16Cuda(x_dev->data(), static_cast<int64_t>(x.size()), y_dev->data(), nullptr);
  EXPECT_TRUE(queued.ok()) << queued;
  auto y = y_dev->ToHost();
  EXPECT_TRUE(y.ok()) << y.status();
  return y.ok() ? *y : std::vector<uint16_t>{};
}

// Sizes around the 256-thread block and the 1024-block grid cap (2^20 + 3:
// several grid-stride passes and a partial block).
class Bf16RoundCudaTest : public testing::CudaTest,
                          public ::testing::WithParamInterface<int64_t> {};

TEST_P(Bf16RoundCudaTest, RandomInputs_BitwiseTheCpuRounding) {
  const int64_t n = GetParam();
  std::vector<float> x = RandomNormal(7, n, 0.0f, 1.0f);
  // Magnitudes from 1e-30 to 1e30, so every exponent range is crossed.
  for (int64_t i = 0; i < n; ++i) x[i] *= std::pow(10.0f, static_cast<float>(i % 61 - 30));
  const std::vector<uint16_t> got = RoundOnGpu(x);
  ASSERT_EQ(got.size(), x.size());
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (got[i] != CpuBits(x[i]) && ++mismatches <= 5) {
      ADD_FAILURE() << "x[" << i << "] = " << x[i] << ": gpu 0x" << std::hex << got[i] << ", cpu 0x"
                    << CpuBits(x[i]);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(Sizes, Bf16RoundCudaTest,
                         ::testing::Values(1, 31, 257, 4097, (int64_t{1} << 20) + 3));

// Ties go to the even neighbour, the largest finite floats overflow to the
// infinity of their sign, subnormals and zeros keep their sign, and Inf and
// NaN stay what they are.
class Bf16RoundEdgeTest : public testing::CudaTest {};

TEST_F(Bf16RoundEdgeTest, TiesOverflowZerosSpecials) {
  const float max = std::numeric_limits<float>::max();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {1.0f + 0x1p-8f,            // halfway between 1 and 1 + 2^-7: to 1
                                1.0f + 0x1p-8f + 0x1p-7f,  // halfway, odd below: up
                                -0.0f,
                                0.0f,
                                0x1p-140f,
                                -0x1p-140f,
                                max,
                                -max,
                                inf,
                                -inf,
                                std::numeric_limits<float>::quiet_NaN()};
  const std::vector<uint16_t> got = RoundOnGpu(x);
  ASSERT_EQ(got.size(), x.size());
  EXPECT_EQ(got[0], 0x3f80);  // 1.0
  EXPECT_EQ(got[1], 0x3f82);  // 1 + 2^-6
  EXPECT_EQ(got[2], 0x8000);
  EXPECT_EQ(got[3], 0x0000);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(got[i], CpuBits(x[i])) << "x[" << i << "] = " << x[i];
  EXPECT_EQ(got[6], 0x7f80);  // FLT_MAX rounds up past bf16's largest finite
  EXPECT_EQ(got[7], 0xff80);
  EXPECT_EQ(got[8], 0x7f80);
  EXPECT_EQ(got[9], 0xff80);
  EXPECT_EQ(got[10] & 0x7f80, 0x7f80);  // NaN: exponent all ones, mantissa not zero
  EXPECT_NE(got[10] & 0x007f, 0);
}

// Lines copied into a wider stride (as a padded leading dimension): each
// line's elements rounded as the CPU does, the padding left as it was.
TEST_F(Bf16RoundEdgeTest, Strided_EachLineRounded_PaddingUntouched) {
  const int64_t lines = 70000, length = 3, x_stride = 5, y_stride = 8;  // lines > grid's y limit
  const std::vector<float> x = RandomNormal(9, lines * x_stride, 0.0f, 3.0f);
  auto x_dev = DeviceBuffer<float>::FromHost(x);
  ASSERT_TRUE(x_dev.ok()) << x_dev.status();
  const std::vector<uint16_t> sentinel(lines * y_stride, 0xabcd);
  auto y_dev = DeviceBuffer<uint16_t>::FromHost(sentinel);
  ASSERT_TRUE(y_dev.ok()) << y_dev.status();
  ASSERT_TRUE(RoundToBf16StridedCuda(x_dev->data(), lines, length, x_stride, y_dev->data(),
                                     y_stride, nullptr)
                  .ok());
  auto y = y_dev->ToHost();
  ASSERT_TRUE(y.ok()) << y.status();
  int64_t mismatches = 0;
  for (int64_t line = 0; line < lines; ++line) {
    for (int64_t i = 0; i < y_stride; ++i) {
      const uint16_t want = i < length ? CpuBits(x[line * x_stride + i]) : uint16_t{0xabcd};
      if ((*y)[line * y_stride + i] != want) ++mismatches;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// Bf16CopyCuda: the same bits as RoundToBf16Cuda, in scratch of its own.
TEST_F(Bf16RoundEdgeTest, Bf16Copy_BitwiseTheCpuRounding) {
  const int64_t n = 4097;
  const std::vector<float> x = RandomNormal(11, n, 0.0f, 2.0f);
  auto x_dev = DeviceBuffer<float>::FromHost(x);
  ASSERT_TRUE(x_dev.ok()) << x_dev.status();
  absl::StatusOr<StreamScratch> copy = Bf16CopyCuda(x_dev->data(), n, nullptr);
  ASSERT_TRUE(copy.ok()) << copy.status();
  std::vector<uint16_t> got(n);
  ASSERT_EQ(cudaMemcpy(got.data(), copy->get(), n * sizeof(uint16_t), cudaMemcpyDeviceToHost),
            cudaSuccess);
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) mismatches += got[i] != CpuBits(x[i]);
  EXPECT_EQ(mismatches, 0);
}

TEST(Bf16RoundArgumentsTest, NegativeCount_InvalidArgument_ZeroLaunchesNothing) {
  EXPECT_EQ(RoundToBf16Cuda(nullptr, -1, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(RoundToBf16Cuda(nullptr, 0, nullptr, nullptr).ok());
  EXPECT_EQ(RoundToBf16StridedCuda(nullptr, 2, 4, 3, nullptr, 4, nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // a stride below the length
  EXPECT_EQ(RoundToBf16StridedCuda(nullptr, -1, 4, 4, nullptr, 4, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(RoundToBf16StridedCuda(nullptr, 0, 4, 4, nullptr, 4, nullptr).ok());
  EXPECT_EQ(Bf16CopyCuda(nullptr, -1, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain
