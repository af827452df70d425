// Checkpoints of jobs whose pipeline links go through PowerSGD
// (spec.compression.forward/backward): each link's warm start Q is the
// only state a compressed link carries from step to step (residuals are
// flushed within a step), and StageRuntime::Snapshot keeps it
// (UnitState::link_warm_q), every replica's. Resumed on its own layout the
// job goes on bitwise as the run that never stopped; without the warm
// starts it would not (checked too, so the test can fail).
#include <string>
#include <vector>

#include "coordinator/planner/partition.h"
#include "gtest/gtest.h"
#include "worker/runtime/pipeline_testing.h"

namespace pipetrain {
namespace {

using testing::MakeDataset;
using testing::PipelineCheckpoint;
using testing::PipelineExtras;
using testing::RunOutput;
using testing::RunPipeline;

constexpr int kStep = 5;

struct Layout {
  std::string name;
  int replicas = 1;
  int tensor_parallel = 1;
  std::string forward_codec, backward_codec;
};

void PrintTo(const Layout& layout, std::ostream* os) { *os << layout.name; }

class LinkCheckpointTest : public ::testing::TestWithParam<Layout> {};

TEST_P(LinkCheckpointTest, WarmStartsKept_ResumesBitwise) {
  const Layout& layout = GetParam();
  TrainConfig c = testing::SmallConfig();
  c.batch_size = 8;
  c.micro_batches = 4;
  const Dataset data = MakeDataset();
  const std::vector<Range> ranges = {{0, 2}, {2, 4}, {4, 6}};
  PipelineExtras extras;
  extras.replicas = layout.replicas;
  extras.tensor_parallel = layout.tensor_parallel;
  extras.forward_codec = layout.forward_codec;
  extras.backward_codec = layout.backward_codec;
  extras.snapshot_after = kStep;
  const RunOutput whole =
      RunPipeline(c, data, ranges, ranges, Schedule::kOneFOneB, nullptr, nullptr, extras);
  ASSERT_EQ(whole.checkpoint.step, kStep);

  // Each stage's first backward unit holds its compressed links' warm
  // starts, one per replica: stage 0 sends activations, stage 2 gradients,
  // stage 1 both.
  const int forward = layout.forward_codec.empty() ? 0 : 1;
  const int backward = layout.backward_codec.empty() ? 0 : 1;
  const std::vector<int> sent = {forward, forward + backward, backward};
  for (int stage = 0; stage < 3; ++stage) {
    SCOPED_TRACE(stage);
    const UnitState& state = whole.checkpoint.units.at(2 * stage);
    EXPECT_EQ(state.link_warm_q.size(), static_cast<size_t>(sent[stage] * layout.replicas));
    for (const LinkWarmStart& link : state.link_warm_q) {
      EXPECT_LT(link.replica, layout.replicas);
      EXPECT_EQ(link.q.shape(), (Shape{c.model.d_model, 2}));  // [cols, rank 2]
    }
    EXPECT_TRUE(whole.checkpoint.units.at(2 * stage + 1).link_warm_q.empty());
  }

  PipelineExtras resume = extras;
  resume.snapshot_after = 0;
  resume.resume = &whole.checkpoint;
  testing::ExpectResumedMatches(
      c, RunPipeline(c, data, ranges, ranges, Schedule::kOneFOneB, nullptr, nullptr, resume), whole,
      kStep, "resumed with its links' warm starts", /*weights_relative=*/0);

  // Without them the links start from PowerSGD's fixed Q and the run
  // leaves the uninterrupted one.
  PipelineCheckpoint stripped = whole.checkpoint;
  for (auto& [unit, state] : stripped.units) state.link_warm_q.clear();
  resume.resume = &stripped;
  const RunOutput cold =
      RunPipeline(c, data, ranges, ranges, Schedule::kOneFOneB, nullptr, nullptr, resume);
  EXPECT_NE(cold.weights, whole.weights);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, LinkCheckpointTest,
    ::testing::Values(Layout{"ForwardAndBackward", 1, 1, "powersgd:rank=2", "powersgd:rank=2"},
                      Layout{"BackwardOnly", 1, 1, "", "powersgd:rank=2"},
                      Layout{"TwoReplicas", 2, 1, "powersgd:rank=2", "powersgd:rank=2"},
                      Layout{"TwoTensorRanks", 1, 2, "token_topk:keep=0.5+powersgd:rank=2",
                             "powersgd:rank=2"}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace pipetrain
