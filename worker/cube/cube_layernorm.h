// The 3-D layer normalization of 3d-parallelism.txt §3.2 on a p x p x p
// cube: LayerNorm over the hidden dimension (kernels/cpu/layernorm.h's
// numerics: two-pass mean and biased variance, rstd = 1 / sqrt(var + eps),
// y = (x - mean) * rstd * gamma + beta) of an activation X [M, H] held in
// the kActivation layout of direction d (cube_layout.h): each rank has
// [M / p^2, H / p], its rows' hidden values split along d.output. Does not
// change the direction (§3.2).
//
//   forward   gamma_o, beta_o by Algorithm 7 (CubeVectorAllGather); the
//             rows' sums, then their centred squares, all-reduced along
//             d.output; mean, rstd per local row (every member of the
//             output-axis group gets bitwise the same).
//   backward  gamma_o by Algorithm 7 again; per row sum(g) and
//             sum(g * xhat), g = dy * gamma, all-reduced along d.output
//             (one call, 2 M / p^2 floats); dx = rstd (g - mean(g) -
//             xhat mean(g xhat)); dgamma = sum dy * xhat and dbeta = sum dy
//             over the local rows, reduced onto the diagonal pieces by
//             Algorithm 8 (CubeVectorReduceGrad) and ADDED there.
// Results equal the unsplit kernel's to rounding: only the order of the
// hidden (and, for dgamma / dbeta, row) sums changes.
//
// gamma / beta / dgamma / dbeta are this rank's kVector blocks under d
// (H / p^2 values where coord[d.input] == coord[d.output], else empty);
// mean / rstd have M / p^2 values. Every rank must call these together
// with the same dims and direction. Errors: INVALID_ARGUMENT when p < 2,
// rows (M) is not a multiple of p^2 or hidden (H) of p^2 (named), or a span
// has the wrong size; the comm's errors otherwise.
#ifndef PIPETRAIN_WORKER_CUBE_CUBE_LAYERNORM_H_
#define PIPETRAIN_WORKER_CUBE_CUBE_LAYERNORM_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/cpu/layernorm.h"
#include "worker/cube/cube_comm.h"

namespace pipetrain {

struct CubeLayerNormDims {
  int64_t rows = 0;    // M: multiple of p^2
  int64_t hidden = 0;  // H: multiple of p^2 (gamma's pieces)
  float eps = kLayerNormEps;
};

// y is written, as are mean and rstd (kept for the backward).
absl::Status CubeLayerNormForward(CubeComm& comm, const CubeDirection& direction,
                                  const CubeLayerNormDims& dims, absl::Span<const float> x,
                                  absl::Span<const float> gamma, absl::Span<const float> beta,
                                  absl::Span<float> y, absl::Span<float> mean,
                                  absl::Span<float> rstd);

// dx is written; dgamma and dbeta are ADDED to (diagonal ranks).
absl::Status CubeLayerNormBackward(CubeComm& comm, const CubeDirection& direction,
                                   const CubeLayerNormDims& dims, absl::Span<const float> x,
                                   absl::Span<const float> gamma, absl::Span<const float> mean,
                                   absl::Span<const float> rstd, absl::Span<const float> dy,
                                   absl::Span<float> dx, absl::Span<float> dgamma,
                                   absl::Span<float> dbeta);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_CUBE_CUBE_LAYERNORM_H_
