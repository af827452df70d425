#include "worker/agent/device_info.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/cpu/blas.h"

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

double MeasureGflops() {
  constexpr int n = 384;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    Sgemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    if (rep > 0) best = std::min(best, dt.count());  // rep 0 warms up
  }
  return 2.0 * n * n * n / best / 1e9;
}

}  // namespace

v1::DeviceInfo CollectDeviceInfo() {
  v1::DeviceInfo info;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) info.set_hostname(host);
  info.set_cpu_model(CpuModel());
  info.set_cpu_cores(static_cast<int32_t>(sysconf(_SC_NPROCESSORS_ONLN)));
  info.set_memory_bytes(int64_t{sysconf(_SC_PHYS_PAGES)} * sysconf(_SC_PAGE_SIZE));
  info.set_measured_gflops(MeasureGflops());
  return info;
}

}  // namespace pipetrain
