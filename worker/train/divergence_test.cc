#include "worker/train/divergence.h"

#include <limits>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(CheckLossFiniteTest, FiniteLosses_Ok) {
  EXPECT_TRUE(CheckLossFinite(1, 5.5f).ok());
  EXPECT_TRUE(CheckLossFinite(2, 0.0f).ok());
  EXPECT_TRUE(CheckLossFinite(3, std::numeric_limits<float>::max()).ok());
}

TEST(CheckLossFiniteTest, NanOrInfinite_FailedPreconditionNamingTheStep) {
  const absl::Status nan = CheckLossFinite(7, std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(nan.message(), "the loss of step 7 is nan")) << nan;
  const absl::Status inf = CheckLossFinite(9, -std::numeric_limits<float>::infinity());
  EXPECT_EQ(inf.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(inf.message(), "the loss of step 9 is infinite")) << inf;
}

TEST(CheckWeightsAfterStepTest, NamesTheStepAndWhatTheCheckFound) {
  EXPECT_TRUE(CheckWeightsAfterStep(4, absl::OkStatus()).ok());
  const absl::Status broken =
      CheckWeightsAfterStep(12, absl::FailedPreconditionError("wte.weight holds NaN at element 3"));
  EXPECT_EQ(broken.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StartsWith(broken.message(),
                               "training diverged: after step 12, wte.weight holds NaN at "
                               "element 3 (that step's loss was still finite)"))
      << broken;
}

}  // namespace
}  // namespace pipetrain
