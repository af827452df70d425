#include "kernels/cuda/adamw.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch.h"

namespace pipetrain {
namespace {

// The per-step scalars, prepared on the host exactly as kernels/cpu/adamw.cc
// prepares them, so both sides feed the same floats into the element loop.
struct AdamWScalars {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float decay;        // 1 - lr * weight_decay, or 1 without decay
  float correction1;  // 1 - beta1^step
  float correction2;  // 1 - beta2^step
};

// The CPU loop body, term for term and in the same order. sqrtf and '/' are
// IEEE-rounded (nvcc's defaults without -use_fast_math); nvcc may contract
// multiply-adds into FMAs, and so may GCC on the CPU side (see adamw_test.cc).
__global__ void AdamWKernel(float* param, const float* grad, float* m, float* v, int64_t n,
                            AdamWScalars s) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float g = grad[i];
    const float mi = s.beta1 * m[i] + (1.0f - s.beta1) * g;
    const float vi = s.beta2 * v[i] + (1.0f - s.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / s.correction1;
    const float vhat = vi / s.correction2;
    param[i] = param[i] * s.decay - s.lr * mhat / (sqrtf(vhat) + s.eps);
  }
}

absl::Status CheckArguments(int64_t n, int64_t step, const AdamWConfig& config) {
  absl::Status count = CheckElementCount("AdamWUpdateCuda", n);
  if (!count.ok()) return count;
  if (step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamWUpdateCuda: step is 1-based, got ", step));
  }
  const bool betas_ok =
      config.beta1 >= 0.0f && config.beta1 < 1.0f && config.beta2 >= 0.0f && config.beta2 < 1.0f;
  if (!betas_ok) {
    return absl::InvalidArgumentError(absl::StrCat("AdamWUpdateCuda: beta1 ", config.beta1,
                                                   " and beta2 ", config.beta2,
                                                   " must lie in [0, 1)"));
  }
  return absl::OkStatus();
}

AdamWScalars MakeScalars(int64_t step, const AdamWConfig& config, bool apply_decay) {
  AdamWScalars s;
  s.lr = config.lr;
  s.beta1 = config.beta1;
  s.beta2 = config.beta2;
  s.eps = config.eps;
  s.decay = apply_decay ? 1.0f - config.lr * config.weight_decay : 1.0f;
  // In double, as on the CPU: beta^t for large t loses digits in float.
  s.correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(config.beta1), step));
  s.correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(config.beta2), step));
  return s;
}

}  // namespace

absl::Status AdamWUpdateCuda(float* param, const float* grad, float* m, float* v, int64_t n,
                             int64_t step, const AdamWConfig& config, bool apply_decay,
                             cudaStream_t stream) {
  absl::Status valid = CheckArguments(n, step, config);
  if (!valid.ok() || n == 0) return valid;
  AdamWKernel<<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(
      param, grad, m, v, n, MakeScalars(step, config, apply_decay));
  CUDA_CHECK_LAUNCH("AdamWKernel");
  return absl::OkStatus();
}

}  // namespace pipetrain
