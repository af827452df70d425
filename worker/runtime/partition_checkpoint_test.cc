// Checkpoints of tensor-parallel stages that measure their AccTFM partition
// counts (PartitionTuner, spec.parallelism.tensor_partitions 0): each stage
// records the counts it kept with its first backward unit
// (UnitState::tuned_partitions), every replica and tensor rank of it having
// kept the same, and the stage resumed on the same layout runs them at
// once instead of measuring again. The candidates cut a micro-batch
// differently, so they round differently (the ring all-reduce's chunks
// fall elsewhere): measuring again would leave the run that never stopped,
// which is checked too, so the test can fail.
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/planner/partition.h"
#include "gtest/gtest.h"
#include "worker/checkpoint/unit_checkpoint.h"
#include "worker/runtime/pipeline_testing.h"

namespace pipetrain {
namespace {

using testing::MakeDataset;
using testing::PipelineCheckpoint;
using testing::PipelineExtras;
using testing::RunOutput;
using testing::RunPipeline;

// After the tuning (1 warm-up step and 3 candidates of 1 step each).
constexpr int kStep = 6;

struct Layout {
  std::string name;
  int replicas = 1;
  int tensor_parallel = 1;
  std::vector<Range> forward, backward;
};

void PrintTo(const Layout& layout, std::ostream* os) { *os << layout.name; }

// `checkpoint` written as stages write it (WriteStageCheckpoint, under
// TEST_TMPDIR) and read back as a resuming worker reads it
// (ReadUnitCheckpoint, with moments for every unit: each is some stage's
// backward unit).
PipelineCheckpoint ThroughFiles(const PipelineCheckpoint& checkpoint, const GptConfig& model,
                                const std::string& name) {
  const std::string root = std::getenv("TEST_TMPDIR");
  const CheckpointIdentity identity{"job-tuned", model, 1};
  StageSnapshot snapshot{checkpoint.step, checkpoint.optimizer_steps, {}};
  for (const auto& [unit, state] : checkpoint.units) snapshot.units.push_back(state);
  const std::string dir = "ckpt-" + name;
  absl::StatusOr<std::vector<v1::UnitFile>> files =
      WriteStageCheckpoint(root, dir, snapshot, identity);
  EXPECT_TRUE(files.ok()) << files.status();
  PipelineCheckpoint out{checkpoint.step, checkpoint.optimizer_steps, {}};
  if (!files.ok()) return out;
  v1::ResumeFrom from;
  from.set_step(checkpoint.step);
  from.set_dir(dir + "/" + StepDirName(checkpoint.step));
  for (const v1::UnitFile& file : *files) {
    absl::StatusOr<UnitState> read =
        ReadUnitCheckpoint(root, from, file, identity, /*with_moments=*/true, nullptr);
    EXPECT_TRUE(read.ok()) << read.status();
    if (read.ok()) out.units[file.unit()] = *std::move(read);
  }
  return out;
}

class PartitionCheckpointTest : public ::testing::TestWithParam<Layout> {};

TEST_P(PartitionCheckpointTest, KeptCountsRecorded_ResumesBitwise) {
  const Layout& layout = GetParam();
  TrainConfig c = testing::SmallConfig();  // micro-batches of 2 samples
  c.model.n_head = 4;                      // split by 2 and 4
  const Dataset data = MakeDataset();
  const int stages = static_cast<int>(layout.forward.size());
  PipelineExtras extras;
  extras.replicas = layout.replicas;
  extras.tensor_parallel = layout.tensor_parallel;
  // Units embed, attn_0, mlp_0, attn_1, mlp_1, head: unlike uniform 1 and
  // 2, so three candidates (uniform 4 runs as 2 on 2 samples).
  extras.tensor_partitions_forward = {1, 2, 1, 1, 2, 1};
  extras.tensor_partitions_backward = {1, 1, 2, 2, 1, 1};
  extras.tensor_partition_tune_steps = 1;
  extras.snapshot_after = kStep;
  const RunOutput whole = RunPipeline(c, data, layout.forward, layout.backward, Schedule::kOneFOneB,
                                      nullptr, nullptr, extras);
  ASSERT_EQ(whole.checkpoint.step, kStep);

  // Every runtime of a stage (its replicas and tensor ranks) ran the same
  // counts at the end, and the stage's first backward unit records them
  // with the layout they were measured on.
  const int tp = layout.tensor_parallel;
  ASSERT_EQ(whole.last_partitions.size(), static_cast<size_t>(layout.replicas * stages * tp));
  // A stage tunes only the block units (1-4) whose forward and backward
  // both run on it (PartitionTuner); one with none keeps the plan's counts
  // and records nothing.
  const auto tunes = [&](int s) {
    for (int u = 1; u <= 4; ++u) {
      if (layout.forward[s].begin <= u && u < layout.forward[s].end &&
          layout.backward[s].begin <= u && u < layout.backward[s].end) {
        return true;
      }
    }
    return false;
  };
  for (int s = 0; s < stages; ++s) {
    SCOPED_TRACE(s);
    const std::map<std::string, std::pair<int, int>>& ran = whole.last_partitions[s * tp];
    EXPECT_EQ(ran.empty(), !tunes(s));
    for (int r = 0; r < layout.replicas; ++r) {
      for (int t = 0; t < tp; ++t) {
        EXPECT_EQ(whole.last_partitions[(r * stages + s) * tp + t], ran)
            << "replica " << r << ", tensor rank " << t;
      }
    }
    const Range& backward = layout.backward[s];
    if (backward.begin == backward.end) continue;
    for (int u = backward.begin; u < backward.end; ++u) {
      EXPECT_EQ(whole.checkpoint.units.at(u).tuned_partitions.has_value(),
                tunes(s) && u == backward.begin)
          << "unit " << u;
    }
    if (!tunes(s)) continue;
    const std::optional<TunedPartitions>& tuned =
        whole.checkpoint.units.at(backward.begin).tuned_partitions;
    ASSERT_TRUE(tuned.has_value());
    EXPECT_EQ(tuned->tensor_parallel, tp);
    EXPECT_EQ(tuned->samples, c.batch_size / c.micro_batches);
    EXPECT_EQ(std::make_pair(tuned->forward_begin, tuned->forward_end),
              std::make_pair(layout.forward[s].begin, layout.forward[s].end));
    EXPECT_EQ(std::make_pair(tuned->backward_begin, tuned->backward_end),
              std::make_pair(backward.begin, backward.end));
    // The counts the stage's block units ran after the checkpoint.
    const std::vector<std::string> names = {"", "attn_0", "mlp_0", "attn_1", "mlp_1", ""};
    for (const auto& [unit, counts] : ran) {
      int u = 0;
      while (u < static_cast<int>(names.size()) && names[u] != unit) ++u;
      ASSERT_LT(u, static_cast<int>(names.size())) << unit;
      EXPECT_EQ(std::make_pair(tuned->forward[u], tuned->backward[u]), counts) << unit;
      // Only the units tuned are reported: both passes run on this stage.
      EXPECT_TRUE(layout.forward[s].begin <= u && u < layout.forward[s].end &&
                  layout.backward[s].begin <= u && u < layout.backward[s].end)
          << unit;
    }
  }

  // Resumed from the files a worker would write and read.
  const PipelineCheckpoint on_disk = ThroughFiles(whole.checkpoint, c.model, layout.name);
  for (int s = 0; s < stages; ++s) {
    const Range& backward = layout.backward[s];
    if (backward.begin == backward.end) continue;
    ASSERT_TRUE(on_disk.units.at(backward.begin).tuned_partitions ==
                whole.checkpoint.units.at(backward.begin).tuned_partitions)
        << "stage " << s;
  }
  PipelineExtras resume = extras;
  resume.snapshot_after = 0;
  resume.resume = &on_disk;
  testing::ExpectResumedMatches(c,
                                RunPipeline(c, data, layout.forward, layout.backward,
                                            Schedule::kOneFOneB, nullptr, nullptr, resume),
                                whole, kStep, "resumed with its kept counts",
                                /*weights_relative=*/0);

  // Without the record the stages measure again, running the other
  // candidates for a step each, and the run leaves the one that never
  // stopped.
  PipelineCheckpoint stripped = whole.checkpoint;
  for (auto& [unit, state] : stripped.units) state.tuned_partitions.reset();
  resume.resume = &stripped;
  const RunOutput measured_again = RunPipeline(c, data, layout.forward, layout.backward,
                                               Schedule::kOneFOneB, nullptr, nullptr, resume);
  EXPECT_NE(measured_again.weights, whole.weights);

  // A record measured on another layout (other samples per micro-batch,
  // tensor ranks or units), or holding counts the units would not run as
  // they are (4 on 2 samples), is not taken: the stages measure again.
  const std::vector<std::pair<std::string, std::function<void(TunedPartitions&)>>> others = {
      {"samples", [](TunedPartitions& t) { t.samples = 4; }},
      {"tensor ranks", [](TunedPartitions& t) { t.tensor_parallel *= 2; }},
      {"units", [](TunedPartitions& t) { ++t.forward_begin; }},
      {"not as run", [](TunedPartitions& t) { t.forward[1] = 4; }},
  };
  for (const auto& [what, change] : others) {
    SCOPED_TRACE(what);
    PipelineCheckpoint other = whole.checkpoint;
    for (auto& [unit, state] : other.units) {
      if (state.tuned_partitions.has_value()) change(*state.tuned_partitions);
    }
    resume.resume = &other;
    const RunOutput again = RunPipeline(c, data, layout.forward, layout.backward,
                                        Schedule::kOneFOneB, nullptr, nullptr, resume);
    EXPECT_NE(again.weights, whole.weights);
    // Every count reported is one that ran: at most 2 on 2 samples.
    for (const auto& ran : again.last_partitions) {
      for (const auto& [unit, counts] : ran) {
        EXPECT_LE(std::max(counts.first, counts.second), 2) << unit;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PartitionCheckpointTest,
    ::testing::Values(Layout{"FourTensorRanks", 1, 4, {{0, 3}, {3, 6}}, {{0, 3}, {3, 6}}},
                      Layout{"TwoReplicasOfTwoRanks", 2, 2, {{0, 3}, {3, 6}}, {{0, 3}, {3, 6}}},
                      // Bi-Partition: stage 1 runs no forward pass (it
                      // recomputes units 1-3) and stage 0 no block unit's
                      // backward: neither tunes. Stage 2 tunes mlp_1 (unit
                      // 4) alone; its counts go with unit 4.
                      Layout{
                          "BiPartition", 1, 4, {{0, 2}, {2, 2}, {2, 6}}, {{0, 1}, {1, 4}, {4, 6}}}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace pipetrain
