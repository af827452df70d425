#include "worker/data/dataset.h"

#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// Token i has id i, so a window's start can be read off its first input.
std::vector<uint16_t> Ramp(int n) {
  std::vector<uint16_t> tokens(n);
  for (int i = 0; i < n; ++i) tokens[i] = static_cast<uint16_t>(i);
  return tokens;
}

// Pseudo-random ids in [0, 256): windows cannot be told apart by position.
std::vector<uint16_t> Scrambled(int n) {
  std::vector<uint16_t> tokens(n);
  for (int i = 0; i < n; ++i) tokens[i] = static_cast<uint16_t>((i * 2654435761u) >> 24);
  return tokens;
}

Dataset MakeDataset(std::vector<uint16_t> tokens, int seq_len, double val_fraction) {
  absl::StatusOr<Dataset> dataset = Dataset::Create(std::move(tokens), seq_len, val_fraction);
  EXPECT_TRUE(dataset.ok()) << dataset.status();
  return *std::move(dataset);
}

void ExpectInvalid(const absl::StatusOr<Dataset>& result, const std::string& fragment) {
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), fragment))
      << result.status() << " lacks \"" << fragment << "\"";
}

TEST(DatasetTest, Create_SeqLenBelowOne_InvalidArgument) {
  ExpectInvalid(Dataset::Create(Ramp(100), 0, 0.0), "seq_len is 0; it must be >= 1");
}

TEST(DatasetTest, Create_ValFractionOutOfRange_InvalidArgument) {
  ExpectInvalid(Dataset::Create(Ramp(100), 4, 1.0), "val_fraction is 1; it must be in [0, 1)");
  ExpectInvalid(Dataset::Create(Ramp(100), 4, -0.1), "must be in [0, 1)");
  ExpectInvalid(Dataset::Create(Ramp(100), 4, std::nan("")), "must be in [0, 1)");
}

TEST(DatasetTest, Create_TrainSplitTooSmall_NamesCountsAndRemedy) {
  ExpectInvalid(Dataset::Create(Ramp(40), 64, 0.0),
                "train split has 40 tokens; need at least seq_len + 1 = 65; use a larger file "
                "or a smaller --seq-len");
}

// A job's worker names the spec's fields: the flags are train-local's.
TEST(DatasetTest, Create_SplitTooSmall_RemedyInTheCallersNames) {
  const DatasetSettingNames spec = {.seq_len = "spec.training.seq_len",
                                    .val_fraction = "spec.data.val_fraction"};
  ExpectInvalid(Dataset::Create(Ramp(40), 64, 0.1, spec),
                "use a larger file, a smaller spec.training.seq_len or a smaller "
                "spec.data.val_fraction");
  ExpectInvalid(Dataset::Create(Ramp(100), 8, 0.05, spec),
                "use a larger file, a larger spec.data.val_fraction or a smaller "
                "spec.training.seq_len (or spec.data.val_fraction 0 for no validation)");
}

TEST(DatasetTest, Create_ValSplitTooSmall_NamesCountsAndRemedy) {
  // 100 tokens, 5% -> 5 val tokens, fewer than seq_len + 1 = 9.
  ExpectInvalid(Dataset::Create(Ramp(100), 8, 0.05),
                "val split has 5 tokens; need at least seq_len + 1 = 9");
}

TEST(DatasetTest, Create_ValFractionTooSmallForAnyToken_InvalidArgument) {
  ExpectInvalid(Dataset::Create(Ramp(100), 8, 0.001), "val split has 0 tokens");
}

TEST(DatasetTest, Create_MinimalTrainSplit_Accepted) {
  Dataset dataset = MakeDataset(Ramp(9), 8, 0.0);
  EXPECT_EQ(dataset.train_tokens(), 9);
  EXPECT_EQ(dataset.val_tokens(), 0);
  EXPECT_EQ(dataset.num_val_windows(), 0);
  for (int64_t index = 0; index < 50; ++index) {
    EXPECT_EQ(dataset.TrainWindowStart(1, 0, index), 0);
  }
}

