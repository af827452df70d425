// Helpers shared by the cube tests: seeded inputs, cutting a full matrix
// into every rank's block, and an element-wise comparison against a
// per-element bound that prints the first mismatches.
#ifndef PIPETRAIN_WORKER_CUBE_CUBE_TEST_UTIL_H_
#define PIPETRAIN_WORKER_CUBE_CUBE_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "worker/cube/cube_layout.h"
#include "worker/cube/cube_testing.h"

namespace pipetrain {
namespace cube_test {

// The unit roundoff of fp32.
constexpr double kUnitRoundoff = 1.0 / (1 << 24);

// Algorithm 1's direction as printed: input y, weight x, output z.
inline const CubeDirection kPaper{CubeAxis::kY, CubeAxis::kX, CubeAxis::kZ};

// An in-process cube of side p (EXPECTs it is created).
inline std::unique_ptr<InProcessCubeFabric> Fabric(int p) {
  auto fabric = InProcessCubeFabric::Create(p);
  EXPECT_TRUE(fabric.ok()) << fabric.status();
  return std::move(fabric).value();
}

// Every rank's status OK, the failing rank named.
inline void ExpectAllOk(const std::vector<absl::Status>& status) {
  for (size_t r = 0; r < status.size(); ++r) EXPECT_TRUE(status[r].ok()) << r << ": " << status[r];
}

// n values uniform in [offset - 1, offset + 1) from `seed`.
inline std::vector<float> Random(int64_t n, uint32_t seed, float offset = 0.0f) {
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> out(static_cast<size_t>(n));
  for (float& v : out) v = value(random) + offset;
  return out;
}

// Every rank's block of `full`, indexed by rank.
inline std::vector<std::vector<float>> ScatterAll(CubeOperand operand,
                                                  const std::vector<float>& full, int64_t rows,
                                                  int64_t cols, int p,
                                                  const CubeDirection& direction) {
  std::vector<std::vector<float>> blocks;
  for (int r = 0; r < p * p * p; ++r) {
    auto block = ScatterCubeBlock(operand, full, rows, cols, p, CubeCoordOf(r, p), direction);
    EXPECT_TRUE(block.ok()) << block.status();
    blocks.push_back(block.ok() ? *block : std::vector<float>());
  }
  return blocks;
}

inline std::vector<float> GatherAll(CubeOperand operand,
                                    const std::vector<std::vector<float>>& blocks, int64_t rows,
                                    int64_t cols, int p, const CubeDirection& direction) {
  auto full = GatherCubeBlocks(operand, blocks, rows, cols, p, direction);
  EXPECT_TRUE(full.ok()) << full.status();
  return full.ok() ? *full : std::vector<float>();
}

// C[m, n] = sum_k |op(A)[m, k]| |op(B)[k, n]| in double, row-major; the
// magnitude that bounds a reordered float sum's rounding.
inline std::vector<double> AbsGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                   const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t t = 0; t < k; ++t) {
        const double av = trans_a ? a[t * m + i] : a[i * k + t];
        const double bv = trans_b ? b[j * k + t] : b[t * n + j];
        s += std::fabs(av) * std::fabs(bv);
      }
      c[i * n + j] = s;
    }
  }
  return c;
}

inline std::vector<double> Abs(const std::vector<float>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = std::fabs(v[i]);
  return out;
}

// Expects |got - want| <= bound[i] for every element (sizes equal); prints
// the first five mismatches. Returns the largest |got - want| / max|want|.
inline double ExpectWithin(const std::string& what, const std::vector<float>& got,
                           const std::vector<float>& want, const std::vector<double>& bound) {
  EXPECT_EQ(got.size(), want.size()) << what;
  if (got.size() != want.size() || bound.size() != want.size()) return INFINITY;
  double max_want = 0, max_diff = 0;
  int shown = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double diff = std::fabs(double(got[i]) - double(want[i]));
    max_want = std::max(max_want, std::fabs(double(want[i])));
    max_diff = std::max(max_diff, diff);
    if (!(diff <= bound[i]) && shown++ < 5) {
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", unsplit " << want[i]
                    << ", |diff| " << diff << " > bound " << bound[i];
    }
  }
  return max_want > 0 ? max_diff / max_want : max_diff;
}

}  // namespace cube_test
}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_CUBE_CUBE_TEST_UTIL_H_
