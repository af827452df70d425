#include "worker/agent/step_tracing.h"

#include <vector>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

std::vector<int64_t> Traced(int64_t plan_start, int64_t steps) {
  std::vector<int64_t> traced;
  for (int64_t it = plan_start - 2; it < steps + 2; ++it) {
    if (IsTracedStep(it, plan_start, steps)) traced.push_back(it);
  }
  return traced;
}

TEST(IsTracedStep, EleventhStepThenEveryHundredth) {
  EXPECT_EQ(Traced(0, 800), (std::vector<int64_t>{10, 110, 210, 310, 410, 510, 610, 710}));
  EXPECT_EQ(Traced(0, 111), (std::vector<int64_t>{10, 110}));
  EXPECT_EQ(Traced(0, 110), (std::vector<int64_t>{10}));
}

TEST(IsTracedStep, CountsFromTheResumedPlansStart) {
  EXPECT_EQ(Traced(250, 400), (std::vector<int64_t>{260, 360}));
}

TEST(IsTracedStep, ShortPlanTracesItsLastStep) {
  EXPECT_EQ(Traced(0, 5), (std::vector<int64_t>{4}));
  EXPECT_EQ(Traced(0, 1), (std::vector<int64_t>{0}));
  EXPECT_EQ(Traced(395, 400), (std::vector<int64_t>{399}));
  EXPECT_EQ(Traced(0, 11), (std::vector<int64_t>{10}));
}

TEST(IsTracedStep, NothingOutsideThePlan) {
  EXPECT_EQ(Traced(400, 400), (std::vector<int64_t>{}));
  EXPECT_FALSE(IsTracedStep(-1, 0, 100));
}

}  // namespace
}  // namespace pipetrain
