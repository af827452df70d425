// StopWatchdog: bounds how long a shutdown step may take. Constructed
// before the step, it calls `on_timeout` (on its own thread) unless Done()
// comes within `limit`; the worker's on_timeout logs and _Exits, so a stage
// stuck in a long computation or a send to a stalled peer cannot keep a
// signalled process alive past its grace period.
//
// Thread-safety: Done() from any one thread; the destructor calls Done()
// and joins. on_timeout must not call back into the watchdog.
#ifndef PIPETRAIN_COMMON_STOP_WATCHDOG_H_
#define PIPETRAIN_COMMON_STOP_WATCHDOG_H_

#include <functional>
#include <thread>

#include "absl/time/time.h"
#include "common/annotated_mutex.h"

namespace pipetrain {

class StopWatchdog {
 public:
  StopWatchdog(absl::Duration limit, std::function<void()> on_timeout);
  ~StopWatchdog();  // Done(), then joins
  StopWatchdog(const StopWatchdog&) = delete;
  StopWatchdog& operator=(const StopWatchdog&) = delete;

  // The step ended: on_timeout will not be called if it has not been.
  void Done();

 private:
  AnnotatedMutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_STOP_WATCHDOG_H_
