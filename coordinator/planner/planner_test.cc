// PlanJob's model of workers that share a host's cores (host_sharing.h):
// a stage's tensor ranks compute in lockstep, so on a host with fewer
// cores than their threads their compute stretches; their collectives'
// waits do not.
#include "coordinator/planner/planner.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "coordinator/planner/cluster_testing.h"
#include "coordinator/planner/compression_marking.h"
#include "coordinator/planner/solve_plan.h"
#include "coordinator/planner/tensor_partitions.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"

namespace pipetrain {
namespace {

// A 2-layer, d_model 128 job of 8 sequences of 64 tokens, solver uniform.
v1::JobSpec SmallSpec(int stages, int micro_batches) {
  v1::JobSpec spec;
  spec.set_name("planner-test");
  spec.mutable_model()->set_n_layer(2);
  spec.mutable_model()->set_n_head(4);
  spec.mutable_model()->set_d_model(128);
  spec.mutable_training()->set_seq_len(64);
  spec.mutable_training()->set_batch_size(8);
  spec.mutable_training()->set_micro_batches(micro_batches);
  spec.mutable_training()->set_steps(10);
  spec.mutable_data()->set_synthetic_bytes(100000);
  spec.mutable_parallelism()->set_stages(stages);
  spec.mutable_parallelism()->set_solver("uniform");
  return spec;
}

ResolvedJobSpec TensorParallelJob(int tensor) {
  v1::JobSpec spec = SmallSpec(1, 2);
  spec.mutable_parallelism()->set_tensor(tensor);
  return ResolveJobSpec(spec).value();
}

double Predicted(int tensor, int cores, double bandwidth, double latency, std::string* source) {
  const ResolvedJobSpec job = TensorParallelJob(tensor);
  const ModelProfile profile = AnalyticProfile(
      job.train.model, job.train.seq_len, job.train.batch_size / job.train.micro_batches, 1e10);
  absl::StatusOr<CompiledPlan> plan = PlanJob(
      job, "job", 1, profile, testing::TestCluster(tensor, bandwidth, latency, cores), "analytic");
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return 0;
  if (source != nullptr) *source = plan->plan.profile_source();
  return plan->plan.predicted_iteration_seconds();
}

TEST(PlanJobSharedCores, FourRanksOnTwoCores_ComputeTwiceAsLong) {
  // Unlimited links: the step is compute (and the optimizer step, which
  // an analytic profile does not time), so sharing 2 cores about doubles it.
  std::string source;
  const double alone = Predicted(4, 0, 0, 0, &source);
  EXPECT_FALSE(absl::StrContains(source, "compute x")) << source;
  const double shared = Predicted(4, 2, 0, 0, &source);
  EXPECT_TRUE(absl::StrContains(source,
                                "compute x2.00: 4 lockstep compute threads share the 2 "
                                "cores of shared"))
      << source;
  EXPECT_GT(shared, 1.9 * alone);
  EXPECT_LE(shared, 2.0 * alone + 1e-12);
  // 4 cores for 4 ranks: nothing shared.
  EXPECT_DOUBLE_EQ(Predicted(4, 4, 0, 0, nullptr), alone);
}

TEST(PlanJobSharedCores, CollectiveWaitsAreNotStretched) {
  // A slow link: the step is mostly the all-reduces, which sharing the
  // cores leaves as they are; the step grows by the compute only.
  const double compute_alone = Predicted(4, 0, 0, 0, nullptr);
  const double compute_shared = Predicted(4, 2, 0, 0, nullptr);
  const double alone = Predicted(4, 0, 1.25e8, 5e-4, nullptr);
  const double shared = Predicted(4, 2, 1.25e8, 5e-4, nullptr);
  EXPECT_GT(alone, 3 * compute_alone);  // the link dominates
  EXPECT_NEAR(shared - alone, compute_shared - compute_alone, 1e-9 + 1e-6 * alone);
}

// `spec` planned on its analytic profile over two workers on 1 MB/s links,
// where transfers and all-reduces dwarf the compute (a raw activation's
// transfer takes 65 ms).
absl::StatusOr<CompiledPlan> PlanOnSlowLinks(const v1::JobSpec& spec) {
  const ResolvedJobSpec job = ResolveJobSpec(spec).value();
  const ModelProfile profile = AnalyticProfile(
      job.train.model, job.train.seq_len, job.train.batch_size / job.train.micro_batches, 1e10);
  return PlanJob(job, "job", 1, profile, testing::TestCluster(2, 1e6, 1e-4), "analytic");
}

// spec.compression's codecs shrink the stages' sends in the prediction as
// they do on the wire (simulator_test checks the bytes per send): on a slow
// link, a 2-stage pipeline whose activations and gradients go as piecewise
// 3-bit (under a fifth of the fp32 bytes) is predicted well under half as
// long as the raw one.
// A rank's all-reduces take as long whatever its compute speed: the same
// tensor groups described as (profile P, speed 1) and as (P with every
// compute time doubled, speed 2) get the same AccTFM partitions, cuts and
// prediction (relative 1e-9: the speeds divide in another order). The
// links are slow enough for the all-reduces to matter (about 1 ms each
// beside 1 to 2 ms of a block unit's compute).
TEST(PlanJobTensorParallel, CommunicationNotScaledByWorkerSpeed) {
  for (const std::string solver : {"bipartition", "pipedream"}) {
    v1::JobSpec spec = SmallSpec(2, 2);
    spec.mutable_parallelism()->set_solver(solver);
    spec.mutable_parallelism()->set_tensor(2);
    spec.mutable_parallelism()->set_tensor_partitions(0);
    const ResolvedJobSpec job = ResolveJobSpec(spec).value();
    const ModelProfile profile = AnalyticProfile(
        job.train.model, job.train.seq_len, job.train.batch_size / job.train.micro_batches, 1e10);
    ModelProfile doubled = profile;
    for (UnitProfile& u : doubled.units) {
      u.fwd_seconds *= 2;
      u.bwd_seconds *= 2;
      u.optimizer_seconds *= 2;
    }
    ClusterSpec fast = testing::TestCluster(4, 1e8, 1e-4);
    for (WorkerSpec& w : fast.workers) w.speed = 2;
    absl::StatusOr<CompiledPlan> one =
        PlanJob(job, "job", 1, profile, testing::TestCluster(4, 1e8, 1e-4), "analytic");
    absl::StatusOr<CompiledPlan> two = PlanJob(job, "job", 1, doubled, fast, "analytic");
    ASSERT_TRUE(one.ok() && two.ok()) << one.status() << two.status();
    const v1::Plan& a = one->plan;
    const v1::Plan& b = two->plan;
    EXPECT_NEAR(b.predicted_iteration_seconds(), a.predicted_iteration_seconds(),
                1e-9 * a.predicted_iteration_seconds())
        << solver;
    EXPECT_NEAR(b.bottleneck_seconds(), a.bottleneck_seconds(), 1e-9 * a.bottleneck_seconds())
        << solver;
    EXPECT_EQ(std::vector<int>(b.tensor_partitions_forward().begin(),
                               b.tensor_partitions_forward().end()),
              std::vector<int>(a.tensor_partitions_forward().begin(),
                               a.tensor_partitions_forward().end()))
        << solver;
    EXPECT_EQ(std::vector<int>(b.tensor_partitions_backward().begin(),
                               b.tensor_partitions_backward().end()),
              std::vector<int>(a.tensor_partitions_backward().begin(),
                               a.tensor_partitions_backward().end()))
        << solver;
    ASSERT_EQ(b.stages_size(), a.stages_size());
    for (int s = 0; s < a.stages_size(); ++s) {
      EXPECT_EQ(b.stages(s).forward().DebugString(), a.stages(s).forward().DebugString())
          << solver << " stage " << s;
      EXPECT_EQ(b.stages(s).backward().DebugString(), a.stages(s).backward().DebugString())
          << solver << " stage " << s;
    }
  }
}

// The codec's coding of a rank's all-reduces is CPU work: a group at speed
// 0.25 codes 4x as long as the profile measured, as it computes 4x as
// long. So (profile P with the codec's cost c, speed 0.25) plans as (P
// with its compute x4 and 4c, speed 1): the same partitions and prediction
// (relative 1e-9). Priced at c, the coding was predicted as (4P, c): here
// 50 to 63 % as long.
TEST(PlanJobTensorParallel, CodecCodingScaledByWorkerSpeed) {
  for (const std::string solver : {"bipartition", "pipedream"}) {
    SCOPED_TRACE(solver);
    v1::JobSpec spec = SmallSpec(2, 2);
    spec.mutable_parallelism()->set_solver(solver);
    spec.mutable_parallelism()->set_tensor(2);
    spec.mutable_parallelism()->set_tensor_partitions(0);
    spec.mutable_parallelism()->set_tensor_compression("piecewise:bits=4");
    const ResolvedJobSpec job = ResolveJobSpec(spec).value();
    const ModelProfile profile = AnalyticProfile(
        job.train.model, job.train.seq_len, job.train.batch_size / job.train.micro_batches, 1e10);
    const auto scaled = [&](double compute, double coding_per_byte) {
      ModelProfile out = profile;
      for (UnitProfile& u : out.units) {
        u.fwd_seconds *= compute;
        u.bwd_seconds *= compute;
        u.optimizer_seconds *= compute;
      }
      out.codec_all_reduce_seconds_per_byte["piecewise:bits=8"] = coding_per_byte;
      return out;
    };
    const auto plan = [&](const ModelProfile& p, double speed) {
      ClusterSpec cluster = testing::TestCluster(4, 1e8, 1e-4);
      for (WorkerSpec& w : cluster.workers) w.speed = speed;
      return PlanJob(job, "job", 1, p, cluster, "analytic");
    };
    const absl::StatusOr<CompiledPlan> slow = plan(scaled(1, 5e-8), 0.25);
    const absl::StatusOr<CompiledPlan> described = plan(scaled(4, 2e-7), 1);
    const absl::StatusOr<CompiledPlan> coding_unscaled = plan(scaled(4, 5e-8), 1);
    ASSERT_TRUE(slow.ok() && described.ok() && coding_unscaled.ok())
        << slow.status() << described.status() << coding_unscaled.status();
    const v1::Plan& a = slow->plan;
    const v1::Plan& b = described->plan;
    EXPECT_NEAR(a.predicted_iteration_seconds(), b.predicted_iteration_seconds(),
                1e-9 * b.predicted_iteration_seconds());
    EXPECT_EQ(std::vector<int>(a.tensor_partitions_forward().begin(),
                               a.tensor_partitions_forward().end()),
              std::vector<int>(b.tensor_partitions_forward().begin(),
                               b.tensor_partitions_forward().end()));
    EXPECT_EQ(std::vector<int>(a.tensor_partitions_backward().begin(),
                               a.tensor_partitions_backward().end()),
              std::vector<int>(b.tensor_partitions_backward().begin(),
                               b.tensor_partitions_backward().end()));
    EXPECT_LT(coding_unscaled->plan.predicted_iteration_seconds(),
              0.8 * b.predicted_iteration_seconds());
  }
}

// A fixed spec.parallelism.tensor_partitions splits the attention and MLP
// units only: embed and head are never partitioned, so the plan lists 1
// for them, as it does for Alg. 1's choice (tensor_partitions 0).
TEST(PlanJobTensorPartitions, FixedCountSplitsOnlyBlockUnits) {
  for (int fixed : {0, 2, 4}) {
    v1::JobSpec spec = SmallSpec(1, 4);
    spec.mutable_parallelism()->set_tensor(2);
    spec.mutable_parallelism()->set_tensor_partitions(fixed);
    const ResolvedJobSpec job = ResolveJobSpec(spec).value();
    const ModelProfile profile = AnalyticProfile(
        job.train.model, job.train.seq_len, job.train.batch_size / job.train.micro_batches, 1e10);
    absl::StatusOr<CompiledPlan> plan =
        PlanJob(job, "job", 1, profile, testing::TestCluster(2, 1e9, 1e-5, 16), "analytic");
    ASSERT_TRUE(plan.ok()) << plan.status();
    const v1::Plan& p = plan->plan;
    ASSERT_EQ(p.tensor_partitions_forward_size(), static_cast<int>(profile.units.size()));
    ASSERT_EQ(p.tensor_partitions_backward_size(), static_cast<int>(profile.units.size()));
    int block_units = 0;
    for (size_t u = 0; u < profile.units.size(); ++u) {
      const bool block = IsTensorParallelBlockUnit(profile.units[u]);
      block_units += block;
      for (int k : {p.tensor_partitions_forward(u), p.tensor_partitions_backward(u)}) {
        if (!block) {
          EXPECT_EQ(k, 1) << profile.units[u].name << " with tensor_partitions " << fixed;
        } else if (fixed > 0) {
          // Micro-batches of 2 samples: 4 partitions run as 2 (gcd).
          EXPECT_EQ(k, std::min(fixed, 2)) << profile.units[u].name;
        } else {  // Alg. 1's choice, cut to what a worker runs
          EXPECT_TRUE(k == 1 || k == 2) << profile.units[u].name << ": " << k;
        }
      }
    }
    EXPECT_EQ(block_units, 4);  // 2 layers: attn and mlp each
  }
}

// A micro-batch of one sample cannot be partitioned (the runtime runs
// gcd(K, samples) partitions): the plan records 1 for every unit and
// predicts what it predicts for tensor_partitions 1, not an overlap the
// workers never get.
TEST(PlanJobTensorPartitions, OneSampleMicroBatches_NotPartitioned) {
  const auto plan_with = [](int partitions) {
    v1::JobSpec spec = SmallSpec(1, 8);  // 8 samples in 8 micro-batches
    spec.mutable_parallelism()->set_tensor(2);
    spec.mutable_parallelism()->set_tensor_partitions(partitions);
    const ResolvedJobSpec job = ResolveJobSpec(spec).value();
    const ModelProfile profile = AnalyticProfile(job.train.model, job.train.seq_len, 1, 1e10);
    return PlanJob(job, "job", 1, profile, testing::TestCluster(2, 1e8, 1e-4, 16), "analytic");
  };
  absl::StatusOr<CompiledPlan> one = plan_with(1);
  ASSERT_TRUE(one.ok()) << one.status();
  for (int partitions : {0, 2, 4}) {
    absl::StatusOr<CompiledPlan> plan = plan_with(partitions);
    ASSERT_TRUE(plan.ok()) << plan.status();
    // One count per unit, like the plan without partitions.
    ASSERT_GT(one->plan.tensor_partitions_forward_size(), 0);
    ASSERT_EQ(plan->plan.tensor_partitions_forward_size(),
              one->plan.tensor_partitions_forward_size());
    ASSERT_EQ(plan->plan.tensor_partitions_backward_size(),
              one->plan.tensor_partitions_forward_size());
    for (int k : plan->plan.tensor_partitions_forward()) EXPECT_EQ(k, 1) << partitions;
    for (int k : plan->plan.tensor_partitions_backward()) EXPECT_EQ(k, 1) << partitions;
    EXPECT_DOUBLE_EQ(plan->plan.predicted_iteration_seconds(),
                     one->plan.predicted_iteration_seconds())
        << partitions;
  }
}

// Solver auto: the plan names each solver it tried with its prediction,
// and each one that gave no plan with the reason, so a user reading GET
// /plan learns why pipedream is missing. Here pipedream's time-balanced cut
// (units 0-4 | 5) puts unit 3's weights on w0, over its memory; uniform
// (0-2 | 3-5) and bipartition fit.
TEST(PlanJobAuto, NamesTheSolversItSkippedAndWhy) {
  v1::JobSpec spec = SmallSpec(2, 2);
  spec.mutable_parallelism()->set_solver("auto");
  const ResolvedJobSpec job = ResolveJobSpec(spec).value();
  ModelProfile profile = AnalyticProfile(job.train.model, job.train.seq_len,
                                         job.train.batch_size / job.train.micro_batches, 1e10);
  ASSERT_EQ(profile.units.size(), 6u);  // embed, 2 x (attention, MLP), head
  for (size_t u = 0; u < profile.units.size(); ++u) {
    UnitProfile& unit = profile.units[u];
    unit.fwd_seconds = unit.bwd_seconds = u == 5 ? 2.5 : 0.5;
    unit.weight_bytes = u == 3 ? 1e6 : 0;
    unit.activation_bytes = unit.stash_bytes = unit.transient_bytes = unit.optimizer_seconds = 0;
  }
  ClusterSpec cluster = testing::TestCluster(2, 0, 0);
  cluster.workers[0].memory_bytes = 1e6;
  absl::StatusOr<CompiledPlan> plan = PlanJob(job, "job", 1, profile, cluster, "analytic");
  ASSERT_TRUE(plan.ok()) << plan.status();
  const v1::Plan& p = plan->plan;
  EXPECT_EQ(p.candidates_size(), 2);
  EXPECT_TRUE(p.candidates().contains("uniform"));
  EXPECT_TRUE(p.candidates().contains("bipartition"));
  ASSERT_EQ(p.candidates_skipped_size(), 1);
  ASSERT_TRUE(p.candidates_skipped().contains("pipedream"));
  EXPECT_TRUE(absl::StartsWith(p.candidates_skipped().at("pipedream"),
                               "RESOURCE_EXHAUSTED: worker w0 would need"))
      << p.candidates_skipped().at("pipedream");
}

// Solver auto when nothing fits: RESOURCE_EXHAUSTED naming every solver's
// reason, Bi-Partition's first. It answered with uniform's reason alone
// ("worker w0 would need ..."), naming no solver and hiding Bi-Partition's.
TEST(PlanJobAuto, NothingFits_EverySolversReasonBiPartitionsFirst) {
  v1::JobSpec spec = SmallSpec(2, 2);
  spec.mutable_parallelism()->set_solver("auto");
  const ResolvedJobSpec job = ResolveJobSpec(spec).value();
  ModelProfile profile = AnalyticProfile(job.train.model, job.train.seq_len,
                                         job.train.batch_size / job.train.micro_batches, 1e10);
  for (UnitProfile& unit : profile.units) unit.weight_bytes = 1e6;
  ClusterSpec cluster = testing::TestCluster(2, 0, 0);
  for (auto& worker : cluster.workers) worker.memory_bytes = 1e6;  // fits one unit's weights
  const absl::Status refused = PlanJob(job, "job", 1, profile, cluster, "analytic").status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_TRUE(absl::StartsWith(refused.message(), "solver auto found no plan; bipartition: "))
      << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "; pipedream: ")) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "; uniform: worker w")) << refused;
}

