// SerialExecutor: one thread of its own that runs posted tasks one at a
// time, in the order posted. Users: the coordinator's gRPC service, for work
// that must not run inside a gRPC reaction (STYLE.md item 6: anything that
// may wait on JobManager while it writes a job's final weights, or that plans
// a job); the stage runtime's background sends (worker/runtime/send_queue.h).
//
//   SerialExecutor executor;
//   executor.Post([=] { reactor->Finish(ToGrpcStatus(jobs->FinishWeights(w, j))); });
//
// Thread-safe.
#ifndef PIPETRAIN_COMMON_SERIAL_EXECUTOR_H_
#define PIPETRAIN_COMMON_SERIAL_EXECUTOR_H_

#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/annotated_mutex.h"
#include "common/clock.h"

namespace pipetrain {

class SerialExecutor {
 public:
  // `clock` (not owned; MonotonicClock() when null) times OldestTaskAge.
  explicit SerialExecutor(const Clock* clock = nullptr);
  // Runs every task already posted, then joins the thread.
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  // Queues `task`. Requires: the destructor has not started (checked). A task
  // may post further tasks.
  void Post(std::function<void()> task);

  // How long ago the oldest task not yet finished was posted (the one
  // running, else the first waiting); zero when none is. A queue whose
  // task is stuck (a file system that stopped answering) shows it here
  // while every task behind it waits.
  absl::Duration OldestTaskAge() const;

 private:
  struct Task {
    std::function<void()> run;
    absl::Time posted;
  };
  void Run();

  const Clock* const clock_;
  mutable AnnotatedMutex mu_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  // When the task now running was posted; InfiniteFuture when none runs.
  absl::Time running_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the fields above exist
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_SERIAL_EXECUTOR_H_
