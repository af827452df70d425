#include "worker/runtime/send_queue.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/annotated_mutex.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(SendQueueTest, RunsTasksInOrderAndDrainWaitsForAll) {
  SendQueue queue;
  AnnotatedMutex mu;
  std::vector<int> order;
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(queue
                    .Enqueue([&, i] {
                      AnnotatedMutexLock lock(&mu);
                      order.push_back(i);
                      return absl::OkStatus();
                    })
                    .ok());
  }
  ASSERT_TRUE(queue.Drain().ok());
  EXPECT_EQ(queue.pending(), 0);
  AnnotatedMutexLock lock(&mu);
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(SendQueueTest, EnqueueReturnsBeforeTheTaskRuns) {
  SendQueue queue;
  absl::Notification release, ran;
  ASSERT_TRUE(queue
                  .Enqueue([&] {
                    release.WaitForNotification();
                    ran.Notify();
                    return absl::OkStatus();
                  })
                  .ok());
  // The task blocks until released, so Enqueue must not have waited for it.
  EXPECT_EQ(queue.pending(), 1);
  EXPECT_FALSE(ran.HasBeenNotified());
  release.Notify();
  ASSERT_TRUE(queue.Drain().ok());
  EXPECT_TRUE(ran.HasBeenNotified());
}

// The validation pass paces its sends with AwaitPendingAtMost: it returns
// once at most that many tasks are left (here after two of three ran, each
// let go by another thread), and leaves a task's error to Drain.
TEST(SendQueueTest, AwaitPendingAtMost_ReturnsOnceFewAreLeftAndKeepsTheError) {
  SendQueue queue;
  AnnotatedMutex mu;
  int released = 0;  // guarded by mu
  std::atomic<int> ran{0};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(queue
                    .Enqueue([&, i]() -> absl::Status {
                      AnnotatedMutexLock lock(&mu);
                      mu.AwaitWithTimeout([&] { return released > i; }, absl::InfiniteDuration());
                      ++ran;
                      return i == 2 ? absl::InternalError("last") : absl::OkStatus();
                    })
                    .ok());
  }
  std::thread releaser([&] {
    for (int i = 0; i < 3; ++i) {
      AnnotatedMutexLock lock(&mu);
      ++released;
    }
  });
  queue.AwaitPendingAtMost(1);
  EXPECT_GE(ran.load(), 2);
  EXPECT_LE(queue.pending(), 1);
  releaser.join();
  queue.AwaitPendingAtMost(0);
  EXPECT_EQ(queue.pending(), 0);
  EXPECT_EQ(queue.Drain().code(), absl::StatusCode::kInternal);
}

TEST(SendQueueTest, FirstErrorSticksDropsLaterTasksAndDrainClearsIt) {
  SendQueue queue;
  std::atomic<int> ran{0};
  absl::Notification release;
  ASSERT_TRUE(queue
                  .Enqueue([&] {
                    release.WaitForNotification();
                    ++ran;
                    return absl::UnavailableError("peer 2 gone");
                  })
                  .ok());
  // Queued before the failure is known: dropped unrun.
  ASSERT_TRUE(queue
                  .Enqueue([&] {
                    ++ran;
                    return absl::InternalError("second");
                  })
                  .ok());
  release.Notify();
  absl::Status drained = queue.Drain();
  EXPECT_EQ(drained.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(drained.message(), "peer 2 gone");
  EXPECT_EQ(ran.load(), 1);
  // Reported once: the queue works again afterwards.
  ASSERT_TRUE(queue
                  .Enqueue([&] {
                    ++ran;
                    return absl::OkStatus();
                  })
                  .ok());
  EXPECT_TRUE(queue.Drain().ok());
  EXPECT_EQ(ran.load(), 2);
}

TEST(SendQueueTest, EnqueueAfterAFailureReturnsTheErrorWithoutQueueing) {
  SendQueue queue;
  ASSERT_TRUE(queue.Enqueue([] { return absl::DataLossError("bad payload"); }).ok());
  // Wait for the failure without clearing it: Drain would clear it, so poll
  // pending() — bounded, since the single task finishes on its own.
  while (queue.pending() != 0) std::this_thread::yield();
  bool ran = false;
  absl::Status status = queue.Enqueue([&] {
    ran = true;
    return absl::OkStatus();
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(queue
                .Enqueue([&] {
                  ran = true;
                  return absl::OkStatus();
                })
                .code(),
            absl::StatusCode::kDataLoss);  // still refused until drained
  // Returned by Enqueue, so not again by the Drain a failing caller runs on
  // its way out: the stage runtime's error read "X; also failed: X".
  EXPECT_TRUE(queue.Drain().ok());
  EXPECT_FALSE(ran);
  // Cleared: the queue runs tasks again, and a new error is reported by Drain.
  ASSERT_TRUE(queue.Enqueue([] { return absl::UnavailableError("gone"); }).ok());
  EXPECT_EQ(queue.Drain().code(), absl::StatusCode::kUnavailable);
}

TEST(SendQueueTest, DestructorRunsQueuedTasks) {
  std::atomic<int> ran{0};
  {
    SendQueue queue;
    for (int i = 0; i < 10; ++i) {
      ASSERT_TRUE(queue
                      .Enqueue([&] {
                        ++ran;
                        return absl::OkStatus();
                      })
                      .ok());
    }
  }
  EXPECT_EQ(ran.load(), 10);
}

}  // namespace
}  // namespace pipetrain
