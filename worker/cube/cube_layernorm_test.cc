// The 3-D LayerNorm on an in-process cube against the unsplit
// kernels/cpu LayerNormForward / LayerNormBackward.
//
// Tolerance: the cube reorders the row sums over H (and, for dgamma and
// dbeta, the sums over M rows); a float sum of n terms in any order is
// within n u sum |terms| of the exact one (u = 2^-24), so the two
// implementations' mean differs by at most 2 H u mean|x|, their rstd
// relatively by about 2 H u (the variance's centred sum, whose first-order
// dependence on the mean vanishes), and y = (x - mean) rstd g + b by
//   2 H u (|g| (rstd mean|x| + |xhat|) + |b|)
// up to a few ulps of the final products; we allow 4 H u (...) + 4 u |y|.
// dx adds its own two H-term sums and carries xhat's error:
//   4 H u rstd (|dy g| + mean|dy g| + (|xhat| + rstd mean|x|) mean|dy g xhat|)
//   + 4 u |dx|;
// dgamma and dbeta sum M rows: 4 (M + H) u sum |dy| (|xhat| + rstd mean|x|)
// and 2 M u sum |dy|, each + 4 u of the result.
#include "worker/cube/cube_layernorm.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/layernorm.h"
#include "worker/cube/cube_test_util.h"
#include "worker/cube/cube_testing.h"

namespace pipetrain {
namespace {

using cube_test::ExpectWithin;
using cube_test::Fabric;
using cube_test::GatherAll;
using cube_test::kPaper;
using cube_test::kUnitRoundoff;
using cube_test::Random;
using cube_test::ScatterAll;

class CubeLayerNormTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(CubeLayerNormTest, ForwardBackward_GatheredEqualUnsplitWithinRounding) {
  const auto [p, swapped] = GetParam();
  const CubeDirection d = swapped ? kPaper.Swapped() : kPaper;
  const int64_t M = 3 * p * p, H = 2 * p * p;
  const int n = p * p * p;
  // A mean of 3 exercises the centring; gamma near 1.
  const std::vector<float> x = Random(M * H, 5, 3.0f), dy = Random(M * H, 6);
  const std::vector<float> gamma = Random(H, 7, 1.0f), beta = Random(H, 8);
  const std::vector<float> dgamma0 = Random(H, 9), dbeta0 = Random(H, 10);

  std::vector<float> y_ref(M * H), mean_ref(M), rstd_ref(M), dx_ref(M * H);
  std::vector<float> dgamma_ref = dgamma0, dbeta_ref = dbeta0;
  LayerNormForward(x.data(), gamma.data(), beta.data(), M, H, kLayerNormEps, y_ref.data(),
                   mean_ref.data(), rstd_ref.data());
  LayerNormBackward(x.data(), gamma.data(), mean_ref.data(), rstd_ref.data(), dy.data(), M, H,
                    dx_ref.data(), dgamma_ref.data(), dbeta_ref.data());

  auto xs = ScatterAll(CubeOperand::kActivation, x, M, H, p, d);
  auto dys = ScatterAll(CubeOperand::kActivation, dy, M, H, p, d);
  auto gs = ScatterAll(CubeOperand::kVector, gamma, 1, H, p, d);
  auto bs = ScatterAll(CubeOperand::kVector, beta, 1, H, p, d);
  auto dgs = ScatterAll(CubeOperand::kVector, dgamma0, 1, H, p, d);
  auto dbs = ScatterAll(CubeOperand::kVector, dbeta0, 1, H, p, d);
  std::vector<std::vector<float>> ys(n), dxs(n), means(n), rstds(n);
  const CubeLayerNormDims dims{M, H};
  auto fabric = Fabric(p);
  const auto status = fabric->Run([&](InProcessCubeComm& comm) -> absl::Status {
    const int r = CubeRankIndex(comm.coord(), p);
    ys[r].resize(xs[r].size());
    dxs[r].resize(xs[r].size());
    means[r].resize(M / (p * p));
    rstds[r].resize(M / (p * p));
    absl::Status st =
        CubeLayerNormForward(comm, d, dims, xs[r], gs[r], bs[r], absl::MakeSpan(ys[r]),
                             absl::MakeSpan(means[r]), absl::MakeSpan(rstds[r]));
    if (!st.ok()) return st;
    return CubeLayerNormBackward(comm, d, dims, xs[r], gs[r], means[r], rstds[r], dys[r],
                                 absl::MakeSpan(dxs[r]), absl::MakeSpan(dgs[r]),
                                 absl::MakeSpan(dbs[r]));
  });
  for (int r = 0; r < n; ++r) ASSERT_TRUE(status[r].ok()) << r << ": " << status[r];

  // The members of an output-axis group hold the same rows: bitwise the
  // same statistics.
  for (int r = 0; r < n; ++r) {
    CubeCoord first = CubeCoordOf(r, p);
    first[d.output] = 0;
    const int f = CubeRankIndex(first, p);
    EXPECT_EQ(0, std::memcmp(means[r].data(), means[f].data(), means[r].size() * 4)) << r;
    EXPECT_EQ(0, std::memcmp(rstds[r].data(), rstds[f].data(), rstds[r].size() * 4)) << r;
  }

