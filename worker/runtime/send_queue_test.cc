#include "worker/runtime/send_queue.h"

#include <atomic>
#include <memory>
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

// Each task's bytes count from Enqueue until it has run, or was dropped
// behind a failed one; what it captured (a host copy) is freed by then.
TEST(SendQueueTest, QueuedBytes_CountedUntilEachTaskRanOrWasDropped) {
  SendQueue queue;
  absl::Notification release;
  auto copy = std::make_shared<int>(0);
  std::weak_ptr<int> held = copy;
  ASSERT_TRUE(queue
                  .Enqueue(
                      [&release, copy = std::move(copy)] {
                        release.WaitForNotification();
                        return absl::UnavailableError("peer 1 gone");
                      },
                      100)
                  .ok());
  ASSERT_TRUE(queue.Enqueue([] { return absl::OkStatus(); }, 20).ok());
  ASSERT_TRUE(queue.Enqueue([] { return absl::OkStatus(); }).ok());  // holds nothing
  EXPECT_EQ(queue.queued_bytes(), 120);
  EXPECT_EQ(queue.pending(), 3);
  release.Notify();
  EXPECT_EQ(queue.Drain().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(queue.queued_bytes(), 0);
  EXPECT_TRUE(held.expired());
}

// Tasks of 100 bytes, each let go in turn by another thread: a wait for at
// most 150 bytes returns once two of three have run (100 bytes left).
TEST(SendQueueTest, AwaitQueuedBytesAtMost_ReturnsOnceTheBytesFit) {
  SendQueue queue;
  AnnotatedMutex mu;
  int released = 0;  // guarded by mu
  std::atomic<int> ran{0};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(queue
                    .Enqueue(
                        [&, i]() -> absl::Status {
                          AnnotatedMutexLock lock(&mu);
                          mu.AwaitWithTimeout([&] { return released > i; },
                                              absl::InfiniteDuration());
                          ++ran;
                          return absl::OkStatus();
                        },
                        100)
                    .ok());
  }
  // The first two go; the third stays held until the wait returned, so the
  // wait must have waited for exactly those two (a wait that returned at
  // once would see none run).
  std::thread releaser([&] {
    AnnotatedMutexLock lock(&mu);
    released = 2;
  });
  queue.AwaitQueuedBytesAtMost(150);
  EXPECT_EQ(ran.load(), 2);
  EXPECT_EQ(queue.queued_bytes(), 100);
  releaser.join();
  {
    AnnotatedMutexLock lock(&mu);
    released = 3;
  }
  EXPECT_TRUE(queue.Drain().ok());
  EXPECT_EQ(ran.load(), 3);
}

// One task larger than the bound does not wait for itself (each send of a
// large tensor would wait for the one before it); a second one waits for
// the first.
TEST(SendQueueTest, AwaitQueuedBytesAtMost_OneTaskOverTheBoundAloneDoesNotWait) {
  SendQueue queue;
  absl::Notification release_first, first_ran;
  ASSERT_TRUE(queue
                  .Enqueue(
                      [&] {
                        release_first.WaitForNotification();
                        first_ran.Notify();
                        return absl::OkStatus();
                      },
                      1000)
                  .ok());
  queue.AwaitQueuedBytesAtMost(10);  // returns with the one task queued
  EXPECT_EQ(queue.pending(), 1);
  EXPECT_EQ(queue.queued_bytes(), 1000);

  absl::Notification release_second;
  ASSERT_TRUE(queue
                  .Enqueue(
                      [&] {
                        release_second.WaitForNotification();
                        return absl::OkStatus();
                      },
                      1000)
                  .ok());
  release_first.Notify();
  queue.AwaitQueuedBytesAtMost(10);  // until the first has run
  EXPECT_TRUE(first_ran.HasBeenNotified());
  EXPECT_EQ(queue.pending(), 1);
  EXPECT_EQ(queue.queued_bytes(), 1000);
  release_second.Notify();
  EXPECT_TRUE(queue.Drain().ok());
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
