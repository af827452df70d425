#include "coordinator/registry/registration_limits.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/host_port.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

absl::Status CheckLength(absl::string_view field, const std::string& value, size_t limit) {
  if (value.size() <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", value.size(), " bytes exceeds the limit of ", limit));
}

absl::Status CheckRange(absl::string_view field, double value, double limit) {
  if (value >= 0 && value <= limit) return absl::OkStatus();  // false for NaN
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", value, " is outside [0, ", limit, "]"));
}

// 0 (not measured) or within [min, limit]: a tiny positive rate passes a
// `> 0` test and then divides into infinite times in the planner.
absl::Status CheckRate(absl::string_view field, double value, double min, double limit) {
  if (value == 0 || (value >= min && value <= limit)) return absl::OkStatus();  // false for NaN
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": ", value, " is neither 0 (not measured) nor in [", min, ", ", limit, "]"));
}

absl::Status CheckDevice(const v1::DeviceInfo& d) {
  constexpr absl::string_view kDevice = "RegisterWorkerRequest.device.";
  RETURN_IF_ERROR(CheckLength(absl::StrCat(kDevice, "hostname"), d.hostname(), kMaxNameBytes));
  RETURN_IF_ERROR(
      CheckLength(absl::StrCat(kDevice, "cpu_model"), d.cpu_model(), kMaxDescriptionBytes));
  RETURN_IF_ERROR(
      CheckLength(absl::StrCat(kDevice, "gpu_model"), d.gpu_model(), kMaxDescriptionBytes));
  RETURN_IF_ERROR(CheckLength(absl::StrCat(kDevice, "backend"), d.backend(), kMaxDescriptionBytes));
  RETURN_IF_ERROR(
      CheckLength(absl::StrCat(kDevice, "gpu_pci_bus_id"), d.gpu_pci_bus_id(), kMaxPciBusIdBytes));
  RETURN_IF_ERROR(
      CheckLength(absl::StrCat(kDevice, "nccl_unique_id"), d.nccl_unique_id(), kMaxNcclIdBytes));
  RETURN_IF_ERROR(CheckRange(absl::StrCat(kDevice, "cpu_cores"), d.cpu_cores(), kMaxCpuCores));
  RETURN_IF_ERROR(
      CheckRange(absl::StrCat(kDevice, "compute_threads"), d.compute_threads(), kMaxCpuCores));
  RETURN_IF_ERROR(
      CheckRange(absl::StrCat(kDevice, "gpu_sm_count"), d.gpu_sm_count(), kMaxCpuCores));
  RETURN_IF_ERROR(CheckRange(absl::StrCat(kDevice, "gpu_index"), d.gpu_index(), kMaxCpuCores));
  RETURN_IF_ERROR(
      CheckRange(absl::StrCat(kDevice, "memory_bytes"), d.memory_bytes(), kMaxMemoryBytes));
  RETURN_IF_ERROR(CheckRange(absl::StrCat(kDevice, "memory_limit_bytes"), d.memory_limit_bytes(),
                             kMaxMemoryBytes));
  RETURN_IF_ERROR(
      CheckRange(absl::StrCat(kDevice, "gpu_memory_bytes"), d.gpu_memory_bytes(), kMaxMemoryBytes));
  RETURN_IF_ERROR(CheckRange(absl::StrCat(kDevice, "memory_reserve_bytes"),
                             d.memory_reserve_bytes(), kMaxMemoryBytes));
  RETURN_IF_ERROR(CheckRange(absl::StrCat(kDevice, "mailbox_limit_bytes"),
                             d.mailbox_limit_bytes(), kMaxMemoryBytes));
  RETURN_IF_ERROR(CheckRange(absl::StrCat(kDevice, "data_plane_overhead_seconds"),
                             d.data_plane_overhead_seconds(), kMaxDataPlaneOverheadSeconds));
  RETURN_IF_ERROR(CheckRate(absl::StrCat(kDevice, "data_plane_bytes_per_second"),
                            d.data_plane_bytes_per_second(), kMinDataPlaneBytesPerSecond,
                            kMaxDataPlaneBytesPerSecond));
  return CheckRate(absl::StrCat(kDevice, "measured_gflops"), d.measured_gflops(), kMinGflops,
                   kMaxGflops);
}

}  // namespace

absl::Status CheckMetricsAddress(const std::string& address) {
  if (address.empty()) return absl::OkStatus();
  // The port and the brackets as every listen flag is parsed (SplitHostPort:
  // a decimal port of at most 65535; a host with ':' only in brackets);
  // then the host's characters.
  const absl::StatusOr<HostPort> split = SplitHostPort(address, "metrics_address");
  bool valid = split.ok();
  const absl::string_view host = valid ? absl::string_view(split->host) : "";
  if (valid && address.front() == '[') {  // an IPv6 address, a zone after '%'
    const size_t zone = std::min(host.find('%'), host.size());
    valid = host.substr(0, zone).find(':') != absl::string_view::npos;
    for (size_t i = 0; valid && i < host.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(host[i]);
      valid = i < zone ? absl::ascii_isxdigit(c) || c == ':' || c == '.'
                       : i == zone || absl::ascii_isalnum(c) || c == '.' || c == '-' || c == '_';
    }
  } else {
    for (size_t i = 0; valid && i < host.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(host[i]);
      valid = absl::ascii_isalnum(c) || c == '.' || c == '-' || c == '_';
    }
  }
  if (valid) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "RegisterWorkerRequest.metrics_address: not host:port (letters, digits, '.', '-', '_', "
      "or an IPv6 address in brackets, then ':' and a decimal port), nor empty");
}

absl::Status CheckRegistrationBounds(const v1::RegisterWorkerRequest& r) {
  RETURN_IF_ERROR(
      CheckLength("RegisterWorkerRequest.data_address", r.data_address(), kMaxAddressBytes));
  RETURN_IF_ERROR(
      CheckLength("RegisterWorkerRequest.metrics_address", r.metrics_address(), kMaxAddressBytes));
  RETURN_IF_ERROR(CheckMetricsAddress(r.metrics_address()));
  RETURN_IF_ERROR(CheckLength("RegisterWorkerRequest.node_name", r.node_name(), kMaxNameBytes));
  RETURN_IF_ERROR(CheckLength("RegisterWorkerRequest.registration_id", r.registration_id(),
                              kMaxRegistrationIdBytes));
  RETURN_IF_ERROR(
      CheckLength("RegisterWorkerRequest.build.version", r.build().version(), kMaxBuildFieldBytes));
  RETURN_IF_ERROR(
      CheckLength("RegisterWorkerRequest.build.commit", r.build().commit(), kMaxBuildFieldBytes));
  return CheckDevice(r.device());
}

absl::Status CheckHeartbeatBounds(const v1::HeartbeatRequest& r) {
  RETURN_IF_ERROR(CheckLength("HeartbeatRequest.current_instruction", r.current_instruction(),
                              kMaxDescriptionBytes));
  RETURN_IF_ERROR(
      CheckLength("HeartbeatRequest.nccl_unique_id", r.nccl_unique_id(), kMaxNcclIdBytes));
  return CheckLength("HeartbeatRequest.last_job_id", r.last_job_id(), kMaxDescriptionBytes);
}

}  // namespace pipetrain
