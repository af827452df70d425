// Causal multi-head self-attention core on the GPU, the CUDA twin of
// kernels/cpu/attention.h (same layouts and formulas).
//
// qkv [batch, seq_len, 3c] holds q, k, v side by side; heads split c into
// slices of head_dim = c / heads. Per (batch, head):
//   S = q k^T / sqrt(head_dim), position t sees only positions <= t,
//   P = softmax(S) row-wise (max subtracted), out = P v.
// out is [batch, seq_len, c] (heads concatenated); probs is
// [batch, heads, seq_len, seq_len] with zeros above the diagonal, kept for
// the backward pass. The backward writes all of dqkv [batch, seq_len, 3c]
// from dout [batch, seq_len, c], qkv and probs:
//   dv = P^T dout, dS = P * (dout v^T - rowsum(dout v^T * P)) / sqrt(head_dim),
//   dq = dS k, dk = dS^T q.
// `scratch` holds dS: batch * heads * seq_len * seq_len floats (every
// (batch, head) at once, unlike the CPU's one seq_len^2 block); on return
// it holds dS on and below the diagonal, and nothing is written above it.
//
// These are straightforward kernels, one block per (batch, head, row) with
// plain fp32 dot products, written for correctness and determinism first:
// O(seq_len^2) memory for probs and scratch, and no tensor cores. Attention
// through cuBLAS batched GEMMs (and later a fused, flash-style kernel) is the
// next step; these stay as the GPU reference for it.
//
// All pointers are device pointers. Outputs must not overlap inputs or each
// other. Work is queued on `stream`; these return before it finishes.
// Results are bitwise deterministic run to run (every sum runs in a fixed
// order; no atomics). INVALID_ARGUMENT if batch < 0, seq_len < 1, heads < 1,
// c < 1, c % heads != 0, or batch * heads * seq_len exceeds the grid limit
// (2^31 - 1 blocks); INTERNAL if a launch fails. batch == 0 launches
// nothing. Thread-safe (no state).
#ifndef PIPETRAIN_KERNELS_CUDA_ATTENTION_H_
#define PIPETRAIN_KERNELS_CUDA_ATTENTION_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace pipetrain {

absl::Status AttentionForwardCuda(const float* qkv, int batch, int seq_len, int c, int heads,
                                  float* out, float* probs, cudaStream_t stream = nullptr);

absl::Status AttentionBackwardCuda(const float* qkv, const float* probs, const float* dout,
                                   int batch, int seq_len, int c, int heads, float* dqkv,
                                   float* scratch, cudaStream_t stream = nullptr);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_ATTENTION_H_
