#include "coordinator/planner/host_sharing.h"

#include <cmath>
#include <functional>
#include <string>

#include "coordinator/planner/partition.h"
#include "coordinator/planner/schedule_compiler.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// `n` workers on hosts named by `host_of(i)` with `cores` cores each,
// computing with `threads` threads.
ClusterSpec Cluster(int n, const std::function<std::string(int)>& host_of, int cores,
                    int threads = 1) {
  ClusterSpec cluster;
  for (int i = 0; i < n; ++i) {
    WorkerSpec w;
    w.name = "w" + std::to_string(i);
    w.host = host_of(i);
    w.host_cores = cores;
    w.compute_threads = threads;
    cluster.workers.push_back(w);
  }
  return cluster;
}

std::string OneHost(int) { return "a"; }

TEST(LockstepComputeStretch, FourTensorRanksOnTwoCores_Twice) {
  const ComputeStretch s = LockstepComputeStretch(Cluster(4, OneHost, 2), 1, 1, 4);
  EXPECT_DOUBLE_EQ(s.factor, 2.0);
  EXPECT_EQ(s.host, "a");
  EXPECT_EQ(s.threads, 4);
  EXPECT_EQ(s.cores, 2);
  EXPECT_EQ(DescribeComputeStretch(s),
            "; compute x2.00: 4 lockstep compute threads share the 2 cores of a");
}

TEST(LockstepComputeStretch, RanksOnHostsOfTheirOwn_None) {
  const ComputeStretch s =
      LockstepComputeStretch(Cluster(
                                 4, [](int i) { return std::to_string(i); }, 2),
                             1, 1, 4);
  EXPECT_DOUBLE_EQ(s.factor, 1.0);
  EXPECT_EQ(DescribeComputeStretch(s), "");
}

// Workers that name no host share nothing (grouped under "" they were one
// host); each still has its own cores to outnumber.
TEST(LockstepComputeStretch, UnnamedHosts_EachItsOwn) {
  const auto unnamed = [](int) { return std::string(); };
  EXPECT_DOUBLE_EQ(LockstepComputeStretch(Cluster(2, unnamed, 4, 4), 2, 1, 1).factor, 1.0);
  const ComputeStretch s = LockstepComputeStretch(Cluster(2, unnamed, 4, 8), 2, 1, 1);
  EXPECT_DOUBLE_EQ(s.factor, 2.0);
  EXPECT_EQ(s.host, "(w0's unnamed host)");
}

TEST(LockstepComputeStretch, StagesAreNotCountedAgainstEachOther) {
  // 2 stages of 2 ranks on one 2-core host: each position's 2 threads fit.
  EXPECT_DOUBLE_EQ(LockstepComputeStretch(Cluster(4, OneHost, 2), 1, 2, 2).factor, 1.0);
  // 2 replicas of 1 stage of 2 ranks: 4 threads at the one position.
  EXPECT_DOUBLE_EQ(LockstepComputeStretch(Cluster(4, OneHost, 2), 2, 1, 2).factor, 2.0);
}

TEST(LockstepComputeStretch, WorstHostAndPositionSetIt) {
  // Replica r's stage s, rank t at (r * 2 + s) * 2 + t; stage 1's ranks of
  // both replicas (workers 2, 3, 6, 7) on host "b" with 1 core, threads 2.
  auto host_of = [](int i) { return (i / 2) % 2 == 1 ? "b" : "a"; };
  ClusterSpec cluster = Cluster(8, host_of, 8, 2);
  for (int i : {2, 3, 6, 7}) cluster.workers[i].host_cores = 1;
  const ComputeStretch s = LockstepComputeStretch(cluster, 2, 2, 2);
  EXPECT_DOUBLE_EQ(s.factor, 8.0);
  EXPECT_EQ(s.host, "b");
}

TEST(LockstepComputeStretch, UnknownCoresOrGpuWorkersOrBadShape_None) {
  EXPECT_DOUBLE_EQ(LockstepComputeStretch(Cluster(4, OneHost, 0), 1, 1, 4).factor, 1.0);
  EXPECT_DOUBLE_EQ(LockstepComputeStretch(Cluster(4, OneHost, 2, 0), 1, 1, 4).factor, 1.0);
  EXPECT_DOUBLE_EQ(LockstepComputeStretch(Cluster(3, OneHost, 1), 1, 1, 4).factor, 1.0);
  EXPECT_DOUBLE_EQ(LockstepComputeStretch(Cluster(4, OneHost, 1), 0, 1, 4).factor, 1.0);
}

