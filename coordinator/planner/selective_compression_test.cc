#include "coordinator/planner/selective_compression.h"

#include <algorithm>
#include <random>

#include "coordinator/planner/schedule_compiler.h"
#include "gtest/gtest.h"
#include "kernels/compress/codec_spec.h"

namespace pipetrain {
namespace {

TimelineEvent Event(int worker, TimelineEventKind kind, double start, double end) {
  TimelineEvent e;
  e.worker = worker;
  e.kind = kind;
  e.start_seconds = start;
  e.end_seconds = end;
  return e;
}

// A synthetic step: worker w computes until ends[w], then (lengths[w] >
// 0) all-reduces for lengths[w], shrunk to fractions[w] of it when
// compressed, then steps for `after` s. Counts its calls in *calls.
struct SyntheticStage {
  double compute_end = 0;
  double all_reduce = 0;  // 0: none (no gradients)
  double after = 0;
};

CompressedStepSimulator Synthetic(const std::vector<SyntheticStage>& stages,
                                  const std::vector<double>& fractions, int* calls = nullptr) {
  return [=](const std::vector<int>& compressed) -> absl::StatusOr<SimulationResult> {
    if (calls != nullptr) ++*calls;
    SimulationResult sim;
    for (int w = 0; w < static_cast<int>(stages.size()); ++w) {
      const SyntheticStage& s = stages[w];
      const bool shrunk = std::find(compressed.begin(), compressed.end(), w) != compressed.end();
      const double length = s.all_reduce * (shrunk ? fractions[w] : 1.0);
      sim.events.push_back(Event(w, TimelineEventKind::kBackward, 0, s.compute_end));
      if (s.all_reduce > 0) {
        sim.events.push_back(
            Event(w, TimelineEventKind::kAllReduce, s.compute_end, s.compute_end + length));
      }
      const double end = s.compute_end + (s.all_reduce > 0 ? length : 0);
      sim.events.push_back(Event(w, TimelineEventKind::kOptimizer, end, end + s.after));
      sim.iteration_seconds = std::max(sim.iteration_seconds, end + s.after);
    }
    return sim;
  };
}

std::vector<int> Choose(const std::vector<SyntheticStage>& stages,
                        const std::vector<double>& fractions) {
  return ChooseCompressedStages(Synthetic(stages, fractions), fractions).value().stages;
}

// 1F1B-like: stage 0's backward ends last; its all-reduce and optimizer
// step end the step.
TEST(ChooseCompressedStages, TheLatestUntilComputationBounds) {
  std::vector<SyntheticStage> stages = {{10, 4, 1}, {8, 4, 1}, {6, 4, 1}};
  // A quarter: stage 0 ends at 12, stage 1's 13 is then last, compressed
  // to 10; stage 0's 12 ends the step, compressed already.
  EXPECT_EQ(Choose(stages, {0.25, 0.25, 0.25}), (std::vector<int>{0, 1}));
  const CompressedStages chosen =
      ChooseCompressedStages(Synthetic(stages, {0.25, 0.25, 0.25}), {0.25, 0.25, 0.25}).value();
  EXPECT_EQ(chosen.simulation.iteration_seconds, 12);  // the step with both compressed
  // Barely compressible: stage 0 at 14.6 stays last.
  EXPECT_EQ(Choose(stages, {0.9, 0.9, 0.9}), (std::vector<int>{0}));
  // A stage without gradients (forward passes only) busy until 20 bounds
  // the step: nothing to gain, and nothing simulated beyond the first step.
  stages.push_back({20, 0, 0});
  int calls = 0;
  EXPECT_TRUE(ChooseCompressedStages(Synthetic(stages, {0.25, 0.25, 0.25, 1}, &calls),
                                     {0.25, 0.25, 0.25, 1})
                  .value()
                  .stages.empty());
  EXPECT_EQ(calls, 1);
  // Incompressible stages are not chosen.
  stages.pop_back();
  EXPECT_TRUE(Choose(stages, {1.0, 0.25, 0.25}).empty());
  // The simulator's errors come back.
  EXPECT_EQ(ChooseCompressedStages(
                [](const std::vector<int>&) -> absl::StatusOr<SimulationResult> {
                  return absl::InternalError("boom");
                },
                {0.5})
                .status()
                .message(),
            "boom");
}

// With the real simulator: one stage whose 2000 B of block gradients go in
// two overlapped buckets during the last backward. On a 1000 B/s link they
// end before the step, which only all-reduces the tied wte: compressing
// would buy nothing, so nothing is chosen. On a 250 B/s link the step
// waits 5 s for them: compressed to a tenth, they hide, and the stage is
// chosen.
TEST(ChooseCompressedStages, OverlappedStageOnlyWhenItsAllReduceIsExposed) {
  const std::vector<v1::Program> programs =
      CompilePrograms({{0, 4}}, 4, 1, Schedule::kGPipe).value();
  SimulationCosts costs;
  costs.units = {{0.5, 1, 0, 100}, {0.5, 2, 0, 1000}, {0.5, 2, 0, 1000}, {0.5, 1, 0, 100}};
  costs.tied_grad_bytes = 100;
  costs.worker_speeds = {1};
  costs.data_parallel = 2;
  costs.all_reduce_bucket_bytes = 1000;
  auto simulate = [&](const std::vector<int>& stages) {
    SimulationCosts trial = costs;
    trial.all_reduce_byte_fraction = {stages.empty() ? 1.0 : 0.1};
    return SimulateIteration(programs, trial);
  };
  costs.replica_link = {1000, 0};
  CompressedStages chosen = ChooseCompressedStages(simulate, {0.1}).value();
  EXPECT_TRUE(chosen.stages.empty());
  EXPECT_DOUBLE_EQ(chosen.simulation.iteration_seconds, 8 + 0.1);
  costs.replica_link = {250, 0};
  chosen = ChooseCompressedStages(simulate, {0.1}).value();
  EXPECT_EQ(chosen.stages, (std::vector<int>{0}));
  EXPECT_DOUBLE_EQ(chosen.simulation.iteration_seconds, 8 + 0.4);
}

// A stage is compressed only for a gain of at least kMinCompressionGain of
// the step: one that would shorten a 15 s step by 1 % is left exact, one
// that shortens it by 3 % is compressed.
TEST(ChooseCompressedStages, TooSmallAGainLeavesTheStageExact) {
  const std::vector<SyntheticStage> stages = {{10, 4, 1}, {8, 1, 1}};
  // 15 -> 14.85 and 15 -> 14.55.
  EXPECT_TRUE(Choose(stages, {1 - 0.15 / 4, 1}).empty());
  EXPECT_EQ(Choose(stages, {1 - 0.45 / 4, 1}), (std::vector<int>{0}));
  // Without the margin, any gain.
  EXPECT_EQ(ChooseCompressedStages(Synthetic(stages, {1 - 0.15 / 4, 1}), {1 - 0.15 / 4, 1}, 0)
                .value()
                .stages,
            (std::vector<int>{0}));
}

// Against brute force on random timelines (a worker's end moves with its
// all-reduce): without a margin the choice reaches the least step time of
// any subset; with one, it is within the margin of its own step time of
// it, and every stage it compresses gained at least that.
TEST(ChooseCompressedStages, RandomTimelines_OptimalStepTime) {
  std::mt19937 random(7);
  std::uniform_real_distribution<double> u(0, 10);
  for (int trial = 0; trial < 600; ++trial) {
    const double margin = trial % 2 == 0 ? 0.0 : 0.05;
    const int n = 1 + trial / 2 % 5;
    std::vector<SyntheticStage> stages;
    std::vector<double> fractions;
    for (int w = 0; w < n; ++w) {
      const double start = u(random), length = u(random), after = u(random) / 5;
      const bool has_all_reduce = random() % 4 != 0;
      stages.push_back({start, has_all_reduce ? length : 0, after});
      fractions.push_back(std::uniform_real_distribution<double>(0.05, 1.0)(random));
    }
    const CompressedStepSimulator simulate = Synthetic(stages, fractions);
    auto step_of = [&](unsigned mask) {
      std::vector<int> compressed;
      for (int w = 0; w < n; ++w) {
        if (mask >> w & 1) compressed.push_back(w);
      }
      return simulate(compressed).value().iteration_seconds;
    };
    double best = step_of(0);
    for (unsigned mask = 0; mask < (1u << n); ++mask) best = std::min(best, step_of(mask));
    const CompressedStages chosen = ChooseCompressedStages(simulate, fractions, margin).value();
    unsigned mask = 0;
    for (int w : chosen.stages) mask |= 1u << w;
    if (margin == 0) {
      EXPECT_DOUBLE_EQ(step_of(mask), best) << "trial " << trial;
    } else {
      EXPECT_LE(step_of(mask) - best, margin * step_of(mask)) << "trial " << trial;
      for (int w : chosen.stages) {  // each one's own end moved by the margin of a step
        const SyntheticStage& st = stages[w];
        const double saved = st.all_reduce * (1 - fractions[w]);
        EXPECT_GE(saved, margin * step_of(mask)) << "trial " << trial << " stage " << w;
      }
    }
    EXPECT_EQ(chosen.simulation.iteration_seconds, step_of(mask)) << "trial " << trial;
  }
}

// 2 layers of d_model 256, a vocabulary of 256 (wte 256 x 256), 64
// positions (wpe 64 x 256).
GptConfig SmallGpt() {
  GptConfig model;
  model.n_layer = 2;
  model.n_head = 4;
  model.d_model = 256;
  model.vocab_size = 256;
  model.max_seq_len = 64;
  return model;
}

// GPT-2-like shapes: rank 4 sends a few percent of a block's matrices;
// the tied wte is outside the fraction (it goes whole), so the embedding
// stage's is wpe's alone.
TEST(PowerSgdByteFractions, MatricesShrinkVectorsAndWteDoNot) {
  const GptConfig model = SmallGpt();
  const std::vector<double> f = PowerSgdByteFractions(model, {{0, 1}, {1, 3}, {3, 6}}, 4, 1);
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0], 4.0 * (64 + 256) / (64 * 256));  // wpe (64 x 256) at rank 4
  EXPECT_LT(f[1], 0.05);                           // attention + MLP matrices at rank 4
  EXPECT_GT(f[1], 0.0);
  EXPECT_EQ(PowerSgdByteFractions(model, {{2, 2}}, 4, 1)[0], 1.0);  // no gradients
}

