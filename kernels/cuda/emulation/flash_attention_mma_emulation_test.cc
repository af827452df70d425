// The mma.sync flash attention kernels (flash_attention_mma_kernels.cuh),
// their own source run on the CPU through warp_emulation.h, against the
// CPU reference attention (kernels/cpu/attention.h, the tolerances the GPU
// parity test holds them to) and against the CPU twin of the flash
// algorithm (kernels/cpu/flash_attention.h, the same roundings: closer
// still). A wrong index, stride, mask, fragment element or tile shows here
// as errors of order 0.1-1, and every output starts as NaN and the shared
// memory as NaN bytes, so an element never written or a tile read before
// it is loaded fails too. What only a GPU can show (limits, timing, the
// tensor cores' own summation order) is left to kernels/cuda's
// flash_attention_test.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/flash_attention.h"
#include "kernels/cpu/flash_attention_testing.h"
#include "kernels/cuda/emulation/warp_emulation.h"
#include "kernels/cuda/flash_attention_mma_kernels.cuh"

namespace pipetrain {
namespace {

using cuda_emulation::LaunchEmulated;
using testing::Bf16Normal;
using testing::WorstRatio;

// Against the twin (same inputs, tiles and bf16 roundings; fp32 sums in
// another order): |got - want| <= atol + rtol |want|. The sums' order moves
// out and dqkv by fp32 noise, and now and then tips a P or dS element to
// the neighbouring bf16 (2^-8 relative of a weight): worst seen 2e-4, a
// tenth of the GPU test's bounds against attention.h. lse = m + log l sums
// l over up to 1024 keys (fp32, about 2e-5 relative): worst seen 3.5e-5.
constexpr double kTwinAtol = 1e-3, kTwinRtol = 1e-3, kTwinLseAtol = 2e-4;

struct Shape {
  int batch, seq_len, c, heads;
  int64_t qkv_size() const { return int64_t{batch} * seq_len * 3 * c; }
  int64_t out_size() const { return int64_t{batch} * seq_len * c; }
  int64_t rows() const { return int64_t{batch} * heads * seq_len; }
  std::string Name() const {
    return "[b " + std::to_string(batch) + ", t " + std::to_string(seq_len) + ", c " +
           std::to_string(c) + ", h " + std::to_string(heads) + "]";
  }
};

struct Result {
  std::vector<float> out, lse, dqkv;
};

// The three kernels for head_dim padded to kHdp, launched as
// flash_attention_mma.cu launches them, with D = rowsum(dout * out) in
// between as flash_attention.cu's RowDotsKernel computes it.
template <int kHdp>
Result RunEmulated(const Shape& s, const std::vector<float>& qkv, const std::vector<float>& dout) {
  const int hd = s.c / s.heads, tiles = flash_tiles::Tiles(s.seq_len);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));  // as flash_attention_mma.cu
  const unsigned heads_total = static_cast<unsigned>(s.batch * s.heads);
  Result r;
  r.out.assign(s.out_size(), NAN);
  r.lse.assign(s.rows(), NAN);
  r.dqkv.assign(s.qkv_size(), NAN);
  LaunchEmulated(heads_total, tiles, flash_tiles::kThreads, ForwardSharedBytes<kHdp>(), [&] {
    MmaForwardKernel<kHdp>(qkv.data(), s.seq_len, s.c, s.heads, hd, scale, r.out.data(),
                           r.lse.data());
  });
  std::vector<float> dots(s.rows(), NAN);
  for (int64_t row = 0; row < s.rows(); ++row) {
    const int t = static_cast<int>(row % s.seq_len);
    const int64_t bh = row / s.seq_len, b = bh / s.heads, h = bh % s.heads;
    const int64_t at = (b * s.seq_len + t) * s.c + h * hd;
    float sum = 0.0f;
    for (int d = 0; d < hd; ++d) sum += r.out[at + d] * dout[at + d];
    dots[row] = sum;
  }
  LaunchEmulated(heads_total, tiles, flash_tiles::kThreads, KeyGradSharedBytes<kHdp>(), [&] {
    MmaKeyGradKernel<kHdp>(qkv.data(), dout.data(), r.lse.data(), dots.data(), s.seq_len, s.c,
                           s.heads, hd, scale, tiles, r.dqkv.data());
  });
  LaunchEmulated(heads_total, tiles, flash_tiles::kThreads, QueryGradSharedBytes<kHdp>(), [&] {
    MmaQueryGradKernel<kHdp>(qkv.data(), dout.data(), r.lse.data(), dots.data(), s.seq_len, s.c,
                             s.heads, hd, scale, r.dqkv.data());
  });
  return r;
}

