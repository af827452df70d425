// The 3-D linear layer (Algorithms 1-2, 7-8) on an in-process cube against
// the unsplit kernels/cpu LinearForward / LinearBackward.
//
// Tolerance: a float sum of n terms t_k, in any order, is within
// gamma_n sum |t_k| of the exact sum, gamma_n ~ n u (u = 2^-24, Higham,
// "Accuracy and Stability", §3.1); the cube only reorders each dot product
// (p partial GEMMs summed in coordinate order), so cube and unsplit differ
// by at most 2 n u sum |t_k| per element: n = N + 1 for Y (the bias is one
// more term), K for dX, M for dW and db. Through a chain the first layer's
// bound propagates: the second layer's magnitudes use |H| |W2| and its n
// adds the first layer's.
#include "worker/cube/cube_linear.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/linear.h"
#include "worker/cube/cube_test_util.h"
#include "worker/cube/cube_testing.h"

namespace pipetrain {
namespace {

using cube_test::Abs;
using cube_test::AbsGemm;
using cube_test::ExpectAllOk;
using cube_test::ExpectWithin;
using cube_test::Fabric;
using cube_test::GatherAll;
using cube_test::kPaper;
using cube_test::kUnitRoundoff;
using cube_test::Random;
using cube_test::ScatterAll;

CubeDirection DirectionOf(int index) {
  switch (index) {
    case 0:
      return kPaper;
    case 1:
      return kPaper.Swapped();
    default:
      return {CubeAxis::kX, CubeAxis::kZ, CubeAxis::kY};  // any permutation works
  }
}

std::vector<double> Scaled(std::vector<double> v, double by) {
  for (double& x : v) x *= by;
  return v;
}

// One linear layer's full tensors, unsplit.
struct Layer {
  CubeLinearDims dims;
  std::vector<float> w, b;
};

Layer MakeLayer(int64_t rows, int64_t in, int64_t out, uint32_t seed) {
  Layer layer;
  layer.dims = {rows, in, out, /*bias=*/true};
  layer.w = Random(in * out, seed);
  layer.b = Random(out, seed + 1);
  return layer;
}

// A layer's blocks on every rank (indexed by rank), for direction d.
struct LayerBlocks {
  std::vector<std::vector<float>> w, b, dw, db;
};

LayerBlocks ScatterLayer(const Layer& layer, const std::vector<float>& dw0,
                         const std::vector<float>& db0, int p, const CubeDirection& d) {
  const CubeLinearDims& m = layer.dims;
  LayerBlocks blocks;
  blocks.w = ScatterAll(CubeOperand::kWeight, layer.w, m.in, m.out, p, d);
  blocks.b = ScatterAll(CubeOperand::kVector, layer.b, 1, m.out, p, d.Swapped());
  blocks.dw = ScatterAll(CubeOperand::kWeight, dw0, m.in, m.out, p, d);
  blocks.db = ScatterAll(CubeOperand::kVector, db0, 1, m.out, p, d.Swapped());
  return blocks;
}

class CubeLinearTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(CubeLinearTest, ForwardBackward_GatheredEqualUnsplitWithinRounding) {
  const auto [p, direction_index] = GetParam();
  const CubeDirection d = DirectionOf(direction_index);
  const int64_t M = 4 * p * p, N = 5 * p, K = 3 * p * p;
  const Layer layer = MakeLayer(M, N, K, 11);
  const std::vector<float> x = Random(M * N, 21), dy = Random(M * K, 31);
  // dW and db start non-zero: both implementations accumulate.
  const std::vector<float> dw0 = Random(N * K, 41), db0 = Random(K, 51);

  std::vector<float> y_ref(M * K), dx_ref(M * N), dw_ref = dw0, db_ref = db0;
  LinearForward(x.data(), layer.w.data(), layer.b.data(), M, N, K, y_ref.data());
  LinearBackward(x.data(), layer.w.data(), dy.data(), M, N, K, dx_ref.data(), dw_ref.data(),
                 db_ref.data());

