// Workers that share a host's CPU cores (DESIGN.md §12; the planner's model
// of what a profile measured alone does not know).
//
// A profile is measured by one worker with the host to itself. In a job,
// the workers at one stage position, its T tensor ranks and its D
// replicas, run the same program on the same micro-batch at the same time
// (their collectives keep them in lockstep), so they also compute at the
// same time. Where those workers' compute threads on one host outnumber
// its cores, each gets cores / threads of a core's time while they
// compute (processor sharing), and their compute takes threads / cores as
// long as the profile says. Their waits for collectives and transfers
// leave the cores free and are not stretched. Workers of different stage
// positions compute at different times of the step (the pipeline's
// schedule), but not always apart: SimulateWithSharedCores adds what
// positions on one host take from each other where their compute overlaps
// in the simulated step, and what the workers' data planes take from it
// while they move messages.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_HOST_SHARING_H_
#define PIPETRAIN_COORDINATOR_PLANNER_HOST_SHARING_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/planner/profile.h"
#include "coordinator/planner/simulator.h"

namespace pipetrain {

struct ComputeStretch {
  double factor = 1;  // >= 1: how much longer a stage's compute takes
  std::string host;   // the host that sets it (factor > 1 only)
  int threads = 0;    // the lockstep compute threads there
  int cores = 0;      // and its cores
};

// The largest stretch over the stage positions s (workers (r * stages + s)
// * tensor + t for every replica r and tensor rank t) and hosts h: the sum
// of compute_threads of position s's workers on h over h's host_cores,
// at least 1. Workers with host_cores or compute_threads 0 (not known, or
// computing on a GPU) count for nothing; a worker with an empty host has
// one of its own ("(<name>'s unnamed host)" in messages). Requires cluster.workers.size() ==
// replicas * stages * tensor, all >= 1 (else factor 1).
ComputeStretch LockstepComputeStretch(const ClusterSpec& cluster, int replicas, int stages,
                                      int tensor);

// Threads that want a host's cores over [start_seconds, end_seconds).
struct CpuDemand {
  double start_seconds = 0;
  double end_seconds = 0;
  double threads = 0;
};

// Processor sharing resolved in time: the mean, over a position's compute
// intervals `busy` (sorted, disjoint), of max(1, (own + others(t)) /
// cores), where others(t) is the sum of the threads of the demands that
// cover t. (The mean of the ratio, not the ratio of the means: a position
// that computes beside 3 others half the time and alone the rest is slowed
// by 2 x 0.5 + 1 x 0.5 = 1.5 on 2 cores, where the mean demand, 2.5 / 2,
// says 1.25.) 1 when `busy` is empty or cores <= 0.
double MeanSharingStretch(const std::vector<std::pair<double, double>>& busy, double own,
                          const std::vector<CpuDemand>& others, int cores);

// Contention between the stage positions of one host, and with the data
// plane: runs SimulateIteration(programs, costs), where programs[s] is
// stage position s (one replica's programs; `cluster` lists every worker as
// LockstepComputeStretch's; costs.link and replica_link are its links, and
// get its per_message_seconds, which the merged clusters the costs may
// come from do not keep), and then again with each position's speed
// divided by its extra stretch, until no stretch moves by more than 1 %
// (damped; at most 12 rounds). A position's stretch is the largest, over
// the hosts it computes on, of MeanSharingStretch over its compute
// (forward, backward, recompute and optimizer events), with own = its
// compute threads there (every replica and rank) and as others:
//   - every other position's compute threads on that host over its
//     compute, times `compute_share` (below);
//   - the data plane's work (cluster.data_plane_*, data_plane_cost.h) of
//     every position with workers on that host, one thread per worker, over
//     the last lockstep x (overhead + bytes / rate) seconds of each of its
//     transfers (capped at the time the transfer holds its link, which
//     links folded with AddDataPlaneCost make at least that, the
//     per-message work included; an emulated link's wait comes first),
//     and of each all-reduce (bucket) for its messages
//     (AllReduceMessagesFor: the ring's 2 (D - 1) of bytes / D, one of
//     bytes for D = 2). The work is counted on the sender's host
//     only: on loopback (both ends on the host) the probe measured the two
//     ends' work as one thread's; across hosts the receiver's part is not
//     counted. Not counted where the cluster's data-plane cost is unknown.
// The extra stretch is that over `lockstep` (what the profile already
// carries), at least 1. `compute_share` in (0, 1] is the part of the units'
// costs that is compute (tensor parallelism adds the all-reduces a rank
// waits for, which leave the cores free): only that part of a position's
// busy time counts as threads on the cores. Only the compute stretches: the
// extra stretch divides the position's speed, which the simulator applies
// to the units' compute and not to their comm terms (fwd_comm_seconds).
// Where no host has more threads that may want it (compute threads and
// data-plane workers) than cores, the first simulation is returned as it
// is. `*largest_extra` (optional) gets the largest extra stretch of the
// last round. Errors: SimulateIteration's.
absl::StatusOr<SimulationResult> SimulateWithSharedCores(const std::vector<v1::Program>& programs,
                                                         SimulationCosts costs,
                                                         const ClusterSpec& cluster, int replicas,
                                                         int stages, int tensor, double lockstep,
                                                         double compute_share = 1,
                                                         double* largest_extra = nullptr);

// `profile` with every unit's compute times (fwd_seconds, bwd_seconds and
// partition_seconds) times `factor`; sizes unchanged.
ModelProfile StretchCompute(const ModelProfile& profile, double factor);

// Per stage position: whether some host its workers compute on has no core
// beyond the compute threads of all the workers on it (a thread of the
// position's own, such as a compressed all-reduce's coding, then takes
// from compute). False where the hosts' cores or threads are not known, or
// the cluster is not shaped as replicas x stages x tensor.
std::vector<bool> PositionsWithoutSpareCore(const ClusterSpec& cluster, int replicas, int stages,
                                            int tensor);

// "; compute x2.00: 4 lockstep compute threads share the 2 cores of host
// H", or "" for a factor of 1: what the plan's profile_source appends.
std::string DescribeComputeStretch(const ComputeStretch& stretch);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_HOST_SHARING_H_
