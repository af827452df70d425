// Flash-style attention (flash_attention.h) against the CPU reference
// (kernels/cpu/attention.cc) run on the same inputs rounded to bf16.
//
// Tolerances: with q, k, v and dout already bf16 on both sides, the
// products' inputs agree exactly and S differs only by summation order
// (~1e-6). What remains is the kernel's rounding of P (forward) and of P
// and dS (backward) to bf16, 2^-9 relative per element: out is a convex mix
// of v's rows whose weights move by at most ~2^-8 relative, so |error| <=
// 2^-8 max|v| (~0.016 for N(0, 1) at seq_len 1024; far less on average);
// the gradients' sums of such terms likewise. lse's error is log(1 +
// 2^-9) at most. A wrong stride, a missed mask or head, or a lost tile
// shows up as errors of order 0.1-1, well above these bounds, and every
// output starts as NaN, so an element never written fails too. The CPU
// twin (kernels/cpu/flash_attention.h) meets these bounds with about 2x to
// spare at every shape here. Every case runs both kernels (FlashKernel);
// the kWmma ones have passed on an H200, the kMma ones not yet run on a
// GPU (their source meets these bounds on the CPU, through
// kernels/cuda/emulation's flash_attention_mma_emulation_test).
#include "kernels/cuda/flash_attention.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/flash_attention.h"
#include "kernels/cuda/attention_testing.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/parity_testing.h"

namespace pipetrain {
namespace {

using testing::AllClose;
using testing::NaNBuffer;
using testing::RandomNormal;
using Shape = testing::AttentionShape;

// The bounds the CPU twin (kernels/cpu/flash_attention.h) meets at these
// shapes with about 2x to spare (kernels/cpu:flash_attention_test).
constexpr float kOutAtol = kFlashOutAtol;
constexpr float kGradAtol = kFlashGradAtol;
constexpr float kLseAtol = kFlashLseAtol;
constexpr float kRtol = kFlashRtol;

std::vector<float> Bf16Normal(uint64_t seed, int64_t n) {
  std::vector<float> v = RandomNormal(seed, n, 0.0f, 1.0f);
  for (float& x : v) x = RoundToBf16(x);
  return v;
}

// The CPU reference, and each row's log-sum-exp in double from the same
// scaled scores: lse[b, h, t] = log sum_{j <= t} exp(q_t . k_j / sqrt(hd)).
struct CpuResult {
  std::vector<float> out, dqkv, lse;
};

CpuResult RunCpu(const Shape& s, const std::vector<float>& qkv, const std::vector<float>& dout) {
  CpuResult r;
  r.out.resize(s.out_size());
  r.dqkv.resize(s.qkv_size());
  std::vector<float> probs(s.probs_size());
  std::vector<float> scratch(static_cast<size_t>(s.seq_len) * s.seq_len);
  AttentionForward(qkv.data(), s.batch, s.seq_len, s.c, s.heads, r.out.data(), probs.data());
  AttentionBackward(qkv.data(), probs.data(), dout.data(), s.batch, s.seq_len, s.c, s.heads,
                    r.dqkv.data(), scratch.data());
  const int hd = s.c / s.heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.heads; ++h) {
      for (int t = 0; t < s.seq_len; ++t) {
        const float* q = qkv.data() + (int64_t{b} * s.seq_len + t) * 3 * s.c + h * hd;
        std::vector<double> x(t + 1);
        double m = -INFINITY;
        for (int j = 0; j <= t; ++j) {
          const float* k = qkv.data() + (int64_t{b} * s.seq_len + j) * 3 * s.c + s.c + h * hd;
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += double{q[d]} * k[d];
          x[j] = dot * scale;
          m = std::max(m, x[j]);
        }
        double sum = 0;
        for (double v : x) sum += std::exp(v - m);
        r.lse.push_back(static_cast<float>(m + std::log(sum)));
      }
    }
  }
  return r;
}

struct GpuResult {
  std::vector<float> out, lse, dqkv;
};

