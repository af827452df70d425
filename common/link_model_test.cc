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

}  // namespace
}  // namespace pipetrain
