#include "coordinator/planner/host_sharing.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"

namespace pipetrain {

namespace {

// Position s's compute threads per host (hosts with known cores only).
std::vector<std::map<std::string, int>> ThreadsByPosition(const ClusterSpec& cluster, int replicas,
                                                          int stages, int tensor,
                                                          std::map<std::string, int>* cores) {
  std::vector<std::map<std::string, int>> threads(stages);
  for (int s = 0; s < stages; ++s) {
    for (int r = 0; r < replicas; ++r) {
      for (int t = 0; t < tensor; ++t) {
        const WorkerSpec& w = cluster.workers[(static_cast<size_t>(r) * stages + s) * tensor + t];
        if (w.host_cores <= 0 || w.compute_threads <= 0) continue;
        threads[s][w.host] += w.compute_threads;
        (*cores)[w.host] = w.host_cores;
      }
    }
  }
  return threads;
}

bool IsCompute(TimelineEventKind kind) {
  return kind == TimelineEventKind::kForward || kind == TimelineEventKind::kBackward ||
         kind == TimelineEventKind::kRecompute || kind == TimelineEventKind::kOptimizer ||
         kind == TimelineEventKind::kAllReduceCpu;
}

// Seconds that two sorted lists of disjoint intervals overlap.
double Overlap(const std::vector<std::pair<double, double>>& a,
               const std::vector<std::pair<double, double>>& b) {
  double total = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const double lo = std::max(a[i].first, b[j].first);
    const double hi = std::min(a[i].second, b[j].second);
    if (hi > lo) total += hi - lo;
    if (a[i].second < b[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return total;
}

// Whether `cluster` holds one worker per (replica, stage position, rank).
bool Shaped(const ClusterSpec& cluster, int replicas, int stages, int tensor) {
  return replicas >= 1 && stages >= 1 && tensor >= 1 &&
         cluster.workers.size() == static_cast<size_t>(replicas) * stages * tensor;
}

}  // namespace

ComputeStretch LockstepComputeStretch(const ClusterSpec& cluster, int replicas, int stages,
                                      int tensor) {
  ComputeStretch worst;
  if (!Shaped(cluster, replicas, stages, tensor)) return worst;
  std::map<std::string, int> cores;
  for (const auto& by_host : ThreadsByPosition(cluster, replicas, stages, tensor, &cores)) {
    for (const auto& [host, n] : by_host) {
      const double factor = static_cast<double>(n) / cores[host];
      if (factor > worst.factor) worst = {factor, host, n, cores[host]};
    }
  }
  return worst;
}

absl::StatusOr<SimulationResult> SimulateWithSharedCores(const std::vector<v1::Program>& programs,
                                                         SimulationCosts costs,
                                                         const ClusterSpec& cluster, int replicas,
                                                         int stages, int tensor, double lockstep,
                                                         double compute_share,
                                                         double* largest_extra) {
  const double c = std::clamp(compute_share, 1e-6, 1.0);
  if (largest_extra != nullptr) *largest_extra = 1;
  absl::StatusOr<SimulationResult> result = SimulateIteration(programs, costs);
  if (!result.ok() || stages != static_cast<int>(programs.size()) ||
      !Shaped(cluster, replicas, stages, tensor)) {
    return result;
  }
  std::map<std::string, int> cores;
  const std::vector<std::map<std::string, int>> threads =
      ThreadsByPosition(cluster, replicas, stages, tensor, &cores);
  // Only hosts that more than one position computes on can add anything.
  std::map<std::string, int> positions_on;
  for (const auto& by_host : threads) {
    for (const auto& [host, n] : by_host) ++positions_on[host];
  }
  bool shared = false;
  for (const auto& [host, n] : positions_on) shared = shared || n > 1;
  if (!shared) return result;
  const std::vector<double> base_speeds = costs.worker_speeds;
  std::vector<double> extra(stages, 1.0);
  constexpr int kRounds = 12;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::vector<std::pair<double, double>>> busy(stages);
    for (const TimelineEvent& e : result->events) {
      if (IsCompute(e.kind) && e.end_seconds > e.start_seconds) {
        busy[e.worker].push_back({e.start_seconds, e.end_seconds});
      }
    }
    std::vector<double> busy_seconds(stages, 0);
    for (int s = 0; s < stages; ++s) {
      std::sort(busy[s].begin(), busy[s].end());
      for (const auto& [lo, hi] : busy[s]) busy_seconds[s] += hi - lo;
    }
    double moved = 0;
    for (int s = 0; s < stages; ++s) {
      if (busy_seconds[s] <= 0) continue;
      double stretch = 1;
      for (const auto& [host, own] : threads[s]) {
        double demand = own;
        for (int o = 0; o < stages; ++o) {
          auto there = threads[o].find(host);
          if (o == s || there == threads[o].end()) continue;
          // Over s's compute (c of its busy time), o computes c of the
          // overlap's (both spread evenly: the mean field).
          demand += there->second * c * Overlap(busy[s], busy[o]) / busy_seconds[s];
        }
        stretch = std::max(stretch, demand / cores[host]);
      }
      const double wanted = std::max(1.0, stretch / std::max(1.0, lockstep));
      const double next = 0.5 * (extra[s] + wanted);  // damped
      moved = std::max(moved, std::abs(next - extra[s]) / extra[s]);
      extra[s] = next;
    }
    for (int s = 0; s < stages; ++s) {
      costs.worker_speeds[s] = base_speeds[s] / (c * extra[s] + (1 - c));
    }
    result = SimulateIteration(programs, costs);
    if (!result.ok()) return result;
    if (moved < 0.01) break;
  }
  if (largest_extra != nullptr) *largest_extra = *std::max_element(extra.begin(), extra.end());
  return result;
}

std::vector<bool> PositionsWithoutSpareCore(const ClusterSpec& cluster, int replicas, int stages,
                                            int tensor) {
  std::vector<bool> out(std::max(stages, 0), false);
  if (!Shaped(cluster, replicas, stages, tensor)) return out;
  std::map<std::string, int> cores;
  const std::vector<std::map<std::string, int>> threads =
      ThreadsByPosition(cluster, replicas, stages, tensor, &cores);
  std::map<std::string, int> total;  // compute threads on each host
  for (const auto& by_host : threads) {
    for (const auto& [host, n] : by_host) total[host] += n;
  }
  for (int s = 0; s < stages; ++s) {
    for (const auto& [host, n] : threads[s]) {
      if (total[host] >= cores[host]) out[s] = true;
    }
  }
  return out;
}

ModelProfile StretchCompute(const ModelProfile& profile, double factor) {
  ModelProfile out = profile;
  for (UnitProfile& u : out.units) {
    u.fwd_seconds *= factor;
    u.bwd_seconds *= factor;
    u.optimizer_seconds *= factor;
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
