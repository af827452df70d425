// BackgroundQueue: a JobManagerOptions::background_runner for tests. It keeps
// the tasks a JobManager hands it (plans, final weights files) until the
// test runs them, on the test's thread, so a test can decide what happens
// while a job is PLANNING or its weights are written (a worker lost, a
// cancel, a drain) and stays single-threaded otherwise.
//
//   BackgroundQueue background;
//   JobManager jobs(&registry, &hub, &clock, {.background_runner = background.Runner()});
//   jobs.ScheduleQueued();  // the job is PLANNING
//   background.RunAll();    // now RUNNING (or FAILED)
//
// Thread-safe (a profile fetch's thread may hand tasks over). Must outlive
// the JobManager using it; tasks left unrun are dropped unrun.
#ifndef PIPETRAIN_COORDINATOR_JOBS_BACKGROUND_QUEUE_TESTING_H_
#define PIPETRAIN_COORDINATOR_JOBS_BACKGROUND_QUEUE_TESTING_H_

#include <deque>
#include <functional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/annotated_mutex.h"

namespace pipetrain {

class BackgroundQueue {
 public:
  std::function<void(std::function<void()>)> Runner() {
    return [this](std::function<void()> task) {
      AnnotatedMutexLock lock(&mu_);
      tasks_.push_back(std::move(task));
    };
  }

  // Runs the tasks handed over so far, and those they hand over, oldest
  // first; returns how many ran.
  int RunAll() {
    int ran = 0;
    while (true) {
      std::function<void()> task;
      {
        AnnotatedMutexLock lock(&mu_);
        if (tasks_.empty()) return ran;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();  // takes the job manager's lock: not under ours
      ++ran;
    }
  }

  int pending() const {
    AnnotatedMutexLock lock(&mu_);
    return static_cast<int>(tasks_.size());
  }

  // Waits until a task has been handed over from another thread, at most
  // `timeout`; whether one is pending.
  bool AwaitPending(absl::Duration timeout) const {
    AnnotatedMutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !tasks_.empty(); }, timeout);
  }

 private:
  mutable AnnotatedMutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_JOBS_BACKGROUND_QUEUE_TESTING_H_
