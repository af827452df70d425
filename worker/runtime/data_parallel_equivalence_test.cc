// DESIGN.md §4 and §12 with data parallelism, in one process: D replicas of
// a P-stage pipeline (D in {2, 3}, P in {1, 2, 3}, uniform and Bi-Partition
// plans, 1F1B and GPipe, gradient clipping by the global norm and a warm-up
// + cosine schedule) must reproduce the single-process trainer on the same
// global batch, and every replica must end with bitwise the same weights.
//
// Not bitwise against train-local: the all-reduce adds the gradients in
// another order (data_parallel_testing.h says why, and what is checked
// instead). Seen on the development VM: at most 9.2e-8 relative for a loss
// and 9.7e-7 for a weight tensor. The replicas agree with each other
// bitwise because the collectives reduce in one fixed order
// (worker/collectives/collectives.h); RunPipeline checks that.
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

// 6 micro-batches of 2 sequences: divisible by 2 and 3 replicas. Clipping
// is on every step; warm-up then cosine decay.
TrainConfig DataParallelConfig() {
  TrainConfig c = SmallConfig();
  c.batch_size = 12;
  c.micro_batches = 6;
  c.grad_clip = 0.05f;
  c.lr_schedule = LrSchedule::kCosine;
  c.warmup_steps = 3;
  c.min_lr = c.adam.lr / 10;
  return c;
}

void ExpectMatchesLocal(const TrainConfig& c, const RunOutput& pipe, const RunOutput& local,
                        const std::string& what) {
  testing::ExpectLossesClose(pipe.losses, local.losses, what + " losses");
  testing::ExpectLossesClose(pipe.val_losses, local.val_losses, what + " validation losses");
  EXPECT_EQ(pipe.val_losses.size(), 3u) << what;  // after steps 4, 8 and 10
  testing::ExpectWeightsClose(pipe.weights, local.weights, c.model.d_model, c.adam.lr,
                              testing::kIterations, what);
}

class DataParallelEquivalenceTest
    : public ::testing::TestWithParam<std::tuple<int, int, std::string>> {};

TEST_P(DataParallelEquivalenceTest, MatchesSingleProcessAndReplicasAgreeBitwise) {
  const auto& [replicas, stages, schedule_name] = GetParam();
  const TrainConfig c = DataParallelConfig();
  const Dataset data = MakeDataset();
  const RunOutput local = RunLocal(c, data);
  auto ranges = UniformPartition(NumUnits(c.model), stages);
  ASSERT_TRUE(ranges.ok()) << ranges.status();
  // RunPipeline checks that every replica's copy of every weight agrees.
  const RunOutput pipe = RunPipeline(
      c, data, *ranges, *ranges, ParseSchedule(schedule_name).value(), nullptr, nullptr, replicas);
  ASSERT_EQ(pipe.losses.size(), local.losses.size());
  ExpectMatchesLocal(c, pipe, local, "uniform");
  if (stages == 3) {
    // Bi-Partition: worker 1 runs backward passes only (all recomputed).
    const std::vector<Range> forward = {{0, 2}, {2, 2}, {2, 6}};
    const std::vector<Range> backward = {{0, 1}, {1, 4}, {4, 6}};
    const RunOutput bi =
        RunPipeline(c, data, forward, backward, ParseSchedule(schedule_name).value(), nullptr,
                    nullptr, replicas);
    ExpectMatchesLocal(c, bi, local, "bi-partition");
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, DataParallelEquivalenceTest,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Values(1, 2, 3),
                                            ::testing::Values("1f1b", "gpipe")),
                         [](const auto& info) {
                           return "D" + std::to_string(std::get<0>(info.param)) + "_P" +
                                  std::to_string(std::get<1>(info.param)) + "_" +
                                  std::get<2>(info.param);
                         });

// The replicas' shares differ (a replica that trained alone on its share
// would not match): one replica's run is not the global batch's run.
TEST(DataParallelEquivalenceTest, OneReplicaAloneDoesNotMatch) {
  TrainConfig c = DataParallelConfig();
  const Dataset data = MakeDataset();
  const RunOutput local = RunLocal(c, data);
  TrainConfig half = c;
  half.batch_size = 6;
  half.micro_batches = 3;
  const RunOutput alone = RunLocal(half, data);
  EXPECT_NE(alone.losses, local.losses);
}

}  // namespace
}  // namespace pipetrain
