#include "kernels/cpu/embedding.h"

#include <cstdint>
#include <vector>

#include "common/philox.h"
#include "common/tensor.h"
#include "common/testing/gradient_check.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using testing::CheckGradients;
using testing::DotLoss;
using testing::RandomTensor;

constexpr int kBatch = 2;
constexpr int kSeq = 4;
constexpr int kChannels = 8;
constexpr int kVocab = 11;
constexpr int kMaxSeq = 6;  // wpe has more rows than seq_len uses.

struct EmbeddingCase {
  // Token 3 occurs four times (twice at the same position in different
  // sequences), 7 twice; tokens 1, 2, 4, 5, 6, 8 and 9 never occur.
  std::vector<int32_t> tokens = {3, 3, 7, 3, 0, 10, 7, 3};
  Tensor wte = RandomTensor({kVocab, kChannels}, 1);
  Tensor wpe = RandomTensor({kMaxSeq, kChannels}, 2);
  Tensor dout = RandomTensor({kBatch * kSeq, kChannels}, 3);  // Projection weights.
  Tensor out = Tensor::Zeros({kBatch * kSeq, kChannels});

  void Forward() {
    EmbeddingForward(tokens.data(), wte.data(), wpe.data(), kBatch, kSeq, kChannels, out.data());
  }
  void Backward(Tensor* dwte, Tensor* dwpe) const {
    EmbeddingBackward(tokens.data(), dout.data(), kBatch, kSeq, kChannels, dwte->data(),
                      dwpe->data());
  }
};

TEST(EmbeddingForwardTest, RepeatedTokens_RowIsTokenPlusPosition) {
  EmbeddingCase c;
  c.Forward();
  for (int b = 0; b < kBatch; ++b) {
    for (int t = 0; t < kSeq; ++t) {
      const int row = b * kSeq + t;
      for (int j = 0; j < kChannels; ++j) {
        // One fp32 addition: the naive sum is bit-identical.
        EXPECT_EQ(c.out[row * kChannels + j],
                  c.wte[c.tokens[row] * kChannels + j] + c.wpe[t * kChannels + j])
            << "b " << b << " t " << t << " j " << j;
      }
    }
  }
}

TEST(EmbeddingBackwardTest, RepeatedTokens_ScatterAddIntoExistingGradients) {
  EmbeddingCase c;
  Tensor dwte = Tensor::Zeros(c.wte.shape());
  Tensor dwpe = Tensor::Zeros(c.wpe.shape());
  dwte.Fill(1.0f);  // Accumulates onto what is there.
  c.Backward(&dwte, &dwpe);
  // Naive scatter in double: every occurrence of a token adds its row.
  std::vector<double> want_wte(dwte.numel(), 1.0), want_wpe(dwpe.numel(), 0.0);
  for (int row = 0; row < kBatch * kSeq; ++row) {
    const int t = row % kSeq;
    for (int j = 0; j < kChannels; ++j) {
      want_wte[c.tokens[row] * kChannels + j] += c.dout[row * kChannels + j];
      want_wpe[t * kChannels + j] += c.dout[row * kChannels + j];
    }
  }
  absl::Status status = testing::CheckClose("dwte", dwte, want_wte, 1e-6, 1e-6);
  EXPECT_TRUE(status.ok()) << status;
  status = testing::CheckClose("dwpe", dwpe, want_wpe, 1e-6, 1e-6);
  EXPECT_TRUE(status.ok()) << status;
  // Unused vocabulary rows and positions beyond seq_len are untouched.
  for (int j = 0; j < kChannels; ++j) {
    EXPECT_EQ(dwte[2 * kChannels + j], 1.0f);
    EXPECT_EQ(dwpe[(kMaxSeq - 1) * kChannels + j], 0.0f);
  }
}

TEST(EmbeddingBackwardTest, WteAndWpe_MatchFiniteDifferences) {
  EmbeddingCase c;
  auto loss = [&] {
    c.Forward();
    return DotLoss(c.out, c.dout);
  };
  Tensor dwte = Tensor::Zeros(c.wte.shape());
  Tensor dwpe = Tensor::Zeros(c.wpe.shape());
  c.Backward(&dwte, &dwpe);
  testing::GradCheckOptions options;
  options.max_elements = kVocab * kChannels;  // All 88 (unused rows must be 0 too).
  absl::Status status =
      CheckGradients(loss, {{"wte", &c.wte, dwte}, {"wpe", &c.wpe, dwpe}}, options);
  EXPECT_TRUE(status.ok()) << status;
}

