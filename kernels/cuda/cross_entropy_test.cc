// Softmax cross-entropy CUDA kernels against the CPU reference
// (kernels/cpu/cross_entropy.cc).
//
// Tolerance |gpu - cpu| <= atol + rtol * |cpu|, in fp32. The forward differs
// from the CPU in three ways: expf (<= 2 ulp) against FastExp (< 4e-7
// relative), the row sum of exponentials in a tree of 512 per-thread
// partial sums against the CPU's left-to-right sum, and log of that sum.
// (Since the forward's sums became online, each thread's partial sum is
// also rescaled by expf(m_old - m_new) when its maximum grows, a few times
// a row on random logits: a few more ulp, far inside the bounds below.)
// Measured against a double-precision softmax on these inputs (no GPU was
// available when these bounds were written, so the GPU side was measured by
// a float emulation of the kernels' operation order on the CPU):
//   probs:      CPU off by up to 3.5e-7 absolute and 8.2e-6 relative (small
//               p at vocab 50257, where the sequential sum drifts), the GPU
//               emulation by 5.5e-8 and 1.0e-6;
//   row losses: CPU 7.2e-6 (losses ~13, ulp 1e-6), GPU emulation 3.1e-6
//               (logits around 100, where lse ~ 108 rounds to 7.6e-6);
//   mean loss:  CPU 3.2e-6, GPU emulation 9e-7.
// The bounds below leave about 3x headroom over the sum of both sides'
// errors. A wrong target index or a missing max shift shows up as errors of
// order 1 (or inf/NaN). The backward is exact: both sides compute
// fl(fl(p * scale) - scale) with the same scale and no FMA (see the kernel).
#include "kernels/cuda/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/flash_attention.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/parity_testing.h"