// A worker's memory counts the largest transient of its units once: with a
// 4096-word vocabulary the head's [B·T, vocab] logit gradient (4.5 MB),
// which a worker that fits everything else but it cannot hold.
TEST(PlanJobMemory, TheHeadsLogitGradientCountsAgainstItsWorker) {
  v1::JobSpec spec = SmallSpec(2, 2);  // uniform: units 0-2 | 3-5, the head on w1
  spec.mutable_model()->set_vocab_size(4096);
  const ResolvedJobSpec job = ResolveJobSpec(spec).value();
  const ModelProfile profile = AnalyticProfile(
      job.train.model, job.train.seq_len, job.train.batch_size / job.train.micro_batches, 1e10);
  ClusterSpec cluster = testing::TestCluster(2, 0, 0);
  BiPartitionProblem problem = MakeBiPartitionProblem(profile, cluster);
  const double with = BiPartitionCosts(problem).Memory(1, {3, 6}, {3, 6});
  problem.transient_bytes.clear();
  const double without = BiPartitionCosts(problem).Memory(1, {3, 6}, {3, 6});
  EXPECT_EQ(with - without, profile.units[5].transient_bytes);
  EXPECT_EQ(profile.units[5].transient_bytes, 4.0 * 4 * 64 * (4096 + 2 * 128));

  cluster.workers[1].memory_bytes = std::ceil(without) + 1024;
  absl::StatusOr<CompiledPlan> refused = PlanJob(job, "job", 1, profile, cluster, "analytic");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "worker w1 would need"))
      << refused.status();
  cluster.workers[1].memory_bytes = std::ceil(with);
  absl::StatusOr<CompiledPlan> planned = PlanJob(job, "job", 1, profile, cluster, "analytic");
  EXPECT_TRUE(planned.ok()) << planned.status();
}

