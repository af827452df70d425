// A network link as bandwidth and latency, and the flag text that names one
// ("10Gbit,50us"). Workers emulate such a link (--emulate-link,
// worker/transport/shaped_transport.h); the coordinator plans over one
// (--network, coordinator/jobs/job_manager.h); both read it with
// ParseLinkModel, so the two flags take the same text.
//
// Thread-safe (a value type and a pure function).
#ifndef PIPETRAIN_COMMON_LINK_MODEL_H_
#define PIPETRAIN_COMMON_LINK_MODEL_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pipetrain {

struct LinkModel {
  double bandwidth_bytes_per_second = 1.25e9;  // 10 Gbit/s
  absl::Duration latency = absl::Microseconds(50);
};

// The fastest link ParseLinkModel takes, in bytes/s (80000 Gbit/s): DeviceInfo's
// bound (coordinator.proto), above which placement reads a worker's link as
// not emulated, so a faster --emulate-link would be paced but not planned over.
inline constexpr double kMaxLinkBandwidthBytesPerSecond = 1e13;

// "10Gbit,50us", "1Gbit,0.5ms", "125MB,1ms" (bandwidth per second: a number
// with Gbit or Mbit for bits, in any case, or GB or MB for bytes, with an
// upper-case B; in [8 kbit/s, kMaxLinkBandwidthBytesPerSecond]; latency: an
// absl duration in [0, 10s]). "Gb", "gb", "Mb", "mb" and the like are refused:
// they read as bits to some and bytes to others. Empty: nullopt (no link
// given). INVALID_ARGUMENT naming `flag` and the expected form otherwise.
absl::StatusOr<std::optional<LinkModel>> ParseLinkModel(const std::string& flag,
                                                        const std::string& text);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_LINK_MODEL_H_
