// DESIGN.md §4 and §12 with 3-D tensor parallelism, in one process: every
// stage's attention and MLP units split over a 2 x 2 x 2 cube of runtimes
// (StageSetup::tensor_mode "3d", worker/model/cube_units.h; the embedding
// and the head vocabulary-parallel over the same 8), alone and composed
// with 2 pipeline stages (1F1B and GPipe, a Bi-Partition plan) and with
// D = 2 replicas, with clipping and a warm-up + cosine schedule, must
// reproduce the single-process trainer, the shards gathered into the
// unsplit tensors.
//
// Not bitwise: a 3-D linear layer sums p partial products (the reduce-
// scatter along its output axis), the 3-D LayerNorm p partial row sums,
// the head p^3 partial softmax sums, and the global norm p^3 shares of
// squares, each in another order than one process. These are the same
// kinds of reordering as 1-D tensor parallelism's, so the results are held
// to the same tolerances (data_parallel_testing.h): losses within 1e-5
// relative, weights within kTensorParallelWeightsRelative. Every tensor
// rank reports bitwise the same losses and every replica of a parameter is
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

// 4 heads (2 per cube column), d_model 32 (p^2 = 4 divides it), vocabulary
// 256 (p^3 = 8 divides it), micro-batches of 4 samples (p^2: each rank's
// rows are whole sequences), clipping on every step, warm-up then cosine.
TrainConfig CubeConfig() {
  TrainConfig c = testing::WithClippingAndCosine(SmallConfig());
  c.model.n_head = 4;
  c.batch_size = 16;
  c.micro_batches = 4;
  return c;
}

void ExpectMatchesLocal(const TrainConfig& c, const RunOutput& pipe, const RunOutput& local,
                        const std::string& what) {
  testing::ExpectRunMatchesLocal(c, pipe, local, what, testing::kTensorParallelWeightsRelative);
}

