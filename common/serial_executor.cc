#include "common/serial_executor.h"

#include <algorithm>
#include <utility>

#include "common/logging.h"

namespace pipetrain {

SerialExecutor::SerialExecutor(const Clock* clock)
    : clock_(clock != nullptr ? clock : MonotonicClock()), thread_([this] { Run(); }) {}

SerialExecutor::~SerialExecutor() {
  {
    AnnotatedMutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void SerialExecutor::Post(std::function<void()> task) {
  AnnotatedMutexLock lock(&mu_);
  PT_CHECK(!stopping_ || std::this_thread::get_id() == thread_.get_id())
      << "SerialExecutor::Post after destruction began";
  tasks_.push_back({std::move(task), clock_->Now()});
}

absl::Duration SerialExecutor::OldestTaskAge() const {
  AnnotatedMutexLock lock(&mu_);
  absl::Time oldest = running_since_;
  if (!tasks_.empty()) oldest = std::min(oldest, tasks_.front().posted);
  if (oldest == absl::InfiniteFuture()) return absl::ZeroDuration();
  return std::max(absl::ZeroDuration(), clock_->Now() - oldest);
}

void SerialExecutor::Run() {
  auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !tasks_.empty();
  };
  while (true) {
    std::function<void()> task;
    {
      AnnotatedMutexLock lock(&mu_);
      running_since_ = absl::InfiniteFuture();
      mu_.AwaitWithTimeout(wake, absl::InfiniteDuration());
      if (tasks_.empty()) return;  // stopping, and everything posted has run
      task = std::move(tasks_.front().run);
      running_since_ = tasks_.front().posted;
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace pipetrain
