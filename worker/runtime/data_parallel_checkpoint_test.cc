// Checkpoints of compressed data-parallel jobs (selective stage
// compression's error feedback, StageRuntime::Snapshot and Restore), in
// one process:
//  - a checkpoint holds every replica's residual of every compressed
//    gradient, and PowerSGD's warm starts;
//  - resumed on its own layout, the job goes on bitwise as the run that
//    never stopped (without the feedback it would not: checked too);
//  - with tensor ranks, the residuals of shards are unsplit in the
//    checkpoint and cut back out on resuming, PowerSGD's warm starts kept
//    per rank;
//  - resumed on another number of replicas, the replicas' residuals are
//    folded (Restore's rule), the replicas still agree bitwise, and the
//    feedback reaches the gradients once;
//  - resumed uncompressed, the residuals go into the exact all-reduce once,
//    on the gRPC collectives and on replica device collectives alike.
#include <algorithm>
#include <cmath>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/planner/partition.h"
#include "gtest/gtest.h"
#include "worker/runtime/data_parallel_testing.h"
#include "worker/runtime/pipeline_testing.h"

namespace pipetrain {
namespace {

using testing::MakeDataset;
using testing::PipelineCheckpoint;
using testing::PipelineExtras;
using testing::RunOutput;
using testing::RunPipeline;

constexpr int kStep = 5;

// 6 micro-batches of 2 sequences (2 or 3 replicas), d_model 64 so that
// PowerSGD of rank 2 pays on the matrices.
TrainConfig CompressedConfig() {
  TrainConfig c = testing::WithClippingAndCosine(testing::SmallConfig());
  c.batch_size = 12;
  c.micro_batches = 6;
  c.model.d_model = 64;
  return c;
}

// 2 replicas of `ranges`, both stages' all-reduce through `quantizer`, a
// snapshot after kStep steps.
PipelineExtras QuantizedReplicas(const std::string& quantizer) {
  PipelineExtras extras;
  extras.replicas = 2;
  extras.dp_quantizer = quantizer;
  extras.dp_compressed_stages = {0, 1};
  extras.snapshot_after = kStep;
  return extras;
}

// The checkpoint without its error feedback (as checkpoints were before).
PipelineCheckpoint WithoutFeedback(PipelineCheckpoint checkpoint) {
  for (auto& [unit, state] : checkpoint.units) state.feedback.clear(), state.warm_q.clear();
  return checkpoint;
}

// Replica 0's error-feedback residual of h.0.attn.c_attn.weight in an
// attention unit's checkpoint state; null when it has none.
const Tensor* CAttnResidual(const UnitState& attention) {
  if (attention.feedback.empty()) return nullptr;
  for (const NamedTensor& e : attention.feedback[0]) {
    if (e.name == "h.0.attn.c_attn.weight") return &e.tensor;
  }
  return nullptr;
}

// sum |a - b| / sum |b| over the elements (same size).
double RelativeL1(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  double diff = 0, size = 0;
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i) {
    diff += std::fabs(double{a[i]} - b[i]);
    size += std::fabs(double{b[i]});
  }
  return size > 0 ? diff / size : 0.0;
}

// `t` ([rows, cols]) with columns [first, first + width) and [second,
// second + width) swapped in every row.
Tensor SwapColumns(const Tensor& t, int64_t first, int64_t second, int64_t width) {
  Tensor out = t.Clone();
  const int64_t rows = t.shape()[0], cols = t.shape()[1];
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < width; ++j) {
      std::swap(out[r * cols + first + j], out[r * cols + second + j]);
    }
  }
  return out;
}

struct Compression {
  std::string name;
  int powersgd_rank = 0;
  std::string quantizer;
  std::vector<int> stages;
  int64_t bucket_bytes = 0;
};

void PrintTo(const Compression& compression, std::ostream* os) { *os << compression.name; }

class DataParallelCheckpointTest : public ::testing::TestWithParam<Compression> {};

