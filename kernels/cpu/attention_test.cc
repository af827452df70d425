#include "kernels/cpu/attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "common/tensor.h"
#include "common/testing/gradient_check.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using testing::CheckClose;
using testing::CheckGradients;
using testing::DotLoss;
using testing::RandomTensor;

constexpr int kBatch = 2;
constexpr int kSeq = 5;
constexpr int kChannels = 8;
constexpr int kHeads = 2;
constexpr int kHeadDim = kChannels / kHeads;
constexpr int kProbs = kBatch * kHeads * kSeq * kSeq;

// Flat offset of q (part 0), k (1) or v (2), channel h*hd + d, at (b, t).
int QkvIndex(int b, int t, int part, int h, int d) {
  return (b * kSeq + t) * 3 * kChannels + part * kChannels + h * kHeadDim + d;
}

struct NaiveAttention {
  std::vector<double> out = std::vector<double>(kBatch * kSeq * kChannels);
  std::vector<double> probs = std::vector<double>(kProbs, 0.0);
};

// Explicit loops in double: scores, causal softmax with std::exp, P v.
NaiveAttention ReferenceAttention(const Tensor& qkv) {
  NaiveAttention r;
  const double scale = 1.0 / std::sqrt(double{kHeadDim});
  for (int b = 0; b < kBatch; ++b) {
    for (int h = 0; h < kHeads; ++h) {
      double* p = &r.probs[(b * kHeads + h) * kSeq * kSeq];
      for (int t = 0; t < kSeq; ++t) {
        std::vector<double> s(t + 1);
        double max = -std::numeric_limits<double>::infinity();
        for (int j = 0; j <= t; ++j) {
          s[j] = 0.0;
          for (int d = 0; d < kHeadDim; ++d) {
            s[j] += double{qkv[QkvIndex(b, t, 0, h, d)]} * qkv[QkvIndex(b, j, 1, h, d)];
          }
          s[j] *= scale;
          max = std::max(max, s[j]);
        }
        double sum = 0.0;
        for (int j = 0; j <= t; ++j) sum += std::exp(s[j] - max);
        for (int j = 0; j <= t; ++j) p[t * kSeq + j] = std::exp(s[j] - max) / sum;
        for (int d = 0; d < kHeadDim; ++d) {
          double o = 0.0;
          for (int j = 0; j <= t; ++j) o += p[t * kSeq + j] * qkv[QkvIndex(b, j, 2, h, d)];
          r.out[(b * kSeq + t) * kChannels + h * kHeadDim + d] = o;
        }
      }
    }
  }
  return r;
}

struct AttentionCase {
  Tensor qkv = RandomTensor({kBatch, kSeq, 3 * kChannels}, 1);
  Tensor dout = RandomTensor({kBatch, kSeq, kChannels}, 2);  // Projection weights.
  Tensor out = Tensor::Zeros({kBatch, kSeq, kChannels});
  Tensor probs = Tensor::Zeros({kBatch, kHeads, kSeq, kSeq});

  void Forward() {
    AttentionForward(qkv.data(), kBatch, kSeq, kChannels, kHeads, out.data(), probs.data());
  }
};

TEST(AttentionForwardTest, RandomQkv_OutputAndProbsMatchNaive) {
  // Scores are 4-term fp32 dot products and FastExp is within 1e-7
  // relative: errors are a few 1e-7; 2e-6 leaves a margin.
  AttentionCase c;
  c.Forward();
  const NaiveAttention ref = ReferenceAttention(c.qkv);
  absl::Status status = CheckClose("out", c.out, ref.out, 2e-6, 2e-6);
  EXPECT_TRUE(status.ok()) << status;
  status = CheckClose("probs", c.probs, ref.probs, 2e-6, 2e-6);
  EXPECT_TRUE(status.ok()) << status;
}

