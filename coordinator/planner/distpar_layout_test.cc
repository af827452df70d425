#include "coordinator/planner/distpar_layout.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using L = MatmulLayout;

std::string Names(const std::vector<MatmulLayout>& layouts) {
  std::vector<std::string> names;
  for (MatmulLayout l : layouts) names.push_back(MatmulLayoutName(l));
  return absl::StrJoin(names, ",");
}

LayoutProblem GptBlock(int64_t tokens, int64_t d, int devices, double beta) {
  LayoutProblem p;
  p.layers = GptBlockLayers(tokens, d);
  p.devices = devices;
  p.beta = beta;
  return p;
}

// Megatron's scheme (acctfm.txt Fig. 1: QKV and fc by columns, the
// projections by rows) costs exactly one all-reduce of the block's
// activations after each row-parallel layer forward and one before each
// column-parallel layer backward: 4 of 2(n-1)|m x d| elements.
TEST(DistParLayoutTest, Megatron_FourAllReducesOfTheActivations) {
  const LayoutProblem p = GptBlock(/*tokens=*/512, /*d=*/256, /*devices=*/4, /*beta=*/1.0);
  const LayoutScheme s = EvaluateLayouts(p, {L::kColumn, L::kRow, L::kColumn, L::kRow});
  ASSERT_EQ(s.conversions.size(), 4u) << Names(s.layouts);
  for (const Conversion& c : s.conversions) {
    EXPECT_EQ(c.collective, "all-reduce") << c.where;
    EXPECT_EQ(c.from, Sbp::kPartial) << c.where;
    EXPECT_EQ(c.to, Sbp::kBroadcast) << c.where;
    EXPECT_DOUBLE_EQ(c.elements, 2.0 * 3 * 512 * 256) << c.where;
  }
  EXPECT_DOUBLE_EQ(s.communication, 4 * 2.0 * 3 * 512 * 256);
}

// Data parallelism within the group: no activation traffic but the
// block's input split and output gathered, and every weight gradient
// all-reduced.
TEST(DistParLayoutTest, DataEverywhere_GathersOutputAndAllReducesWeightGradients) {
  const LayoutProblem p = GptBlock(512, 256, 2, 1.0);
  const LayoutScheme s = EvaluateLayouts(p, {L::kData, L::kData, L::kData, L::kData});
  double weights = 0;
  for (const MatmulLayer& l : p.layers) weights += double(l.k) * l.n;
  // dW all-reduces: 2(n-1) = 2 per weight element; the output all-gathered
  // forward ((n-1)|Y|) and the input gradient all-gathered backward.
  EXPECT_DOUBLE_EQ(s.communication, 2.0 * weights + 512.0 * 256 + 512.0 * 256);
}

TEST(DistParLayoutTest, ExtremeBetas_PickTheObviousSchemes) {
  // Communication free: the least local elements. Priceless: no
  // communication at all, which only replication achieves.
  const LayoutScheme free = *SolveLayouts(GptBlock(4096, 64, 4, 0.0));
  for (MatmulLayout l : free.layouts) EXPECT_NE(l, L::kReplicate) << Names(free.layouts);
  const LayoutScheme priceless = *SolveLayouts(GptBlock(4096, 64, 4, 1e9));
  EXPECT_EQ(Names(priceless.layouts), "replicate,replicate,replicate,replicate");
  EXPECT_EQ(priceless.communication, 0);
}

// A beta so large that beta x communication overflows to inf for every
// layout of the first layer (the input split by rows must be converted):
// a scheme still comes back (the search once matched costs going forward
// and aborted on inf - inf), the cheapest where costs are finite.
TEST(DistParLayoutTest, BetaOverflowingEveryChain_StillAScheme) {
  LayoutProblem p = GptBlock(1024, 768, 2, 1e305);
  p.input = Sbp::kSplitRows;
  p.output = Sbp::kBroadcast;
  const absl::StatusOr<LayoutScheme> scheme = SolveLayouts(p);
  ASSERT_TRUE(scheme.ok()) << scheme.status();
  EXPECT_EQ(scheme->layouts.size(), p.layers.size());
}

TEST(DistParLayoutTest, LargeWeightsFewTokens_SplitsEveryWeight) {
  // 16 tokens of a d = 2048 block on 4 devices: weights dwarf activations,
  // so data parallelism (all-reduce of dW) and replication (every device
  // holds and computes all weights) both lose to splitting the weights by
  // columns or rows; how they chain is a matter of the small activations.
  const LayoutProblem p = GptBlock(16, 2048, 4, 1.0);
  const LayoutScheme s = *SolveLayouts(p);
  for (MatmulLayout l : s.layouts) {
    EXPECT_TRUE(l == L::kColumn || l == L::kRow) << Names(s.layouts);
  }
  EXPECT_LE(s.cost, EvaluateLayouts(p, {L::kColumn, L::kRow, L::kColumn, L::kRow}).cost);
  EXPECT_LT(s.cost, 0.5 * EvaluateLayouts(p, {L::kData, L::kData, L::kData, L::kData}).cost);
}

TEST(DistParLayoutTest, ManyTokensSmallWeights_ChoosesDataParallel) {
  // 65536 tokens of a d = 64 block: activations dwarf weights.
  const LayoutScheme s = *SolveLayouts(GptBlock(65536, 64, 4, 1.0));
  EXPECT_EQ(Names(s.layouts), "data,data,data,data");
}

// 3-D (3d-parallelism.txt Alg. 1-2): on p^3 devices a cube matmul sends
// (p-1)(|X| + |W| + |Y|) forward and (p-1)(|Y| + 2|X| + 2|W|) backward
// (dY gathered once for both backward products, as CubeLinearBackward
// does), and its blocks pass from layer to layer without conversions.
TEST(DistParLayoutTest, CubeEverywhere_OnlyTheProductsCommunicate) {
  const LayoutProblem p = GptBlock(512, 256, 8, 1.0);
  ASSERT_EQ(CubeSide(8), 2);
  const LayoutScheme s = EvaluateLayouts(p, {L::kCube, L::kCube, L::kCube, L::kCube});
  double expected = 0;
  for (const MatmulLayer& l : p.layers) {
    const double x = double(l.m) * l.k, w = double(l.k) * l.n, y = double(l.m) * l.n;
    expected += (2 - 1) * ((x + w + y) + (y + 2 * x + 2 * w));
  }
  // The block's input arrives replicated (B -> C is a local slice) and
  // its output is gathered (C -> B, (n-1)|Y|), its input gradient too.
  expected += 2 * 7.0 * 512 * 256;
  EXPECT_DOUBLE_EQ(s.communication, expected);
}

TEST(DistParLayoutTest, Cube_OnlyWhereTheGroupIsACube) {
  EXPECT_EQ(CubeSide(8), 2);
  EXPECT_EQ(CubeSide(27), 3);
  EXPECT_EQ(CubeSide(4), 0);
  EXPECT_EQ(CubeSide(16), 0);
  // Large everything, 64 devices: the cube's O(1/p^2) traffic wins over
  // every 1-D scheme; on 16 devices (not a cube) it is never chosen.
  const LayoutScheme cube = *SolveLayouts(GptBlock(8192, 4096, 64, 1.0));
  EXPECT_EQ(Names(cube.layouts), "cube,cube,cube,cube");
  const LayoutScheme flat = *SolveLayouts(GptBlock(8192, 4096, 16, 1.0));
  for (MatmulLayout l : flat.layouts) EXPECT_NE(l, L::kCube) << Names(flat.layouts);
}

TEST(DistParLayoutTest, Solve_RandomChains_MatchesBruteForce) {
  std::mt19937 rng(20261128);
  std::uniform_int_distribution<int> dim(1, 64), layers(1, 6), joiner(0, 2);
  const int kDevices[] = {2, 3, 4, 8, 16, 27};
  std::uniform_int_distribution<int> devices_index(0, 5);
  std::uniform_real_distribution<double> log_beta(-3, 3);
  // Samples and heads: unconstrained (0) in a third of the trials each.
  std::uniform_int_distribution<int> count_of(0, 8);
  int solved = 0, with_a_split_left_out = 0;
  for (int trial = 0; trial < 400; ++trial) {
    LayoutProblem p;
    const int count = layers(rng);
    for (int i = 0; i < count; ++i) {
      // Rows of 8 tokens in half the layers, so that some splits divide.
      const int64_t m = (rng() % 2 ? 8 : 1) * dim(rng);
      p.layers.push_back(
          {"l" + std::to_string(i), m, dim(rng), dim(rng), static_cast<Joiner>(joiner(rng))});
    }
    p.devices = kDevices[devices_index(rng)];
    p.beta = std::pow(10.0, log_beta(rng));
    p.input = rng() % 2 ? Sbp::kBroadcast : Sbp::kSplitRows;
    p.output = rng() % 2 ? Sbp::kBroadcast : Sbp::kSplitRows;
    p.samples = rng() % 3 == 0 ? 0 : count_of(rng);
    p.heads = rng() % 3 == 0 ? 0 : count_of(rng);
    const absl::StatusOr<LayoutScheme> dp = SolveLayouts(p);
    const absl::StatusOr<LayoutScheme> brute = SolveLayoutsBruteForce(p);
    if (!dp.ok()) {  // an input or output split the devices do not divide
      EXPECT_EQ(dp.status().code(), absl::StatusCode::kInvalidArgument) << dp.status();
      EXPECT_EQ(brute.status().code(), absl::StatusCode::kInvalidArgument) << brute.status();
      EXPECT_NE(p.input == Sbp::kSplitRows || p.output == Sbp::kSplitRows, false) << dp.status();
      continue;
    }
    ++solved;
    ASSERT_TRUE(brute.ok()) << brute.status();
    EXPECT_NEAR(dp->cost, brute->cost, 1e-9 * brute->cost) << "trial " << trial;
    // The same scheme, not just the same cost: both keep the
    // lexicographically smallest of the schemes tied up to rounding.
    EXPECT_EQ(Names(dp->layouts), Names(brute->layouts)) << "trial " << trial;
    for (size_t i = 0; i < p.layers.size(); ++i) {
      EXPECT_TRUE(LayoutFits(p, i, dp->layouts[i])) << "trial " << trial << " layer " << i;
      for (int l = 0; l < kMatmulLayouts; ++l) {
        const MatmulLayout layout = static_cast<MatmulLayout>(l);
        if (layout != L::kCube && !LayoutFits(p, i, layout)) ++with_a_split_left_out;
      }
    }
  }
  EXPECT_GT(solved, 150);
  EXPECT_GT(with_a_split_left_out, 200) << "too few trials where a split does not divide";
}

// Ties go to the lexicographically smallest layouts (header), though the
// search adds a scheme's terms in another order than EvaluateLayouts: here
// data and column evaluate to the same 45004.800000000003, but the
// search's own sums differed by an ulp and it returned column.
TEST(DistParLayoutTest, TieUpToRounding_LexicographicallySmallestLayout) {
  LayoutProblem p;
  p.layers = {{"l0", /*m=*/96, /*k=*/4, /*n=*/96, Joiner::kRowwise}};
  p.devices = 8;
  p.beta = 0.1;
  p.samples = 6;
  p.heads = 6;
  p.input = Sbp::kSplitRows;
  p.output = Sbp::kBroadcast;
  ASSERT_EQ(EvaluateLayouts(p, {L::kData}).cost, EvaluateLayouts(p, {L::kColumn}).cost);
  const absl::StatusOr<LayoutScheme> dp = SolveLayouts(p);
  ASSERT_TRUE(dp.ok()) << dp.status();
  EXPECT_EQ(Names(dp->layouts), "data");
  EXPECT_EQ(Names(SolveLayoutsBruteForce(p)->layouts), "data");
}

// Shares are equal, as a job's ranks cut a dimension: a layout or a
// conversion whose split the devices do not divide is no option, and the
// attention core computes on whole sequences and heads. Before, the search
// handed the core 2 sequences cut 4 ways, 3 heads cut 2 ways, and chose
// the cube on tokens that p^2 does not divide.
TEST(DistParLayoutTest, SplitsThatDoNotDivide_NeverChosen) {
  // 65536 tokens of a d = 64 block: data parallelism throughout when 4
  // sequences share the 4 devices; with 2 the core gets them otherwise
  // (by columns: an all-to-all, as heads are not constrained here).
  LayoutProblem p = GptBlock(65536, 64, 4, 1.0);
  const std::vector<MatmulLayout> data = {L::kData, L::kData, L::kData, L::kData};
  p.samples = 4;
  EXPECT_EQ(Names(SolveLayouts(p)->layouts), "data,data,data,data");
  const LayoutScheme whole = EvaluateLayouts(p, data);
  p.samples = 2;
  EXPECT_TRUE(LayoutFits(p, 0, L::kData)) << "a layer splits rows anywhere the devices divide";
  const LayoutScheme cut = EvaluateLayouts(p, data);
  bool gathered = false;
  for (const Conversion& c : cut.conversions) {
    gathered |= c.where == "after qkv (forward)" && c.from == Sbp::kSplitRows;
  }
  EXPECT_TRUE(gathered);
  EXPECT_GT(cut.cost, whole.cost);
  p.layers[0].m = 65538;  // no longer divided by 4 devices
  EXPECT_FALSE(LayoutFits(p, 0, L::kData));
  EXPECT_TRUE(LayoutFits(p, 0, L::kReplicate));
  // The cube on 64 devices (p = 4) needs p^2 = 16 to divide the tokens.
  LayoutProblem cube = GptBlock(8192, 4096, 64, 1.0);
  EXPECT_EQ(Names(SolveLayouts(cube)->layouts), "cube,cube,cube,cube");
  cube = GptBlock(8200, 4096, 64, 1.0);
  EXPECT_FALSE(LayoutFits(cube, 0, L::kCube));
  const LayoutScheme flat = *SolveLayouts(cube);
  for (MatmulLayout l : flat.layouts) EXPECT_NE(l, L::kCube) << Names(flat.layouts);
  // Megatron's qkv by columns hands the attention core whole heads when
  // the devices divide them; with 3 heads on 2 devices its output is
  // gathered first.
  LayoutProblem heads = GptBlock(512, 256, 2, 1.0);
  const std::vector<MatmulLayout> megatron = {L::kColumn, L::kRow, L::kColumn, L::kRow};
  heads.heads = 4;
  for (const Conversion& c : EvaluateLayouts(heads, megatron).conversions) {
    EXPECT_NE(c.where, "after qkv (forward)") << c.collective;
  }
  heads.heads = 3;
  gathered = false;
  for (const Conversion& c : EvaluateLayouts(heads, megatron).conversions) {
    gathered |= c.where == "after qkv (forward)" && c.from == Sbp::kSplitColumns &&
                c.collective == "all-gather";
  }
  EXPECT_TRUE(gathered);
  // An input the devices cannot split: refused, naming it.
  LayoutProblem input = GptBlock(6, 64, 4, 1.0);
  input.input = Sbp::kSplitRows;
  EXPECT_EQ(SolveLayouts(input).status().code(), absl::StatusCode::kInvalidArgument);
  input.samples = -1;
  input.input = Sbp::kBroadcast;
  EXPECT_EQ(SolveLayouts(input).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DistParLayoutTest, BadProblems_InvalidArgument) {
  LayoutProblem p = GptBlock(16, 64, 2, 1.0);
  p.devices = 1;
  EXPECT_EQ(SolveLayouts(p).status().code(), absl::StatusCode::kInvalidArgument);
  p = GptBlock(16, 64, 2, -1.0);
  EXPECT_EQ(SolveLayouts(p).status().code(), absl::StatusCode::kInvalidArgument);
  p = GptBlock(16, 64, 2, 1.0);
  p.layers[1].k = 0;
  EXPECT_EQ(SolveLayouts(p).status().code(), absl::StatusCode::kInvalidArgument);
  p = GptBlock(16, 64, 2, 1.0);
  p.input = Sbp::kPartial;
  EXPECT_EQ(SolveLayouts(p).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SolveLayouts(LayoutProblem{}).status().code(), absl::StatusCode::kInvalidArgument);
}

// beta from the machine: one [1024, 768] x [768, 2304] product is 2 x 1024
// x 768 x 2304 FLOPs over 1024 x 768 + 768 x 2304 + 1024 x 2304 elements
// (737.28 FLOPs each); at 100 GFLOP/s and 10 Gbit/s (1.25e9 bytes/s)
// an element sent costs 3.2 ns, one computed 7.37 ns: beta 0.434.
// Ten times the bandwidth, a tenth of beta; twice the rate, twice.
TEST(CalibratedBetaTest, RatioOfSecondsPerCommunicatedAndComputedElement) {
  const std::vector<MatmulLayer> one = {{"qkv", 1024, 768, 2304, Joiner::kAttention}};
  const double per_element =
      2.0 * 1024 * 768 * 2304 / (1024.0 * 768 + 768.0 * 2304 + 1024.0 * 2304);
  const double beta = CalibratedBeta(one, 1e11, 1.25e9).value();
  EXPECT_NEAR(beta, 4 * 1e11 / (1.25e9 * per_element), 1e-12);
  EXPECT_NEAR(beta, 0.434, 1e-3);
  EXPECT_NEAR(CalibratedBeta(one, 1e11, 1.25e10).value(), beta / 10, 1e-12);
  EXPECT_NEAR(CalibratedBeta(one, 2e11, 1.25e9).value(), 2 * beta, 1e-12);
  // A GPT-2 block averages its four products by their FLOPs and elements.
  const double block = CalibratedBeta(GptBlockLayers(1024, 768), 1e11, 1.25e9).value();
  EXPECT_GT(block, 0.3);
  EXPECT_LT(block, 0.6);
  EXPECT_EQ(CalibratedBeta(one, 0, 1e9).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CalibratedBeta(one, 1e11, -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CalibratedBeta({}, 1e11, 1e9).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CalibratedBeta({{"bad", 0, 1, 1, Joiner::kRowwise}}, 1e11, 1e9).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain
