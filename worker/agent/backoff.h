// Exponential backoff with jitter for reconnects (STYLE.md item 8).
// Delay n is min(max, initial * multiplier^n) scaled by a factor drawn
// uniformly from [1 - jitter, 1]: "equal jitter" keeps a floor so retries
// from many workers spread out without hammering the coordinator.
// Deterministic for a seed (Philox), so tests can check exact delays.
// Not thread-safe (RandomBackoffSeed is).
#ifndef PIPETRAIN_WORKER_AGENT_BACKOFF_H_
#define PIPETRAIN_WORKER_AGENT_BACKOFF_H_

#include <cstdint>

#include "absl/time/time.h"

namespace pipetrain {

// A seed no other call (in this process or another) is likely to return:
// from std::random_device, mixed with the process id, the clock and a
// counter (which alone keep seeds apart should the device fail).
uint64_t RandomBackoffSeed();

// The factor that scales Backoff's delay number `draw` for `seed`: uniform
// in [1 - jitter, 1], a function of its arguments only. For code that
// computes its delays another way but must spread them as Backoff does
// (the start barrier's polls, job_runner.h). Thread-safe.
double BackoffJitterFactor(uint64_t seed, uint32_t draw, double jitter);

struct BackoffOptions {
  absl::Duration initial = absl::Milliseconds(100);
  absl::Duration max = absl::Seconds(5);
  double multiplier = 2.0;
  double jitter = 0.5;  // in [0, 1]
  // The jitter's seed: a fresh one per options by default, so that workers
  // that lost the coordinator together (it restarted) do not retry in
  // lockstep, as they would with one fixed seed. Tests that check exact
  // delays set it.
  uint64_t seed = RandomBackoffSeed();
};

class Backoff {
 public:
  explicit Backoff(const BackoffOptions& options) : options_(options) {}
  absl::Duration Next();       // the delay before the next attempt
  void Reset() { attempt_ = 0; }
  int attempts() const { return attempt_; }

 private:
  BackoffOptions options_;
  int attempt_ = 0;
  uint32_t draws_ = 0;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_AGENT_BACKOFF_H_