TEST(AttentionForwardTest, Probs_RowsSumToOneAndZeroAboveDiagonal) {
  AttentionCase c;
  c.probs.Fill(std::numeric_limits<float>::quiet_NaN());  // Every entry must be written.
  c.Forward();
  for (int bh = 0; bh < kBatch * kHeads; ++bh) {
    for (int t = 0; t < kSeq; ++t) {
      const float* row = c.probs.data() + (bh * kSeq + t) * kSeq;
      double sum = 0.0;
      for (int j = 0; j <= t; ++j) {
        EXPECT_GT(row[j], 0.0f);
        sum += row[j];
      }
      EXPECT_NEAR(sum, 1.0, 1e-6) << "block " << bh << " row " << t;
      for (int j = t + 1; j < kSeq; ++j) EXPECT_EQ(row[j], 0.0f) << "row " << t << " col " << j;
    }
  }
  // Position 0 attends only to itself.
  EXPECT_EQ(c.probs[0], 1.0f);
}

TEST(AttentionForwardTest, ChangingLaterPosition_LeavesEarlierOutputsUnchanged) {
  AttentionCase c;
  c.Forward();
  const Tensor before = c.out.Clone();
  constexpr int kChangedBatch = 1, kChangedPos = 3;
  for (int part = 0; part < 3; ++part) {
    for (int h = 0; h < kHeads; ++h) {
      for (int d = 0; d < kHeadDim; ++d) {
        c.qkv[QkvIndex(kChangedBatch, kChangedPos, part, h, d)] += 1.5f;
      }
    }
  }
  c.Forward();
  for (int b = 0; b < kBatch; ++b) {
    for (int t = 0; t < kSeq; ++t) {
      bool changed = false;
      for (int j = 0; j < kChannels; ++j) {
        const int i = (b * kSeq + t) * kChannels + j;
        changed |= c.out[i] != before[i];
      }
      // Only batch 1 at positions >= 3 may (and does) change, bit for bit.
      EXPECT_EQ(changed, b == kChangedBatch && t >= kChangedPos) << "batch " << b << " pos " << t;
    }
  }
}

TEST(AttentionBackwardTest, AllOfQkv_MatchesFiniteDifferences) {
  AttentionCase c;
  auto loss = [&] {
    c.Forward();
    return DotLoss(c.out, c.dout);
  };
  c.Forward();
  Tensor dqkv = Tensor::Zeros(c.qkv.shape());
  dqkv.Fill(std::numeric_limits<float>::quiet_NaN());  // The backward must write all of it.
  // Exactly seq_len^2 floats, so AddressSanitizer sees any overrun.
  std::vector<float> scratch(kSeq * kSeq);
  AttentionBackward(c.qkv.data(), c.probs.data(), c.dout.data(), kBatch, kSeq, kChannels, kHeads,
                    dqkv.data(), scratch.data());
  testing::GradCheckOptions options;
  options.max_elements = static_cast<int>(c.qkv.numel());  // All 240: q, k and v parts.
  absl::Status status = CheckGradients(loss, {{"qkv", &c.qkv, dqkv}}, options);
  EXPECT_TRUE(status.ok()) << status;
}

TEST(AttentionBackwardTest, LastPositionKeyAndValue_GetGradientOnlyFromLastQuery) {
  // k and v at the last position are seen only by the last query: with dout
  // zero there, their gradients are exactly zero.
  AttentionCase c;
  for (int b = 0; b < kBatch; ++b) {
    for (int j = 0; j < kChannels; ++j) c.dout[(b * kSeq + kSeq - 1) * kChannels + j] = 0.0f;
  }
  c.Forward();
  Tensor dqkv = Tensor::Zeros(c.qkv.shape());
  std::vector<float> scratch(kSeq * kSeq);
  AttentionBackward(c.qkv.data(), c.probs.data(), c.dout.data(), kBatch, kSeq, kChannels, kHeads,
                    dqkv.data(), scratch.data());
  for (int b = 0; b < kBatch; ++b) {
    for (int h = 0; h < kHeads; ++h) {
      for (int d = 0; d < kHeadDim; ++d) {
        EXPECT_EQ(dqkv[QkvIndex(b, kSeq - 1, 1, h, d)], 0.0f);
        EXPECT_EQ(dqkv[QkvIndex(b, kSeq - 1, 2, h, d)], 0.0f);
      }
    }
  }
}

}  // namespace
}  // namespace pipetrain
