// Attention through cuBLAS batched GEMMs (attention_gemm.h) against the CPU
// reference (kernels/cpu/attention.cc), fp32 GEMM mode.
//
// Tolerance: attention_test.cc's bounds, for the same reasons: both sides
// sum in different orders (OpenBLAS's blocked SGEMMs against cuBLAS's, here
// GEMMs on both sides), the softmax's expf against the CPU's FastExp;
// inputs N(0, 1), outputs and gradients O(1). The products over the full
// square add exact zeros above the diagonal, which change no sum. A wrong
// stride, a missed head or a missing mask shows up as errors of order 0.1.
// Not yet run on a GPU.
#include "kernels/cuda/attention_gemm.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention_testing.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/parity_testing.h"

namespace pipetrain {
namespace {

using testing::AllClose;
using testing::RandomNormal;

using testing::kAttentionShapes;
using testing::NaNBuffer;
using Shape = testing::AttentionShape;

constexpr float kOutAtol = testing::kAttentionOutAtol;
constexpr float kProbsAtol = testing::kAttentionProbsAtol;
constexpr float kGradAtol = testing::kAttentionGradAtol;
constexpr float kRtol = testing::kAttentionRtol;

struct GpuResult {
  std::vector<float> out, probs, dqkv, ds;
};

// Forward, then backward from the GPU's own probs; outputs start as NaN so
// an element never written fails the comparison.
GpuResult RunGpu(const Shape& s, const std::vector<float>& qkv, const std::vector<float>& dout) {
  GpuResult r;
  auto handle = CublasHandle::Create(GemmMode::kFp32);
  auto qkv_d = DeviceBuffer<float>::FromHost(qkv);
  auto dout_d = DeviceBuffer<float>::FromHost(dout);
  auto out_d = NaNBuffer(s.out_size());
  auto probs_d = NaNBuffer(s.probs_size());
  auto dqkv_d = NaNBuffer(s.qkv_size());
  auto ds_d = NaNBuffer(s.probs_size());
  const bool ready = handle.ok() && qkv_d.ok() && dout_d.ok() && out_d.ok() && probs_d.ok() &&
                     dqkv_d.ok() && ds_d.ok();
  EXPECT_TRUE(ready);
  if (!ready) return r;
  absl::Status run = AttentionGemmForwardCuda(*handle, qkv_d->data(), s.batch, s.seq_len, s.c,
                                              s.heads, out_d->data(), probs_d->data());
  EXPECT_TRUE(run.ok()) << run;
  run = AttentionGemmBackwardCuda(*handle, qkv_d->data(), probs_d->data(), dout_d->data(),
                                  s.batch, s.seq_len, s.c, s.heads, dqkv_d->data(),
                                  ds_d->data());
  EXPECT_TRUE(run.ok()) << run;
  r.out = out_d->ToHost().value_or(std::vector<float>{});
  r.probs = probs_d->ToHost().value_or(std::vector<float>{});
  r.dqkv = dqkv_d->ToHost().value_or(std::vector<float>{});
  r.ds = ds_d->ToHost().value_or(std::vector<float>{});
  return r;
}

class AttentionGemmCudaTest : public testing::CudaTest {};

TEST_F(AttentionGemmCudaTest, ForwardAndBackward_Shapes_MatchCpu) {
  for (const Shape& s : kAttentionShapes) {
    SCOPED_TRACE(s.Name(""));
    const std::vector<float> qkv = RandomNormal(70, s.qkv_size(), 0.0f, 1.0f);
    const std::vector<float> dout = RandomNormal(71, s.out_size(), 0.0f, 1.0f);
    std::vector<float> out(s.out_size()), probs(s.probs_size()), dqkv(s.qkv_size());
    std::vector<float> scratch(static_cast<size_t>(s.seq_len) * s.seq_len);
    AttentionForward(qkv.data(), s.batch, s.seq_len, s.c, s.heads, out.data(), probs.data());
    AttentionBackward(qkv.data(), probs.data(), dout.data(), s.batch, s.seq_len, s.c, s.heads,
                      dqkv.data(), scratch.data());
    const GpuResult got = RunGpu(s, qkv, dout);
    ASSERT_EQ(got.ds.size(), static_cast<size_t>(s.probs_size()));
    EXPECT_TRUE(AllClose(s.Name("out"), got.out, out, kOutAtol, kRtol));
    EXPECT_TRUE(AllClose(s.Name("probs"), got.probs, probs, kProbsAtol, kRtol));
    // The GPU backward used the GPU's probs, within kProbsAtol of the CPU's:
    // a further O(1e-6) on the gradients, inside kGradAtol.
    EXPECT_TRUE(AllClose(s.Name("dqkv"), got.dqkv, dqkv, kGradAtol, kRtol));
    // dS: zeros above every diagonal (the products over the full square rely
    // on them), finite values on and below.
    for (int64_t row = 0; row < int64_t{s.batch} * s.heads * s.seq_len; ++row) {
      const int t = static_cast<int>(row % s.seq_len);
      for (int j = t + 1; j < s.seq_len; ++j) {
        ASSERT_EQ(got.ds[row * s.seq_len + j], 0.0f) << "row " << row << " key " << j;
      }
    }
  }
}

TEST_F(AttentionGemmCudaTest, TwoRuns_BitwiseEqual) {
  const Shape s = {2, 129, 96, 4};
  const std::vector<float> qkv = RandomNormal(72, s.qkv_size(), 0.0f, 1.0f);
  const std::vector<float> dout = RandomNormal(73, s.out_size(), 0.0f, 1.0f);
  const GpuResult first = RunGpu(s, qkv, dout);
  const GpuResult second = RunGpu(s, qkv, dout);
  EXPECT_EQ(first.out, second.out);
  EXPECT_EQ(first.probs, second.probs);
  EXPECT_EQ(first.dqkv, second.dqkv);
}

// Argument checks before any CUDA call: run without a GPU.
TEST(AttentionGemmCudaArgumentsTest, BadShapes_InvalidArgument) {
  const CublasHandle empty;
  absl::Status status = AttentionGemmForwardCuda(empty, nullptr, 1, 4, 10, 3, nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("AttentionGemmForwardCuda: batch 1, seq_len 4, c 10, heads 3"),
            std::string::npos)
      << status;
  status = AttentionGemmBackwardCuda(empty, nullptr, nullptr, nullptr, 2, 0, 8, 2, nullptr,
                                     nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(AttentionGemmForwardCuda(empty, nullptr, 0, 4, 8, 2, nullptr, nullptr).ok());
  EXPECT_EQ(CausalSoftmaxRowsCuda(nullptr, -1, 4, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CausalSoftmaxBackwardRowsCuda(nullptr, nullptr, 3, 0, 1.0f, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// With a shape that is fine, an empty handle is the GEMM's error.
TEST(AttentionGemmCudaArgumentsTest, EmptyHandle_FailedPrecondition) {
  const CublasHandle empty;
  float x = 0;
  const absl::Status status = AttentionGemmForwardCuda(empty, &x, 1, 2, 4, 2, &x, &x);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
}

}  // namespace
}  // namespace pipetrain
