// Injectable time source. Code that evaluates deadlines (leases, timeouts)
// takes a Clock* so that tests step time with FakeClock instead of sleeping.
//
//   FakeClock clock;
//   WorkerRegistry registry({.clock = &clock});
//   clock.Advance(absl::Seconds(6));  // every lease is now 6 s older
//
// Only the *evaluation* of time goes through a Clock: real waits (condition
// variables, AwaitWithTimeout) still run on real time.
#ifndef PIPETRAIN_COMMON_CLOCK_H_
#define PIPETRAIN_COMMON_CLOCK_H_

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"

namespace pipetrain {

class Clock {
 public:
  virtual ~Clock() = default;
  // The current time. Implementations are thread-safe.
  virtual absl::Time Now() const = 0;
};

// The system's wall clock (absl::Now()). Process-wide, never destroyed,
// thread-safe; the caller does not own it.
Clock* RealClock();

// A monotonic clock (std::chrono::steady_clock): its Now() is no date, only
// differences between its readings mean anything, and a step of the wall
// clock (NTP, an operator's date) does not move it. For judging how long
// ago something happened (leases). Process-wide, as RealClock().
Clock* MonotonicClock();

// A clock that moves only when told to. Thread-safe: one thread may Advance
// while others read Now. It keeps nanoseconds since the Unix epoch in one
// atomic, so times must lie within years 1678..2261 (absl::Time's infinities
// and instants outside that range are clamped by the conversion).
//
// Why an atomic and not a mutex: Debian's Abseil is built without
// ThreadSanitizer, so TSan cannot see absl::Mutex hand-offs; an atomic keeps
// every test that reads a FakeClock from several threads TSan-clean.
class FakeClock : public Clock {
 public:
  // Starts at a fixed instant (2023-11-14 22:13:20 UTC), so timestamps in
  // test output are reproducible.
  FakeClock();
  explicit FakeClock(absl::Time start);

  absl::Time Now() const override;
  // Moves time forward by `delta`. A negative delta moves it back; tests of
  // clock steps may need that, production clocks never do it.
  void Advance(absl::Duration delta);
  void Set(absl::Time now);

 private:
  std::atomic<int64_t> unix_nanos_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_CLOCK_H_
