#include "worker/model/device_collective.h"

#include "absl/strings/str_cat.h"

namespace pipetrain {

absl::Status CheckDeviceCollectiveSpec(const DeviceCollectiveSpec& spec) {
  if (spec.members < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica device group of ", spec.members, " members: needs at least two"));
  }
  if (spec.rank < 0 || spec.rank >= spec.members) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica device group of ", spec.members, " members has no rank ", spec.rank));
  }
  if (spec.id.empty()) {
    return absl::InvalidArgumentError("replica device group without a communicator id");
  }
  return absl::OkStatus();
}

}  // namespace pipetrain
