// Causal attention CUDA kernels against the CPU reference
// (kernels/cpu/attention.cc).
//
// Tolerance |gpu - cpu| <= atol + rtol * |cpu|, in fp32. The two sides sum
// in different orders: the CPU through OpenBLAS's blocked SGEMMs, the GPU in
// plain sequential dot products and sums over keys (up to seq_len = 1024
// terms), with nvcc contracting multiply-adds into FMAs; and expf (<= 2 ulp)
// against FastExp (< 4e-7 relative). Inputs are N(0, 1), so scores, outputs
// and gradients are O(1) (largest |value| about 5). Measured against a
// double-precision attention on these shapes (no GPU was available when
// these bounds were written, so the GPU side was measured by a float
// emulation of the kernels' operation order, without FMAs, on the CPU):
//   out:   CPU off by up to 1.0e-6, GPU emulation 6.5e-7;
//   probs: CPU 3.5e-7, GPU emulation 2.1e-7;
//   dqkv:  CPU up to 4.7e-6 (dv at seq_len 300), GPU emulation 6.8e-6 (dv
//          at seq_len 1024: a 1024-term sequential sum).
// The bounds below leave about 2.5-3x headroom over the sum of both sides'
// errors. A wrong index, a missing mask or a missing scale shows up as
// errors of order 0.1 or more. Entries above the diagonal of probs are
// exact zeros on both sides.
#include "kernels/cuda/attention.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention_testing.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/parity_testing.h"

