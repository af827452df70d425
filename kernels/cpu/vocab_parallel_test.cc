// The vocabulary-parallel halves, summed over T simulated ranks here, against
// the unsplit kernels: the embedding bitwise, the cross-entropy within
// rounding. Vocabulary sizes include ones T does not divide evenly into
// powers of two and ranks whose slice holds no target.
#include "kernels/cpu/vocab_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/tensor.h"
#include "common/testing/gradient_check.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/embedding.h"

namespace pipetrain {
namespace {

using testing::RandomTensor;

// Rows [begin, end) of a [rows, cols] tensor.
Tensor RowSlice(const Tensor& full, int64_t begin, int64_t end) {
  const int64_t cols = full.shape()[1];
  Tensor out = Tensor::Zeros({end - begin, cols});
  std::copy(full.data() + begin * cols, full.data() + end * cols, out.data());
  return out;
}

struct Split {
  int begin, end;
};
std::vector<Split> SplitVocab(int vocab, int ranks) {
  std::vector<Split> out;
  for (int r = 0; r < ranks; ++r) out.push_back({vocab * r / ranks, vocab * (r + 1) / ranks});
  return out;
}

class VocabParallelTest : public ::testing::TestWithParam<int> {};

TEST_P(VocabParallelTest, Embedding_SumOverRanksEqualsUnsplitBitwise) {
  const int ranks = GetParam();
  constexpr int kBatch = 3, kSeq = 5, kC = 7, kVocab = 24;
  const Tensor wte = RandomTensor({kVocab, kC}, 11, 1.0f);
  const Tensor wpe = RandomTensor({kSeq, kC}, 12, 1.0f);
  const Tensor dout = RandomTensor({kBatch * kSeq, kC}, 13, 1.0f);
  // Token 5 repeats, so the backward's scatter-add has a row summed twice.
  std::vector<int32_t> tokens;
  for (int i = 0; i < kBatch * kSeq; ++i) tokens.push_back(i % 4 == 0 ? 5 : (i * 7) % kVocab);

  Tensor want = Tensor::Zeros({kBatch * kSeq, kC});
  EmbeddingForward(tokens.data(), wte.data(), wpe.data(), kBatch, kSeq, kC, want.data());
  Tensor want_dwte = Tensor::Zeros(wte.shape()), want_dwpe = Tensor::Zeros(wpe.shape());
  EmbeddingBackward(tokens.data(), dout.data(), kBatch, kSeq, kC, want_dwte.data(),
                    want_dwpe.data());

  Tensor sum = Tensor::Zeros(want.shape());
  for (int r = 0; r < ranks; ++r) {
    const Split s = SplitVocab(kVocab, ranks)[r];
    const Tensor slice = RowSlice(wte, s.begin, s.end);
    Tensor part = Tensor::Zeros(want.shape());
    VocabSliceEmbeddingForward(tokens.data(), slice.data(), r == 0 ? wpe.data() : nullptr, kBatch,
                               kSeq, kC, s.begin, s.end, part.data());
    for (int64_t i = 0; i < sum.numel(); ++i) sum[i] += part[i];

    Tensor dwte = Tensor::Zeros(slice.shape()), dwpe = Tensor::Zeros(wpe.shape());
    VocabSliceEmbeddingBackward(tokens.data(), dout.data(), kBatch, kSeq, kC, s.begin, s.end,
                                dwte.data(), dwpe.data());
    EXPECT_EQ(dwte.ToVector(), RowSlice(want_dwte, s.begin, s.end).ToVector()) << "rank " << r;
    EXPECT_EQ(dwpe.ToVector(), want_dwpe.ToVector()) << "rank " << r;
  }
  EXPECT_EQ(sum.ToVector(), want.ToVector());
}

TEST_P(VocabParallelTest, CrossEntropy_SplitEqualsUnsplitWithinRounding) {
  const int ranks = GetParam();
  constexpr int kRows = 6, kVocab = 29;
  constexpr float kDloss = 0.25f;
  Tensor logits = RandomTensor({kRows, kVocab}, 21, 3.0f);
  // Offsets of 500 would overflow exp without the global maximum.
  for (int64_t j = 0; j < kVocab; ++j) logits[3 * kVocab + j] += 500.0f;
  const std::vector<int32_t> targets = {0, 28, 14, 3, 27, 9};

  Tensor want_probs = Tensor::Zeros(logits.shape());
  const float want_loss = SoftmaxCrossEntropyForward(logits.data(), targets.data(), kRows, kVocab,
                                                     kVocab, want_probs.data());
  Tensor want_dlogits = Tensor::Zeros(logits.shape());
  SoftmaxCrossEntropyBackward(want_probs.data(), targets.data(), kRows, kVocab, kVocab, kDloss,
                              want_dlogits.data());

  const std::vector<Split> splits = SplitVocab(kVocab, ranks);
  std::vector<Tensor> local(ranks);
  // 1. Row maxima, reduced by max over the ranks.
  std::vector<float> global_max(kRows, -INFINITY);
  for (int r = 0; r < ranks; ++r) {
    local[r] = Tensor::Zeros({kRows, splits[r].end - splits[r].begin});
    for (int i = 0; i < kRows; ++i) {
      for (int j = splits[r].begin; j < splits[r].end; ++j) {
        local[r][i * local[r].shape()[1] + (j - splits[r].begin)] = logits[i * kVocab + j];
      }
    }
    std::vector<float> row_max(kRows);
    VocabSliceRowMax(local[r].data(), kRows, local[r].shape()[1], row_max.data());
    for (int i = 0; i < kRows; ++i) global_max[i] = std::max(global_max[i], row_max[i]);
  }
  // 2. Partial sums, summed over the ranks; probs in place over the logits.
  std::vector<float> z(kRows, 0.0f), target(kRows, 0.0f);
  for (int r = 0; r < ranks; ++r) {
    std::vector<float> sum_exp(kRows), target_shifted(kRows);
    VocabSliceSoftmaxPartials(local[r].data(), targets.data(), kRows, local[r].shape()[1],
                              splits[r].begin, global_max.data(), local[r].data(), sum_exp.data(),
                              target_shifted.data());
    for (int i = 0; i < kRows; ++i) {
      z[i] += sum_exp[i];
      target[i] += target_shifted[i];
    }
  }
  // 3. Every rank finishes with the same totals and gets the same loss.
  for (int r = 0; r < ranks; ++r) {
    const int local_vocab = local[r].shape()[1];
    const float loss =
        VocabSliceSoftmaxFinish(z.data(), target.data(), kRows, local_vocab, local[r].data());
    EXPECT_NEAR(loss, want_loss, 2e-6 * std::abs(want_loss) + 1e-6) << "rank " << r;
    Tensor dlogits = Tensor::Zeros(local[r].shape());
    VocabSliceCrossEntropyBackward(local[r].data(), targets.data(), kRows, local_vocab,
                                   splits[r].begin, kDloss, dlogits.data());
    for (int i = 0; i < kRows; ++i) {
      for (int j = 0; j < local_vocab; ++j) {
        const int64_t full = i * kVocab + splits[r].begin + j;
        EXPECT_NEAR(local[r][i * local_vocab + j], want_probs[full], 1e-6)
            << "probs rank " << r << " row " << i << " col " << j;
        EXPECT_NEAR(dlogits[i * local_vocab + j], want_dlogits[full], 1e-7)
            << "dlogits rank " << r << " row " << i << " col " << j;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, VocabParallelTest, ::testing::Values(1, 2, 3, 4));

}  // namespace
}  // namespace pipetrain