// With T = 4 tensor ranks each rank compresses its own shards (d 64, rank
// 16): c_attn [64, 48] and the MLP's [64, 64] send r (rows + cols), more
// than a quarter of the whole matrix's, and attn.c_proj's row shard
// [16, 64] (16 x 80 >= 1024 values) goes whole. LayerNorms and the
// projections' biases are whole on every rank; c_attn's and c_fc's biases
// are split. Priced on whole matrices the shares are far smaller.
TEST(PowerSgdByteFractions, TensorRanks_PricedOnEachRanksShards) {
  GptConfig model;
  model.n_layer = 2;
  model.n_head = 4;
  model.d_model = 64;
  model.vocab_size = 256;
  model.max_seq_len = 64;
  const std::vector<Range> attn_and_mlp = {{1, 2}, {2, 3}};
  const std::vector<double> f = PowerSgdByteFractions(model, attn_and_mlp, 16, 4);
  ASSERT_EQ(f.size(), 2u);
  // attn_0: ln_1 128, c_attn [64, 48] 3072 as 16 x 112, its bias 48,
  // c_proj [16, 64] 1024 whole, its bias 64.
  EXPECT_EQ(f[0], (128.0 + 16 * 112 + 48 + 1024 + 64) / (128 + 3072 + 48 + 1024 + 64));
  // mlp_0: ln_2 128, c_fc [64, 64] 4096 as 16 x 128, its bias 64, c_proj
  // [64, 64] 4096 as 16 x 128, its bias 64.
  EXPECT_EQ(f[1], (128.0 + 16 * 128 + 64 + 16 * 128 + 64) / (128 + 4096 + 64 + 4096 + 64));
  // The whole matrices' shares, 1 tensor rank: c_attn [64, 192] as
  // 16 x 256, c_proj [64, 64] as 16 x 128; c_fc and the MLP's c_proj as
  // 16 x 320.
  const std::vector<double> whole = PowerSgdByteFractions(model, attn_and_mlp, 16, 1);
  EXPECT_EQ(whole[0], (128.0 + 16 * 256 + 192 + 16 * 128 + 64) / (128 + 12288 + 192 + 4096 + 64));
  EXPECT_EQ(whole[1], (128.0 + 16 * 320 + 256 + 16 * 320 + 64) / (128 + 16384 + 256 + 16384 + 64));
  EXPECT_GT(f[0], 1.5 * whole[0]);
  EXPECT_GT(f[1], 1.5 * whole[1]);
}