TEST_P(DataParallelCheckpointTest, ResumesBitwiseOnItsLayoutWithEveryReplicasFeedback) {
  const Compression& compression = GetParam();
  const TrainConfig c = CompressedConfig();
  const Dataset data = MakeDataset();
  const std::vector<Range> ranges = {{0, 3}, {3, 6}};
  PipelineExtras extras;
  extras.replicas = 2;
  extras.dp_powersgd_rank = compression.powersgd_rank;
  extras.dp_quantizer = compression.quantizer;
  extras.dp_compressed_stages = compression.stages;
  extras.dp_bucket_bytes = compression.bucket_bytes;
  extras.snapshot_after = kStep;
  const RunOutput whole =
      RunPipeline(c, data, ranges, ranges, Schedule::kOneFOneB, nullptr, nullptr, extras);
  ASSERT_EQ(whole.checkpoint.step, kStep);
  ASSERT_EQ(whole.checkpoint.units.size(), 6u);

  // Every unit of a compressed stage holds both replicas' residuals of the
  // same parameters, not all zero; PowerSGD also its warm starts.
  int compressed_units = 0;
  for (const auto& [unit, state] : whole.checkpoint.units) {
    const int stage = unit < 3 ? 0 : 1;
    const bool compressed =
        std::count(compression.stages.begin(), compression.stages.end(), stage) > 0;
    SCOPED_TRACE(unit);
    if (!compressed) {
      EXPECT_TRUE(state.feedback.empty());
      continue;
    }
    ++compressed_units;
    ASSERT_EQ(state.feedback.size(), 2u);
    ASSERT_FALSE(state.feedback[0].empty());
    ASSERT_EQ(state.feedback[1].size(), state.feedback[0].size());
    double magnitude = 0;
    for (size_t i = 0; i < state.feedback[0].size(); ++i) {
      EXPECT_EQ(state.feedback[1][i].name, state.feedback[0][i].name);
      EXPECT_EQ(state.feedback[1][i].tensor.shape(), state.feedback[0][i].tensor.shape());
      // Held once by the writing replica: every residual a view of the one
      // buffer the replicas' feedback was gathered into, not a copy each.
      EXPECT_TRUE(state.feedback[1][i].tensor.SharesStorageWith(state.feedback[0][0].tensor));
      EXPECT_TRUE(state.feedback[0][i].tensor.SharesStorageWith(state.feedback[0][0].tensor));
      for (float x : state.feedback[0][i].tensor.ToVector()) magnitude += std::abs(x);
    }
    EXPECT_GT(magnitude, 0) << "replica 0's residuals are all zero";
    if (compression.powersgd_rank > 0 && unit > 0) {
      EXPECT_FALSE(state.warm_q.empty());
    }
  }
  EXPECT_EQ(compressed_units, 3 * static_cast<int>(compression.stages.size()));

  PipelineExtras resume = extras;
  resume.snapshot_after = 0;
  resume.resume = &whole.checkpoint;
  testing::ExpectResumedMatches(
      c, RunPipeline(c, data, ranges, ranges, Schedule::kOneFOneB, nullptr, nullptr, resume), whole,
      kStep, "resumed with its feedback", /*weights_relative=*/0);

  // What the feedback is worth: without it the resumed run leaves the
  // uninterrupted one.
  const PipelineCheckpoint stripped = WithoutFeedback(whole.checkpoint);
  resume.resume = &stripped;
  const RunOutput forgot =
      RunPipeline(c, data, ranges, ranges, Schedule::kOneFOneB, nullptr, nullptr, resume);
  EXPECT_NE(forgot.weights, whole.weights);
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, DataParallelCheckpointTest,
    ::testing::Values(Compression{"PowerSgdStage0", 2, "", {0}, 0},
                      Compression{"Bf16BothStages", 0, "bf16", {0, 1}, 0},
                      Compression{"Linear8OneUnitBuckets", 0, "linear:bits=8", {0, 1}, 1}),
    [](const auto& info) { return info.param.name; });

// More replicas than StageSetup::max_feedback_replicas (here 1, with 2):
// the checkpoint holds their sum instead, bitwise the two replicas'
// residuals added (what the default keeps separately); resumed on 2
// replicas, replica 0 takes it all.
TEST(DataParallelCheckpointSumTest, BeyondTheBoundOnlyTheSumIsKept) {
  const TrainConfig c = CompressedConfig();
  const Dataset data = MakeDataset();
  const std::vector<Range> ranges = {{0, 3}, {3, 6}};
  PipelineExtras extras = QuantizedReplicas("bf16");
  const RunOutput each =
      RunPipeline(c, data, ranges, ranges, Schedule::kOneFOneB, nullptr, nullptr, extras);
  extras.max_feedback_replicas = 1;
  const RunOutput summed =
      RunPipeline(c, data, ranges, ranges, Schedule::kOneFOneB, nullptr, nullptr, extras);
  EXPECT_EQ(summed.losses, each.losses);  // the bound changes checkpoints only
  for (const auto& [unit, state] : summed.checkpoint.units) {
    SCOPED_TRACE(unit);
    const UnitState& separate = each.checkpoint.units.at(unit);
    ASSERT_EQ(state.feedback.size(), 1u);
    ASSERT_EQ(separate.feedback.size(), 2u);
    ASSERT_EQ(state.feedback[0].size(), separate.feedback[0].size());
    for (size_t i = 0; i < state.feedback[0].size(); ++i) {
      std::vector<float> sum = separate.feedback[0][i].tensor.ToVector();
      const std::vector<float> other = separate.feedback[1][i].tensor.ToVector();
      for (size_t k = 0; k < sum.size(); ++k) sum[k] += other[k];
      EXPECT_EQ(state.feedback[0][i].tensor.ToVector(), sum) << state.feedback[0][i].name;
    }
  }
  PipelineExtras resume = extras;
  resume.snapshot_after = 0;
  resume.resume = &summed.checkpoint;
  const RunOutput resumed =
      RunPipeline(c, data, ranges, ranges, Schedule::kOneFOneB, nullptr, nullptr, resume);
  ASSERT_EQ(resumed.losses.size(), static_cast<size_t>(testing::kIterations - kStep));
  EXPECT_EQ(resumed.losses.front(), each.losses[kStep]);  // the checkpoint's weights
}

