// The load-balanced 3-D layouts of 3d-parallelism.txt §3.1.1 (Figure 4a,
// Figure 5): which block of a full matrix or vector each rank of a p^3 cube
// holds, for a given CubeDirection; and cutting full host matrices into
// blocks (initialising a rank from the unsplit model of the same seed) and
// pasting blocks back (export, tests).
//
// With a rank's coordinates read through the direction d,
//   w = coord[d.weight]  (the paper's i),
//   a = coord[d.input]   (the paper's j),
//   o = coord[d.output]  (the paper's l),
// the three operands of C = A B, A [M, N], B [N, K], C [M, K], are held as
//   activation A_ijl: rows block (w * p + a) of p^2, columns block o of p
//                     -> [M / p^2, N / p], the paper's A[imp + jm, lnp];
//   weight     B_lji: rows block o of p, columns block (a * p + w) of p^2
//                     -> [N / p, K / p^2], the paper's B[lnp, jkp + ik];
//   output     C_ilj: the activation layout of d.Swapped() (rows block
//                     (w * p + o), columns block a) -> [M / p^2, K / p].
// Every rank holds 1/p^3 of each matrix. A vector v of length L added to
// (or multiplying) the columns of an activation in layout d (a bias, a
// LayerNorm gain) is stored diagonally: only ranks with a == o hold a
// piece, v[o * L / p + w * L / p^2, + L / p^2] (the paper's b_ji on the
// processors with j = l); the others hold nothing (an empty block).
//
// All functions are pure and thread-safe. Errors: INVALID_ARGUMENT naming
// the dimension that p or p^2 does not divide, or the buffer whose size is
// wrong.
#ifndef PIPETRAIN_WORKER_CUBE_CUBE_LAYOUT_H_
#define PIPETRAIN_WORKER_CUBE_CUBE_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/cube/cube_comm.h"

namespace pipetrain {

enum class CubeOperand {
  kActivation,  // [rows, cols] split (rows / p^2, cols / p)
  kWeight,      // [rows, cols] split (rows / p, cols / p^2)
  kVector,      // rows == 1, cols = length, diagonal pieces of length / p^2
};

// The rectangle of the full [rows, cols] matrix a rank holds (row-major in
// the block). held is false (and the block empty) for a vector off the
// diagonal.
struct CubeBlock {
  int64_t row0 = 0, rows = 0, col0 = 0, cols = 0;
  bool held = true;
  int64_t size() const { return held ? rows * cols : 0; }
};

// The block of `operand` (full shape [rows, cols]) that rank `coord` holds
// under `direction`. INVALID_ARGUMENT when p < 2, the direction is not
// Valid(), a dimension is not divisible as the operand's split needs
// (named: "activation rows = 6 must be divisible by p^2 = 4"), or a
// vector's rows is not 1.
absl::StatusOr<CubeBlock> CubeBlockOf(CubeOperand operand, int64_t rows, int64_t cols, int p,
                                      const CubeCoord& coord, const CubeDirection& direction);

// Copies rank `coord`'s block out of `full` (rows * cols values, row-major).
absl::StatusOr<std::vector<float>> ScatterCubeBlock(CubeOperand operand,
                                                    absl::Span<const float> full, int64_t rows,
                                                    int64_t cols, int p, const CubeCoord& coord,
                                                    const CubeDirection& direction);

// The full matrix from every rank's block, blocks[CubeRankIndex(coord)]
// (p^3 of them; off-diagonal vector blocks empty). INVALID_ARGUMENT when a
// block's size is not its layout's.
absl::StatusOr<std::vector<float>> GatherCubeBlocks(CubeOperand operand,
                                                    const std::vector<std::vector<float>>& blocks,
                                                    int64_t rows, int64_t cols, int p,
                                                    const CubeDirection& direction);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_CUBE_CUBE_LAYOUT_H_
