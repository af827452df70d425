// Matrix-vector operations on the cube (3d-parallelism.txt §3.1.3,
// Algorithms 7 and 8): the communication that brings a diagonally stored
// vector (cube_layout.h, kVector) to the ranks whose activation block it
// applies to, and its adjoint, which sums a vector's gradient back into
// the diagonal pieces. The element-wise part (C = A + b, C = A * b) is the
// caller's.
//
// For an activation in layout d (columns block o = coord[d.output]) and a
// vector of `length` L:
//   CubeVectorAllGather  Algorithm 7 lines 1-2: broadcast the piece along
//                        d.input from the diagonal member (the one whose
//                        input coordinate equals o), then all-gather along
//                        d.weight: every rank gets v_o, the L / p values of
//                        its columns block.
//                        Sends (star broadcast, ring all-gather; floats):
//                        (p - 1) L / p^2 on every rank, plus
//                        (p - 1) L / p^2 on the diagonal ones (the roots).
//   CubeVectorReduceGrad Algorithm 8 lines 2-7: given each rank's gradient
//                        for v_o summed over its own rows (L / p values),
//                        reduce-scatter along d.weight (the adjoint of the
//                        all-gather), then sum along d.input (the adjoint of
//                        the broadcast; an all-reduce, as CubeComm has no
//                        rooted reduce), and the diagonal rank ADDS the
//                        result to its piece. Algorithm 8 as printed keeps
//                        only the x reduce-scatter; without the sum over the
//                        input axis a piece would miss the rows of the other
//                        p - 1 members. Sends (p - 1) L / p^2 +
//                        2 (p - 1) L / p^3 (an all-reduce of L / p^2; exact
//                        when p^3 divides L).
// Every member of the cube must call these together with the same length
// and direction (they are collectives). Errors: INVALID_ARGUMENT for a
// length p^2 does not divide or a span of the wrong size (named); the
// comm's errors. Not thread-safe per comm.
#ifndef PIPETRAIN_WORKER_CUBE_CUBE_VECTOR_H_
#define PIPETRAIN_WORKER_CUBE_CUBE_VECTOR_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/cube/cube_comm.h"

namespace pipetrain {

// `piece`: this rank's kVector block (L / p^2 values on the diagonal,
// empty elsewhere); `out`: L / p values.
absl::Status CubeVectorAllGather(CubeComm& comm, const CubeDirection& direction, int64_t length,
                                 absl::Span<const float> piece, absl::Span<float> out);

// `column_sums`: L / p values; `grad_piece`: this rank's kVector block,
// accumulated into (L / p^2 on the diagonal, empty elsewhere).
absl::Status CubeVectorReduceGrad(CubeComm& comm, const CubeDirection& direction, int64_t length,
                                  absl::Span<const float> column_sums,
                                  absl::Span<float> grad_piece);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_CUBE_CUBE_VECTOR_H_
