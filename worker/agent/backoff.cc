#include "worker/agent/backoff.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <random>

#include "absl/time/clock.h"
#include "common/philox.h"

namespace pipetrain {

uint64_t RandomBackoffSeed() {
  static std::atomic<uint64_t> calls{0};
  uint64_t seed = (static_cast<uint64_t>(getpid()) << 32) ^
                  static_cast<uint64_t>(absl::GetCurrentTimeNanos()) ^
                  (calls.fetch_add(1) + 1) * 0x9E3779B97F4A7C15ull;
  try {
    std::random_device device;  // the kernel's entropy
    seed ^= (static_cast<uint64_t>(device()) << 32) | device();
  } catch (const std::exception&) {
    // No entropy source: the mix above still differs per process and call.
  }
  return seed;
}

double BackoffJitterFactor(uint64_t seed, uint32_t draw, double jitter) {
  const double u = UniformIndex(seed, draw, 0xB0FF, 0, 1u << 24) / double(1u << 24);
  return 1.0 - jitter * u;
}

absl::Duration Backoff::Next() {
  const double base = absl::ToDoubleSeconds(options_.initial) *
                      std::pow(options_.multiplier, std::min(attempt_, 62));
  const double capped = std::min(base, absl::ToDoubleSeconds(options_.max));
  ++attempt_;
  return absl::Seconds(capped * BackoffJitterFactor(options_.seed, draws_++, options_.jitter));
}

}  // namespace pipetrain
