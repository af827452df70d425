#include "kernels/cpu/low_rank.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/philox.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

std::vector<float> Normal(int64_t n, uint64_t seed) {
  std::vector<float> x(static_cast<size_t>(n));
  FillNormal(seed, /*stream=*/0, 0.0f, 1.0f, x.data(), n);
  return x;
}

// The contract's order, one element at a time and kept scalar: what every
// clone of LowRankProduct must reproduce bit for bit (built with the
// kernels' -ffp-contract=off, as the kernel is).
void ScalarProduct(const float* p, const float* q, int64_t rows, int64_t cols, int r, float* out) {
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      float acc = 0.0f;
      for (int k = 0; k < r; ++k) {
        acc += p[i * r + k] * q[j * r + k];
        asm volatile("" ::: "memory");  // Keeps this loop scalar.
      }
      out[i * cols + j] = acc;
    }
  }
}

// Bitwise the scalar order (so the same on every CPU whichever clone it
// runs), and within float rounding of the product in double; shapes with
// ragged column blocks (512) and odd ranks.
TEST(LowRankProductTest, BitwiseTheFixedOrderAndCloseToDouble) {
  struct Case {
    int64_t rows, cols;
    int r;
  };
  for (const Case& c :
       {Case{1, 1, 1}, Case{3, 7, 2}, Case{17, 513, 5}, Case{64, 1100, 8}, Case{768, 40, 32}}) {
    const std::vector<float> p = Normal(c.rows * c.r, 1 + c.cols);
    const std::vector<float> q = Normal(c.cols * c.r, 2 + c.rows);
    std::vector<float> got(static_cast<size_t>(c.rows * c.cols), NAN);
    std::vector<float> want(got.size());
    LowRankProduct(p.data(), q.data(), c.rows, c.cols, c.r, got.data());
    ScalarProduct(p.data(), q.data(), c.rows, c.cols, c.r, want.data());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << c.rows << " x " << c.cols << " rank " << c.r;
    double worst = 0;
    for (int64_t i = 0; i < c.rows; ++i) {
      for (int64_t j = 0; j < c.cols; ++j) {
        double exact = 0, magnitude = 0;
        for (int k = 0; k < c.r; ++k) {
          const double term = double{p[i * c.r + k]} * q[j * c.r + k];
          exact += term;
          magnitude += std::fabs(term);
        }
        worst = std::max(worst, std::fabs(got[i * c.cols + j] - exact) / magnitude);
      }
    }
    // A sum of r products in float: at most about r ulps of the terms' size.
    EXPECT_LE(worst, c.r * 1.2e-7) << c.rows << " x " << c.cols << " rank " << c.r;
  }
}

TEST(LowRankProductTest, EmptyShapesWriteNothing) {
  const float p[2] = {1, 2}, q[2] = {3, 4};
  float out[1] = {-1};
  LowRankProduct(p, q, 0, 2, 1, out);
  LowRankProduct(p, q, 2, 0, 1, out);
  EXPECT_EQ(out[0], -1);
}

}  // namespace
}  // namespace pipetrain
