#include "kernels/cpu/layernorm.h"

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

constexpr int kRows = 5;
constexpr int kChannels = 16;

struct NaiveLayerNorm {
  std::vector<double> y, mean, rstd;
};

// Explicit mean and biased variance per row, in double.
NaiveLayerNorm ReferenceLayerNorm(const Tensor& x, const Tensor& w, const Tensor& b) {
  NaiveLayerNorm r;
  for (int i = 0; i < kRows; ++i) {
    double mean = 0.0;
    for (int j = 0; j < kChannels; ++j) mean += x[i * kChannels + j];
    mean /= kChannels;
    double var = 0.0;
    for (int j = 0; j < kChannels; ++j) {
      const double d = x[i * kChannels + j] - mean;
      var += d * d;
    }
    var /= kChannels;
    const double rstd = 1.0 / std::sqrt(var + double{kLayerNormEps});
    for (int j = 0; j < kChannels; ++j) {
      r.y.push_back((x[i * kChannels + j] - mean) * rstd * w[j] + b[j]);
    }
    r.mean.push_back(mean);
    r.rstd.push_back(rstd);
  }
  return r;
}

struct LayerNormCase {
  Tensor x = RandomTensor({kRows, kChannels}, 1, 2.0f);
  Tensor w = RandomTensor({kChannels}, 2);
  Tensor b = RandomTensor({kChannels}, 3);
  Tensor dy = RandomTensor({kRows, kChannels}, 4);  // Projection weights: dL/dy.
  Tensor y = Tensor::Zeros({kRows, kChannels});
  Tensor mean = Tensor::Zeros({kRows});
  Tensor rstd = Tensor::Zeros({kRows});

  void Forward() {
    LayerNormForward(x.data(), w.data(), b.data(), kRows, kChannels, kLayerNormEps, y.data(),
                     mean.data(), rstd.data());
  }
  void Backward(Tensor* dx, Tensor* dw, Tensor* db) {
    LayerNormBackward(x.data(), w.data(), mean.data(), rstd.data(), dy.data(), kRows, kChannels,
                      dx->data(), dw->data(), db->data());
  }
};

// fp32 sums of 16 O(1) terms and a float sqrt: relative errors of a few
// eps32 (~1e-7) in mean, rstd and y; 2e-6 leaves a 10x margin.
constexpr double kAtol = 2e-6;
constexpr double kRtol = 2e-6;

TEST(LayerNormForwardTest, RandomRows_OutputMeanRstdMatchNaive) {
  LayerNormCase c;
  c.Forward();
  const NaiveLayerNorm ref = ReferenceLayerNorm(c.x, c.w, c.b);
  for (absl::Status status : {CheckClose("y", c.y, ref.y, kAtol, kRtol),
                              CheckClose("mean", c.mean, ref.mean, kAtol, kRtol),
                              CheckClose("rstd", c.rstd, ref.rstd, kAtol, kRtol)}) {
    EXPECT_TRUE(status.ok()) << status;
  }
}

TEST(LayerNormForwardTest, LargeCommonOffset_StillMatchesNaive) {
  // Rows around 1000 with unit spread: E[x^2] - E[x]^2 would lose all digits
  // of the variance in fp32 (1e6 * 6e-8 ~ 0.06 absolute), two passes do not.
  // The inputs themselves carry ulp(1000) ~ 6e-5, so y is compared at 1e-3.
  LayerNormCase c;
  for (int64_t i = 0; i < c.x.numel(); ++i) c.x[i] = 1000.0f + c.x[i] * 0.5f;
  c.Forward();
  const NaiveLayerNorm ref = ReferenceLayerNorm(c.x, c.w, c.b);
  absl::Status status = CheckClose("y", c.y, ref.y, 1e-3, 1e-3);
  EXPECT_TRUE(status.ok()) << status;
  status = CheckClose("rstd", c.rstd, ref.rstd, 0.0, 1e-3);
  EXPECT_TRUE(status.ok()) << status;
}

TEST(LayerNormForwardTest, ConstantRow_NormalisesToBias) {
  // Zero variance: rstd = 1/sqrt(eps) and (x - mean) = 0 exactly, so y = b.
  LayerNormCase c;
  c.x.Fill(3.25f);
  c.Forward();
  for (int i = 0; i < kRows; ++i) {
    EXPECT_EQ(c.mean[i], 3.25f);
    EXPECT_NEAR(c.rstd[i], 1.0 / std::sqrt(1e-5), 1.0);
    for (int j = 0; j < kChannels; ++j) EXPECT_EQ(c.y[i * kChannels + j], c.b[j]);
  }
}

TEST(LayerNormBackwardTest, DxDwDb_MatchFiniteDifferences) {
  LayerNormCase c;
  auto loss = [&] {
    c.Forward();
    return DotLoss(c.y, c.dy);
  };
  c.Forward();
  Tensor dx = Tensor::Zeros(c.x.shape());
  Tensor dw = Tensor::Zeros(c.w.shape());
  Tensor db = Tensor::Zeros(c.b.shape());
  c.Backward(&dx, &dw, &db);
  testing::GradCheckOptions options;
  options.max_elements = kRows * kChannels;  // All 80 elements: cheap.
  absl::Status status =
      CheckGradients(loss, {{"x", &c.x, dx}, {"w", &c.w, dw}, {"b", &c.b, db}}, options);
  EXPECT_TRUE(status.ok()) << status;
}

TEST(LayerNormBackwardTest, TwoCalls_AccumulateDwDbAndOverwriteDx) {
  LayerNormCase c;
  c.Forward();
  Tensor dx1 = Tensor::Zeros(c.x.shape());
  Tensor dw = Tensor::Zeros(c.w.shape());
  Tensor db = Tensor::Zeros(c.b.shape());
  c.Backward(&dx1, &dw, &db);
  const Tensor dw1 = dw.Clone();
  const Tensor db1 = db.Clone();
  Tensor dx2 = Tensor::Zeros(c.x.shape());
  dx2.Fill(5.0f);
  c.Backward(&dx2, &dw, &db);
  // 2x the first result up to fp32 rounding of a 5-row sum (~1e-6); an
  // overwrite instead of an accumulation would be off by 100%.
  std::vector<double> dw2(kChannels), db2(kChannels);
  for (int j = 0; j < kChannels; ++j) {
    dw2[j] = 2.0 * dw1[j];
    db2[j] = 2.0 * db1[j];
  }
  absl::Status status = CheckClose("dw", dw, dw2, 1e-5, 1e-5);
  EXPECT_TRUE(status.ok()) << status;
  status = CheckClose("db", db, db2, 1e-5, 1e-5);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(dx2.ToVector(), dx1.ToVector());
}

}  // namespace
}  // namespace pipetrain
