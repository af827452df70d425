#include "common/serial_executor.h"

#include <utility>

#include "common/logging.h"

namespace pipetrain {

SerialExecutor::SerialExecutor() : thread_([this] { Run(); }) {}

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
  tasks_.push_back(std::move(task));
}

void SerialExecutor::Run() {
  auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !tasks_.empty();
  };
  while (true) {
    std::function<void()> task;
    {
      AnnotatedMutexLock lock(&mu_);
      mu_.AwaitWithTimeout(wake, absl::InfiniteDuration());
      if (tasks_.empty()) return;  // stopping, and everything posted has run
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace pipetrain