// A job with checkpoints: each CPU worker also holds its checkpoint's
// snapshot of what it steps (weights and both AdamW moments, 3x their
// bytes) while one is written, so a worker that fits everything else but
// that is refused. A GPU worker's snapshot is in host memory, not its
// GPU's.
TEST(PlanJobMemory, CheckpointSnapshotCountsAgainstACpuWorkerOnly) {
  v1::JobSpec spec = SmallSpec(2, 2);  // uniform: units 0-2 | 3-5
  spec.mutable_checkpoint()->set_interval_steps(5);
  const ResolvedJobSpec job = ResolveJobSpec(spec).value();
  const ModelProfile profile = AnalyticProfile(
      job.train.model, job.train.seq_len, job.train.batch_size / job.train.micro_batches, 1e10);
  ClusterSpec cluster = testing::TestCluster(2, 0, 0);
  const double without =
      BiPartitionCosts(MakeBiPartitionProblem(profile, cluster)).Memory(1, {3, 6}, {3, 6});
  double stepped = 0;
  for (int u = 3; u < 6; ++u) stepped += profile.units[u].weight_bytes;
  ASSERT_GT(stepped, 0);
  cluster.workers[1].memory_bytes = std::ceil(without) + 1024;
  absl::StatusOr<CompiledPlan> refused = PlanJob(job, "job", 1, profile, cluster, "analytic");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "worker w1 would need"))
      << refused.status();
  // Without checkpoints it fits; so it does with room for the snapshot.
  v1::JobSpec no_checkpoints = spec;
  no_checkpoints.mutable_checkpoint()->set_interval_steps(0);
  EXPECT_TRUE(
      PlanJob(ResolveJobSpec(no_checkpoints).value(), "job", 1, profile, cluster, "analytic").ok());
  cluster.workers[1].memory_bytes = std::ceil(without + 3 * stepped);
  absl::StatusOr<CompiledPlan> planned = PlanJob(job, "job", 1, profile, cluster, "analytic");
  EXPECT_TRUE(planned.ok()) << planned.status();
  // On GPUs, the room the plan needs is without it.
  cluster.workers[1].memory_bytes = std::ceil(without) + 1024;
  for (WorkerSpec& w : cluster.workers) w.gpu = true;
  planned = PlanJob(job, "job", 1, profile, cluster, "analytic");
  EXPECT_TRUE(planned.ok()) << planned.status();
}