TEST(GroupRowsByTokenTest, RepeatedTokens_GroupsInTokenOrderRowsInRowOrder) {
  const EmbeddingCase c;  // tokens 3 3 7 3 0 10 7 3
  const TokenRowGroups g = GroupRowsByToken(c.tokens.data(), kBatch * kSeq, kVocab);
  EXPECT_EQ(g.groups, 4);
  EXPECT_EQ(g.dropped, 0);
  EXPECT_EQ(g.index, (std::vector<int32_t>{0, 3, 7, 10,          // tokens
                                           0, 1, 5, 7, 8,        // starts
                                           4, 0, 1, 3, 7, 2, 6,  // rows of 0, 3, 7
                                           5}))                  // row of 10
      << "layout: tokens, starts, rows";
  EXPECT_EQ(g.tokens()[1], 3);
  EXPECT_EQ(g.starts()[1], 1);
  EXPECT_EQ(g.rows()[0], 4);
}

TEST(GroupRowsByTokenTest, OutOfRangeTokens_LeftOutAndCounted) {
  const std::vector<int32_t> tokens = {2, -1, 4, 2, 1 << 30, 0};
  const TokenRowGroups g = GroupRowsByToken(tokens.data(), 6, /*vocab=*/4);
  EXPECT_EQ(g.dropped, 3);
  EXPECT_EQ(g.groups, 2);
  EXPECT_EQ(g.index, (std::vector<int32_t>{0, 2, 0, 1, 3, 5, 0, 3}));
}

TEST(GroupRowsByTokenTest, NoRows_NoGroups) {
  const TokenRowGroups g = GroupRowsByToken(nullptr, 0, 10);
  EXPECT_EQ(g.groups, 0);
  EXPECT_EQ(g.dropped, 0);
  EXPECT_EQ(g.index, std::vector<int32_t>{0});  // starts[0] = 0
}

// The contract the CUDA backward relies on: adding each group's rows to its
// table row, group by group and in the index's row order, gives exactly
// (bitwise) what EmbeddingBackward gives, on random batches with heavy
// repeats and with a vocabulary larger than the batch.
TEST(GroupRowsByTokenTest, ReplayInIndexOrder_BitwiseEqualsEmbeddingBackward) {
  struct Shape {
    int rows, c, vocab;
  };
  for (const Shape& s : {Shape{1, 3, 1}, Shape{37, 5, 4}, Shape{300, 7, 1000}, Shape{513, 2, 9}}) {
    std::vector<int32_t> tokens(s.rows);
    for (int r = 0; r < s.rows; ++r) {
      tokens[r] = static_cast<int32_t>(UniformIndex(17, r, 0, 0, s.vocab));
    }
    const Tensor dout = RandomTensor({s.rows, s.c}, 5);
    Tensor want = RandomTensor({s.vocab, s.c}, 6);
    Tensor got = want;
    Tensor dwpe = Tensor::Zeros({s.rows, s.c});  // one sequence of s.rows positions
    EmbeddingBackward(tokens.data(), dout.data(), 1, s.rows, s.c, want.data(), dwpe.data());

    const TokenRowGroups g = GroupRowsByToken(tokens.data(), s.rows, s.vocab);
    ASSERT_EQ(g.index.size(), static_cast<size_t>(2 * g.groups + 1 + s.rows));
    for (int32_t group = 0; group < g.groups; ++group) {
      for (int32_t k = g.starts()[group]; k < g.starts()[group + 1]; ++k) {
        for (int j = 0; j < s.c; ++j) {
          got[g.tokens()[group] * s.c + j] += dout[g.rows()[k] * s.c + j];
        }
      }
    }
    for (int64_t i = 0; i < want.numel(); ++i) {
      ASSERT_EQ(got[i], want[i]) << "rows " << s.rows << " vocab " << s.vocab << " element " << i;
    }
  }
}

}  // namespace
}  // namespace pipetrain
