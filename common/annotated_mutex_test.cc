#include "common/annotated_mutex.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// Shared state of the tests: a plain counter that only the mutex protects,
// which is what TSan must see as correctly synchronised.
struct Counter {
  AnnotatedMutex mu;
  int value ABSL_GUARDED_BY(mu) = 0;

  void Increment() {
    AnnotatedMutexLock lock(&mu);
    ++value;
  }
  bool AwaitAtLeast(int n, absl::Duration timeout) {
    AnnotatedMutexLock lock(&mu);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return value >= n; };
    return mu.AwaitWithTimeout(reached, timeout);
  }
};

TEST(AnnotatedMutexTest, Lock_ConcurrentIncrements_CountsAll) {
  Counter counter;
  constexpr int kThreads = 4;
  constexpr int kIncrements = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&counter] {
      for (int i = 0; i < kIncrements; ++i) counter.Increment();
    });
  }
  for (std::thread& thread : threads) thread.join();
  AnnotatedMutexLock lock(&counter.mu);
  EXPECT_EQ(counter.value, kThreads * kIncrements);
}

TEST(AnnotatedMutexTest, AwaitWithTimeout_OtherThreadReaches_ReturnsTrue) {
  Counter counter;
  std::thread producer([&counter] {
    for (int i = 0; i < 1000; ++i) counter.Increment();
  });
  // A generous bound on the wait, not a timing assertion.
  EXPECT_TRUE(counter.AwaitAtLeast(1000, absl::Seconds(10)));
  producer.join();
}

TEST(AnnotatedMutexTest, AwaitWithTimeout_NeverReached_ReturnsFalse) {
  Counter counter;
  EXPECT_FALSE(counter.AwaitAtLeast(1, absl::Milliseconds(10)));
}

}  // namespace
}  // namespace pipetrain
