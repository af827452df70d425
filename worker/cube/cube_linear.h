// The 3-D parallel linear layer Y = X W (+ b) on a p x p x p cube
// (3d-parallelism.txt §3.1, §3.2): the load-balanced 3-D matrix product of
// Algorithm 1 (forward) and Algorithm 2 (backward, eq. 3), with the bias by
// Algorithms 7 and 8. Shapes as kernels/cpu/linear.h (GPT-2's Conv1D
// layout): X [M, N], W [N, K], b [K], Y [M, K].
//
// Layouts (cube_layout.h), for a layer run in direction d:
//   X  kActivation under d            [M / p^2, N / p]
//   W  kWeight under d                [N / p, K / p^2]
//   b  kVector under d.Swapped()      [K / p^2] on ranks with
//                                     coord[d.input] == coord[d.output]
//   Y  kActivation under d.Swapped()  [M / p^2, K / p]
// so the next layer runs in d.Swapped() and a block of two layers (an
// MLP's fc then proj, attention's qkv then proj) returns to d (§3.2).
// Each rank holds 1/p^3 of X, W and Y and multiplies [M/p, N/p] by
// [N/p, K/p] (kernels/cpu LinearForward / LinearBackward).
//
// Communication each rank sends (fp32, 4 bytes each; the in-process
// comm's count, which is the ring's volume):
//   forward   (p - 1) (M N + N K + M K) / p^3 floats: all-gather X in
//             d.input, W in d.weight, reduce-scatter Y in d.output (the
//             paper's "(MN + NK + MK) / p^3 across p processors").
//   backward  (p - 1) (2 M N + 2 N K + M K) / p^3 floats with dx, else
//             (p - 1) (M N + N K + M K) / p^3: all-gather dY in d.output
//             (once, shared by both products), X in d.input, W in
//             d.weight (only for dx), reduce-scatter dX in d.input and dW
//             in d.weight. Running Algorithm 2's two products as
//             independent Algorithms 3 and 5 would gather dY twice.
//   bias      cube_vector.h's counts with L = K.
// CubeLinearSentFloats returns the matrix-product counts.
//
// Every rank of the cube must call these together with the same dims and
// direction (they are collectives). Errors: INVALID_ARGUMENT when p < 2, a
// dimension is not divisible as the layout needs (named: "CubeLinear: out
// (K) = 10 must be a multiple of p^2 = 4") or a span has the wrong size
// (named); the comm's errors otherwise. Thread-safe as the comm is (one
// call at a time per comm).
#ifndef PIPETRAIN_WORKER_CUBE_CUBE_LINEAR_H_
#define PIPETRAIN_WORKER_CUBE_CUBE_LINEAR_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/cube/cube_comm.h"

namespace pipetrain {

struct CubeLinearDims {
  int64_t rows = 0;  // M: multiple of p^2 (tokens, batch * sequence)
  int64_t in = 0;    // N: multiple of p
  int64_t out = 0;   // K: multiple of p^2
  bool bias = false;
};

// The number of values of this rank's blocks (b is 0 off the diagonal or
// without a bias).
struct CubeLinearBlockSizes {
  int64_t x = 0, w = 0, b = 0, y = 0;
};
absl::StatusOr<CubeLinearBlockSizes> CubeLinearBlocks(const CubeLinearDims& dims, int p,
                                                      const CubeCoord& coord,
                                                      const CubeDirection& direction);

// Algorithm 1 (C = A B with A = X, B = W, C = Y), then Algorithm 7 for b:
//   1. all-gather X's blocks along d.input  -> X_il  [M / p, N / p]
//   2. all-gather W's blocks along d.weight -> W_lj  [N / p, K / p]
//   3. P = X_il W_lj                                  [M / p, K / p]
//   4. reduce-scatter P along d.output       -> Y block [M / p^2, K / p]
//   5. (bias) Y += b_j, b_j gathered by CubeVectorAllGather.
// `b` is this rank's bias block (empty when !dims.bias or off the
// diagonal); `y` is written.
absl::Status CubeLinearForward(CubeComm& comm, const CubeDirection& direction,
                               const CubeLinearDims& dims, absl::Span<const float> x,
                               absl::Span<const float> w, absl::Span<const float> b,
                               absl::Span<float> y);

// Algorithm 2 (eq. 3: dX = dY W^T, dW = X^T dY), then Algorithm 8 for db:
//   1. all-gather dY along d.output -> dY_ij [M / p, K / p]
//   2. all-gather X along d.input   -> X_il  [M / p, N / p]
//   3. (dx) all-gather W along d.weight -> W_lj [N / p, K / p]
//   4. dX_part = dY_ij W_lj^T, dW_part = X_il^T dY_ij (LinearBackward)
//   5. (dx) reduce-scatter dX_part along d.input -> dx block (written)
//   6. reduce-scatter dW_part's column blocks along d.weight -> dw block
//      (ADDED, as the kernels accumulate over micro-batches)
//   7. (bias) db: dY's column sums through CubeVectorReduceGrad (ADDED on
//      the diagonal ranks).
// `dx` empty skips the dX product and its communication (then it must be
// empty on every rank); otherwise it has the X block's size. `db` is the
// bias block's size (empty without a bias or off the diagonal).
absl::Status CubeLinearBackward(CubeComm& comm, const CubeDirection& direction,
                                const CubeLinearDims& dims, absl::Span<const float> x,
                                absl::Span<const float> w, absl::Span<const float> dy,
                                absl::Span<float> dx, absl::Span<float> dw, absl::Span<float> db);

// Floats one rank sends for the matrix product (no bias), per the counts
// above: forward, and backward with or without dx. Requires valid dims.
struct CubeLinearSentFloats {
  int64_t forward = 0, backward = 0, backward_without_dx = 0;
};
CubeLinearSentFloats CubeLinearSent(const CubeLinearDims& dims, int p);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_CUBE_CUBE_LINEAR_H_
