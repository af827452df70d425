// Causal multi-head attention on the GPU through cuBLAS batched GEMMs: the
// same contract, layouts and formulas as kernels/cuda/attention.h (read it
// first), computed as attention.h's header says comes next: the four
// matrix products of each head run as tensor-core-capable GEMMs (in the
// handle's GemmMode) instead of one block per row with plain dot products.
// attention.h's kernels stay as the reference it is tested against.
//
// Forward, per batch element b, all heads in one strided-batched GEMM:
//   S = scale q k^T  -> the probs buffer (full [seq_len, seq_len] per head)
//   P = causal softmax of S, in place (row kernel: max subtracted, zeros
//       above the diagonal)
//   out = P v
// Backward:
//   dP = dout v^T -> scratch;  dv = P^T dout
//   dS = scale P (dP - rowsum(dP P)), in place, zeros above the diagonal
//   dq = dS k;  dk = dS^T q
// Each head's q, k, v (and dq, dk, dv) are a [seq_len, head_dim] slice of
// qkv's rows (row stride 3c), so no data is permuted. The products run over
// the full square (twice the causal half's FLOPs); the zeros above P's and
// dS's diagonals make that exact.
//
// Results: within the tolerances of attention_test.cc against the CPU (fp32
// GEMM mode; TF32 and bf16 round the GEMMs' inputs), bitwise equal run to
// run (cuBLAS and the row kernels sum in a fixed order). scratch, as
// attention.h's, holds dS on return, here with zeros above the diagonal.
// Queued on handle.stream(). Errors as attention.h's functions, and
// FAILED_PRECONDITION for an empty handle, INTERNAL if cuBLAS fails.
#ifndef PIPETRAIN_KERNELS_CUDA_ATTENTION_GEMM_H_
#define PIPETRAIN_KERNELS_CUDA_ATTENTION_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/linear.h"

namespace pipetrain {

absl::Status AttentionGemmForwardCuda(const CublasHandle& handle, const float* qkv, int batch,
                                      int seq_len, int c, int heads, float* out, float* probs);

absl::Status AttentionGemmBackwardCuda(const CublasHandle& handle, const float* qkv,
                                       const float* probs, const float* dout, int batch,
                                       int seq_len, int c, int heads, float* dqkv,
                                       float* scratch);

// --- Row kernels (building blocks; rows = batch * heads * seq_len square
// rows of seq_len floats, row r holding query position r % seq_len) ---

// In place: s[r][j] = softmax over j <= t of s[r][j] (max subtracted, expf),
// 0 for j > t. INVALID_ARGUMENT for rows < 0, seq_len < 1 or rows above
// 2^31 - 1; INTERNAL if the launch fails.
absl::Status CausalSoftmaxRowsCuda(float* s, int64_t rows, int seq_len, cudaStream_t stream);

// In place: d[r][j] = scale * p[r][j] * (d[r][j] - sum_{u <= t} d[r][u] p[r][u])
// for j <= t, 0 for j > t. Errors as CausalSoftmaxRowsCuda.
absl::Status CausalSoftmaxBackwardRowsCuda(const float* p, float* d, int64_t rows, int seq_len,
                                           float scale, cudaStream_t stream);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_ATTENTION_GEMM_H_
