#include "worker/model/tensor_parallel.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "kernels/compress/codec_spec.h"
#include "worker/cube/cube_blocks.h"

namespace pipetrain {
namespace {

int64_t Product(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// A cube shard's full tensor as the [rows, cols] matrix of cube_layout.h:
// a vector is one row.
int64_t CubeRows(const ParameterShard& shard) {
  return shard.full_shape.size() == 1 ? 1 : shard.full_shape.front();
}

// Copies between the full tensor and rank `shard.rank`'s part: src is the
// full tensor and dst the part when to_part, the other way round otherwise.
void CopyShard(const ParameterShard& shard, const float* src, float* dst, bool to_part) {
  const int64_t numel = Product(shard.full_shape);
  auto copy = [&](int64_t full_at, int64_t part_at, int64_t n) {
    if (to_part) {
      std::copy(src + full_at, src + full_at + n, dst + part_at);
    } else {
      std::copy(src + part_at, src + part_at + n, dst + full_at);
    }
  };
  if (shard.split == ParameterShard::Split::kRows) {
    const int64_t piece = numel / shard.ranks;
    copy(shard.rank * piece, 0, piece);
    return;
  }
  const int64_t cols = shard.full_shape.back(), rows = numel / cols;
  const int64_t block = cols / shard.column_blocks, piece = block / shard.ranks;
  const int64_t local_cols = piece * shard.column_blocks;
  for (int64_t i = 0; i < rows; ++i) {
    for (int b = 0; b < shard.column_blocks; ++b) {
      copy(i * cols + b * block + shard.rank * piece, i * local_cols + b * piece, piece);
    }
  }
}

void CheckShard(const ParameterShard& shard) {
  PT_CHECK(shard.sharded() && !shard.full_shape.empty() && shard.ranks >= 1 && shard.rank >= 0 &&
           shard.rank < shard.ranks && shard.column_blocks >= 1)
      << "bad ParameterShard";
  if (shard.split == ParameterShard::Split::kCube) {
    PT_CHECK(shard.cube_p >= 2 && shard.ranks == shard.cube_p * shard.cube_p * shard.cube_p &&
             shard.full_shape.size() <= 2)
        << "bad cube ParameterShard";
    PT_CHECK(CubeBlockOf(shard.cube_operand, CubeRows(shard), shard.full_shape.back(), shard.cube_p,
                         CubeCoordOf(shard.rank, shard.cube_p), shard.cube_direction)
                 .ok())
        << "a cube of p = " << shard.cube_p << " does not split a tensor of "
        << Product(shard.full_shape) << " elements";
    return;
  }
  if (shard.split == ParameterShard::Split::kRows) {
    PT_CHECK(shard.full_shape.front() % shard.ranks == 0)
        << shard.ranks << " ranks do not split " << shard.full_shape.front() << " rows";
  } else {
    PT_CHECK(shard.full_shape.back() % (shard.column_blocks * shard.ranks) == 0)
        << shard.ranks << " ranks do not split " << shard.column_blocks << " blocks of "
        << shard.full_shape.back() << " columns";
  }
}

}  // namespace

Shape ShardShape(const ParameterShard& shard) {
  if (shard.split == ParameterShard::Split::kCube) {
    CheckShard(shard);
    const CubeBlock block =
        CubeBlockOf(shard.cube_operand, CubeRows(shard), shard.full_shape.back(), shard.cube_p,
                    CubeCoordOf(shard.rank, shard.cube_p), shard.cube_direction)
            .value();
    if (shard.full_shape.size() == 1) return {block.size()};
    return {block.rows, block.cols};
  }
  Shape shape = shard.full_shape;
  if (shard.split == ParameterShard::Split::kColumns) shape.back() /= shard.ranks;
  if (shard.split == ParameterShard::Split::kRows) shape.front() /= shard.ranks;
  return shape;
}

absl::Status ValidateTensorParallel(const GptConfig& config, int tensor_parallel,
                                    int64_t max_vocab_size) {
  const int t = tensor_parallel;
  if (t < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallelism of ", t, " workers; must be >= 1"));
  }
  auto must_divide = [&](const char* field, int64_t value) -> absl::Status {
    if (value % t == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallelism of ", t, " does not divide ", field, " ", value));
  };
  absl::Status status = must_divide("model.n_head", config.n_head);
  if (status.ok()) status = must_divide("model.d_model", config.d_model);
  if (status.ok()) status = must_divide("4 x model.d_model (the MLP width)", 4 * config.d_model);
  if (!status.ok() || config.vocab_size % t == 0) return status;
  // The vocabulary: the usual way out (Megatron pads it too) keeps every
  // token id valid, unless the padded size is past what a spec accepts.
  const int64_t padded = (int64_t{config.vocab_size} + t - 1) / t * t;
  if (max_vocab_size > 0 && padded > max_vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallelism of ", t, " does not divide model.vocab_size ",
                     config.vocab_size, ", and no vocabulary of at most ", max_vocab_size,
                     " above it is a multiple of ", t, "; choose a tensor that divides it"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "tensor parallelism of ", t, " does not divide model.vocab_size ", config.vocab_size,
      " (pad it to a multiple of ", t, ", e.g. ", padded, "; the data's token ids stay valid)"));
}

int CubeEdge(int tensor_parallel) {
  // In 64 bits: p^3 of an int p past 1290 overflows int (the loop reaches
  // p = 1291 for any T above 1290^3).
  for (int64_t p = 2; p * p * p <= tensor_parallel; ++p) {
    if (p * p * p == tensor_parallel) return static_cast<int>(p);
  }
  return 0;
}

absl::Status ValidateCubeTensorParallel(const GptConfig& config, int tensor_parallel,
                                        int64_t micro_batch_samples) {
  const int p = CubeEdge(tensor_parallel);
  if (p == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("3-D tensor parallelism needs p^3 workers (8, 27, ...) with p "
                     ">= 2, not ",
                     tensor_parallel));
  }
  auto must_divide = [&](const char* field, int64_t value, int64_t by,
                         const char* what) -> absl::Status {
    if (value % by == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("3-D tensor parallelism on a ", p, "x", p, "x",
                                                   p, " cube needs ", what, " = ", by,
                                                   " to divide ", field, " ", value));
  };
  absl::Status status = must_divide("model.n_head", config.n_head, p, "p");
  if (status.ok()) status = must_divide("model.d_model", config.d_model, int64_t{p} * p, "p^2");
  if (status.ok()) {
    status = must_divide("model.vocab_size", config.vocab_size, int64_t{p} * p * p, "p^3");
  }
  if (status.ok()) {
    status = must_divide(
        "the samples of a micro-batch (training.batch_size / "
        "training.micro_batches)",
        micro_batch_samples, int64_t{p} * p, "p^2");
  }
  return status;
}

Tensor SliceShard(const Tensor& full, const ParameterShard& shard) {
  CheckShard(shard);
  PT_CHECK(!full.on_device() && full.numel() == Product(shard.full_shape))
      << "SliceShard of a tensor of " << full.numel() << " elements";
  Tensor part = Tensor::Zeros(ShardShape(shard));
  if (shard.split == ParameterShard::Split::kCube) {
    const int64_t rows = CubeRows(shard), cols = shard.full_shape.back();
    std::vector<float> values = full.ToVector();
    if (shard.cube_attention_columns) {
      values = PermuteCubeAttentionColumns(values, rows, cols / 3, shard.cube_p, true);
    }
    const std::vector<float> block =
        ScatterCubeBlock(shard.cube_operand, values, rows, cols, shard.cube_p,
                         CubeCoordOf(shard.rank, shard.cube_p), shard.cube_direction)
            .value();  // checked by CheckShard
    std::copy(block.begin(), block.end(), part.data());
    return part;
  }
  CopyShard(shard, full.data(), part.data(), /*to_part=*/true);
  return part;
}

absl::StatusOr<Tensor> GatherShards(const std::vector<Tensor>& parts, const ParameterShard& shard) {
  CheckShard(shard);
  if (static_cast<int>(parts.size()) != shard.ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat(parts.size(), " shards for a tensor split ", shard.ranks, " ways"));
  }
  Tensor full = Tensor::Zeros(shard.full_shape);
  if (shard.split == ParameterShard::Split::kCube) {
    std::vector<std::vector<float>> blocks;
    for (int r = 0; r < shard.ranks; ++r) {
      if (parts[r].on_device()) {
        return absl::InvalidArgumentError(absl::StrCat("shard ", r, " is not on the host"));
      }
      blocks.push_back(parts[r].numel() == 0 ? std::vector<float>() : parts[r].ToVector());
    }
    const int64_t rows = CubeRows(shard), cols = shard.full_shape.back();
    ASSIGN_OR_RETURN(std::vector<float> values,
                     GatherCubeBlocks(shard.cube_operand, blocks, rows, cols, shard.cube_p,
                                      shard.cube_direction));
    if (shard.cube_attention_columns) {
      values = PermuteCubeAttentionColumns(values, rows, cols / 3, shard.cube_p, false);
    }
    std::copy(values.begin(), values.end(), full.data());
    return full;
  }
  const int64_t piece = full.numel() / shard.ranks;
  for (int r = 0; r < shard.ranks; ++r) {
    if (parts[r].on_device() || parts[r].numel() != piece) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard ", r, " has ", parts[r].numel(), " elements; expected ", piece, " on the host"));
    }
    ParameterShard at = shard;
    at.rank = r;
    CopyShard(at, parts[r].data(), full.data(), /*to_part=*/false);
  }
  return full;
}

absl::StatusOr<TensorParallelCompression> MakeTensorParallelCompression(const std::string& spec,
                                                                        const std::string& field) {
  TensorParallelCompression compression;
  if (spec.empty() || spec == kCodecNone) return compression;
  absl::StatusOr<std::vector<CodecStage>> stages = ParseCodecSpec(spec);
  if (!stages.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", stages.status().message()));
  }
  size_t inner = 0;
  if ((*stages)[0].name == "token_topk") {
    compression.keep = (*stages)[0].params.count("keep") ? (*stages)[0].params.at("keep") : 1.0;
    inner = 1;
  }
  if (inner < stages->size()) {
    const std::string& name = (*stages)[inner].name;
    if (name != "piecewise" && name != "linear" && name != "fp16" && name != "bf16") {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": \"", spec, "\" names ", name,
          ", which a tensor-parallel all-reduce cannot carry (use token_topk, piecewise, linear, "
          "fp16 or bf16, e.g. \"token_topk:keep=0.5+piecewise:bits=3\")"));
    }
    const size_t plus = spec.find('+');
    ASSIGN_OR_RETURN(compression.codec, MakeCodec(inner == 0 ? spec : spec.substr(plus + 1)));
  }
  return compression;
}

}  // namespace pipetrain