// A 2-stage 1F1B pipeline of 4 units (1 ms forward, 2 ms backward each) and
// 8 micro-batches on workers `cluster` (2 of them, 1 per position).
struct Pipeline {
  std::vector<v1::Program> programs;
  SimulationCosts costs;
};
Pipeline TwoStages() {
  Pipeline p;
  const std::vector<Range> ranges = {{0, 2}, {2, 4}};
  p.programs = CompileBiPartitionPrograms(ranges, ranges, 4, 8, Schedule::kOneFOneB).value();
  for (int u = 0; u < 4; ++u) p.costs.units.push_back({1e-3, 2e-3, 1e3, 1e3});
  p.costs.worker_speeds = {1, 1};
  return p;
}

TEST(SimulateWithSharedCores, PositionsOnOneCoreTakeFromEachOther) {
  const Pipeline p = TwoStages();
  const double alone = SimulateIteration(p.programs, p.costs).value().iteration_seconds;
  // Hosts of their own, or 2 cores for the 2: the plain simulation.
  double extra = 0;
  EXPECT_DOUBLE_EQ(SimulateWithSharedCores(p.programs, p.costs,
                                           Cluster(
                                               2, [](int i) { return std::to_string(i); }, 1),
                                           1, 2, 1, 1.0, 1.0, &extra)
                       .value()
                       .iteration_seconds,
                   alone);
  EXPECT_DOUBLE_EQ(extra, 1.0);
  EXPECT_DOUBLE_EQ(SimulateWithSharedCores(p.programs, p.costs, Cluster(2, OneHost, 2), 1, 2, 1,
                                           1.0, 1.0, &extra)
                       .value()
                       .iteration_seconds,
                   alone);
  // One core for both: where their compute overlaps (1F1B's steady phase)
  // each runs at about half speed, never slower than that.
  const double shared = SimulateWithSharedCores(p.programs, p.costs, Cluster(2, OneHost, 1), 1, 2,
                                                1, 1.0, 1.0, &extra)
                            .value()
                            .iteration_seconds;
  EXPECT_GT(extra, 1.3);
  EXPECT_LE(extra, 2.0);
  EXPECT_GT(shared, 1.3 * alone);
  EXPECT_LE(shared, 2.0 * alone + 1e-12);
  // A lockstep stretch the profile already carries is not charged twice.
  EXPECT_DOUBLE_EQ(SimulateWithSharedCores(p.programs, p.costs, Cluster(2, OneHost, 1), 1, 2, 1,
                                           2.0, 1.0, &extra)
                       .value()
                       .iteration_seconds,
                   alone);
}

TEST(SimulateWithSharedCores, OnlyTheComputeShareStretches) {
  // Half of every unit's cost waited for (tensor-parallel all-reduces):
  // the positions take less from each other, and less of it stretches.
  const Pipeline p = TwoStages();
  const double alone = SimulateIteration(p.programs, p.costs).value().iteration_seconds;
  double all = 0, half = 0;
  const double computing =
      SimulateWithSharedCores(p.programs, p.costs, Cluster(2, OneHost, 1), 1, 2, 1, 1.0, 1.0, &all)
          .value()
          .iteration_seconds;
  const double waiting =
      SimulateWithSharedCores(p.programs, p.costs, Cluster(2, OneHost, 1), 1, 2, 1, 1.0, 0.5, &half)
          .value()
          .iteration_seconds;
  EXPECT_GT(waiting, alone);
  EXPECT_LT(waiting, computing);
  EXPECT_LT(half, all);
}

