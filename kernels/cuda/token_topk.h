// Token top-k selection on the GPU, the CUDA twin of the selection in
// kernels/compress/token_topk_codec.cc (acctfm §4.3.1): of `tokens` tokens
// (rows of d values), keep the kept = TopKCount(keep, tokens) with the
// highest score; equal scores go to the lower token index. The kept set is
// the CPU codec's exactly:
//   - scores given by the caller (the CPU's EncodeWithScores): compared as
//     the CPU compares them (float widened to double: the same order);
//   - scores by L2 norm (the CPU's Encode): each token's squared norm is
//     summed in double, one thread per token, in the CPU's order
//     (sum += double{x} * x for j = 0..d-1, compiled without FMA
//     contraction), so the scores are bit-identical to the CPU's.
//
// Algorithm: each token's rank is counted against every other token
// (rank_i = #{j : s_j > s_i, or s_j == s_i and j < i}; kept iff rank_i <
// kept): O(tokens^2) comparisons, tiled through shared memory. Meant for
// activations (tokens = B * T <= 64K: about 4e9 comparisons, milliseconds on
// an H100); it works for more but grows quadratically. The kept indices come
// from a one-block prefix count over the mask. No atomics on floats; the
// result is deterministic.
//
// Outputs (device memory): mask[tokens], 1 for a kept token, else 0;
// kept_index[kept], the kept token indices in ascending order (the order the
// CPU payload stores their rows in). Gather and scatter move the kept rows.
//
// Synchronisation: the Select/Mask functions wait for `stream` (they check
// the scores for non-finite values and report which); Gather and Scatter
// only queue work. Each Select call takes a few bytes of scratch (and
// 8 * tokens bytes for norm scores) from the device's stream-keyed cache
// (stream_scratch.h).
//
// Thread-safety: no shared state; calls on different streams may overlap.
#ifndef PIPETRAIN_KERNELS_CUDA_TOKEN_TOPK_H_
#define PIPETRAIN_KERNELS_CUDA_TOKEN_TOPK_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pipetrain {

// TopKCount(keep, tokens) (kernels/compress/elem_topk_codec.h), after the
// CPU factory's check: INVALID_ARGUMENT "token_topk: keep K is out of range
// (0, 1]" unless 0 < keep <= 1, or if tokens < 0.
absl::StatusOr<int64_t> TokenTopKKeptCount(double keep, int64_t tokens);

// Selects the `kept` tokens with the highest scores[0, tokens) (device).
// Requires 0 <= kept <= tokens; mask holds `tokens` bytes and kept_index
// `kept` entries. INVALID_ARGUMENT for bad counts, or "token_topk:
// scores[t] is nan; scores must be finite" for the first non-finite score
// (the CPU's message); INTERNAL on CUDA failures. Waits for `stream`.
absl::Status TokenTopKSelectCuda(const float* scores, int64_t tokens, int64_t kept,
                                 uint8_t* mask, int64_t* kept_index,
                                 cudaStream_t stream = nullptr);

// As TokenTopKSelectCuda with each token's L2 norm as its score; x holds
// tokens * d floats (row-major, finite: the caller checks them, as the CPU
// Encode does before selecting). Requires d >= 1. Errors as above.
absl::Status TokenTopKSelectByNormCuda(const float* x, int64_t tokens, int64_t d, int64_t kept,
                                       uint8_t* mask, int64_t* kept_index,
                                       cudaStream_t stream = nullptr);

// TokenTopKKeptCount then TokenTopKSelectCuda; returns kept. kept_index
// must hold TokenTopKKeptCount(keep, tokens) entries.
absl::StatusOr<int64_t> TokenTopKMaskCuda(const float* scores, int64_t tokens, double keep,
                                          uint8_t* mask, int64_t* kept_index,
                                          cudaStream_t stream = nullptr);

// rows[r, :] = x[kept_index[r], :] for r < kept (rows is [kept, d]).
// Requires kept >= 0, d >= 1, indices in range. INVALID_ARGUMENT for bad
// sizes; INTERNAL if the launch fails. Queues work only.
absl::Status TokenGatherCuda(const float* x, int64_t d, const int64_t* kept_index, int64_t kept,
                             float* rows, cudaStream_t stream = nullptr);

// out [tokens, d] = 0 except out[kept_index[r], :] = rows[r, :] (the CPU
// Decode's result). Requires 0 <= kept <= tokens, d >= 1; out must not
// overlap rows. Errors as TokenGatherCuda. Queues work only.
absl::Status TokenScatterCuda(const float* rows, int64_t d, const int64_t* kept_index,
                              int64_t kept, int64_t tokens, float* out,
                              cudaStream_t stream = nullptr);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_TOKEN_TOPK_H_
