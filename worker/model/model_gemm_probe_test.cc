#include "worker/model/model_gemm_probe.h"

#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/model/cpu_backend.h"

namespace pipetrain {
namespace {

// On the CPU at a tiny shape: the 10 products in order, their FLOP counts
// (2 n in out forward, twice that backward; the head over the unpadded
// vocabulary) and a positive time each.
TEST(ModelGemmProbeTest, TinyModelOnCpu_TenProductsWithTheirFlops) {
  GptConfig config;
  config.d_model = 16;
  config.n_head = 2;
  config.n_layer = 1;
  config.max_seq_len = 8;
  config.vocab_size = 37;
  const int n = 24;
  const std::vector<ModelGemmTiming> rows = MeasureModelGemms(CpuBackend(), config, n, 2);
  ASSERT_EQ(rows.size(), 10u);
  const std::vector<std::string> names = {"attn.c_attn forward",     "attn.c_attn backward",
                                          "attn.c_proj forward",     "attn.c_proj backward",
                                          "mlp.c_fc forward + GELU", "mlp.c_fc backward",
                                          "mlp.c_proj forward",      "mlp.c_proj backward",
                                          "lm_head forward",         "lm_head backward"};
  const double d = 16, V = 37;
  const std::vector<double> flops = {
      2 * n * d * 3 * d, 4 * n * d * 3 * d, 2 * n * d * d,     4 * n * d * d, 2 * n * d * 4 * d,
      4 * n * d * 4 * d, 2 * n * 4 * d * d, 4 * n * 4 * d * d, 2 * n * d * V, 4 * n * d * V};
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].name, names[i]);
    EXPECT_EQ(rows[i].flops, flops[i]) << names[i];
    EXPECT_TRUE(std::isfinite(rows[i].seconds) && rows[i].seconds > 0) << names[i];
  }
  EXPECT_EQ(rows[2].shape, "24 x 16 -> 16");
  EXPECT_EQ(rows[8].shape, "24 x 16 -> 37 (rows of 37)");
}

}  // namespace
}  // namespace pipetrain
