#include "kernels/cpu/gelu.h"

#include <cmath>
#include <vector>

#include "common/tensor.h"
#include "common/testing/gradient_check.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using testing::CheckClose;
using testing::CheckGradients;
using testing::DotLoss;
using testing::RandomTensor;

constexpr double kSqrt2OverPi = 0.7978845608028653559;  // sqrt(2 / pi)

// The tanh-approximation GELU in double with std::tanh.
double NaiveGelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
}

// Its derivative, differentiated by hand.
double NaiveGeluGrad(double x) {
  const double t = std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x));
  const double du = kSqrt2OverPi * (1.0 + 3.0 * 0.044715 * x * x);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
}

// 200001 evenly spaced points on [-10, 10] (spacing 1e-4).
Tensor SweepInputs() {
  constexpr int kPoints = 200001;
  Tensor x = Tensor::Zeros({kPoints});
  for (int i = 0; i < kPoints; ++i) x[i] = static_cast<float>(-10.0 + 20.0 * i / (kPoints - 1));
  return x;
}

TEST(GeluForwardTest, SweepMinus10To10_WithinOneMillionthOfTanhFormula) {
  // FastTanh is within 3e-7 of tanh and the result is scaled by 0.5 |x| <= 5,
  // but where that product is large tanh has saturated to exactly +-1; the
  // rest is fp32 rounding of y (half an ulp of 10 is 4.8e-7).
  Tensor x = SweepInputs();
  Tensor y = Tensor::Zeros(x.shape());
  GeluForward(x.data(), x.numel(), y.data());
  std::vector<double> expected(x.numel());
  for (int64_t i = 0; i < x.numel(); ++i) expected[i] = NaiveGelu(x[i]);
  absl::Status status = CheckClose("gelu(x)", y, expected, 1e-6, 0.0);
  EXPECT_TRUE(status.ok()) << status;
}

TEST(GeluBackwardTest, SweepMinus10To10_MatchesClosedFormDerivative) {
  // The derivative involves 1 - t^2 where t ~ +-1, so FastTanh's 3e-7
  // absolute error is amplified by up to |x| * du ~ 4: bound 5e-6.
  Tensor x = SweepInputs();
  Tensor dy = Tensor::Zeros(x.shape());
  dy.Fill(1.0f);
  Tensor dx = Tensor::Zeros(x.shape());
  GeluBackward(x.data(), dy.data(), x.numel(), dx.data());
  std::vector<double> expected(x.numel());
  for (int64_t i = 0; i < x.numel(); ++i) expected[i] = NaiveGeluGrad(x[i]);
  absl::Status status = CheckClose("gelu'(x)", dx, expected, 5e-6, 0.0);
  EXPECT_TRUE(status.ok()) << status;
}

TEST(GeluBackwardTest, RandomInputs_MatchFiniteDifferences) {
  Tensor x = RandomTensor({4, 16}, 1, 2.0f);
  Tensor dy = RandomTensor({4, 16}, 2);  // Projection weights: dL/dy.
  Tensor y = Tensor::Zeros(x.shape());
  auto loss = [&] {
    GeluForward(x.data(), x.numel(), y.data());
    return DotLoss(y, dy);
  };
  Tensor dx = Tensor::Zeros(x.shape());
  GeluBackward(x.data(), dy.data(), x.numel(), dx.data());
  testing::GradCheckOptions options;
  options.max_elements = 64;
  absl::Status status = CheckGradients(loss, {{"x", &x, dx}}, options);
  EXPECT_TRUE(status.ok()) << status;
}

TEST(GeluForwardTest, KnownValues_ZeroAndSymmetry) {
  // gelu(0) = 0 and gelu(x) - gelu(-x) = x (the tanh term is odd).
  Tensor x = Tensor::FromVector({4}, {0.0f, 0.5f, -0.5f, 3.0f});
  Tensor y = Tensor::Zeros({4});
  GeluForward(x.data(), 4, y.data());
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_NEAR(y[1] - y[2], 0.5, 1e-6);
  EXPECT_NEAR(y[3], NaiveGelu(3.0), 1e-6);
}

}  // namespace
}  // namespace pipetrain
