#include "kernels/cpu/flash_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/compress/fp16_codec.h"

namespace pipetrain {
namespace {

// One (batch, head)'s rows: q, k, v at columns h * hd, c + h * hd and
// 2c + h * hd of qkv's rows, rounded to bf16 as the GPU's tiles hold them.
struct HeadInputs {
  int seq_len, hd;
  std::vector<float> q, k, v;  // [seq_len][hd]

  HeadInputs(const float* qkv, int b, int h, int seq_len, int c, int heads)
      : seq_len(seq_len), hd(c / heads) {
    q.resize(static_cast<size_t>(seq_len) * hd);
    k.resize(q.size());
    v.resize(q.size());
    for (int t = 0; t < seq_len; ++t) {
      const float* row = qkv + (int64_t{b} * seq_len + t) * 3 * c + int64_t{h} * hd;
      for (int d = 0; d < hd; ++d) {
        q[t * hd + d] = RoundToBf16(row[d]);
        k[t * hd + d] = RoundToBf16(row[c + d]);
        v[t * hd + d] = RoundToBf16(row[2 * c + d]);
      }
    }
  }
  float Dot(const std::vector<float>& a, int i, const std::vector<float>& b, int j) const {
    float sum = 0.0f;
    for (int d = 0; d < hd; ++d) sum += a[i * hd + d] * b[j * hd + d];
    return sum;
  }
};

float Scale(int hd) { return 1.0f / std::sqrt(static_cast<float>(hd)); }  // as attention.cc

}  // namespace

float RoundToBf16(float x) {
  // The bf16 codec's rounding (kernels/compress/fp16_codec.h).
  if (std::isnan(x)) return x;  // stays NaN, as on the GPU (kernels/cuda/bf16_round.h)
  uint16_t bits = 0;
  if (!FloatToBf16(x, &bits)) return std::copysign(INFINITY, x);  // beyond bf16's range
  return Bf16ToFloat(bits);
}

void FlashAttentionForward(const float* qkv, int batch, int seq_len, int c, int heads, float* out,
                           float* lse) {
  const int hd = c / heads;
  const float scale = Scale(hd);
  std::vector<float> o(hd), pv(hd), s(kFlashTileKeys);
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < heads; ++h) {
      const HeadInputs in(qkv, b, h, seq_len, c, heads);
      for (int t = 0; t < seq_len; ++t) {
        float m = -INFINITY, l = 0.0f;
        std::fill(o.begin(), o.end(), 0.0f);
        for (int k0 = 0; k0 <= t; k0 += kFlashTileKeys) {
          const int keys = std::min(kFlashTileKeys, t + 1 - k0);  // the visible ones
          float tile_max = -INFINITY;
          for (int j = 0; j < keys; ++j) {
            s[j] = in.Dot(in.q, t, in.k, k0 + j) * scale;
            tile_max = std::max(tile_max, s[j]);
          }
          const float m_new = std::max(m, tile_max);
          const float rescale = std::exp(m - m_new);  // 0 on the first tile
          // As the GPU: the tile's P v summed apart, then added to the
          // rescaled o.
          float sum = 0.0f;
          std::fill(pv.begin(), pv.end(), 0.0f);
          for (int j = 0; j < keys; ++j) {
            const float p = RoundToBf16(std::exp(s[j] - m_new));
            sum += p;
            for (int d = 0; d < hd; ++d) pv[d] += p * in.v[(k0 + j) * hd + d];
          }
          for (int d = 0; d < hd; ++d) o[d] = o[d] * rescale + pv[d];
          l = l * rescale + sum;
          m = m_new;
        }
        float* row = out + (int64_t{b} * seq_len + t) * c + int64_t{h} * hd;
        for (int d = 0; d < hd; ++d) row[d] = o[d] / l;
        lse[(int64_t{b} * heads + h) * seq_len + t] = m + std::log(l);
      }
    }
  }
}

void FlashAttentionBackward(const float* qkv, const float* out, const float* lse, const float* dout,
                            int batch, int seq_len, int c, int heads, float* dqkv) {
  const int hd = c / heads;
  const float scale = Scale(hd);
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < heads; ++h) {
      const HeadInputs in(qkv, b, h, seq_len, c, heads);
      std::vector<float> d_out(static_cast<size_t>(seq_len) * hd), dots(seq_len);
      for (int t = 0; t < seq_len; ++t) {
        const int64_t at = (int64_t{b} * seq_len + t) * c + int64_t{h} * hd;
        float dot = 0.0f;
        for (int d = 0; d < hd; ++d) {
          dot += out[at + d] * dout[at + d];
          d_out[t * hd + d] = RoundToBf16(dout[at + d]);
        }
        dots[t] = dot;
      }
      std::vector<float> dq(d_out.size(), 0.0f), dk(d_out.size(), 0.0f), dv(d_out.size(), 0.0f);
      for (int t = 0; t < seq_len; ++t) {
        const float row_lse = lse[(int64_t{b} * heads + h) * seq_len + t];
        for (int j = 0; j <= t; ++j) {
          const float p = std::exp(in.Dot(in.q, t, in.k, j) * scale - row_lse);
          const float dp = in.Dot(d_out, t, in.v, j);
          const float ds = RoundToBf16(p * (dp - dots[t]) * scale);
          const float pb = RoundToBf16(p);
          for (int d = 0; d < hd; ++d) {
            dv[j * hd + d] += pb * d_out[t * hd + d];
            dk[j * hd + d] += ds * in.q[t * hd + d];
            dq[t * hd + d] += ds * in.k[j * hd + d];
          }
        }
      }
      for (int t = 0; t < seq_len; ++t) {
        float* row = dqkv + (int64_t{b} * seq_len + t) * 3 * c + int64_t{h} * hd;
        for (int d = 0; d < hd; ++d) {
          row[d] = dq[t * hd + d];
          row[c + d] = dk[t * hd + d];
          row[2 * c + d] = dv[t * hd + d];
        }
      }
    }
  }
}

}  // namespace pipetrain
