// What a worker tells the coordinator about its machine at registration.
#ifndef PIPETRAIN_WORKER_AGENT_DEVICE_INFO_H_
#define PIPETRAIN_WORKER_AGENT_DEVICE_INFO_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "proto/pipetrain/v1/coordinator.pb.h"
#include "worker/model/backend.h"
#include "worker/model/cpu_backend.h"

namespace pipetrain {

// Hostname, CPU model (/proc/cpuinfo), online cores, physical memory, the
// backend the worker computes on and, for a GPU, its name, memory and SM
// count; GEMM GFLOP/s measured on that backend (a short sgemm: n = 384
// on the CPU, ~0.1 s; n = 4096 on a GPU); and the mailbox limit
// SetReportedMailboxLimit set (0 when it was not).
v1::DeviceInfo CollectDeviceInfo(Backend* backend = CpuBackend());

// The --mailbox-limit this process's mailbox refuses larger tensors above,
// for CollectDeviceInfo to report (DeviceInfo.mailbox_limit_bytes: the
// coordinator plans no larger tensor), as it reports the BLAS threads
// SetBlasThreads set: the worker sets it at start, before its agent
// collects the facts. Process-wide; thread-safe.
void SetReportedMailboxLimit(int64_t bytes);

// The CPU's model name from /proc/cpuinfo ("unknown" if absent).
std::string CpuModelName();

// The memory limit of this process's cgroup: cgroup v2's memory.max (of the
// process's own cgroup, from /proc/self/cgroup) or v1's
// memory.limit_in_bytes; 0 when there is none ("max", an absurd v1 value,
// or unreadable). Where the process's cgroup path has no such file under
// `root` (a container without its own cgroup namespace, which reads its
// host's path), the one at the top of the mount: the container's own.
// `root` is the cgroup mount (a test's fake tree).
int64_t CgroupMemoryLimit(const std::string& root = "/sys/fs/cgroup",
                          const std::string& self_cgroup = "/proc/self/cgroup");

// What DeviceInfo.memory_limit_bytes reports: the least of physical memory,
// `cgroup_limit` and `flag_limit`, ignoring zeros (none).
int64_t EffectiveMemoryLimit(int64_t physical, int64_t cgroup_limit, int64_t flag_limit);

// This host's physical memory (DeviceInfo.memory_bytes).
int64_t PhysicalMemoryBytes();

// What this process may use without a flag of its own: the least of
// physical memory and its cgroup's limit (EffectiveMemoryLimit).
int64_t ProcessMemoryLimit();

// What is left of a worker's memory `limit` (bytes) once `reserve`
// (--memory-reserve) is kept for what the plans do not count (received
// tensors up to --mailbox-limit, the corpus, the allocator's own): limit -
// reserve; the worker checks at start that some is. (The coordinator takes
// the reserve off the worker's own limit or its share of the host's RAM:
// memory_budget.h.) INVALID_ARGUMENT when `reserve` is negative or leaves
// nothing.
absl::StatusOr<int64_t> ReservedMemoryLimit(int64_t limit, int64_t reserve);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_AGENT_DEVICE_INFO_H_