GpuResult RunGpu(FlashKernel kernel, const Shape& s, const std::vector<float>& qkv,
                 const std::vector<float>& dout) {
  GpuResult r;
  const int64_t rows = int64_t{s.batch} * s.heads * s.seq_len;
  auto qkv_d = DeviceBuffer<float>::FromHost(qkv);
  auto dout_d = DeviceBuffer<float>::FromHost(dout);
  auto out_d = NaNBuffer(s.out_size());
  auto lse_d = NaNBuffer(rows);
  auto dqkv_d = NaNBuffer(s.qkv_size());
  auto dots_d = NaNBuffer(rows);
  const bool ready =
      qkv_d.ok() && dout_d.ok() && out_d.ok() && lse_d.ok() && dqkv_d.ok() && dots_d.ok();
  EXPECT_TRUE(ready);
  if (!ready) return r;
  absl::Status run = FlashAttentionForwardCuda(qkv_d->data(), s.batch, s.seq_len, s.c, s.heads,
                                               out_d->data(), lse_d->data(), nullptr, kernel);
  EXPECT_TRUE(run.ok()) << run;
  run = FlashAttentionBackwardCuda(qkv_d->data(), out_d->data(), lse_d->data(), dout_d->data(),
                                   s.batch, s.seq_len, s.c, s.heads, dqkv_d->data(), dots_d->data(),
                                   nullptr, kernel);
  EXPECT_TRUE(run.ok()) << run;
  // A kernel's fault shows at the first synchronisation, here: a failed
  // download fails the test (an empty result would compare equal to
  // another empty one in TwoRuns_BitwiseEqual).
  for (auto [buffer, into] :
       {std::pair{&*out_d, &r.out}, std::pair{&*lse_d, &r.lse}, std::pair{&*dqkv_d, &r.dqkv}}) {
    absl::StatusOr<std::vector<float>> host = buffer->ToHost();
    EXPECT_TRUE(host.ok()) << host.status();
    if (host.ok()) *into = *std::move(host);
  }
  return r;
}

// attention_testing.h's shapes (head_dim 4, 8, 24, 64; seq_len 1 to 1024),
// plus the widest head (128), one padded to 112 (100), and seq_len just
// past a 64-row tile; then one head_dim for each other padded width the
// mma kernels are built for (40 -> 48, 60 -> 64, 72 -> 80, 96), so every
// instantiation runs; and head_dim 10, the only one not a multiple of 4,
// whose tiles the mma kernels load one value at a time (LoadTile).
std::vector<Shape> FlashShapes() {
  std::vector<Shape> shapes(std::begin(testing::kAttentionShapes),
                            std::end(testing::kAttentionShapes));
  shapes.push_back({2, 65, 256, 2});
  shapes.push_back({1, 70, 200, 2});
  shapes.push_back({3, 128, 48, 3});
  shapes.push_back({1, 70, 120, 3});
  shapes.push_back({1, 100, 120, 2});
  shapes.push_back({2, 65, 144, 2});
  shapes.push_back({1, 100, 192, 2});
  shapes.push_back({2, 37, 30, 3});
  return shapes;
}

// Each case runs both kernels (FlashKernel) against the same references.
class FlashAttentionCudaTest : public testing::CudaTest,
                               public ::testing::WithParamInterface<FlashKernel> {};

TEST_P(FlashAttentionCudaTest, ForwardAndBackward_Shapes_MatchCpuOnBf16Inputs) {
  for (const Shape& s : FlashShapes()) {
    SCOPED_TRACE(s.Name(""));
    const std::vector<float> qkv = Bf16Normal(80, s.qkv_size());
    const std::vector<float> dout = Bf16Normal(81, s.out_size());
    const CpuResult want = RunCpu(s, qkv, dout);
    const GpuResult got = RunGpu(GetParam(), s, qkv, dout);
    EXPECT_TRUE(AllClose(s.Name("out"), got.out, want.out, kOutAtol, kRtol));
    EXPECT_TRUE(AllClose(s.Name("lse"), got.lse, want.lse, kLseAtol, 0.0f));
    EXPECT_TRUE(AllClose(s.Name("dqkv"), got.dqkv, want.dqkv, kGradAtol, kRtol));
    // And against the CPU twin, same roundings, same bounds: when the
    // comparisons above fail, this one tells a kernel bug (fails too) from
    // a bound too tight for the GPU's summation order (passes).
    std::vector<float> twin_out(s.out_size()), twin_lse(want.lse.size()), twin_dqkv(s.qkv_size());
    FlashAttentionForward(qkv.data(), s.batch, s.seq_len, s.c, s.heads, twin_out.data(),
                          twin_lse.data());
    FlashAttentionBackward(qkv.data(), twin_out.data(), twin_lse.data(), dout.data(), s.batch,
                           s.seq_len, s.c, s.heads, twin_dqkv.data());
    EXPECT_TRUE(AllClose(s.Name("out vs twin"), got.out, twin_out, kOutAtol, kRtol));
    EXPECT_TRUE(AllClose(s.Name("lse vs twin"), got.lse, twin_lse, kLseAtol, 0.0f));
    EXPECT_TRUE(AllClose(s.Name("dqkv vs twin"), got.dqkv, twin_dqkv, kGradAtol, kRtol));
  }
}

