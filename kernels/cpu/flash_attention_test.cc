// The flash attention twin (flash_attention.h) against attention.h on the
// same bf16-exact inputs: the tolerances the GPU kernels are held to
// (kernels/cuda/flash_attention_test.cc) hold for the algorithm itself, at
// every shape the GPU test uses, with the worst error printed.
#include "kernels/cpu/flash_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/flash_attention_testing.h"

namespace pipetrain {
namespace {

using testing::Bf16Normal;
using testing::WorstRatio;

struct AttentionShape {
  int batch, seq_len, c, heads;
};

// lse in double from the same bf16-exact scores.
std::vector<float> LogSumExp(const std::vector<float>& qkv, const AttentionShape& s) {
  const int hd = s.c / s.heads;
  std::vector<float> lse;
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.heads; ++h) {
      for (int t = 0; t < s.seq_len; ++t) {
        const float* q = qkv.data() + (int64_t{b} * s.seq_len + t) * 3 * s.c + h * hd;
        std::vector<double> x;
        for (int j = 0; j <= t; ++j) {
          const float* k = qkv.data() + (int64_t{b} * s.seq_len + j) * 3 * s.c + s.c + h * hd;
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += double{q[d]} * k[d];
          x.push_back(dot / std::sqrt(double{hd}));
        }
        const double m = *std::max_element(x.begin(), x.end());
        double sum = 0;
        for (double v : x) sum += std::exp(v - m);
        lse.push_back(static_cast<float>(m + std::log(sum)));
      }
    }
  }
  return lse;
}

TEST(FlashAttentionTwinTest, Shapes_WithinTheGpuTolerancesOfAttention) {
  // The GPU test's shapes: head_dim 4 to 128 (padded ones included),
  // seq_len 1 to 1024, one and several key tiles.
  const AttentionShape shapes[] = {{1, 1, 8, 2},    {2, 7, 24, 3},    {1, 33, 64, 1},
                                   {2, 129, 96, 4}, {1, 300, 128, 2}, {1, 1024, 768, 12},
                                   {2, 65, 256, 2}, {1, 70, 200, 2},  {3, 128, 48, 3}};
  for (const AttentionShape& s : shapes) {
    const std::string name = "[b " + std::to_string(s.batch) + ", t " + std::to_string(s.seq_len) +
                             ", c " + std::to_string(s.c) + ", h " + std::to_string(s.heads) + "]";
    SCOPED_TRACE(name);
    const int64_t qkv_n = int64_t{s.batch} * s.seq_len * 3 * s.c;
    const int64_t out_n = int64_t{s.batch} * s.seq_len * s.c;
    const std::vector<float> qkv = Bf16Normal(80, qkv_n), dout = Bf16Normal(81, out_n);
    std::vector<float> want_out(out_n), want_dqkv(qkv_n);
    std::vector<float> probs(int64_t{s.batch} * s.heads * s.seq_len * s.seq_len);
    std::vector<float> scratch(int64_t{s.seq_len} * s.seq_len);
    AttentionForward(qkv.data(), s.batch, s.seq_len, s.c, s.heads, want_out.data(), probs.data());
    AttentionBackward(qkv.data(), probs.data(), dout.data(), s.batch, s.seq_len, s.c, s.heads,
                      want_dqkv.data(), scratch.data());
    std::vector<float> out(out_n, NAN), dqkv(qkv_n, NAN);
    std::vector<float> lse(int64_t{s.batch} * s.heads * s.seq_len, NAN);
    FlashAttentionForward(qkv.data(), s.batch, s.seq_len, s.c, s.heads, out.data(), lse.data());
    FlashAttentionBackward(qkv.data(), out.data(), lse.data(), dout.data(), s.batch, s.seq_len, s.c,
                           s.heads, dqkv.data());
    const double out_ratio = WorstRatio(out, want_out, kFlashOutAtol, kFlashRtol);
    const double lse_ratio = WorstRatio(lse, LogSumExp(qkv, s), kFlashLseAtol, 0);
    const double grad_ratio = WorstRatio(dqkv, want_dqkv, kFlashGradAtol, kFlashRtol);
    EXPECT_LE(out_ratio, 1.0);
    EXPECT_LE(lse_ratio, 1.0);
    EXPECT_LE(grad_ratio, 1.0);
    std::printf("%-28s worst error / tolerance: out %.3f, lse %.3f, dqkv %.3f\n", name.c_str(),
                out_ratio, lse_ratio, grad_ratio);
  }
}

// out's error stays within what the bf16 rounding of P allows, on one key
// tile and several (200 keys: four tiles, three rescalings): the online
// softmax adds nothing beyond fp32 noise.
TEST(FlashAttentionTwinTest, OneTileAndSeveral_ErrorsComeFromTheRoundingOnly) {
  const AttentionShape s = {1, 200, 64, 2};
  const int64_t qkv_n = int64_t{s.batch} * s.seq_len * 3 * s.c;
  const int64_t out_n = int64_t{s.batch} * s.seq_len * s.c;
  const std::vector<float> qkv = Bf16Normal(90, qkv_n);
  std::vector<float> want(out_n), probs(int64_t{s.heads} * s.seq_len * s.seq_len);
  AttentionForward(qkv.data(), s.batch, s.seq_len, s.c, s.heads, want.data(), probs.data());
  std::vector<float> out(out_n), lse(int64_t{s.heads} * s.seq_len);
  FlashAttentionForward(qkv.data(), s.batch, s.seq_len, s.c, s.heads, out.data(), lse.data());
  // P rounds to bf16 (2^-9 relative) and l sums the rounded values, so out
  // is a convex mix whose weights move by at most 2^-8 relative: for every
  // row, |out - want| <= 2^-8 max_j |v_j| (+ fp32 and FastExp noise).
  const int hd = s.c / s.heads;
  for (int h = 0; h < s.heads; ++h) {
    float vmax = 0;
    for (int t = 0; t < s.seq_len; ++t) {
      for (int d = 0; d < hd; ++d) {
        vmax = std::max(vmax, std::fabs(qkv[t * 3 * s.c + 2 * s.c + h * hd + d]));
      }
    }
    for (int t = 0; t < s.seq_len; ++t) {
      for (int d = 0; d < hd; ++d) {
        const int64_t i = int64_t{t} * s.c + h * hd + d;
        ASSERT_LE(std::fabs(out[i] - want[i]), std::ldexp(vmax, -8) + 1e-5f)
            << "head " << h << " t " << t << " d " << d;
      }
    }
  }
}

TEST(FlashAttentionTwinTest, RoundToBf16_NearestEven) {
  EXPECT_EQ(RoundToBf16(1.0f), 1.0f);
  EXPECT_EQ(RoundToBf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);  // a tie: to even
  EXPECT_EQ(RoundToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(RoundToBf16(1.0f + std::ldexp(1.0f, -7)), 1.0f + std::ldexp(1.0f, -7));
  EXPECT_EQ(RoundToBf16(-2.5f), -2.5f);
  EXPECT_EQ(RoundToBf16(3.4e38f), INFINITY);  // beyond bf16's largest finite value
  EXPECT_EQ(RoundToBf16(-3.4e38f), -INFINITY);
  // NaN stays NaN, as the GPU's rounding keeps it (kernels/cuda/bf16_round.h).
  EXPECT_TRUE(std::isnan(RoundToBf16(NAN)));
  EXPECT_TRUE(std::isnan(RoundToBf16(-NAN)));
}

}  // namespace
}  // namespace pipetrain