Result RunEmulatedAnyHeadDim(const Shape& s, const std::vector<float>& qkv,
                             const std::vector<float>& dout) {
  Result r;
  const absl::Status done = flash_tiles::WithPaddedHeadDim(s.c / s.heads, [&](auto hdp) {
    r = RunEmulated<decltype(hdp)::value>(s, qkv, dout);
    return absl::OkStatus();
  });
  EXPECT_TRUE(done.ok()) << done;
  return r;
}

class FlashMmaEmulationTest : public ::testing::TestWithParam<Shape> {};

// kernels/cuda/flash_attention_test.cc's shapes, GPT-2's with one head of
// its twelve (all twelve would take minutes here), plus padded heads
// (40 -> 48, 60 -> 64, 72 -> 80, 100 -> 112) and ragged last tiles:
// head_dim 4 to 128, every padded width the kernels are built for, seq_len
// 1 to 1024, one to sixteen key tiles. Every head_dim but the last shape's
// (10) is a multiple of 4, so LoadTile takes 16-byte loads; the last takes
// its one-value path.
INSTANTIATE_TEST_SUITE_P(Shapes, FlashMmaEmulationTest,
                         ::testing::Values(Shape{1, 1, 8, 2}, Shape{2, 7, 24, 3},
                                           Shape{1, 33, 64, 1}, Shape{2, 129, 96, 4},
                                           Shape{1, 300, 128, 2}, Shape{2, 65, 256, 2},
                                           Shape{1, 70, 200, 2}, Shape{3, 128, 48, 3},
                                           Shape{1, 100, 120, 2}, Shape{1, 1024, 64, 1},
                                           Shape{1, 70, 120, 3}, Shape{2, 65, 144, 2},
                                           Shape{1, 100, 192, 2}, Shape{2, 37, 30, 3}));

TEST_P(FlashMmaEmulationTest, WithinTheGpuBoundsOfAttention_AndCloseToTheCpuTwin) {
  const Shape s = GetParam();
  const std::vector<float> qkv = Bf16Normal(80, s.qkv_size()), dout = Bf16Normal(81, s.out_size());
  const Result got = RunEmulatedAnyHeadDim(s, qkv, dout);

  // The reference attention in fp32: the GPU test's bounds.
  std::vector<float> want_out(s.out_size()), want_dqkv(s.qkv_size());
  std::vector<float> probs(s.rows() * s.seq_len), scratch(int64_t{s.seq_len} * s.seq_len);
  AttentionForward(qkv.data(), s.batch, s.seq_len, s.c, s.heads, want_out.data(), probs.data());
  AttentionBackward(qkv.data(), probs.data(), dout.data(), s.batch, s.seq_len, s.c, s.heads,
                    want_dqkv.data(), scratch.data());
  const double out_ratio = WorstRatio(got.out, want_out, kFlashOutAtol, kFlashRtol);
  const double grad_ratio = WorstRatio(got.dqkv, want_dqkv, kFlashGradAtol, kFlashRtol);
  EXPECT_LE(out_ratio, 1.0) << "out against attention.h";
  EXPECT_LE(grad_ratio, 1.0) << "dqkv against attention.h";

  // The twin: the same tiles and roundings, summed in another order.
  std::vector<float> twin_out(s.out_size()), twin_lse(s.rows()), twin_dqkv(s.qkv_size());
  FlashAttentionForward(qkv.data(), s.batch, s.seq_len, s.c, s.heads, twin_out.data(),
                        twin_lse.data());
  FlashAttentionBackward(qkv.data(), twin_out.data(), twin_lse.data(), dout.data(), s.batch,
                         s.seq_len, s.c, s.heads, twin_dqkv.data());
  const double twin_out_ratio = WorstRatio(got.out, twin_out, kTwinAtol, kTwinRtol);
  const double twin_lse_ratio = WorstRatio(got.lse, twin_lse, kTwinLseAtol, 0);
  const double twin_grad_ratio = WorstRatio(got.dqkv, twin_dqkv, kTwinAtol, kTwinRtol);
  EXPECT_LE(twin_out_ratio, 1.0) << "out against the twin";
  EXPECT_LE(twin_lse_ratio, 1.0) << "lse against the twin";
  EXPECT_LE(twin_grad_ratio, 1.0) << "dqkv against the twin";
  std::printf(
      "%-28s worst error / bound: against attention.h out %.3f, dqkv %.3f; against the twin "
      "out %.3f, lse %.3f, dqkv %.3f\n",
      s.Name().c_str(), out_ratio, grad_ratio, twin_out_ratio, twin_lse_ratio, twin_grad_ratio);
}

}  // namespace
}  // namespace pipetrain
