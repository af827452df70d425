// LogRateLimiter: lets at most `burst` messages of one kind through per
// `period`, and counts the rest, so that what peers or clients can trigger
// at will (a refused stream, a rejected frame) cannot flood a log.
//
//   LogRateLimiter refusals(10, absl::Seconds(10));
//   if (int64_t dropped = 0; refusals.Allow(&dropped)) {
//     PT_LOG(WARNING) << "refused ..." << LogRateLimiter::Dropped(dropped);
//   }
//
// Thread-safe.
#ifndef PIPETRAIN_COMMON_LOG_RATE_LIMITER_H_
#define PIPETRAIN_COMMON_LOG_RATE_LIMITER_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/annotated_mutex.h"
#include "common/clock.h"

namespace pipetrain {

class LogRateLimiter {
 public:
  // `clock` (not owned) defaults to the monotonic one: a wall clock stepped
  // back an hour would drop all but the burst for that hour. A clock that
  // goes back all the same starts a new window. Requires burst >= 1.
  LogRateLimiter(int burst, absl::Duration period, Clock* clock = MonotonicClock());

  // Whether to log this message. When it is allowed, *dropped (may be
  // null) gets how many were not since the last allowed one.
  bool Allow(int64_t* dropped);

  // "" for 0, else " (N similar messages not logged)".
  static std::string Dropped(int64_t dropped);

 private:
  const int burst_;
  const absl::Duration period_;
  Clock* const clock_;
  AnnotatedMutex mu_;
  absl::Time window_start_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int allowed_in_window_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_LOG_RATE_LIMITER_H_
