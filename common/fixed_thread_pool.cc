#include "common/fixed_thread_pool.h"

#include <utility>

#include "common/logging.h"

namespace pipetrain {

FixedThreadPool::FixedThreadPool(int threads) {
  PT_CHECK(threads >= 1) << "FixedThreadPool needs at least one thread, got " << threads;
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

FixedThreadPool::~FixedThreadPool() { Stop(); }

void FixedThreadPool::Post(std::function<void()> task) {
  AnnotatedMutexLock lock(&mu_);
  if (stopping_) return;  // dropped: destroyed as Post returns
  tasks_.push_back(std::move(task));
}

void FixedThreadPool::Stop() {
  std::deque<std::function<void()>> dropped;  // destroyed after the lock is released
  {
    AnnotatedMutexLock lock(&mu_);
    stopping_ = true;
    dropped.swap(tasks_);
  }
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
}

bool FixedThreadPool::AwaitIdle(absl::Duration timeout) {
  AnnotatedMutexLock lock(&mu_);
  auto idle = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return tasks_.empty() && running_ == 0; };
  return mu_.AwaitWithTimeout(idle, timeout);
}

void FixedThreadPool::Run() {
  auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !tasks_.empty(); };
  while (true) {
    std::function<void()> task;
    {
      AnnotatedMutexLock lock(&mu_);
      mu_.AwaitWithTimeout(wake, absl::InfiniteDuration());
      if (stopping_) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
      ++running_;
    }
    task();
    task = nullptr;  // what it holds goes before it counts as done
    AnnotatedMutexLock lock(&mu_);
    --running_;
  }
}

}  // namespace pipetrain
