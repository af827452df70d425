#include "coordinator/planner/partition.h"

#include <functional>
#include <limits>

#include "common/philox.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

std::vector<UnitCost> RandomCosts(int n, uint64_t seed) {
  std::vector<UnitCost> costs;
  for (int i = 0; i < n; ++i) {
    costs.push_back({"u", double(1 + UniformIndex(seed, i, 0, 0, 20)),
                     double(1 + UniformIndex(seed, i, 1, 0, 40))});
  }
  return costs;
}

// Enumerates every placement of stages-1 cuts: the naive model the DP must match.
double BruteForceBottleneck(const std::vector<UnitCost>& costs, int stages) {
  const int n = static_cast<int>(costs.size());
  double best = std::numeric_limits<double>::infinity();
  std::vector<Range> ranges;
  std::function<void(int, int)> place = [&](int begin, int left) {
    if (left == 1) {
      ranges.push_back({begin, n});
      best = std::min(best, BottleneckCost(costs, ranges));
      ranges.pop_back();
      return;
    }
    for (int end = begin + 1; end <= n - (left - 1); ++end) {
      ranges.push_back({begin, end});
      place(end, left - 1);
      ranges.pop_back();
    }
  };
  place(0, stages);
  return best;
}

// 500 random instances (<= 10 units): the DP equals brute force over every
// equal-cut partition with non-empty stages.
TEST(PartitionTest, PipeDream_MatchesBruteForceOnRandomInstances) {
  for (uint64_t seed = 1; seed <= 500; ++seed) {
    const int n = 1 + static_cast<int>(UniformIndex(seed, 0, 9, 0, 10));
    const int stages = 1 + static_cast<int>(UniformIndex(seed, 1, 9, 0, n));
    const auto costs = RandomCosts(n, seed);
    auto ranges = PipeDreamPartition(costs, stages);
    ASSERT_TRUE(ranges.ok()) << ranges.status();
    ASSERT_EQ(ranges->size(), size_t(stages));
    int next = 0;
    for (const Range& r : *ranges) {  // contiguous, non-empty, covering
      EXPECT_EQ(r.begin, next);
      EXPECT_GT(r.end, r.begin);
      next = r.end;
    }
    EXPECT_EQ(next, n);
    EXPECT_EQ(BottleneckCost(costs, *ranges), BruteForceBottleneck(costs, stages))
        << "seed " << seed << " n " << n << " stages " << stages;
  }
}

// The speed-aware objective written out here, not the solver's: the most
// any stage takes, its units' fwd + bwd over its worker's speed, or the
// transfer at its end cut (the activation forward and its gradient back:
// 2 x the last unit's output over the bandwidth; none after the last
// stage, none on an unlimited link).
double WrittenOutBottleneck(const std::vector<UnitCost>& costs, const std::vector<double>& speeds,
                            const std::vector<double>& activations, double bandwidth,
                            const std::vector<Range>& ranges) {
  double worst = 0;
  for (size_t k = 0; k < ranges.size(); ++k) {
    double compute = 0;
    for (int u = ranges[k].begin; u < ranges[k].end; ++u)
      compute += costs[u].forward + costs[u].backward;
    worst = std::max(worst, compute / speeds[k]);
    if (ranges[k].end < static_cast<int>(costs.size()) && bandwidth > 0) {
      worst = std::max(worst, 2 * activations[ranges[k].end - 1] / bandwidth);
    }
  }
  return worst;
}

// Speed-aware pipedream against brute force: 500 random instances with
// mixed speeds, activation sizes and bandwidths (some unlimited), scored
// by the objective written out above.
TEST(PartitionTest, SpeedAwarePipeDream_MatchesBruteForceOnRandomInstances) {
  const double speed_choices[] = {0.5, 1, 2, 3};
  for (uint64_t seed = 1; seed <= 500; ++seed) {
    const int n = 1 + static_cast<int>(UniformIndex(seed, 0, 9, 0, 9));
    const int stages = 1 + static_cast<int>(UniformIndex(seed, 1, 9, 0, n));
    const auto costs = RandomCosts(n, seed);
    std::vector<double> speeds, activations;
    for (int k = 0; k < stages; ++k)
      speeds.push_back(speed_choices[UniformIndex(seed, k, 2, 0, 4)]);
    for (int u = 0; u < n; ++u) activations.push_back(double(UniformIndex(seed, u, 3, 0, 100)));
    const double bandwidth = UniformIndex(seed, 0, 4, 0, 3) == 0 ? 0.0 : 4.0;
    auto ranges = SpeedAwarePipeDreamPartition(costs, speeds, activations, bandwidth);
    ASSERT_TRUE(ranges.ok()) << ranges.status();
    double best = std::numeric_limits<double>::infinity();
    std::vector<Range> candidate;
    std::function<void(int, int)> place = [&](int begin, int left) {
      if (left == 1) {
        candidate.push_back({begin, n});
        best =
            std::min(best, WrittenOutBottleneck(costs, speeds, activations, bandwidth, candidate));
        candidate.pop_back();
        return;
      }
      for (int end = begin + 1; end <= n - (left - 1); ++end) {
        candidate.push_back({begin, end});
        place(end, left - 1);
        candidate.pop_back();
      }
    };
    place(0, stages);
    EXPECT_EQ(WrittenOutBottleneck(costs, speeds, activations, bandwidth, *ranges), best)
        << "seed " << seed << " n " << n << " stages " << stages;
    EXPECT_EQ(SpeedAwareBottleneck(costs, speeds, activations, bandwidth, *ranges), best)
        << "seed " << seed << " n " << n << " stages " << stages;
  }
}

