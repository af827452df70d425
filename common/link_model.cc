#include "common/link_model.h"

#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pipetrain {

absl::StatusOr<std::optional<LinkModel>> ParseLinkModel(const std::string& flag,
                                                        const std::string& text) {
  if (text.empty()) return std::optional<LinkModel>();
  auto invalid = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, " \"", text, "\": ", why, " (expected BANDWIDTH,LATENCY, e.g. 1Gbit,0.5ms)"));
  };
  const std::vector<std::string> parts = absl::StrSplit(text, ',');
  if (parts.size() != 2) return invalid("not two fields");
  const std::string bw(absl::StripAsciiWhitespace(parts[0]));
  const std::string lower = absl::AsciiStrToLower(bw);
  // Bits in any case; bytes only with an upper-case B. "Gb" is gigabits to
  // some and gigabytes to others, so anything else with a b is refused.
  const struct {
    const char* suffix;
    bool any_case;
    double bytes_per_unit;
  } units[] = {{"gbit", true, 1e9 / 8}, {"mbit", true, 1e6 / 8}, {"GB", false, 1e9},
               {"MB", false, 1e6}};
  LinkModel model;
  bool parsed = false;
  for (const auto& u : units) {
    if (absl::EndsWith(u.any_case ? lower : bw, u.suffix)) {
      double value = 0;
      if (!absl::SimpleAtod(bw.substr(0, bw.size() - std::strlen(u.suffix)), &value) ||
          !(value > 0)) {
        return invalid("bandwidth must be a positive number");
      }
      model.bandwidth_bytes_per_second = value * u.bytes_per_unit;
      // Slower, a message's emulated seconds leave absl::Duration's range.
      if (model.bandwidth_bytes_per_second < 1000) {
        return invalid("bandwidth must be at least 8 kbit/s (0.008Mbit)");
      }
      if (!(model.bandwidth_bytes_per_second <= kMaxLinkBandwidthBytesPerSecond)) {
        return invalid("bandwidth must be at most 1e13 bytes/s (80000Gbit or 10000GB)");
      }
      parsed = true;
      break;
    }
  }
  if (!parsed && (absl::EndsWith(lower, "gb") || absl::EndsWith(lower, "mb"))) {
    return invalid(
        "bandwidth unit is ambiguous: write 10Gbit for gigabits or 10GB for gigabytes "
        "(Mbit or MB likewise)");
  }
  if (!parsed) return invalid("bandwidth needs a unit: Gbit, Mbit, GB or MB (per second)");
  if (!absl::ParseDuration(std::string(absl::StripAsciiWhitespace(parts[1])), &model.latency) ||
      model.latency < absl::ZeroDuration() || model.latency > absl::Seconds(10)) {
    return invalid("latency must be a duration in [0, 10s], e.g. 50us");
  }
  return std::optional<LinkModel>(model);
}

}  // namespace pipetrain