// What a CPU worker holds beside its stepped weights (c_i): a
// checkpoint's snapshot (3x), with data-parallel compression one residual
// per gradient and every replica's (their sum past 8) in the snapshot,
// times the tensor ranks rank 0 gathers, and with tensor ranks the buffer
// its own shards' arrive in beside them; and the final weights' gather.
TEST(PlanJobMemory, CpuSteppedWeightCopies_SnapshotAndResiduals) {
  const auto copies = [](int data, int tensor, int interval, const std::string& codec,
                         const std::string& weights_path = "") {
    v1::JobSpec spec = SmallSpec(1, 16);
    spec.mutable_output()->set_weights_path(weights_path);
    spec.mutable_training()->set_batch_size(32);
    spec.mutable_parallelism()->set_data(data);
    spec.mutable_parallelism()->set_tensor(tensor);
    spec.mutable_checkpoint()->set_interval_steps(interval);
    if (!codec.empty()) spec.mutable_compression()->mutable_data_parallel()->set_codec(codec);
    absl::StatusOr<ResolvedJobSpec> r = ResolveJobSpec(spec);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? CpuSteppedWeightCopies(*r) : -1;
  };
  EXPECT_EQ(copies(1, 1, 0, ""), 0);
  EXPECT_EQ(copies(1, 1, 5, ""), 3);
  EXPECT_EQ(copies(1, 2, 5, ""), 6);
  EXPECT_EQ(copies(2, 1, 0, "bf16"), 1);
  EXPECT_EQ(copies(2, 1, 5, "bf16"), 1 + 3 + 2);
  EXPECT_EQ(copies(2, 2, 5, "powersgd:rank=2"), 1 + 2 * (3 + 2) + 2);
  EXPECT_EQ(copies(16, 1, 5, "bf16"), 1 + 3 + 1);
  // Rank 0's gather of the final weights: T shards' worth.
  EXPECT_EQ(copies(1, 2, 0, "", "out.safetensors"), 2);
  EXPECT_EQ(copies(1, 2, 5, "", "out.safetensors"), 6 + 2);
  EXPECT_EQ(copies(1, 1, 0, "", "out.safetensors"), 0);  // no shards to gather
}

