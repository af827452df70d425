#include "common/log_rate_limiter.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace pipetrain {

LogRateLimiter::LogRateLimiter(int burst, absl::Duration period, Clock* clock)
    : burst_(burst), period_(period), clock_(clock) {
  PT_CHECK(burst >= 1) << "LogRateLimiter needs a burst of at least 1";
}

bool LogRateLimiter::Allow(int64_t* dropped) {
  AnnotatedMutexLock lock(&mu_);
  // Read in lock order: a reading taken before another caller's opened the
  // window would look like a clock step back and open another.
  const absl::Time now = clock_->Now();
  if (now - window_start_ >= period_ || now < window_start_) {
    window_start_ = now;
    allowed_in_window_ = 0;
  }
  if (allowed_in_window_ >= burst_) {
    ++dropped_;
    return false;
  }
  ++allowed_in_window_;
  if (dropped != nullptr) *dropped = dropped_;
  dropped_ = 0;
  return true;
}

std::string LogRateLimiter::Dropped(int64_t dropped) {
  if (dropped == 0) return "";
  return absl::StrCat(" (", dropped, " similar messages not logged)");
}

}  // namespace pipetrain
