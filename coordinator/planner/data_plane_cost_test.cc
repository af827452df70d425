#include "coordinator/planner/data_plane_cost.h"

#include "coordinator/planner/acctfm.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

ClusterSpec Link(double bandwidth, double latency, bool emulated) {
  ClusterSpec c;
  c.bandwidth_bytes_per_second = bandwidth;
  c.latency_seconds = latency;
  c.links_emulated = emulated;
  c.data_plane_overhead_seconds = 100e-6;
  c.data_plane_bytes_per_second = 1.5e9;
  return c;
}

// One message of b bytes: the folded link's time against the sum of the
// link's and the (stretched) data plane's, as the header models it.
double MessageSeconds(const ClusterSpec& c, double bytes) {
  return c.latency_seconds + bytes / c.bandwidth_bytes_per_second;
}

TEST(AddDataPlaneCostTest, EmulatedLinksAddTheDataPlaneInSeries) {
  for (double s : {1.0, 2.0}) {
    ClusterSpec c = Link(0.125e9, 0.5e-3, /*emulated=*/true);
    AddDataPlaneCost(s, &c);
    for (double b : {4096.0, 262144.0, 1048576.0}) {
      const double expected = 0.5e-3 + b / 0.125e9 + s * (100e-6 + b / 1.5e9);
      EXPECT_NEAR(MessageSeconds(c, b), expected, expected * 1e-12) << "s " << s << " b " << b;
    }
  }
}

TEST(AddDataPlaneCostTest, RealLinksOverlapTheCopyWithTheWire) {
  // 10 Gbit/s (1.25 GB/s) under a 1.5 GB/s data plane: the wire limits.
  ClusterSpec c = Link(1.25e9, 50e-6, /*emulated=*/false);
  AddDataPlaneCost(1, &c);
  EXPECT_DOUBLE_EQ(c.bandwidth_bytes_per_second, 1.25e9);
  EXPECT_DOUBLE_EQ(c.latency_seconds, 150e-6);
  EXPECT_DOUBLE_EQ(c.per_message_seconds, 100e-6);  // of which o is serial per message
  // Shared cores halve the data plane's rate below the wire's.
  c = Link(1.25e9, 50e-6, false);
  AddDataPlaneCost(2, &c);
  EXPECT_DOUBLE_EQ(c.bandwidth_bytes_per_second, 0.75e9);
  EXPECT_DOUBLE_EQ(c.latency_seconds, 250e-6);
  EXPECT_DOUBLE_EQ(c.per_message_seconds, 200e-6);
  // An unlimited link (0) becomes the data plane's rate; with no latency
  // of its own, its latency is all per message.
  c = Link(0, 0, false);
  AddDataPlaneCost(1, &c);
  EXPECT_DOUBLE_EQ(c.bandwidth_bytes_per_second, 1.5e9);
  EXPECT_DOUBLE_EQ(c.latency_seconds, 100e-6);
  EXPECT_DOUBLE_EQ(c.per_message_seconds, 100e-6);
}

TEST(AddDataPlaneCostTest, UnmeasuredChangesNothing) {
  ClusterSpec c = Link(0.125e9, 0.5e-3, true);
  c.data_plane_overhead_seconds = 0;
  AddDataPlaneCost(2, &c);
  EXPECT_DOUBLE_EQ(c.bandwidth_bytes_per_second, 0.125e9);
  EXPECT_DOUBLE_EQ(c.latency_seconds, 0.5e-3);
  EXPECT_EQ(c.per_message_seconds, 0);
  EXPECT_EQ(DescribeDataPlaneCost(c, 2), "");
}

TEST(AddDataPlaneCostTest, EqThreeSeesTheFoldedLinkPerRingStep) {
  // A ring all-reduce of m bytes over n ranks: 2 (n - 1) steps of m / n
  // bytes, each paying the link and the data plane once.
  ClusterSpec c = Link(0.125e9, 0.5e-3, true);
  AddDataPlaneCost(2, &c);
  AllReduceModel model;
  model.alpha_seconds = c.latency_seconds;
  model.beta_seconds_per_byte = 1 / c.bandwidth_bytes_per_second;
  model.group_size = 4;
  const double m = 1 << 20;
  const double step = 0.5e-3 + m / 4 / 0.125e9 + 2 * (100e-6 + m / 4 / 1.5e9);
  EXPECT_NEAR(AllReduceSeconds(model, m).value(), 6 * step, 6 * step * 1e-12);
}

TEST(DescribeDataPlaneCostTest, SaysTheCostAndTheStretch) {
  const ClusterSpec c = Link(0.125e9, 0.5e-3, true);
  EXPECT_EQ(DescribeDataPlaneCost(c, 1), "; data plane 0.1 ms + 1.5 GB/s per message");
  EXPECT_EQ(DescribeDataPlaneCost(c, 2),
            "; data plane 0.1 ms + 1.5 GB/s per message (x2.00 on shared cores)");
}

}  // namespace
}  // namespace pipetrain
