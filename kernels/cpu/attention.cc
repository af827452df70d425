#include "kernels/cpu/attention.h"

#include <cmath>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/target_clones.h"

namespace pipetrain {
namespace {

// Causal softmax of one T x T score block in place: row t keeps columns
// 0..t and zeroes the rest, so the masked entries contribute exactly 0.
PT_TARGET_CLONES
void CausalSoftmaxRows(float* s, int seq_len) {
  for (int t = 0; t < seq_len; ++t) {
    float* row = s + static_cast<int64_t>(t) * seq_len;
    float max = row[0];
    for (int j = 1; j <= t; ++j) max = row[j] > max ? row[j] : max;
    float sum = 0.0f;
    for (int j = 0; j <= t; ++j) {
      row[j] = FastExp(row[j] - max);
      sum += row[j];
    }
    float inv = 1.0f / sum;
    for (int j = 0; j <= t; ++j) row[j] *= inv;
    for (int j = t + 1; j < seq_len; ++j) row[j] = 0.0f;
  }
}

// Softmax backward on one block: dS = P * (dP - sum_j dP * P), scaled, in
// place in dp. Entries above the diagonal have P = 0 and so get 0.
PT_TARGET_CLONES
void SoftmaxBackwardRows(const float* p, float* dp, int seq_len, float scale) {
  for (int t = 0; t < seq_len; ++t) {
    const float* prow = p + static_cast<int64_t>(t) * seq_len;
    float* drow = dp + static_cast<int64_t>(t) * seq_len;
    float dot = 0.0f;
    for (int j = 0; j <= t; ++j) dot += drow[j] * prow[j];
    for (int j = 0; j <= t; ++j) drow[j] = scale * prow[j] * (drow[j] - dot);
    for (int j = t + 1; j < seq_len; ++j) drow[j] = 0.0f;
  }
}

}  // namespace

void AttentionForward(const float* qkv, int batch, int seq_len, int c, int heads, float* out,
                      float* probs) {
  const int hd = c / heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t block = static_cast<int64_t>(seq_len) * seq_len;
  for (int b = 0; b < batch; ++b) {
    const float* base = qkv + static_cast<int64_t>(b) * seq_len * 3 * c;
    for (int h = 0; h < heads; ++h) {
      const float* q = base + h * hd;
      const float* k = base + c + h * hd;
      const float* v = base + 2 * c + h * hd;
      float* p = probs + (static_cast<int64_t>(b) * heads + h) * block;
      Sgemm(false, true, seq_len, seq_len, hd, scale, q, 3 * c, k, 3 * c, 0.0f, p, seq_len);
      CausalSoftmaxRows(p, seq_len);
      float* o = out + static_cast<int64_t>(b) * seq_len * c + h * hd;
      Sgemm(false, false, seq_len, hd, seq_len, 1.0f, p, seq_len, v, 3 * c, 0.0f, o, c);
    }
  }
}

void AttentionBackward(const float* qkv, const float* probs, const float* dout, int batch,
                       int seq_len, int c, int heads, float* dqkv, float* scratch) {
  const int hd = c / heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t block = static_cast<int64_t>(seq_len) * seq_len;
  for (int b = 0; b < batch; ++b) {
    const int64_t offset = static_cast<int64_t>(b) * seq_len * 3 * c;
    const float* do_b = dout + static_cast<int64_t>(b) * seq_len * c;
    for (int h = 0; h < heads; ++h) {
      const float* q = qkv + offset + h * hd;
      const float* k = q + c;
      const float* v = q + 2 * c;
      float* dq = dqkv + offset + h * hd;
      float* dk = dq + c;
      float* dv = dq + 2 * c;
      const float* p = probs + (static_cast<int64_t>(b) * heads + h) * block;
      const float* dout_h = do_b + h * hd;
      // dP = dO v^T and dv = P^T dO.
      Sgemm(false, true, seq_len, seq_len, hd, 1.0f, dout_h, c, v, 3 * c, 0.0f, scratch,
            seq_len);
      Sgemm(true, false, seq_len, hd, seq_len, 1.0f, p, seq_len, dout_h, c, 0.0f, dv, 3 * c);
      SoftmaxBackwardRows(p, scratch, seq_len, scale);
      // dq = dS k and dk = dS^T q (dS already carries the 1/sqrt(hd) scale).
      Sgemm(false, false, seq_len, hd, seq_len, 1.0f, scratch, seq_len, k, 3 * c, 0.0f, dq,
            3 * c);
      Sgemm(true, false, seq_len, hd, seq_len, 1.0f, scratch, seq_len, q, 3 * c, 0.0f, dk,
            3 * c);
    }
  }
}

}  // namespace pipetrain