TEST(MeanSharingStretch, TheMeanOfTheRatioOverTheOwnComputeOnly) {
  // Header's example: beside 3 threads half the time, alone the rest, on 2
  // cores: 2 x 0.5 + 1 x 0.5 (the mean demand, 2.5 / 2, would say 1.25).
  EXPECT_DOUBLE_EQ(MeanSharingStretch({{0, 2}}, 1, {{0, 1, 3}}, 2), 1.5);
  // Demand outside the position's compute costs it nothing; demands that
  // cover one moment add up; a weight may be fractional.
  EXPECT_DOUBLE_EQ(MeanSharingStretch({{0, 1}}, 1, {{1, 5, 9}, {-3, 0, 9}}, 1), 1.0);
  EXPECT_DOUBLE_EQ(MeanSharingStretch({{0, 1}}, 1, {{0, 1, 1}, {0.5, 1, 2}}, 1), 0.5 * 2 + 0.5 * 4);
  EXPECT_DOUBLE_EQ(MeanSharingStretch({{0, 4}}, 2, {{0, 4, 0.5}}, 1), 2.5);
  // Two compute intervals with a gap: only their 2 seconds are averaged.
  EXPECT_DOUBLE_EQ(MeanSharingStretch({{0, 1}, {3, 4}}, 1, {{0, 4, 1}}, 1), 2.0);
  EXPECT_DOUBLE_EQ(MeanSharingStretch({{0, 1}, {3, 4}}, 1, {{2, 3.5, 3}}, 2),
                   (1.0 + 0.5 * 2 + 0.5 * 1) / 2);
  // Nothing to average, or no cores known: 1.
  EXPECT_DOUBLE_EQ(MeanSharingStretch({}, 4, {{0, 1, 4}}, 1), 1.0);
  EXPECT_DOUBLE_EQ(MeanSharingStretch({{0, 1}}, 4, {{0, 1, 4}}, 0), 1.0);
  EXPECT_DOUBLE_EQ(MeanSharingStretch({{1, 1}}, 4, {{0, 2, 4}}, 1), 1.0);
}

TEST(SimulateWithSharedCores, TheDataPlaneTakesFromComputeOnItsHost) {
  // Transfers of 1 MB over a 1 GB/s link (1 ms each) whose data plane
  // works 0.1 ms + 0.5 ms of them on the sender's host.
  Pipeline p = TwoStages();
  for (UnitSimulationCost& u : p.costs.units) u.activation_bytes = 1e6;
  p.costs.link = {1e9, 0};
  const double alone = SimulateIteration(p.programs, p.costs).value().iteration_seconds;
  ClusterSpec own_hosts = Cluster(2, [](int i) { return std::to_string(i); }, 1);
  auto simulate = [&](const ClusterSpec& cluster, double lockstep, double* extra) {
    return SimulateWithSharedCores(p.programs, p.costs, cluster, 1, 2, 1, lockstep, 1.0, extra)
        .value()
        .iteration_seconds;
  };
  // The data plane's cost not known: each worker's one thread has its core.
  double extra = 0;
  EXPECT_DOUBLE_EQ(simulate(own_hosts, 1, &extra), alone);
  EXPECT_DOUBLE_EQ(extra, 1.0);
  // Known: each worker's sends take their core from its compute while
  // they run (never more than half of it).
  own_hosts.data_plane_overhead_seconds = 1e-4;
  own_hosts.data_plane_bytes_per_second = 2e9;
  const double sending = simulate(own_hosts, 1, &extra);
  EXPECT_GT(extra, 1.01);
  EXPECT_LE(extra, 2.0);
  EXPECT_GT(sending, alone);
  EXPECT_LE(sending, 2.0 * alone + 1e-12);
  // A second core leaves both threads theirs.
  ClusterSpec two_cores = Cluster(2, [](int i) { return std::to_string(i); }, 2);
  two_cores.data_plane_overhead_seconds = 1e-4;
  two_cores.data_plane_bytes_per_second = 2e9;
  EXPECT_DOUBLE_EQ(simulate(two_cores, 1, &extra), alone);
  EXPECT_DOUBLE_EQ(extra, 1.0);
  // Both workers on one core: their compute and both data planes share
  // it, a slower step than either alone.
  ClusterSpec one_core = Cluster(2, OneHost, 1);
  one_core.data_plane_overhead_seconds = 1e-4;
  one_core.data_plane_bytes_per_second = 2e9;
  const double one = simulate(one_core, 1, &extra);
  ClusterSpec one_core_unknown = Cluster(2, OneHost, 1);
  EXPECT_GT(one, simulate(one_core_unknown, 1, nullptr));
  EXPECT_GT(one, sending);
}

