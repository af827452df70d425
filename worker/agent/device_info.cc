#include "worker/agent/device_info.h"

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kernels/cpu/blas.h"
#include "worker/model/gemm_probe.h"

namespace pipetrain {

std::string CpuModelName() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown";
}

namespace {

// The first line of `path` as a non-negative integer; 0 when it is not one
// (cgroup v2 writes "max" for no limit); -1 when there is no such file.
int64_t ReadLimitFile(const std::string& path) {
  std::ifstream in(path);
  if (!in.is_open()) return -1;
  std::string line;
  int64_t value = 0;
  if (!std::getline(in, line) || !absl::SimpleAtoi(line, &value) || value <= 0) return 0;
  return value;
}

}  // namespace

int64_t CgroupMemoryLimit(const std::string& root, const std::string& self_cgroup) {
  // cgroup v2: "0::/some/path"; v1 memory controller: "N:memory:/path".
  std::ifstream in(self_cgroup);
  std::string line;
  while (std::getline(in, line)) {
    const std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    // The file of the process's own cgroup; where that path is not under
    // `root`, the file at the top of the mount. Why: a container that does
    // not have its own cgroup namespace (cgroup v1 nodes, so Kubernetes on
    // them) reads its host's path in /proc/self/cgroup while the mount
    // shows its own cgroup at the top.
    const auto own_or_top = [&](const std::string& own, const std::string& top) {
      const int64_t value = ReadLimitFile(own);
      return value >= 0 ? value : ReadLimitFile(top);
    };
    if (parts[0] == "0" && parts[1].empty()) {
      const int64_t v2 = own_or_top(root + parts[2] + "/memory.max", root + "/memory.max");
      if (v2 > 0) return v2;
    }
    if (absl::StrContains(parts[1], "memory")) {
      // v1 reports "no limit" as a huge page-rounded number.
      const int64_t v1 = own_or_top(root + "/memory" + parts[2] + "/memory.limit_in_bytes",
                                    root + "/memory/memory.limit_in_bytes");
      if (v1 > 0 && v1 < (int64_t{1} << 60)) return v1;
    }
  }
  return 0;
}

int64_t EffectiveMemoryLimit(int64_t physical, int64_t cgroup_limit, int64_t flag_limit) {
  int64_t limit = physical;
  for (int64_t other : {cgroup_limit, flag_limit}) {
    if (other > 0 && (limit <= 0 || other < limit)) limit = other;
  }
  return limit;
}

absl::StatusOr<int64_t> ReservedMemoryLimit(int64_t limit, int64_t reserve) {
  if (reserve < 0 || reserve >= limit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--memory-reserve of ", reserve, " bytes leaves nothing of the memory limit (", limit,
        " bytes: --memory-limit, or the least of physical memory and the "
        "cgroup's limit) for the jobs"));
  }
  return limit - reserve;
}

int64_t PhysicalMemoryBytes() { return int64_t{sysconf(_SC_PHYS_PAGES)} * sysconf(_SC_PAGE_SIZE); }

int64_t ProcessMemoryLimit() {
  return EffectiveMemoryLimit(PhysicalMemoryBytes(), CgroupMemoryLimit(), 0);
}

namespace {

std::atomic<int64_t> reported_mailbox_limit{0};

}  // namespace

void SetReportedMailboxLimit(int64_t bytes) { reported_mailbox_limit.store(bytes); }

v1::DeviceInfo CollectDeviceInfo(Backend* backend) {
  v1::DeviceInfo info;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) info.set_hostname(host);
  info.set_cpu_model(CpuModelName());
  info.set_cpu_cores(static_cast<int32_t>(sysconf(_SC_NPROCESSORS_ONLN)));
  info.set_memory_bytes(PhysicalMemoryBytes());
  info.set_memory_limit_bytes(ProcessMemoryLimit());
  info.set_backend(backend->Describe());
  const DeviceFacts facts = backend->device_facts();
  info.set_gpu_model(facts.name);
  info.set_gpu_memory_bytes(facts.memory_bytes);
  info.set_gpu_sm_count(facts.sm_count);
  info.set_gpu_pci_bus_id(facts.pci_bus_id);
  const bool gpu = backend->kind() != BackendKind::kCpu;
  if (!gpu) info.set_compute_threads(BlasThreads());
  info.set_measured_gflops(MeasureGemmGflops(backend, gpu ? 4096 : 384, 3));
  info.set_mailbox_limit_bytes(reported_mailbox_limit.load());
  return info;
}

}  // namespace pipetrain
