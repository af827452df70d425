#include "common/clock.h"

#include <chrono>

#include "absl/time/clock.h"

namespace pipetrain {
namespace {

class SystemClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

class SteadyClock : public Clock {
 public:
  absl::Time Now() const override {
    return absl::UnixEpoch() +
           absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
  }
};

}  // namespace

Clock* RealClock() {
  // Leaked on purpose: a function-local static pointer is initialised
  // thread-safely, and never destroying it keeps it usable from other
  // static destructors and detached threads at exit.
  static Clock* const clock = new SystemClock();
  return clock;
}

Clock* MonotonicClock() {
  static Clock* const clock = new SteadyClock();  // leaked, as RealClock's
  return clock;
}

FakeClock::FakeClock() : FakeClock(absl::FromUnixSeconds(1700000000)) {}

FakeClock::FakeClock(absl::Time start) : unix_nanos_(absl::ToUnixNanos(start)) {}

absl::Time FakeClock::Now() const { return absl::FromUnixNanos(unix_nanos_.load()); }

void FakeClock::Advance(absl::Duration delta) {
  unix_nanos_.fetch_add(absl::ToInt64Nanoseconds(delta));
}

void FakeClock::Set(absl::Time now) { unix_nanos_.store(absl::ToUnixNanos(now)); }

}  // namespace pipetrain
