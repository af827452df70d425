#include "kernels/cpu/low_rank.h"

#include <cstddef>
#include <vector>

#include "kernels/cpu/target_clones.h"

namespace pipetrain {
namespace {

// Columns summed at a time: one vector register's worth on AVX-512 (two on
// AVX2), kept in registers across the k loop; each output element is
// written once.
constexpr int64_t kColumns = 16;

PT_TARGET_CLONES
void RowsTimesFactor(const float* p, const float* qt, int64_t rows, int64_t cols, int r,
                     float* out) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* pi = p + i * r;
    float* oi = out + i * cols;
    int64_t j0 = 0;
    for (; j0 + kColumns <= cols; j0 += kColumns) {
      float acc[kColumns] = {};
      for (int k = 0; k < r; ++k) {
        const float pk = pi[k];
        const float* row = qt + k * cols + j0;
        for (int64_t j = 0; j < kColumns; ++j) acc[j] += pk * row[j];
      }
      for (int64_t j = 0; j < kColumns; ++j) oi[j0 + j] = acc[j];
    }
    for (int64_t j = j0; j < cols; ++j) {  // the last columns, one at a time
      float acc = 0.0f;
      for (int k = 0; k < r; ++k) acc += pi[k] * qt[k * cols + j];
      oi[j] = acc;
    }
  }
}

}  // namespace

void LowRankProduct(const float* p, const float* q, int64_t rows, int64_t cols, int r, float* out) {
  if (rows <= 0 || cols <= 0) return;
  // Q^T [r, cols], so that the inner loop runs over contiguous columns.
  std::vector<float> qt(static_cast<size_t>(r) * static_cast<size_t>(cols));
  for (int64_t j = 0; j < cols; ++j) {
    for (int k = 0; k < r; ++k) qt[static_cast<size_t>(k) * cols + j] = q[j * r + k];
  }
  RowsTimesFactor(p, qt.data(), rows, cols, r, out);
}

}  // namespace pipetrain