// bf16 halves every value but the tied wte's, which goes exact and is
// outside the fraction: every stage sends half of the rest (embed's: wpe,
// 64 x 256), a payload header more.
TEST(QuantizerByteFractions, HalvedButTheTiedEmbedding) {
  const GptConfig model = SmallGpt();
  const std::unique_ptr<Codec> bf16 = MakeCodec("bf16").value();
  const std::vector<double> f = QuantizerByteFractions(model, {{0, 1}, {1, 3}, {2, 2}}, *bf16);
  ASSERT_EQ(f.size(), 3u);
  EXPECT_NEAR(f[0], 0.5, 1e-3);
  EXPECT_NEAR(f[1], 0.5, 1e-3);
  EXPECT_EQ(f[2], 1.0);  // no gradients
}

// A head stage of a d_model 4 model holds ln_f's 8 values: fp16's header
// outweighs them ((22 + 16) / 32 > 1), and a fraction above 1, which the
// simulator refuses, failed the plan of a spec naming that stage.
TEST(QuantizerByteFractions, HeaderOutweighingTheValues_CountedAsRaw) {
  GptConfig model;
  model.n_layer = 1;
  model.n_head = 1;
  model.d_model = 4;
  model.vocab_size = 16;
  model.max_seq_len = 8;
  const std::unique_ptr<Codec> fp16 = MakeCodec("fp16").value();
  ASSERT_GT(fp16->EncodedBytes(Shape{8, 1}), 32);
  EXPECT_EQ(QuantizerByteFractions(model, {{3, 4}}, *fp16)[0], 1.0);  // unit 3: the head
}

}  // namespace
}  // namespace pipetrain
