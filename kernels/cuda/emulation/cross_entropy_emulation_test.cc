// The softmax cross-entropy kernels (cross_entropy_kernels.cuh), their own
// source run on the CPU through warp_emulation.h: the fp32 forward and
// backward against the softmax in double, and, as kernels/cuda/cross_entropy_test.cc checks
// it on a GPU, the forward that writes the head's gradient in bf16 against
// the fp32 forward and backward (the same kernels), rounded: bitwise, +0
// in the padding, NaN in a row whose target is out of range.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/tensor.h"
#include "common/testing/gradient_check.h"
#include "gtest/gtest.h"
#include "kernels/cpu/flash_attention.h"
#include "kernels/cuda/cross_entropy_kernels.cuh"
#include "kernels/cuda/emulation/warp_emulation.h"

namespace pipetrain {
namespace {

using cuda_emulation::LaunchEmulated;

struct Case {
  int n, vocab, ld;
};

// What the kernels write for one case, launched as cross_entropy.cu
// launches them (one block of kRowThreads per row; one kMeanThreads block
// for the mean).
struct Emulated {
  std::vector<float> probs, row_losses, dlogits;
  std::vector<uint16_t> gradient;
  std::vector<float> bf16_row_losses;
  float loss = NAN, bf16_loss = NAN;
};

Emulated RunEmulated(const Case& c, const std::vector<float>& logits,
                     const std::vector<int32_t>& targets) {
  const size_t size = static_cast<size_t>(c.n) * c.ld;
  const float scale = 1.0f / c.n;  // cross_entropy.cu's for dloss = 1
  Emulated e;
  e.probs.assign(size, 0.0f);
  e.dlogits.assign(size, 0.0f);
  e.gradient.assign(size, 0x1234);  // not a value the kernel writes
  e.row_losses.assign(c.n, NAN);
  e.bf16_row_losses.assign(c.n, NAN);
  const unsigned rows = static_cast<unsigned>(c.n);
  LaunchEmulated(rows, 1, kRowThreads, 0, [&] {
    SoftmaxCrossEntropyRowKernel<false>(logits.data(), targets.data(), c.vocab, c.ld,
                                        e.probs.data(), 0.0f, nullptr, e.row_losses.data());
  });
  LaunchEmulated(1, 1, kMeanThreads, 0, [&] { MeanLossKernel(e.row_losses.data(), c.n, &e.loss); });
  LaunchEmulated(rows, 1, kRowThreads, 0, [&] {
    SoftmaxCrossEntropyBackwardKernel(e.probs.data(), targets.data(), c.vocab, c.ld, scale,
                                      e.dlogits.data());
  });
  LaunchEmulated(rows, 1, kRowThreads, 0, [&] {
    SoftmaxCrossEntropyRowKernel<true>(logits.data(), targets.data(), c.vocab, c.ld, nullptr, scale,
                                       e.gradient.data(), e.bf16_row_losses.data());
  });
  LaunchEmulated(1, 1, kMeanThreads, 0,
                 [&] { MeanLossKernel(e.bf16_row_losses.data(), c.n, &e.bf16_loss); });
  return e;
}

std::vector<int32_t> Targets(const Case& c, uint64_t seed) {
  std::vector<int32_t> targets(c.n);
  for (int i = 0; i < c.n; ++i)
    targets[i] = static_cast<int32_t>((seed * 7919 + i * 104729) % c.vocab);
  return targets;
}

// Unpadded and padded rows, one row short of a block's threads and many
// logits a thread (50257 over 512 threads).
const Case kCases[] = {{9, 13, 13}, {5, 1000, 1024}, {3, 50257, 50304}};

// Against the softmax in double: the kernels' probabilities come within
// about 1.1e-6 relative of it at these shapes (expf's 2 ulp, the
// normaliser's per-thread and tree sums), and a row's loss within a few
// ulp of lse ~ 15. (kernels/cpu's float softmax, the GPU parity test's
// reference, sums a row left to right and drifts by up to 5.8e-5
// relative at vocab 50257 on these inputs, so it is not the yardstick
// here.)
constexpr double kProbsRtol = 5e-6, kProbsAtol = 1e-12;
constexpr double kLossAtol = 2e-5;

TEST(CrossEntropyEmulationTest, Fp32ForwardAndBackward_CloseToTheSoftmaxInDouble) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "n " << c.n << ", vocab " << c.vocab << ", ld " << c.ld);
    const std::vector<float> logits =
        testing::RandomTensor({int64_t{c.n} * c.ld}, 70, 3.0f).ToVector();
    const std::vector<int32_t> targets = Targets(c, 1);
    const Emulated e = RunEmulated(c, logits, targets);
    int bad = 0;
    double mean = 0;
    for (int i = 0; i < c.n; ++i) {
      const float* x = logits.data() + static_cast<size_t>(i) * c.ld;
      double max = x[0], sum = 0;
      for (int j = 1; j < c.vocab; ++j) max = std::max(max, double{x[j]});
      for (int j = 0; j < c.vocab; ++j) sum += std::exp(x[j] - max);
      for (int j = 0; j < c.vocab; ++j) {
        const size_t at = static_cast<size_t>(i) * c.ld + j;
        const double want = std::exp(x[j] - max) / sum;
        const double got = e.probs[at];
        if (!(std::fabs(got - want) <= kProbsAtol + kProbsRtol * want) && ++bad <= 5) {
          ADD_FAILURE() << "probs[" << i << "][" << j << "] " << got << " vs " << want;
        }
        // The mean loss's gradient (p - onehot) / n, from those
        // probabilities (the targets' p stay far below 1 here, so p - 1
        // does not cancel).
        const double want_d = (want - (j == targets[i] ? 1.0 : 0.0)) / c.n;
        if (!(std::fabs(e.dlogits[at] - want_d) <= kProbsAtol + kProbsRtol * std::fabs(want_d)) &&
            ++bad <= 5) {
          ADD_FAILURE() << "dlogits[" << i << "][" << j << "] " << e.dlogits[at] << " vs "
                        << want_d;
        }
      }
      const double row_loss = max + std::log(sum) - x[targets[i]];
      EXPECT_NEAR(e.row_losses[i], row_loss, kLossAtol) << "row " << i;
      mean += row_loss / c.n;
    }
    EXPECT_EQ(bad, 0);
    EXPECT_NEAR(e.loss, mean, kLossAtol);
  }
}

