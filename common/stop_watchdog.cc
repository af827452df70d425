#include "common/stop_watchdog.h"

#include <utility>

namespace pipetrain {

StopWatchdog::StopWatchdog(absl::Duration limit, std::function<void()> on_timeout) {
  thread_ = std::thread([this, limit, on_timeout = std::move(on_timeout)] {
    bool done;
    {
      AnnotatedMutexLock lock(&mu_);
      done = mu_.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; },
                                  limit);
    }
    if (!done) on_timeout();
  });
}

StopWatchdog::~StopWatchdog() {
  Done();
  thread_.join();
}

void StopWatchdog::Done() {
  AnnotatedMutexLock lock(&mu_);
  done_ = true;
}

}  // namespace pipetrain