  const double u = kUnitRoundoff;
  std::vector<double> mean_abs(M, 0.0), dyg_mean(M, 0.0), dygx_mean(M, 0.0);
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t k = 0; k < H; ++k) {
      const double xhat = (x[i * H + k] - mean_ref[i]) * rstd_ref[i];
      const double dyg = std::fabs(dy[i * H + k] * gamma[k]);
      mean_abs[i] += std::fabs(x[i * H + k]) / H;
      dyg_mean[i] += dyg / H;
      dygx_mean[i] += dyg * std::fabs(xhat) / H;
    }
  }
  std::vector<double> y_bound(M * H), dx_bound(M * H), dg_bound(H), db_bound(H);
  for (int64_t k = 0; k < H; ++k) {
    dg_bound[k] = 4 * u * std::fabs(dgamma_ref[k]);
    db_bound[k] = 4 * u * std::fabs(dbeta_ref[k]);
  }
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t k = 0; k < H; ++k) {
      const int64_t e = i * H + k;
      const double r = rstd_ref[i];
      const double xhat_err = std::fabs((x[e] - mean_ref[i]) * r) + r * mean_abs[i];
      y_bound[e] = 4 * H * u * (std::fabs(gamma[k]) * xhat_err + std::fabs(beta[k])) +
                   4 * u * std::fabs(y_ref[e]);
      dx_bound[e] =
          4 * H * u * r * (std::fabs(dy[e] * gamma[k]) + dyg_mean[i] + xhat_err * dygx_mean[i]) +
          4 * u * std::fabs(dx_ref[e]);
      dg_bound[k] += 4 * (M + H) * u * std::fabs(dy[e]) * xhat_err;
      db_bound[k] += 2 * M * u * std::fabs(dy[e]);
    }
  }
  const double ey =
      ExpectWithin("y", GatherAll(CubeOperand::kActivation, ys, M, H, p, d), y_ref, y_bound);
  const double edx =
      ExpectWithin("dx", GatherAll(CubeOperand::kActivation, dxs, M, H, p, d), dx_ref, dx_bound);
  const double edg = ExpectWithin("dgamma", GatherAll(CubeOperand::kVector, dgs, 1, H, p, d),
                                  dgamma_ref, dg_bound);
  const double edb =
      ExpectWithin("dbeta", GatherAll(CubeOperand::kVector, dbs, 1, H, p, d), dbeta_ref, db_bound);
  std::printf(
      "p=%d %s: max |cube - unsplit| / max|unsplit|: y %.2e dx %.2e dgamma %.2e "
      "dbeta %.2e\n",
      p, d.ToString().c_str(), ey, edx, edg, edb);
}

INSTANTIATE_TEST_SUITE_P(PAndDirection, CubeLayerNormTest,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Bool()));

// Forward sends two vector gathers (cube_vector.h: (p - 1) H / p^2 each,
// doubled on the diagonal roots) and two all-reduces of M / p^2 row values
// along the output axis (2 (p - 1) M / p^3 floats each when p divides M / p^2).
TEST(CubeLayerNormTest, ForwardSentBytes_MatchTheCount) {
  const int p = 2;
  const int64_t M = p * p * p, H = p * p, p3 = p * p * p;
  const CubeDirection d = kPaper;
  auto xs = ScatterAll(CubeOperand::kActivation, Random(M * H, 1), M, H, p, d);
  auto gs = ScatterAll(CubeOperand::kVector, Random(H, 2), 1, H, p, d);
  auto fabric = Fabric(p);
  const auto status = fabric->Run([&](InProcessCubeComm& comm) -> absl::Status {
    const CubeCoord c = comm.coord();
    const int r = CubeRankIndex(c, p);
    std::vector<float> y(xs[r].size()), mean(M / (p * p)), rstd(M / (p * p));
    absl::Status st = CubeLayerNormForward(comm, d, {M, H}, xs[r], gs[r], gs[r], absl::MakeSpan(y),
                                           absl::MakeSpan(mean), absl::MakeSpan(rstd));
    const bool diagonal = c[d.input] == c[d.output];
    EXPECT_EQ(comm.sent_bytes(),
              4 * (2 * (p - 1) * H / (p * p) * (diagonal ? 2 : 1) + 2 * 2 * (p - 1) * M / p3))
        << r;
    return st;
  });
  for (const absl::Status& s : status) EXPECT_TRUE(s.ok()) << s;
}

TEST(CubeLayerNormTest, NotDivisible_InvalidArgumentNamingTheDimension) {
  auto fabric = Fabric(2);
  CubeComm& comm = fabric->comm(0);
  absl::Status s = CubeLayerNormForward(comm, kPaper, {8, 6}, {}, {}, {}, {}, {}, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("hidden (H) = 6"), std::string::npos) << s;
  s = CubeLayerNormBackward(comm, kPaper, {6, 8}, {}, {}, {}, {}, {}, {}, {}, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("rows (M) = 6"), std::string::npos) << s;
  std::vector<float> x(2 * 4);
  s = CubeLayerNormForward(comm, kPaper, {8, 8}, x, {}, {}, {}, {}, {});
  EXPECT_NE(s.message().find("gamma has 0 values, its layout 2"), std::string::npos) << s;
}

}  // namespace
}  // namespace pipetrain