// A slow link moves the cut: four equal units (3 s each) on two workers;
// unit 1's output is large (1000 bytes at 10 B/s: 200 s there and back),
// the others' empty. The even cut after unit 1 costs 200 s; either cut
// beside it 9 s.
TEST(PartitionTest, SpeedAwarePipeDream_SlowLink_CutAvoidsTheLargeActivation) {
  const std::vector<UnitCost> costs(4, UnitCost{"u", 1, 2});
  const std::vector<double> activations = {0, 1000, 0, 0};
  const auto ranges = SpeedAwarePipeDreamPartition(costs, {1.0, 1.0}, activations, 10).value();
  ASSERT_EQ(ranges.size(), 2u);
  EXPECT_NE(ranges[0].end, 2);
  EXPECT_EQ(WrittenOutBottleneck(costs, {1.0, 1.0}, activations, 10, ranges), 9);
  // Unlimited, the even cut is the best.
  EXPECT_EQ(SpeedAwarePipeDreamPartition(costs, {1.0, 1.0}, activations, 0).value()[0].end, 2);
}

// Equal speeds and unlimited links: the speed-blind pipedream's optimum.
TEST(PartitionTest, SpeedAwarePipeDream_EqualSpeedsNoLinks_IsPipeDream) {
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    const int n = 1 + static_cast<int>(UniformIndex(seed, 0, 9, 0, 10));
    const int stages = 1 + static_cast<int>(UniformIndex(seed, 1, 9, 0, n));
    const auto costs = RandomCosts(n, seed);
    const auto aware = SpeedAwarePipeDreamPartition(costs, std::vector<double>(stages, 1.0),
                                                    std::vector<double>(n, 1.0), 0)
                           .value();
    EXPECT_EQ(BottleneckCost(costs, aware),
              BottleneckCost(costs, PipeDreamPartition(costs, stages).value()));
  }
}

// A worker twice as fast gets about twice the work.
TEST(PartitionTest, SpeedAwarePipeDream_FastWorkerTakesMore) {
  const std::vector<UnitCost> costs(6, UnitCost{"u", 1, 2});
  const auto ranges =
      SpeedAwarePipeDreamPartition(costs, {1.0, 2.0}, std::vector<double>(6, 0), 0).value();
  EXPECT_EQ(ranges[0].end, 2);  // 2 units (6 s) on the slow one, 4 (12 s / 2) on the fast one
}

TEST(PartitionTest, PipeDream_HeavyUnitGetsItsOwnStage) {
  std::vector<UnitCost> costs = {{"a", 1, 1}, {"b", 1, 1}, {"c", 30, 30}, {"d", 1, 1}};
  auto ranges = PipeDreamPartition(costs, 3).value();
  EXPECT_EQ(ranges, (std::vector<Range>{{0, 2}, {2, 3}, {3, 4}}));
}

TEST(PartitionTest, Uniform_SpreadsTheRemainderOverTheFirstStages) {
  EXPECT_EQ(UniformPartition(6, 4).value(),
            (std::vector<Range>{{0, 2}, {2, 4}, {4, 5}, {5, 6}}));
  EXPECT_EQ(UniformPartition(6, 1).value(), (std::vector<Range>{{0, 6}}));
  EXPECT_EQ(UniformPartition(3, 3).value(), (std::vector<Range>{{0, 1}, {1, 2}, {2, 3}}));
}

TEST(PartitionTest, MoreStagesThanUnits_IsInvalidArgument) {
  auto uniform = UniformPartition(6, 7);
  EXPECT_EQ(uniform.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(uniform.status().message(), "7 stages for 6 units; need 1 <= stages <= units");
  EXPECT_EQ(PipeDreamPartition(RandomCosts(3, 1), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Costs whose sums are infinite leave the DPs without a finite optimum:
// refused, where the backtrack read cut[-1].
TEST(PartitionTest, InfiniteCostSums_AreInvalidArgument) {
  const std::vector<UnitCost> costs = {{"a", 1e308, 1e308}, {"b", 1e308, 1e308}};
  EXPECT_EQ(PipeDreamPartition(costs, 2).status().code(), absl::StatusCode::kInvalidArgument);
  const absl::StatusOr<std::vector<Range>> aware =
      SpeedAwarePipeDreamPartition(costs, {1.0, 1.0}, {0.0, 0.0}, 0.0);
  EXPECT_EQ(aware.status().code(), absl::StatusCode::kInvalidArgument) << aware.status();
}

TEST(UnitCostsTest, AnalyticCosts_OrderUnitsAsExpected) {
  GptConfig c;
  c.n_layer = 2;
  c.d_model = 128;
  c.n_head = 4;
  c.vocab_size = 256;
  auto costs = AnalyticUnitCosts(c, 64, 4);
  ASSERT_EQ(costs.size(), 6u);
  EXPECT_EQ(costs[1].name, "attn_0");
  EXPECT_GT(costs[2].total(), costs[1].total());  // MLP (16 d^2) > attention at T=64
  EXPECT_LT(costs[0].total(), costs[5].total());  // lookup is cheap next to the LM head
  EXPECT_EQ(costs[3].backward, 2 * costs[3].forward);
}

}  // namespace
}  // namespace pipetrain