// With T > 1 the writer's snapshot gathers its ranks' residuals unsplit
// into new tensors beside the buffer its own shards' arrived in
// (GatherReplicaFeedback), 1 per residual kept: T = 2, D = 8 with a
// quantizer holds 1 + 2 x (3 + 8) + 8 = 31, where 23 was budgeted. Past 8
// replicas their sum, 1; at T = 1 the snapshot's residuals are that
// buffer's views, counted once.
TEST(PlanJobMemory, CpuSteppedWeightCopies_TensorRanksHoldTheResidualsBuffer) {
  const auto copies = [](int data, int tensor) {
    v1::JobSpec spec = SmallSpec(1, 16);
    spec.mutable_training()->set_batch_size(32);
    spec.mutable_parallelism()->set_data(data);
    spec.mutable_parallelism()->set_tensor(tensor);
    spec.mutable_checkpoint()->set_interval_steps(5);
    spec.mutable_compression()->mutable_data_parallel()->set_codec("bf16");
    absl::StatusOr<ResolvedJobSpec> r = ResolveJobSpec(spec);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? CpuSteppedWeightCopies(*r) : -1;
  };
  EXPECT_EQ(copies(8, 2), 1 + 2 * (3 + 8) + 8);
  EXPECT_EQ(copies(16, 2), 1 + 2 * (3 + 1) + 1);
  EXPECT_EQ(copies(8, 1), 1 + 3 + 8);
}

// With tensor ranks, each rank reads its stage's starting weights
// (spec.init.from) unsplit before the first step: T shards' worth, when
// nothing else of CpuSteppedWeightCopies is held yet.
TEST(PlanJobMemory, CpuSteppedWeightCopies_InitFromUnsplitOnEachRank) {
  const auto copies = [](int tensor, int interval, const std::string& from) {
    v1::JobSpec spec = SmallSpec(1, 16);
    spec.mutable_training()->set_batch_size(32);
    spec.mutable_parallelism()->set_tensor(tensor);
    spec.mutable_checkpoint()->set_interval_steps(interval);
    spec.mutable_init()->set_from(from);
    absl::StatusOr<ResolvedJobSpec> r = ResolveJobSpec(spec);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? CpuSteppedWeightCopies(*r) : -1;
  };
  EXPECT_EQ(copies(4, 0, ""), 0);
  EXPECT_EQ(copies(4, 0, "w.safetensors"), 4);
  EXPECT_EQ(copies(4, 5, "w.safetensors"), 12);  // the snapshot's 3 x 4 covers it
  EXPECT_EQ(copies(1, 0, "w.safetensors"), 0);   // no shards: the stash's room
}

