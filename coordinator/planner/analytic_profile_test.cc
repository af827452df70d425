// AnalyticProfile (solve_plan.h): the saved attention state and the extra
// backward work of a flash-style kernel, against hand-computed sizes.
#include "coordinator/planner/solve_plan.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

GptConfig Gpt2Small() {
  GptConfig config;
  config.n_layer = 2;
  config.n_head = 12;
  config.d_model = 768;
  config.vocab_size = 50257;
  config.max_seq_len = 1024;
  return config;
}

TEST(AnalyticProfileTest, Flash_RowStatisticsInsteadOfProbabilities_ScoresRecomputed) {
  const GptConfig config = Gpt2Small();
  const double flops = 1e12;
  const ModelProfile probs = AnalyticProfile(config, 1024, 2, flops);
  const ModelProfile flash = AnalyticProfile(config, 1024, 2, flops, AnalyticAttention::kCudaFlash);
  ASSERT_EQ(probs.units.size(), flash.units.size());
  const double rows = 2.0 * 12 * 1024;  // batch x heads x tokens
  for (size_t u = 0; u < probs.units.size(); ++u) {
    SCOPED_TRACE(probs.units[u].name);
    const UnitProfile& p = probs.units[u];
    const UnitProfile& f = flash.units[u];
    EXPECT_EQ(f.fwd_seconds, p.fwd_seconds);
    EXPECT_EQ(f.weight_bytes, p.weight_bytes);
    EXPECT_EQ(f.activation_bytes, p.activation_bytes);
    if (p.name.rfind("attn_", 0) != 0) {
      EXPECT_EQ(f.stash_bytes, p.stash_bytes);
      EXPECT_EQ(f.bwd_seconds, p.bwd_seconds);
      continue;
    }
    // [2, 12, 1024, 1024] probabilities give way to [2, 12, 1024] floats.
    EXPECT_DOUBLE_EQ(p.stash_bytes - f.stash_bytes, 4 * rows * (1024 - 1));
    // QK^T again in backward: 2 x (2 x 1024 tokens) x 1024 x 768 FLOPs.
    const double recompute = 2.0 * 2048 * 1024 * 768 / flops;
    EXPECT_NEAR(f.bwd_seconds - p.bwd_seconds, recompute, 1e-12 * p.bwd_seconds);
  }
}

// What a pass allocates beyond its stash, in floats, as the CPU backend's
// units do (unit_profiler_test measures the same on a small model).
TEST(AnalyticProfileTest, TransientBytes_EachUnitsPassBeyondItsStash) {
  const GptConfig config = Gpt2Small();
  const ModelProfile profile = AnalyticProfile(config, 1024, 2, 1e12);
  const double bt = 2.0 * 1024, d = 768, x = 4 * bt * d;
  ASSERT_EQ(profile.units.size(), 6u);
  EXPECT_EQ(profile.units[0].transient_bytes, x);                          // embed: its output
  EXPECT_EQ(profile.units[1].transient_bytes, 7 * x + 4.0 * 1024 * 1024);  // attn_0
  EXPECT_EQ(profile.units[2].transient_bytes, 7 * x);                      // mlp_0
  // The head's [B·T, vocab] logit gradient: as large as the probabilities
  // it stashes, 0.41 GB here.
  EXPECT_EQ(profile.units[5].transient_bytes, 4 * bt * 50257 + 2 * x);
  EXPECT_GT(profile.units[5].transient_bytes, 0.5 * profile.units[5].stash_bytes);
}

// The backward's scratch of an attention unit by backend: the CPU's one
// [T, T] matrix, the CUDA GEMM path's dS of every (batch, head), a flash
// kernel's row dots; the other units' passes are the same.
TEST(AnalyticProfileTest, TransientBytes_AttentionScratchByBackend) {
  const GptConfig config = Gpt2Small();
  const ModelProfile cpu = AnalyticProfile(config, 1024, 2, 1e12);
  const ModelProfile gemm = AnalyticProfile(config, 1024, 2, 1e12, AnalyticAttention::kCudaGemm);
  const ModelProfile flash = AnalyticProfile(config, 1024, 2, 1e12, AnalyticAttention::kCudaFlash);
  const double bt = 2.0 * 1024, d = 768, x = 4 * bt * d, rows = 2.0 * 12 * 1024;
  EXPECT_EQ(cpu.units[1].transient_bytes, 7 * x + 4.0 * 1024 * 1024);
  EXPECT_EQ(gemm.units[1].transient_bytes, 7 * x + 4 * rows * 1024);  // 201 MB of dS
  EXPECT_EQ(flash.units[1].transient_bytes, 7 * x + 4 * rows);
  EXPECT_EQ(gemm.units[1].stash_bytes, cpu.units[1].stash_bytes);
  for (size_t u : {size_t{0}, size_t{2}, size_t{5}}) {
    EXPECT_EQ(gemm.units[u].transient_bytes, cpu.units[u].transient_bytes) << cpu.units[u].name;
    EXPECT_EQ(flash.units[u].transient_bytes, cpu.units[u].transient_bytes) << cpu.units[u].name;
  }
}

TEST(AnalyticProfileTest, Flash_HeadsWiderThanTheKernelTakes_KeepProbabilities) {
  GptConfig config = Gpt2Small();
  config.n_head = 3;  // 256-dim heads: the CUDA backend falls back
  const ModelProfile probs = AnalyticProfile(config, 1024, 2, 1e12);
  const ModelProfile flash = AnalyticProfile(config, 1024, 2, 1e12, AnalyticAttention::kCudaFlash);
  for (size_t u = 0; u < probs.units.size(); ++u) {
    EXPECT_EQ(flash.units[u].stash_bytes, probs.units[u].stash_bytes) << probs.units[u].name;
    EXPECT_EQ(flash.units[u].bwd_seconds, probs.units[u].bwd_seconds) << probs.units[u].name;
  }
}

}  // namespace
}  // namespace pipetrain
