// GELU CUDA kernels against the CPU reference (kernels/cpu/gelu.cc).
//
// Tolerance |gpu - cpu| <= kAtol + kRtol * |cpu|, in fp32. Why these
// numbers: the CPU uses FastTanh (absolute error < 3e-7, fast_math.h), the
// GPU uses CUDA's tanhf (<= 2 ulp), and nvcc contracts a*b+c into FMAs in
// places of its choosing (by default; the CPU reference is built with
// -ffp-contract=off and never does). Measured on x in [-8, 8] against fp32 tanhf
// and double tanh, the CPU reference is off by up to 4.3e-7 (forward) and
// 2.0e-6 (backward, |dy| = 1; gelu' amplifies tanh's error by up to ~3
// near |x| ~ 2). The GPU's own error is of the same kind and size but has
// not been measured yet (these bounds were written without a GPU), so they
// leave about 10x headroom over the CPU's error. rtol covers few-ulp
// rounding differences of large outputs (y ~ x for large x).
#include "kernels/cuda/gelu.h"

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cpu/gelu.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/parity_testing.h"

namespace pipetrain {
namespace {

using testing::AllClose;
using testing::RandomNormal;

constexpr float kForwardAtol = 5e-6f;
constexpr float kBackwardAtol = 2e-5f;
constexpr float kRtol = 1e-5f;

// Sizes around the 256-thread block and the 1024-block grid cap: a single
// element, a partial warp, partial blocks, and 2^20 elements (4 grid-stride
// iterations).
class GeluCudaParityTest : public testing::CudaTest,
                           public ::testing::WithParamInterface<int64_t> {};

TEST_P(GeluCudaParityTest, GeluForwardCuda_RandomInput_MatchesCpu) {
  const int64_t n = GetParam();
  // stddev 3 covers the curved middle and both saturated tails.
  const std::vector<float> x = RandomNormal(1, n, 0.0f, 3.0f);
  std::vector<float> want(x.size());
  GeluForward(x.data(), n, want.data());

  auto x_dev = DeviceBuffer<float>::FromHost(x);
  ASSERT_TRUE(x_dev.ok()) << x_dev.status();
  auto y_dev = DeviceBuffer<float>::Create(n);
  ASSERT_TRUE(y_dev.ok()) << y_dev.status();
  ASSERT_TRUE(GeluForwardCuda(x_dev->data(), n, y_dev->data()).ok());
  auto got = y_dev->ToHost();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(AllClose("gelu forward y", *got, want, kForwardAtol, kRtol));
}

TEST_P(GeluCudaParityTest, GeluBackwardCuda_RandomInput_MatchesCpu) {
  const int64_t n = GetParam();
  const std::vector<float> x = RandomNormal(2, n, 0.0f, 3.0f);
  // |dy| mostly below 1: the atol above is derived for |dy| = 1.
  const std::vector<float> dy = RandomNormal(3, n, 0.0f, 0.5f);
  std::vector<float> want(x.size());
  GeluBackward(x.data(), dy.data(), n, want.data());

  auto x_dev = DeviceBuffer<float>::FromHost(x);
  ASSERT_TRUE(x_dev.ok()) << x_dev.status();
  auto dy_dev = DeviceBuffer<float>::FromHost(dy);
  ASSERT_TRUE(dy_dev.ok()) << dy_dev.status();
  auto dx_dev = DeviceBuffer<float>::Create(n);
  ASSERT_TRUE(dx_dev.ok()) << dx_dev.status();
  ASSERT_TRUE(GeluBackwardCuda(x_dev->data(), dy_dev->data(), n, dx_dev->data()).ok());
  auto got = dx_dev->ToHost();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(AllClose("gelu backward dx", *got, want, kBackwardAtol, kRtol));
}

INSTANTIATE_TEST_SUITE_P(Sizes, GeluCudaParityTest,
                         ::testing::Values(int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{4097},
                                           int64_t{1} << 20));

class GeluCudaTest : public testing::CudaTest {};

TEST_F(GeluCudaTest, GeluForwardCuda_InPlace_MatchesCpu) {
  constexpr int64_t kN = 4097;
  const std::vector<float> x = RandomNormal(4, kN, 0.0f, 3.0f);
  std::vector<float> want(x.size());
  GeluForward(x.data(), kN, want.data());
  auto buf = DeviceBuffer<float>::FromHost(x);
  ASSERT_TRUE(buf.ok()) << buf.status();
  ASSERT_TRUE(GeluForwardCuda(buf->data(), kN, buf->data()).ok());
  auto got = buf->ToHost();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(AllClose("gelu forward in place", *got, want, kForwardAtol, kRtol));
}

TEST_F(GeluCudaTest, GeluForwardCuda_TwoRuns_BitwiseEqual) {
  constexpr int64_t kN = 1 << 20;
  auto x = DeviceBuffer<float>::FromHost(RandomNormal(5, kN, 0.0f, 3.0f));
  ASSERT_TRUE(x.ok()) << x.status();
  auto y = DeviceBuffer<float>::Create(kN);
  ASSERT_TRUE(y.ok()) << y.status();
  ASSERT_TRUE(GeluForwardCuda(x->data(), kN, y->data()).ok());
  auto first = y->ToHost();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(GeluForwardCuda(x->data(), kN, y->data()).ok());
  auto second = y->ToHost();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*first, *second);
}

// The fused bias + GELU: y gets exactly y + b (one float add), and g is
// bitwise GeluForwardCuda of that y, and within the parity bound of the
// CPU's; 77 columns, so rows straddle blocks.
TEST_F(GeluCudaTest, BiasGeluForwardCuda_EqualsBiasThenGelu) {
  constexpr int kRows = 301, kCols = 77;
  const std::vector<float> y0 = RandomNormal(5, int64_t{kRows} * kCols, 0.0f, 3.0f);
  const std::vector<float> b = RandomNormal(6, kCols, 0.0f, 1.0f);
  std::vector<float> biased(y0.size()), want(y0.size());
  for (size_t i = 0; i < y0.size(); ++i) biased[i] = y0[i] + b[i % kCols];
  GeluForward(biased.data(), static_cast<int64_t>(biased.size()), want.data());
  auto y = DeviceBuffer<float>::FromHost(y0);
  auto b_dev = DeviceBuffer<float>::FromHost(b);
  auto g = DeviceBuffer<float>::Create(static_cast<int64_t>(y0.size()));
  auto unfused = DeviceBuffer<float>::Create(static_cast<int64_t>(y0.size()));
  ASSERT_TRUE(y.ok() && b_dev.ok() && g.ok() && unfused.ok());
  ASSERT_TRUE(BiasGeluForwardCuda(b_dev->data(), kRows, kCols, y->data(), g->data()).ok());
  ASSERT_TRUE(GeluForwardCuda(y->data(), static_cast<int64_t>(y0.size()), unfused->data()).ok());
  EXPECT_EQ(y->ToHost().value(), biased);
  EXPECT_EQ(g->ToHost().value(), unfused->ToHost().value());
  EXPECT_TRUE(AllClose("bias + gelu g", g->ToHost().value(), want, kForwardAtol, kRtol));
}

// Argument checks happen before any CUDA call, so these run without a GPU.
TEST(GeluCudaArgumentsTest, BiasGeluForwardCuda_BadShape_InvalidArgument) {
  EXPECT_EQ(BiasGeluForwardCuda(nullptr, -1, 4, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status status = BiasGeluForwardCuda(nullptr, 3, 0, nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("BiasGeluForwardCuda: shape [3, 0]"), std::string::npos)
      << status;
  EXPECT_TRUE(BiasGeluForwardCuda(nullptr, 0, 4, nullptr, nullptr).ok());
}

TEST(GeluCudaArgumentsTest, GeluForwardCuda_NegativeSize_InvalidArgument) {
  const absl::Status status = GeluForwardCuda(nullptr, -1, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("GeluForwardCuda: element count -1"), std::string::npos)
      << status;
}

TEST(GeluCudaArgumentsTest, GeluBackwardCuda_NegativeSize_InvalidArgument) {
  const absl::Status status = GeluBackwardCuda(nullptr, nullptr, -5, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("GeluBackwardCuda: element count -5"), std::string::npos)
      << status;
}

TEST(GeluCudaArgumentsTest, GeluForwardCuda_ZeroSize_OkWithoutLaunch) {
  EXPECT_TRUE(GeluForwardCuda(nullptr, 0, nullptr).ok());
  EXPECT_TRUE(GeluBackwardCuda(nullptr, nullptr, 0, nullptr).ok());
}

}  // namespace
}  // namespace pipetrain
