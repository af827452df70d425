// AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization"),
// with bias correction, in PyTorch's formulation:
//   p <- p * (1 - lr * weight_decay)                  (decoupled decay)
//   m <- beta1 m + (1 - beta1) g,   v <- beta2 v + (1 - beta2) g^2
//   p <- p - lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
// `step` is the 1-based count of updates including this one. Which tensors
// get weight decay is the caller's choice (apply_decay).
#ifndef PIPETRAIN_KERNELS_CPU_ADAMW_H_
#define PIPETRAIN_KERNELS_CPU_ADAMW_H_

#include <cstdint>

namespace pipetrain {

struct AdamWConfig {
  float lr = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
};

void AdamWUpdate(float* param, const float* grad, float* m, float* v, int64_t n, int64_t step,
                 const AdamWConfig& config, bool apply_decay);

// One tensor of a step over many (Backend::AdamWUpdateAll): AdamWUpdate's
// arguments, n floats each.
struct AdamWTensor {
  float* param;
  const float* grad;
  float* m;
  float* v;
  int64_t n;
  bool apply_decay;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CPU_ADAMW_H_
