#include "coordinator/planner/data_parallel_layout.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/philox.h"
#include "common/status_macros.h"
#include "coordinator/planner/fused_embedding_sync.h"
#include "coordinator/planner/simulator.h"
#include "coordinator/planner/solve_plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

ClusterSpec Cluster(const std::vector<WorkerSpec>& workers, double bandwidth, double latency) {
  ClusterSpec c;
  c.workers = workers;
  c.bandwidth_bytes_per_second = bandwidth;
  c.latency_seconds = latency;
  return c;
}

ClusterSpec Identical(int n, double bandwidth, double latency) {
  std::vector<WorkerSpec> workers;
  for (int w = 0; w < n; ++w) workers.push_back({absl::StrCat("w", w), 1.0, 0});
  return Cluster(workers, bandwidth, latency);
}

// Two units: embed (fwd 1, bwd 2, 800 weight bytes, 400 B output) and head
// (fwd 3, bwd 4, 1600 weight bytes, 40 B output).
ModelProfile TwoUnits() {
  ModelProfile p;
  p.units = {{"embed", 1, 2, 800, 400, 0}, {"head", 3, 4, 1600, 40, 0}};
  return p;
}

int MaxMicroBatch(const std::vector<v1::Program>& programs) {
  int most = -1;
  for (const v1::Program& p : programs) {
    for (const v1::Instruction& in : p.instructions()) {
      if (in.has_forward()) most = std::max(most, in.forward().micro_batch());
    }
  }
  return most;
}

TEST(SolvePlanTest, DataParallelBelowOne_InvalidArgument) {
  PlanOptions options;
  options.data_parallel = 0;
  auto plan = SolvePlan(TwoUnits(), Identical(2, 0, 0), options);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("parallelism.data"));
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("got 0"));
}

// One stage, two replicas, one micro-batch each: F 1+3, B 2+4, then the
// all-reduce of embed + head less the shared wte (1600 B, counted once), one
// exchange for two replicas: 0.125 s + 1600 B / 1000 B/s = 0.125 + 1.6 s.
TEST(SolvePlanTest, DataParallelTwo_OneStage_ClosedForm) {
  PlanOptions options;
  options.solver = "uniform";
  options.data_parallel = 2;
  const SolvedPlan plan = SolvePlan(TwoUnits(), Identical(1, 1000, 0.125), options).value();
  EXPECT_EQ(plan.data_parallel, 2);
  ASSERT_EQ(plan.all_reduce_seconds.size(), 1u);
  EXPECT_DOUBLE_EQ(plan.all_reduce_seconds[0], 0.125 + 1.6);
  EXPECT_DOUBLE_EQ(plan.simulation.iteration_seconds, 10 + 1.725);
  options.data_parallel = 1;
  const SolvedPlan alone = SolvePlan(TwoUnits(), Identical(1, 1000, 0.125), options).value();
  EXPECT_EQ(alone.all_reduce_seconds, (std::vector<double>{0}));
  EXPECT_EQ(alone.simulation.iteration_seconds, 10);
}

// Two stages, three replicas: each stage all-reduces its own unit's bytes
// after the same programs as without replicas.
TEST(SolvePlanTest, DataParallelThree_TwoStages_SameProgramsPlusAllReduce) {
  PlanOptions options;
  options.solver = "uniform";
  options.micro_batches = 2;
  const ClusterSpec cluster = Identical(2, 1000, 0.01);
  const SolvedPlan alone = SolvePlan(TwoUnits(), cluster, options).value();
  options.data_parallel = 3;
  const SolvedPlan plan = SolvePlan(TwoUnits(), cluster, options).value();
  ASSERT_EQ(plan.programs.size(), 2u);
  for (int w = 0; w < 2; ++w) {
    EXPECT_EQ(plan.programs[w].SerializeAsString(), alone.programs[w].SerializeAsString());
  }
  // 4 x 0.01 s + 4/3 x bytes / 1000 B/s.
  ASSERT_EQ(plan.all_reduce_seconds.size(), 2u);
  EXPECT_DOUBLE_EQ(plan.all_reduce_seconds[0], 0.04 + 4.0 / 3 * 800 / 1000);
  EXPECT_DOUBLE_EQ(plan.all_reduce_seconds[1], 0.04 + 4.0 / 3 * 1600 / 1000);
  EXPECT_GT(plan.simulation.iteration_seconds, alone.simulation.iteration_seconds);
}

