#include "common/link_model.h"

#include <string>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(ParseLinkModelTest, UnitsAndErrors) {
  auto m = ParseLinkModel("--emulate-link", "10Gbit,50us").value();
  ASSERT_TRUE(m.has_value());
  EXPECT_DOUBLE_EQ(m->bandwidth_bytes_per_second, 1.25e9);
  EXPECT_EQ(m->latency, absl::Microseconds(50));
  EXPECT_DOUBLE_EQ(ParseLinkModel("f", "1gbit,0.5ms").value()->bandwidth_bytes_per_second, 1.25e8);
  EXPECT_DOUBLE_EQ(ParseLinkModel("f", "125MB,1ms").value()->bandwidth_bytes_per_second, 1.25e8);
  EXPECT_FALSE(ParseLinkModel("f", "").value().has_value());
  EXPECT_DOUBLE_EQ(ParseLinkModel("f", "0.008Mbit,0s").value()->bandwidth_bytes_per_second, 1000);
  for (const char* bad : {"10,50us", "10Gbit", "0Gbit,1ms", "1Gbit,-1ms", "1Gbit,1 parsec",
                          "xGbit,1ms", "1Gbit,20s", "1e-300Gbit,1ms", "0.001Mbit,0s"}) {
    const absl::Status s = ParseLinkModel("--emulate-link", bad).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("--emulate-link"), std::string::npos) << s;
  }
}

// "Gb" reads as gigabits to some and gigabytes to others: bits take "bit"
// in any case, bytes an upper-case B, and the rest is refused.
TEST(ParseLinkModelTest, BitsOrBytes_AmbiguousUnitRefused) {
  EXPECT_DOUBLE_EQ(ParseLinkModel("f", "10Gbit,50us").value()->bandwidth_bytes_per_second, 1.25e9);
  EXPECT_DOUBLE_EQ(ParseLinkModel("f", "10gbit,50us").value()->bandwidth_bytes_per_second, 1.25e9);
  EXPECT_DOUBLE_EQ(ParseLinkModel("f", "10GBIT,50us").value()->bandwidth_bytes_per_second, 1.25e9);
  EXPECT_DOUBLE_EQ(ParseLinkModel("f", "100MBit,1ms").value()->bandwidth_bytes_per_second, 1.25e7);
  EXPECT_DOUBLE_EQ(ParseLinkModel("f", "10GB,50us").value()->bandwidth_bytes_per_second, 1e10);
  EXPECT_DOUBLE_EQ(ParseLinkModel("f", "125MB,1ms").value()->bandwidth_bytes_per_second, 1.25e8);
  for (const char* bad : {"10Gb,50us", "10gb,50us", "100Mb,1ms", "100mb,1ms", "10gB,50us"}) {
    const absl::Status s = ParseLinkModel("--network", bad).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("--network"), std::string::npos) << s;
    EXPECT_NE(s.message().find("write 10Gbit for gigabits or 10GB for gigabytes"),
              std::string::npos)
        << s;
  }
}

// Placement reads a worker's bandwidth above the cap as "not emulated", so
// the flag refuses what the planner would ignore.
TEST(ParseLinkModelTest, AboveCap_Refused) {
  EXPECT_EQ(kMaxLinkBandwidthBytesPerSecond, 1e13);
  EXPECT_DOUBLE_EQ(ParseLinkModel("f", "80000Gbit,0s").value()->bandwidth_bytes_per_second, 1e13);
  EXPECT_DOUBLE_EQ(ParseLinkModel("f", "10000GB,0s").value()->bandwidth_bytes_per_second, 1e13);
  // Beyond the old cap of 1e6 units, within the byte bound.
  EXPECT_DOUBLE_EQ(ParseLinkModel("f", "1e7Mbit,0s").value()->bandwidth_bytes_per_second, 1.25e12);
  for (const char* bad : {"100000Gbit,0s", "10001GB,0s", "1e300GB,0s", "infGbit,0s"}) {
    const absl::Status s = ParseLinkModel("--emulate-link", bad).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("at most 1e13 bytes/s"), std::string::npos) << bad << ": " << s;
  }
}

}  // namespace
}  // namespace pipetrain
