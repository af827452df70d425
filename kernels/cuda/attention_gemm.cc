// Host side of attention_gemm.h: the per-head GEMMs (strided-batched over
// the heads of one batch element: a head is `head_dim` floats further into
// each row, a stride cuBLAS can take; batch elements are a loop) around
// the softmax row kernels of attention_gemm.cu.
#include "kernels/cuda/attention_gemm.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

absl::Status CheckShape(const char* op, int batch, int seq_len, int c, int heads) {
  if (batch < 0 || seq_len < 1 || heads < 1 || c < 1 || c % heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": batch ", batch, ", seq_len ", seq_len, ", c ", c, ", heads ", heads,
        " needs batch >= 0, seq_len >= 1, heads >= 1 and c a positive multiple of heads"));
  }
  if (int64_t{batch} * heads * seq_len > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": batch * heads * seq_len = ", int64_t{batch} * heads * seq_len,
                     " rows exceed the 2^31 - 1 grid limit; split the batch"));
  }
  return absl::OkStatus();
}

// Where batch element b's matrices start, and their strides.
struct Layout {
  int seq_len, c, heads, hd;
  int64_t square;  // seq_len^2: one head's probs (or dS)
  int qkv_ld() const { return 3 * c; }
  int64_t qkv_offset(int b) const { return int64_t{b} * seq_len * 3 * c; }
  int64_t out_offset(int b) const { return int64_t{b} * seq_len * c; }
  int64_t square_offset(int b) const { return int64_t{b} * heads * square; }
};

Layout LayoutOf(int seq_len, int c, int heads) {
  return Layout{seq_len, c, heads, c / heads, int64_t{seq_len} * seq_len};
}

// 1 / sqrt(head_dim), computed as the CPU and attention.cu compute it.
float Scale(const Layout& l) { return 1.0f / std::sqrt(static_cast<float>(l.hd)); }

}  // namespace

absl::Status AttentionGemmForwardCuda(const CublasHandle& handle, const float* qkv, int batch,
                                      int seq_len, int c, int heads, float* out, float* probs) {
  RETURN_IF_ERROR(CheckShape("AttentionGemmForwardCuda", batch, seq_len, c, heads));
  if (batch == 0) return absl::OkStatus();
  const Layout l = LayoutOf(seq_len, c, heads);
  const int t = seq_len;
  for (int b = 0; b < batch; ++b) {
    const float* q = qkv + l.qkv_offset(b);
    // S = scale q k^T, every head at once: [t, hd] x [t, hd]^T.
    RETURN_IF_ERROR(SgemmStridedBatchedCuda(handle, false, true, t, t, l.hd, Scale(l), q,
                                            l.qkv_ld(), l.hd, q + c, l.qkv_ld(), l.hd, 0.0f,
                                            probs + l.square_offset(b), t, l.square, heads));
  }
  RETURN_IF_ERROR(
      CausalSoftmaxRowsCuda(probs, int64_t{batch} * heads * t, t, handle.stream()));
  for (int b = 0; b < batch; ++b) {
    const float* v = qkv + l.qkv_offset(b) + 2 * c;
    // out = P v: [t, t] x [t, hd], into the head's columns of out's rows.
    RETURN_IF_ERROR(SgemmStridedBatchedCuda(handle, false, false, t, l.hd, t, 1.0f,
                                            probs + l.square_offset(b), t, l.square, v,
                                            l.qkv_ld(), l.hd, 0.0f, out + l.out_offset(b), c,
                                            l.hd, heads));
  }
  return absl::OkStatus();
}

absl::Status AttentionGemmBackwardCuda(const CublasHandle& handle, const float* qkv,
                                       const float* probs, const float* dout, int batch,
                                       int seq_len, int c, int heads, float* dqkv,
                                       float* scratch) {
  RETURN_IF_ERROR(CheckShape("AttentionGemmBackwardCuda", batch, seq_len, c, heads));
  if (batch == 0) return absl::OkStatus();
  const Layout l = LayoutOf(seq_len, c, heads);
  const int t = seq_len;
  for (int b = 0; b < batch; ++b) {
    const float* v = qkv + l.qkv_offset(b) + 2 * c;
    const float* d_out = dout + l.out_offset(b);
    const float* p = probs + l.square_offset(b);
    float* dv = dqkv + l.qkv_offset(b) + 2 * c;
    // dP = dout v^T: [t, hd] x [t, hd]^T, into scratch.
    RETURN_IF_ERROR(SgemmStridedBatchedCuda(handle, false, true, t, t, l.hd, 1.0f, d_out, c,
                                            l.hd, v, l.qkv_ld(), l.hd, 0.0f,
                                            scratch + l.square_offset(b), t, l.square, heads));
    // dv = P^T dout: [t, t]^T x [t, hd].
    RETURN_IF_ERROR(SgemmStridedBatchedCuda(handle, true, false, t, l.hd, t, 1.0f, p, t,
                                            l.square, d_out, c, l.hd, 0.0f, dv, l.qkv_ld(), l.hd,
                                            heads));
  }
  RETURN_IF_ERROR(CausalSoftmaxBackwardRowsCuda(probs, scratch, int64_t{batch} * heads * t, t,
                                                Scale(l), handle.stream()));
  for (int b = 0; b < batch; ++b) {
    const float* q = qkv + l.qkv_offset(b);
    const float* ds = scratch + l.square_offset(b);
    float* dq = dqkv + l.qkv_offset(b);
    // dq = dS k: [t, t] x [t, hd].
    RETURN_IF_ERROR(SgemmStridedBatchedCuda(handle, false, false, t, l.hd, t, 1.0f, ds, t,
                                            l.square, q + c, l.qkv_ld(), l.hd, 0.0f, dq,
                                            l.qkv_ld(), l.hd, heads));
    // dk = dS^T q: [t, t]^T x [t, hd].
    RETURN_IF_ERROR(SgemmStridedBatchedCuda(handle, true, false, t, l.hd, t, 1.0f, ds, t,
                                            l.square, q, l.qkv_ld(), l.hd, 0.0f, dq + c,
                                            l.qkv_ld(), l.hd, heads));
  }
  return absl::OkStatus();
}

}  // namespace pipetrain
