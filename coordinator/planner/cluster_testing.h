// Clusters for the planner's tests: `n` workers named w0, w1, ... with one
// compute thread each, on links of `bandwidth` bytes/s (0: unlimited) and
// `latency` seconds, each with `memory` bytes (0: unlimited). With
// shared_host_cores > 0 they all sit on one host "shared" of that many
// cores (host_sharing.h), else each on a host of its own with 8 cores.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_CLUSTER_TESTING_H_
#define PIPETRAIN_COORDINATOR_PLANNER_CLUSTER_TESTING_H_

#include <string>

#include "coordinator/planner/profile.h"

namespace pipetrain::testing {

inline ClusterSpec TestCluster(int n, double bandwidth, double latency, int shared_host_cores = 0,
                               double memory = 0) {
  ClusterSpec cluster;
  cluster.bandwidth_bytes_per_second = bandwidth;
  cluster.latency_seconds = latency;
  for (int i = 0; i < n; ++i) {
    WorkerSpec w;
    w.name = "w" + std::to_string(i);
    w.memory_bytes = memory;
    w.host = shared_host_cores > 0 ? "shared" : w.name;
    w.host_cores = shared_host_cores > 0 ? shared_host_cores : 8;
    w.compute_threads = 1;
    cluster.workers.push_back(w);
  }
  return cluster;
}

}  // namespace pipetrain::testing

#endif  // PIPETRAIN_COORDINATOR_PLANNER_CLUSTER_TESTING_H_
