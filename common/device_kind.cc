#include "common/device_kind.h"

#include "absl/strings/str_cat.h"

namespace pipetrain {

std::string DeviceKind(const v1::DeviceInfo& device) {
  if (!device.gpu_model().empty()) return absl::StrCat("cuda:", device.gpu_model());
  return absl::StrCat("cpu:", device.cpu_model());
}

}  // namespace pipetrain