namespace pipetrain {
namespace {

using testing::AllClose;
using testing::RandomNormal;

constexpr float kProbsAtol = 1e-6f;
constexpr float kProbsRtol = 3e-5f;
constexpr float kLossAtol = 3e-5f;   // row losses and the mean loss
constexpr float kLossRtol = 1e-6f;
constexpr float kGradAtol = 0.0f;    // exact, see above
constexpr float kGradRtol = 0.0f;

struct Shape {
  int n;      // positions (rows)
  int vocab;  // classes (columns)
};

// A single class, rows narrower than a warp, widths that are not multiples
// of the 512-thread block, many rows, and GPT-2's vocabulary.
const Shape kShapes[] = {{1, 1}, {1, 7}, {3, 1000}, {5, 4097}, {257, 513}, {8, 50257}};

std::string Name(const Shape& s, const char* tensor) {
  return "[" + std::to_string(s.n) + ", " + std::to_string(s.vocab) + "] " + tensor;
}

// Targets spread over the vocabulary, a pure function of (n, vocab).
std::vector<int32_t> Targets(int n, int vocab) {
  std::vector<int32_t> targets(n);
  for (int i = 0; i < n; ++i) targets[i] = static_cast<int32_t>((i * 7919LL + 13) % vocab);
  return targets;
}

// The CPU reference: probs, the mean loss, and each row's loss (the CPU
// forward on that row alone, whose "mean" is the row's loss).
struct CpuForward {
  std::vector<float> probs;
  std::vector<float> row_losses;
  float loss = 0.0f;
};

CpuForward RunCpuForward(const std::vector<float>& logits, const std::vector<int32_t>& targets,
                         int n, int vocab) {
  CpuForward cpu;
  cpu.probs.resize(logits.size());
  cpu.loss =
      SoftmaxCrossEntropyForward(logits.data(), targets.data(), n, vocab, vocab, cpu.probs.data());
  std::vector<float> row_probs(vocab);
  for (int i = 0; i < n; ++i) {
    cpu.row_losses.push_back(
        SoftmaxCrossEntropyForward(logits.data() + static_cast<int64_t>(i) * vocab, &targets[i], 1,
                                   vocab, vocab, row_probs.data()));
  }
  return cpu;
}

// The GPU forward's outputs, copied back.
struct GpuForward {
  std::vector<float> probs;
  std::vector<float> row_losses;
  float loss = 0.0f;
};

// Runs the GPU forward; with in_place, probs is written over the logits.
void RunGpuForward(const std::vector<float>& logits, const std::vector<int32_t>& targets, int n,
                   int vocab, bool in_place, GpuForward* gpu) {
  auto logits_d = DeviceBuffer<float>::FromHost(logits);
  auto targets_d = DeviceBuffer<int32_t>::FromHost(targets);
  auto probs_d = DeviceBuffer<float>::Create(in_place ? 0 : logits.size());
  auto rows_d = DeviceBuffer<float>::Create(n);
  auto loss_d = DeviceBuffer<float>::Create(1);
  ASSERT_TRUE(logits_d.ok() && targets_d.ok() && probs_d.ok() && rows_d.ok() && loss_d.ok());
  float* probs = in_place ? logits_d->data() : probs_d->data();
  const absl::Status run = SoftmaxCrossEntropyForwardCuda(
      logits_d->data(), targets_d->data(), n, vocab, vocab, probs, rows_d->data(), loss_d->data());
  ASSERT_TRUE(run.ok()) << run;
  auto probs_got = (in_place ? *logits_d : *probs_d).ToHost();
  auto rows_got = rows_d->ToHost();
  ASSERT_TRUE(probs_got.ok() && rows_got.ok());
  ASSERT_TRUE(loss_d->CopyToHost(&gpu->loss, 1).ok());
  gpu->probs = *std::move(probs_got);
  gpu->row_losses = *std::move(rows_got);
}

// Runs the GPU backward on `probs`; with in_place, dlogits overwrites probs.
void RunGpuBackward(const std::vector<float>& probs, const std::vector<int32_t>& targets, int n,
                    int vocab, float dloss, bool in_place, std::vector<float>* dlogits) {
  auto probs_d = DeviceBuffer<float>::FromHost(probs);
  auto targets_d = DeviceBuffer<int32_t>::FromHost(targets);
  auto dlogits_d = DeviceBuffer<float>::Create(in_place ? 0 : probs.size());
  ASSERT_TRUE(probs_d.ok() && targets_d.ok() && dlogits_d.ok());
  DeviceBuffer<float>& out = in_place ? *probs_d : *dlogits_d;
  const absl::Status run = SoftmaxCrossEntropyBackwardCuda(probs_d->data(), targets_d->data(), n,
                                                           vocab, vocab, dloss, out.data());
  ASSERT_TRUE(run.ok()) << run;
  auto got = out.ToHost();
  ASSERT_TRUE(got.ok()) << got.status();
  *dlogits = *std::move(got);
}

class CrossEntropyCudaTest : public testing::CudaTest {};

TEST_F(CrossEntropyCudaTest, SoftmaxCrossEntropyForwardCuda_Shapes_MatchesCpu) {
  for (const Shape& s : kShapes) {
    const std::vector<float> logits =
        RandomNormal(10, static_cast<int64_t>(s.n) * s.vocab, 0.0f, 2.0f);
    const std::vector<int32_t> targets = Targets(s.n, s.vocab);
    const CpuForward cpu = RunCpuForward(logits, targets, s.n, s.vocab);
    GpuForward gpu;
    ASSERT_NO_FATAL_FAILURE(RunGpuForward(logits, targets, s.n, s.vocab, false, &gpu));
    EXPECT_TRUE(AllClose(Name(s, "probs"), gpu.probs, cpu.probs, kProbsAtol, kProbsRtol));
    EXPECT_TRUE(
        AllClose(Name(s, "row losses"), gpu.row_losses, cpu.row_losses, kLossAtol, kLossRtol));
    EXPECT_TRUE(AllClose(Name(s, "loss"), {gpu.loss}, {cpu.loss}, kLossAtol, kLossRtol));
  }
}

// Logits around 100: expf(100) overflows fp32, so this fails without the
// max subtraction.
TEST_F(CrossEntropyCudaTest, SoftmaxCrossEntropyForwardCuda_LargeLogits_MatchesCpu) {
  constexpr int kN = 4, kVocab = 4097;
  const std::vector<float> logits = RandomNormal(11, int64_t{kN} * kVocab, 100.0f, 2.0f);
  const std::vector<int32_t> targets = Targets(kN, kVocab);
  const CpuForward cpu = RunCpuForward(logits, targets, kN, kVocab);
  GpuForward gpu;
  ASSERT_NO_FATAL_FAILURE(RunGpuForward(logits, targets, kN, kVocab, false, &gpu));
  EXPECT_TRUE(AllClose("large logits probs", gpu.probs, cpu.probs, kProbsAtol, kProbsRtol));
  EXPECT_TRUE(AllClose("large logits row losses", gpu.row_losses, cpu.row_losses, kLossAtol,
                       kLossRtol));
  EXPECT_TRUE(AllClose("large logits loss", {gpu.loss}, {cpu.loss}, kLossAtol, kLossRtol));
}

TEST_F(CrossEntropyCudaTest, SoftmaxCrossEntropyForwardCuda_InPlace_MatchesCpu) {
  constexpr int kN = 257, kVocab = 513;
  const std::vector<float> logits = RandomNormal(12, int64_t{kN} * kVocab, 0.0f, 2.0f);
  const std::vector<int32_t> targets = Targets(kN, kVocab);
  const CpuForward cpu = RunCpuForward(logits, targets, kN, kVocab);
  GpuForward gpu;
  ASSERT_NO_FATAL_FAILURE(RunGpuForward(logits, targets, kN, kVocab, true, &gpu));
  EXPECT_TRUE(AllClose("in-place probs", gpu.probs, cpu.probs, kProbsAtol, kProbsRtol));
  EXPECT_TRUE(AllClose("in-place loss", {gpu.loss}, {cpu.loss}, kLossAtol, kLossRtol));
}

TEST_F(CrossEntropyCudaTest, SoftmaxCrossEntropyBackwardCuda_Shapes_MatchesCpuExactly) {
  for (const Shape& s : kShapes) {
    const std::vector<float> logits =
        RandomNormal(20, static_cast<int64_t>(s.n) * s.vocab, 0.0f, 2.0f);
    const std::vector<int32_t> targets = Targets(s.n, s.vocab);
    // The GPU backward gets the CPU's probs, so it is checked alone.
    const CpuForward cpu = RunCpuForward(logits, targets, s.n, s.vocab);
    constexpr float kDloss = 0.75f;
    std::vector<float> want(cpu.probs.size());
    SoftmaxCrossEntropyBackward(cpu.probs.data(), targets.data(), s.n, s.vocab, s.vocab, kDloss,
                                want.data());
    std::vector<float> got;
    ASSERT_NO_FATAL_FAILURE(
        RunGpuBackward(cpu.probs, targets, s.n, s.vocab, kDloss, false, &got));
    EXPECT_TRUE(AllClose(Name(s, "dlogits"), got, want, kGradAtol, kGradRtol));
  }
}

TEST_F(CrossEntropyCudaTest, SoftmaxCrossEntropyBackwardCuda_InPlace_MatchesCpuExactly) {
  constexpr int kN = 5, kVocab = 4097;
  const std::vector<float> logits = RandomNormal(21, int64_t{kN} * kVocab, 0.0f, 2.0f);
  const std::vector<int32_t> targets = Targets(kN, kVocab);
  const CpuForward cpu = RunCpuForward(logits, targets, kN, kVocab);
  std::vector<float> want(cpu.probs.size());
  SoftmaxCrossEntropyBackward(cpu.probs.data(), targets.data(), kN, kVocab, kVocab, 1.0f,
                              want.data());
  std::vector<float> got;
  ASSERT_NO_FATAL_FAILURE(RunGpuBackward(cpu.probs, targets, kN, kVocab, 1.0f, true, &got));
  EXPECT_TRUE(AllClose("in-place dlogits", got, want, kGradAtol, kGradRtol));
}

// Row 1's target is out of range: its loss, the mean and its gradient row
// are NaN; the other rows are unaffected.
TEST_F(CrossEntropyCudaTest, SoftmaxCrossEntropyCuda_TargetOutOfRange_NaNForThatRow) {
  constexpr int kN = 3, kVocab = 100;
  const std::vector<float> logits = RandomNormal(30, kN * kVocab, 0.0f, 2.0f);
  const std::vector<int32_t> targets = {5, kVocab, 7};
  GpuForward gpu;
  ASSERT_NO_FATAL_FAILURE(RunGpuForward(logits, targets, kN, kVocab, false, &gpu));
  EXPECT_TRUE(std::isfinite(gpu.row_losses[0]));
  EXPECT_TRUE(std::isnan(gpu.row_losses[1]));
  EXPECT_TRUE(std::isfinite(gpu.row_losses[2]));
  EXPECT_TRUE(std::isnan(gpu.loss));
  std::vector<float> dlogits;
  ASSERT_NO_FATAL_FAILURE(RunGpuBackward(gpu.probs, targets, kN, kVocab, 1.0f, false, &dlogits));
  for (int j = 0; j < kVocab; ++j) {
    EXPECT_TRUE(std::isfinite(dlogits[j])) << "row 0, column " << j;
    EXPECT_TRUE(std::isnan(dlogits[kVocab + j])) << "row 1, column " << j;
    EXPECT_TRUE(std::isfinite(dlogits[2 * kVocab + j])) << "row 2, column " << j;
  }
}

TEST_F(CrossEntropyCudaTest, SoftmaxCrossEntropyCuda_TwoRuns_BitwiseEqual) {
  constexpr int kN = 300, kVocab = 50257;
  const std::vector<float> logits = RandomNormal(40, int64_t{kN} * kVocab, 0.0f, 2.0f);
  const std::vector<int32_t> targets = Targets(kN, kVocab);
  GpuForward runs[2];
  std::vector<float> grads[2];
  for (int r = 0; r < 2; ++r) {
    ASSERT_NO_FATAL_FAILURE(RunGpuForward(logits, targets, kN, kVocab, false, &runs[r]));
    ASSERT_NO_FATAL_FAILURE(
        RunGpuBackward(runs[r].probs, targets, kN, kVocab, 1.0f, false, &grads[r]));
  }
  EXPECT_EQ(runs[0].probs, runs[1].probs);
  EXPECT_EQ(runs[0].row_losses, runs[1].row_losses);
  EXPECT_EQ(runs[0].loss, runs[1].loss);
  EXPECT_EQ(grads[0], grads[1]);
}

// Rows of stride ld > vocab (Backend::LogitsRowStride: GPT-2's 50257 padded
// to 50304, and an odd width padded by 3): bitwise the packed layout's
// results, with the floats after each row untouched by both kernels and
// ignored (NaN there changes nothing).
TEST_F(CrossEntropyCudaTest, SoftmaxCrossEntropyCuda_PaddedRows_SameAsPackedAndPaddingUntouched) {
  const struct { int n, vocab, ld; } cases[] = {{6, 50257, 50304}, {9, 13, 16}};
  constexpr float kDloss = 0.5f;
  for (const auto& c : cases) {
    SCOPED_TRACE(Name({c.n, c.vocab}, "padded") + " to " + std::to_string(c.ld));
    const std::vector<float> logits = RandomNormal(50, int64_t{c.n} * c.vocab, 0.0f, 2.0f);
    const std::vector<int32_t> targets = Targets(c.n, c.vocab);
    GpuForward packed;
    ASSERT_NO_FATAL_FAILURE(RunGpuForward(logits, targets, c.n, c.vocab, false, &packed));
    std::vector<float> packed_grad;
    ASSERT_NO_FATAL_FAILURE(
        RunGpuBackward(packed.probs, targets, c.n, c.vocab, kDloss, false, &packed_grad));

    std::vector<float> padded(static_cast<size_t>(c.n) * c.ld, NAN);
    for (int i = 0; i < c.n; ++i) {
      std::copy_n(logits.begin() + int64_t{i} * c.vocab, c.vocab,
                  padded.begin() + int64_t{i} * c.ld);
    }
    auto logits_d = DeviceBuffer<float>::FromHost(padded);
    auto targets_d = DeviceBuffer<int32_t>::FromHost(targets);
    auto probs_d = DeviceBuffer<float>::FromHost(std::vector<float>(padded.size(), -7.0f));
    auto grad_d = DeviceBuffer<float>::FromHost(std::vector<float>(padded.size(), -9.0f));
    auto rows_d = DeviceBuffer<float>::Create(c.n);
    auto loss_d = DeviceBuffer<float>::Create(1);
    ASSERT_TRUE(logits_d.ok() && targets_d.ok() && probs_d.ok() && grad_d.ok() && rows_d.ok() &&
                loss_d.ok());
    ASSERT_TRUE(SoftmaxCrossEntropyForwardCuda(logits_d->data(), targets_d->data(), c.n, c.vocab,
                                               c.ld, probs_d->data(), rows_d->data(),
                                               loss_d->data())
                    .ok());
    ASSERT_TRUE(SoftmaxCrossEntropyBackwardCuda(probs_d->data(), targets_d->data(), c.n, c.vocab,
                                                c.ld, kDloss, grad_d->data())
                    .ok());
    auto probs = probs_d->ToHost();
    auto grad = grad_d->ToHost();
    auto rows = rows_d->ToHost();
    float loss = 0.0f;
    ASSERT_TRUE(probs.ok() && grad.ok() && rows.ok() && loss_d->CopyToHost(&loss, 1).ok());
    EXPECT_EQ(loss, packed.loss);
    EXPECT_EQ(*rows, packed.row_losses);
    int mismatches = 0;
    for (int i = 0; i < c.n; ++i) {
      for (int j = 0; j < c.ld; ++j) {
        const size_t at = static_cast<size_t>(i) * c.ld + j;
        const size_t packed_at = static_cast<size_t>(i) * c.vocab + j;
        const bool ok = j < c.vocab ? (*probs)[at] == packed.probs[packed_at] &&
                                          (*grad)[at] == packed_grad[packed_at]
                                    : (*probs)[at] == -7.0f && (*grad)[at] == -9.0f;
        if (!ok && ++mismatches <= 5) ADD_FAILURE() << "row " << i << ", column " << j;
      }
    }
    EXPECT_EQ(mismatches, 0);
  }
}

// The forward with the bf16 gradient: the row losses and the loss bitwise
// the fp32 forward's; each gradient value bitwise the fp32 backward's for
// dloss = 1 (from the fp32 forward's probabilities) rounded to nearest even
// (RoundToBf16, the CPU's); +0 in the padding; NaN in a row whose target
// is out of range; over padded and unpadded rows.
TEST_F(CrossEntropyCudaTest, ForwardBf16Gradient_IsTheFp32PassesRounded) {
  const struct { int n, vocab, ld; } cases[] = {{6, 50257, 50304}, {9, 13, 13}, {5, 1000, 1024}};
  for (const auto& c : cases) {
    SCOPED_TRACE(Name({c.n, c.vocab}, "bf16 gradient") + " ld " + std::to_string(c.ld));
    const std::vector<float> logits = RandomNormal(70, int64_t{c.n} * c.ld, 0.0f, 3.0f);
    std::vector<int32_t> targets = Targets(c.n, c.vocab);
    targets[1] = c.vocab;  // out of range: NaN row
    auto logits_d = DeviceBuffer<float>::FromHost(logits);
    auto targets_d = DeviceBuffer<int32_t>::FromHost(targets);
    auto probs_d = DeviceBuffer<float>::FromHost(std::vector<float>(logits.size(), 0.0f));
    auto fp32_d = DeviceBuffer<float>::FromHost(std::vector<float>(logits.size(), 0.0f));
    auto bf16_d = DeviceBuffer<uint16_t>::FromHost(std::vector<uint16_t>(logits.size(), 0x1234));
    auto rows1 = DeviceBuffer<float>::Create(c.n), rows2 = DeviceBuffer<float>::Create(c.n);
    auto loss1 = DeviceBuffer<float>::Create(1), loss2 = DeviceBuffer<float>::Create(1);
    ASSERT_TRUE(logits_d.ok() && targets_d.ok() && probs_d.ok() && fp32_d.ok() && bf16_d.ok() &&
                rows1.ok() && rows2.ok() && loss1.ok() && loss2.ok());
    ASSERT_TRUE(SoftmaxCrossEntropyForwardCuda(logits_d->data(), targets_d->data(), c.n, c.vocab,
                                               c.ld, probs_d->data(), rows1->data(), loss1->data())
                    .ok());
    ASSERT_TRUE(SoftmaxCrossEntropyBackwardCuda(probs_d->data(), targets_d->data(), c.n, c.vocab,
                                                c.ld, 1.0f, fp32_d->data())
                    .ok());
    ASSERT_TRUE(SoftmaxCrossEntropyForwardBf16GradientCuda(logits_d->data(), targets_d->data(), c.n,
                                                           c.vocab, c.ld, bf16_d->data(),
                                                           rows2->data(), loss2->data())
                    .ok());
    auto fp32 = fp32_d->ToHost();
    auto bf16 = bf16_d->ToHost();
    ASSERT_TRUE(fp32.ok() && bf16.ok());
    int mismatches = 0;
    for (int i = 0; i < c.n; ++i) {
      for (int j = 0; j < c.ld; ++j) {
        const size_t at = static_cast<size_t>(i) * c.ld + j;
        const uint32_t bits = uint32_t{(*bf16)[at]} << 16;
        float got;
        std::memcpy(&got, &bits, sizeof(got));
        bool ok;
        if (j >= c.vocab) {
          ok = bits == 0;
        } else if (i == 1) {
          ok = std::isnan(got);
        } else {
          ok = got == RoundToBf16((*fp32)[at]);
        }
        if (!ok && ++mismatches <= 5) ADD_FAILURE() << "row " << i << ", column " << j;
      }
    }
    EXPECT_EQ(mismatches, 0);
    auto want_rows = rows1->ToHost(), got_rows = rows2->ToHost();
    auto want_loss = loss1->ToHost(), got_loss = loss2->ToHost();
    ASSERT_TRUE(want_rows.ok() && got_rows.ok() && want_loss.ok() && got_loss.ok());
    // NaN != NaN: compare the row losses' bits.
    ASSERT_EQ(got_rows->size(), want_rows->size());
    for (int i = 0; i < c.n; ++i) {
      EXPECT_EQ(std::memcmp(&(*got_rows)[i], &(*want_rows)[i], sizeof(float)), 0) << "row " << i;
    }
    EXPECT_TRUE(std::isnan((*got_loss)[0]));  // the out-of-range row's NaN reaches the mean
    EXPECT_TRUE(std::isnan((*want_loss)[0]));
  }
}

// Masked logits (-inf, as a causal or padding mask writes them) take no
// part in the normaliser: the online sum must not turn exp(-inf - -inf)
// into NaN when a thread's first logit is -inf.
TEST_F(CrossEntropyCudaTest, SoftmaxCrossEntropyForwardCuda_MinusInfinityLogits_MatchesCpu) {
  constexpr int kN = 3, kVocab = 2000;
  std::vector<float> logits = RandomNormal(60, int64_t{kN} * kVocab, 0.0f, 2.0f);
  for (int i = 0; i < kN; ++i) {
    for (int j = i; j < kVocab; j += 3) logits[int64_t{i} * kVocab + j] = -INFINITY;
  }
  std::vector<int32_t> targets = {1, 2, 3};  // never masked: (j - i) % 3 != 0
  const CpuForward cpu = RunCpuForward(logits, targets, kN, kVocab);
  GpuForward gpu;
  ASSERT_NO_FATAL_FAILURE(RunGpuForward(logits, targets, kN, kVocab, false, &gpu));
  ASSERT_TRUE(std::isfinite(gpu.loss));
  EXPECT_TRUE(AllClose("masked probs", gpu.probs, cpu.probs, kProbsAtol, kProbsRtol));
  EXPECT_TRUE(AllClose("masked loss", {gpu.loss}, {cpu.loss}, kLossAtol, kLossRtol));
}

// Shape checks happen before any CUDA call, so these run without a GPU.
TEST(CrossEntropyCudaArgumentsTest, SoftmaxCrossEntropyCuda_StrideBelowVocab_InvalidArgument) {
  const absl::Status forward =
      SoftmaxCrossEntropyForwardCuda(nullptr, nullptr, 2, 10, 9, nullptr, nullptr, nullptr);
  EXPECT_EQ(forward.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(forward.message().find("row stride 9"), std::string::npos) << forward;
  const absl::Status backward =
      SoftmaxCrossEntropyBackwardCuda(nullptr, nullptr, 2, 10, 9, 1.0f, nullptr);
  EXPECT_EQ(backward.code(), absl::StatusCode::kInvalidArgument);
  const absl::Status fused = SoftmaxCrossEntropyForwardBf16GradientCuda(nullptr, nullptr, 2, 10, 9,
                                                                        nullptr, nullptr, nullptr);
  EXPECT_EQ(fused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(fused.message().find("row stride 9"), std::string::npos) << fused;
}

TEST(CrossEntropyCudaArgumentsTest, SoftmaxCrossEntropyForwardCuda_ZeroRows_InvalidArgument) {
  const absl::Status status =
      SoftmaxCrossEntropyForwardCuda(nullptr, nullptr, 0, 10, 10, nullptr, nullptr, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("SoftmaxCrossEntropyForwardCuda: shape [0, 10]"),
            std::string::npos)
      << status;
}

TEST(CrossEntropyCudaArgumentsTest, SoftmaxCrossEntropyBackwardCuda_ZeroVocab_InvalidArgument) {
  const absl::Status status =
      SoftmaxCrossEntropyBackwardCuda(nullptr, nullptr, 4, 0, 0, 1.0f, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("SoftmaxCrossEntropyBackwardCuda: shape [4, 0]"),
            std::string::npos)
      << status;
}

}  // namespace
}  // namespace pipetrain
