#include "coordinator/planner/tensor_parallel_lanes.h"

#include <string>
#include <utility>
#include <vector>

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

std::vector<TimelineEvent> AllReducesOf(const SimulationResult& result) {
  std::vector<TimelineEvent> reduces;
  for (const TimelineEvent& e : result.events) {
    if (e.kind == TimelineEventKind::kTensorParallelAllReduce) reduces.push_back(e);
  }
  return reduces;
}

// A worker at half the groups' speed running forward [1, 3) then backward
// [1, 3) of one micro-batch, and an optimizer step. Its events are what
// the simulator charges: compute x 2 plus the waits (PassSeconds less the
// compute), forward 2 x 7 + 6.5 ms, backward 2 x 14 + 2 ms.
TEST(AddTensorParallelLanesTest, AllReducesPlacedInsideTheirUnitsComputeAtTheWorkersSpeed) {
  std::vector<TensorParallelUnitLanes> lanes(3);
  lanes[1].forward = {0.005, 2, 0.004};   // 10.5 ms
  lanes[2].forward = {0.002, 1, 0.001};   // 3 ms
  lanes[1].backward = {0.010, 1, 0.002};  // 12 ms
  lanes[2].backward = {0.004, 1, 0};      // 4 ms, nothing to reduce
  SimulationResult result;
  result.busy_seconds = {0.0515};
  result.iteration_seconds = 0.0515;
  TimelineEvent f{0, TimelineEventKind::kForward, 0, 0.0205, 3, Range{1, 3}};
  TimelineEvent b{0, TimelineEventKind::kBackward, 0.0205, 0.0505, 3, Range{1, 3}};
  b.instruction = 1;
  TimelineEvent o{0, TimelineEventKind::kOptimizer, 0.0505, 0.0515, -1, Range{1, 3}};
  o.instruction = 2;
  result.events = {f, b, o};
  AddTensorParallelLanes(lanes, &result);
  const std::vector<TimelineEvent> reduces = AllReducesOf(result);
  ASSERT_EQ(reduces.size(), 4u);  // unit 1 twice, unit 2 once, backward unit 1 once
  // Forward: unit 1's halves compute 5 ms each and reduce over [5, 9] and
  // [10, 14] ms; unit 2 (not streamed: from 14) after its 4 ms of
  // compute: [18, 19].
  EXPECT_NEAR(reduces[0].start_seconds, 0.005, 1e-12);
  EXPECT_NEAR(reduces[0].end_seconds, 0.009, 1e-12);
  EXPECT_NEAR(reduces[1].start_seconds, 0.010, 1e-12);
  EXPECT_NEAR(reduces[1].end_seconds, 0.014, 1e-12);
  EXPECT_EQ(reduces[1].units.begin, 1);
  EXPECT_NEAR(reduces[2].start_seconds, 0.018, 1e-12);
  EXPECT_NEAR(reduces[2].end_seconds, 0.019, 1e-12);
  EXPECT_EQ(reduces[2].units.begin, 2);
  // Backward runs unit 2 first (8 ms), then unit 1: 20 ms of compute, its
  // reduce of 2 ms to the event's end.
  EXPECT_NEAR(reduces[3].start_seconds, 0.0205 + 0.008 + 0.020, 1e-12);
  EXPECT_NEAR(reduces[3].end_seconds, 0.0505, 1e-12);
  EXPECT_EQ(reduces[3].micro_batch, 3);
  // Still sorted by (worker, start, instruction).
  for (size_t i = 1; i < result.events.size(); ++i) {
    EXPECT_LE(result.events[i - 1].start_seconds, result.events[i].start_seconds);
  }
  EXPECT_EQ(std::string(TimelineEventKindName(reduces[0].kind)), "tp-all-reduce");
}

// Two block units {compute 5 ms, 2 partitions, all-reduce 4 ms} streamed
// into each other: tensor_partitions' charges are 10.5 and 8 ms, so the
// forward box is 18.5 ms. One chain: unit 2's first half computes under
// unit 1's second reduce and its reduces queue behind it, [10.5, 14.5]
// and [14.5, 18.5] (unit by unit alone they would run to 21 ms).
TEST(AddTensorParallelLanesTest, StreamedUnits_OneChainWithinTheBoxNoOverlap) {
  std::vector<TensorParallelUnitLanes> lanes(2);
  lanes[0].forward = {0.005, 2, 0.004, 0.0105};
  lanes[1].forward = {0.005, 2, 0.004, 0.008};
  // At the groups' speed, and at twice it: 0.5 x 10 ms of compute plus
  // 8.5 ms of waits, 13.5 ms, shorter than the chain's 17.25 ms (16 ms of
  // all-reduces alone), so drawn scaled to fit.
  for (const double box : {0.0185, 0.0135}) {
    SimulationResult result;
    result.busy_seconds = {box};
    result.iteration_seconds = box;
    result.events = {TimelineEvent{0, TimelineEventKind::kForward, 0, box, 0, Range{0, 2}}};
    AddTensorParallelLanes(lanes, &result);
    const std::vector<TimelineEvent> reduces = AllReducesOf(result);
    ASSERT_EQ(reduces.size(), 4u);
    for (size_t i = 0; i < reduces.size(); ++i) {
      EXPECT_LE(reduces[i].end_seconds, box) << i;
      EXPECT_LT(reduces[i].start_seconds, reduces[i].end_seconds) << i;
      if (i > 0) EXPECT_LE(reduces[i - 1].end_seconds, reduces[i].start_seconds) << i;
    }
    if (box != 0.0185) continue;
    const std::vector<std::pair<double, double>> want = {
        {0.0025, 0.0065}, {0.0065, 0.0105}, {0.0105, 0.0145}, {0.0145, 0.0185}};
    for (size_t i = 0; i < reduces.size(); ++i) {
      EXPECT_NEAR(reduces[i].start_seconds, want[i].first, 1e-12) << i;
      EXPECT_NEAR(reduces[i].end_seconds, want[i].second, 1e-12) << i;
      EXPECT_EQ(reduces[i].units.begin, static_cast<int>(i / 2));
    }
  }
}

// Compute-bound streamed units {10 ms, 2 partitions, all-reduce 2 ms},
// charged 12 and 10 ms (10 ms of compute each, 2 ms of waits): at twice
// the groups' speed the box is 0.5 x 20 + 2 = 12 ms. The halves compute
// 2.5 ms each, and the all-reduces keep their 2 ms.
TEST(AddTensorParallelLanesTest, FasterPosition_ComputeScaledAllReducesKeepTheirLength) {
  std::vector<TensorParallelUnitLanes> lanes(2);
  lanes[0].forward = {0.010, 2, 0.002, 0.012};
  lanes[1].forward = {0.010, 2, 0.002, 0.010};
  SimulationResult result;
  result.busy_seconds = {0.012};
  result.iteration_seconds = 0.012;
  result.events = {TimelineEvent{0, TimelineEventKind::kForward, 0, 0.012, 0, Range{0, 2}}};
  AddTensorParallelLanes(lanes, &result);
  const std::vector<TimelineEvent> reduces = AllReducesOf(result);
  ASSERT_EQ(reduces.size(), 4u);
  const std::vector<std::pair<double, double>> want = {
      {0.0025, 0.0045}, {0.005, 0.007}, {0.0075, 0.0095}, {0.010, 0.012}};
  for (size_t i = 0; i < reduces.size(); ++i) {
    EXPECT_NEAR(reduces[i].start_seconds, want[i].first, 1e-12) << i;
    EXPECT_NEAR(reduces[i].end_seconds, want[i].second, 1e-12) << i;
  }
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
