#include "kernels/cuda/attention.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_status.h"

namespace pipetrain {
namespace {

// The row kernels: threads split the keys of one query row (up to seq_len
// dot products), then the head_dim outputs. 128 threads suit GPT-2's
// head_dim of 64 and seq_len of 1024 (eight keys per thread).
constexpr int kRowThreads = 128;
// The key-gradient kernel: one thread per head dimension.
constexpr int kKeyThreads = 64;

using cuda_reduce::BlockReduce;
using cuda_reduce::MaxOp;
using cuda_reduce::SumOp;

// Where block blockIdx.x works: row `t` (a query row, or a key row in the
// key-gradient kernel) of head `h` of batch element `b`; bh = b * heads + h.
struct HeadRow {
  int64_t bh;
  int b;
  int h;
  int t;
};

__device__ HeadRow ThisBlockRow(int seq_len, int heads) {
  const int64_t row = blockIdx.x;
  HeadRow r;
  r.t = static_cast<int>(row % seq_len);
  r.bh = row / seq_len;
  r.h = static_cast<int>(r.bh % heads);
  r.b = static_cast<int>(r.bh / heads);
  return r;
}

// Sum over d < n of a[d] * b[d], in order.
__device__ float Dot(const float* a, const float* b, int n) {
  float acc = 0.0f;
  for (int d = 0; d < n; ++d) acc += a[d] * b[d];
  return acc;
}

// One query row: scores scale * q.k_j for keys j <= t, their softmax (max
// subtracted, expf within 2 ulp) into the probs row, zeros above the
// diagonal, then out = sum_j p_j v_j with j in order. The probs row in
// global memory doubles as the scores buffer: each thread touches only its
// own keys until the barrier before the output loop.
__global__ void AttentionForwardKernel(const float* qkv, int seq_len, int c, int heads,
                                       float scale, float* out, float* probs) {
  __shared__ float scratch[33];
  const HeadRow r = ThisBlockRow(seq_len, heads);
  const int hd = c / heads;
  const int64_t stride = 3 * static_cast<int64_t>(c);
  const float* head = qkv + static_cast<int64_t>(r.b) * seq_len * stride + r.h * hd;
  const float* q = head + r.t * stride;
  float* p = probs + (r.bh * seq_len + r.t) * seq_len;
  float m = -INFINITY;
  for (int j = threadIdx.x; j <= r.t; j += blockDim.x) {
    p[j] = scale * Dot(q, head + c + j * stride, hd);
    m = fmaxf(m, p[j]);
  }
  m = BlockReduce(m, -INFINITY, scratch, MaxOp());
  float sum = 0.0f;
  for (int j = threadIdx.x; j <= r.t; j += blockDim.x) {
    p[j] = expf(p[j] - m);
    sum += p[j];
  }
  const float inv = 1.0f / BlockReduce(sum, 0.0f, scratch, SumOp());
  for (int j = threadIdx.x; j <= r.t; j += blockDim.x) p[j] *= inv;
  for (int j = r.t + 1 + threadIdx.x; j < seq_len; j += blockDim.x) p[j] = 0.0f;
  __syncthreads();  // the whole probs row is read below
  float* o = out + (static_cast<int64_t>(r.b) * seq_len + r.t) * c + r.h * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j <= r.t; ++j) acc += p[j] * head[2 * c + j * stride + d];
    o[d] = acc;
  }
}

// One query row of the backward: dP_j = dout_t . v_j for j <= t, then
// dS_j = scale * P_j * (dP_j - sum_j dP_j P_j) into scratch (the CPU's
// operation order), then dq_t = sum_j dS_j k_j with j in order. Entries of
// scratch above the diagonal are not written (nothing reads them).
__global__ void AttentionQueryGradKernel(const float* qkv, const float* probs,
                                         const float* dout, int seq_len, int c, int heads,
                                         float scale, float* dqkv, float* ds_all) {
  __shared__ float scratch[33];
  const HeadRow r = ThisBlockRow(seq_len, heads);
  const int hd = c / heads;
  const int64_t stride = 3 * static_cast<int64_t>(c);
  const int64_t head_offset = static_cast<int64_t>(r.b) * seq_len * stride + r.h * hd;
  const float* head = qkv + head_offset;
  const float* p = probs + (r.bh * seq_len + r.t) * seq_len;
  float* ds = ds_all + (r.bh * seq_len + r.t) * seq_len;
  const float* dout_t = dout + (static_cast<int64_t>(r.b) * seq_len + r.t) * c + r.h * hd;
  float dot = 0.0f;
  for (int j = threadIdx.x; j <= r.t; j += blockDim.x) {
    ds[j] = Dot(dout_t, head + 2 * c + j * stride, hd);
    dot += ds[j] * p[j];
  }
  dot = BlockReduce(dot, 0.0f, scratch, SumOp());
  for (int j = threadIdx.x; j <= r.t; j += blockDim.x) ds[j] = scale * p[j] * (ds[j] - dot);
  __syncthreads();  // the whole dS row is read below
  float* dq = dqkv + head_offset + r.t * stride;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j <= r.t; ++j) acc += ds[j] * head[c + j * stride + d];
    dq[d] = acc;
  }
}