  const int n = p * p * p;
  auto xs = ScatterAll(CubeOperand::kActivation, x, M, N, p, d);
  auto dys = ScatterAll(CubeOperand::kActivation, dy, M, K, p, d.Swapped());
  LayerBlocks blocks = ScatterLayer(layer, dw0, db0, p, d);
  std::vector<std::vector<float>> ys(n), dxs(n);
  auto fabric = Fabric(p);
  ExpectAllOk(fabric->Run([&](InProcessCubeComm& comm) -> absl::Status {
    const int r = CubeRankIndex(comm.coord(), p);
    ys[r].resize(dys[r].size());
    dxs[r].resize(xs[r].size());
    absl::Status st = CubeLinearForward(comm, d, layer.dims, xs[r], blocks.w[r], blocks.b[r],
                                        absl::MakeSpan(ys[r]));
    if (!st.ok()) return st;
    return CubeLinearBackward(comm, d, layer.dims, xs[r], blocks.w[r], dys[r],
                              absl::MakeSpan(dxs[r]), absl::MakeSpan(blocks.dw[r]),
                              absl::MakeSpan(blocks.db[r]));
  }));

  const double u2 = 2 * kUnitRoundoff;
  // |X| |W| + |b|, the magnitude of Y's N + 1 terms.
  std::vector<double> y_mag = AbsGemm(false, false, M, K, N, Abs(x), Abs(layer.w));
  for (int64_t i = 0; i < M * K; ++i) y_mag[i] += std::fabs(layer.b[i % K]);
  std::vector<double> dw_mag = AbsGemm(true, false, N, K, M, Abs(x), Abs(dy));
  for (int64_t i = 0; i < N * K; ++i) dw_mag[i] += std::fabs(dw0[i]);
  std::vector<double> db_mag(K, 0.0);
  for (int64_t i = 0; i < M * K; ++i) db_mag[i % K] += std::fabs(dy[i]);
  for (int64_t k = 0; k < K; ++k) db_mag[k] += std::fabs(db0[k]);

