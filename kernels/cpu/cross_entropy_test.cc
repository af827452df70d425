#include "kernels/cpu/cross_entropy.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/tensor.h"
#include "common/testing/gradient_check.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using testing::CheckClose;
using testing::CheckGradients;
using testing::RandomTensor;

constexpr int kRows = 4;
constexpr int kVocab = 11;

struct NaiveCrossEntropy {
  double loss = 0.0;
  std::vector<double> probs;
};

// log-softmax with std::exp and std::log in double; mean of -log p[target].
NaiveCrossEntropy ReferenceCrossEntropy(const Tensor& logits, const std::vector<int32_t>& targets) {
  NaiveCrossEntropy r;
  for (int i = 0; i < kRows; ++i) {
    const float* x = logits.data() + i * kVocab;
    double max = x[0];
    for (int j = 1; j < kVocab; ++j) max = std::max(max, double{x[j]});
    double sum = 0.0;
    for (int j = 0; j < kVocab; ++j) sum += std::exp(x[j] - max);
    const double log_sum = max + std::log(sum);
    for (int j = 0; j < kVocab; ++j) r.probs.push_back(std::exp(x[j] - log_sum));
    r.loss += log_sum - x[targets[i]];
  }
  r.loss /= kRows;
  return r;
}

struct CrossEntropyCase {
  Tensor logits = RandomTensor({kRows, kVocab}, 1, 2.0f);
  std::vector<int32_t> targets = {0, 10, 3, 3};
  Tensor probs = Tensor::Zeros({kRows, kVocab});

  double Forward() {
    return SoftmaxCrossEntropyForward(logits.data(), targets.data(), kRows, kVocab, kVocab,
                                      probs.data());
  }
};

TEST(SoftmaxCrossEntropyForwardTest, RandomLogits_LossAndProbsMatchNaive) {
  CrossEntropyCase c;
  const double loss = c.Forward();
  const NaiveCrossEntropy ref = ReferenceCrossEntropy(c.logits, c.targets);
  // The loss is accumulated in double and rounded to float once; logsumexp
  // goes through fp32 sums of 11 terms and std::log: a few eps32 relative.
  EXPECT_NEAR(loss, ref.loss, 1e-6 * ref.loss);
  absl::Status status = CheckClose("probs", c.probs, ref.probs, 1e-8, 1e-6);
  EXPECT_TRUE(status.ok()) << status;
}

TEST(SoftmaxCrossEntropyForwardTest, UniformLogits_LossIsLogVocab) {
  for (float value : {0.0f, 3.7f, -50.0f}) {
    CrossEntropyCase c;
    c.logits.Fill(value);
    const double loss = c.Forward();
    EXPECT_NEAR(loss, std::log(double{kVocab}), 1e-6) << "logits all " << value;
    for (int64_t i = 0; i < c.probs.numel(); ++i) EXPECT_NEAR(c.probs[i], 1.0 / kVocab, 1e-7);
  }
}

TEST(SoftmaxCrossEntropyForwardTest, LargeLogits_FiniteAndMatchNaive) {
  // Offsets of 1000 and spreads of +-80 overflow a naive exp without the max
  // subtraction; the loss must stay finite and exact, also when the target's
  // probability underflows fp32.
  CrossEntropyCase c;
  for (int64_t i = 0; i < c.logits.numel(); ++i) c.logits[i] = 1000.0f + 40.0f * c.logits[i];
  const double loss = c.Forward();
  const NaiveCrossEntropy ref = ReferenceCrossEntropy(c.logits, c.targets);
  ASSERT_TRUE(std::isfinite(loss));
  // logsumexp ~ 1100 is a float: half an ulp there is 6e-5 per row.
  EXPECT_NEAR(loss, ref.loss, 2e-4);
  for (int64_t i = 0; i < c.probs.numel(); ++i) ASSERT_TRUE(std::isfinite(c.probs[i])) << i;
}