// Overlap: the block's 8 MiB gradient is final 6 s into the iteration
// (forward 3 s, head's backward 1 s, the block's 2 s) and all-reduces in
// 1 s while embed's 10 s backward goes on; the step is left with the tied
// wte (100 B). A GPU worker, whose gradients stay on the device, all-reduces
// all of it at the step instead (WorkerSpec::gpu, simulator.h).
TEST(SolvePlanTest, DataParallel_CpuOverlapsBucketsGpuAllReducesAtTheStep) {
  const double block = 8 << 20;
  ModelProfile profile;
  profile.units = {
      {"embed", 1, 10, 100, 4, 0}, {"block", 1, 2, block, 4, 0}, {"head", 1, 1, 100, 4, 0}};
  PlanOptions options;
  options.solver = "uniform";
  options.data_parallel = 2;
  ClusterSpec cluster = Identical(1, block, 0);  // 2(2-1)/2 x 8 MiB at 8 MiB/s: 1 s
  const SolvedPlan cpu = SolvePlan(profile, cluster, options).value();
  EXPECT_DOUBLE_EQ(cpu.simulation.iteration_seconds, 16 + 100 / block);
  EXPECT_DOUBLE_EQ(cpu.all_reduce_seconds[0], 100 / block);
  cluster.workers[0].gpu = true;
  const SolvedPlan gpu = SolvePlan(profile, cluster, options).value();
  EXPECT_DOUBLE_EQ(gpu.simulation.iteration_seconds, 17 + 100 / block);
  EXPECT_DOUBLE_EQ(gpu.all_reduce_seconds[0], 1 + 100 / block);
}

TEST(ReplicaStageClusterTest, SlowestSpeedSmallestLimitedMemory) {
  const ClusterSpec cluster =
      Cluster({{"a", 1, 0}, {"b", 2, 100}, {"c", 0.5, 50}, {"d", 3, 0}}, 7, 0.5);
  const ClusterSpec two = ReplicaStageCluster(cluster, 2);
  ASSERT_EQ(two.workers.size(), 2u);
  EXPECT_EQ(two.workers[0].name, "a,c");
  EXPECT_EQ(two.workers[0].speed, 0.5);
  EXPECT_EQ(two.workers[0].memory_bytes, 50);  // a is unlimited
  EXPECT_EQ(two.workers[1].name, "b,d");
  EXPECT_EQ(two.workers[1].speed, 2);
  EXPECT_EQ(two.workers[1].memory_bytes, 100);  // d is unlimited
  EXPECT_EQ(two.bandwidth_bytes_per_second, 7);
  EXPECT_EQ(two.latency_seconds, 0.5);
  const ClusterSpec four = ReplicaStageCluster(cluster, 4);
  ASSERT_EQ(four.workers.size(), 1u);
  EXPECT_EQ(four.workers[0].name, "a,b,c,d");
  EXPECT_EQ(four.workers[0].speed, 0.5);
  EXPECT_EQ(four.workers[0].memory_bytes, 50);
  EXPECT_FALSE(four.workers[0].gpu);
  ClusterSpec mixed = cluster;
  mixed.workers[2].gpu = true;  // one GPU keeps its position's collective at the step
  EXPECT_EQ(ReplicaStageCluster(mixed, 2).workers[0].gpu, true);
  EXPECT_EQ(ReplicaStageCluster(mixed, 2).workers[1].gpu, false);
  const ClusterSpec one = ReplicaStageCluster(cluster, 1);
  ASSERT_EQ(one.workers.size(), 4u);
  EXPECT_EQ(one.workers[3].name, "d");
  EXPECT_EQ(
      ReplicaStageCluster(Cluster({{"x", 1, 0}, {"y", 1, 0}}, 0, 0), 2).workers[0].memory_bytes,
      0);  // every one unlimited
}

// DistPar's cost (data_parallel_layout.h) by hand. Operator elements:
// embed (0 + 400) / 4 = 100, head (400 + 40) / 4 = 110.
TEST(DistParLayoutCostTest, HandComputed) {
  PlanOptions options;
  options.solver = "uniform";
  options.micro_batches = 2;
  // D = 1, P = 2: worker 1 runs head's F and B for 2 micro-batches: 4 x 110.
  // Sends: ACTIVATION u0 and ACTIVATION_GRAD u1 (400 B each) per
  // micro-batch, and the tied gradient (head's 1600 B) both ways: 4800 B.
  SolvedPlan pipeline = SolvePlan(TwoUnits(), Identical(2, 0, 0), options).value();
  DistParCost cost = DistParLayoutCost(pipeline, TwoUnits(), 1);
  EXPECT_EQ(cost.computation, 440);
  EXPECT_EQ(cost.communication, 1200);
  EXPECT_EQ(cost.total, 1640);
  // D = 2, P = 1: one micro-batch per replica, F and B of both units:
  // 2 x 210; no sends; the all-reduce moves 2(2-1) x 1600 B (wte once).
  options.micro_batches = 1;
  options.data_parallel = 2;
  SolvedPlan replicas = SolvePlan(TwoUnits(), Identical(1, 0, 0), options).value();
  cost = DistParLayoutCost(replicas, TwoUnits(), 0.5);
  EXPECT_EQ(cost.computation, 420);
  EXPECT_EQ(cost.communication, 800);
  EXPECT_EQ(cost.total, 420 + 0.5 * 800);
}

