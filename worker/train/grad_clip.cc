#include "worker/train/grad_clip.h"

#include <cmath>

namespace pipetrain {

double ParameterSquares(Backend* backend, const Parameter& p) {
  return backend->SumsOfSquares({&p.grad}).at(0);
}

std::vector<double> ParametersSquares(Backend* backend,
                                      const std::vector<const Parameter*>& params) {
  std::vector<const Tensor*> grads;
  grads.reserve(params.size());
  for (const Parameter* p : params) grads.push_back(&p->grad);
  return backend->SumsOfSquares(grads);
}

float ClipScale(double total_squares, float max_norm) {
  if (!(max_norm > 0)) return 1.0f;
  const double coef = double(max_norm) / (std::sqrt(total_squares) + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

void ScaleGradients(Backend* backend, const std::vector<Parameter*>& params, float scale) {
  if (scale == 1.0f) return;
  std::vector<Tensor*> grads;
  grads.reserve(params.size());
  for (Parameter* p : params) grads.push_back(&p->grad);
  backend->ScaleInPlace(grads, scale);
}

float ClipGradientsByGlobalNorm(Backend* backend, const std::vector<Parameter*>& params,
                                float max_norm) {
  if (!(max_norm > 0)) return 1.0f;
  double total = 0;
  for (double squares : ParametersSquares(backend, {params.begin(), params.end()}))
    total += squares;
  const float scale = ClipScale(total, max_norm);
  ScaleGradients(backend, params, scale);
  return scale;
}

}  // namespace pipetrain
