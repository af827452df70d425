#include "coordinator/planner/tensor_parallel_lanes.h"

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(PassSecondsTest, AccTfmTimelineOfOneUnit) {
  // Compute 5 ms, all-reduce 4 ms per half: 2.5, then the first reduce to
  // 6.5 while the second half computes (to 5), the second reduce to 10.5.
  EXPECT_NEAR(PassSeconds({0.005, 2, 0.004}), 0.0105, 1e-12);
  EXPECT_NEAR(PassSeconds({0.005, 1, 0.008}), 0.013, 1e-12);
  // Compute-bound: 4 quarters of 2.5 ms, reduces of 1 ms hide behind the
  // next quarter; only the last one shows.
  EXPECT_NEAR(PassSeconds({0.010, 4, 0.001}), 0.011, 1e-12);
  EXPECT_NEAR(PassSeconds({0.010, 4, 0}), 0.010, 1e-12);  // no all-reduce
}

// A worker running forward [1, 3) then backward [1, 3) of one micro-batch at
// half speed (its events twice the passes), and an optimizer step.
TEST(AddTensorParallelLanesTest, AllReducesPlacedInsideTheirUnitsScaledToTheEvent) {
  std::vector<TensorParallelUnitLanes> lanes(3);
  lanes[1].forward = {0.005, 2, 0.004};   // 10.5 ms
  lanes[2].forward = {0.002, 1, 0.001};   // 3 ms
  lanes[1].backward = {0.010, 1, 0.002};  // 12 ms
  lanes[2].backward = {0.004, 1, 0};      // 4 ms, nothing to reduce
  SimulationResult result;
  result.busy_seconds = {0.059};
  result.iteration_seconds = 0.06;
  TimelineEvent f{0, TimelineEventKind::kForward, 0, 0.027, 3, Range{1, 3}};
  TimelineEvent b{0, TimelineEventKind::kBackward, 0.027, 0.059, 3, Range{1, 3}};
  b.instruction = 1;
  TimelineEvent o{0, TimelineEventKind::kOptimizer, 0.059, 0.06, -1, Range{1, 3}};
  o.instruction = 2;
  result.events = {f, b, o};
  AddTensorParallelLanes(lanes, &result);
  std::vector<TimelineEvent> reduces;
  for (const TimelineEvent& e : result.events) {
    if (e.kind == TimelineEventKind::kTensorParallelAllReduce) reduces.push_back(e);
  }
  ASSERT_EQ(reduces.size(), 4u);  // unit 1 twice, unit 2 once, backward unit 1 once
  // Forward at scale 2: unit 1's halves reduce over [5, 13] and [13, 21] ms,
  // unit 2 (from 21) after its 4 ms of compute: [25, 27].
  EXPECT_NEAR(reduces[0].start_seconds, 0.005, 1e-12);
  EXPECT_NEAR(reduces[0].end_seconds, 0.013, 1e-12);
  EXPECT_NEAR(reduces[1].start_seconds, 0.013, 1e-12);
  EXPECT_NEAR(reduces[1].end_seconds, 0.021, 1e-12);
  EXPECT_EQ(reduces[1].units.begin, 1);
  EXPECT_NEAR(reduces[2].start_seconds, 0.025, 1e-12);
  EXPECT_NEAR(reduces[2].end_seconds, 0.027, 1e-12);
  EXPECT_EQ(reduces[2].units.begin, 2);
  // Backward runs unit 2 first (8 ms at scale 2), then unit 1: 20 ms of
  // compute, its reduce [55, 59] ms.
  EXPECT_NEAR(reduces[3].start_seconds, 0.027 + 0.008 + 0.020, 1e-12);
  EXPECT_NEAR(reduces[3].end_seconds, 0.059, 1e-12);
  EXPECT_EQ(reduces[3].micro_batch, 3);
  // Still sorted by (worker, start, instruction).
  for (size_t i = 1; i < result.events.size(); ++i) {
    EXPECT_LE(result.events[i - 1].start_seconds, result.events[i].start_seconds);
  }
  EXPECT_EQ(std::string(TimelineEventKindName(reduces[0].kind)), "tp-all-reduce");
}

// Three micro-batches whose forward each adds two all-reduces: a budget of
// five draws the first two whole, one draws none.
TEST(AddTensorParallelLanesTest, DrawsAsManyWholeMicroBatchesAsTheBudgetHolds) {
  std::vector<TensorParallelUnitLanes> lanes(1);
  lanes[0].forward = {0.004, 2, 0.001};
  SimulationResult base;
  for (int m = 0; m < 3; ++m) {
    TimelineEvent f{0, TimelineEventKind::kForward, 0.01 * m, 0.01 * m + 0.005, m, Range{0, 1}};
    f.instruction = m;
    base.events.push_back(f);
  }
  const auto reduces_of = [](const SimulationResult& r) {
    std::vector<int> micro_batches;
    for (const TimelineEvent& e : r.events) {
      if (e.kind == TimelineEventKind::kTensorParallelAllReduce) {
        micro_batches.push_back(e.micro_batch);
      }
    }
    return micro_batches;
  };
  SimulationResult all = base;
  TensorParallelLanesDrawn drawn = AddTensorParallelLanes(lanes, &all);
  EXPECT_EQ(drawn.micro_batches_drawn, 3);
  EXPECT_EQ(drawn.micro_batches, 3);
  EXPECT_EQ(reduces_of(all), (std::vector<int>{0, 0, 1, 1, 2, 2}));

  SimulationResult capped = base;
  drawn = AddTensorParallelLanes(lanes, &capped, 5);
  EXPECT_EQ(drawn.micro_batches_drawn, 2);
  EXPECT_EQ(drawn.micro_batches, 3);
  EXPECT_EQ(reduces_of(capped), (std::vector<int>{0, 0, 1, 1}));

  SimulationResult none = base;
  drawn = AddTensorParallelLanes(lanes, &none, 1);
  EXPECT_EQ(drawn.micro_batches_drawn, 0);
  EXPECT_TRUE(reduces_of(none).empty());
  EXPECT_EQ(none.events.size(), 3u);
}

}  // namespace
}  // namespace pipetrain
