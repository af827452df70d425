// GELU, tanh approximation (as in GPT-2):
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// Backward writes dx = dy * gelu'(x) (it needs the forward input x).
#ifndef PIPETRAIN_KERNELS_CPU_GELU_H_
#define PIPETRAIN_KERNELS_CPU_GELU_H_

#include <cstdint>

namespace pipetrain {

void GeluForward(const float* x, int64_t n, float* y);
void GeluBackward(const float* x, const float* dy, int64_t n, float* dx);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CPU_GELU_H_
