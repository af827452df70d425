#include "kernels/cpu/linear.h"

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

constexpr int kRows = 4;
constexpr int kIn = 12;
constexpr int kOut = 8;

// y = x W + b with a triple loop in double; b may be null.
std::vector<double> NaiveLinear(const Tensor& x, const Tensor& w, const Tensor* b) {
  std::vector<double> y(kRows * kOut);
  for (int i = 0; i < kRows; ++i) {
    for (int j = 0; j < kOut; ++j) {
      double sum = b != nullptr ? (*b)[j] : 0.0;
      for (int k = 0; k < kIn; ++k) sum += double{x[i * kIn + k]} * w[k * kOut + j];
      y[i * kOut + j] = sum;
    }
  }
  return y;
}

std::vector<double> Doubled(const Tensor& t) {
  std::vector<double> out(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = 2.0 * t[i];
  return out;
}

struct LinearCase {
  Tensor x = RandomTensor({kRows, kIn}, 1);
  Tensor w = RandomTensor({kIn, kOut}, 2, 0.5f);
  Tensor b = RandomTensor({kOut}, 3);
  Tensor dy = RandomTensor({kRows, kOut}, 4);  // Projection weights: dL/dy.
};

// L is linear in each of x, w and b, so central differences have no
// truncation error, only fp32 rounding (~1e-5 relative): a tolerance 20x
// tighter than the default still has a 100x margin and catches 1% errors.
testing::GradCheckOptions LinearOptions() {
  testing::GradCheckOptions options;
  options.rtol = 1e-3;
  return options;
}

// fp32 dot products of length 12 over N(0,1)-sized terms: the rounding error
// is below 12 * 6e-8 * sum|x w| ~ 1e-5 at worst, typically ~1e-6.
constexpr double kForwardAtol = 1e-5;
constexpr double kForwardRtol = 1e-5;

TEST(LinearForwardTest, WithBias_MatchesNaive) {
  LinearCase c;
  Tensor y = Tensor::Zeros({kRows, kOut});
  LinearForward(c.x.data(), c.w.data(), c.b.data(), kRows, kIn, kOut, y.data());
  absl::Status status = CheckClose("y", y, NaiveLinear(c.x, c.w, &c.b), kForwardAtol, kForwardRtol);
  EXPECT_TRUE(status.ok()) << status;
}

TEST(LinearForwardTest, WithoutBias_MatchesNaiveAndOverwritesOutput) {
  LinearCase c;
  Tensor y = Tensor::Zeros({kRows, kOut});
  y.Fill(123.0f);  // The output is written, not accumulated.
  LinearForward(c.x.data(), c.w.data(), nullptr, kRows, kIn, kOut, y.data());
  absl::Status status =
      CheckClose("y", y, NaiveLinear(c.x, c.w, nullptr), kForwardAtol, kForwardRtol);
  EXPECT_TRUE(status.ok()) << status;
}

TEST(LinearBackwardTest, WithBias_MatchesFiniteDifferences) {
  LinearCase c;
  Tensor y = Tensor::Zeros({kRows, kOut});
  auto loss = [&] {
    LinearForward(c.x.data(), c.w.data(), c.b.data(), kRows, kIn, kOut, y.data());
    return DotLoss(y, c.dy);
  };
  Tensor dx = Tensor::Zeros(c.x.shape());
  Tensor dw = Tensor::Zeros(c.w.shape());
  Tensor db = Tensor::Zeros(c.b.shape());
  LinearBackward(c.x.data(), c.w.data(), c.dy.data(), kRows, kIn, kOut, dx.data(), dw.data(),
                 db.data());
  absl::Status status =
      CheckGradients(loss, {{"x", &c.x, dx}, {"w", &c.w, dw}, {"b", &c.b, db}}, LinearOptions());
  EXPECT_TRUE(status.ok()) << status;
}

TEST(LinearBackwardTest, WithoutBias_MatchesFiniteDifferences) {
  LinearCase c;
  Tensor y = Tensor::Zeros({kRows, kOut});
  auto loss = [&] {
    LinearForward(c.x.data(), c.w.data(), nullptr, kRows, kIn, kOut, y.data());
    return DotLoss(y, c.dy);
  };
  Tensor dx = Tensor::Zeros(c.x.shape());
  Tensor dw = Tensor::Zeros(c.w.shape());
  LinearBackward(c.x.data(), c.w.data(), c.dy.data(), kRows, kIn, kOut, dx.data(), dw.data(),
                 nullptr);
  absl::Status status = CheckGradients(loss, {{"x", &c.x, dx}, {"w", &c.w, dw}}, LinearOptions());
  EXPECT_TRUE(status.ok()) << status;
}

TEST(LinearBackwardTest, TwoCalls_AccumulateDwDbAndOverwriteDx) {
  LinearCase c;
  Tensor dx1 = Tensor::Zeros(c.x.shape());
  Tensor dw = Tensor::Zeros(c.w.shape());
  Tensor db = Tensor::Zeros(c.b.shape());
  LinearBackward(c.x.data(), c.w.data(), c.dy.data(), kRows, kIn, kOut, dx1.data(), dw.data(),
                 db.data());
  const Tensor dw1 = dw.Clone();
  const Tensor db1 = db.Clone();
  Tensor dx2 = Tensor::Zeros(c.x.shape());
  dx2.Fill(-7.0f);
  LinearBackward(c.x.data(), c.w.data(), c.dy.data(), kRows, kIn, kOut, dx2.data(), dw.data(),
                 db.data());
  // The second call adds its terms one by one onto the first result, so the
  // sum is 2x the first up to fp32 rounding of a 4-row sum (~1e-6); an
  // overwrite instead of an accumulation would be off by 100%.
  absl::Status status = CheckClose("dw", dw, Doubled(dw1), 1e-5, 1e-5);
  EXPECT_TRUE(status.ok()) << status;
  status = CheckClose("db", db, Doubled(db1), 1e-5, 1e-5);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(dx2.ToVector(), dx1.ToVector());
}

TEST(LinearBackwardTest, NullDx_SameParameterGradients) {
  LinearCase c;
  Tensor dx = Tensor::Zeros(c.x.shape());
  Tensor dw_with = Tensor::Zeros(c.w.shape());
  Tensor db_with = Tensor::Zeros(c.b.shape());
  LinearBackward(c.x.data(), c.w.data(), c.dy.data(), kRows, kIn, kOut, dx.data(), dw_with.data(),
                 db_with.data());
  Tensor dw = Tensor::Zeros(c.w.shape());
  Tensor db = Tensor::Zeros(c.b.shape());
  LinearBackward(c.x.data(), c.w.data(), c.dy.data(), kRows, kIn, kOut, nullptr, dw.data(),
                 db.data());
  EXPECT_EQ(dw.ToVector(), dw_with.ToVector());
  EXPECT_EQ(db.ToVector(), db_with.ToVector());
}

}  // namespace
}  // namespace pipetrain
