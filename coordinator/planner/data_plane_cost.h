// The links the planner models, with the data plane's own cost per message
// added (DeviceInfo.data_plane_*, measured by each worker at start-up:
// worker/collectives/data_plane_probe.h).
//
// A message of b bytes over a link of latency L and bandwidth W takes
// L + b / W on the wire; the data plane adds o + b / R of its own work
// (framing, gRPC's copies, the receiver's parse and hand-off). That work is
// done by threads that share the host's cores with the compute threads, so
// where those cores are oversubscribed (host_sharing.h's lockstep stretch
// s >= 1) it takes s times as long. How the two combine depends on the link:
//   emulated (ShapedTransport: the emulated link's time, then the real
//   loopback send, in series):  L' = L + s o,   1 / W' = 1 / W + s / R
//   a real network (the copy overlaps the wire; the fixed cost does not):
//                               L' = L + s o,   W' = min(W, R / s)
// Every model of a message's time (eq. 3's all-reduce, the simulator's
// transfers, the 3-D cube's collectives) then sees L' and W' through the
// cluster's two link fields, unchanged, and charges L' per message. The
// fixed cost s o is serial, though: one peer stream frames and copies its
// messages one after another, where the wire's latency L overlaps between
// back-to-back sends. So the cluster also records that part of L'
// (per_message_seconds), and the simulator's Send holds the link for
// s o + b / W' and delivers L after that (simulator.h): the last of k
// messages sent at once arrives k (s o + b / W') + L after they are sent,
// not s o + k b / W' + L.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_DATA_PLANE_COST_H_
#define PIPETRAIN_COORDINATOR_PLANNER_DATA_PLANE_COST_H_

#include <string>

#include "coordinator/planner/profile.h"

namespace pipetrain {

// Folds cluster->data_plane_* into cluster->latency_seconds and
// bandwidth_bytes_per_second as above (an unlimited bandwidth, 0, becomes
// R / s), and adds s o to cluster->per_message_seconds too (the part of
// the latency that is serial per message). Nothing changes when the
// overhead or the rate is not positive. Requires stretch >= 1.
void AddDataPlaneCost(double stretch, ClusterSpec* cluster);

// "; data plane 0.11 ms + 1.5 GB/s per message (x2 on shared cores)", or
// "" when the cluster has no data-plane cost: for the plan's profileSource.
std::string DescribeDataPlaneCost(const ClusterSpec& cluster, double stretch);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_DATA_PLANE_COST_H_
