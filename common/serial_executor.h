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
#include "common/annotated_mutex.h"

namespace pipetrain {

class SerialExecutor {
 public:
  SerialExecutor();
  // Runs every task already posted, then joins the thread.
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  // Queues `task`. Requires: the destructor has not started (checked). A task
  // may post further tasks.
  void Post(std::function<void()> task);

 private:
  void Run();

  AnnotatedMutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the fields above exist
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_SERIAL_EXECUTOR_H_
