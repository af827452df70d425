#include "kernels/cpu/low_rank.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/target_clones.h"

namespace pipetrain {
namespace {

// Columns of one row summed at a time: the accumulators stay in L1 and
// each output element is written once.
constexpr int64_t kColumnBlock = 512;

PT_TARGET_CLONES
void RowsTimesFactor(const float* p, const float* qt, int64_t rows, int64_t cols, int r,
                     float* out) {
  float acc[kColumnBlock];
  for (int64_t i = 0; i < rows; ++i) {
    const float* pi = p + i * r;
    for (int64_t j0 = 0; j0 < cols; j0 += kColumnBlock) {
      const int64_t n = std::min(kColumnBlock, cols - j0);
      for (int64_t j = 0; j < n; ++j) acc[j] = 0.0f;
      for (int k = 0; k < r; ++k) {
        const float pk = pi[k];
        const float* row = qt + k * cols + j0;
        for (int64_t j = 0; j < n; ++j) acc[j] += pk * row[j];
      }
      std::memcpy(out + i * cols + j0, acc, static_cast<size_t>(n) * sizeof(float));
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
