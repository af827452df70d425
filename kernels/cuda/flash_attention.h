// Causal multi-head attention on the GPU without the seq_len x seq_len
// matrices: a fused, flash-style kernel (the GPU issue, scope 3) with the
// layouts of kernels/cuda/attention.h (read it first) and its formulas,
// computed tile by tile on bf16 tensor cores with fp32 accumulation.
//
// Forward, per (batch, head) and tile of 64 queries, over the key tiles in
// ascending order, an online softmax (Milakov & Gimelshein's running max
// and sum, as FlashAttention does):
//   S = q k^T (tensor cores, bf16 in, fp32 out), scaled by 1/sqrt(head_dim),
//       causal mask;
//   m' = max(m, rowmax S);  P = exp(S - m') rounded to bf16;
//   l' = l exp(m - m') + rowsum P;  O' = O exp(m - m') + P v.
// At the end out = O / l and lse = m + log l, the row's log-sum-exp: all
// the backward needs besides qkv, out and dout ([batch, heads, seq_len]
// floats instead of the probabilities' [batch, heads, seq_len, seq_len]).
//
// Backward, from P = exp(S - lse) recomputed tile by tile:
//   D = rowsum(dout * out)  (= rowsum(dP * P), as attention.h's formula)
//   dP = dout v^T;  dS = P (dP - D) / sqrt(head_dim)
//   dv = P^T dout;  dk = dS^T q;  dq = dS k.
// dk and dv come from one kernel over key tiles, dq from one over query
// tiles, each owning the rows it writes: no atomics, so results are bitwise
// the same run to run (every sum runs in a fixed order). This recomputes
// S and dP once more than a kernel with atomic dq would.
//
// Precision: q, k, v, P, dout and dS are rounded to bf16 for the products
// (fp32 accumulation); the softmax statistics, D and the outputs are fp32.
// So results differ from the fp32 kernels by about bf16's 2^-9 relative
// rounding, whatever the backend's GEMM mode (flash_attention_test.cc
// gives the bounds). head_dim up to kFlashAttentionMaxHeadDim; others go
// through attention_gemm.h.
//
// Two implementations (FlashKernel): kWmma, WMMA fragments with every
// score tile staged in shared memory (run on an H200: parity passes, and
// slower than the GEMM attention, docs/benchmarks.md); kMma
// (flash_attention_mma.cu), mma.sync with the scores, probabilities and
// accumulators in registers, as FlashAttention-2 keeps them; written
// without a GPU and not yet run on one (its source runs on the CPU through
// kernels/cuda/emulation and meets the parity bounds there). Both compute
// the formulas above with the same roundings.
//
// All pointers are device pointers; outputs must not overlap inputs or
// each other. Work is queued on `stream`; these return before it finishes.
// `row_dots` (backward) is the caller's scratch of batch * heads * seq_len
// floats (D). INVALID_ARGUMENT if batch < 0, seq_len < 1, heads < 1,
// c < 1, c % heads != 0, head_dim above the maximum, batch * heads above
// 2^31 - 1 or more than 65535 query tiles; INTERNAL if a launch fails.
// batch == 0 launches nothing. Thread-safe (no state).
#ifndef PIPETRAIN_KERNELS_CUDA_FLASH_ATTENTION_H_
#define PIPETRAIN_KERNELS_CUDA_FLASH_ATTENTION_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pipetrain {

enum class FlashKernel { kWmma, kMma };

// "wmma" or "mma", for logs and PIPETRAIN_FLASH_KERNEL.
const char* FlashKernelName(FlashKernel kernel);

// The kernel named by the environment variable PIPETRAIN_FLASH_KERNEL (a
// benchmarking knob: "wmma" or "mma"), kWmma when it is unset;
// INVALID_ARGUMENT naming the choices otherwise.
absl::StatusOr<FlashKernel> FlashKernelFromEnvironment();

// The widest head the kernels take (their tiles live in shared memory).
inline constexpr int kFlashAttentionMaxHeadDim = 128;

// Whether the kernels take this shape (the checks above, as a bool).
bool FlashAttentionSupports(int seq_len, int c, int heads);

// out [batch, seq_len, c]; lse [batch, heads, seq_len].
absl::Status FlashAttentionForwardCuda(const float* qkv, int batch, int seq_len, int c, int heads,
                                       float* out, float* lse, cudaStream_t stream,
                                       FlashKernel kernel = FlashKernel::kWmma);

// Writes all of dqkv [batch, seq_len, 3c] from qkv, the forward's out and
// lse, and dout [batch, seq_len, c].
absl::Status FlashAttentionBackwardCuda(const float* qkv, const float* out, const float* lse,
                                        const float* dout, int batch, int seq_len, int c, int heads,
                                        float* dqkv, float* row_dots, cudaStream_t stream,
                                        FlashKernel kernel = FlashKernel::kWmma);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_FLASH_ATTENTION_H_
