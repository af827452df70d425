// Bounds on what a worker may send the coordinator about itself
// (RegisterWorker, Heartbeat), checked before anything is stored: the
// registry keeps these strings for the life of the entry and ListWorkers
// returns them, so unbounded strings would let one client make every later
// ListWorkers response exceed the gRPC message limit. docs/operations.md "Bounds"
// lists them. Thread-safe (pure functions).
#ifndef PIPETRAIN_COORDINATOR_REGISTRY_REGISTRATION_LIMITS_H_
#define PIPETRAIN_COORDINATOR_REGISTRY_REGISTRATION_LIMITS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "proto/pipetrain/v1/coordinator.pb.h"

namespace pipetrain {

// Addresses ("host:port", "[v6]:port") and names (a Kubernetes node name is
// at most 253 bytes).
inline constexpr size_t kMaxAddressBytes = 256;
inline constexpr size_t kMaxNameBytes = 253;
// Free text a worker reports (CPU and GPU model, backend description, its
// current instruction).
inline constexpr size_t kMaxDescriptionBytes = 256;
// "0000:3B:00.0" and its longer domain forms.
inline constexpr size_t kMaxPciBusIdBytes = 32;
// NCCL_UNIQUE_ID_BYTES.
inline constexpr size_t kMaxNcclIdBytes = 128;
// RegisterWorkerRequest.registration_id (a worker sends 32 hex digits).
inline constexpr size_t kMaxRegistrationIdBytes = 64;
// Each field of RegisterWorkerRequest.build ("0.1.0", a 12-digit commit).
inline constexpr size_t kMaxBuildFieldBytes = 64;
// Sanity ranges of device facts, far beyond any machine.
inline constexpr int64_t kMaxCpuCores = 1 << 16;
inline constexpr int64_t kMaxMemoryBytes = int64_t{1} << 50;  // 1 PiB
// Measured rates are 0 (not measured) or within [min, max]: the planner
// divides by them.
inline constexpr double kMinGflops = 1e-3;
inline constexpr double kMaxGflops = 1e9;
// The data plane's measured cost per message (DeviceInfo.data_plane_*).
inline constexpr double kMaxDataPlaneOverheadSeconds = 1;
inline constexpr double kMinDataPlaneBytesPerSecond = 1e3;
inline constexpr double kMaxDataPlaneBytesPerSecond = 1e13;

// INVALID_ARGUMENT naming the field ("RegisterWorkerRequest.device.cpu_model:
// 300 bytes exceeds the limit of 256") for any field out of bounds. The
// join token and data_address presence are the registry's checks.
absl::Status CheckRegistrationBounds(const v1::RegisterWorkerRequest& request);

// The same for a heartbeat's current_instruction and nccl_unique_id.
absl::Status CheckHeartbeatBounds(const v1::HeartbeatRequest& request);

// Empty, or host:port as a worker's --metrics-address gives it: a host of
// letters, digits, '.', '-' and '_', or an IPv6 address in brackets (hex
// digits, ':' and '.', a zone after '%'), then ':' and a decimal port of
// at most 65535 (SplitHostPort, as the worker's own flag is parsed). The
// coordinator exports it as a label on its open /metrics
// (pipetrain_worker_info), which dashboards use in a regular expression.
// INVALID_ARGUMENT naming RegisterWorkerRequest.metrics_address otherwise
// (CheckRegistrationBounds calls it).
absl::Status CheckMetricsAddress(const std::string& address);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_REGISTRY_REGISTRATION_LIMITS_H_