TEST(CrossEntropyEmulationTest, Bf16GradientForward_IsTheFp32PassesRounded) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "n " << c.n << ", vocab " << c.vocab << ", ld " << c.ld);
    const std::vector<float> logits =
        testing::RandomTensor({int64_t{c.n} * c.ld}, 71, 3.0f).ToVector();
    std::vector<int32_t> targets = Targets(c, 2);
    targets[1] = c.vocab;  // out of range: a NaN row
    const Emulated e = RunEmulated(c, logits, targets);
    int bad = 0;
    for (int i = 0; i < c.n; ++i) {
      for (int j = 0; j < c.ld; ++j) {
        const size_t at = static_cast<size_t>(i) * c.ld + j;
        const uint32_t bits = uint32_t{e.gradient[at]} << 16;
        float got;
        std::memcpy(&got, &bits, sizeof(got));
        const bool ok = j >= c.vocab ? bits == 0
                        : i == 1     ? std::isnan(got)
                                     : got == RoundToBf16(e.dlogits[at]);
        if (!ok && ++bad <= 5) ADD_FAILURE() << "row " << i << ", column " << j;
      }
    }
    EXPECT_EQ(bad, 0);
    for (int i = 0; i < c.n; ++i) {  // bitwise, NaN included
      EXPECT_EQ(std::memcmp(&e.bf16_row_losses[i], &e.row_losses[i], sizeof(float)), 0)
          << "row " << i;
    }
    EXPECT_TRUE(std::isnan(e.bf16_loss));  // the NaN row reaches the mean
    EXPECT_TRUE(std::isnan(e.loss));
  }
}

// A NaN logit makes its row's loss NaN, as the CPU's softmax sum does, also
// when it is the only logit its thread reads (vocab <= the block's
// threads) and so never sets that thread's max.
TEST(CrossEntropyEmulationTest, NanLogit_RowLossAndMeanAreNan) {
  for (const Case& c : {Case{2, 300, 300}, Case{2, 1000, 1024}}) {
    SCOPED_TRACE(::testing::Message() << "vocab " << c.vocab);
    std::vector<float> logits = testing::RandomTensor({int64_t{c.n} * c.ld}, 72, 3.0f).ToVector();
    const std::vector<int32_t> targets = {1, 1};
    logits[5] = NAN;  // row 0, not its target
    const Emulated e = RunEmulated(c, logits, targets);
    EXPECT_TRUE(std::isnan(e.row_losses[0])) << e.row_losses[0];
    EXPECT_FALSE(std::isnan(e.row_losses[1])) << e.row_losses[1];
    EXPECT_TRUE(std::isnan(e.loss));
    EXPECT_TRUE(std::isnan(e.bf16_row_losses[0])) << e.bf16_row_losses[0];
    EXPECT_TRUE(std::isnan(e.bf16_loss));
  }
}

}  // namespace
}  // namespace pipetrain
