// Small element-wise helpers (residual connections, gradient sums, the
// compression residual of error feedback).
#ifndef PIPETRAIN_KERNELS_CPU_ELEMENTWISE_H_
#define PIPETRAIN_KERNELS_CPU_ELEMENTWISE_H_

#include <cstdint>

namespace pipetrain {

// out[i] = a[i] + b[i]; out may alias a or b. (Residual forward; its backward
// passes dy unchanged to both inputs.)
void Add(const float* a, const float* b, int64_t n, float* out);
// acc[i] += x[i].
void AddInPlace(float* acc, const float* x, int64_t n);
// out[i] = a[i] - b[i]; out may alias a or b. (Error feedback's residual:
// what was meant minus what the codec delivered, kernels/compress/
// error_feedback.h.)
void Subtract(const float* a, const float* b, int64_t n, float* out);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CPU_ELEMENTWISE_H_
