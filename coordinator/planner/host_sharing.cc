#include "coordinator/planner/host_sharing.h"

#include <map>

#include "absl/strings/str_format.h"

namespace pipetrain {

ComputeStretch LockstepComputeStretch(const ClusterSpec& cluster, int replicas, int stages,
                                      int tensor) {
  ComputeStretch worst;
  if (replicas < 1 || stages < 1 || tensor < 1 ||
      cluster.workers.size() != static_cast<size_t>(replicas) * stages * tensor) {
    return worst;
  }
  for (int s = 0; s < stages; ++s) {
    std::map<std::string, int> threads;  // position s's compute threads per host
    std::map<std::string, int> cores;
    for (int r = 0; r < replicas; ++r) {
      for (int t = 0; t < tensor; ++t) {
        const WorkerSpec& w = cluster.workers[(static_cast<size_t>(r) * stages + s) * tensor + t];
        if (w.host_cores <= 0 || w.compute_threads <= 0) continue;
        threads[w.host] += w.compute_threads;
        cores[w.host] = w.host_cores;
      }
    }
    for (const auto& [host, n] : threads) {
      const double factor = static_cast<double>(n) / cores[host];
      if (factor > worst.factor) worst = {factor, host, n, cores[host]};
    }
  }
  return worst;
}

ModelProfile StretchCompute(const ModelProfile& profile, double factor) {
  ModelProfile out = profile;
  for (UnitProfile& u : out.units) {
    u.fwd_seconds *= factor;
    u.bwd_seconds *= factor;
    for (auto& [count, seconds] : u.partition_seconds) {
      seconds.first *= factor;
      seconds.second *= factor;
    }
  }
  return out;
}

std::string DescribeComputeStretch(const ComputeStretch& stretch) {
  if (stretch.factor <= 1) return "";
  return absl::StrFormat("; compute x%.2f: %d lockstep compute threads share the %d cores of %s",
                         stretch.factor, stretch.threads, stretch.cores, stretch.host);
}

}  // namespace pipetrain
