#include "common/serial_executor.h"

#include <chrono>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(SerialExecutor, Destructor_RunsEveryPostedTaskInOrder) {
  std::vector<int> order;  // touched only by the executor's thread, read after the join
  {
    SerialExecutor executor;
    for (int i = 0; i < 100; ++i) executor.Post([&order, i] { order.push_back(i); });
  }
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(SerialExecutor, Post_FromSeveralThreadsAndFromTasks_RunsAll) {
  std::mutex mu;
  int runs = 0;
  {
    SerialExecutor executor;
    std::vector<std::thread> posters;
    for (int t = 0; t < 4; ++t) {
      posters.emplace_back([&] {
        for (int i = 0; i < 25; ++i) {
          executor.Post([&] {
            std::lock_guard<std::mutex> lock(mu);
            ++runs;
          });
        }
      });
    }
    for (std::thread& poster : posters) poster.join();
    // A task that posts another while the destructor drains the queue.
    executor.Post([&] {
      executor.Post([&] {
        std::lock_guard<std::mutex> lock(mu);
        ++runs;
      });
    });
  }
  EXPECT_EQ(runs, 101);
}

// The age is that of the oldest task not finished: the one running (stuck
// here on `release`), then, once it is done, nothing.
TEST(SerialExecutor, OldestTaskAge_TheRunningTaskOnlyUntilItEnds) {
  FakeClock clock;
  std::promise<void> started;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::promise<void> second_ran;
  SerialExecutor executor(&clock);
  EXPECT_EQ(executor.OldestTaskAge(), absl::ZeroDuration());
  executor.Post([&started, released] {
    started.set_value();
    released.wait();
  });
  started.get_future().wait();
  clock.Advance(absl::Seconds(7));
  EXPECT_EQ(executor.OldestTaskAge(), absl::Seconds(7));
  executor.Post([&second_ran] { second_ran.set_value(); });
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(executor.OldestTaskAge(), absl::Seconds(9));  // the first, still running
  release.set_value();
  second_ran.get_future().wait();
  clock.Advance(absl::Seconds(5));
  // The loop marks the second task done once it returns: the age drops to
  // zero then (a task left marked running would keep the second's 7 s).
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (executor.OldestTaskAge() != absl::ZeroDuration() &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::yield();
  }
  EXPECT_EQ(executor.OldestTaskAge(), absl::ZeroDuration());
}

}  // namespace
}  // namespace pipetrain
