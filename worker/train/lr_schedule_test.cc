#include "worker/train/lr_schedule.h"

#include <cmath>

#include "gtest/gtest.h"
#include "worker/model/cpu_backend.h"
#include "worker/model/forwarding_backend.h"
#include "worker/train/grad_clip.h"

namespace pipetrain {
namespace {

TrainConfig Config(LrSchedule schedule, int64_t warmup) {
  TrainConfig c;
  c.steps = 100;
  c.adam.lr = 1e-3f;
  c.min_lr = 1e-4f;
  c.lr_schedule = schedule;
  c.warmup_steps = warmup;
  return c;
}

TEST(LrScheduleTest, ConstantWithWarmUp) {
  const TrainConfig c = Config(LrSchedule::kConstant, 10);
  EXPECT_FLOAT_EQ(LearningRate(c, 0), 1e-4f);
  EXPECT_FLOAT_EQ(LearningRate(c, 4), 5e-4f);
  EXPECT_FLOAT_EQ(LearningRate(c, 9), 1e-3f);
  EXPECT_EQ(LearningRate(c, 10), 1e-3f);
  EXPECT_EQ(LearningRate(c, 99), 1e-3f);
  EXPECT_EQ(LearningRate(Config(LrSchedule::kConstant, 0), 0), 1e-3f);  // no warm-up
}

TEST(LrScheduleTest, CosineFromLrToMinLr) {
  const TrainConfig c = Config(LrSchedule::kCosine, 20);
  EXPECT_FLOAT_EQ(LearningRate(c, 19), 1e-3f);      // last warm-up step
  EXPECT_FLOAT_EQ(LearningRate(c, 20), 1e-3f);      // p = 0
  EXPECT_NEAR(LearningRate(c, 60), 5.5e-4f, 1e-9);  // p = 1/2: halfway
  EXPECT_GT(LearningRate(c, 99), 1e-4f);            // p = 79/80: just above the floor
  EXPECT_LT(LearningRate(c, 99), 1.01e-4f);
  for (int64_t s = 21; s < 100; ++s) EXPECT_LE(LearningRate(c, s), LearningRate(c, s - 1));
}

// Past the last step the cosine holds at its floor: cos(pi p) for p > 1
// would climb back towards lr (at p = 2, step 180, all the way).
TEST(LrScheduleTest, CosinePastTheLastStep_HoldsAtMinLr) {
  const TrainConfig c = Config(LrSchedule::kCosine, 20);
  EXPECT_FLOAT_EQ(LearningRate(c, 100), 1e-4f);  // p = 1
  EXPECT_FLOAT_EQ(LearningRate(c, 140), 1e-4f);
  EXPECT_FLOAT_EQ(LearningRate(c, 180), 1e-4f);
}

TEST(LrScheduleTest, Parse) {
  LrSchedule s;
  EXPECT_TRUE(ParseLrSchedule("f", "cosine", &s).ok());
  EXPECT_EQ(s, LrSchedule::kCosine);
  EXPECT_EQ(ParseLrSchedule("spec.training.lr_schedule", "linear", &s).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GradClipTest, ScaleOnlyAboveTheNorm_SquaresInDouble) {
  Parameter a, b;
  a.grad = Tensor::FromVector({2}, {3.0f, 0.0f});
  b.grad = Tensor::FromVector({1}, {4.0f});
  const double total = ParameterSquares(CpuBackend(), a) + ParameterSquares(CpuBackend(), b);
  EXPECT_EQ(total, 25.0);
  EXPECT_EQ(ClipScale(total, 10.0f), 1.0f);  // norm 5 below 10
  const float scale = ClipScale(total, 1.0f);
  EXPECT_FLOAT_EQ(scale, 1.0f / (5.0f + 1e-6f));
  ScaleGradients(CpuBackend(), {&a, &b}, scale);
  EXPECT_FLOAT_EQ(a.grad.data()[0], 3.0f * scale);
  EXPECT_FLOAT_EQ(b.grad.data()[0], 4.0f * scale);
  EXPECT_EQ(ClipScale(total, 0.0f), 1.0f);  // off
}

// Counts the clipping passes' backend calls: a device backend waits once
// per SumsOfSquares call, so clipping must make one for all parameters.
class CountingBackend : public ForwardingBackend {
 public:
  CountingBackend() : ForwardingBackend(CpuBackend()) {}
  std::vector<double> SumsOfSquares(const std::vector<const Tensor*>& tensors) override {
    ++sums_calls;
    return inner()->SumsOfSquares(tensors);
  }
  void ScaleInPlace(const std::vector<Tensor*>& tensors, float scale) override {
    ++scale_calls;
    inner()->ScaleInPlace(tensors, scale);
  }
  int sums_calls = 0, scale_calls = 0;
};

TEST(GradClipTest, ClipByGlobalNorm_OneSumsCallInParameterOrder_ThenOneScale) {
  Parameter a, b, c;
  a.grad = Tensor::FromVector({2}, {3.0f, 0.0f});
  b.grad = Tensor::FromVector({1}, {4.0f});
  c.grad = Tensor::FromVector({0}, {});
  CountingBackend backend;
  EXPECT_EQ(ParametersSquares(&backend, {&a, &b, &c}), (std::vector<double>{9.0, 16.0, 0.0}));
  EXPECT_EQ(backend.sums_calls, 1);

  backend.sums_calls = 0;
  const float scale = ClipGradientsByGlobalNorm(&backend, {&a, &b, &c}, 1.0f);
  EXPECT_EQ(scale, ClipScale(25.0, 1.0f));
  EXPECT_EQ(backend.sums_calls, 1);
  EXPECT_EQ(backend.scale_calls, 1);
  EXPECT_EQ(a.grad.data()[0], 3.0f * scale);
  EXPECT_EQ(b.grad.data()[0], 4.0f * scale);

  // Below the norm, or off: no scaling call, gradients untouched.
  backend.sums_calls = backend.scale_calls = 0;
  EXPECT_EQ(ClipGradientsByGlobalNorm(&backend, {&a, &b}, 10.0f), 1.0f);
  EXPECT_EQ(backend.scale_calls, 0);
  EXPECT_EQ(ClipGradientsByGlobalNorm(&backend, {&a, &b}, 0.0f), 1.0f);
  EXPECT_EQ(backend.sums_calls, 1);  // off: not even the sums
  EXPECT_EQ(b.grad.data()[0], 4.0f * scale);
}

}  // namespace
}  // namespace pipetrain
