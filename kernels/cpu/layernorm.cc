#include "kernels/cpu/layernorm.h"

#include <cmath>
#include <cstdint>

#include "kernels/cpu/target_clones.h"

namespace pipetrain {

// Per target (target_clones.h): the normalising loops vectorise; the sums
// stay in order (no reassociation), so every clone gives the same bits.
PT_TARGET_CLONES
void LayerNormForward(const float* x, const float* w, const float* b, int n, int c, float eps,
                      float* y, float* mean, float* rstd) {
  for (int i = 0; i < n; ++i) {
    const float* xi = x + static_cast<int64_t>(i) * c;
    float* yi = y + static_cast<int64_t>(i) * c;
    // Two passes (mean, then centred squares) avoid the cancellation of
    // E[x^2] - E[x]^2 when activations have a large mean.
    float sum = 0.0f;
    for (int j = 0; j < c; ++j) sum += xi[j];
    float m = sum / c;
    float sq = 0.0f;
    for (int j = 0; j < c; ++j) {
      float d = xi[j] - m;
      sq += d * d;
    }
    float r = 1.0f / std::sqrt(sq / c + eps);
    for (int j = 0; j < c; ++j) yi[j] = (xi[j] - m) * r * w[j] + b[j];
    mean[i] = m;
    rstd[i] = r;
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w, the
// derivative of the normalisation through both the mean and the variance.
PT_TARGET_CLONES
void LayerNormBackward(const float* x, const float* w, const float* mean, const float* rstd,
                       const float* dy, int n, int c, float* dx, float* dw, float* db) {
  for (int i = 0; i < n; ++i) {
    const float* xi = x + static_cast<int64_t>(i) * c;
    const float* dyi = dy + static_cast<int64_t>(i) * c;
    float* dxi = dx + static_cast<int64_t>(i) * c;
    const float m = mean[i], r = rstd[i];
    float g_sum = 0.0f, gx_sum = 0.0f;
    for (int j = 0; j < c; ++j) {
      float xhat = (xi[j] - m) * r;
      float g = dyi[j] * w[j];
      g_sum += g;
      gx_sum += g * xhat;
      dw[j] += dyi[j] * xhat;
      db[j] += dyi[j];
    }
    const float g_mean = g_sum / c, gx_mean = gx_sum / c;
    for (int j = 0; j < c; ++j) {
      float xhat = (xi[j] - m) * r;
      dxi[j] = r * (dyi[j] * w[j] - g_mean - xhat * gx_mean);
    }
  }
}

}  // namespace pipetrain
