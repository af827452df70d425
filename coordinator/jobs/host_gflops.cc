#include "coordinator/jobs/host_gflops.h"

#include <algorithm>

namespace pipetrain {

double HostGflops(const std::vector<v1::Worker>& workers, const v1::Worker& w) {
  const v1::DeviceInfo& mine = w.device();
  double best = mine.measured_gflops();
  if (!mine.gpu_model().empty() || mine.hostname().empty()) return best;
  for (const v1::Worker& other : workers) {
    const v1::DeviceInfo& theirs = other.device();
    if (theirs.hostname() == mine.hostname() && theirs.gpu_model().empty() &&
        theirs.compute_threads() == mine.compute_threads()) {
      best = std::max(best, theirs.measured_gflops());
    }
  }
  return best;
}

}  // namespace pipetrain
