// A compressed all-reduce: PowerSGD (Vogels et al. 2019, algorithm 1; the
// data-parallel gradient compression Optimus-CC §7 applies to selected
// stages), over Collectives.
//
// Each member holds M_i [rows, cols] (a gradient viewed as a matrix).
// With a shared start Q [cols, r] (the fixed Philox draw, or the previous
// call's result: kernels/compress/powersgd_codec.h step 1):
//   P   = sum_i M_i Q          all-reduce of [rows, r]
//   P^  = orthonormalise(P)    the same on every member (P is bitwise equal)
//   Q'  = sum_i M_i^T P^       all-reduce of [cols, r]
//   sum_i M_i ~= P^ Q'^T       = the projection of the sum onto span(P^)
// so each member sends r (rows + cols) values instead of rows * cols. A
// sum of rank <= r whose column space P^ captures is reproduced to fp32
// precision.
//
// Error feedback: the part of its own M_i (plus its residual) that its
// share of the result misses, M_i - P^ Q'^T / N, is kept and added to its
// next call's M_i, so nothing is lost over steps, only delayed.
//
// Every member must call it with the same shapes, tags and rank, in the
// same order (Collectives' rule); the state (warm Q, residual) is per
// tensor and per member. Not thread-safe.
#ifndef PIPETRAIN_WORKER_COLLECTIVES_POWERSGD_ALL_REDUCE_H_
#define PIPETRAIN_WORKER_COLLECTIVES_POWERSGD_ALL_REDUCE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/tensor.h"
#include "worker/collectives/collectives.h"

namespace pipetrain {

struct PowerSgdAllReduceState {
  Tensor q;         // [cols, r]: the last result's Q', the next start
  Tensor residual;  // [rows, cols]: error feedback
};

// m [rows * cols] (row-major) <- the rank-`rank` approximation of the sum
// over members. Uses tags `tag` and `tag + 1`. INVALID_ARGUMENT for a
// shape that does not match rows * cols, rank < 1, or sizes beyond BLAS's
// int; the collectives' errors otherwise.
absl::Status PowerSgdAllReduce(Collectives& collectives, int64_t iteration, int tag, int rank,
                               int64_t rows, int64_t cols, bool error_feedback, Tensor& m,
                               PowerSgdAllReduceState* state);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COLLECTIVES_POWERSGD_ALL_REDUCE_H_
