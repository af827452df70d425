#include "worker/cube/cube_layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

const char* OperandName(CubeOperand operand) {
  switch (operand) {
    case CubeOperand::kActivation:
      return "activation";
    case CubeOperand::kWeight:
      return "weight";
    case CubeOperand::kVector:
      return "vector";
  }
  return "?";
}

absl::Status CheckDivisible(CubeOperand operand, const char* dim, int64_t value, int64_t by,
                            const char* by_name) {
  if (value <= 0 || value % by != 0) {
    return absl::InvalidArgumentError(absl::StrCat(OperandName(operand), " ", dim, " = ", value,
                                                   " must be a positive multiple of ", by_name,
                                                   " = ", by));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CubeBlock> CubeBlockOf(CubeOperand operand, int64_t rows, int64_t cols, int p,
                                      const CubeCoord& coord, const CubeDirection& direction) {
  RETURN_IF_ERROR(ValidateCube(p, direction, "CubeBlockOf"));
  const int64_t pp = int64_t{p} * p;
  const int64_t w = coord[direction.weight], a = coord[direction.input],
                o = coord[direction.output];
  CubeBlock block;
  switch (operand) {
    case CubeOperand::kActivation:
      RETURN_IF_ERROR(CheckDivisible(operand, "rows", rows, pp, "p^2"));
      RETURN_IF_ERROR(CheckDivisible(operand, "cols", cols, p, "p"));
      block.rows = rows / pp;
      block.row0 = (w * p + a) * block.rows;
      block.cols = cols / p;
      block.col0 = o * block.cols;
      return block;
    case CubeOperand::kWeight:
      RETURN_IF_ERROR(CheckDivisible(operand, "rows", rows, p, "p"));
      RETURN_IF_ERROR(CheckDivisible(operand, "cols", cols, pp, "p^2"));
      block.rows = rows / p;
      block.row0 = o * block.rows;
      block.cols = cols / pp;
      block.col0 = (a * p + w) * block.cols;
      return block;
    case CubeOperand::kVector:
      if (rows != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("vector rows = ", rows, " must be 1 (a vector is one row)"));
      }
      RETURN_IF_ERROR(CheckDivisible(operand, "length", cols, pp, "p^2"));
      block.rows = 1;
      block.cols = cols / pp;
      block.col0 = o * (cols / p) + w * block.cols;
      block.held = a == o;
      return block;
  }
  return absl::InvalidArgumentError("unknown cube operand");
}

absl::StatusOr<std::vector<float>> ScatterCubeBlock(CubeOperand operand,
                                                    absl::Span<const float> full, int64_t rows,
                                                    int64_t cols, int p, const CubeCoord& coord,
                                                    const CubeDirection& direction) {
  ASSIGN_OR_RETURN(const CubeBlock block, CubeBlockOf(operand, rows, cols, p, coord, direction));
  if (static_cast<int64_t>(full.size()) != rows * cols) {
    return absl::InvalidArgumentError(absl::StrCat("ScatterCubeBlock: full ", OperandName(operand),
                                                   " has ", full.size(),
                                                   " values, not rows * cols = ", rows * cols));
  }
  std::vector<float> out(static_cast<size_t>(block.size()));
  if (!block.held) return out;
  for (int64_t r = 0; r < block.rows; ++r) {
    const float* src = full.data() + (block.row0 + r) * cols + block.col0;
    std::copy(src, src + block.cols, out.data() + r * block.cols);
  }
  return out;
}

absl::StatusOr<std::vector<float>> GatherCubeBlocks(CubeOperand operand,
                                                    const std::vector<std::vector<float>>& blocks,
                                                    int64_t rows, int64_t cols, int p,
                                                    const CubeDirection& direction) {
  RETURN_IF_ERROR(ValidateCube(p, direction, "GatherCubeBlocks"));
  const int n = p * p * p;
  if (static_cast<int>(blocks.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("GatherCubeBlocks: ", blocks.size(), " blocks, not p^3 = ", n));
  }
  std::vector<float> full(static_cast<size_t>(rows * cols), 0.0f);
  for (int r = 0; r < n; ++r) {
    ASSIGN_OR_RETURN(const CubeBlock block,
                     CubeBlockOf(operand, rows, cols, p, CubeCoordOf(r, p), direction));
    if (static_cast<int64_t>(blocks[r].size()) != block.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("GatherCubeBlocks: rank ", r, "'s ", OperandName(operand), " block has ",
                       blocks[r].size(), " values, its layout ", block.size()));
    }
    for (int64_t i = 0; i < block.size() / std::max<int64_t>(block.cols, 1); ++i) {
      const float* src = blocks[r].data() + i * block.cols;
      std::copy(src, src + block.cols, full.data() + (block.row0 + i) * cols + block.col0);
    }
  }
  return full;
}

}  // namespace pipetrain