  const double ey = ExpectWithin("Y", GatherAll(CubeOperand::kActivation, ys, M, K, p, d.Swapped()),
                                 y_ref, Scaled(y_mag, u2 * (N + 1)));
  const double edx =
      ExpectWithin("dX", GatherAll(CubeOperand::kActivation, dxs, M, N, p, d), dx_ref,
                   Scaled(AbsGemm(false, true, M, N, K, Abs(dy), Abs(layer.w)), u2 * K));
  const double edw = ExpectWithin("dW", GatherAll(CubeOperand::kWeight, blocks.dw, N, K, p, d),
                                  dw_ref, Scaled(dw_mag, u2 * (M + 1)));
  const double edb =
      ExpectWithin("db", GatherAll(CubeOperand::kVector, blocks.db, 1, K, p, d.Swapped()), db_ref,
                   Scaled(db_mag, u2 * (M + 1)));
  std::printf("p=%d %s: max |cube - unsplit| / max|unsplit|: Y %.2e dX %.2e dW %.2e db %.2e\n", p,
              d.ToString().c_str(), ey, edx, edw, edb);
}

// An MLP's fc then proj: the second layer runs in the swapped direction on
// the first's output blocks as they are, and the chain's output is back in
// the first layer's input layout.
TEST_P(CubeLinearTest, TwoLayerChain_SwappedDirection_EqualsUnsplitChain) {
  const auto [p, direction_index] = GetParam();
  const CubeDirection d = DirectionOf(direction_index);
  const int64_t M = 2 * p * p, N = 2 * p * p, K1 = 4 * p * p, K2 = N;
  const Layer fc = MakeLayer(M, N, K1, 101), proj = MakeLayer(M, K1, K2, 201);
  const std::vector<float> x = Random(M * N, 301), dy = Random(M * K2, 401);
  const std::vector<float> zeros1(N * K1, 0.0f), zeros2(K1 * K2, 0.0f);
  const std::vector<float> zb1(K1, 0.0f), zb2(K2, 0.0f);

  std::vector<float> h(M * K1), y(M * K2), dh(M * K1), dx(M * N);
  std::vector<float> dw1 = zeros1, dw2 = zeros2, db1 = zb1, db2 = zb2;
  LinearForward(x.data(), fc.w.data(), fc.b.data(), M, N, K1, h.data());
  LinearForward(h.data(), proj.w.data(), proj.b.data(), M, K1, K2, y.data());
  LinearBackward(h.data(), proj.w.data(), dy.data(), M, K1, K2, dh.data(), dw2.data(), db2.data());
  LinearBackward(x.data(), fc.w.data(), dh.data(), M, N, K1, dx.data(), dw1.data(), db1.data());

  const int n = p * p * p;
  const CubeDirection d2 = d.Swapped();
  auto xs = ScatterAll(CubeOperand::kActivation, x, M, N, p, d);
  auto dys = ScatterAll(CubeOperand::kActivation, dy, M, K2, p, d);  // back in d
  LayerBlocks b1 = ScatterLayer(fc, zeros1, zb1, p, d), b2 = ScatterLayer(proj, zeros2, zb2, p, d2);
  std::vector<std::vector<float>> hs(n), ys(n), dhs(n), dxs(n);
  auto fabric = Fabric(p);
  ExpectAllOk(fabric->Run([&](InProcessCubeComm& comm) -> absl::Status {
    const int r = CubeRankIndex(comm.coord(), p);
    hs[r].resize(M * K1 / n);
    dhs[r].resize(M * K1 / n);
    ys[r].resize(M * K2 / n);
    dxs[r].resize(M * N / n);
    absl::Status st =
        CubeLinearForward(comm, d, fc.dims, xs[r], b1.w[r], b1.b[r], absl::MakeSpan(hs[r]));
    if (st.ok()) {
      st = CubeLinearForward(comm, d2, proj.dims, hs[r], b2.w[r], b2.b[r], absl::MakeSpan(ys[r]));
    }
    if (st.ok()) {
      st = CubeLinearBackward(comm, d2, proj.dims, hs[r], b2.w[r], dys[r], absl::MakeSpan(dhs[r]),
                              absl::MakeSpan(b2.dw[r]), absl::MakeSpan(b2.db[r]));
    }
    if (st.ok()) {
      st = CubeLinearBackward(comm, d, fc.dims, xs[r], b1.w[r], dhs[r], absl::MakeSpan(dxs[r]),
                              absl::MakeSpan(b1.dw[r]), absl::MakeSpan(b1.db[r]));
    }
    return st;
  }));

  // Magnitudes through the chain (in double): |H| <= |X||W1| + |b1|, etc.
  const double u2 = 2 * kUnitRoundoff;
  std::vector<double> h_mag = AbsGemm(false, false, M, K1, N, Abs(x), Abs(fc.w));
  for (int64_t i = 0; i < M * K1; ++i) h_mag[i] += std::fabs(fc.b[i % K1]);
  std::vector<double> y_mag = AbsGemm(false, false, M, K2, K1, h_mag, Abs(proj.w));
  for (int64_t i = 0; i < M * K2; ++i) y_mag[i] += std::fabs(proj.b[i % K2]);
  const std::vector<double> dh_mag = AbsGemm(false, true, M, K1, K2, Abs(dy), Abs(proj.w));
  const std::vector<double> dx_mag = AbsGemm(false, true, M, N, K1, dh_mag, Abs(fc.w));
  const std::vector<double> dw2_mag = AbsGemm(true, false, K1, K2, M, h_mag, Abs(dy));
  const std::vector<double> dw1_mag = AbsGemm(true, false, N, K1, M, Abs(x), dh_mag);
  std::vector<double> db2_mag(K2, 0.0), db1_mag(K1, 0.0);
  for (int64_t i = 0; i < M * K2; ++i) db2_mag[i % K2] += std::fabs(dy[i]);
  for (int64_t i = 0; i < M * K1; ++i) db1_mag[i % K1] += dh_mag[i];

  double worst = 0;
  auto check = [&](const char* what, const std::vector<float>& got, const std::vector<float>& want,
                   const std::vector<double>& mag, int64_t terms) {
    worst = std::max(worst, ExpectWithin(what, got, want, Scaled(mag, u2 * terms)));
  };
  check("H", GatherAll(CubeOperand::kActivation, hs, M, K1, p, d2), h, h_mag, N + 1);
  check("Y", GatherAll(CubeOperand::kActivation, ys, M, K2, p, d), y, y_mag, N + K1 + 2);
  check("dH", GatherAll(CubeOperand::kActivation, dhs, M, K1, p, d2), dh, dh_mag, K2);
  check("dX", GatherAll(CubeOperand::kActivation, dxs, M, N, p, d), dx, dx_mag, K2 + K1);
  check("dW2", GatherAll(CubeOperand::kWeight, b2.dw, K1, K2, p, d2), dw2, dw2_mag, M + N + 1);
  check("dW1", GatherAll(CubeOperand::kWeight, b1.dw, N, K1, p, d), dw1, dw1_mag, M + K2);
  check("db2", GatherAll(CubeOperand::kVector, b2.db, 1, K2, p, d), db2, db2_mag, M);
  check("db1", GatherAll(CubeOperand::kVector, b1.db, 1, K1, p, d2), db1, db1_mag, M + K2);
  std::printf("p=%d %s chain: max |cube - unsplit| / max|unsplit| %.2e\n", p, d.ToString().c_str(),
              worst);
}

// The same inputs give bitwise the same blocks, run after run (sums in
// coordinate order, never arrival order).
TEST_P(CubeLinearTest, Forward_RunTwice_BitwiseEqual) {
  const auto [p, direction_index] = GetParam();
  const CubeDirection d = DirectionOf(direction_index);
  const Layer layer = MakeLayer(p * p, p, p * p, 7);
  const int n = p * p * p;
  auto xs = ScatterAll(CubeOperand::kActivation, Random(p * p * p, 8), p * p, p, p, d);
  LayerBlocks blocks = ScatterLayer(layer, layer.w, layer.b, p, d);
  std::vector<std::vector<float>> first(n), second(n);
  auto fabric = Fabric(p);
  for (auto* out : {&first, &second}) {
    ExpectAllOk(fabric->Run([&](InProcessCubeComm& comm) {
      const int r = CubeRankIndex(comm.coord(), p);
      (*out)[r].resize(layer.dims.rows * layer.dims.out / n);
      return CubeLinearForward(comm, d, layer.dims, xs[r], blocks.w[r], blocks.b[r],
                               absl::MakeSpan((*out)[r]));
    }));
  }
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(0, std::memcmp(first[r].data(), second[r].data(), first[r].size() * 4)) << r;
  }
}

INSTANTIATE_TEST_SUITE_P(PAndDirection, CubeLinearTest,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Values(0, 1, 2)));

