#include "common/build_identity.h"

#include "absl/strings/str_cat.h"

namespace pipetrain {

bool CommitKnown(const std::string& commit) { return !commit.empty() && commit != kUnknownCommit; }

v1::BuildIdentity ToBuildIdentity(const BuildInfo& info) {
  v1::BuildIdentity build;
  build.set_version(info.version);
  build.set_commit(info.commit);
  return build;
}

v1::BuildIdentity ThisBuild() { return ToBuildIdentity(GetBuildInfo()); }

bool SameBuild(const v1::BuildIdentity& a, const v1::BuildIdentity& b) {
  if (a.version() != b.version()) return false;
  if (!CommitKnown(a.commit()) || !CommitKnown(b.commit())) return true;
  if (a.commit().size() >= kStampedCommitDigits && b.commit().size() >= kStampedCommitDigits) {
    return a.commit().compare(0, kStampedCommitDigits, b.commit(), 0, kStampedCommitDigits) == 0;
  }
  return a.commit() == b.commit();
}

std::string DescribeBuild(const v1::BuildIdentity& build) {
  if (build.version().empty() && build.commit().empty()) return "none";
  return absl::StrCat(build.version().empty() ? "(no version)" : build.version(), " (commit ",
                      CommitKnown(build.commit()) ? build.commit() : kUnknownCommit, ")");
}

}  // namespace pipetrain
