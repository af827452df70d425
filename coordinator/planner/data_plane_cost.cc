#include "coordinator/planner/data_plane_cost.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace pipetrain {

void AddDataPlaneCost(double stretch, ClusterSpec* cluster) {
  PT_CHECK(stretch >= 1) << "stretch=" << stretch;
  const double o = cluster->data_plane_overhead_seconds;
  const double rate = cluster->data_plane_bytes_per_second;
  if (!(o > 0) || !(rate > 0)) return;
  cluster->latency_seconds += stretch * o;
  cluster->per_message_seconds += stretch * o;
  const double stretched_rate = rate / stretch;
  const double w = cluster->bandwidth_bytes_per_second;
  if (!(w > 0)) {
    cluster->bandwidth_bytes_per_second = stretched_rate;
  } else if (cluster->links_emulated) {
    cluster->bandwidth_bytes_per_second = 1 / (1 / w + 1 / stretched_rate);
  } else {
    cluster->bandwidth_bytes_per_second = std::min(w, stretched_rate);
  }
}

std::string DescribeDataPlaneCost(const ClusterSpec& cluster, double stretch) {
  if (!(cluster.data_plane_overhead_seconds > 0) || !(cluster.data_plane_bytes_per_second > 0)) {
    return "";
  }
  return absl::StrFormat(
      "; data plane %.3g ms + %.3g GB/s per message%s", cluster.data_plane_overhead_seconds * 1e3,
      cluster.data_plane_bytes_per_second / 1e9,
      stretch > 1.005 ? absl::StrFormat(" (x%.2f on shared cores)", stretch) : std::string());
}

}  // namespace pipetrain
