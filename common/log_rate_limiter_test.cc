#include "common/log_rate_limiter.h"

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(LogRateLimiterTest, BurstPerPeriod_RestCountedAndReportedWithTheNextOne) {
  FakeClock clock;
  LogRateLimiter limiter(2, absl::Seconds(10), &clock);
  int64_t dropped = -1;
  EXPECT_TRUE(limiter.Allow(&dropped));
  EXPECT_EQ(dropped, 0);
  EXPECT_TRUE(limiter.Allow(&dropped));
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(limiter.Allow(&dropped));
  clock.Advance(absl::Seconds(9));
  EXPECT_FALSE(limiter.Allow(&dropped));  // still the same period
  clock.Advance(absl::Seconds(1));
  EXPECT_TRUE(limiter.Allow(&dropped));
  EXPECT_EQ(dropped, 6);
  EXPECT_EQ(LogRateLimiter::Dropped(dropped), " (6 similar messages not logged)");
  EXPECT_TRUE(limiter.Allow(&dropped));
  EXPECT_EQ(dropped, 0);
  EXPECT_EQ(LogRateLimiter::Dropped(0), "");
}

// A clock stepped back (a wall clock an operator set an hour back) starts
// a new window rather than silencing all but the burst until it catches up.
TEST(LogRateLimiterTest, ClockSteppedBack_NewWindowAfterAPeriod) {
  FakeClock clock;
  LogRateLimiter limiter(1, absl::Seconds(10), &clock);
  EXPECT_TRUE(limiter.Allow(nullptr));
  EXPECT_FALSE(limiter.Allow(nullptr));
  clock.Advance(absl::Hours(-1));
  EXPECT_TRUE(limiter.Allow(nullptr));
  EXPECT_FALSE(limiter.Allow(nullptr));
  clock.Advance(absl::Seconds(10));
  int64_t dropped = -1;
  EXPECT_TRUE(limiter.Allow(&dropped));
  EXPECT_EQ(dropped, 1);  // the one since the step back
}

}  // namespace
}  // namespace pipetrain
