// Element-wise CUDA kernels against the CPU reference
// (kernels/cpu/elementwise.cc).
//
// Tolerance: none (atol = rtol = 0, i.e. bitwise equal). Each output element
// is a single fp32 addition (or subtraction) of the same two operands on
// both sides, which
// IEEE 754 rounds correctly and identically; there is nothing to contract or
// reorder. AllClose still prints the first mismatches if that ever breaks.
#include "kernels/cuda/elementwise.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/parity_testing.h"

namespace pipetrain {
namespace {

using testing::AllClose;
using testing::RandomNormal;

constexpr float kAtol = 0.0f;
constexpr float kRtol = 0.0f;

// Sizes around the 256-thread block and the 1024-block grid cap: a single
// element, a partial warp, partial blocks, and 2^20 elements (4 grid-stride
// iterations).
class ElementwiseCudaParityTest : public testing::CudaTest,
                                  public ::testing::WithParamInterface<int64_t> {
 protected:
  int64_t n() const { return GetParam(); }
  std::string Name(const char* what) const { return "n " + std::to_string(n()) + " " + what; }
};

TEST_P(ElementwiseCudaParityTest, AddCuda_SeparateOutput_MatchesCpu) {
  // Different scales, so the sums round.
  const std::vector<float> a = RandomNormal(60, n(), 0.0f, 1.0f);
  const std::vector<float> b = RandomNormal(61, n(), 0.0f, 1e-3f);
  std::vector<float> want(a.size());
  Add(a.data(), b.data(), n(), want.data());

  auto a_d = DeviceBuffer<float>::FromHost(a);
  auto b_d = DeviceBuffer<float>::FromHost(b);
  auto out_d = DeviceBuffer<float>::Create(n());
  ASSERT_TRUE(a_d.ok() && b_d.ok() && out_d.ok());
  const absl::Status run = AddCuda(a_d->data(), b_d->data(), n(), out_d->data());
  ASSERT_TRUE(run.ok()) << run;
  auto got = out_d->ToHost();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(AllClose(Name("a + b"), *got, want, kAtol, kRtol));
}

// The residual forward writes y = f(x) + x over f(x)'s buffer.
TEST_P(ElementwiseCudaParityTest, AddCuda_OutputIsFirstInput_MatchesCpu) {
  const std::vector<float> a = RandomNormal(62, n(), 0.0f, 1.0f);
  const std::vector<float> b = RandomNormal(63, n(), 0.5f, 2.0f);
  std::vector<float> want = a;
  Add(want.data(), b.data(), n(), want.data());

  auto a_d = DeviceBuffer<float>::FromHost(a);
  auto b_d = DeviceBuffer<float>::FromHost(b);
  ASSERT_TRUE(a_d.ok() && b_d.ok());
  const absl::Status run = AddCuda(a_d->data(), b_d->data(), n(), a_d->data());
  ASSERT_TRUE(run.ok()) << run;
  auto got = a_d->ToHost();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(AllClose(Name("a += b via AddCuda"), *got, want, kAtol, kRtol));
}

TEST_P(ElementwiseCudaParityTest, AddCuda_OutputIsSecondInput_MatchesCpu) {
  const std::vector<float> a = RandomNormal(64, n(), 0.0f, 1.0f);
  const std::vector<float> b = RandomNormal(65, n(), 0.0f, 1.0f);
  std::vector<float> want = b;
  Add(a.data(), want.data(), n(), want.data());

  auto a_d = DeviceBuffer<float>::FromHost(a);
  auto b_d = DeviceBuffer<float>::FromHost(b);
  ASSERT_TRUE(a_d.ok() && b_d.ok());
  const absl::Status run = AddCuda(a_d->data(), b_d->data(), n(), b_d->data());
  ASSERT_TRUE(run.ok()) << run;
  auto got = b_d->ToHost();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(AllClose(Name("b = a + b"), *got, want, kAtol, kRtol));
}

// The residual backward: the branch's input gradient plus the skip's dy.
TEST_P(ElementwiseCudaParityTest, AddInPlaceCuda_RandomInput_MatchesCpu) {
  const std::vector<float> acc = RandomNormal(66, n(), 0.0f, 1.0f);
  const std::vector<float> x = RandomNormal(67, n(), 0.0f, 0.1f);
  std::vector<float> want = acc;
  AddInPlace(want.data(), x.data(), n());

  auto acc_d = DeviceBuffer<float>::FromHost(acc);
  auto x_d = DeviceBuffer<float>::FromHost(x);
  ASSERT_TRUE(acc_d.ok() && x_d.ok());
  const absl::Status run = AddInPlaceCuda(acc_d->data(), x_d->data(), n());
  ASSERT_TRUE(run.ok()) << run;
  auto got = acc_d->ToHost();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(AllClose(Name("acc += x"), *got, want, kAtol, kRtol));
}

// Error feedback's residual: what was meant minus what the codec delivered,
// written over the meant tensor.
TEST_P(ElementwiseCudaParityTest, SubtractCuda_SeparateAndAliasedOutput_MatchesCpu) {
  const std::vector<float> a = RandomNormal(69, n(), 0.0f, 1.0f);
  const std::vector<float> b = RandomNormal(70, n(), 0.0f, 0.9f);
  std::vector<float> want(a.size());
  Subtract(a.data(), b.data(), n(), want.data());

  auto a_d = DeviceBuffer<float>::FromHost(a);
  auto b_d = DeviceBuffer<float>::FromHost(b);
  auto out_d = DeviceBuffer<float>::Create(n());
  ASSERT_TRUE(a_d.ok() && b_d.ok() && out_d.ok());
  absl::Status run = SubtractCuda(a_d->data(), b_d->data(), n(), out_d->data());
  ASSERT_TRUE(run.ok()) << run;
  auto got = out_d->ToHost();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(AllClose(Name("a - b"), *got, want, kAtol, kRtol));
  run = SubtractCuda(a_d->data(), b_d->data(), n(), a_d->data());
  ASSERT_TRUE(run.ok()) << run;
  got = a_d->ToHost();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(AllClose(Name("a -= b via SubtractCuda"), *got, want, kAtol, kRtol));
}

INSTANTIATE_TEST_SUITE_P(Sizes, ElementwiseCudaParityTest,
                         ::testing::Values(int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{4097},
                                           int64_t{1} << 20));

class ElementwiseCudaTest : public testing::CudaTest {};

TEST_F(ElementwiseCudaTest, AddInPlaceCuda_SameBuffer_Doubles) {
  constexpr int64_t kN = 4097;
  std::vector<float> want = RandomNormal(68, kN, 0.0f, 1.0f);
  auto acc_d = DeviceBuffer<float>::FromHost(want);
  ASSERT_TRUE(acc_d.ok()) << acc_d.status();
  AddInPlace(want.data(), want.data(), kN);
  const absl::Status run = AddInPlaceCuda(acc_d->data(), acc_d->data(), kN);
  ASSERT_TRUE(run.ok()) << run;
  auto got = acc_d->ToHost();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(AllClose("acc += acc", *got, want, kAtol, kRtol));
}

// Argument checks happen before any CUDA call, so these run without a GPU.
TEST(ElementwiseCudaArgumentsTest, AddCuda_NegativeSize_InvalidArgument) {
  const absl::Status status = AddCuda(nullptr, nullptr, -1, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("AddCuda: element count -1"), std::string::npos) << status;
}

TEST(ElementwiseCudaArgumentsTest, AddInPlaceCuda_NegativeSize_InvalidArgument) {
  const absl::Status status = AddInPlaceCuda(nullptr, nullptr, -7);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("AddInPlaceCuda: element count -7"), std::string::npos)
      << status;
}

TEST(ElementwiseCudaArgumentsTest, SubtractCuda_NegativeSize_InvalidArgument) {
  const absl::Status status = SubtractCuda(nullptr, nullptr, -2, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("SubtractCuda: element count -2"), std::string::npos) << status;
}

TEST(ElementwiseCudaArgumentsTest, AddCuda_ZeroSize_OkWithoutLaunch) {
  EXPECT_TRUE(AddCuda(nullptr, nullptr, 0, nullptr).ok());
  EXPECT_TRUE(AddInPlaceCuda(nullptr, nullptr, 0).ok());
  EXPECT_TRUE(SubtractCuda(nullptr, nullptr, 0, nullptr).ok());
}

}  // namespace
}  // namespace pipetrain