TEST(PlanJobCompression, CompressedSendsShortenThePrediction) {
  v1::JobSpec spec = SmallSpec(2, 4);
  absl::StatusOr<CompiledPlan> raw = PlanOnSlowLinks(spec);
  spec.mutable_compression()->set_forward("piecewise:bits=3");
  spec.mutable_compression()->set_backward("piecewise:bits=3");
  absl::StatusOr<CompiledPlan> compressed = PlanOnSlowLinks(spec);
  ASSERT_TRUE(raw.ok()) << raw.status();
  ASSERT_TRUE(compressed.ok()) << compressed.status();
  const double fraction =
      LinkCodecWireFractions(spec.compression(), 2, 64, 128)->at("piecewise:bits=3");
  EXPECT_LT(fraction, 0.2);
  EXPECT_GT(compressed->plan.predicted_iteration_seconds(), 0);
  EXPECT_LT(compressed->plan.predicted_iteration_seconds(),
            0.5 * raw->plan.predicted_iteration_seconds());
}

// Selective stage compression in the prediction: with D = 2 on a slow
// replica link, PowerSGD rank 1 on the stage whose all-reduce ends the
// step (the planner's choice) is predicted shorter than the exact
// all-reduce, and that stage is the one the plan names.
TEST(PlanJobCompression, DataParallelPowerSgdShortensThePrediction) {
  v1::JobSpec spec = SmallSpec(1, 4);
  spec.mutable_parallelism()->set_data(2);
  absl::StatusOr<CompiledPlan> exact = PlanOnSlowLinks(spec);
  spec.mutable_compression()->mutable_data_parallel()->set_codec("powersgd:rank=1");
  absl::StatusOr<CompiledPlan> compressed = PlanOnSlowLinks(spec);
  ASSERT_TRUE(exact.ok()) << exact.status();
  ASSERT_TRUE(compressed.ok()) << compressed.status();
  EXPECT_EQ(compressed->plan.data_parallel_compressed_stages_size(), 1);
  EXPECT_LT(compressed->plan.predicted_iteration_seconds(),
            0.5 * exact->plan.predicted_iteration_seconds());
}

// The same with a quantizer on the data-parallel all-reduce: piecewise
// 3-bit sends about a fifth of the fp32 bytes of every gradient but the
// tied embedding's; the plan names the stage and the quantizer, no rank.
TEST(PlanJobCompression, DataParallelQuantizerShortensThePrediction) {
  v1::JobSpec spec = SmallSpec(1, 4);
  spec.mutable_parallelism()->set_data(2);
  absl::StatusOr<CompiledPlan> exact = PlanOnSlowLinks(spec);
  spec.mutable_compression()->mutable_data_parallel()->set_codec("piecewise:bits=3");
  absl::StatusOr<CompiledPlan> compressed = PlanOnSlowLinks(spec);
  ASSERT_TRUE(exact.ok()) << exact.status();
  ASSERT_TRUE(compressed.ok()) << compressed.status();
  EXPECT_EQ(compressed->plan.data_parallel_compressed_stages_size(), 1);
  EXPECT_EQ(compressed->plan.data_parallel_quantizer(), "piecewise:bits=3");
  EXPECT_EQ(compressed->plan.data_parallel_powersgd_rank(), 0);
  EXPECT_LT(compressed->plan.predicted_iteration_seconds(),
            0.6 * exact->plan.predicted_iteration_seconds());
}

// The prediction prices the tied embedding's sync as the workers run it:
// fused (the default with replicas), one all-reduce over the 2D owners
// (eq. 16), not the owners' exchange and each one's ring (eq. 15), which
// the workers no longer do. On a slow link the fused plan is predicted
// shorter.
TEST(PlanJobDataParallel, FusedEmbeddingSync_PricedAsItRuns) {
  v1::JobSpec spec = SmallSpec(2, 4);
  spec.mutable_parallelism()->set_data(2);
  const auto plan = [&](bool fused) {
    spec.mutable_parallelism()->set_fused_embedding_sync(fused);
    const ResolvedJobSpec job = ResolveJobSpec(spec).value();
    const ModelProfile profile = AnalyticProfile(
        job.train.model, job.train.seq_len, job.train.batch_size / job.train.micro_batches, 1e10);
    return PlanJob(job, "job", 1, profile, testing::TestCluster(4, 1e6, 1e-4), "analytic");
  };
  absl::StatusOr<CompiledPlan> fused = plan(true), unfused = plan(false);
  ASSERT_TRUE(fused.ok()) << fused.status();
  ASSERT_TRUE(unfused.ok()) << unfused.status();
  EXPECT_LT(fused->plan.predicted_iteration_seconds(), unfused->plan.predicted_iteration_seconds());
}

// The quantized all-reduce's own CPU time, from the profile, for a model
// of several 4 MiB buckets: on hosts of their own (8 cores, 1 thread each)
// it lengthens only the buckets, which overlap the backward pass; with both
// replicas on a 2-core host it takes from compute too, at least its whole
// CPU time (every gradient but the tied wte, per byte).
TEST(PlanJobCompression, DataParallelQuantizerCpuTimeFromTheProfile) {
  v1::JobSpec spec = SmallSpec(1, 4);
  spec.mutable_model()->set_n_layer(4);
  spec.mutable_model()->set_d_model(512);  // 12.6 M block parameters, 50 MB
  spec.mutable_parallelism()->set_data(2);
  spec.mutable_compression()->mutable_data_parallel()->set_codec("piecewise:bits=3");
  spec.mutable_compression()->mutable_data_parallel()->add_stages(0);
  const ResolvedJobSpec job = ResolveJobSpec(spec).value();
  ModelProfile profile = AnalyticProfile(job.train.model, job.train.seq_len,
                                         job.train.batch_size / job.train.micro_batches, 1e10);
  auto predicted = [&](int shared_host_cores) {
    absl::StatusOr<CompiledPlan> plan = PlanJob(
        job, "job", 1, profile, testing::TestCluster(2, 1e9, 1e-5, shared_host_cores), "analytic");
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? plan->plan.predicted_iteration_seconds() : 0.0;
  };
  const double unmeasured = predicted(0);
  profile.codec_all_reduce_seconds_per_byte["piecewise:bits=8"] = 1e-6;  // the family's entry
  double coded_bytes = 0;  // every unit's gradient but the tied wte's, once
  for (const UnitProfile& u : profile.units) coded_bytes += u.weight_bytes;
  coded_bytes -= 2 * TiedGradientBytes(profile);
  const double own_hosts = predicted(0);
  const double shared = predicted(2);
  EXPECT_GE(own_hosts, unmeasured);
  EXPECT_LT(own_hosts, unmeasured + coded_bytes * 1e-6);  // partly hidden
  EXPECT_GE(shared, unmeasured + coded_bytes * 1e-6 * 0.999);
}

