#include "coordinator/planner/selective_compression.h"

#include <random>

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

// 1F1B-like: stage 0's backward ends last; its all-reduce and optimizer
// step end the step.
TEST(ChooseCompressedStages, TheLatestUntilComputationBounds) {
  SimulationResult sim;
  sim.events = {Event(0, TimelineEventKind::kBackward, 0, 10),
                Event(1, TimelineEventKind::kBackward, 0, 8),
                Event(2, TimelineEventKind::kBackward, 0, 6),
                Event(0, TimelineEventKind::kAllReduce, 10, 14),
                Event(1, TimelineEventKind::kAllReduce, 8, 12),
                Event(2, TimelineEventKind::kAllReduce, 6, 10),
                Event(0, TimelineEventKind::kOptimizer, 14, 15),
                Event(1, TimelineEventKind::kOptimizer, 12, 13),
                Event(2, TimelineEventKind::kOptimizer, 10, 11)};
  // A quarter: stage 0 ends at 12, stage 1's 13 is then last, compressed
  // to 10; stage 0's 12 ends the step, compressed already.
  EXPECT_EQ(ChooseCompressedStages(sim, {0.25, 0.25, 0.25}), (std::vector<int>{0, 1}));
  // Barely compressible: stage 0 at 14.6 stays last.
  EXPECT_EQ(ChooseCompressedStages(sim, {0.9, 0.9, 0.9}), (std::vector<int>{0}));
  // A stage without gradients (forward passes only) busy until 20 bounds
  // the step: nothing to gain.
  sim.events.push_back(Event(3, TimelineEventKind::kForward, 15, 20));
  EXPECT_TRUE(ChooseCompressedStages(sim, {0.25, 0.25, 0.25}).empty());
  // Incompressible stages are not chosen.
  sim.events.pop_back();
  EXPECT_TRUE(ChooseCompressedStages(sim, {1.0, 0.25, 0.25}).empty());
}

// An overlapped stage: its buckets (3.5 s on the lane) hide behind the
// backward, and it spends 0.5 s at the step (0.2 s waiting for the lane,
// 0.3 s on the tied wte). Compressed, it would all-reduce everything at the
// step: a quarter of the 3.8 s is 0.95 s, more than the 0.5 s now, so it is
// not chosen; a tenth (0.38 s) gains 0.12 s.
TEST(ChooseCompressedStages, OverlappedStageOnlyWhenCompressingBeatsTheWait) {
  SimulationResult sim;
  sim.events = {Event(0, TimelineEventKind::kBackward, 0, 10),
                Event(0, TimelineEventKind::kAllReduceBucket, 6, 9.5),
                Event(0, TimelineEventKind::kAllReduceWait, 10, 10.2),
                Event(0, TimelineEventKind::kAllReduce, 10.2, 10.5),
                Event(0, TimelineEventKind::kOptimizer, 10.5, 11)};
  EXPECT_TRUE(ChooseCompressedStages(sim, {0.25}).empty());
  EXPECT_EQ(ChooseCompressedStages(sim, {0.1}), (std::vector<int>{0}));
}

// Against brute force on random timelines (a worker's end moves with its
// all-reduce): the choice reaches the least step time of any subset.
TEST(ChooseCompressedStages, RandomTimelines_OptimalStepTime) {
  std::mt19937 random(7);
  std::uniform_real_distribution<double> u(0, 10);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + trial % 5;
    SimulationResult sim;
    std::vector<double> fractions, ends, lengths;
    for (int w = 0; w < n; ++w) {
      const double start = u(random), length = u(random), after = u(random) / 5;
      const bool has_all_reduce = random() % 4 != 0;
      sim.events.push_back(Event(w, TimelineEventKind::kBackward, 0, start));
      if (has_all_reduce) {
        sim.events.push_back(Event(w, TimelineEventKind::kAllReduce, start, start + length));
      }
      const double opt_start = start + (has_all_reduce ? length : 0);
      sim.events.push_back(Event(w, TimelineEventKind::kOptimizer, opt_start, opt_start + after));
      ends.push_back(opt_start + after);
      lengths.push_back(has_all_reduce ? length : 0);
      fractions.push_back(std::uniform_real_distribution<double>(0.05, 1.0)(random));
    }
    auto step_of = [&](unsigned mask) {
      double step = 0;
      for (int w = 0; w < n; ++w) {
        step = std::max(step, ends[w] - ((mask >> w & 1) ? (1 - fractions[w]) * lengths[w] : 0));
      }
      return step;
    };
    double best = step_of(0);
    for (unsigned mask = 0; mask < (1u << n); ++mask) best = std::min(best, step_of(mask));
    unsigned chosen = 0;
    for (int w : ChooseCompressedStages(sim, fractions)) chosen |= 1u << w;
    EXPECT_DOUBLE_EQ(step_of(chosen), best) << "trial " << trial;
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

// GPT-2-like shapes: rank 4 sends a few percent of a block's matrices; the
// embedding stage keeps wte whole.
TEST(PowerSgdByteFractions, MatricesShrinkVectorsAndWteDoNot) {
  const GptConfig model = SmallGpt();
  const std::vector<double> f = PowerSgdByteFractions(model, {{0, 1}, {1, 3}, {3, 6}}, 4);
  ASSERT_EQ(f.size(), 3u);
  EXPECT_GT(f[0], 0.75);  // wte (256 x 256) whole, wpe compressed
  EXPECT_LT(f[1], 0.05);  // attention + MLP matrices at rank 4
  EXPECT_GT(f[1], 0.0);
  EXPECT_EQ(PowerSgdByteFractions(model, {{2, 2}}, 4)[0], 1.0);  // no gradients
}

// bf16 halves every value but the tied wte's, which goes exact: a stage
// without the embedding sends exactly half, embed's stage (wte 256 x 256
// exact, wpe 64 x 256 halved) (65536 + 8192) / 81920 of its bytes.
TEST(QuantizerByteFractions, HalvedButTheTiedEmbedding) {
  const GptConfig model = SmallGpt();
  const std::unique_ptr<Codec> bf16 = MakeCodec("bf16").value();
  const std::vector<double> f = QuantizerByteFractions(model, {{0, 1}, {1, 3}, {2, 2}}, *bf16);
  ASSERT_EQ(f.size(), 3u);
  EXPECT_NEAR(f[0], (65536.0 + 8192.0) / 81920.0, 1e-3);
  EXPECT_NEAR(f[1], 0.5, 1e-3);
  EXPECT_EQ(f[2], 1.0);  // no gradients
}

}  // namespace
}  // namespace pipetrain