TEST(DatasetTest, Create_ValFraction_SplitsAtTokenBoundary) {
  Dataset dataset = MakeDataset(Ramp(1000), 16, 0.1);
  EXPECT_EQ(dataset.seq_len(), 16);
  EXPECT_EQ(dataset.train_tokens(), 900);
  EXPECT_EQ(dataset.val_tokens(), 100);
  TokenBatch first = dataset.ValBatch(0, 1);
  EXPECT_EQ(first.inputs[0], 900);  // the val split starts right after train
}

TEST(DatasetTest, TrainBatch_SameArguments_SameBatch) {
  Dataset dataset = MakeDataset(Scrambled(5000), 32, 0.1);
  TokenBatch a = dataset.TrainBatch(42, 7, 0, 8);
  TokenBatch b = dataset.TrainBatch(42, 7, 0, 8);
  EXPECT_EQ(a.batch, 8);
  EXPECT_EQ(a.seq_len, 32);
  ASSERT_EQ(a.inputs.size(), 8u * 32u);
  ASSERT_EQ(a.targets.size(), 8u * 32u);
  EXPECT_EQ(a.inputs, b.inputs);
  EXPECT_EQ(a.targets, b.targets);
}

TEST(DatasetTest, TrainBatch_SplitIntoMicroBatches_SameSamples) {
  Dataset dataset = MakeDataset(Scrambled(5000), 32, 0.0);
  TokenBatch whole = dataset.TrainBatch(42, 3, 0, 8);
  TokenBatch low = dataset.TrainBatch(42, 3, 0, 4);
  TokenBatch high = dataset.TrainBatch(42, 3, 4, 4);
  std::vector<int32_t> inputs = low.inputs;
  inputs.insert(inputs.end(), high.inputs.begin(), high.inputs.end());
  std::vector<int32_t> targets = low.targets;
  targets.insert(targets.end(), high.targets.begin(), high.targets.end());
  EXPECT_EQ(whole.inputs, inputs);
  EXPECT_EQ(whole.targets, targets);
}

TEST(DatasetTest, TrainBatch_DifferentIterationOrSeed_DifferentSamples) {
  Dataset dataset = MakeDataset(Ramp(60000), 16, 0.0);
  std::vector<int64_t> base, next_iteration, other_seed, far_iteration;
  for (int64_t i = 0; i < 16; ++i) {
    base.push_back(dataset.TrainWindowStart(42, 5, i));
    next_iteration.push_back(dataset.TrainWindowStart(42, 6, i));
    other_seed.push_back(dataset.TrainWindowStart(43, 5, i));
    far_iteration.push_back(dataset.TrainWindowStart(42, 5 + (int64_t{1} << 32), i));
  }
  EXPECT_NE(base, next_iteration);
  EXPECT_NE(base, other_seed);
  EXPECT_NE(base, far_iteration);  // the high bits of the iteration count too
  EXPECT_NE(dataset.TrainBatch(42, 5, 0, 4).inputs, dataset.TrainBatch(42, 6, 0, 4).inputs);
}

TEST(DatasetTest, TrainBatch_Rows_AreCorpusWindowsWithTargetsShiftedByOne) {
  const std::vector<uint16_t> corpus = Scrambled(3000);
  Dataset dataset = MakeDataset(corpus, 24, 0.2);
  TokenBatch batch = dataset.TrainBatch(9, 11, 5, 6);
  for (int row = 0; row < 6; ++row) {
    const int64_t start = dataset.TrainWindowStart(9, 11, 5 + row);
    for (int t = 0; t < 24; ++t) {
      EXPECT_EQ(batch.inputs[row * 24 + t], corpus[start + t]) << row << "," << t;
      EXPECT_EQ(batch.targets[row * 24 + t], corpus[start + t + 1]) << row << "," << t;
    }
  }
}

TEST(DatasetTest, TrainWindowStart_ManyDraws_StayInTrainSplitAndReachBothEnds) {
  // 20 train tokens, seq_len 16: starts 0..3 are the only legal ones.
  Dataset dataset = MakeDataset(Ramp(40), 16, 0.5);
  ASSERT_EQ(dataset.train_tokens(), 20);
  std::set<int64_t> seen;
  for (int64_t iteration = 0; iteration < 100; ++iteration) {
    for (int64_t index = 0; index < 10; ++index) {
      const int64_t start = dataset.TrainWindowStart(7, iteration, index);
      ASSERT_GE(start, 0);
      ASSERT_LE(start, dataset.train_tokens() - dataset.seq_len() - 1);
      seen.insert(start);
    }
  }
  EXPECT_EQ(seen, (std::set<int64_t>{0, 1, 2, 3}));
  // The last target of every train window is still a train token.
  TokenBatch batch = dataset.TrainBatch(7, 0, 0, 64);
  for (int32_t target : batch.targets) EXPECT_LT(target, 20);
}