// A stage whose replicas would run on a GPU and a CPU is refused before
// any solving: they could not keep bitwise the same weights (the runtime
// also cut their all-reduces differently and deadlocked).
TEST(PlanJobDataParallel, ReplicasOnAGpuAndACpu_FailedPrecondition) {
  v1::JobSpec spec = SmallSpec(1, 4);
  spec.mutable_parallelism()->set_data(2);
  const ResolvedJobSpec job = ResolveJobSpec(spec).value();
  const ModelProfile profile = AnalyticProfile(
      job.train.model, job.train.seq_len, job.train.batch_size / job.train.micro_batches, 1e10);
  ClusterSpec cluster = testing::TestCluster(2, 1e9, 1e-5, 0);
  ASSERT_TRUE(PlanJob(job, "job", 1, profile, cluster, "analytic").ok());
  cluster.workers[1].gpu = true;
  const absl::StatusOr<CompiledPlan> mixed = PlanJob(job, "job", 1, profile, cluster, "analytic");
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kFailedPrecondition) << mixed.status();
  cluster.workers[0].gpu = true;
  EXPECT_TRUE(PlanJob(job, "job", 1, profile, cluster, "analytic").ok());
}

// The reviewer's trigger (r22_shapes finding 1): one layer of d_model 12288
// on two stages, the MLP (unit 2, 8d^2 + 7d floats: 4.83 GB) run forward on
// stage 0 and backward on stage 1. Its weights would go back to stage 0 as
// one tensor after each step, above the 4 GiB a receiver takes: the job
// failed at its first step, and again after each recovery.
v1::JobSpec WideMlpSpec(const std::string& solver) {
  v1::JobSpec spec = SmallSpec(2, 1);
  spec.mutable_model()->set_n_layer(1);
  spec.mutable_model()->set_n_head(96);
  spec.mutable_model()->set_d_model(12288);
  spec.mutable_training()->set_seq_len(8);
  spec.mutable_training()->set_batch_size(1);
  spec.mutable_parallelism()->set_solver(solver);
  return spec;
}

void AddManualStage(v1::JobSpec* spec, Range forward, Range backward) {
  v1::ManualStage* stage = spec->mutable_parallelism()->add_manual_stages();
  stage->set_forward_begin(forward.begin);
  stage->set_forward_end(forward.end);
  stage->set_backward_begin(backward.begin);
  stage->set_backward_end(backward.end);
}

absl::StatusOr<CompiledPlan> PlanWideMlp(const v1::JobSpec& spec) {
  const ResolvedJobSpec job = ResolveJobSpec(spec).value();
  const ModelProfile profile = AnalyticProfile(
      job.train.model, job.train.seq_len, job.train.batch_size / job.train.micro_batches, 1e10);
  return PlanJob(job, "job", 1, profile, testing::TestCluster(2, 0, 0), "analytic");
}

TEST(PlanJobWeightSync, ManualPlanSplittingAUnitOverTheTensorLimit_InvalidArgument) {
  v1::JobSpec spec = WideMlpSpec("manual");
  AddManualStage(&spec, {0, 3}, {0, 2});
  AddManualStage(&spec, {3, 4}, {2, 4});
  const absl::Status refused = PlanWideMlp(spec).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_EQ(refused.message(),
            "spec.parallelism.manual_stages: unit 2 (mlp_0) runs its forward pass on stage 0 and "
            "its backward pass on stage 1, so after each step stage 1 would send its weights to "
            "stage 0 as one tensor of 4832182272 bytes (4.50 GiB), above the data plane's limit "
            "of 4294967296 bytes (4.00 GiB) per tensor; give that unit equal forward and backward "
            "cuts (both passes on one stage)");
  // Equal cuts for it: planned.
  spec.mutable_parallelism()->clear_manual_stages();
  AddManualStage(&spec, {0, 3}, {0, 3});
  AddManualStage(&spec, {3, 4}, {3, 4});
  const absl::StatusOr<CompiledPlan> planned = PlanWideMlp(spec);
  EXPECT_TRUE(planned.ok()) << planned.status();
}

// Bi-Partition never splits such a unit (bipartition.h's weight sync rule).
TEST(PlanJobWeightSync, BiPartition_KeepsAUnitOverTheTensorLimitOnOneStage) {
  for (const char* objective : {"paper", "full"}) {
    SCOPED_TRACE(objective);
    v1::JobSpec spec = WideMlpSpec("bipartition");
    spec.mutable_parallelism()->set_objective(objective);
    const absl::StatusOr<CompiledPlan> planned = PlanWideMlp(spec);
    ASSERT_TRUE(planned.ok()) << planned.status();
    ASSERT_EQ(planned->plan.stages_size(), 2);
    for (const v1::PlanStage& stage : planned->plan.stages()) {
      const bool forward = stage.forward().begin() <= 2 && 2 < stage.forward().end();
      const bool backward = stage.backward().begin() <= 2 && 2 < stage.backward().end();
      EXPECT_EQ(forward, backward) << stage.ShortDebugString();
    }
  }
}

