// LayerNorm over the last dimension (GPT-2: eps = 1e-5).
//
// Forward: for each of n rows of c values, y = (x - mean) * rstd * w + b with
// rstd = 1 / sqrt(var + eps) (biased variance). It stores mean[n] and rstd[n]
// for the backward pass. Backward writes dx and ACCUMULATES dw, db.
#ifndef PIPETRAIN_KERNELS_CPU_LAYERNORM_H_
#define PIPETRAIN_KERNELS_CPU_LAYERNORM_H_

namespace pipetrain {

constexpr float kLayerNormEps = 1e-5f;

void LayerNormForward(const float* x, const float* w, const float* b, int n, int c, float eps,
                      float* y, float* mean, float* rstd);

void LayerNormBackward(const float* x, const float* w, const float* mean, const float* rstd,
                       const float* dy, int n, int c, float* dx, float* dw, float* db);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CPU_LAYERNORM_H_
