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

TEST(AnnotatedMutexTest, AwaitWithTimeout_ZeroOrNegative_ReturnsPredicateAtOnce) {
  Counter counter;
  EXPECT_FALSE(counter.AwaitAtLeast(1, absl::ZeroDuration()));
  EXPECT_FALSE(counter.AwaitAtLeast(1, absl::Seconds(-1)));
  counter.Increment();
  EXPECT_TRUE(counter.AwaitAtLeast(1, absl::ZeroDuration()));
}

TEST(AnnotatedMutexTest, AwaitWithTimeout_Infinite_WaitsUntilReached) {
  Counter counter;
  std::thread producer([&counter] {
    for (int i = 0; i < 100; ++i) counter.Increment();
  });
  EXPECT_TRUE(counter.AwaitAtLeast(100, absl::InfiniteDuration()));
  producer.join();
}

// Two timed waiters on one mutex: each is woken by its own predicate, and
// one whose predicate never holds still times out while the other waits on.
TEST(AnnotatedMutexTest, AwaitWithTimeout_TwoWaiters_EachWokenByItsOwnPredicate) {
  AnnotatedMutex mu;
  int a ABSL_GUARDED_BY(mu) = 0;
  int b ABSL_GUARDED_BY(mu) = 0;
  bool a_met = false;
  bool never_met = true;
  std::thread waits_for_a([&] {
    AnnotatedMutexLock lock(&mu);
    a_met = mu.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return a == 1; },
                                absl::Seconds(30));
  });
  std::thread waits_in_vain([&] {
    AnnotatedMutexLock lock(&mu);
    never_met = mu.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return b == 7; },
                                    absl::Milliseconds(50));
  });
  waits_in_vain.join();
  {
    AnnotatedMutexLock lock(&mu);
    b = 1;
    a = 1;
  }
  waits_for_a.join();
  EXPECT_TRUE(a_met);
  EXPECT_FALSE(never_met);
}

// A thread that changes the state and then waits itself (releasing the
// mutex inside AwaitWithTimeout, not through Unlock) still wakes the timed
// waiter the change satisfied: otherwise both would wait, the first until
// its 30 s ran out (met false), the second for the first.
TEST(AnnotatedMutexTest, AwaitWithTimeout_ChangeThenWait_WakesTimedWaiter) {
  for (const absl::Duration second_wait : {absl::InfiniteDuration(), absl::Seconds(60)}) {
    AnnotatedMutex mu;
    bool waiting ABSL_GUARDED_BY(mu) = false;
    bool asked ABSL_GUARDED_BY(mu) = false;
    bool answered ABSL_GUARDED_BY(mu) = false;
    bool met = false;
    std::thread answerer([&] {
      AnnotatedMutexLock lock(&mu);
      waiting = true;  // seen once this thread releases the mutex to wait
      met = mu.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return asked; },
                                absl::Seconds(30));
      answered = true;
    });
    {
      AnnotatedMutexLock lock(&mu);
      // Untimed (Abseil's own wait): the answerer is then listed as waiting.
      mu.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return waiting; },
                          absl::InfiniteDuration());
      asked = true;
      EXPECT_TRUE(mu.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return answered; },
                                      second_wait));
    }
    answerer.join();
    EXPECT_TRUE(met) << "second wait " << second_wait;
  }
}

// Many timed waiters and changers at once (for TSan, and for wakes lost
// between a waiter's check and its sleep: each round's waiter would then
// time out, which the counts would show).
TEST(AnnotatedMutexTest, AwaitWithTimeout_ManyRounds_NoWakeLost) {
  AnnotatedMutex mu;
  int turn ABSL_GUARDED_BY(mu) = 0;
  constexpr int kThreads = 4;
  constexpr int kRounds = 500;
  std::vector<int> timeouts(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        AnnotatedMutexLock lock(&mu);
        const int mine = round * kThreads + t;
        if (!mu.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return turn == mine; },
                                 absl::Seconds(30))) {
          ++timeouts[t];
          return;
        }
        ++turn;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  AnnotatedMutexLock lock(&mu);
  EXPECT_EQ(turn, kThreads * kRounds);
  EXPECT_EQ(timeouts, std::vector<int>(kThreads, 0));
}

}  // namespace
}  // namespace pipetrain
