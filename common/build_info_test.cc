#include "common/build_info.h"

#include <regex>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(BuildInfoTest, GetBuildInfo_Stamped_HasVersionCommitAndDate) {
  const BuildInfo& info = GetBuildInfo();
  EXPECT_TRUE(std::regex_match(info.version, std::regex(R"(\d+\.\d+\.\d+)"))) << info.version;
  // Built from a checkout (CI clones one): an abbreviated commit; elsewhere "unknown".
  EXPECT_TRUE(std::regex_match(info.commit, std::regex("[0-9a-f]{7,40}|unknown"))) << info.commit;
  EXPECT_TRUE(std::regex_match(info.build_date, std::regex(R"(\d{4}-\d{2}-\d{2}|unknown)")))
      << info.build_date;
  EXPECT_EQ(&info, &GetBuildInfo());
}

TEST(BuildInfoTest, VersionLine_NamesProgramVersionCommitAndDate) {
  const BuildInfo& info = GetBuildInfo();
  EXPECT_EQ(VersionLine("pipetrain"), "pipetrain " + info.version + " (commit " + info.commit +
                                          ", built " + info.build_date + ")");
}

}  // namespace
}  // namespace pipetrain