// With tensor ranks (2 replicas of 1 stage), 1-D (2 ranks) and 3-D (a
// 2 x 2 x 2 cube), bf16 or PowerSGD on the replicas' all-reduce: each
// rank's residuals of its shards go to replica 0 and are unsplit there as
// the moments are, and PowerSGD's warm starts of split matrices are kept
// per rank; resumed on the layout, each rank cuts its own back out,
// bitwise; resumed on one rank per stage, the unsplit residuals are the
// ranks' shards side by side (and the warm starts of split matrices no
// start).
TEST(DataParallelCheckpointTensorTest, ShardsResidualsUnsplitAndCutBack) {
  for (const auto& [mode, codec] : std::vector<std::pair<std::string, std::string>>{
           {"1d", "bf16"}, {"3d", "bf16"}, {"1d", "powersgd"}, {"3d", "powersgd"}}) {
    SCOPED_TRACE(mode + " " + codec);
    TrainConfig c = CompressedConfig();
    PipelineExtras extras;
    extras.tensor_mode = mode;
    extras.tensor_parallel = 2;
    if (mode == "3d") {
      // The cube's rules (cube_equivalence_test): p^2 = 4 divides d_model
      // and each micro-batch's sequences, 2 heads per cube column.
      c.model.d_model = 32;
      c.model.n_head = 4;
      c.batch_size = 16;
      c.micro_batches = 4;
      extras.tensor_parallel = 8;
    }
    const Dataset data = MakeDataset();
    const std::vector<Range> one = {{0, NumUnits(c.model)}};
    extras.replicas = 2;
    if (codec == "powersgd") {
      extras.dp_powersgd_rank = 2;
    } else {
      extras.dp_quantizer = codec;
    }
    extras.dp_compressed_stages = {0};
    extras.snapshot_after = kStep;
    const RunOutput whole =
        RunPipeline(c, data, one, one, Schedule::kOneFOneB, nullptr, nullptr, extras);
    ASSERT_EQ(whole.checkpoint.units.size(), static_cast<size_t>(NumUnits(c.model)));
    const UnitState& attention = whole.checkpoint.units.at(1);
    ASSERT_EQ(attention.feedback.size(), 2u);
    const Tensor* unsplit = CAttnResidual(attention);
    ASSERT_NE(unsplit, nullptr) << "no residual of c_attn";
    EXPECT_EQ(unsplit->shape(), (Shape{c.model.d_model, 3 * c.model.d_model}));
    if (codec == "bf16") {
      // bf16's residual is elementwise (g - bf16(g)), so the same replicas
      // on one rank leave nearly the same one (their gradients differ in
      // summation order only, and an element near a rounding boundary
      // flips: 1.8 % apart in L1). The unsplit one is nearer it than to
      // it with its q and k blocks swapped, or the two ranks' halves of q
      // swapped (3.8 % and 2.9 % apart with the cube): the ranks' shards
      // gathered in the wrong column order would not be.
      PipelineExtras one_rank = extras;
      one_rank.tensor_parallel = 1;
      one_rank.tensor_mode = "1d";
      const RunOutput single =
          RunPipeline(c, data, one, one, Schedule::kOneFOneB, nullptr, nullptr, one_rank);
      const Tensor* reference = CAttnResidual(single.checkpoint.units.at(1));
      ASSERT_NE(reference, nullptr);
      const int64_t d = c.model.d_model;
      const double apart = RelativeL1(*unsplit, *reference);
      EXPECT_LT(apart, RelativeL1(*unsplit, SwapColumns(*reference, 0, d, d)));
      EXPECT_LT(apart, RelativeL1(*unsplit, SwapColumns(*reference, 0, d / 2, d / 2)));
    }

    PipelineExtras resume = extras;
    resume.snapshot_after = 0;
    resume.resume = &whole.checkpoint;
    testing::ExpectResumedMatches(
        c, RunPipeline(c, data, one, one, Schedule::kOneFOneB, nullptr, nullptr, resume), whole,
        kStep, "resumed on its layout", /*weights_relative=*/0);
    resume.tensor_parallel = 1;
    resume.tensor_mode = "1d";
    const RunOutput ranks_gone =
        RunPipeline(c, data, one, one, Schedule::kOneFOneB, nullptr, nullptr, resume);
    EXPECT_EQ(ranks_gone.losses.size(), static_cast<size_t>(testing::kIterations - kStep));
    // The unsplit residuals were taken in: without them the run differs.
    const PipelineCheckpoint stripped = WithoutFeedback(whole.checkpoint);
    resume.resume = &stripped;
    const RunOutput forgot =
        RunPipeline(c, data, one, one, Schedule::kOneFOneB, nullptr, nullptr, resume);
    EXPECT_NE(forgot.weights, ranks_gone.weights);
  }
}

