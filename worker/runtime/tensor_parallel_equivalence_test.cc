// DESIGN.md §4 and §12 with tensor parallelism, in one process: every stage
// of a P-stage pipeline split across T runtimes (1-D, Megatron style;
// worker/model/tensor_parallel.h), T in {2, 4}, P in {1, 2, 3}, uniform and
// Bi-Partition plans, 1F1B and GPipe, composed with D = 2 data-parallel
// replicas, with gradient clipping by the global norm and a warm-up +
// cosine schedule, and with AccTFM's partitioned all-reduces, must
// reproduce the single-process trainer, with the shards gathered into the
// unsplit tensors.
//
// Not bitwise: the row-parallel layers sum T partial GEMMs, the
// vocabulary-parallel softmax T partial sums, and the global norm T partial
// squares, in another order than one process does. The results are held
// to data_parallel_testing.h's tolerance: losses within 1e-5 relative,
// weights within kTensorParallelWeightsRelative (5e-5, why there), the key
// bias to Adam's bound. Every tensor rank reports
// bitwise the same losses and every replica of a replicated parameter is
// bitwise the same (RunPipeline checks both).
#include "coordinator/planner/partition.h"
#include "coordinator/planner/schedule_compiler.h"
#include "gtest/gtest.h"
#include "worker/runtime/data_parallel_testing.h"
#include "worker/runtime/pipeline_testing.h"

