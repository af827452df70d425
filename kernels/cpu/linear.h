// Linear layer in GPT-2's Conv1D layout: y = x W + b, W stored [in, out].
//
// Keeping Hugging Face's (in, out) layout means checkpoints load without a
// transpose. Shapes: x [n, in], w [in, out], b [out] (may be null), y [n, out].
// Backward writes dx (when non-null) and ACCUMULATES dw and db, so gradient
// accumulation over micro-batches is a sum of calls.
#ifndef PIPETRAIN_KERNELS_CPU_LINEAR_H_
#define PIPETRAIN_KERNELS_CPU_LINEAR_H_

#include <cstdint>

namespace pipetrain {

void LinearForward(const float* x, const float* w, const float* b, int n, int in, int out,
                   float* y);

void LinearBackward(const float* x, const float* w, const float* dy, int n, int in, int out,
                    float* dx, float* dw, float* db);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CPU_LINEAR_H_
