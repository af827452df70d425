#include "kernels/cpu/linear.h"

#include "kernels/cpu/blas.h"

namespace pipetrain {

void LinearForward(const float* x, const float* w, const float* b, int n, int in, int out,
                   float* y) {
  float beta = 0.0f;
  if (b != nullptr) {
    // Seed y with the bias rows so the GEMM adds onto it (beta = 1).
    for (int i = 0; i < n; ++i) {
      float* row = y + static_cast<int64_t>(i) * out;
      for (int j = 0; j < out; ++j) row[j] = b[j];
    }
    beta = 1.0f;
  }
  Sgemm(false, false, n, out, in, 1.0f, x, in, w, out, beta, y, out);
}

void LinearBackward(const float* x, const float* w, const float* dy, int n, int in, int out,
                    float* dx, float* dw, float* db) {
  if (dx != nullptr) Sgemm(false, true, n, in, out, 1.0f, dy, out, w, out, 0.0f, dx, in);
  Sgemm(true, false, in, out, n, 1.0f, x, in, dy, out, 1.0f, dw, out);
  if (db != nullptr) {
    for (int i = 0; i < n; ++i) {
      const float* row = dy + static_cast<int64_t>(i) * out;
      for (int j = 0; j < out; ++j) db[j] += row[j];
    }
  }
}

}  // namespace pipetrain