// Another number of replicas: 2 -> 3 (replica r gets old replica r's
// residuals, replica 2 none) and 2 -> 1 (the one replica gets their sum,
// added to its first step's gradients once, with no all-reduce to carry
// it). The replicas still agree bitwise (RunPipeline checks), and the
// feedback changes the run against the stripped checkpoint's.
TEST(DataParallelCheckpointFoldTest, OtherReplicaCountsKeepTheFeedback) {
  const TrainConfig c = CompressedConfig();
  const Dataset data = MakeDataset();
  const std::vector<Range> ranges = {{0, 3}, {3, 6}};
  PipelineExtras extras = QuantizedReplicas("linear:bits=8");
  const RunOutput whole =
      RunPipeline(c, data, ranges, ranges, Schedule::kOneFOneB, nullptr, nullptr, extras);
  const PipelineCheckpoint stripped = WithoutFeedback(whole.checkpoint);

  for (int replicas : {3, 1}) {
    SCOPED_TRACE(replicas);
    PipelineExtras other;
    other.replicas = replicas;
    if (replicas > 1) {
      other.dp_quantizer = extras.dp_quantizer;
      other.dp_compressed_stages = extras.dp_compressed_stages;
    }
    other.resume = &whole.checkpoint;
    const RunOutput folded =
        RunPipeline(c, data, ranges, ranges, Schedule::kOneFOneB, nullptr, nullptr, other);
    ASSERT_EQ(folded.losses.size(), static_cast<size_t>(testing::kIterations - kStep));
    other.resume = &stripped;
    const RunOutput forgot =
        RunPipeline(c, data, ranges, ranges, Schedule::kOneFOneB, nullptr, nullptr, other);
    // The step after the checkpoint computes the same losses (the weights
    // are the checkpoint's); the update after it differs.
    EXPECT_EQ(folded.losses.front(), forgot.losses.front());
    EXPECT_NE(folded.losses.back(), forgot.losses.back());
    EXPECT_NE(folded.weights, forgot.weights);
  }
}

// The same 2 replicas resumed uncompressed: each replica's restored
// residuals go into its first step's gradients once, before the exact
// all-reduce, on the gRPC collectives and on replica device collectives
// alike (bitwise: two replicas add in either order), and change the run
// against the stripped checkpoint's.
TEST(DataParallelCheckpointFoldTest, ExactResumeFoldsTheFeedbackOnEitherPath) {
  const TrainConfig c = CompressedConfig();
  const Dataset data = MakeDataset();
  const std::vector<Range> ranges = {{0, 3}, {3, 6}};
  const RunOutput whole = RunPipeline(c, data, ranges, ranges, Schedule::kOneFOneB, nullptr,
                                      nullptr, QuantizedReplicas("linear:bits=8"));
  const PipelineCheckpoint stripped = WithoutFeedback(whole.checkpoint);
  PipelineExtras exact;
  exact.replicas = 2;
  exact.resume = &whole.checkpoint;
  const RunOutput grpc =
      RunPipeline(c, data, ranges, ranges, Schedule::kOneFOneB, nullptr, nullptr, exact);
  ASSERT_EQ(grpc.losses.size(), static_cast<size_t>(testing::kIterations - kStep));
  exact.replica_device_collectives = true;
  const RunOutput device =
      RunPipeline(c, data, ranges, ranges, Schedule::kOneFOneB, nullptr, nullptr, exact);
  EXPECT_GT(device.device_sums, 0);
  EXPECT_EQ(device.losses, grpc.losses);
  EXPECT_EQ(device.weights, grpc.weights);
  exact.resume = &stripped;
  const RunOutput forgot =
      RunPipeline(c, data, ranges, ranges, Schedule::kOneFOneB, nullptr, nullptr, exact);
  EXPECT_EQ(device.losses.front(), forgot.losses.front());
  EXPECT_NE(device.losses.back(), forgot.losses.back());
  EXPECT_NE(device.weights, forgot.weights);
}

}  // namespace
}  // namespace pipetrain