// Bytes each rank sends per product, against §3.1.2's count: the forward
// moves (M N + N K + M K) / p^3 per rank across p processors, i.e. each
// rank sends (p - 1) (M N + N K + M K) / p^3 floats (two all-gathers, one
// reduce-scatter); the backward (p - 1) (2 M N + 2 N K + M K) / p^3 with dX
// (dY gathered once), (p - 1) (M N + N K + M K) / p^3 without. The bias
// adds cube_vector.h's: forward (p - 1) K / p^2 (+ the same from the
// diagonal ranks, the broadcast's roots), backward (p - 1) K / p^2 +
// 2 (p - 1) K / p^3.
class CubeLinearBytesTest : public ::testing::TestWithParam<int> {};

TEST_P(CubeLinearBytesTest, SentBytesPerRank_MatchThePapersCount) {
  const int p = GetParam();
  const int64_t M = 2 * p * p, N = 3 * p, K = p * p * p, p3 = p * p * p;
  const CubeDirection d = kPaper;
  const int64_t fwd = 4 * (p - 1) * (M * N + N * K + M * K) / p3;
  const int64_t bwd = 4 * (p - 1) * (2 * M * N + 2 * N * K + M * K) / p3;
  const int64_t bwd_no_dx = 4 * (p - 1) * (M * N + N * K + M * K) / p3;
  const CubeLinearSentFloats sent = CubeLinearSent({M, N, K, false}, p);
  EXPECT_EQ(4 * sent.forward, fwd);
  EXPECT_EQ(4 * sent.backward, bwd);
  EXPECT_EQ(4 * sent.backward_without_dx, bwd_no_dx);

  for (bool bias : {false, true}) {
    const CubeLinearDims dims{M, N, K, bias};
    const Layer layer = MakeLayer(M, N, K, 3);
    auto xs = ScatterAll(CubeOperand::kActivation, Random(M * N, 4), M, N, p, d);
    auto dys = ScatterAll(CubeOperand::kActivation, Random(M * K, 5), M, K, p, d.Swapped());
    LayerBlocks blocks = ScatterLayer(layer, layer.w, layer.b, p, d);
    auto fabric = Fabric(p);
    ExpectAllOk(fabric->Run([&](InProcessCubeComm& comm) -> absl::Status {
      const CubeCoord c = comm.coord();
      const int r = CubeRankIndex(c, p);
      const bool diagonal = c[d.input] == c[d.output];
      std::vector<float> y(dys[r].size()), dx(xs[r].size());
      std::vector<float> b = bias ? blocks.b[r] : std::vector<float>();
      std::vector<float> db(b.size());
      const int64_t bias_fwd = bias ? 4 * (p - 1) * K / (p * p) * (diagonal ? 2 : 1) : 0;
      const int64_t bias_bwd = bias ? 4 * ((p - 1) * K / (p * p) + 2 * (p - 1) * K / p3) : 0;

      absl::Status st = CubeLinearForward(comm, d, dims, xs[r], blocks.w[r], b, absl::MakeSpan(y));
      EXPECT_EQ(comm.sent_bytes(), fwd + bias_fwd) << "rank " << r;
      comm.ResetSentBytes();
      if (st.ok()) {
        st = CubeLinearBackward(comm, d, dims, xs[r], blocks.w[r], dys[r], absl::MakeSpan(dx),
                                absl::MakeSpan(blocks.dw[r]), absl::MakeSpan(db));
      }
      EXPECT_EQ(comm.sent_bytes(), bwd + bias_bwd) << "rank " << r;
      comm.ResetSentBytes();
      if (st.ok()) {
        st = CubeLinearBackward(comm, d, dims, xs[r], blocks.w[r], dys[r], {},
                                absl::MakeSpan(blocks.dw[r]), absl::MakeSpan(db));
      }
      EXPECT_EQ(comm.sent_bytes(), bwd_no_dx + bias_bwd) << "rank " << r;
      return st;
    }));
  }
}

