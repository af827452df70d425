#include "worker/train/grad_clip.h"

#include <cmath>

namespace pipetrain {

double ParameterSquares(Backend* backend, const Parameter& p) {
  const Tensor grad = p.grad.on_device() ? backend->Download(p.grad) : p.grad;
  const float* g = grad.data();
  double sum = 0;
  for (int64_t i = 0; i < grad.numel(); ++i) sum += double(g[i]) * double(g[i]);
  return sum;
}

float ClipScale(double total_squares, float max_norm) {
  if (!(max_norm > 0)) return 1.0f;
  const double coef = double(max_norm) / (std::sqrt(total_squares) + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

void ScaleGradients(Backend* backend, const std::vector<Parameter*>& params, float scale) {
  if (scale == 1.0f) return;
  for (Parameter* p : params) {
    if (p->grad.on_device()) {
      Tensor host = backend->Download(p->grad);
      float* g = host.data();
      for (int64_t i = 0; i < host.numel(); ++i) g[i] *= scale;
      backend->CopyFromHost(host, &p->grad);
    } else {
      float* g = p->grad.data();
      for (int64_t i = 0; i < p->grad.numel(); ++i) g[i] *= scale;
    }
  }
}

}  // namespace pipetrain
