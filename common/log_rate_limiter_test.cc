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

}  // namespace
}  // namespace pipetrain
