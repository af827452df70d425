#include "kernels/cpu/low_rank.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
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
        const double error = std::fabs(got[i * c.cols + j] - exact) / magnitude;
        // A NaN is infinitely far: std::max would drop it (it compares false).
        worst = std::max(worst, std::isfinite(error) ? error : INFINITY);
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

// The contract's order for MatrixTimesFactor, kept scalar: kLowRankLanes
// partial sums over whole groups of columns, added in lane order, then the
// ragged last columns in order.
void ScalarMatrixTimesFactor(const float* m, const float* q, int64_t rows, int64_t cols, int r,
                             float* out) {
  const int64_t whole = cols - cols % kLowRankLanes;
  for (int64_t i = 0; i < rows; ++i) {
    for (int k = 0; k < r; ++k) {
      float lanes[kLowRankLanes] = {};
      for (int64_t j = 0; j < whole; ++j) {
        lanes[j % kLowRankLanes] += m[i * cols + j] * q[j * r + k];
        asm volatile("" ::: "memory");
      }
      float acc = 0.0f;
      for (int64_t l = 0; l < kLowRankLanes; ++l) {
        acc += lanes[l];
        asm volatile("" ::: "memory");
      }
      for (int64_t j = whole; j < cols; ++j) {
        acc += m[i * cols + j] * q[j * r + k];
        asm volatile("" ::: "memory");
      }
      out[i * r + k] = acc;
    }
  }
}

// MatrixTransposeTimesFactor's order, kept scalar: i ascending.
void ScalarMatrixTransposeTimesFactor(const float* m, const float* p, int64_t rows, int64_t cols,
                                      int r, float* out) {
  for (int64_t j = 0; j < cols; ++j) {
    for (int k = 0; k < r; ++k) {
      float acc = 0.0f;
      for (int64_t i = 0; i < rows; ++i) {
        acc += m[i * cols + j] * p[i * r + k];
        asm volatile("" ::: "memory");
      }
      out[j * r + k] = acc;
    }
  }
}

// The worst relative error of float sums `got[e]` against the same sums in
// double, each element's sum of `count` terms term(e, t), scaled by the
// sum of the terms' magnitudes.
double WorstRelativeError(const std::vector<float>& got, int64_t count,
                          const std::function<double(int64_t e, int64_t t)>& term) {
  double worst = 0;
  for (size_t e = 0; e < got.size(); ++e) {
    double exact = 0, magnitude = 0;
    for (int64_t t = 0; t < count; ++t) {
      exact += term(static_cast<int64_t>(e), t);
      magnitude += std::fabs(term(static_cast<int64_t>(e), t));
    }
    const double error = std::fabs(got[e] - exact);
    // A NaN is infinitely far, whatever the magnitude: std::max would drop
    // it (it compares false).
    if (!std::isfinite(error)) return INFINITY;
    if (magnitude > 0) worst = std::max(worst, error / magnitude);
  }
  return worst;
}

// Both PowerSGD projections: bitwise their contract's order (the same on
// every CPU, whichever clone runs) and within float rounding of the double
// result, on shapes with ragged lane groups and odd ranks. A stage's
// tensor-parallel ranks encode with these and must send equal factors.
TEST(PowerSgdProjectionsTest, BitwiseTheFixedOrderAndCloseToDouble) {
  struct Case {
    int64_t rows, cols;
    int r;
  };
  for (const Case& c : {Case{1, 1, 1}, Case{3, 7, 2}, Case{17, 513, 5}, Case{64, 1100, 8},
                        Case{300, 16, 3}, Case{5, 48, 32}}) {
    const std::vector<float> m = Normal(c.rows * c.cols, 3 + c.cols);
    const std::vector<float> q = Normal(c.cols * c.r, 4 + c.rows);
    const std::vector<float> p = Normal(c.rows * c.r, 5 + c.rows);
    const std::string where =
        std::to_string(c.rows) + " x " + std::to_string(c.cols) + " rank " + std::to_string(c.r);

    std::vector<float> mq(static_cast<size_t>(c.rows * c.r), NAN), mq_want(mq.size());
    MatrixTimesFactor(m.data(), q.data(), c.rows, c.cols, c.r, mq.data());
    ScalarMatrixTimesFactor(m.data(), q.data(), c.rows, c.cols, c.r, mq_want.data());
    EXPECT_EQ(std::memcmp(mq.data(), mq_want.data(), mq.size() * sizeof(float)), 0) << where;

    std::vector<float> mtp(static_cast<size_t>(c.cols * c.r), NAN), mtp_want(mtp.size());
    MatrixTransposeTimesFactor(m.data(), p.data(), c.rows, c.cols, c.r, mtp.data());
    ScalarMatrixTransposeTimesFactor(m.data(), p.data(), c.rows, c.cols, c.r, mtp_want.data());
    EXPECT_EQ(std::memcmp(mtp.data(), mtp_want.data(), mtp.size() * sizeof(float)), 0) << where;

    // A float sum of n terms: within about n ulps of the terms' size.
    // MQ's element (i, k) sums over j; M^T P's element (j, k) over i.
    EXPECT_LE(WorstRelativeError(mq, c.cols,
                                 [&](int64_t e, int64_t j) {
                                   const int64_t i = e / c.r, k = e % c.r;
                                   return double{m[i * c.cols + j]} * q[j * c.r + k];
                                 }),
              c.cols * 1.2e-7)
        << where;
    EXPECT_LE(WorstRelativeError(mtp, c.rows,
                                 [&](int64_t e, int64_t i) {
                                   const int64_t j = e / c.r, k = e % c.r;
                                   return double{m[i * c.cols + j]} * p[i * c.r + k];
                                 }),
              c.rows * 1.2e-7)
        << where;
  }
}

TEST(PowerSgdProjectionsTest, AnEmptySideGivesZeros) {
  const float m[1] = {7}, q[2] = {1, 2};
  std::vector<float> out(2, NAN);
  MatrixTimesFactor(m, q, /*rows=*/2, /*cols=*/0, /*r=*/1, out.data());
  EXPECT_EQ(out, std::vector<float>({0, 0}));
  out.assign(2, NAN);
  MatrixTransposeTimesFactor(m, q, /*rows=*/0, /*cols=*/1, /*r=*/2, out.data());
  EXPECT_EQ(out, std::vector<float>({0, 0}));
}

}  // namespace
}  // namespace pipetrain
