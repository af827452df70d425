#include "kernels/cuda/adamw.h"

#include <algorithm>
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
  float correction1;  // 1 - beta1^step
  float correction2;  // 1 - beta2^step
};

// Up to kAdamWTensorsPerLaunch tensors, passed by value in the kernel's
// arguments (no table to upload).
struct AdamWBatch {
  float* param[kAdamWTensorsPerLaunch];
  const float* grad[kAdamWTensorsPerLaunch];
  float* m[kAdamWTensorsPerLaunch];
  float* v[kAdamWTensorsPerLaunch];
  int64_t n[kAdamWTensorsPerLaunch];
  float decay[kAdamWTensorsPerLaunch];  // 1 - lr * weight_decay, or 1 without decay
};
static_assert(sizeof(AdamWBatch) + 64 <= 4096, "kernel arguments are capped at 4 KiB");

// Grid (blocks per tensor, tensors): block row y updates tensor y, grid
// stride. The CPU loop body, term for term and in the same order. sqrtf and
// '/' are IEEE-rounded (nvcc's defaults without -use_fast_math), and it is
// built with -fmad=false (kernels/cuda/BUILD) so that nvcc does not
// contract multiply-adds into FMAs, which the CPU reference never does (it
// is built with -ffp-contract=off; see adamw_test.cc, whose tolerance
// predates the flag: bitwise equality is not yet shown on a GPU).
__global__ void AdamWKernel(AdamWBatch batch, AdamWScalars s) {
  const int t = blockIdx.y;
  float* param = batch.param[t];
  const float* grad = batch.grad[t];
  float* m = batch.m[t];
  float* v = batch.v[t];
  const int64_t n = batch.n[t];
  const float decay = batch.decay[t];
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
    param[i] = param[i] * decay - s.lr * mhat / (sqrtf(vhat) + s.eps);
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

AdamWScalars MakeScalars(int64_t step, const AdamWConfig& config) {
  AdamWScalars s;
  s.lr = config.lr;
  s.beta1 = config.beta1;
  s.beta2 = config.beta2;
  s.eps = config.eps;
  // In double, as on the CPU: beta^t for large t loses digits in float.
  s.correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(config.beta1), step));
  s.correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(config.beta2), step));
  return s;
}

}  // namespace

absl::Status AdamWUpdateCuda(float* param, const float* grad, float* m, float* v, int64_t n,
                             int64_t step, const AdamWConfig& config, bool apply_decay,
                             cudaStream_t stream) {
  const AdamWTensor one{param, grad, m, v, n, apply_decay};
  return AdamWUpdateAllCuda(&one, 1, step, config, stream);
}

absl::Status AdamWUpdateAllCuda(const AdamWTensor* tensors, int count, int64_t step,
                                const AdamWConfig& config, cudaStream_t stream) {
  for (int i = 0; i < count; ++i) {
    absl::Status valid = CheckArguments(tensors[i].n, step, config);
    if (!valid.ok()) {
      return count == 1 ? valid
                        : absl::InvalidArgumentError(
                              absl::StrCat("tensor ", i, " of ", count, ": ", valid.message()));
    }
  }
  const AdamWScalars s = MakeScalars(step, config);
  const float decay = 1.0f - config.lr * config.weight_decay;
  for (int first = 0; first < count; first += kAdamWTensorsPerLaunch) {
    AdamWBatch batch{};
    int in_batch = 0;
    int64_t largest = 0;
    for (int i = first; i < count && i < first + kAdamWTensorsPerLaunch; ++i) {
      const AdamWTensor& t = tensors[i];
      if (t.n == 0) continue;
      batch.param[in_batch] = t.param;
      batch.grad[in_batch] = t.grad;
      batch.m[in_batch] = t.m;
      batch.v[in_batch] = t.v;
      batch.n[in_batch] = t.n;
      batch.decay[in_batch] = t.apply_decay ? decay : 1.0f;
      largest = std::max(largest, t.n);
      ++in_batch;
    }
    if (in_batch == 0) continue;
    AdamWKernel<<<dim3(ElementwiseBlocks(largest), in_batch), kElementwiseThreads, 0, stream>>>(
        batch, s);
    CUDA_CHECK_LAUNCH("AdamWKernel");
  }
  return absl::OkStatus();
}

}  // namespace pipetrain