// A worker's --mailbox-limit below the data plane's 4 GiB (the Kubernetes
// manifests give 1G) refuses any larger tensor: the planner sends none
// above the job's smallest (r22_self_b finding 3). At d_model 8192 the MLP
// (unit 2) holds 2.0 GiB of weights and the attention (unit 1) just over
// 1 GiB, both legal under 4 GiB.
constexpr int64_t kGiB = int64_t{1} << 30;

absl::StatusOr<CompiledPlan> PlanWithMailbox(v1::JobSpec spec, int64_t mailbox_limit_bytes) {
  spec.mutable_model()->set_n_head(64);
  spec.mutable_model()->set_d_model(8192);
  const ResolvedJobSpec job = ResolveJobSpec(spec).value();
  const ModelProfile profile = AnalyticProfile(
      job.train.model, job.train.seq_len, job.train.batch_size / job.train.micro_batches, 1e10);
  ClusterSpec cluster = testing::TestCluster(2, 0, 0);
  cluster.mailbox_limit_bytes = mailbox_limit_bytes;
  return PlanJob(job, "job", 1, profile, cluster, "analytic");
}

TEST(PlanJobMailboxLimit, ManualPlanSplittingAUnitOverTheSmallestMailbox_InvalidArgument) {
  v1::JobSpec spec = WideMlpSpec("manual");
  AddManualStage(&spec, {0, 3}, {0, 2});
  AddManualStage(&spec, {3, 4}, {2, 4});
  EXPECT_TRUE(PlanWithMailbox(spec, 0).ok());  // not reported: the 4 GiB holds
  EXPECT_TRUE(PlanWithMailbox(spec, 8 * kGiB).ok());
  const absl::Status refused = PlanWithMailbox(spec, kGiB).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_EQ(refused.message(),
            "spec.parallelism.manual_stages: unit 2 (mlp_0) runs its forward pass on stage 0 and "
            "its backward pass on stage 1, so after each step stage 1 would send its weights to "
            "stage 0 as one tensor of 2147713024 bytes (2.00 GiB), above the smallest "
            "--mailbox-limit among the job's workers, 1073741824 bytes (1.00 GiB) (a worker's "
            "mailbox refuses a larger tensor); give that unit equal forward and backward cuts "
            "(both passes on one stage)");
}

TEST(PlanJobMailboxLimit, BiPartition_KeepsUnitsOverTheSmallestMailboxOnOneStage) {
  for (const char* objective : {"paper", "full"}) {
    SCOPED_TRACE(objective);
    v1::JobSpec spec = WideMlpSpec("bipartition");
    spec.mutable_parallelism()->set_objective(objective);
    const absl::StatusOr<CompiledPlan> planned = PlanWithMailbox(spec, kGiB);
    ASSERT_TRUE(planned.ok()) << planned.status();
    ASSERT_EQ(planned->plan.stages_size(), 2);
    for (const v1::PlanStage& stage : planned->plan.stages()) {
      EXPECT_EQ(stage.forward().begin(), stage.backward().begin()) << stage.ShortDebugString();
      EXPECT_EQ(stage.forward().end(), stage.backward().end()) << stage.ShortDebugString();
    }
  }
}

// A stage's output (one micro-batch's activation, B·T·d floats) above the
// smallest mailbox: no cut or other worker count helps, so the plan is
// refused naming the flag.
TEST(PlanJobMailboxLimit, StageOutputOverTheSmallestMailbox_FailedPrecondition) {
  v1::JobSpec spec = WideMlpSpec("uniform");
  spec.mutable_training()->set_seq_len(64);  // 64 x 8192 floats: 2 MiB
  // The tied embedding's gradient (256 x 8192 floats and ln_f's, 8 MiB),
  // which the two stages exchange each step, bounds it too.
  EXPECT_TRUE(PlanWithMailbox(spec, 16 << 20).ok());
  const absl::Status tied = PlanWithMailbox(spec, 4 << 20).status();
  EXPECT_EQ(tied.code(), absl::StatusCode::kFailedPrecondition) << tied;
  EXPECT_TRUE(absl::StrContains(tied.message(),
                                "stages 0 and 1 would exchange the tied embedding's gradient as "
                                "one tensor of "))
      << tied;
  const absl::Status refused = PlanWithMailbox(spec, (2 << 20) - 1).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_EQ(refused.message(),
            "stage 0 would send the output of unit 1 (attn_0) as one tensor of 2097152 bytes "
            "(0.00 GiB) per micro-batch, above the smallest --mailbox-limit among the job's "
            "workers, 2097151 bytes (0.00 GiB) (a worker's mailbox refuses a larger tensor); "
            "raise the workers' --mailbox-limit above it, or make the micro-batches smaller "
            "(more spec.training.micro_batches)");
}

TEST(MaxPlannedTensorBytes, SmallerOfTheMailboxAndTheDataPlaneLimit) {
  ClusterSpec cluster;
  EXPECT_EQ(MaxPlannedTensorBytes(cluster), 4.0 * kGiB);
  cluster.mailbox_limit_bytes = kGiB;
  EXPECT_EQ(MaxPlannedTensorBytes(cluster), 1.0 * kGiB);
  cluster.mailbox_limit_bytes = 8 * kGiB;
  EXPECT_EQ(MaxPlannedTensorBytes(cluster), 4.0 * kGiB);
}

}  // namespace
}  // namespace pipetrain