// Links folded with AddDataPlaneCost hold each transfer's link for the data
// plane's whole work, s (o + bytes / R), its per-message part o included,
// so the demand is not cut short. Worker 0 (its own 1-core host) sends one
// 20 kB activation at 0 and then computes for 110 us, while its data plane
// works 100 us + 20 kB / 2 GB/s = 110 us: beside all of its compute at
// first. At an extra stretch x its compute takes 110 x us, of which the
// first 110 run at half speed: it wants 1 + 1 / x, whose fixed point is
// the golden ratio (damped to within 1 %). Cut at the 10 us the bytes
// alone take (a link that does not hold o), it was 1.08.
TEST(SimulateWithSharedCores, FoldedDataPlaneCost_DemandNotCutAtTheWire) {
  v1::Program sender, receiver;
  v1::Instruction* send = sender.add_instructions();
  send->mutable_send()->mutable_tensor()->set_kind(v1::TENSOR_KIND_ACTIVATION);
  send->mutable_send()->set_peer_stage(1);
  v1::Instruction* forward = sender.add_instructions();
  forward->mutable_forward()->mutable_units()->set_end(1);
  v1::Instruction* recv = receiver.add_instructions();
  recv->mutable_recv()->mutable_tensor()->set_kind(v1::TENSOR_KIND_ACTIVATION);
  recv->mutable_recv()->set_peer_stage(0);
  ModelProfile profile;
  profile.units = {{"embed", 110e-6, 0, 0, 20e3}};
  ClusterSpec cluster = Cluster(2, [](int i) { return std::to_string(i); }, 1);
  cluster.data_plane_overhead_seconds = 1e-4;
  cluster.data_plane_bytes_per_second = 2e9;
  // What AddDataPlaneCost(1, &cluster) makes of an unlimited link of no
  // latency (data_plane_cost_test): L' = o, W' = R, o per message.
  cluster.latency_seconds = 1e-4;
  cluster.bandwidth_bytes_per_second = 2e9;
  cluster.per_message_seconds = 1e-4;
  // At D > 1 the costs come from ReplicaStageCluster, which keeps the
  // links' latency but not their per-message part: the same result.
  ClusterSpec merged = cluster;
  merged.per_message_seconds = 0;
  for (const ClusterSpec* from : {&cluster, &merged}) {
    double extra = 0;
    const SimulationResult r =
        SimulateWithSharedCores({sender, receiver}, SimulationCostsFromProfile(profile, *from, 0),
                                cluster, 1, 2, 1, 1.0, 1.0, &extra)
            .value();
    EXPECT_NEAR(extra, (1 + std::sqrt(5.0)) / 2, 0.01);
    EXPECT_NEAR(r.iteration_seconds, 110e-6 * extra, 1e-12);
  }
}

// A host whose cores all compute leaves none for a position's own threads
// (a compressed all-reduce's coding): 2 single-threaded workers on 2 cores
// do; on 3 cores, or with unknown cores, they do not.
TEST(PositionsWithoutSpareCore, HostsWhoseCoresAllCompute) {
  EXPECT_EQ(PositionsWithoutSpareCore(Cluster(2, OneHost, 2), 2, 1, 1), (std::vector<bool>{true}));
  EXPECT_EQ(PositionsWithoutSpareCore(Cluster(2, OneHost, 3), 2, 1, 1), (std::vector<bool>{false}));
  EXPECT_EQ(PositionsWithoutSpareCore(Cluster(2, OneHost, 0), 2, 1, 1), (std::vector<bool>{false}));
  // Two positions on hosts of their own (2 cores, 1 thread each): spare
  // cores; both on host a: none. A cluster of another shape: not known.
  ClusterSpec two = Cluster(2, [](int i) { return i == 0 ? "a" : "b"; }, 2);
  EXPECT_EQ(PositionsWithoutSpareCore(two, 1, 2, 1), (std::vector<bool>{false, false}));
  two.workers[1].host = "a";
  EXPECT_EQ(PositionsWithoutSpareCore(two, 1, 2, 1), (std::vector<bool>{true, true}));
  EXPECT_EQ(PositionsWithoutSpareCore(two, 1, 3, 1), (std::vector<bool>{false, false, false}));
}

TEST(StretchCompute, ComputeTimesScaledSizesKept) {
  ModelProfile p;
  UnitProfile u;
  u.name = "attn_0";
  u.fwd_seconds = 1;
  u.bwd_seconds = 2;
  u.weight_bytes = 10;
  u.activation_bytes = 20;
  u.partition_seconds[2] = {0.5, 1.5};
  p.units.push_back(u);
  const ModelProfile q = StretchCompute(p, 3);
  EXPECT_DOUBLE_EQ(q.units[0].fwd_seconds, 3);
  EXPECT_DOUBLE_EQ(q.units[0].bwd_seconds, 6);
  EXPECT_DOUBLE_EQ(q.units[0].partition_seconds.at(2).first, 1.5);
  EXPECT_DOUBLE_EQ(q.units[0].partition_seconds.at(2).second, 4.5);
  EXPECT_DOUBLE_EQ(q.units[0].weight_bytes, 10);
  EXPECT_DOUBLE_EQ(q.units[0].activation_bytes, 20);
}

}  // namespace
}  // namespace pipetrain
