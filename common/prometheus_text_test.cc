#include "common/prometheus_text.h"

#include <cmath>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(ParsePrometheusText, SamplesWithAndWithoutLabels_Parsed) {
  auto samples = ParsePrometheusText(
      "# HELP pipetrain_link_bytes_total Bytes\n"
      "# TYPE pipetrain_link_bytes_total counter\n"
      "pipetrain_link_bytes_total{encoding=\"raw\",kind=\"ACTIVATION\",peer=\"1\"} 1048576\n"
      "\n"
      "pipetrain_stage_loss 2.5e-01\n"
      "up{job=\"x\"} +Inf\n");
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 3u);
  EXPECT_EQ((*samples)[0].name, "pipetrain_link_bytes_total");
  EXPECT_EQ((*samples)[0].labels.at("encoding"), "raw");
  EXPECT_EQ((*samples)[0].labels.at("kind"), "ACTIVATION");
  EXPECT_EQ((*samples)[0].labels.at("peer"), "1");
  EXPECT_EQ((*samples)[0].value, 1048576);
  EXPECT_EQ((*samples)[1].name, "pipetrain_stage_loss");
  EXPECT_TRUE((*samples)[1].labels.empty());
  EXPECT_EQ((*samples)[1].value, 0.25);
  EXPECT_TRUE(std::isinf((*samples)[2].value));
}

TEST(ParsePrometheusText, MalformedLine_InvalidArgumentWithLineNumber) {
  auto samples = ParsePrometheusText("ok 1\nbroken{kind=\"x} 2\n");
  EXPECT_EQ(samples.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(samples.status().message().find("line 2"), std::string::npos);
  EXPECT_EQ(ParsePrometheusText("novalue\n").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParsePrometheusText("x notanumber\n").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain
