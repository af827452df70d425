// The 3-D attention and MLP blocks on an in-process cube against the
// unsplit worker/model AttentionUnit / MlpUnit (tp = nullptr, CPU backend)
// with the same parameters: the gathered output, input gradient and every
// parameter gradient, the bytes each rank sends, and bad dims.
//
// Tolerance (normwise: max |cube - unsplit| / max |unsplit| per tensor).
// The cube computes the same ops on the same values and only reorders
// float sums (the 3-D products' p partial GEMMs summed along an axis, the
// LayerNorm's row sums over p column blocks, the biases' and LayerNorm
// parameters' column sums over p^2 row blocks); the attention core and
// GELU see the same inputs element by element. A reordered sum of n terms
// is within 2 n u sum |t| of the other order (u = 2^-24; Higham §3.1), and
// the longest sum here has n = max(4d, M) = 64 terms at p = 2 (c_fc's dW
// over M = 32 rows, the MLP's c_proj over 4d = 64 inputs), so each op is
// within 2 * 64 * u = 7.6e-6 of its magnitude. Inputs and weights are
// O(1) random, so the magnitudes are O(max |result|) and the ops are well
// conditioned (LayerNorm's rstd ~ 1.7, softmax's Jacobian <= 1); about six
// ops chain (ln, linear, attention / GELU, linear and back), so the errors
// add to at most ~6 * 7.6e-6 = 4.6e-5: kTolerance = 5e-5. The observed
// error is ~1e-6 (rounding errors are random, not worst-case), far below
// the O(1e-1) a wrong permutation, layout or missing term produces.
#include "worker/cube/cube_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "common/tensor.h"
#include "gtest/gtest.h"
#include "worker/cube/cube_test_util.h"
#include "worker/cube/cube_testing.h"
#include "worker/data/dataset.h"
#include "worker/model/gpt_config.h"
#include "worker/model/unit.h"

namespace pipetrain {
namespace {

using cube_test::Fabric;
using cube_test::GatherAll;
using cube_test::kPaper;
using cube_test::Random;
using cube_test::ScatterAll;

constexpr double kTolerance = 5e-5;

// max |got - want| / max |want|.
double RelativeError(const std::string& what, const std::vector<float>& got,
                     const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size()) << what;
  if (got.size() != want.size()) return INFINITY;
  double max_want = 0, max_diff = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_want = std::max(max_want, std::fabs(double(want[i])));
    const double diff = std::fabs(double(got[i]) - double(want[i]));
    // A NaN is infinitely far: std::max would drop it (it compares false).
    max_diff = std::max(max_diff, std::isfinite(diff) ? diff : INFINITY);
  }
  const double error = max_want > 0 ? max_diff / max_want : max_diff;
  EXPECT_LE(error, kTolerance) << what << ": max |diff| " << max_diff << ", max |unsplit| "
                               << max_want;
  return error;
}

// The six tensors of a unit's parameters() (values or gradients).
CubeBlockTensors FromUnit(Unit& unit, bool grads) {
  std::vector<std::vector<float>> t;
  for (Parameter* p : unit.parameters()) t.push_back((grads ? p->grad : p->value).ToVector());
  EXPECT_EQ(t.size(), 6u);
  t.resize(6);
  return {t[0], t[1], t[2], t[3], t[4], t[5]};
}

struct Case {
  int p;
  int64_t batch, seq_len, d_model, n_head;
  CubeDirection direction;
};

enum class Block { kAttention, kMlp };

class CubeBlocksTest : public ::testing::TestWithParam<std::tuple<Block, int>> {};

Case CaseOf(int index) {
  switch (index) {
    case 0:
      return {2, 4, 8, 16, 4, kPaper};
    case 1:
      return {2, 4, 8, 16, 4, {CubeAxis::kX, CubeAxis::kZ, CubeAxis::kY}};
    default:
      return {3, 9, 4, 18, 3, kPaper};
  }
}

TEST_P(CubeBlocksTest, GatheredEqualUnsplitUnitWithinRounding_SentBytesMatchFormula) {
  const auto [block, case_index] = GetParam();
  const Case c = CaseOf(case_index);
  const bool attention = block == Block::kAttention;
  const int p = c.p, n = p * p * p;
  const int64_t B = c.batch, T = c.seq_len, d = c.d_model, M = B * T;
  const CubeBlockDims dims{B, T, d, c.n_head};
  const CubeDirection dir = c.direction;

  // The unsplit unit, with O(1) random parameters and non-zero starting
  // gradients (both sides accumulate).
  GptConfig config;
  config.max_seq_len = static_cast<int>(T);
  config.n_layer = 1;
  config.n_head = static_cast<int>(c.n_head);
  config.d_model = static_cast<int>(d);
  std::unique_ptr<Unit> unit = MakeUnit(config, attention ? 1 : 2);
  uint32_t seed = 1000;
  for (Parameter* param : unit->parameters()) {
    const float offset = param->init == ParamInit::kOnes ? 1.0f : 0.0f;
    param->value.CopyFrom(
        Tensor::FromVector(param->value.shape(), Random(param->value.numel(), seed++, offset)));
    param->grad.CopyFrom(
        Tensor::FromVector(param->grad.shape(), Random(param->grad.numel(), seed++)));
  }
  const CubeBlockTensors full = FromUnit(*unit, false), grad0 = FromUnit(*unit, true);
  const std::vector<float> x = Random(M * d, 7), dy = Random(M * d, 8);

  TokenBatch batch;
  batch.batch = static_cast<int>(B);
  batch.seq_len = static_cast<int>(T);
  UnitContext unit_ctx;
  const std::vector<float> y_ref =
      unit->Forward(Tensor::FromVector({B, T, d}, x), batch, &unit_ctx).ToVector();
  const std::vector<float> dx_ref =
      unit->Backward(Tensor::FromVector({B, T, d}, dy), batch, unit_ctx).ToVector();
  const CubeBlockTensors grad_ref = FromUnit(*unit, true);

  // Every rank's blocks.
  std::vector<CubeBlockTensors> params(n), grads(n);
  for (int r = 0; r < n; ++r) {
    const CubeCoord coord = CubeCoordOf(r, p);
    auto v = attention ? ScatterCubeAttentionParams(full, dims, p, coord, dir)
                       : ScatterCubeMlpParams(full, dims, p, coord, dir);
    auto g = attention ? ScatterCubeAttentionParams(grad0, dims, p, coord, dir)
                       : ScatterCubeMlpParams(grad0, dims, p, coord, dir);
    ASSERT_TRUE(v.ok()) << v.status();
    ASSERT_TRUE(g.ok()) << g.status();
    params[r] = *std::move(v);
    grads[r] = *std::move(g);
  }
  const auto xs = ScatterAll(CubeOperand::kActivation, x, M, d, p, dir);
  const auto dys = ScatterAll(CubeOperand::kActivation, dy, M, d, p, dir);
  std::vector<std::vector<float>> ys(n), dxs(n);
  std::vector<int64_t> sent_forward(n), sent_backward(n);
  auto fabric = Fabric(p);
  const std::vector<absl::Status> status = fabric->Run([&](InProcessCubeComm& comm) {
    const int r = CubeRankIndex(comm.coord(), p);
    ys[r].resize(xs[r].size());
    dxs[r].resize(xs[r].size());
    CubeBlockContext ctx;
    comm.ResetSentBytes();
    absl::Status st = attention ? CubeAttentionForward(comm, dir, dims, params[r].params(), xs[r],
                                                       absl::MakeSpan(ys[r]), &ctx)
                                : CubeMlpForward(comm, dir, dims, params[r].params(), xs[r],
                                                 absl::MakeSpan(ys[r]), &ctx);
    if (!st.ok()) return st;
    sent_forward[r] = comm.sent_bytes();
    comm.ResetSentBytes();
    st = attention ? CubeAttentionBackward(comm, dir, dims, params[r].params(), ctx, dys[r],
                                           absl::MakeSpan(dxs[r]), grads[r].grads())
                   : CubeMlpBackward(comm, dir, dims, params[r].params(), ctx, dys[r],
                                     absl::MakeSpan(dxs[r]), grads[r].grads());
    sent_backward[r] = comm.sent_bytes();
    return st;
  });
  for (int r = 0; r < n; ++r) ASSERT_TRUE(status[r].ok()) << r << ": " << status[r];

  auto gathered = attention ? GatherCubeAttentionParams(grads, dims, p, dir)
                            : GatherCubeMlpParams(grads, dims, p, dir);
  ASSERT_TRUE(gathered.ok()) << gathered.status();
  const CubeBlockTensors& g = *gathered;
  const double ey =
      RelativeError("y", GatherAll(CubeOperand::kActivation, ys, M, d, p, dir), y_ref);
  const double edx =
      RelativeError("dx", GatherAll(CubeOperand::kActivation, dxs, M, d, p, dir), dx_ref);
  double eparam = 0;
  eparam = std::max(eparam, RelativeError("d ln_weight", g.ln_weight, grad_ref.ln_weight));
  eparam = std::max(eparam, RelativeError("d ln_bias", g.ln_bias, grad_ref.ln_bias));
  eparam = std::max(eparam, RelativeError("d in_weight", g.in_weight, grad_ref.in_weight));
  eparam = std::max(eparam, RelativeError("d in_bias", g.in_bias, grad_ref.in_bias));
  eparam = std::max(eparam, RelativeError("d out_weight", g.out_weight, grad_ref.out_weight));
  eparam = std::max(eparam, RelativeError("d out_bias", g.out_bias, grad_ref.out_bias));
  std::printf("%s p=%d %s: max |cube - unsplit| / max|unsplit|: y %.2e dx %.2e params %.2e\n",
              attention ? "attention" : "mlp", p, dir.ToString().c_str(), ey, edx, eparam);

  for (int r = 0; r < n; ++r) {
    const CubeCoord coord = CubeCoordOf(r, p);
    const CubeBlockSentFloats want =
        attention ? CubeAttentionSent(dims, p, coord, dir) : CubeMlpSent(dims, p, coord, dir);
    EXPECT_EQ(sent_forward[r], 4 * want.forward) << "rank " << r;
    EXPECT_EQ(sent_backward[r], 4 * want.backward) << "rank " << r;
    if (r == 0) {
      std::printf("  rank 0 sends %lld bytes forward, %lld backward\n",
                  static_cast<long long>(sent_forward[r]),
                  static_cast<long long>(sent_backward[r]));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllBlocks, CubeBlocksTest,
                         ::testing::Combine(::testing::Values(Block::kAttention, Block::kMlp),
                                            ::testing::Values(0, 1, 2)));

// The closed form at p = 2 on a diagonal rank of the paper's direction
// (coord 0: all coordinates 0), written out from the layers' counts, so
// that CubeAttentionSent / CubeMlpSent are themselves checked: with
// m = M / p^3 etc., a 3-D linear M x N x K sends (p - 1)(MN + NK + MK) / p^3
// forward and (p - 1)(2MN + 2NK + MK) / p^3 backward; a vector of L sends
// 2 (p - 1) L / p^2 gathered on the diagonal, (p - 1) L / p^2 +
// 2 (p - 1) L / p^3 reduced; an all-reduce of n floats 2 (p - 1) n / p.
TEST(CubeBlocksSentTest, ClosedFormAtP2) {
  const int64_t B = 4, T = 8, d = 16, M = B * T;  // p = 2: p^2 = 4, p^3 = 8
  const CubeBlockDims dims{B, T, d, 4};
  const auto linear_f = [](int64_t m, int64_t n, int64_t k) { return (m * n + n * k + m * k) / 8; };
  const auto linear_b = [](int64_t m, int64_t n, int64_t k) {
    return (2 * m * n + 2 * n * k + m * k) / 8;
  };
  const auto gather = [](int64_t l) { return 2 * l / 4; };      // diagonal rank
  const auto reduce = [](int64_t l) { return l / 4 + l / 4; };  // (p-1)L/p^2 + 2(p-1)(L/p^2)/p
  const auto all_reduce = [](int64_t n) { return n; };          // 2 (p - 1) n / p
  for (const bool attention : {true, false}) {
    const int64_t k = attention ? 3 * d : 4 * d, k2 = attention ? d : 4 * d;
    const int64_t forward = 2 * gather(d) + 2 * all_reduce(M / 4) + linear_f(M, d, k) + gather(k) +
                            linear_f(M, k2, d) + gather(d);
    const int64_t backward = linear_b(M, k2, d) + reduce(d) + linear_b(M, d, k) + reduce(k) +
                             gather(d) + all_reduce(2 * M / 4) + 2 * reduce(d);
    const CubeBlockSentFloats got = attention ? CubeAttentionSent(dims, 2, CubeCoord{}, kPaper)
                                              : CubeMlpSent(dims, 2, CubeCoord{}, kPaper);
    EXPECT_EQ(got.forward, forward) << (attention ? "attention" : "mlp");
    EXPECT_EQ(got.backward, backward) << (attention ? "attention" : "mlp");
  }
}

// The permutation is a bijection that gives group g the q, k, v columns of
// heads [g H / p, (g+1) H / p); scatter then gather returns the unsplit
// parameters bitwise.
TEST(CubeBlocksParamsTest, AttentionPermutationAndScatterGatherRoundTrip) {
  const int p = 2;
  const int64_t d = 16;
  const CubeBlockDims dims{4, 8, d, 4};
  std::vector<int> seen(3 * d, 0);
  for (int64_t col = 0; col < 3 * d; ++col) ++seen[CubeAttentionPermutedColumn(col, d, p)];
  for (int64_t u = 0; u < 3 * d; ++u) EXPECT_EQ(seen[u], 1) << u;
  // Group 1 starts with q's column d / p (head 2 of 4, its first head).
  EXPECT_EQ(CubeAttentionPermutedColumn(3 * d / p, d, p), d / p);
  EXPECT_EQ(CubeAttentionPermutedColumn(d / p, d, p), d);              // group 0's k
  EXPECT_EQ(CubeAttentionPermutedColumn(3 * d - 1, d, p), 3 * d - 1);  // group 1's last v

  CubeBlockTensors full{Random(d, 1),     Random(d, 2),     Random(d * 3 * d, 3),
                        Random(3 * d, 4), Random(d * d, 5), Random(d, 6)};
  std::vector<CubeBlockTensors> blocks;
  for (int r = 0; r < p * p * p; ++r) {
    auto b = ScatterCubeAttentionParams(full, dims, p, CubeCoordOf(r, p), kPaper);
    ASSERT_TRUE(b.ok()) << b.status();
    blocks.push_back(*std::move(b));
  }
  auto back = GatherCubeAttentionParams(blocks, dims, p, kPaper);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ln_weight, full.ln_weight);
  EXPECT_EQ(back->ln_bias, full.ln_bias);
  EXPECT_EQ(back->in_weight, full.in_weight);
  EXPECT_EQ(back->in_bias, full.in_bias);
  EXPECT_EQ(back->out_weight, full.out_weight);
  EXPECT_EQ(back->out_bias, full.out_bias);
}

TEST(CubeBlocksDimsTest, BadDims_InvalidArgumentNamingTheDimension) {
  auto fabric = Fabric(2);
  InProcessCubeComm& comm = fabric->comm(0);  // validation precedes any collective
  CubeBlockContext ctx;
  std::vector<float> x(6 * 8 * 16 / 8), y(x.size());
  const CubeBlockParams none;

  absl::Status st =
      CubeAttentionForward(comm, kPaper, {6, 8, 16, 4}, none, x, absl::MakeSpan(y), &ctx);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("batch (B) = 6"), std::string::npos) << st;
  EXPECT_NE(st.message().find("p^2 = 4"), std::string::npos) << st;

  st = CubeMlpForward(comm, kPaper, {6, 8, 16, 4}, none, x, absl::MakeSpan(y), &ctx);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("batch (B) = 6"), std::string::npos) << st;

  st = CubeAttentionForward(comm, kPaper, {4, 8, 24, 3}, none, x, absl::MakeSpan(y), &ctx);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("n_head = 3"), std::string::npos) << st;
  EXPECT_NE(st.message().find("p = 2"), std::string::npos) << st;

  st = CubeAttentionForward(comm, kPaper, {4, 8, 18, 2}, none, x, absl::MakeSpan(y), &ctx);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("d_model (d) = 18"), std::string::npos) << st;

  // The right dims, the wrong input block size.
  st = CubeAttentionForward(comm, kPaper, {4, 8, 16, 4}, none, x, absl::MakeSpan(y), &ctx);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("x has"), std::string::npos) << st;

  CubeBlockTensors full;  // empty tensors
  auto scattered = ScatterCubeMlpParams(full, {4, 8, 16, 4}, 2, CubeCoord{}, kPaper);
  EXPECT_EQ(scattered.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(scattered.status().message().find("full ln_weight"), std::string::npos)
      << scattered.status();
}

}  // namespace
}  // namespace pipetrain
