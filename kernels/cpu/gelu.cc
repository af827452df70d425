#include "kernels/cpu/gelu.h"

#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/target_clones.h"

namespace pipetrain {
namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
}  // namespace

PT_TARGET_CLONES
void GeluForward(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    float t = FastTanh(kSqrt2OverPi * (v + kCubic * v * v * v));
    y[i] = 0.5f * v * (1.0f + t);
  }
}

PT_TARGET_CLONES
void GeluBackward(const float* x, const float* dy, int64_t n, float* dx) {
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    float u = kSqrt2OverPi * (v + kCubic * v * v * v);
    float t = FastTanh(u);
    float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * v * v);
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
}

}  // namespace pipetrain