// One key row j: dk_j = sum_{t >= j} dS_tj q_t and dv_j = sum_{t >= j}
// P_tj dout_t, with t in order. Runs after AttentionQueryGradKernel (same
// stream), whose dS it reads; each block owns its dk and dv rows, so no
// atomics are needed.
__global__ void AttentionKeyGradKernel(const float* qkv, const float* probs, const float* dout,
                                       int seq_len, int c, int heads, const float* ds_all,
                                       float* dqkv) {
  const HeadRow r = ThisBlockRow(seq_len, heads);  // r.t is the key row j
  const int hd = c / heads;
  const int64_t stride = 3 * static_cast<int64_t>(c);
  const int64_t head_offset = static_cast<int64_t>(r.b) * seq_len * stride + r.h * hd;
  const float* head = qkv + head_offset;
  const float* dout_head = dout + static_cast<int64_t>(r.b) * seq_len * c + r.h * hd;
  const int64_t block = r.bh * seq_len * seq_len;
  float* dk = dqkv + head_offset + r.t * stride + c;
  float* dv = dk + c;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float dk_acc = 0.0f;
    float dv_acc = 0.0f;
    for (int t = r.t; t < seq_len; ++t) {
      const int64_t at = block + static_cast<int64_t>(t) * seq_len + r.t;
      dk_acc += ds_all[at] * head[t * stride + d];
      dv_acc += probs[at] * dout_head[static_cast<int64_t>(t) * c + d];
    }
    dk[d] = dk_acc;
    dv[d] = dv_acc;
  }
}

// Validates the shape and sets *blocks to batch * heads * seq_len.
absl::Status CheckShape(const char* op, int batch, int seq_len, int c, int heads,
                        int64_t* blocks) {
  if (batch < 0 || seq_len < 1 || heads < 1 || c < 1 || c % heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": batch ", batch, ", seq_len ", seq_len, ", c ", c, ", heads ", heads,
        " needs batch >= 0, seq_len >= 1, heads >= 1 and c a positive multiple of heads"));
  }
  *blocks = static_cast<int64_t>(batch) * heads * seq_len;
  if (*blocks > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": batch * heads * seq_len = ", *blocks,
                     " rows exceed the 2^31 - 1 grid limit; split the batch"));
  }
  return absl::OkStatus();
}

// 1 / sqrt(head_dim), computed as the CPU computes it.
float Scale(int c, int heads) { return 1.0f / std::sqrt(static_cast<float>(c / heads)); }

}  // namespace

absl::Status AttentionForwardCuda(const float* qkv, int batch, int seq_len, int c, int heads,
                                  float* out, float* probs, cudaStream_t stream) {
  int64_t blocks = 0;
  absl::Status valid = CheckShape("AttentionForwardCuda", batch, seq_len, c, heads, &blocks);
  if (!valid.ok() || blocks == 0) return valid;
  AttentionForwardKernel<<<static_cast<unsigned>(blocks), kRowThreads, 0, stream>>>(
      qkv, seq_len, c, heads, Scale(c, heads), out, probs);
  CUDA_CHECK_LAUNCH("AttentionForwardKernel");
  return absl::OkStatus();
}

absl::Status AttentionBackwardCuda(const float* qkv, const float* probs, const float* dout,
                                   int batch, int seq_len, int c, int heads, float* dqkv,
                                   float* scratch, cudaStream_t stream) {
  int64_t blocks = 0;
  absl::Status valid = CheckShape("AttentionBackwardCuda", batch, seq_len, c, heads, &blocks);
  if (!valid.ok() || blocks == 0) return valid;
  const unsigned grid = static_cast<unsigned>(blocks);
  AttentionQueryGradKernel<<<grid, kRowThreads, 0, stream>>>(qkv, probs, dout, seq_len, c, heads,
                                                             Scale(c, heads), dqkv, scratch);
  CUDA_CHECK_LAUNCH("AttentionQueryGradKernel");
  AttentionKeyGradKernel<<<grid, kKeyThreads, 0, stream>>>(qkv, probs, dout, seq_len, c, heads,
                                                           scratch, dqkv);
  CUDA_CHECK_LAUNCH("AttentionKeyGradKernel");
  return absl::OkStatus();
}

}  // namespace pipetrain