TEST(SoftmaxCrossEntropyBackwardTest, HalfDloss_MatchesFiniteDifferences) {
  constexpr float kDloss = 0.5f;
  CrossEntropyCase c;
  auto loss = [&] { return kDloss * c.Forward(); };
  c.Forward();
  Tensor dlogits = Tensor::Zeros(c.logits.shape());
  SoftmaxCrossEntropyBackward(c.probs.data(), c.targets.data(), kRows, kVocab, kVocab, kDloss,
                              dlogits.data());
  testing::GradCheckOptions options;
  options.max_elements = kRows * kVocab;  // All 44.
  absl::Status status = CheckGradients(loss, {{"logits", &c.logits, dlogits}}, options);
  EXPECT_TRUE(status.ok()) << status;
}

TEST(SoftmaxCrossEntropyBackwardTest, InPlaceOverProbs_SameAsSeparateOutput) {
  CrossEntropyCase c;
  c.Forward();
  Tensor separate = Tensor::Zeros(c.probs.shape());
  SoftmaxCrossEntropyBackward(c.probs.data(), c.targets.data(), kRows, kVocab, kVocab, 0.5f,
                              separate.data());
  SoftmaxCrossEntropyBackward(c.probs.data(), c.targets.data(), kRows, kVocab, kVocab, 0.5f,
                              c.probs.data());
  EXPECT_EQ(c.probs.ToVector(), separate.ToVector());
  // Each row of (p - onehot) sums to zero.
  for (int i = 0; i < kRows; ++i) {
    double sum = 0.0;
    for (int j = 0; j < kVocab; ++j) sum += separate[i * kVocab + j];
    EXPECT_NEAR(sum, 0.0, 1e-7) << "row " << i;
  }
}

TEST(SoftmaxCrossEntropyTest, PaddedRows_SameValuesAndPaddingUntouched) {
  // Rows of stride 16 > vocab 11: the same loss, probabilities and
  // gradients bitwise as the packed layout, and the 5 floats after each
  // row neither read (NaN there changes nothing) nor written.
  constexpr int kLd = 16;
  CrossEntropyCase c;
  const float packed_loss = c.Forward();
  Tensor packed_dlogits = Tensor::Zeros(c.logits.shape());
  SoftmaxCrossEntropyBackward(c.probs.data(), c.targets.data(), kRows, kVocab, kVocab, 0.5f,
                              packed_dlogits.data());

  Tensor logits = Tensor::Filled({kRows, kLd}, NAN);
  for (int i = 0; i < kRows; ++i) {
    for (int j = 0; j < kVocab; ++j) logits[i * kLd + j] = c.logits[i * kVocab + j];
  }
  Tensor probs = Tensor::Filled({kRows, kLd}, -7.0f);
  const float loss =
      SoftmaxCrossEntropyForward(logits.data(), c.targets.data(), kRows, kVocab, kLd, probs.data());
  Tensor dlogits = Tensor::Filled({kRows, kLd}, -9.0f);
  SoftmaxCrossEntropyBackward(probs.data(), c.targets.data(), kRows, kVocab, kLd, 0.5f,
                              dlogits.data());
  EXPECT_EQ(loss, packed_loss);
  for (int i = 0; i < kRows; ++i) {
    for (int j = 0; j < kLd; ++j) {
      if (j < kVocab) {
        EXPECT_EQ(probs[i * kLd + j], c.probs[i * kVocab + j]) << i << "," << j;
        EXPECT_EQ(dlogits[i * kLd + j], packed_dlogits[i * kVocab + j]) << i << "," << j;
      } else {
        EXPECT_EQ(probs[i * kLd + j], -7.0f) << i << "," << j;
        EXPECT_EQ(dlogits[i * kLd + j], -9.0f) << i << "," << j;
      }
    }
  }
}

}  // namespace
}  // namespace pipetrain
