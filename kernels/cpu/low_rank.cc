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

// out[i * r + k] = row i of m . row k of qt, in the header's lane order.
PT_TARGET_CLONES
void RowsDotFactor(const float* m, const float* qt, int64_t rows, int64_t cols, int r, float* out) {
  const int64_t whole = cols - cols % kLowRankLanes;
  for (int64_t i = 0; i < rows; ++i) {
    const float* mi = m + i * cols;
    for (int k = 0; k < r; ++k) {
      const float* qk = qt + static_cast<int64_t>(k) * cols;
      float lanes[kLowRankLanes] = {};
      for (int64_t j0 = 0; j0 < whole; j0 += kLowRankLanes) {
        for (int64_t l = 0; l < kLowRankLanes; ++l) lanes[l] += mi[j0 + l] * qk[j0 + l];
      }
      float acc = 0.0f;
      for (int64_t l = 0; l < kLowRankLanes; ++l) acc += lanes[l];
      for (int64_t j = whole; j < cols; ++j) acc += mi[j] * qk[j];
      out[i * r + k] = acc;
    }
  }
}

// outt[k * cols + j] += p[i * r + k] * m[i * cols + j], i in order: each
// element's sum runs over i alone, so vectorising over j keeps its order.
PT_TARGET_CLONES
void AccumulateRowsTimesFactor(const float* m, const float* p, int64_t rows, int64_t cols, int r,
                               float* outt) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* mi = m + i * cols;
    for (int k = 0; k < r; ++k) {
      const float pk = p[i * r + k];
      float* ok = outt + static_cast<int64_t>(k) * cols;
      for (int64_t j = 0; j < cols; ++j) ok[j] += pk * mi[j];
    }
  }
}

// [rows, cols] -> [cols, rows].
std::vector<float> Transposed(const float* a, int64_t rows, int64_t cols) {
  std::vector<float> t(static_cast<size_t>(rows) * static_cast<size_t>(cols));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) t[static_cast<size_t>(j * rows + i)] = a[i * cols + j];
  }
  return t;
}

}  // namespace

void MatrixTimesFactor(const float* m, const float* q, int64_t rows, int64_t cols, int r,
                       float* out) {
  if (rows <= 0) return;
  const std::vector<float> qt = Transposed(q, cols, r);  // [r, cols]
  RowsDotFactor(m, qt.data(), rows, cols, r, out);
}

void MatrixTransposeTimesFactor(const float* m, const float* p, int64_t rows, int64_t cols, int r,
                                float* out) {
  if (cols <= 0) return;
  std::vector<float> outt(static_cast<size_t>(r) * static_cast<size_t>(cols), 0.0f);  // [r, cols]
  AccumulateRowsTimesFactor(m, p, rows, cols, r, outt.data());
  for (int64_t j = 0; j < cols; ++j) {
    for (int k = 0; k < r; ++k) out[j * r + k] = outt[static_cast<size_t>(k) * cols + j];
  }
}

void LowRankProduct(const float* p, const float* q, int64_t rows, int64_t cols, int r, float* out) {
  if (rows <= 0 || cols <= 0) return;
  // Q^T [r, cols], so that the inner loop runs over contiguous columns.
  const std::vector<float> qt = Transposed(q, cols, r);
  RowsTimesFactor(p, qt.data(), rows, cols, r, out);
}

}  // namespace pipetrain
