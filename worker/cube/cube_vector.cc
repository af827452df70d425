#include "worker/cube/cube_vector.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/cube/cube_layout.h"

namespace pipetrain {
namespace {

absl::Status CheckSize(const char* what, const char* name, size_t got, int64_t want) {
  if (static_cast<int64_t>(got) != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", name, " has ", got, " values, expected ", want));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CubeVectorAllGather(CubeComm& comm, const CubeDirection& direction, int64_t length,
                                 absl::Span<const float> piece, absl::Span<float> out) {
  const int p = comm.p();
  const CubeCoord c = comm.coord();
  ASSIGN_OR_RETURN(const CubeBlock block,
                   CubeBlockOf(CubeOperand::kVector, 1, length, p, c, direction));
  RETURN_IF_ERROR(CheckSize("CubeVectorAllGather", "piece", piece.size(), block.size()));
  RETURN_IF_ERROR(CheckSize("CubeVectorAllGather", "out", out.size(), length / p));
  // Line 1: broadcast the diagonal piece along the input axis.
  std::vector<float> mine(static_cast<size_t>(block.cols), 0.0f);
  if (block.held) std::copy(piece.begin(), piece.end(), mine.begin());
  RETURN_IF_ERROR(
      comm.Broadcast(direction.input, /*root=*/c[direction.output], absl::MakeSpan(mine)));
  // Line 2: all-gather the p pieces of v_o along the weight axis.
  return comm.AllGather(direction.weight, mine, out);
}

absl::Status CubeVectorReduceGrad(CubeComm& comm, const CubeDirection& direction, int64_t length,
                                  absl::Span<const float> column_sums,
                                  absl::Span<float> grad_piece) {
  const int p = comm.p();
  ASSIGN_OR_RETURN(const CubeBlock block,
                   CubeBlockOf(CubeOperand::kVector, 1, length, p, comm.coord(), direction));
  RETURN_IF_ERROR(CheckSize("CubeVectorReduceGrad", "column_sums", column_sums.size(), length / p));
  RETURN_IF_ERROR(CheckSize("CubeVectorReduceGrad", "grad_piece", grad_piece.size(), block.size()));
  // Adjoint of the all-gather: reduce-scatter along the weight axis.
  std::vector<float> segment(static_cast<size_t>(block.cols));
  RETURN_IF_ERROR(comm.ReduceScatter(direction.weight, column_sums, absl::MakeSpan(segment)));
  // Adjoint of the broadcast: the sum along the input axis, kept by the root.
  RETURN_IF_ERROR(comm.AllReduce(direction.input, absl::MakeSpan(segment)));
  if (block.held) {
    for (int64_t k = 0; k < block.cols; ++k) grad_piece[k] += segment[k];
  }
  return absl::OkStatus();
}

}  // namespace pipetrain
