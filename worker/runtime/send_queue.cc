#include "worker/runtime/send_queue.h"

#include <utility>

namespace pipetrain {

absl::Status SendQueue::Enqueue(Task task, int64_t bytes) {
  {
    AnnotatedMutexLock lock(&mu_);
    if (!first_error_.ok()) {
      error_returned_ = true;
      return first_error_;
    }
    ++pending_;
    queued_bytes_ += bytes;
  }
  executor_.Post([this, task = std::move(task), bytes]() mutable {
    bool failed_before;
    {
      AnnotatedMutexLock lock(&mu_);
      failed_before = !first_error_.ok();
    }
    absl::Status status = failed_before ? absl::OkStatus() : task();
    task = nullptr;  // what it held (a host copy) is freed before it stops counting
    AnnotatedMutexLock lock(&mu_);
    if (!status.ok() && first_error_.ok()) first_error_ = std::move(status);
    --pending_;
    queued_bytes_ -= bytes;
  });
  return absl::OkStatus();
}

absl::Status SendQueue::Drain() {
  AnnotatedMutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; };
  mu_.AwaitWithTimeout(idle, absl::InfiniteDuration());
  absl::Status error = std::exchange(first_error_, absl::OkStatus());
  // Reported once: a caller that got it from Enqueue, and drains on its
  // way out, would otherwise add it to itself ("X; also failed: X").
  if (std::exchange(error_returned_, false)) return absl::OkStatus();
  return error;
}

absl::Status SendQueue::TakeError() {
  AnnotatedMutexLock lock(&mu_);
  if (first_error_.ok()) return absl::OkStatus();
  error_returned_ = true;
  return first_error_;
}

void SendQueue::AwaitPendingAtMost(int64_t most) {
  AnnotatedMutexLock lock(&mu_);
  auto few = [this, most]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ <= most; };
  mu_.AwaitWithTimeout(few, absl::InfiniteDuration());
}

void SendQueue::AwaitQueuedBytesAtMost(int64_t most) {
  AnnotatedMutexLock lock(&mu_);
  auto room = [this, most]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queued_bytes_ <= most || pending_ <= 1;
  };
  mu_.AwaitWithTimeout(room, absl::InfiniteDuration());
}

int64_t SendQueue::pending() const {
  AnnotatedMutexLock lock(&mu_);
  return pending_;
}

int64_t SendQueue::queued_bytes() const {
  AnnotatedMutexLock lock(&mu_);
  return queued_bytes_;
}

}  // namespace pipetrain
