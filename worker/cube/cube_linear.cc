#include "worker/cube/cube_linear.h"

#include <algorithm>
#include <climits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/linear.h"
#include "worker/cube/cube_layout.h"
#include "worker/cube/cube_vector.h"

namespace pipetrain {
namespace {

absl::Status CheckDim(const char* name, int64_t value, int64_t by, const char* by_name) {
  if (value <= 0 || value % by != 0 || value > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("CubeLinear: ", name, " = ", value,
                                                   " must be a positive multiple of ", by_name,
                                                   " = ", by, " (at most ", INT_MAX, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckDims(const CubeLinearDims& dims, int p, const CubeDirection& direction) {
  RETURN_IF_ERROR(ValidateCube(p, direction, "CubeLinear"));
  const int64_t pp = int64_t{p} * p;
  RETURN_IF_ERROR(CheckDim("rows (M)", dims.rows, pp, "p^2"));
  RETURN_IF_ERROR(CheckDim("in (N)", dims.in, p, "p"));
  return CheckDim("out (K)", dims.out, pp, "p^2");
}

absl::Status CheckSpan(const char* name, size_t got, int64_t want) {
  if (static_cast<int64_t>(got) != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("CubeLinear: ", name, " block has ", got, " values, its layout ", want));
  }
  return absl::OkStatus();
}

// The all-gathered weight blocks arrive as p blocks [rows, cols] in weight-
// axis order; W_lj is them side by side: [rows, p * cols].
std::vector<float> ColumnBlocksToMatrix(const std::vector<float>& blocks, int p, int64_t rows,
                                        int64_t cols) {
  std::vector<float> out(blocks.size());
  for (int b = 0; b < p; ++b) {
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = blocks.data() + (b * rows + r) * cols;
      std::copy(src, src + cols, out.data() + r * p * cols + b * cols);
    }
  }
  return out;
}

// The inverse: [rows, p * cols] -> p blocks [rows, cols], so that a
// reduce-scatter hands member b column block b.
std::vector<float> MatrixToColumnBlocks(const std::vector<float>& matrix, int p, int64_t rows,
                                        int64_t cols) {
  std::vector<float> out(matrix.size());
  for (int b = 0; b < p; ++b) {
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = matrix.data() + r * p * cols + b * cols;
      std::copy(src, src + cols, out.data() + (b * rows + r) * cols);
    }
  }
  return out;
}

// Per-rank block extents.
struct Extents {
  int64_t mb, mp, nb, kb, kp;  // M/p^2, M/p, N/p, K/p^2, K/p
};
Extents ExtentsOf(const CubeLinearDims& dims, int p) {
  const int64_t pp = int64_t{p} * p;
  return {dims.rows / pp, dims.rows / p, dims.in / p, dims.out / pp, dims.out / p};
}

}  // namespace

absl::StatusOr<CubeLinearBlockSizes> CubeLinearBlocks(const CubeLinearDims& dims, int p,
                                                      const CubeCoord& coord,
                                                      const CubeDirection& direction) {
  RETURN_IF_ERROR(CheckDims(dims, p, direction));
  const Extents e = ExtentsOf(dims, p);
  CubeLinearBlockSizes sizes;
  sizes.x = e.mb * e.nb;
  sizes.w = e.nb * e.kb;
  sizes.y = e.mb * e.kp;
  if (dims.bias) {
    ASSIGN_OR_RETURN(const CubeBlock b,
                     CubeBlockOf(CubeOperand::kVector, 1, dims.out, p, coord, direction.Swapped()));
    sizes.b = b.size();
  }
  return sizes;
}

absl::Status CubeLinearForward(CubeComm& comm, const CubeDirection& direction,
                               const CubeLinearDims& dims, absl::Span<const float> x,
                               absl::Span<const float> w, absl::Span<const float> b,
                               absl::Span<float> y) {
  const int p = comm.p();
  ASSIGN_OR_RETURN(const CubeLinearBlockSizes sizes,
                   CubeLinearBlocks(dims, p, comm.coord(), direction));
  RETURN_IF_ERROR(CheckSpan("x", x.size(), sizes.x));
  RETURN_IF_ERROR(CheckSpan("w", w.size(), sizes.w));
  RETURN_IF_ERROR(CheckSpan("b", b.size(), sizes.b));
  RETURN_IF_ERROR(CheckSpan("y", y.size(), sizes.y));
  const Extents e = ExtentsOf(dims, p);

  // Algorithm 1, line 1: X_il, the p row blocks of the input axis stacked.
  std::vector<float> x_il(static_cast<size_t>(e.mp * e.nb));
  RETURN_IF_ERROR(comm.AllGather(direction.input, x, absl::MakeSpan(x_il)));
  // Line 2: W_lj, the p column blocks of the weight axis side by side.
  std::vector<float> w_blocks(static_cast<size_t>(e.nb * e.kp));
  RETURN_IF_ERROR(comm.AllGather(direction.weight, w, absl::MakeSpan(w_blocks)));
  const std::vector<float> w_lj = ColumnBlocksToMatrix(w_blocks, p, e.nb, e.kb);
  // Line 3: this rank's partial product, one term of Y_ij = sum_l X_il W_lj.
  std::vector<float> partial(static_cast<size_t>(e.mp * e.kp));
  LinearForward(x_il.data(), w_lj.data(), nullptr, static_cast<int>(e.mp), static_cast<int>(e.nb),
                static_cast<int>(e.kp), partial.data());
  // Line 4: the sum over the output axis, of which this rank keeps its rows.
  RETURN_IF_ERROR(comm.ReduceScatter(direction.output, partial, y));
  if (!dims.bias) return absl::OkStatus();

  // Algorithm 7 on Y (layout d.Swapped()): Y += b_j row by row.
  std::vector<float> b_j(static_cast<size_t>(e.kp));
  RETURN_IF_ERROR(CubeVectorAllGather(comm, direction.Swapped(), dims.out, b, absl::MakeSpan(b_j)));
  for (int64_t r = 0; r < e.mb; ++r) {
    float* row = y.data() + r * e.kp;
    for (int64_t k = 0; k < e.kp; ++k) row[k] += b_j[k];
  }
  return absl::OkStatus();
}

absl::Status CubeLinearBackward(CubeComm& comm, const CubeDirection& direction,
                                const CubeLinearDims& dims, absl::Span<const float> x,
                                absl::Span<const float> w, absl::Span<const float> dy,
                                absl::Span<float> dx, absl::Span<float> dw, absl::Span<float> db) {
  const int p = comm.p();
  ASSIGN_OR_RETURN(const CubeLinearBlockSizes sizes,
                   CubeLinearBlocks(dims, p, comm.coord(), direction));
  const bool want_dx = !dx.empty();
  RETURN_IF_ERROR(CheckSpan("x", x.size(), sizes.x));
  RETURN_IF_ERROR(CheckSpan("w", w.size(), sizes.w));
  RETURN_IF_ERROR(CheckSpan("dy", dy.size(), sizes.y));
  if (want_dx) RETURN_IF_ERROR(CheckSpan("dx", dx.size(), sizes.x));
  RETURN_IF_ERROR(CheckSpan("dw", dw.size(), sizes.w));
  RETURN_IF_ERROR(CheckSpan("db", db.size(), sizes.b));
  const Extents e = ExtentsOf(dims, p);

  // dY_ij: the output axis's row blocks stacked (Algorithm 2 uses it in both
  // products; gathered once).
  std::vector<float> dy_ij(static_cast<size_t>(e.mp * e.kp));
  RETURN_IF_ERROR(comm.AllGather(direction.output, dy, absl::MakeSpan(dy_ij)));
  std::vector<float> x_il(static_cast<size_t>(e.mp * e.nb));
  RETURN_IF_ERROR(comm.AllGather(direction.input, x, absl::MakeSpan(x_il)));
  std::vector<float> w_lj;
  if (want_dx) {
    std::vector<float> w_blocks(static_cast<size_t>(e.nb * e.kp));
    RETURN_IF_ERROR(comm.AllGather(direction.weight, w, absl::MakeSpan(w_blocks)));
    w_lj = ColumnBlocksToMatrix(w_blocks, p, e.nb, e.kb);
  }
  // The local terms of eq. 3: dX_il += dY_ij W_lj^T (summed over the input
  // axis) and dW_lj += X_il^T dY_ij (summed over the weight axis).
  std::vector<float> dx_part(want_dx ? static_cast<size_t>(e.mp * e.nb) : 0);
  std::vector<float> dw_part(static_cast<size_t>(e.nb * e.kp), 0.0f);
  LinearBackward(x_il.data(), want_dx ? w_lj.data() : nullptr, dy_ij.data(), static_cast<int>(e.mp),
                 static_cast<int>(e.nb), static_cast<int>(e.kp), want_dx ? dx_part.data() : nullptr,
                 dw_part.data(), nullptr);
  // Algorithm 2 line 1 ("in z, x, y"): dX's reduce-scatter along the input axis.
  if (want_dx) RETURN_IF_ERROR(comm.ReduceScatter(direction.input, dx_part, dx));
  // Line 2 ("in y, z, x"): dW's along the weight axis, column block per member.
  std::vector<float> dw_sum(static_cast<size_t>(sizes.w));
  RETURN_IF_ERROR(comm.ReduceScatter(direction.weight, MatrixToColumnBlocks(dw_part, p, e.nb, e.kb),
                                     absl::MakeSpan(dw_sum)));
  for (int64_t k = 0; k < sizes.w; ++k) dw[k] += dw_sum[k];
  if (!dims.bias) return absl::OkStatus();

  // Algorithm 8: this rank's column sums of dY, reduced onto the diagonal.
  std::vector<float> column_sums(static_cast<size_t>(e.kp), 0.0f);
  for (int64_t r = 0; r < e.mb; ++r) {
    const float* row = dy.data() + r * e.kp;
    for (int64_t k = 0; k < e.kp; ++k) column_sums[k] += row[k];
  }
  return CubeVectorReduceGrad(comm, direction.Swapped(), dims.out, column_sums, db);
}

CubeLinearSentFloats CubeLinearSent(const CubeLinearDims& dims, int p) {
  const int64_t p3 = int64_t{p} * p * p;
  const int64_t mn = dims.rows * dims.in / p3, nk = dims.in * dims.out / p3,
                mk = dims.rows * dims.out / p3;
  CubeLinearSentFloats sent;
  sent.forward = (p - 1) * (mn + nk + mk);
  sent.backward = (p - 1) * (2 * mn + 2 * nk + mk);
  sent.backward_without_dx = (p - 1) * (mn + nk + mk);
  return sent;
}

}  // namespace pipetrain