TEST(PlanDataParallelTest, ExplicitD_PlansOneReplicaWithItsShareOfMicroBatches) {
  LayoutOptions options;
  options.data_parallel = 2;
  options.micro_batches = 8;
  options.plan.solver = "uniform";
  ModelProfile profile = TwoUnits();
  const DataParallelLayout layout =
      PlanDataParallel(profile, Identical(4, 1e6, 1e-3), options).value();
  ASSERT_EQ(layout.candidates.size(), 1u);
  EXPECT_EQ(layout.chosen, 0);
  EXPECT_EQ(layout.candidates[0].data_parallel, 2);
  EXPECT_EQ(layout.candidates[0].stages, 2);
  EXPECT_TRUE(layout.candidates[0].status.ok());
  EXPECT_EQ(layout.stage_workers, (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  ASSERT_EQ(layout.stage_cluster.workers.size(), 2u);
  EXPECT_EQ(layout.stage_cluster.workers[1].name, "w1,w3");
  EXPECT_EQ(layout.plan.data_parallel, 2);
  EXPECT_EQ(layout.plan.programs.size(), 2u);
  EXPECT_EQ(MaxMicroBatch(layout.plan.programs), 3);  // 8 / 2 = 4 per replica
  EXPECT_EQ(layout.candidates[0].step_seconds, layout.plan.simulation.iteration_seconds);
  // The head's stage: its 1600 B are the tied wte's, all-reduced by the 4
  // owners of the fused embedding sync (4 latencies, 1.5 x 1600 B), which
  // leaves its step nothing to all-reduce.
  EXPECT_NEAR(layout.candidates[0].max_all_reduce_seconds, 4 * 1e-3 + 1.5 * 1600 / 1e6, 1e-15);
  EXPECT_EQ(layout.candidates[0].distpar.total, DistParLayoutCost(layout.plan, profile, 1).total);
}

TEST(PlanDataParallelTest, BadInput_InvalidArgumentNamingTheField) {
  struct Case {
    int data, micro_batches, workers;
    double beta;
    std::string message;
  };
  const std::vector<Case> cases = {
      {3, 6, 4, 1, "parallelism.data = 3 does not divide the 4 workers"},
      {3, 6, 4, 1, "use one of 1, 2, 4 or auto"},
      {4, 6, 4, 1, "training.micro_batches = 6 is not divisible by parallelism.data = 4"},
      {1, 0, 4, 1, "training.micro_batches must be >= 1, got 0"},
      {-1, 4, 4, 1, "parallelism.data must be >= 1 replicas (or auto), got -1"},
      {1, 4, 4, -1, "DistPar's beta must be finite and >= 0"},
      {1, 4, 0, 1, "no workers"},
      // One unit, m = 1: only D = 1, whose 4 stages exceed the unit.
      {kAutoDataParallel, 1, 4, 1, "no data-parallel layout of the 4 workers"},
  };
  ModelProfile one_unit;
  one_unit.units = {{"embed", 1, 1, 1, 1, 0}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    LayoutOptions options;
    options.data_parallel = c.data;
    options.micro_batches = c.micro_batches;
    options.distpar_beta = c.beta;
    const ModelProfile& profile = c.data == kAutoDataParallel ? one_unit : TwoUnits();
    auto layout = PlanDataParallel(profile, Identical(c.workers, 0, 0), options);
    ASSERT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(layout.status().message()), HasSubstr(c.message));
  }
}

// Replicas must end every step with bitwise the same weights, which a GPU
// and a CPU do not compute: a data-parallel group of both kinds is refused
// naming them, at any stage and tensor rank (tensor rank innermost).
TEST(CheckReplicaDevicesTest, MixedGroup_FailedPreconditionNamingBoth) {
  ClusterSpec cluster = Identical(4, 0, 0);
  EXPECT_TRUE(CheckReplicaDevices(cluster, 2, 2, 1).ok());
  cluster.workers[0].gpu = cluster.workers[2].gpu = true;  // stage 0's replicas
  EXPECT_TRUE(CheckReplicaDevices(cluster, 2, 2, 1).ok());
  EXPECT_TRUE(CheckReplicaDevices(cluster, 1, 4, 1).ok());  // no replicas
  cluster.workers[2].gpu = false;
  cluster.workers[3].gpu = true;  // [G, C, C, G]: both stages mix
  const absl::Status mixed = CheckReplicaDevices(cluster, 2, 2, 1);
  EXPECT_EQ(mixed.code(), absl::StatusCode::kFailedPrecondition) << mixed;
  EXPECT_THAT(std::string(mixed.message()),
              HasSubstr("the data-parallel replicas of stage 0 would run on GPU worker w0 and "
                        "CPU worker w2"));
  // 2 replicas x 1 stage x 2 ranks: rank 1's group is workers 1 and 3
  // ([C, G, C, C]; its tensor ranks mix too, named after the replicas).
  cluster.workers[0].gpu = cluster.workers[2].gpu = cluster.workers[3].gpu = false;
  cluster.workers[1].gpu = true;
  EXPECT_THAT(std::string(CheckReplicaDevices(cluster, 2, 1, 2).message()),
              HasSubstr("stage 0 rank 1 would run on GPU worker w1 and CPU worker w3"));
}

// A stage's tensor ranks each step its replicated parameters, so they are
// of one kind too: refused naming both, at any replica, with no replicas at
// all, and checked after the data-parallel groups.
TEST(CheckReplicaDevicesTest, MixedTensorGroup_FailedPreconditionNamingBoth) {
  ClusterSpec cluster = Identical(4, 0, 0);
  cluster.workers[2].gpu = cluster.workers[3].gpu = true;   // [C, C, G, G]
  EXPECT_TRUE(CheckReplicaDevices(cluster, 1, 2, 2).ok());  // each stage's ranks agree
  const absl::Status stage1 = CheckReplicaDevices(cluster, 1, 1, 4);
  EXPECT_EQ(stage1.code(), absl::StatusCode::kFailedPrecondition) << stage1;
  EXPECT_THAT(std::string(stage1.message()),
              HasSubstr("the tensor-parallel ranks of stage 0 would run on GPU worker w2 and CPU "
                        "worker w0"));
  // 2 replicas x 2 stages x 1 rank would mix replicas instead: that is named.
  EXPECT_THAT(std::string(CheckReplicaDevices(cluster, 2, 2, 1).message()),
              HasSubstr("the data-parallel replicas of stage 0"));
  // [C, G, C, G] as 2 x 1 x 2: replicas agree, each replica's ranks mix.
  cluster.workers[1].gpu = true;
  cluster.workers[2].gpu = false;
  const absl::Status replica = CheckReplicaDevices(cluster, 2, 1, 2);
  EXPECT_EQ(replica.code(), absl::StatusCode::kFailedPrecondition) << replica;
  EXPECT_THAT(std::string(replica.message()),
              HasSubstr("the tensor-parallel ranks of stage 0 replica 0 would run on GPU worker "
                        "w1 and CPU worker w0"));
}

// GPU tensor ranks each compute the stage's replicated parts, so another
// --gemm mode or GPU model rounds them apart: refused naming both workers
// and what they report. Equal ones, CPU ranks, unknown ones (empty) and
// data-parallel replicas (all-reduced) are accepted.
TEST(CheckReplicaDevicesTest, TensorRanksOfOtherGemmMode_FailedPreconditionNamingBoth) {
  ClusterSpec cluster = Identical(4, 0, 0);
  for (WorkerSpec& w : cluster.workers) {
    w.gpu = true;
    w.gpu_arithmetic = "NVIDIA H100 80GB HBM3, fp32 GEMMs";
  }
  cluster.workers[1].gpu_arithmetic = "NVIDIA H100 80GB HBM3, tf32 GEMMs";
  const absl::Status ranks = CheckReplicaDevices(cluster, 1, 2, 2);  // stage 0: w0 + w1
  EXPECT_EQ(ranks.code(), absl::StatusCode::kFailedPrecondition) << ranks;
  EXPECT_THAT(std::string(ranks.message()),
              HasSubstr("the tensor-parallel ranks of stage 0 would run on GPU worker w0 "
                        "(NVIDIA H100 80GB HBM3, fp32 GEMMs) and GPU worker w1 (NVIDIA H100 80GB "
                        "HBM3, tf32 GEMMs)"));
  // The same workers as data-parallel replicas (T = 1): their all-reduce
  // makes them equal.
  EXPECT_TRUE(CheckReplicaDevices(cluster, 2, 2, 1).ok());
  EXPECT_TRUE(CheckReplicaDevices(cluster, 4, 1, 1).ok());
  // [fp32, tf32, fp32, tf32] as 2 x 1 x 2: every replica's ranks mix.
  cluster.workers[3].gpu_arithmetic = cluster.workers[1].gpu_arithmetic;
  EXPECT_THAT(std::string(CheckReplicaDevices(cluster, 2, 1, 2).message()),
              HasSubstr("stage 0 replica 0 would run on GPU worker w0"));
  // Each stage's ranks of one mode: accepted, the stages differing too.
  cluster.workers[1].gpu_arithmetic = cluster.workers[0].gpu_arithmetic;
  cluster.workers[2].gpu_arithmetic = cluster.workers[3].gpu_arithmetic;
  EXPECT_TRUE(CheckReplicaDevices(cluster, 1, 2, 2).ok());
  // Another GPU model, the same mode: refused.
  cluster.workers[1].gpu_arithmetic = "NVIDIA A100-SXM4-80GB, fp32 GEMMs";
  EXPECT_EQ(CheckReplicaDevices(cluster, 1, 2, 2).code(), absl::StatusCode::kFailedPrecondition);
  // Not known (a cluster file): not compared.
  cluster.workers[1].gpu_arithmetic.clear();
  EXPECT_TRUE(CheckReplicaDevices(cluster, 1, 2, 2).ok());
}

// GpuArithmetic keeps the model and the GEMM clause, not the device
// ordinal or the attention kernel; a CPU worker has none.
TEST(GpuArithmeticTest, ModelAndGemmClause) {
  EXPECT_EQ(GpuArithmetic("NVIDIA H100 80GB HBM3",
                          "cuda:3 (NVIDIA H100 80GB HBM3), tf32 GEMMs, flash attention (wmma)"),
            "NVIDIA H100 80GB HBM3, tf32 GEMMs");
  EXPECT_EQ(GpuArithmetic("NVIDIA H100 80GB HBM3", "cuda:0 (NVIDIA H100 80GB HBM3), fp32 GEMMs"),
            "NVIDIA H100 80GB HBM3, fp32 GEMMs");
  EXPECT_EQ(GpuArithmetic("A", "cuda:0 (A), bf16 GEMMs (cublas), GEMM attention"),
            "A, bf16 GEMMs (cublas)");
  EXPECT_EQ(GpuArithmetic("A", ""), "A");
  EXPECT_EQ(GpuArithmetic("", "cpu"), "");
}

// ArrangeByDeviceKind on every kind pattern of up to 8 candidates and every
// layout that fits: a set is returned exactly when some subset of the
// candidates can be laid out with each stage of one kind (brute force over
// subsets), the set returned passes CheckReplicaDevices with distinct
// candidates, and first candidates that pass already are kept as they are.
TEST(ArrangeByDeviceKindTest, AgainstBruteForce_SmallInstances) {
  int arranged = 0, refused = 0;
  for (int n = 1; n <= 8; ++n) {
    for (uint32_t pattern = 0; pattern < (1u << n); ++pattern) {
      std::vector<bool> gpu(n);
      for (int i = 0; i < n; ++i) gpu[i] = (pattern >> i) & 1;
      for (int replicas = 1; replicas <= 4; ++replicas)
        for (int stages = 1; stages <= 4; ++stages)
          for (int tensor = 1; tensor <= 2; ++tensor) {
            const int need = replicas * stages * tensor;
            if (need > n) continue;
            SCOPED_TRACE(absl::StrCat("pattern ", pattern, " of ", n, ", ", replicas, " x ", stages,
                                      " x ", tensor));
            // Some subset of `need` whose GPUs fill whole stages?
            bool possible = false;
            for (uint32_t subset = 0; subset < (1u << n) && !possible; ++subset) {
              if (__builtin_popcount(subset) != need) continue;
              const int gpus = __builtin_popcount(subset & pattern);
              possible = gpus % (replicas * tensor) == 0;
            }
            const std::optional<std::vector<size_t>> picked =
                ArrangeByDeviceKind(gpu, replicas, stages, tensor);
            ASSERT_EQ(picked.has_value(), possible);
            if (!picked) {
              ++refused;
              continue;
            }
            ++arranged;
            ASSERT_EQ(picked->size(), static_cast<size_t>(need));
            ClusterSpec cluster = Identical(need, 0, 0);
            std::vector<bool> used(n, false);
            for (int p = 0; p < need; ++p) {
              const size_t c = (*picked)[p];
              ASSERT_LT(c, static_cast<size_t>(n));
              ASSERT_FALSE(used[c]) << "candidate " << c << " picked twice";
              used[c] = true;
              cluster.workers[p].gpu = gpu[c];
            }
            EXPECT_TRUE(CheckReplicaDevices(cluster, replicas, stages, tensor).ok());
            ClusterSpec first = Identical(need, 0, 0);
            for (int p = 0; p < need; ++p) first.workers[p].gpu = gpu[p];
            if (CheckReplicaDevices(first, replicas, stages, tensor).ok()) {
              for (int p = 0; p < need; ++p) EXPECT_EQ((*picked)[p], static_cast<size_t>(p));
            }
          }
    }
  }
  EXPECT_GT(arranged, 1000);
  EXPECT_GT(refused, 100);
}

// The review's case: [G, C, G, C] for 2 replicas of 1 stage takes the two
// GPUs (the first candidate's kind: as many GPU stages as the first two
// held, rounded); for 2 x 2 the order is already right.
TEST(ArrangeByDeviceKindTest, MixedReadyWorkers_OneKindPerStage) {
  const std::vector<bool> gcgc = {true, false, true, false};
  EXPECT_EQ(ArrangeByDeviceKind(gcgc, 2, 1, 1), (std::vector<size_t>{0, 2}));
  EXPECT_EQ(ArrangeByDeviceKind(gcgc, 2, 2, 1), (std::vector<size_t>{0, 1, 2, 3}));
  EXPECT_EQ(ArrangeByDeviceKind({true, false, false, true}, 2, 2, 1),
            (std::vector<size_t>{0, 1, 3, 2}));
  EXPECT_EQ(ArrangeByDeviceKind({true, false, false}, 2, 1, 1), (std::vector<size_t>{1, 2}));
  EXPECT_EQ(ArrangeByDeviceKind({true, false, true}, 1, 1, 3), std::nullopt);
}

// `pipetrain plan --data auto` skips such layouts: [G, G, C, C] as 2 x 2
// mixes each stage's replicas, so one replica of 4 stages is chosen.
TEST(PlanDataParallelTest, Auto_SkipsLayoutsWhoseReplicasMixGpusAndCpus) {
  LayoutOptions options;
  options.data_parallel = kAutoDataParallel;
  options.micro_batches = 4;
  options.plan.solver = "uniform";
  ModelProfile profile;
  for (int u = 0; u < 4; ++u) profile.units.push_back({absl::StrCat("u", u), 1, 2, 0, 40, 0});
  ClusterSpec cluster = Identical(4, 1e6, 1e-3);
  cluster.workers[0].gpu = cluster.workers[1].gpu = true;
  const DataParallelLayout layout = PlanDataParallel(profile, cluster, options).value();
  std::vector<int> tried;
  for (const LayoutCandidate& c : layout.candidates) {
    tried.push_back(c.data_parallel);
    if (c.data_parallel == 1) {
      EXPECT_TRUE(c.status.ok()) << c.status;
    } else {
      EXPECT_EQ(c.status.code(), absl::StatusCode::kFailedPrecondition) << c.data_parallel;
    }
  }
  std::sort(tried.begin(), tried.end());
  EXPECT_EQ(tried, (std::vector<int>{1, 2, 4}));  // every replica count was tried
  EXPECT_EQ(layout.candidates[layout.chosen].data_parallel, 1);
}

TEST(PlanDataParallelTest, AutoNothingFits_ResourceExhaustedListsEachLayout) {
  LayoutOptions options;
  options.data_parallel = kAutoDataParallel;
  options.micro_batches = 2;
  options.plan.solver = "uniform";
  ClusterSpec cluster = Identical(2, 0, 0);
  for (WorkerSpec& w : cluster.workers) w.memory_bytes = 10;  // < any unit's weights
  auto layout = PlanDataParallel(TwoUnits(), cluster, options);
  ASSERT_EQ(layout.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(layout.status().message()), HasSubstr("1 x 2: worker w0 would need"));
  EXPECT_THAT(std::string(layout.status().message()), HasSubstr("2 x 1: worker w0,w1 would need"));
  // An explicit D returns its own error unchanged.
  options.data_parallel = 2;
  layout = PlanDataParallel(TwoUnits(), cluster, options);
  ASSERT_EQ(layout.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(layout.status().message()), HasSubstr("worker w0,w1 would need"));
}

// Heavy gradients over a slow link: the all-reduce (8000 B at 100 B/s: 80 s)
// makes replicas lose; no gradients: replicas halve the pipeline's work and
// win.
TEST(PlanDataParallelTest, Auto_AllReduceCostDecidesTheLayout) {
  LayoutOptions options;
  options.data_parallel = kAutoDataParallel;
  options.micro_batches = 4;
  options.plan.solver = "uniform";
  ModelProfile profile;
  profile.units = {{"embed", 1, 2, 8000, 400, 0}, {"head", 3, 4, 100, 40, 0}};
  const ClusterSpec cluster = Identical(2, 100, 0);
  DataParallelLayout layout = PlanDataParallel(profile, cluster, options).value();
  ASSERT_EQ(layout.candidates.size(), 2u);
  EXPECT_EQ(layout.candidates[layout.chosen].data_parallel, 1);
  EXPECT_GT(layout.candidates[1].max_all_reduce_seconds, 0);
  for (UnitProfile& u : profile.units) u.weight_bytes = 0;
  layout = PlanDataParallel(profile, cluster, options).value();
  EXPECT_EQ(layout.candidates[layout.chosen].data_parallel, 2);
  EXPECT_EQ(layout.plan.programs.size(), 1u);
  EXPECT_EQ(layout.stage_workers, (std::vector<std::vector<int>>{{0, 1}}));
}

// Workers that name their host are planned as a job's are: 4 replicas of
// one stage on one host of 2 cores compute 4 threads on 2 cores, twice as
// long; 2 replicas of 2 stages keep the lockstep within the cores, but
// their two positions overlap and take cores from each other, so their
// step grows too, by less.
TEST(PlanDataParallelTest, SharedHost_ComputeStretchedAsJobsAre) {
  ModelProfile profile;  // no weights: no all-reduce to blur the compute
  profile.units = {{"embed", 1, 2, 0, 400, 0}, {"head", 3, 4, 0, 40, 0}};
  LayoutOptions options;
  options.data_parallel = kAutoDataParallel;
  options.micro_batches = 4;
  options.plan.solver = "uniform";
  const ClusterSpec alone = Identical(4, 0, 0);
  ClusterSpec shared = alone;
  for (WorkerSpec& w : shared.workers) {
    w.host = "vm";
    w.host_cores = 2;
    w.compute_threads = 1;
  }
  const DataParallelLayout apart = PlanDataParallel(profile, alone, options).value();
  const DataParallelLayout together = PlanDataParallel(profile, shared, options).value();
  ASSERT_EQ(apart.candidates.size(), 2u);  // 2 x 2 and 4 x 1 (2 units)
  ASSERT_EQ(together.candidates.size(), 2u);
  EXPECT_EQ(apart.candidates[1].data_parallel, 4);
  EXPECT_EQ(apart.candidates[1].compute_stretch, 1);
  EXPECT_DOUBLE_EQ(apart.candidates[1].step_seconds, 10);  // F 1+3, B 2+4
  EXPECT_EQ(together.candidates[1].compute_stretch, 2);
  EXPECT_DOUBLE_EQ(together.candidates[1].step_seconds, 20);
  EXPECT_EQ(together.candidates[0].compute_stretch, 1);
  EXPECT_GT(together.candidates[0].step_seconds, apart.candidates[0].step_seconds);
  EXPECT_LT(together.candidates[0].step_seconds, 2 * apart.candidates[0].step_seconds);
  // The choice is the lowest of the stretched steps.
  EXPECT_EQ(apart.candidates[apart.chosen].data_parallel, 4);
  EXPECT_DOUBLE_EQ(
      together.candidates[together.chosen].step_seconds,
      std::min(together.candidates[0].step_seconds, together.candidates[1].step_seconds));
  EXPECT_DOUBLE_EQ(together.plan.simulation.iteration_seconds,
                   together.candidates[together.chosen].step_seconds);
}

TEST(PlanDataParallelTest, Auto_TieGoesToSmallerD) {
  ModelProfile free;
  free.units = {{"embed", 0, 0, 0, 0, 0}, {"head", 0, 0, 0, 0, 0}};
  LayoutOptions options;
  options.data_parallel = kAutoDataParallel;
  options.micro_batches = 2;
  const DataParallelLayout layout = PlanDataParallel(free, Identical(2, 0, 0), options).value();
  ASSERT_EQ(layout.candidates.size(), 2u);
  EXPECT_EQ(layout.candidates[0].step_seconds, layout.candidates[1].step_seconds);
  EXPECT_EQ(layout.chosen, 0);
  EXPECT_EQ(layout.candidates[0].data_parallel, 1);
}

// The model: every (D, P) by brute force, each planned on a stage cluster
// built here independently (worker i serves stage i % P), the minimum
// simulated step kept (ties: smaller D).
struct BruteForce {
  int data_parallel = -1;
  double step_seconds = 0;
  std::vector<int> listed;  // every D tried
  absl::StatusCode error = absl::StatusCode::kOk;
};

BruteForce BruteForceLayout(const ModelProfile& profile, const ClusterSpec& cluster, int m,
                            const PlanOptions& plan_options) {
  BruteForce best;
  const int n = static_cast<int>(cluster.workers.size());
  const int units = static_cast<int>(profile.units.size());
  for (int d = 1; d <= n; ++d) {
    if (n % d != 0 || m % d != 0 || n / d > units) continue;
    const int p = n / d;
    best.listed.push_back(d);
    ClusterSpec stages = cluster;
    stages.workers.resize(p);
    for (int i = p; i < n; ++i) {
      WorkerSpec& s = stages.workers[i % p];
      s.speed = std::min(s.speed, cluster.workers[i].speed);
      const double mem = cluster.workers[i].memory_bytes;
      if (mem > 0 && (s.memory_bytes == 0 || mem < s.memory_bytes)) s.memory_bytes = mem;
    }
    PlanOptions o = plan_options;
    o.micro_batches = m / d;
    o.data_parallel = d;
    // Priced as its workers run it: with replicas, the tied embedding's
    // sync fused (LayoutOptions::fused_embedding_sync's default).
    SimulationCosts costs = SimulationCostsFromProfile(profile, stages, TiedGradientBytes(profile));
    costs.data_parallel = d;
    o.simulate = [&](const std::vector<v1::Program>& programs) -> absl::StatusOr<SimulationResult> {
      std::vector<v1::Program> run = programs;
      if (d > 1) RETURN_IF_ERROR(FuseEmbeddingSyncOfPrograms(&run).status());
      return SimulateIteration(run, costs);
    };
    absl::StatusOr<SolvedPlan> plan = SolvePlan(profile, stages, o);
    if (!plan.ok()) {
      if (best.error == absl::StatusCode::kOk) best.error = plan.status().code();
      continue;
    }
    if (best.data_parallel < 0 || plan->simulation.iteration_seconds < best.step_seconds) {
      best.data_parallel = d;
      best.step_seconds = plan->simulation.iteration_seconds;
    }
  }
  return best;
}

TEST(PlanDataParallelTest, Auto_RandomInstances_MatchesBruteForce) {
  const char* const kSolvers[] = {"uniform", "pipedream", "bipartition", "auto"};
  int data_parallel_chosen = 0, pipeline_chosen = 0, no_fit = 0;
  for (uint32_t instance = 0; instance < 150; ++instance) {
    auto draw = [instance](uint32_t what, uint64_t bound) {
      return static_cast<int>(UniformIndex(20261126, instance, what, 0, bound));
    };
    auto real = [&](uint32_t what, int lo, int hi) {  // integers: exact sums
      return static_cast<double>(lo + draw(what, hi - lo + 1));
    };
    ModelProfile profile;
    const int units = 2 + draw(1, 4);  // 2..5
    for (int u = 0; u < units; ++u) {
      profile.units.push_back({absl::StrCat("u", u), real(10 + u, 0, 4), real(20 + u, 0, 8),
                               real(30 + u, 0, 3) * 1000, real(40 + u, 0, 4) * 100,
                               real(50 + u, 0, 2) * 100});
    }
    const int n = 1 + draw(2, 6);  // 1..6 workers
    ClusterSpec cluster;
    for (int w = 0; w < n; ++w) {
      cluster.workers.push_back(
          {absl::StrCat("w", w), 0.5 * (1 + draw(60 + w, 4)), draw(70 + w, 4) == 0 ? 2500.0 : 0.0});
    }
    cluster.bandwidth_bytes_per_second = draw(3, 3) == 0 ? 0 : real(4, 1, 8) * 500;
    cluster.latency_seconds = 0.25 * draw(5, 3);
    LayoutOptions options;
    options.data_parallel = kAutoDataParallel;
    options.micro_batches = 1 + draw(6, 8);  // 1..8
    options.plan.solver = kSolvers[draw(7, 4)];
    options.plan.objective = draw(8, 2) ? "full" : "paper";
    options.plan.schedule = draw(9, 2) ? Schedule::kGPipe : Schedule::kOneFOneB;
    SCOPED_TRACE(absl::StrCat("instance ", instance, ": ", units, " units, ", n, " workers, m ",
                              options.micro_batches, ", ", options.plan.solver));
    const BruteForce want = BruteForceLayout(profile, cluster, options.micro_batches, options.plan);
    absl::StatusOr<DataParallelLayout> got = PlanDataParallel(profile, cluster, options);
    if (want.listed.empty()) {
      EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
      continue;
    }
    if (want.data_parallel < 0) {
      EXPECT_EQ(got.status().code(), want.error);
      ++no_fit;
      continue;
    }
    ASSERT_TRUE(got.ok()) << got.status();
    std::vector<int> listed;
    for (const LayoutCandidate& c : got->candidates) listed.push_back(c.data_parallel);
    EXPECT_EQ(listed, want.listed);
    const LayoutCandidate& chosen = got->candidates[got->chosen];
    EXPECT_EQ(chosen.data_parallel, want.data_parallel);
    EXPECT_EQ(chosen.stages, n / want.data_parallel);
    EXPECT_EQ(chosen.step_seconds, want.step_seconds);
    EXPECT_EQ(got->plan.simulation.iteration_seconds, want.step_seconds);
    EXPECT_EQ(static_cast<int>(got->plan.programs.size()), chosen.stages);
    for (const LayoutCandidate& c : got->candidates) {
      if (c.status.ok()) {
        EXPECT_GE(c.step_seconds, chosen.step_seconds);
      }
    }
    (want.data_parallel > 1 ? data_parallel_chosen : pipeline_chosen) += 1;
  }
  // The instances exercise both outcomes and the no-fit path.
  EXPECT_GT(data_parallel_chosen, 10);
  EXPECT_GT(pipeline_chosen, 10);
  EXPECT_GT(no_fit, 0);
}

}  // namespace
}  // namespace pipetrain