class CubeEquivalenceTest : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(CubeEquivalenceTest, MatchesSingleProcess) {
  const auto& [stages, schedule_name] = GetParam();
  const TrainConfig c = CubeConfig();
  const Dataset data = MakeDataset();
  const RunOutput local = RunLocal(c, data);
  const Schedule schedule = ParseSchedule(schedule_name).value();
  auto ranges = UniformPartition(NumUnits(c.model), stages);
  ASSERT_TRUE(ranges.ok()) << ranges.status();
  testing::PipelineExtras extras;
  extras.tensor_parallel = 8;
  extras.tensor_mode = "3d";
  const RunOutput uniform =
      RunPipeline(c, data, *ranges, *ranges, schedule, nullptr, nullptr, extras);
  ExpectMatchesLocal(c, uniform, local, "uniform");
  EXPECT_GT(uniform.collectives.at("tensor_parallel"), 0);
  if (stages == 2 && schedule_name == "1f1b") {
    // Bi-Partition: stage 0 runs attn_0 and mlp_0 forward but recomputes
    // and back-propagates only through attn_0; stage 1 the rest. Cube
    // units hand over blocks inside a stage and full tensors across.
    const std::vector<Range> forward = {{0, 3}, {3, 6}};
    const std::vector<Range> backward = {{0, 2}, {2, 6}};
    ExpectMatchesLocal(c,
                       RunPipeline(c, data, forward, backward, schedule, nullptr, nullptr, extras),
                       local, "bi-partition");
    // D x P x T = 2 x 2 x 8: thirty-two runtimes.
    testing::PipelineExtras replicated = extras;
    replicated.replicas = 2;
    ExpectMatchesLocal(
        c, RunPipeline(c, data, *ranges, *ranges, schedule, nullptr, nullptr, replicated), local,
        "data-parallel");
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, CubeEquivalenceTest,
                         ::testing::Combine(::testing::Values(1, 2),
                                            ::testing::Values("1f1b", "gpipe")),
                         [](const auto& info) {
                           return "T8_P" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::get<1>(info.param);
                         });

// D = 3 replicas of the cube: a ring of three sums each element in an
// order set by its offset, and a diagonal rank's bucket holds its vector
// shards where the others' hold none, so the replicated tensors (wpe,
// ln_f) lay at other offsets on each rank's replica group and their copies
// drifted apart from the first step. Summed in a flat tensor of their own
// they stay bitwise equal on every rank (RunPipeline checks every copy).
TEST(CubeDataParallelTest, ThreeReplicas_ReplicatedTensorsEqualOnEveryRank) {
  TrainConfig c = CubeConfig();
  c.batch_size = 24;  // 6 micro-batches of 4 samples, 2 per replica
  c.micro_batches = 6;
  const Dataset data = MakeDataset();
  const std::vector<Range> one = {{0, NumUnits(c.model)}};
  testing::PipelineExtras extras;
  extras.tensor_parallel = 8;
  extras.tensor_mode = "3d";
  extras.replicas = 3;
  const RunOutput local = RunLocal(c, data);
  // Buckets of about 2.5 KB: attn_0's blocks and the embedding's wpe
  // share the last one, where wpe straddled the ring's segments at an
  // offset that differed between diagonal and other ranks.
  extras.dp_bucket_bytes = 2560;
  ExpectMatchesLocal(c,
                     RunPipeline(c, data, one, one, Schedule::kOneFOneB, nullptr, nullptr, extras),
                     local, "3 replicas, 2560-byte buckets");
  // 13000 bytes: every unit but the embedding holds 13376 bytes of
  // gradients on a diagonal rank and 12544 elsewhere. Cut by each rank's
  // own sizes, the diagonal ranks summed ln_f in a flat of its own and wpe
  // in another, the others both in one, each element in another order.
  extras.dp_bucket_bytes = 13000;
  ExpectMatchesLocal(c,
                     RunPipeline(c, data, one, one, Schedule::kOneFOneB, nullptr, nullptr, extras),
                     local, "3 replicas, 13000-byte buckets");
}

// Optimus-CC's token top-k on the stages' links with the 3-D layout: the
// cube's attention scores the tokens by the whole layer's An
// (CubeBlockUnit::TokenImportance, held to the unsplit layer's in
// worker/model's cube_units_test), the same bits on all 8 ranks, so all
// keep the same tokens and send their next-stage peers the same tensor
// (RunPipeline checks that every rank reports the same losses and that
// every weight copy agrees), and the job trains as the same compression
// without tensor parallelism, within the tolerances above. Stage 0 ends
// with attn_1, whose input is mlp_0's block (cube_units.h).
TEST(CubeLinkCompressionTest, TokenTopKRanksByTheCubesScores) {
  const TrainConfig c = CubeConfig();
  const Dataset data = MakeDataset();
  const std::vector<Range> two = {{0, 4}, {4, NumUnits(c.model)}};
  testing::PipelineExtras extras;
  extras.forward_codec = "token_topk:keep=0.5";
  extras.backward_codec = "token_topk:keep=0.5";
  const RunOutput lossy =
      RunPipeline(c, data, two, two, Schedule::kOneFOneB, nullptr, nullptr, extras);
  EXPECT_NE(lossy.losses, RunLocal(c, data).losses) << "the links were not compressed";
  extras.tensor_parallel = 8;
  extras.tensor_mode = "3d";
  ExpectMatchesLocal(c,
                     RunPipeline(c, data, two, two, Schedule::kOneFOneB, nullptr, nullptr, extras),
                     lossy, "token top-k links, cube of 8");
}

// Checkpoints of cube stages: Snapshot gathers the cube blocks (c_attn's
// column permutation undone) and their moments into the unsplit tensors.
// Resumed on the cube the run goes on bitwise; on a 1-D layout it matches
// train-local as above.
TEST(CubeCheckpointTest, ResumesBitwiseOnTheCubeAndOnOneDimension) {
  const TrainConfig c = CubeConfig();
  const Dataset data = MakeDataset();
  const RunOutput local = RunLocal(c, data);
  const std::vector<Range> one = {{0, NumUnits(c.model)}};
  const std::vector<Range> two = UniformPartition(NumUnits(c.model), 2).value();
  constexpr int kStep = 6;
  testing::PipelineExtras cube;
  cube.tensor_parallel = 8;
  cube.tensor_mode = "3d";
  cube.snapshot_after = kStep;
  const RunOutput whole =
      RunPipeline(c, data, one, one, Schedule::kOneFOneB, nullptr, nullptr, cube);
  ExpectMatchesLocal(c, whole, local, "cube, uninterrupted");
  ASSERT_EQ(whole.checkpoint.units.size(), static_cast<size_t>(NumUnits(c.model)));

  cube.snapshot_after = 0;
  cube.resume = &whole.checkpoint;
  testing::ExpectResumedMatches(
      c, RunPipeline(c, data, one, one, Schedule::kOneFOneB, nullptr, nullptr, cube), whole, kStep,
      "cube resumed on the cube", /*weights_relative=*/0);

  testing::PipelineExtras flat;
  flat.tensor_parallel = 2;
  flat.resume = &whole.checkpoint;
  testing::ExpectResumedMatches(
      c, RunPipeline(c, data, two, two, Schedule::kGPipe, nullptr, nullptr, flat), local, kStep,
      "cube resumed on T2 P2", testing::kTensorParallelWeightsRelative);
}

}  // namespace
}  // namespace pipetrain
