// Piecewise quantization, acctfm §4.3.2 eq. (6)-(12) (the paper's Fig. 4).
//
// The parameter `bits` is the paper's "data bit width N": the magnitude range
// [0, M], M = max|R|, is split into N clusters of equal width M / N, and
// cluster k holds equidistant intervals of width U_k that double from cluster
// to cluster, so values near 0 (the dense part of a Gaussian) get the finest
// grid. Negative values mirror positive ones through a separate sign bit, so
// each value costs N + 1 bits (the paper's closing remark of §4.3.2).
//
// For a value val, with a = |val|:
//   U_0 = M / (N * 2^(N-1))                        eq. (12), from (10)-(11)
//   U_k = U_0 * 2^k                                eq. (8)
//   C_k = M / N * k      (left edge of cluster k)  eq. (7)
//   k   = floor(a * N / M), clamped to N-1         eq. (9); only a == M gives
//                                                  N, it belongs to the last
//                                                  cluster's right edge
//   j   = round((a - C_k) / U_k), 0 <= j <= 2^(N-1-k)
//   Qa  = C_k + j * U_k                            eq. (6)
//   Qval = sign(val) * Qa
// Cluster k holds p / 2^k = 2^(N-1-k) intervals (eq. 10 with p = 2^(N-1)),
// N clusters hold 2^N - 1 intervals (eq. 11), i.e. 2^N distinct magnitude
// levels 0 = L_0 < ... < L_{2^N - 1} = M. The level index of (k, j) is
// (2^N - 2^(N-k)) + j; j = 2^(N-1-k) is the same level as (k+1, 0).
//
// Guarantee: |Qval - val| <= U_k / 2 for a value in cluster k (as above), plus
// the float32 rounding of the decoded level (half an ulp). M = 0 (all zeros)
// decodes to exact zeros.
//
// Payload: the common header (payload.h), then
//   uint8  N (1..8)
//   f32    M = max|R| (finite, >= 0)
//   body   numel codes of N + 1 bits, LSB-first (BitWriter):
//          code = sign << N | level_index (sign = 1 for val < 0).
//   EncodedBytes(shape) = HeaderBytes(rank) + 1 + 4 + ceil((N + 1) * numel / 8);
//   e.g. N = 3: ceil(4 * numel / 8) body bytes.
//
// Encode: INVALID_ARGUMENT for non-finite input (CheckFinite).
// Decode: INVALID_ARGUMENT for a bad header, an N other than this codec's,
// a non-finite or negative M, or a body length other than the shape implies.
// (Every code is a valid level, so the body itself cannot be out of range.)
//
// Thread-safety: immutable; share freely.
#ifndef PIPETRAIN_KERNELS_COMPRESS_PIECEWISE_CODEC_H_
#define PIPETRAIN_KERNELS_COMPRESS_PIECEWISE_CODEC_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/compress/codec.h"

namespace pipetrain {

inline constexpr int kPiecewiseMinClusters = 1;
inline constexpr int kPiecewiseMaxClusters = 8;

// name() "piecewise:bits=<N>", codec id kPiecewise; N + 1 bits per value.
// INVALID_ARGUMENT naming "bits" unless 1 <= bits <= 8.
absl::StatusOr<std::unique_ptr<Codec>> MakePiecewiseCodec(int bits);

// The interval width U_k (eq. 8, 12) for the cluster holding `value` under
// max|R| = `max_abs` and N = `clusters` (eq. 9, clamped): the per-element
// error bound is half of it. 0 when max_abs == 0. Exposed for tests.
double PiecewiseIntervalFor(float value, float max_abs, int clusters);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_COMPRESS_PIECEWISE_CODEC_H_
