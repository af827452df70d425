#include "worker/model/tensor_parallel.h"

#include <vector>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// A [rows, cols] tensor whose element (i, j) is 100 i + j.
Tensor Indexed(int64_t rows, int64_t cols) {
  Tensor t = Tensor::Zeros({rows, cols});
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) t[i * cols + j] = 100.0f * i + j;
  }
  return t;
}

ParameterShard Shard(ParameterShard::Split split, int rank, int ranks, Shape full, int blocks = 1) {
  ParameterShard s;
  s.split = split;
  s.rank = rank;
  s.ranks = ranks;
  s.column_blocks = blocks;
  s.full_shape = full;
  return s;
}

// The search for p tries p^3 in 64 bits: for T above 1290^3 it reaches
// p = 1291, whose cube overflows int (UBSan reported it; the loop could
// also run on past the last int).
TEST(TensorParallelTest, CubeEdge_CubesOnly_UpToTheLargestInt) {
  EXPECT_EQ(CubeEdge(8), 2);
  EXPECT_EQ(CubeEdge(27), 3);
  EXPECT_EQ(CubeEdge(1), 0);  // p >= 2
  EXPECT_EQ(CubeEdge(0), 0);
  EXPECT_EQ(CubeEdge(-8), 0);
  EXPECT_EQ(CubeEdge(16), 0);
  EXPECT_EQ(CubeEdge(1290 * 1290 * 1290), 1290);
  EXPECT_EQ(CubeEdge(1290 * 1290 * 1290 + 1), 0);
  EXPECT_EQ(CubeEdge(2147483647), 0);
}

TEST(TensorParallelTest, ColumnsInThreeBlocks_EachRankGetsItsPieceOfEveryBlock) {
  // c_attn-like: 2 rows, 12 columns = q | k | v of 4 columns each; rank 1
  // of 2 holds columns 2-3, 6-7 and 10-11.
  const Tensor full = Indexed(2, 12);
  const ParameterShard shard = Shard(ParameterShard::Split::kColumns, 1, 2, {2, 12}, 3);
  EXPECT_EQ(ShardShape(shard), (Shape{2, 6}));
  const Tensor part = SliceShard(full, shard);
  EXPECT_EQ(part.ToVector(),
            (std::vector<float>{2, 3, 6, 7, 10, 11, 102, 103, 106, 107, 110, 111}));
}

TEST(TensorParallelTest, OneDimensionalColumns_BiasOfThreeBlocks) {
  Tensor bias = Tensor::Zeros({6});
  for (int j = 0; j < 6; ++j) bias[j] = j;
  const Tensor part = SliceShard(bias, Shard(ParameterShard::Split::kColumns, 0, 2, {6}, 3));
  EXPECT_EQ(part.ToVector(), (std::vector<float>{0, 2, 4}));
}

TEST(TensorParallelTest, Rows_ContiguousBlock) {
  const Tensor full = Indexed(4, 3);
  const Tensor part = SliceShard(full, Shard(ParameterShard::Split::kRows, 1, 2, {4, 3}));
  EXPECT_EQ(part.ToVector(), (std::vector<float>{200, 201, 202, 300, 301, 302}));
}

TEST(TensorParallelTest, GatherShards_InvertsSliceShardForEverySplit) {
  const Tensor full = Indexed(4, 12);
  for (auto [split, blocks] : {std::pair{ParameterShard::Split::kColumns, 3},
                               std::pair{ParameterShard::Split::kColumns, 1},
                               std::pair{ParameterShard::Split::kRows, 1}}) {
    for (int ranks : {1, 2, 4}) {
      std::vector<Tensor> parts;
      for (int r = 0; r < ranks; ++r) {
        parts.push_back(SliceShard(full, Shard(split, r, ranks, {4, 12}, blocks)));
      }
      absl::StatusOr<Tensor> gathered =
          GatherShards(parts, Shard(split, 0, ranks, {4, 12}, blocks));
      ASSERT_TRUE(gathered.ok()) << gathered.status();
      EXPECT_EQ(gathered->ToVector(), full.ToVector()) << ranks << " ranks";
      EXPECT_EQ(gathered->shape(), full.shape());
    }
  }
}

TEST(TensorParallelTest, GatherShards_WrongCountOrSize_InvalidArgument) {
  const ParameterShard shard = Shard(ParameterShard::Split::kRows, 0, 2, {4, 3});
  EXPECT_EQ(GatherShards({Tensor::Zeros({2, 3})}, shard).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GatherShards({Tensor::Zeros({2, 3}), Tensor::Zeros({1, 3})}, shard).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TensorParallelTest, CountsTowardNorm_ShardsAlwaysReplicasOnRankZeroOnly) {
  ParameterShard replica;
  replica.ranks = 2;
  replica.rank = 0;
  EXPECT_TRUE(replica.CountsTowardNorm());
  replica.rank = 1;
  EXPECT_FALSE(replica.CountsTowardNorm());
  EXPECT_TRUE(Shard(ParameterShard::Split::kRows, 1, 2, {4, 3}).CountsTowardNorm());
}

TEST(TensorParallelTest, Validate_NamesTheFieldThatDoesNotSplit) {
  GptConfig config;  // vocab 256, 4 heads, d_model 128
  EXPECT_TRUE(ValidateTensorParallel(config, 1).ok());
  EXPECT_TRUE(ValidateTensorParallel(config, 4).ok());
  absl::Status heads = ValidateTensorParallel(config, 8);
  EXPECT_EQ(heads.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(heads.message().find("model.n_head"), std::string::npos) << heads;
  config.n_head = 8;
  config.vocab_size = 250;
  absl::Status vocab = ValidateTensorParallel(config, 4);
  EXPECT_EQ(vocab.message(),
            "tensor parallelism of 4 does not divide model.vocab_size 250 (pad it to a multiple "
            "of 4, e.g. 252; the data's token ids stay valid)");
  EXPECT_EQ(ValidateTensorParallel(config, 0).code(), absl::StatusCode::kInvalidArgument);
  // The heads come first, and their message has no padding hint.
  config.n_head = 6;
  EXPECT_EQ(ValidateTensorParallel(config, 4).message(),
            "tensor parallelism of 4 does not divide model.n_head 6");
}

}  // namespace
}  // namespace pipetrain
