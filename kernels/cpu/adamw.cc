#include "kernels/cpu/adamw.h"

#include <cmath>

#include "common/logging.h"
#include "kernels/cpu/target_clones.h"

namespace pipetrain {

PT_TARGET_CLONES
void AdamWUpdate(float* param, const float* grad, float* m, float* v, int64_t n, int64_t step,
                 const AdamWConfig& config, bool apply_decay) {
  PT_CHECK(step >= 1) << "AdamW step is 1-based, got " << step;
  // Bias corrections in double: beta^t for large t loses digits in float.
  const float correction1 =
      static_cast<float>(1.0 - std::pow(static_cast<double>(config.beta1), step));
  const float correction2 =
      static_cast<float>(1.0 - std::pow(static_cast<double>(config.beta2), step));
  const float decay = apply_decay ? 1.0f - config.lr * config.weight_decay : 1.0f;
  const float b1 = config.beta1, b2 = config.beta2;
  for (int64_t i = 0; i < n; ++i) {
    float g = grad[i];
    float mi = b1 * m[i] + (1.0f - b1) * g;
    float vi = b2 * v[i] + (1.0f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / correction1;
    float vhat = vi / correction2;
    param[i] = param[i] * decay - config.lr * mhat / (std::sqrt(vhat) + config.eps);
  }
}

}  // namespace pipetrain