TEST(DatasetTest, TrainBatch_ZeroCount_EmptyBatch) {
  Dataset dataset = MakeDataset(Ramp(100), 8, 0.0);
  TokenBatch batch = dataset.TrainBatch(1, 1, 10, 0);
  EXPECT_EQ(batch.batch, 0);
  EXPECT_EQ(batch.seq_len, 8);
  EXPECT_TRUE(batch.inputs.empty());
  EXPECT_TRUE(batch.targets.empty());
}

TEST(DatasetTest, NumValWindows_ValSplit_StrideIsSeqLen) {
  // 1000 tokens, 25% -> 250 val tokens; (250 - 1) / 16 = 15 windows.
  Dataset dataset = MakeDataset(Ramp(1000), 16, 0.25);
  EXPECT_EQ(dataset.val_tokens(), 250);
  EXPECT_EQ(dataset.num_val_windows(), 15);
  for (int64_t k = 0; k < 15; ++k) EXPECT_EQ(dataset.ValWindowStart(k), k * 16);
}

TEST(DatasetTest, ValBatch_AllWindows_PredictEveryValTokenOnceExceptShortTail) {
  Dataset dataset = MakeDataset(Ramp(1000), 16, 0.25);
  const int64_t windows = dataset.num_val_windows();
  TokenBatch batch = dataset.ValBatch(0, static_cast<int>(windows));
  std::vector<int> predicted(1000, 0);
  for (size_t i = 0; i < batch.inputs.size(); ++i) {
    EXPECT_EQ(batch.targets[i], batch.inputs[i] + 1);
    ASSERT_GE(batch.inputs[i], 750);  // only val tokens
    ++predicted[batch.targets[i]];
  }
  const int64_t covered_end = 750 + windows * 16;  // last predicted position
  for (int64_t pos = 750; pos < 1000; ++pos) {
    EXPECT_EQ(predicted[pos], pos >= 751 && pos <= covered_end ? 1 : 0) << pos;
  }
  EXPECT_LT(1000 - 1 - covered_end, 16);  // the unused tail is shorter than seq_len
}

TEST(DatasetTest, ValBatch_Repeated_SameAndSplittable) {
  Dataset dataset = MakeDataset(Scrambled(4000), 16, 0.25);
  TokenBatch whole = dataset.ValBatch(3, 6);
  TokenBatch again = dataset.ValBatch(3, 6);
  EXPECT_EQ(whole.inputs, again.inputs);
  EXPECT_EQ(whole.targets, again.targets);
  TokenBatch low = dataset.ValBatch(3, 2);
  TokenBatch high = dataset.ValBatch(5, 4);
  std::vector<int32_t> inputs = low.inputs;
  inputs.insert(inputs.end(), high.inputs.begin(), high.inputs.end());
  EXPECT_EQ(whole.inputs, inputs);
}

TEST(DatasetTest, ValBatch_LastWindow_EndsInsideValSplit) {
  Dataset dataset = MakeDataset(Ramp(1000), 7, 0.3);  // 300 val tokens
  const int64_t last = dataset.num_val_windows() - 1;
  TokenBatch batch = dataset.ValBatch(last, 1);
  EXPECT_LE(batch.targets.back(), 999);
  EXPECT_GT(batch.targets.back(), 999 - 7);
}

TEST(DatasetDeathTest, ValBatch_OutOfRange_Aborts) {
  Dataset dataset = MakeDataset(Ramp(1000), 16, 0.25);
  EXPECT_DEATH(dataset.ValBatch(14, 2), "val windows \\[14, 16\\) of 15");
}

TEST(DatasetDeathTest, TrainBatch_NegativeIndex_Aborts) {
  Dataset dataset = MakeDataset(Ramp(1000), 16, 0.0);
  EXPECT_DEATH(dataset.TrainBatch(1, 1, -1, 2), "train samples");
}

}  // namespace
}  // namespace pipetrain