namespace pipetrain {
namespace {

using testing::AllClose;
using testing::RandomNormal;

using testing::AttentionShape;
using testing::kAttentionShapes;
using testing::NaNBuffer;
using Shape = AttentionShape;

constexpr float kOutAtol = testing::kAttentionOutAtol;
constexpr float kProbsAtol = testing::kAttentionProbsAtol;
constexpr float kGradAtol = testing::kAttentionGradAtol;
constexpr float kRtol = testing::kAttentionRtol;

void RunGpuForward(const Shape& s, const std::vector<float>& qkv, std::vector<float>* out,
                   std::vector<float>* probs) {
  auto qkv_d = DeviceBuffer<float>::FromHost(qkv);
  auto out_d = NaNBuffer(s.out_size());
  auto probs_d = NaNBuffer(s.probs_size());
  ASSERT_TRUE(qkv_d.ok() && out_d.ok() && probs_d.ok());
  const absl::Status run = AttentionForwardCuda(qkv_d->data(), s.batch, s.seq_len, s.c, s.heads,
                                                out_d->data(), probs_d->data());
  ASSERT_TRUE(run.ok()) << run;
  auto out_got = out_d->ToHost();
  auto probs_got = probs_d->ToHost();
  ASSERT_TRUE(out_got.ok() && probs_got.ok());
  *out = *std::move(out_got);
  *probs = *std::move(probs_got);
}

void RunGpuBackward(const Shape& s, const std::vector<float>& qkv,
                    const std::vector<float>& probs, const std::vector<float>& dout,
                    std::vector<float>* dqkv) {
  auto qkv_d = DeviceBuffer<float>::FromHost(qkv);
  auto probs_d = DeviceBuffer<float>::FromHost(probs);
  auto dout_d = DeviceBuffer<float>::FromHost(dout);
  auto dqkv_d = NaNBuffer(s.qkv_size());
  auto scratch_d = DeviceBuffer<float>::Create(s.probs_size());
  ASSERT_TRUE(qkv_d.ok() && probs_d.ok() && dout_d.ok() && dqkv_d.ok() && scratch_d.ok());
  const absl::Status run =
      AttentionBackwardCuda(qkv_d->data(), probs_d->data(), dout_d->data(), s.batch, s.seq_len,
                            s.c, s.heads, dqkv_d->data(), scratch_d->data());
  ASSERT_TRUE(run.ok()) << run;
  auto got = dqkv_d->ToHost();
  ASSERT_TRUE(got.ok()) << got.status();
  *dqkv = *std::move(got);
}

class AttentionCudaTest : public testing::CudaTest {};

TEST_F(AttentionCudaTest, AttentionForwardCuda_Shapes_MatchesCpu) {
  for (const Shape& s : kAttentionShapes) {
    const std::vector<float> qkv = RandomNormal(40, s.qkv_size(), 0.0f, 1.0f);
    std::vector<float> out(s.out_size()), probs(s.probs_size());
    AttentionForward(qkv.data(), s.batch, s.seq_len, s.c, s.heads, out.data(), probs.data());
    std::vector<float> out_got, probs_got;
    ASSERT_NO_FATAL_FAILURE(RunGpuForward(s, qkv, &out_got, &probs_got));
    EXPECT_TRUE(AllClose(s.Name("out"), out_got, out, kOutAtol, kRtol));
    EXPECT_TRUE(AllClose(s.Name("probs"), probs_got, probs, kProbsAtol, kRtol));
  }
}

TEST_F(AttentionCudaTest, AttentionBackwardCuda_Shapes_MatchesCpu) {
  for (const Shape& s : kAttentionShapes) {
    const std::vector<float> qkv = RandomNormal(50, s.qkv_size(), 0.0f, 1.0f);
    const std::vector<float> dout = RandomNormal(51, s.out_size(), 0.0f, 1.0f);
    std::vector<float> out(s.out_size()), probs(s.probs_size()), dqkv(s.qkv_size());
    std::vector<float> scratch(static_cast<size_t>(s.seq_len) * s.seq_len);
    AttentionForward(qkv.data(), s.batch, s.seq_len, s.c, s.heads, out.data(), probs.data());
    AttentionBackward(qkv.data(), probs.data(), dout.data(), s.batch, s.seq_len, s.c, s.heads,
                      dqkv.data(), scratch.data());
    // The GPU backward gets the CPU's probs, so it is checked alone.
    std::vector<float> got;
    ASSERT_NO_FATAL_FAILURE(RunGpuBackward(s, qkv, probs, dout, &got));
    EXPECT_TRUE(AllClose(s.Name("dqkv"), got, dqkv, kGradAtol, kRtol));
  }
}

TEST_F(AttentionCudaTest, AttentionCuda_TwoRuns_BitwiseEqual) {
  const Shape s = {2, 129, 96, 4};
  const std::vector<float> qkv = RandomNormal(60, s.qkv_size(), 0.0f, 1.0f);
  const std::vector<float> dout = RandomNormal(61, s.out_size(), 0.0f, 1.0f);
  std::vector<float> out[2], probs[2], dqkv[2];
  for (int r = 0; r < 2; ++r) {
    ASSERT_NO_FATAL_FAILURE(RunGpuForward(s, qkv, &out[r], &probs[r]));
    ASSERT_NO_FATAL_FAILURE(RunGpuBackward(s, qkv, probs[r], dout, &dqkv[r]));
  }
  EXPECT_EQ(out[0], out[1]);
  EXPECT_EQ(probs[0], probs[1]);
  EXPECT_EQ(dqkv[0], dqkv[1]);
}

// Shape checks happen before any CUDA call, so these run without a GPU.
TEST(AttentionCudaArgumentsTest, AttentionForwardCuda_HeadsNotDividingC_InvalidArgument) {
  const absl::Status status = AttentionForwardCuda(nullptr, 1, 4, 10, 3, nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("AttentionForwardCuda: batch 1, seq_len 4, c 10, heads 3"),
            std::string::npos)
      << status;
}

TEST(AttentionCudaArgumentsTest, AttentionBackwardCuda_ZeroSeqLen_InvalidArgument) {
  const absl::Status status =
      AttentionBackwardCuda(nullptr, nullptr, nullptr, 2, 0, 8, 2, nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("AttentionBackwardCuda: batch 2, seq_len 0"),
            std::string::npos)
      << status;
}

TEST(AttentionCudaArgumentsTest, AttentionForwardCuda_NegativeBatch_InvalidArgument) {
  const absl::Status status = AttentionForwardCuda(nullptr, -1, 4, 8, 2, nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("AttentionForwardCuda: batch -1"), std::string::npos)
      << status;
}

TEST(AttentionCudaArgumentsTest, AttentionForwardCuda_TooManyRows_InvalidArgument) {
  // 2^20 * 64 * 4096 = 2^38 rows, past the 2^31 - 1 grid limit.
  const absl::Status status =
      AttentionForwardCuda(nullptr, 1 << 20, 4096, 64 * 64, 64, nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("274877906944 rows exceed the 2^31 - 1 grid limit"),
            std::string::npos)
      << status;
}

TEST(AttentionCudaArgumentsTest, AttentionCuda_ZeroBatch_OkWithoutLaunch) {
  EXPECT_TRUE(AttentionForwardCuda(nullptr, 0, 4, 8, 2, nullptr, nullptr).ok());
  EXPECT_TRUE(
      AttentionBackwardCuda(nullptr, nullptr, nullptr, 0, 4, 8, 2, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace pipetrain
