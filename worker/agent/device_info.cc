#include "worker/agent/device_info.h"

#include <unistd.h>

#include <fstream>
#include <string>

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

v1::DeviceInfo CollectDeviceInfo(Backend* backend) {
  v1::DeviceInfo info;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) info.set_hostname(host);
  info.set_cpu_model(CpuModelName());
  info.set_cpu_cores(static_cast<int32_t>(sysconf(_SC_NPROCESSORS_ONLN)));
  info.set_memory_bytes(int64_t{sysconf(_SC_PHYS_PAGES)} * sysconf(_SC_PAGE_SIZE));
  info.set_backend(backend->Describe());
  const DeviceFacts facts = backend->device_facts();
  info.set_gpu_model(facts.name);
  info.set_gpu_memory_bytes(facts.memory_bytes);
  info.set_gpu_sm_count(facts.sm_count);
  info.set_gpu_pci_bus_id(facts.pci_bus_id);
  const bool gpu = backend->kind() != BackendKind::kCpu;
  info.set_measured_gflops(MeasureGemmGflops(backend, gpu ? 4096 : 384, 3));
  return info;
}

}  // namespace pipetrain
