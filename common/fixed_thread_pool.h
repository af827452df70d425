// FixedThreadPool: a fixed number of threads of its own run posted tasks,
// oldest first, up to that many at once. The HTTP server runs its handlers
// on one, so a burst of requests queues instead of starting threads.
//
//   FixedThreadPool pool(4);
//   pool.Post([request] { Handle(request); });
//   pool.Stop();  // queued tasks are dropped, running ones finish
//
// Post is thread-safe; Stop is not (see there).
#ifndef PIPETRAIN_COMMON_FIXED_THREAD_POOL_H_
#define PIPETRAIN_COMMON_FIXED_THREAD_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/annotated_mutex.h"

namespace pipetrain {

class FixedThreadPool {
 public:
  // Starts `threads` threads. Requires: threads >= 1 (checked).
  explicit FixedThreadPool(int threads);
  ~FixedThreadPool();  // Stop()
  FixedThreadPool(const FixedThreadPool&) = delete;
  FixedThreadPool& operator=(const FixedThreadPool&) = delete;

  // Queues `task`. After Stop has begun the task is dropped (destroyed
  // unrun): callers must not rely on it running.
  void Post(std::function<void()> task);

  // Waits up to `timeout` until no task is queued or running: whether that
  // happened. Tasks may still be posted meanwhile (they are waited for).
  bool AwaitIdle(absl::Duration timeout);

  // Drops the tasks still queued, waits for the running ones and joins the
  // threads. Idempotent, but not concurrently with itself or the
  // destructor; not from a task (it would wait for itself).
  void Stop();

 private:
  void Run();

  AnnotatedMutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;  // last: they start after the fields above exist
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_FIXED_THREAD_POOL_H_
