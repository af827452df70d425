#include "coordinator/planner/host_sharing.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pipetrain {

namespace {

// Per stage position s (workers (r * stages + s) * tensor + t for every
// replica r and tensor rank t) and host with known cores: the sum of
// count(w) over s's workers there; workers counting 0 are left out.
// `cores` (optional) gets those hosts' cores.
template <typename Count>
std::vector<std::map<std::string, int>> SumByPosition(const ClusterSpec& cluster, int replicas,
                                                      int stages, int tensor, Count count,
                                                      std::map<std::string, int>* cores) {
  std::vector<std::map<std::string, int>> sums(stages);
  for (int s = 0; s < stages; ++s) {
    for (int r = 0; r < replicas; ++r) {
      for (int t = 0; t < tensor; ++t) {
        const WorkerSpec& w = cluster.workers[(static_cast<size_t>(r) * stages + s) * tensor + t];
        const int n = count(w);
        if (w.host_cores <= 0 || n <= 0) continue;
        // A worker that names no host (a cluster file without one, a
        // hostname the worker could not read) shares its cores with no
        // other: grouped under "" they were all one host.
        const std::string host =
            w.host.empty() ? absl::StrCat("(", w.name, "'s unnamed host)") : w.host;
        sums[s][host] += n;
        if (cores != nullptr) (*cores)[host] = w.host_cores;
      }
    }
  }
  return sums;
}

// Position s's compute threads per host (hosts with known cores only).
std::vector<std::map<std::string, int>> ThreadsByPosition(const ClusterSpec& cluster, int replicas,
                                                          int stages, int tensor,
                                                          std::map<std::string, int>* cores) {
  return SumByPosition(
      cluster, replicas, stages, tensor, [](const WorkerSpec& w) { return w.compute_threads; },
      cores);
}

// Position s's workers per host whose cores are known (any device: every
// worker's data plane runs on its host's CPU).
std::vector<std::map<std::string, int>> WorkersByPosition(const ClusterSpec& cluster, int replicas,
                                                          int stages, int tensor) {
  return SumByPosition(
      cluster, replicas, stages, tensor, [](const WorkerSpec&) { return 1; }, nullptr);
}

bool IsCompute(TimelineEventKind kind) {
  return kind == TimelineEventKind::kForward || kind == TimelineEventKind::kBackward ||
         kind == TimelineEventKind::kRecompute || kind == TimelineEventKind::kOptimizer ||
         kind == TimelineEventKind::kAllReduceCpu;
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

double MeanSharingStretch(const std::vector<std::pair<double, double>>& busy, double own,
                          const std::vector<CpuDemand>& others, int cores) {
  if (cores <= 0) return 1;
  // A sweep over every interval's ends: between two of them the demand is
  // constant, and inside > 0 while the position computes.
  struct Edge {
    double t;
    double threads;  // demand that starts (> 0) or ends (< 0) here
    int inside;      // +1 / -1 at the position's own intervals' ends
  };
  std::vector<Edge> edges;
  edges.reserve(2 * (busy.size() + others.size()));
  for (const auto& [lo, hi] : busy) {
    if (hi <= lo) continue;
    edges.push_back({lo, 0, 1});
    edges.push_back({hi, 0, -1});
  }
  for (const CpuDemand& d : others) {
    if (d.end_seconds <= d.start_seconds || d.threads <= 0) continue;
    edges.push_back({d.start_seconds, d.threads, 0});
    edges.push_back({d.end_seconds, -d.threads, 0});
  }
  std::sort(edges.begin(), edges.end(), [](const Edge& a, const Edge& b) { return a.t < b.t; });
  double level = 0, weighted = 0, total = 0;
  int inside = 0;
  for (size_t i = 0; i < edges.size();) {
    const double t = edges[i].t;
    for (; i < edges.size() && edges[i].t == t; ++i) {
      level += edges[i].threads;
      inside += edges[i].inside;
    }
    if (i == edges.size() || inside <= 0) continue;
    const double span = edges[i].t - t;
    total += span;
    weighted += span * std::max(1.0, (own + std::max(0.0, level)) / cores);
  }
  return total > 0 ? weighted / total : 1;
}

absl::StatusOr<SimulationResult> SimulateWithSharedCores(const std::vector<v1::Program>& programs,
                                                         SimulationCosts costs,
                                                         const ClusterSpec& cluster, int replicas,
                                                         int stages, int tensor, double lockstep,
                                                         double compute_share,
                                                         double* largest_extra) {
  const double c = std::clamp(compute_share, 1e-6, 1.0);
  if (largest_extra != nullptr) *largest_extra = 1;
  // The merged clusters the costs are made from at D > 1 or T > 1
  // (ReplicaStageCluster, TensorGroupCluster) keep the links' latency but
  // not its per-message part: the job's cluster has it.
  costs.link.per_message_seconds = cluster.per_message_seconds;
  costs.replica_link.per_message_seconds = cluster.per_message_seconds;
  absl::StatusOr<SimulationResult> result = SimulateIteration(programs, costs);
  if (!result.ok() || stages != static_cast<int>(programs.size()) ||
      !Shaped(cluster, replicas, stages, tensor)) {
    return result;
  }
  std::map<std::string, int> cores;
  const std::vector<std::map<std::string, int>> threads =
      ThreadsByPosition(cluster, replicas, stages, tensor, &cores);
  // The data plane's work (data_plane_cost.h) runs on a thread of each
  // worker of a position beside its compute: counted where it is known.
  const double overhead = cluster.data_plane_overhead_seconds;
  const double rate = cluster.data_plane_bytes_per_second;
  const bool data_plane_known = overhead > 0 && rate > 0;
  const std::vector<std::map<std::string, int>> senders =
      data_plane_known ? WorkersByPosition(cluster, replicas, stages, tensor)
                       : std::vector<std::map<std::string, int>>(stages);
  // Only hosts that more threads than cores may want can stretch anything.
  std::map<std::string, int> wanted_threads;
  for (int s = 0; s < stages; ++s) {
    for (const auto& [host, n] : threads[s]) wanted_threads[host] += n;
    for (const auto& [host, n] : senders[s]) wanted_threads[host] += n;
  }
  bool shared = false;
  for (const auto& [host, n] : wanted_threads) {
    auto known = cores.find(host);
    shared = shared || (known != cores.end() && n > known->second);
  }
  if (!shared) return result;
  const double step_lockstep = std::max(1.0, lockstep);
  const std::vector<double> base_speeds = costs.worker_speeds;
  std::vector<double> extra(stages, 1.0);
  constexpr int kRounds = 12;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::vector<std::pair<double, double>>> busy(stages);
    // Each position's data-plane work: the last CPU seconds of its
    // transfers (an emulated link's wait comes first; on a real one the
    // copy is most of a CPU-bound transfer's time). A transfer's span is
    // the time it holds its link, which the folded cluster's links
    // (AddDataPlaneCost) make s (o + bytes / rate) at least, the per-message
    // work included; the cap only binds where the costs' links do not
    // carry the data plane.
    std::vector<std::vector<std::pair<double, double>>> data_plane(stages);
    for (const TimelineEvent& e : result->events) {
      if (e.end_seconds <= e.start_seconds || e.worker < 0 || e.worker >= stages) continue;
      if (IsCompute(e.kind)) {
        busy[e.worker].push_back({e.start_seconds, e.end_seconds});
        continue;
      }
      if (!data_plane_known) continue;
      double cpu = 0;
      if (e.kind == TimelineEventKind::kSendTransfer) {
        cpu = overhead + e.bytes / rate;
      } else if ((e.kind == TimelineEventKind::kAllReduceBucket ||
                  e.kind == TimelineEventKind::kAllReduce) &&
                 replicas > 1) {
        // The all-reduce's messages (simulator.h's AllReduceMessagesFor:
        // the ring's 2 (D - 1) of bytes / D, one exchange for 2).
        const AllReduceMessages messages = AllReduceMessagesFor(replicas);
        cpu = messages.count * (overhead + e.bytes * messages.fraction / rate);
      }
      cpu = std::min(cpu * step_lockstep, e.end_seconds - e.start_seconds);
      if (cpu > 0) data_plane[e.worker].push_back({e.end_seconds - cpu, e.end_seconds});
    }
    for (int s = 0; s < stages; ++s) std::sort(busy[s].begin(), busy[s].end());
    double moved = 0;
    for (int s = 0; s < stages; ++s) {
      if (busy[s].empty()) continue;
      double stretch = 1;
      for (const auto& [host, own] : threads[s]) {
        // What else wants this host's cores: the other positions' compute
        // (c of their busy time is compute) and every position's data plane.
        std::vector<CpuDemand> others;
        for (int o = 0; o < stages; ++o) {
          auto computing = threads[o].find(host);
          if (o != s && computing != threads[o].end()) {
            for (const auto& [lo, hi] : busy[o]) others.push_back({lo, hi, computing->second * c});
          }
          auto sending = senders[o].find(host);
          if (sending != senders[o].end()) {
            for (const auto& [lo, hi] : data_plane[o]) {
              others.push_back({lo, hi, 1.0 * sending->second});
            }
          }
        }
        stretch = std::max(stretch, MeanSharingStretch(busy[s], own, others, cores[host]));
      }
      const double wanted = std::max(1.0, stretch / step_lockstep);
      const double next = 0.5 * (extra[s] + wanted);  // damped
      moved = std::max(moved, std::abs(next - extra[s]) / extra[s]);
      extra[s] = next;
    }
    for (int s = 0; s < stages; ++s) {
      // The speed divides the units' compute only (their comm terms wait
      // at any speed, simulator.h), so the stretch divides it whole.
      costs.worker_speeds[s] = base_speeds[s] / extra[s];
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
