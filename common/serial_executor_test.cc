#include "common/serial_executor.h"

#include <mutex>
#include <thread>
#include <vector>

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

}  // namespace
}  // namespace pipetrain
