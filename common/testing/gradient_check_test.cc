#include "common/testing/gradient_check.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// L = sum_i x_i^3, accumulated in double.
double CubeSum(const Tensor& x) {
  double sum = 0.0;
  for (int64_t i = 0; i < x.numel(); ++i) sum += std::pow(double{x[i]}, 3);
  return sum;
}

// dL/dx_i = factor * x_i^power.
Tensor PowerGrad(const Tensor& x, double factor, int power) {
  Tensor g = Tensor::Zeros(x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) {
    g[i] = static_cast<float>(factor * std::pow(double{x[i]}, power));
  }
  return g;
}

int CountOccurrences(const std::string& text, const std::string& needle) {
  int count = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) {
    ++count;
  }
  return count;
}

TEST(CheckGradientsTest, CubeWithRightGradient_Passes) {
  Tensor x = RandomTensor({3, 4}, 7);
  absl::Status status =
      CheckGradients([&] { return CubeSum(x); }, {{"x", &x, PowerGrad(x, 3.0, 2)}});
  EXPECT_TRUE(status.ok()) << status;
}

TEST(CheckGradientsTest, CubeWithWrongGradient_FailsNamingInputAndValues) {
  // d(x^3)/dx = 3x^2 = 12 at x = 2; the wrong gradient 2x gives 4.
  Tensor x = Tensor::FromVector({1}, {2.0f});
  absl::Status status =
      CheckGradients([&] { return CubeSum(x); }, {{"x", &x, PowerGrad(x, 2.0, 1)}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("input 'x' (shape [1])"));
  EXPECT_THAT(status.message(), HasSubstr("index 0 [0]: analytic=4 numeric=12.000"));
}

TEST(CheckGradientsTest, WrongGradientOnRandomTensor_Fails) {
  Tensor x = RandomTensor({3, 4}, 7);
  absl::Status status =
      CheckGradients([&] { return CubeSum(x); }, {{"x", &x, PowerGrad(x, 2.0, 1)}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("input 'x' (shape [3, 4])"));
}

TEST(CheckGradientsTest, ErrorsRelativeToTolerance_PassBelowAndFailAbove) {
  Tensor x = RandomTensor({16}, 3);
  auto loss = [&] { return CubeSum(x); };
  // rtol is 2e-2: a 0.1% error passes, a 10% error fails.
  EXPECT_TRUE(CheckGradients(loss, {{"x", &x, PowerGrad(x, 3.0 * 1.001, 2)}}).ok());
  EXPECT_EQ(CheckGradients(loss, {{"x", &x, PowerGrad(x, 3.0 * 1.1, 2)}}).code(),
            absl::StatusCode::kInternal);
}

TEST(CheckGradientsTest, AfterPassOrFailure_InputsAreRestoredBitExactly) {
  Tensor x = RandomTensor({5, 3}, 11, 4.0f);
  const std::vector<float> before = x.ToVector();
  auto loss = [&] { return CubeSum(x); };
  EXPECT_TRUE(CheckGradients(loss, {{"x", &x, PowerGrad(x, 3.0, 2)}}).ok());
  EXPECT_EQ(x.ToVector(), before);
  EXPECT_FALSE(CheckGradients(loss, {{"x", &x, PowerGrad(x, 1.0, 2)}}).ok());
  EXPECT_EQ(x.ToVector(), before);
}

TEST(CheckGradientsTest, LargeInput_ChecksSubsetPlusDirections) {
  Tensor x = RandomTensor({1000}, 5);
  int calls = 0;
  auto loss = [&] {
    ++calls;
    return CubeSum(x);
  };
  GradCheckOptions options;
  options.max_elements = 10;
  options.directions = 3;
  EXPECT_TRUE(CheckGradients(loss, {{"x", &x, PowerGrad(x, 3.0, 2)}}, options).ok());
  // Two evaluations per element and per direction.
  EXPECT_EQ(calls, 2 * 10 + 2 * 3);
}

TEST(CheckGradientsTest, WrongGradientOutsideSubset_CaughtByDirections) {
  Tensor x = RandomTensor({200}, 5);
  GradCheckOptions options;
  options.max_elements = 0;  // Only the directional checks run.
  auto loss = [&] { return CubeSum(x); };
  EXPECT_TRUE(CheckGradients(loss, {{"x", &x, PowerGrad(x, 3.0, 2)}}, options).ok());
  absl::Status status = CheckGradients(loss, {{"x", &x, PowerGrad(x, 4.5, 2)}}, options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("2 of 2 checks fail"));
  EXPECT_THAT(status.message(), HasSubstr("random direction 0: analytic="));
}

TEST(CheckGradientsTest, NanAnalyticGradient_Fails) {
  Tensor x = RandomTensor({4}, 5);
  Tensor grad = PowerGrad(x, 3.0, 2);
  grad[2] = NAN;
  absl::Status status = CheckGradients([&] { return CubeSum(x); }, {{"x", &x, grad}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("index 2 [2]: analytic=nan"));
}

TEST(CheckGradientsTest, TwoInputs_OnlyTheWrongOneIsReported) {
  // L = sum a_i * b_i^2: dL/da = b^2, dL/db = 2 a b.
  Tensor a = RandomTensor({6}, 1);
  Tensor b = RandomTensor({6}, 2);
  auto loss = [&] {
    double sum = 0.0;
    for (int i = 0; i < 6; ++i) sum += double{a[i]} * b[i] * b[i];
    return sum;
  };
  Tensor da = PowerGrad(b, 1.0, 2);
  Tensor db = Tensor::Zeros({6});
  for (int i = 0; i < 6; ++i) db[i] = 2.0f * a[i] * b[i];
  EXPECT_TRUE(CheckGradients(loss, {{"a", &a, da}, {"b", &b, db}}).ok());
  Tensor wrong_db = Tensor::Zeros({6});
  for (int i = 0; i < 6; ++i) wrong_db[i] = a[i] * b[i];
  absl::Status status = CheckGradients(loss, {{"a", &a, da}, {"b", &b, wrong_db}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("input 'b'"));
  EXPECT_THAT(status.message(), Not(HasSubstr("input 'a'")));
}

TEST(CheckGradientsTest, ManyMismatches_ReportsFirstFiveAndWorst) {
  Tensor x = RandomTensor({10}, 9);
  GradCheckOptions options;
  options.directions = 0;
  absl::Status status =
      CheckGradients([&] { return CubeSum(x); }, {{"x", &x, PowerGrad(x, -3.0, 2)}}, options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("10 of 10 checks fail"));
  EXPECT_THAT(status.message(), HasSubstr("index 4 [4]"));
  EXPECT_THAT(status.message(), HasSubstr("; worst: index "));
  // Five first mismatches plus the worst one.
  EXPECT_EQ(CountOccurrences(std::string(status.message()), "analytic="), 6);
}

TEST(CheckGradientsTest, GradientOfWrongSize_InvalidArgument) {
  Tensor x = RandomTensor({3, 4}, 1);
  absl::Status status =
      CheckGradients([&] { return CubeSum(x); }, {{"weights", &x, Tensor::Zeros({4, 4})}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("'weights' has shape [3, 4]"));
  EXPECT_THAT(status.message(), HasSubstr("analytic gradient has shape [4, 4]"));
}

TEST(CheckGradientsTest, NullValue_InvalidArgument) {
  absl::Status status = CheckGradients([] { return 0.0; }, {{"x", nullptr, Tensor()}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("'x' has a null value pointer"));
}

TEST(CheckGradientsTest, NonPositiveStep_InvalidArgument) {
  Tensor x = RandomTensor({3}, 1);
  GradCheckOptions options;
  options.step = 0.0;
  absl::Status status =
      CheckGradients([&] { return CubeSum(x); }, {{"x", &x, PowerGrad(x, 3.0, 2)}}, options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("step=0"));
}

TEST(CheckCloseTest, WithinTolerance_Ok) {
  Tensor t = Tensor::FromVector({2}, {1.0f, -2.0f});
  EXPECT_TRUE(CheckClose("t", t, {1.0 + 1e-7, -2.0}, 1e-6, 0.0).ok());
}

TEST(CheckCloseTest, Mismatch_InternalWithIndexAndValues) {
  Tensor t = Tensor::FromVector({2, 2}, {1.0f, 2.0f, 3.0f, 4.0f});
  absl::Status status = CheckClose("out", t, {1.0, 2.0, 3.5, 4.0}, 1e-6, 1e-6);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("'out' (shape [2, 2])"));
  EXPECT_THAT(status.message(), HasSubstr("1 of 4 checks fail"));
  EXPECT_THAT(status.message(), HasSubstr("index 2 [1, 0]: actual=3 expected=3.5"));
}

TEST(CheckCloseTest, NanActual_Fails) {
  Tensor t = Tensor::FromVector({1}, {NAN});
  EXPECT_EQ(CheckClose("t", t, {0.0}, 1.0, 1.0).code(), absl::StatusCode::kInternal);
}

TEST(CheckCloseTest, SizeMismatch_InvalidArgument) {
  Tensor t = Tensor::Zeros({3});
  absl::Status status = CheckClose("t", t, {0.0, 0.0}, 1.0, 1.0);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("'t' has 3 elements but the reference has 2"));
}

TEST(RandomTensorTest, SameSeed_SameValuesAndScaleMultiplies) {
  Tensor a = RandomTensor({4, 5}, 3);
  EXPECT_EQ(a.shape(), (Shape{4, 5}));
  EXPECT_EQ(a.ToVector(), RandomTensor({4, 5}, 3).ToVector());
  EXPECT_NE(a.ToVector(), RandomTensor({4, 5}, 4).ToVector());
  Tensor b = RandomTensor({4, 5}, 3, 2.0f);
  for (int64_t i = 0; i < a.numel(); ++i) EXPECT_EQ(b[i], 2.0f * a[i]);
}

TEST(DotLossTest, KnownValues_SumOfProducts) {
  Tensor y = Tensor::FromVector({3}, {1.0f, 2.0f, 3.0f});
  Tensor w = Tensor::FromVector({3}, {0.5f, -1.0f, 2.0f});
  EXPECT_EQ(DotLoss(y, w), 0.5 - 2.0 + 6.0);
}

}  // namespace
}  // namespace testing
}  // namespace pipetrain
