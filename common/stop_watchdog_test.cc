#include "common/stop_watchdog.h"

#include <atomic>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// A step that never ends (Done() only after the watchdog fired).
TEST(StopWatchdogTest, NotDoneWithinTheLimit_CallsOnTimeout) {
  AnnotatedMutex mu;
  int calls = 0;
  {
    StopWatchdog watchdog(absl::Milliseconds(1), [&] {
      AnnotatedMutexLock lock(&mu);
      ++calls;
    });
    AnnotatedMutexLock lock(&mu);
    EXPECT_TRUE(mu.AwaitWithTimeout([&] { return calls > 0; }, absl::Seconds(60)));
  }
  AnnotatedMutexLock lock(&mu);
  EXPECT_EQ(calls, 1);
}

TEST(StopWatchdogTest, DoneWithinTheLimit_NeverCallsOnTimeout) {
  std::atomic<int> calls{0};
  {
    StopWatchdog watchdog(absl::Hours(1), [&] { calls.fetch_add(1); });
    watchdog.Done();
  }  // joins at once: Done() woke it
  EXPECT_EQ(calls.load(), 0);
}

}  // namespace
}  // namespace pipetrain
