#include "common/build_identity.h"

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

v1::BuildIdentity Build(const std::string& version, const std::string& commit) {
  v1::BuildIdentity build;
  build.set_version(version);
  build.set_commit(commit);
  return build;
}

TEST(BuildIdentityTest, ThisBuild_IsWhatVersionPrints) {
  const v1::BuildIdentity build = ThisBuild();
  EXPECT_EQ(build.version(), GetBuildInfo().version);
  EXPECT_EQ(build.commit(), GetBuildInfo().commit);
  EXPECT_FALSE(build.version().empty());
  EXPECT_TRUE(SameBuild(build, build));
}

TEST(BuildIdentityTest, SameBuild_VersionAndKnownCommitsMustMatch) {
  EXPECT_TRUE(SameBuild(Build("0.1.0", "3635b2d1a2b3"), Build("0.1.0", "3635b2d1a2b3")));
  EXPECT_FALSE(SameBuild(Build("0.1.0", "3635b2d1a2b3"), Build("0.1.0", "1c20cae00000")));
  EXPECT_FALSE(SameBuild(Build("0.1.0", "3635b2d1a2b3"), Build("0.2.0", "3635b2d1a2b3")));
  // The first 12 digits decide (git may print more where 12 are
  // ambiguous); a shorter abbreviation is not expanded.
  EXPECT_TRUE(SameBuild(Build("0.1.0", "3635b2d1a2b3f0"), Build("0.1.0", "3635b2d1a2b3")));
  EXPECT_FALSE(SameBuild(Build("0.1.0", "3635b2d1a2b4f0"), Build("0.1.0", "3635b2d1a2b3")));
  EXPECT_FALSE(SameBuild(Build("0.1.0", "3635b2d"), Build("0.1.0", "3635b2d1a2b3")));
}

TEST(BuildIdentityTest, CommitKnown_NeitherEmptyNorUnknown) {
  EXPECT_TRUE(CommitKnown("3635b2d1a2b3"));
  EXPECT_FALSE(CommitKnown(""));
  EXPECT_FALSE(CommitKnown(kUnknownCommit));
}

TEST(BuildIdentityTest, SameBuild_UnknownCommitComparesTheVersionOnly) {
  for (const std::string unknown : {"", "unknown"}) {
    EXPECT_TRUE(SameBuild(Build("0.1.0", unknown), Build("0.1.0", "3635b2d1a2b3"))) << unknown;
    EXPECT_TRUE(SameBuild(Build("0.1.0", "3635b2d1a2b3"), Build("0.1.0", unknown))) << unknown;
    EXPECT_FALSE(SameBuild(Build("0.2.0", unknown), Build("0.1.0", "3635b2d1a2b3"))) << unknown;
  }
}

TEST(BuildIdentityTest, AbsentBuild_MatchesNoRelease) {
  EXPECT_FALSE(SameBuild(v1::BuildIdentity(), Build("0.1.0", "unknown")));
  EXPECT_FALSE(SameBuild(Build("0.1.0", "unknown"), v1::BuildIdentity()));
}

TEST(BuildIdentityTest, DescribeBuild_NamesVersionAndCommit) {
  EXPECT_EQ(DescribeBuild(Build("0.1.0", "3635b2d1a2b3")), "0.1.0 (commit 3635b2d1a2b3)");
  EXPECT_EQ(DescribeBuild(Build("0.1.0", "")), "0.1.0 (commit unknown)");
  EXPECT_EQ(DescribeBuild(Build("", "abc")), "(no version) (commit abc)");
  EXPECT_EQ(DescribeBuild(v1::BuildIdentity()), "none");
}

}  // namespace
}  // namespace pipetrain
