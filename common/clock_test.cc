#include "common/clock.h"

#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(FakeClockTest, Now_Default_IsFixedInstant) {
  FakeClock clock;
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(1700000000));
}

TEST(FakeClockTest, Advance_MovesByExactlyDelta) {
  const absl::Time start = absl::FromUnixSeconds(100);
  FakeClock clock(start);
  clock.Advance(absl::Milliseconds(1500));
  EXPECT_EQ(clock.Now(), start + absl::Milliseconds(1500));
  clock.Advance(absl::Seconds(-1));
  EXPECT_EQ(clock.Now(), start + absl::Milliseconds(500));
}

TEST(FakeClockTest, Set_ReplacesTime) {
  FakeClock clock;
  clock.Set(absl::FromUnixSeconds(42));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(42));
}

TEST(FakeClockTest, Advance_ConcurrentThreads_SumsAllSteps) {
  FakeClock clock(absl::UnixEpoch());
  constexpr int kThreads = 4;
  constexpr int kSteps = 1000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&clock] {
      for (int i = 0; i < kSteps; ++i) {
        clock.Advance(absl::Nanoseconds(1));
        (void)clock.Now();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(clock.Now(), absl::UnixEpoch() + absl::Nanoseconds(kThreads * kSteps));
}

TEST(RealClockTest, RealClock_IsProcessWideAndNearAbslNow) {
  Clock* clock = RealClock();
  ASSERT_NE(clock, nullptr);
  EXPECT_EQ(clock, RealClock());
  // Not a timing assertion: only that it reads the wall clock, not a fake.
  EXPECT_LT(absl::AbsDuration(clock->Now() - absl::Now()), absl::Minutes(1));
}

}  // namespace
}  // namespace pipetrain
