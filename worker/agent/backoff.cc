#include "worker/agent/backoff.h"

#include <algorithm>
#include <cmath>

#include "common/philox.h"

namespace pipetrain {

absl::Duration Backoff::Next() {
  const double base = absl::ToDoubleSeconds(options_.initial) *
                      std::pow(options_.multiplier, std::min(attempt_, 62));
  const double capped = std::min(base, absl::ToDoubleSeconds(options_.max));
  ++attempt_;
  const double u = UniformIndex(options_.seed, draws_++, 0xB0FF, 0, 1u << 24) / double(1u << 24);
  return absl::Seconds(capped * (1.0 - options_.jitter * u));
}

}  // namespace pipetrain
