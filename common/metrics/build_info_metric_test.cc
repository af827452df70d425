#include "common/metrics/build_info_metric.h"

#include "common/build_info.h"
#include "common/metrics/metrics_testing.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(AddBuildInfo, Registry_OneSeriesAtOneWithVersionAndCommit) {
  prometheus::Registry registry;
  AddBuildInfo(registry);
  const BuildInfo& build = GetBuildInfo();
  EXPECT_FALSE(build.version.empty());
  EXPECT_EQ(testing::SeriesValue(registry, "pipetrain_build_info",
                                 {{"version", build.version}, {"commit", build.commit}}),
            1.0);
}

}  // namespace
}  // namespace pipetrain