TEST_P(FlashAttentionCudaTest, TwoRuns_BitwiseEqual) {
  const Shape s = {2, 129, 96, 4};
  const std::vector<float> qkv = Bf16Normal(82, s.qkv_size());
  const std::vector<float> dout = Bf16Normal(83, s.out_size());
  const GpuResult first = RunGpu(GetParam(), s, qkv, dout);
  const GpuResult second = RunGpu(GetParam(), s, qkv, dout);
  ASSERT_EQ(first.out.size(), static_cast<size_t>(s.out_size()));
  ASSERT_EQ(first.dqkv.size(), static_cast<size_t>(s.qkv_size()));
  ASSERT_EQ(first.lse.size(), static_cast<size_t>(s.batch) * s.heads * s.seq_len);
  EXPECT_EQ(first.out, second.out);
  EXPECT_EQ(first.lse, second.lse);
  EXPECT_EQ(first.dqkv, second.dqkv);
}

INSTANTIATE_TEST_SUITE_P(Kernels, FlashAttentionCudaTest,
                         ::testing::Values(FlashKernel::kWmma, FlashKernel::kMma),
                         [](const ::testing::TestParamInfo<FlashKernel>& info) {
                           return std::string(FlashKernelName(info.param));
                         });

// PIPETRAIN_FLASH_KERNEL: unset is wmma, the two names parse, others are
// INVALID_ARGUMENT naming the variable. No GPU needed.
TEST(FlashAttentionCudaArgumentsTest, FlashKernelFromEnvironment_NamesAndDefault) {
  const char* before = std::getenv("PIPETRAIN_FLASH_KERNEL");
  const std::string saved = before != nullptr ? before : "";
  unsetenv("PIPETRAIN_FLASH_KERNEL");
  auto unset = FlashKernelFromEnvironment();
  ASSERT_TRUE(unset.ok()) << unset.status();
  EXPECT_EQ(*unset, FlashKernel::kWmma);
  for (FlashKernel kernel : {FlashKernel::kWmma, FlashKernel::kMma}) {
    ASSERT_EQ(setenv("PIPETRAIN_FLASH_KERNEL", FlashKernelName(kernel), 1), 0);
    auto named = FlashKernelFromEnvironment();
    ASSERT_TRUE(named.ok()) << named.status();
    EXPECT_EQ(*named, kernel);
  }
  ASSERT_EQ(setenv("PIPETRAIN_FLASH_KERNEL", "fast", 1), 0);
  auto bad = FlashKernelFromEnvironment();
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("PIPETRAIN_FLASH_KERNEL"), std::string::npos)
      << bad.status();
  if (before != nullptr) {
    setenv("PIPETRAIN_FLASH_KERNEL", saved.c_str(), 1);
  } else {
    unsetenv("PIPETRAIN_FLASH_KERNEL");
  }
}

// Argument checks before any CUDA call: run without a GPU.
TEST(FlashAttentionCudaArgumentsTest, BadShapes_InvalidArgument) {
  absl::Status status = FlashAttentionForwardCuda(nullptr, 1, 4, 10, 3, nullptr, nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("FlashAttentionForwardCuda: batch 1, seq_len 4, c 10, heads 3"),
            std::string::npos)
      << status;
  // A head wider than the tiles hold.
  status = FlashAttentionBackwardCuda(nullptr, nullptr, nullptr, nullptr, 1, 4, 258, 2, nullptr,
                                      nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("c / heads <= 128"), std::string::npos) << status;
  EXPECT_EQ(FlashAttentionForwardCuda(nullptr, -1, 4, 8, 2, nullptr, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(FlashAttentionForwardCuda(nullptr, 0, 4, 8, 2, nullptr, nullptr, nullptr).ok());
  // The kMma kernels' entry points check the same shapes first.
  EXPECT_EQ(
      FlashAttentionForwardCuda(nullptr, 1, 4, 10, 3, nullptr, nullptr, nullptr, FlashKernel::kMma)
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(FlashAttentionBackwardCuda(nullptr, nullptr, nullptr, nullptr, 0, 4, 8, 2, nullptr,
                                         nullptr, nullptr, FlashKernel::kMma)
                  .ok());
  EXPECT_TRUE(FlashAttentionSupports(1024, 768, 12));
  EXPECT_TRUE(FlashAttentionSupports(1, 256, 2));
  EXPECT_FALSE(FlashAttentionSupports(1024, 1600, 12));  // c % heads
  EXPECT_FALSE(FlashAttentionSupports(1024, 2048, 8));   // head_dim 256
  EXPECT_FALSE(FlashAttentionSupports(0, 768, 12));
  EXPECT_FALSE(FlashAttentionSupports(65535 * 64 + 1, 768, 12));  // query tiles
}

}  // namespace
}  // namespace pipetrain
