#include "kernels/cpu/adamw.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/tensor.h"
#include "common/testing/gradient_check.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using testing::CheckClose;
using testing::RandomTensor;

constexpr int kSize = 16;

// The update of adamw.h, term by term, in double.
struct NaiveAdamW {
  std::vector<double> param, m, v;

  void Step(const Tensor& grad, int64_t step, const AdamWConfig& config, bool apply_decay) {
    const double lr = config.lr, b1 = config.beta1, b2 = config.beta2;
    for (size_t i = 0; i < param.size(); ++i) {
      const double g = grad[i];
      if (apply_decay) param[i] *= 1.0 - lr * double{config.weight_decay};
      m[i] = b1 * m[i] + (1.0 - b1) * g;
      v[i] = b2 * v[i] + (1.0 - b2) * g * g;
      const double m_hat = m[i] / (1.0 - std::pow(b1, step));
      const double v_hat = v[i] / (1.0 - std::pow(b2, step));
      param[i] -= lr * m_hat / (std::sqrt(v_hat) + config.eps);
    }
  }
};

std::vector<double> ToDouble(const Tensor& t) {
  return std::vector<double>(t.data(), t.data() + t.numel());
}

// Three steps with fresh gradients against the double reference. fp32 state
// carries a relative error of a few eps32 (~1e-7) per step, so 1e-6
// relative holds after three steps. (Gradients keep one sign per element
// so that m does not cancel to near zero, where a relative bound on m would
// measure the cancellation rather than the kernel.)
void ExpectThreeStepsMatchNaive(bool apply_decay) {
  AdamWConfig config;
  config.lr = 1e-2f;
  config.weight_decay = 0.1f;
  Tensor param = RandomTensor({kSize}, 1);
  Tensor m = Tensor::Zeros({kSize});
  Tensor v = Tensor::Zeros({kSize});
  NaiveAdamW naive{ToDouble(param), ToDouble(m), ToDouble(v)};
  const Tensor sign = RandomTensor({kSize}, 2);
  for (int64_t step = 1; step <= 3; ++step) {
    Tensor grad = RandomTensor({kSize}, 10 + step);
    for (int i = 0; i < kSize; ++i) grad[i] = std::copysign(0.1f + std::fabs(grad[i]), sign[i]);
    AdamWUpdate(param.data(), grad.data(), m.data(), v.data(), kSize, step, config, apply_decay);
    naive.Step(grad, step, config, apply_decay);
    for (absl::Status status :
         {CheckClose("param", param, naive.param, 0.0, 1e-6),
          CheckClose("m", m, naive.m, 0.0, 1e-6), CheckClose("v", v, naive.v, 0.0, 1e-6)}) {
      EXPECT_TRUE(status.ok()) << "step " << step << ": " << status;
    }
  }
}

TEST(AdamWUpdateTest, ThreeStepsWithDecay_MatchNaive) { ExpectThreeStepsMatchNaive(true); }

TEST(AdamWUpdateTest, ThreeStepsWithoutDecay_MatchNaive) { ExpectThreeStepsMatchNaive(false); }

TEST(AdamWUpdateTest, FirstStep_UpdateIsLrTimesSignOfGradient) {
  // Bias correction makes m_hat = g and v_hat = g^2 at step 1, so the update
  // is lr * g / (|g| + eps): lr in magnitude for any gradient scale and sign.
  AdamWConfig config;
  config.lr = 1e-3f;
  const std::vector<float> grads = {-1000.0f, -1.0f, -1e-3f, 1e-3f, 1.0f, 1000.0f};
  const int n = static_cast<int>(grads.size());
  for (bool apply_decay : {false, true}) {
    std::vector<float> param(n, 0.0f), m(n, 0.0f), v(n, 0.0f);
    AdamWUpdate(param.data(), grads.data(), m.data(), v.data(), n, 1, config, apply_decay);
    for (int i = 0; i < n; ++i) {
      // |g| / (|g| + eps) falls short of 1 by eps / |g| <= 1e-5 (at g = 1e-3),
      // plus fp32 rounding.
      EXPECT_NEAR(param[i], -std::copysign(config.lr, grads[i]), 2e-5 * config.lr)
          << "g = " << grads[i] << " decay " << apply_decay;
    }
  }
}

TEST(AdamWUpdateTest, ZeroGradientWithDecay_OnlyShrinksParameters) {
  AdamWConfig config;
  Tensor param = RandomTensor({kSize}, 1);
  const Tensor before = param.Clone();
  Tensor zero = Tensor::Zeros({kSize});
  Tensor m = Tensor::Zeros({kSize});
  Tensor v = Tensor::Zeros({kSize});
  AdamWUpdate(param.data(), zero.data(), m.data(), v.data(), kSize, 1, config, true);
  const float decay = 1.0f - config.lr * config.weight_decay;
  for (int i = 0; i < kSize; ++i) EXPECT_EQ(param[i], before[i] * decay);
}

TEST(AdamWUpdateDeathTest, StepZero_Aborts) {
  float p = 0.0f, g = 1.0f, m = 0.0f, v = 0.0f;
  EXPECT_DEATH(AdamWUpdate(&p, &g, &m, &v, 1, 0, AdamWConfig(), false),
               "AdamW step is 1-based, got 0");
}

}  // namespace
}  // namespace pipetrain
