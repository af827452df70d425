// DESIGN.md §4 in one process: pipelines of 1-4 stages, uniform and
// pipedream partitions, Bi-Partition plans whose forward and backward cuts
// differ (recompute, input routing, weight sync), 1F1B and GPipe schedules,
// must reproduce the single-process trainer's losses and weights. With the tied-gradient rule
// (unit.h) and backward passes visiting micro-batches in order, they agree
// bitwise, so the test demands exact equality. Validation passes (every 4
// steps and after the last, over 7 windows: micro-batches of 2, 2, 2 and 1)
// must equal LocalTrainer::Evaluate bitwise too.
#include "coordinator/planner/partition.h"
#include "coordinator/planner/schedule_compiler.h"
#include "gtest/gtest.h"
#include "worker/runtime/pipeline_testing.h"

namespace pipetrain {
namespace {

using testing::kIterations;
using testing::MakeDataset;
using testing::RunLocal;
using testing::RunOutput;
using testing::RunPipeline;
using testing::SmallConfig;

class PipelineEquivalenceTest
    : public ::testing::TestWithParam<std::tuple<int, std::string, std::string>> {};

TEST_P(PipelineEquivalenceTest, LossesAndWeightsEqualSingleProcessBitwise) {
  const auto& [stages, solver, schedule_name] = GetParam();
  const TrainConfig c = SmallConfig();
  const Dataset data = MakeDataset();
  const int units = NumUnits(c.model);
  auto ranges = solver == "uniform"
                    ? UniformPartition(units, stages)
                    : PipeDreamPartition(AnalyticUnitCosts(c.model, c.seq_len, 2), stages);
  ASSERT_TRUE(ranges.ok()) << ranges.status();
  const RunOutput local = RunLocal(c, data);
  const RunOutput pipe =
      RunPipeline(c, data, *ranges, *ranges, ParseSchedule(schedule_name).value());
  EXPECT_EQ(pipe.losses, local.losses);
  EXPECT_EQ(pipe.val_losses, local.val_losses);
  EXPECT_EQ(pipe.val_losses.size(), 3u);  // after steps 4, 8 and 10
  ASSERT_EQ(pipe.weights.size(), local.weights.size());
  for (const auto& [name, values] : local.weights) {
    EXPECT_EQ(pipe.weights.at(name), values) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllShapes, PipelineEquivalenceTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Values("uniform", "pipedream"),
                       ::testing::Values("1f1b", "gpipe")),
    [](const auto& info) {
      return "P" + std::to_string(std::get<0>(info.param)) + "_" + std::get<1>(info.param) +
             "_" + std::get<2>(info.param);
    });

// A stage holds an activation only until its last reader: a sent forward
// output goes after its send, a received input after the forward pass that
// reads it (the unit's stash keeps what the backward pass needs). So with
// uniform cuts no stage holds more than one micro-batch's activation,
// however many micro-batches are in flight (GPipe: all 4), which is what
// the planner's memory model assumes (bipartition.h).
TEST(PipelineActivationMemoryTest, StagesHoldOneMicroBatchActivationAtATime) {
  const TrainConfig c = SmallConfig();
  const Dataset data = MakeDataset();
  const int64_t one_activation = int64_t{c.batch_size / c.micro_batches} * c.seq_len *
                                 c.model.d_model * static_cast<int64_t>(sizeof(float));
  testing::PipelineExtras two_steps;
  two_steps.iterations = 2;
  for (const std::string schedule : {"1f1b", "gpipe"}) {
    for (int stages : {2, 3}) {
      auto ranges = UniformPartition(NumUnits(c.model), stages);
      ASSERT_TRUE(ranges.ok()) << ranges.status();
      const RunOutput pipe = RunPipeline(c, data, *ranges, *ranges, ParseSchedule(schedule).value(),
                                         nullptr, nullptr, two_steps);
      ASSERT_EQ(pipe.activation_bytes_peak.size(), static_cast<size_t>(stages));
      for (int s = 0; s < stages; ++s) {
        EXPECT_EQ(pipe.activation_bytes_peak[s], one_activation)
            << schedule << ", " << stages << " stages, stage " << s;
      }
    }
  }
}

// Bi-Partition plans on the 6-unit model (embed, attn0, mlp0, attn1, mlp1,
// head), each with forward and backward cuts that differ.
struct BiPlan {
  std::string name;
  std::vector<Range> forward, backward;
};

void PrintTo(const BiPlan& plan, std::ostream* os) { *os << plan.name; }

std::vector<BiPlan> BiPlans() {
  return {
      // The paper's shape: backward cut before the forward cut.
      {"P3_BackwardCutFirst", {{0, 1}, {1, 4}, {4, 6}}, {{0, 2}, {2, 4}, {4, 6}}},
      // Forward cut first: worker 1 recomputes [1, 3) from unit 0's output.
      {"P3_ForwardCutFirst", {{0, 3}, {3, 5}, {5, 6}}, {{0, 1}, {1, 5}, {5, 6}}},
      // Worker 1 runs backward passes only, all recomputed.
      {"P3_BackwardOnlyWorker", {{0, 2}, {2, 2}, {2, 6}}, {{0, 1}, {1, 4}, {4, 6}}},
      // Worker 3 runs head's forward only; worker 2 recomputes head.
      {"P4_ForwardOnlyHead", {{0, 1}, {1, 3}, {3, 5}, {5, 6}}, {{0, 2}, {2, 3}, {3, 6}, {6, 6}}},
      {"P4_Staggered", {{0, 2}, {2, 3}, {3, 4}, {4, 6}}, {{0, 1}, {1, 3}, {3, 5}, {5, 6}}},
      // Worker 0 runs every forward pass, the others only backward passes.
      {"P4_AllForwardOnOne", {{0, 6}, {6, 6}, {6, 6}, {6, 6}}, {{0, 1}, {1, 3}, {3, 5}, {5, 6}}},
  };
}

class BiPartitionEquivalenceTest
    : public ::testing::TestWithParam<std::tuple<BiPlan, std::string>> {};

TEST_P(BiPartitionEquivalenceTest, LossesAndWeightsEqualSingleProcessBitwise) {
  const auto& [plan, schedule_name] = GetParam();
  const TrainConfig c = SmallConfig();
  const Dataset data = MakeDataset();
  ASSERT_NE(plan.forward, plan.backward);
  const RunOutput local = RunLocal(c, data);
  const RunOutput pipe =
      RunPipeline(c, data, plan.forward, plan.backward, ParseSchedule(schedule_name).value());
  EXPECT_EQ(pipe.losses, local.losses);
  EXPECT_EQ(pipe.val_losses, local.val_losses);
  EXPECT_EQ(pipe.val_losses.size(), 3u);  // after steps 4, 8 and 10
  ASSERT_EQ(pipe.weights.size(), local.weights.size());
  for (const auto& [name, values] : local.weights) {
    EXPECT_EQ(pipe.weights.at(name), values) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, BiPartitionEquivalenceTest,
                         ::testing::Combine(::testing::ValuesIn(BiPlans()),
                                            ::testing::Values("1f1b", "gpipe")),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_" + std::get<1>(info.param);
                         });

// Gradient clipping by the global norm and a warm-up + cosine schedule:
// the stages exchange their parameters' squared sums and add them in the
// model's order (grad_clip.h), so even these stay bitwise train-local's.
// The clip threshold is low enough that every step clips.
class ClippedScheduleEquivalenceTest
    : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(ClippedScheduleEquivalenceTest, LossesAndWeightsEqualSingleProcessBitwise) {
  const auto& [stages, schedule_name] = GetParam();
  TrainConfig c = SmallConfig();
  c.grad_clip = 0.05f;
  c.lr_schedule = LrSchedule::kCosine;
  c.warmup_steps = 3;
  c.min_lr = c.adam.lr / 10;
  const Dataset data = MakeDataset();
  const RunOutput local = RunLocal(c, data);
  // Clipping changed the run (against one without it).
  TrainConfig unclipped = c;
  unclipped.grad_clip = 0;
  EXPECT_NE(RunLocal(unclipped, data).losses, local.losses);
  auto ranges = UniformPartition(NumUnits(c.model), stages);
  ASSERT_TRUE(ranges.ok()) << ranges.status();
  const RunOutput pipe =
      RunPipeline(c, data, *ranges, *ranges, ParseSchedule(schedule_name).value());
  EXPECT_EQ(pipe.losses, local.losses);
  for (const auto& [name, values] : local.weights) {
    EXPECT_EQ(pipe.weights.at(name), values) << name;
  }
  // And a Bi-Partition plan (forward-only and backward-only units).
  for (const BiPlan& plan : BiPlans()) {
    if (static_cast<int>(plan.forward.size()) != stages) continue;
    const RunOutput bi =
        RunPipeline(c, data, plan.forward, plan.backward, ParseSchedule(schedule_name).value());
    EXPECT_EQ(bi.losses, local.losses) << plan.name;
    for (const auto& [name, values] : local.weights) {
      EXPECT_EQ(bi.weights.at(name), values) << plan.name << " " << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, ClippedScheduleEquivalenceTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values("1f1b", "gpipe")),
                         [](const auto& info) {
                           return "P" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::get<1>(info.param);
                         });

// The same options across a checkpoint (docs/api.md: a lossless plain
// pipeline resumes bitwise): 2 uniform stages snapshot after step 6, in
// the cosine decay past the warm-up, and 3 stages (uniform, and a
// Bi-Partition plan) restore it. Restore must put the schedule at the
// checkpoint's optimizer step, and the validation passes after steps 8 and
// 10 run on resumed weights, so losses, validation losses and final
// weights must all be train-local's bitwise.
TEST(ClippedScheduleResumeTest, Restore_TwoStageCheckpointOnThreeStages_EqualsLocalBitwise) {
  TrainConfig c = testing::WithClippingAndCosine(SmallConfig());
  c.steps = kIterations;  // the cosine spans the run: each step's rate differs
  const Dataset data = MakeDataset();
  const RunOutput local = RunLocal(c, data);
  constexpr int kStep = 6;
  ASSERT_EQ(local.val_losses.size(), 3u);  // after steps 4, 8 and 10
  const std::vector<Range> two = UniformPartition(NumUnits(c.model), 2).value();
  testing::PipelineExtras snapshot;
  snapshot.snapshot_after = kStep;
  const RunOutput whole =
      RunPipeline(c, data, two, two, Schedule::kOneFOneB, nullptr, nullptr, snapshot);
  EXPECT_EQ(whole.losses, local.losses);
  EXPECT_EQ(whole.val_losses, local.val_losses);
  EXPECT_EQ(whole.weights, local.weights);
  ASSERT_EQ(whole.checkpoint.step, kStep);
  ASSERT_EQ(whole.checkpoint.optimizer_steps, kStep);
  ASSERT_EQ(whole.checkpoint.units.size(), static_cast<size_t>(NumUnits(c.model)));

  testing::PipelineExtras resume;
  resume.resume = &whole.checkpoint;
  const std::vector<Range> three = UniformPartition(NumUnits(c.model), 3).value();
  for (const std::string schedule : {"1f1b", "gpipe"}) {
    const RunOutput resumed = RunPipeline(c, data, three, three, ParseSchedule(schedule).value(),
                                          nullptr, nullptr, resume);
    testing::ExpectResumedMatches(c, resumed, local, kStep, "P2 resumed on P3 " + schedule,
                                  /*weights_relative=*/0);
  }
  const BiPlan plan = BiPlans()[0];  // P3_BackwardCutFirst
  const RunOutput bi = RunPipeline(c, data, plan.forward, plan.backward, Schedule::kOneFOneB,
                                   nullptr, nullptr, resume);
  testing::ExpectResumedMatches(c, bi, local, kStep, "P2 resumed on " + plan.name,
                                /*weights_relative=*/0);
}

}  // namespace
}  // namespace pipetrain
