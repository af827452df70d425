// PowerSGD low-rank compression (Vogels et al.; the codec Optimus-CC §5
// applies to inter-stage gradients): x is viewed as a matrix M with
// rows = product of all but the last dimension and cols = the last
// dimension (a rank-1 tensor is one row; a scalar is 1 x 1).
//
// Encode, one power iteration:
//   1. Q0 [cols, r]: CodecState::powersgd_q when its shape is [cols, r]
//      (warm start), else drawn from N(0, 1) by Philox with a fixed seed.
//      Columns of a warm Q that are all zero (left by a rank-deficient
//      earlier input) are replaced by the fixed Philox columns, so a
//      deficient previous call cannot limit the span of this one.
//   2. P = M Q0 [rows, r].
//   3. Orthonormalise P's columns: modified Gram-Schmidt, each column
//      projected against the previous ones twice ("twice is enough": one fp32
//      pass leaves non-orthogonality of order eps * cond). A column whose
//      norm after projection is at most 1e-5 of its norm before (or zero) is
//      numerically in the span of the previous ones: it is set to zero, not
//      normalised, so it adds no noise direction.
//   4. Q = M^T P [cols, r]; stored back into state->powersgd_q (if state is
//      non-null) to warm-start the next call on this link.
// Decode: M^ = P Q^T = P P^T M, the projection of M onto span(P). A matrix
// of rank <= r whose column space P captures is reproduced to fp32 precision.
//
// Payload: the common header (payload.h), then
//   uint32 r
//   P: rows * r f32 (row-major), Q: cols * r f32 (row-major)
//   EncodedBytes(shape) = HeaderBytes(rank) + 4 + 4 * r * (rows + cols).
//
// Steps 2 and 4 run in a fixed order (MatrixTimesFactor and
// MatrixTransposeTimesFactor, kernels/cpu/low_rank.h), not through BLAS:
// every CPU writes the same payload for the same input and warm start,
// which a stage's tensor-parallel ranks, each encoding the same replicated
// tensor for its own link, rely on.
//
// Errors (INVALID_ARGUMENT): Encode for non-finite input or rows/cols above
// 2^31 - 1 (the GPU twin's int dimensions; both refuse alike). Decode for a bad header, r other
// than this codec's, a body of the wrong length, or non-finite factors.
//
// Thread-safety: the codec is immutable; a CodecState must not be shared by
// concurrent calls.
#ifndef PIPETRAIN_KERNELS_COMPRESS_POWERSGD_CODEC_H_
#define PIPETRAIN_KERNELS_COMPRESS_POWERSGD_CODEC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/compress/codec.h"

namespace pipetrain {

// name() "powersgd:rank=<rank>". INVALID_ARGUMENT naming `rank` unless
// 1 <= rank <= 65536.
absl::StatusOr<std::unique_ptr<Codec>> MakePowerSgdCodec(int rank);

// --- The payload format, shared with the GPU twin
// (kernels/cuda/powersgd_payload.h), which computes P and Q on the device
// and must write and read exactly what this codec does.

// The matrix a tensor of `shape` is viewed as (header, first paragraph).
struct PowerSgdMatrix {
  int64_t rows = 0;
  int64_t cols = 0;
};
PowerSgdMatrix PowerSgdMatrixOf(const Shape& shape);

// The payload of a tensor of `shape` whose factors are p [rows, rank] and
// q [cols, rank] (row-major host arrays of that matrix's sizes).
std::string WritePowerSgdPayload(const Shape& shape, int rank, const float* p, const float* q);

// A payload's shape and factors, checked as Decode checks them (the same
// INVALID_ARGUMENT errors, for a codec of `rank`), not yet multiplied out.
struct PowerSgdFactors {
  Shape shape;
  PowerSgdMatrix matrix;
  std::vector<float> p;  // [rows, rank]
  std::vector<float> q;  // [cols, rank]
};
absl::StatusOr<PowerSgdFactors> ReadPowerSgdPayload(absl::string_view payload, int rank);

// --- The steps, shared with the compressed all-reduce
// (worker/collectives/powersgd_all_reduce.h), which must take the same ones.

// Step 3: orthonormalises the r columns of p [rows, r] (row-major) in place.
void PowerSgdOrthonormalise(float* p, int64_t rows, int r);
// Step 1: the start Q [cols, r]: `warm` when it has that shape (its zero
// columns replaced by the fixed ones), else the fixed Philox draw.
Tensor PowerSgdStartQ(const Tensor& warm, int64_t cols, int r);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_COMPRESS_POWERSGD_CODEC_H_
