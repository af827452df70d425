#include "worker/agent/device_info.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "common/tensor.h"

namespace pipetrain {
namespace {

std::string CpuModel() {
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

// The best of three timed n x n x n GEMMs on `backend` after a warm-up.
double MeasureGflops(Backend* backend, int n) {
  const Tensor a = backend->Upload(Tensor::FromVector({n, n}, std::vector<float>(n * n, 0.5f)));
  const Tensor b = backend->Upload(Tensor::FromVector({n, n}, std::vector<float>(n * n, 0.25f)));
  Tensor c = backend->Zeros({n, n});
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    backend->Sgemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    backend->Synchronize();
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    if (rep > 0) best = std::min(best, dt.count());  // rep 0 warms up
  }
  if (!backend->status().ok()) return 0;
  return 2.0 * n * n * n / best / 1e9;
}

}  // namespace

v1::DeviceInfo CollectDeviceInfo(Backend* backend) {
  v1::DeviceInfo info;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) info.set_hostname(host);
  info.set_cpu_model(CpuModel());
  info.set_cpu_cores(static_cast<int32_t>(sysconf(_SC_NPROCESSORS_ONLN)));
  info.set_memory_bytes(int64_t{sysconf(_SC_PHYS_PAGES)} * sysconf(_SC_PAGE_SIZE));
  info.set_backend(backend->Describe());
  const DeviceFacts facts = backend->device_facts();
  info.set_gpu_model(facts.name);
  info.set_gpu_memory_bytes(facts.memory_bytes);
  info.set_gpu_sm_count(facts.sm_count);
  const bool gpu = backend->kind() != BackendKind::kCpu;
  info.set_measured_gflops(MeasureGflops(backend, gpu ? 4096 : 384));
  return info;
}

}  // namespace pipetrain