INSTANTIATE_TEST_SUITE_P(P, CubeLinearBytesTest, ::testing::Values(2, 3));

// Bad input fails before any communication, so one rank's comm suffices.
TEST(CubeLinearTest, NotDivisible_InvalidArgumentNamingTheDimension) {
  auto fabric = Fabric(2);
  CubeComm& comm = fabric->comm(0);
  struct Case {
    CubeLinearDims dims;
    const char* names;
  };
  for (const Case& c :
       {Case{{6, 4, 8, false}, "rows (M) = 6"}, Case{{8, 5, 8, false}, "in (N) = 5"},
        Case{{8, 4, 6, false}, "out (K) = 6"}, Case{{0, 4, 8, false}, "rows (M) = 0"}}) {
    const absl::Status s = CubeLinearForward(comm, kPaper, c.dims, {}, {}, {}, {});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(c.names), std::string::npos) << s;
    const absl::Status b = CubeLinearBackward(comm, kPaper, c.dims, {}, {}, {}, {}, {}, {});
    EXPECT_NE(b.message().find(c.names), std::string::npos) << b;
  }
}

TEST(CubeLinearTest, WrongBlockSize_InvalidArgumentNamingTheBlock) {
  auto fabric = Fabric(2);
  std::vector<float> x(2 * 2), w(2 * 2), y(2 * 4);
  std::vector<float> short_w(3);
  const CubeLinearDims dims{8, 4, 8, false};
  absl::Status s =
      CubeLinearForward(fabric->comm(0), kPaper, dims, x, short_w, {}, absl::MakeSpan(y));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("w block has 3 values, its layout 4"), std::string::npos) << s;
  // With a bias, rank 0 (0, 0, 0) is on the diagonal and needs its piece.
  s = CubeLinearForward(fabric->comm(0), kPaper, {8, 4, 8, true}, x, w, {}, absl::MakeSpan(y));
  EXPECT_NE(s.message().find("b block has 0 values, its layout 2"), std::string::npos) << s;
}

TEST(CubeLinearTest, PBelowTwo_InvalidArgument) {
  auto sizes = CubeLinearBlocks({8, 4, 8, false}, 1, CubeCoord{}, kPaper);
  EXPECT_EQ(sizes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(sizes.status().message().find("p = 1"), std::string::npos) << sizes.status();
}

}  // namespace
}  // namespace pipetrain