namespace pipetrain {
namespace {

using testing::MakeDataset;
using testing::RunLocal;
using testing::RunOutput;
using testing::RunPipeline;
using testing::SmallConfig;

// 4 heads (split by 2 and 4), clipping on every step, warm-up then cosine.
TrainConfig TensorParallelConfig() {
  TrainConfig c = testing::WithClippingAndCosine(SmallConfig());
  c.model.n_head = 4;
  return c;
}

void ExpectMatchesLocal(const TrainConfig& c, const RunOutput& pipe, const RunOutput& local,
                        const std::string& what) {
  testing::ExpectRunMatchesLocal(c, pipe, local, what, testing::kTensorParallelWeightsRelative);
}

class TensorParallelEquivalenceTest
    : public ::testing::TestWithParam<std::tuple<int, int, std::string>> {};

TEST_P(TensorParallelEquivalenceTest, MatchesSingleProcess) {
  const auto& [tensor, stages, schedule_name] = GetParam();
  const TrainConfig c = TensorParallelConfig();
  const Dataset data = MakeDataset();
  const RunOutput local = RunLocal(c, data);
  const Schedule schedule = ParseSchedule(schedule_name).value();
  auto ranges = UniformPartition(NumUnits(c.model), stages);
  ASSERT_TRUE(ranges.ok()) << ranges.status();
  testing::PipelineExtras extras;
  extras.tensor_parallel = tensor;
  const RunOutput uniform =
      RunPipeline(c, data, *ranges, *ranges, schedule, nullptr, nullptr, extras);
  ExpectMatchesLocal(c, uniform, local, "uniform");
  // Per micro-batch, whatever the stages: embed 1 all-reduce, each
  // attention and MLP 1 forward + 1 backward, the head 2 forward (row
  // maxima, exp sums with target logits) + 1 backward; on every rank.
  const int64_t per_micro_batch = 1 + 4 * c.model.n_layer + 3;
  EXPECT_EQ(uniform.collectives.at("tensor_parallel"),
            tensor * testing::kIterations * c.micro_batches * per_micro_batch);
  if (stages == 3) {
    // Bi-Partition: worker 1 runs backward passes only (all recomputed).
    const std::vector<Range> forward = {{0, 2}, {2, 2}, {2, 6}};
    const std::vector<Range> backward = {{0, 1}, {1, 4}, {4, 6}};
    ExpectMatchesLocal(c,
                       RunPipeline(c, data, forward, backward, schedule, nullptr, nullptr, extras),
                       local, "bi-partition");
  }
  if (stages == 2) {
    // AccTFM's fine-grained pipeline: micro-batches of 2 samples in 2
    // partitions (4 is cut to 2; 4 runs in TensorParallelFourPartitionsTest),
    // all-reduces overlapped with compute.
    testing::PipelineExtras partitioned = extras;
    partitioned.tensor_partitions = 4;
    ExpectMatchesLocal(
        c, RunPipeline(c, data, *ranges, *ranges, schedule, nullptr, nullptr, partitioned), local,
        "partitioned");
    // Per layer and pass, as Alg. 1 chooses them (units embed, attn_0,
    // mlp_0, attn_1, mlp_1, head; 4 is cut to 2 here).
    partitioned.tensor_partitions_forward = {1, 2, 1, 4, 2, 1};
    partitioned.tensor_partitions_backward = {1, 1, 4, 2, 1, 1};
    ExpectMatchesLocal(
        c, RunPipeline(c, data, *ranges, *ranges, schedule, nullptr, nullptr, partitioned), local,
        "partitioned per layer");
    // Those counts measured against uniform 1, 2 and 4 for one step each
    // (PartitionTuner), the fastest kept from step 5 on: the tensor ranks
    // must agree on the choice (else their all-reduces would not match),
    // and the counts change how a micro-batch is cut, not the results.
    partitioned.tensor_partition_tune_steps = 1;
    ExpectMatchesLocal(
        c, RunPipeline(c, data, *ranges, *ranges, schedule, nullptr, nullptr, partitioned), local,
        "partitions tuned");
  }
  if (stages == 2 && tensor == 2) {
    // D x P x T = 2 x 2 x 2: eight runtimes.
    extras.replicas = 2;
    ExpectMatchesLocal(c,
                       RunPipeline(c, data, *ranges, *ranges, schedule, nullptr, nullptr, extras),
                       local, "data-parallel");
    // Each unit's data-parallel all-reduce started as soon as its backward
    // is final, with 2 partitions streamed across units: a streamed unit's
    // LayerNorm gradients are final only after the next unit's backward.
    extras.dp_bucket_bytes = 1;
    extras.tensor_partitions = 2;
    ExpectMatchesLocal(c,
                       RunPipeline(c, data, *ranges, *ranges, schedule, nullptr, nullptr, extras),
                       local, "data-parallel, all-reduce per unit, partitions streamed");
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, TensorParallelEquivalenceTest,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Values(1, 2, 3),
                                            ::testing::Values("1f1b", "gpipe")),
                         [](const auto& info) {
                           return "T" + std::to_string(std::get<0>(info.param)) + "_P" +
                                  std::to_string(std::get<1>(info.param)) + "_" +
                                  std::get<2>(info.param);
                         });

// The tensor-parallel all-reduces one micro-batch takes on one rank when
// the units run these partitions (none cut): embed 1, each attention and
// MLP one per forward and backward partition, the head 2 forward + 1
// backward; and the units in `recomputed` run their forward partitions
// once more.
int64_t AllReducesPerMicroBatch(const std::vector<int>& forward, const std::vector<int>& backward,
                                const std::vector<int>& recomputed) {
  int64_t n = 1 + 3;
  for (size_t u = 1; u + 1 < forward.size(); ++u) n += forward[u] + backward[u];
  for (int u : recomputed) n += forward[u];
  return n;
}

// AccTFM's partitions as the cases above ask them, on micro-batches of 4
// samples (batch 16 in 4 micro-batches), so that a 4 runs as 4 and not as
// 2: uniform 4, and per unit counts mixing 1, 2 and 4 that re-cut every
// streamed output (SplitOrMerge) one way in the forward pass (4 -> 2,
// 2 -> 1, 1 -> 4) and the other in the backward pass (2 -> 4, 4 -> 1,
// 1 -> 2); units in one stage (P = 1) stream across all four block units,
// in two (P = 2) across attn -> mlp, and the Bi-Partition plan (P = 3)
// recomputes units 1-3 in partitions. The runtime reports the counts it
// ran only when tuning (IterationResult::tensor_partitions), so the
// all-reduces it counted show them: one per partition, fewer had a count
// been cut.
class TensorParallelFourPartitionsTest
    : public ::testing::TestWithParam<std::tuple<int, int, std::string>> {};

TEST_P(TensorParallelFourPartitionsTest, FourSampleMicroBatches_RunCountsUncut_MatchSingleProcess) {
  const auto& [tensor, stages, schedule_name] = GetParam();
  TrainConfig c = TensorParallelConfig();
  c.batch_size = 16;
  c.micro_batches = 4;
  const Dataset data = MakeDataset();
  const RunOutput local = RunLocal(c, data);
  const Schedule schedule = ParseSchedule(schedule_name).value();
  std::vector<Range> forward = UniformPartition(NumUnits(c.model), stages).value();
  std::vector<Range> backward = forward;
  std::vector<int> recomputed;
  if (stages == 3) {
    // Bi-Partition, as above: worker 1 recomputes units 1-3 for its
    // backward passes.
    forward = {{0, 2}, {2, 2}, {2, 6}};
    backward = {{0, 1}, {1, 4}, {4, 6}};
    recomputed = {1, 2, 3};
  }
  // Units embed, attn_0, mlp_0, attn_1, mlp_1, head: the counts they run.
  struct Case {
    std::string what;
    bool per_unit;  // else StageSetup::tensor_partitions 4 (embed and head do not cut)
    std::vector<int> forward, backward;
  };
  const std::vector<Case> cases = {
      {"uniform 4", false, {1, 4, 4, 4, 4, 1}, {1, 4, 4, 4, 4, 1}},
      {"per layer", true, {1, 4, 2, 1, 4, 1}, {1, 2, 1, 4, 2, 1}},
  };
  for (const Case& k : cases) {
    testing::PipelineExtras extras;
    extras.tensor_parallel = tensor;
    if (k.per_unit) {
      extras.tensor_partitions_forward = k.forward;
      extras.tensor_partitions_backward = k.backward;
    } else {
      extras.tensor_partitions = 4;
    }
    const RunOutput pipe =
        RunPipeline(c, data, forward, backward, schedule, nullptr, nullptr, extras);
    ExpectMatchesLocal(c, pipe, local, k.what);
    ASSERT_TRUE(pipe.collectives.count("tensor_parallel")) << k.what;
    EXPECT_EQ(pipe.collectives.at("tensor_parallel"),
              tensor * testing::kIterations * c.micro_batches *
                  AllReducesPerMicroBatch(k.forward, k.backward, recomputed))
        << k.what;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, TensorParallelFourPartitionsTest,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Values(1, 2, 3),
                                            ::testing::Values("1f1b", "gpipe")),
                         [](const auto& info) {
                           return "T" + std::to_string(std::get<0>(info.param)) + "_P" +
                                  std::to_string(std::get<1>(info.param)) + "_" +
                                  std::get<2>(info.param);
                         });

// Optimus-CC's token top-k on the stages' links with 1-D tensor
// parallelism: the ranks rank the tokens by the group's summed attention
// column sums (AttentionUnit::TokenImportance, checked against the unsplit
// layer's in tensor_parallel_model_test), so all keep the same tokens and
// send their next-stage peers the same tensor (RunPipeline checks that every
// rank reports the same losses and every weight copy agrees), and the job
// trains as the same compression without tensor parallelism, within the
// tolerances above. (In this small model's first steps An is dominated by
// position, the causal mask's doing, so a rank ranking by its own heads
// would mostly pick the same tokens: the score sums are held to the
// unsplit layer's directly, there.)
TEST(TensorParallelLinkCompressionTest, TokenTopKRanksByTheGroupsScores) {
  const TrainConfig c = TensorParallelConfig();
  const Dataset data = MakeDataset();
  // Stage 0 ends with attn_0, whose An ranks the tokens it sends (an MLP
  // unit's output is ranked by its rows' norms, the same on every rank).
  const std::vector<Range> two = {{0, 2}, {2, NumUnits(c.model)}};
  testing::PipelineExtras extras;
  extras.forward_codec = "token_topk:keep=0.5";
  extras.backward_codec = "token_topk:keep=0.5";
  const RunOutput lossy =
      RunPipeline(c, data, two, two, Schedule::kOneFOneB, nullptr, nullptr, extras);
  EXPECT_NE(lossy.losses, RunLocal(c, data).losses) << "the links were not compressed";
  for (int tensor : {2, 4}) {
    extras.tensor_parallel = tensor;
    ExpectMatchesLocal(
        c, RunPipeline(c, data, two, two, Schedule::kOneFOneB, nullptr, nullptr, extras), lossy,
        "token top-k links, T" + std::to_string(tensor));
  }
}

// Checkpoints of tensor-parallel stages (Snapshot gathers the shards and
// their AdamW moments into the unsplit tensors; Restore cuts each rank's
// back): resumed on its own layout a run goes on bitwise as if never
// stopped (gathering and cutting only copy), and a checkpoint is the
// unsplit model's, so it resumes on any other layout too, there held to
// the tolerances above against train-local.
TEST(TensorParallelCheckpointTest, ResumesBitwiseOnItsLayoutAndOnOthers) {
  const TrainConfig c = TensorParallelConfig();
  const Dataset data = MakeDataset();
  const RunOutput local = RunLocal(c, data);
  const Schedule schedule = Schedule::kOneFOneB;
  const std::vector<Range> two = UniformPartition(NumUnits(c.model), 2).value();
  const std::vector<Range> one = {{0, NumUnits(c.model)}};
  const std::vector<Range> three = UniformPartition(NumUnits(c.model), 3).value();
  constexpr int kStep = 5;

  testing::PipelineExtras t2;
  t2.tensor_parallel = 2;
  t2.snapshot_after = kStep;
  const RunOutput whole = RunPipeline(c, data, two, two, schedule, nullptr, nullptr, t2);
  ExpectMatchesLocal(c, whole, local, "T2 P2, uninterrupted");
  ASSERT_EQ(whole.checkpoint.step, kStep);
  ASSERT_EQ(whole.checkpoint.optimizer_steps, kStep);
  ASSERT_EQ(whole.checkpoint.units.size(), static_cast<size_t>(NumUnits(c.model)));
  for (const auto& [unit, state] : whole.checkpoint.units) {
    EXPECT_EQ(state.m.size(), state.values.size()) << "unit " << unit << " has its moments";
  }

  t2.snapshot_after = 0;
  t2.resume = &whole.checkpoint;
  testing::ExpectResumedMatches(c, RunPipeline(c, data, two, two, schedule, nullptr, nullptr, t2),
                                whole, kStep, "T2 P2 resumed on T2 P2", /*weights_relative=*/0);

  testing::PipelineExtras other;
  other.resume = &whole.checkpoint;
  testing::ExpectResumedMatches(
      c, RunPipeline(c, data, three, three, schedule, nullptr, nullptr, other), local, kStep,
      "T2 P2 resumed on T1 P3", testing::kTensorParallelWeightsRelative);
  other.tensor_parallel = 4;
  testing::ExpectResumedMatches(
      c, RunPipeline(c, data, one, one, schedule, nullptr, nullptr, other), local, kStep,
      "T2 P2 resumed on T4 P1", testing::kTensorParallelWeightsRelative);

  // A plain pipeline's checkpoint (unsplit tensors all along) cut into
  // shards of 2 ranks, 2 partitions per micro-batch.
  testing::PipelineExtras plain;
  plain.snapshot_after = kStep;
  const RunOutput untouched = RunPipeline(c, data, two, two, schedule, nullptr, nullptr, plain);
  testing::PipelineExtras split;
  split.tensor_parallel = 2;
  split.tensor_partitions = 2;
  split.resume = &untouched.checkpoint;
  testing::ExpectResumedMatches(
      c, RunPipeline(c, data, three, three, schedule, nullptr, nullptr, split), local, kStep,
      "T1 P2 resumed on T2 P3", testing::kTensorParallelWeightsRelative);
}

}  // namespace
}  // namespace pipetrain
