// What this binary is: the release version and, stamped in by Bazel at build
// time (tools/workspace_status.sh, .bazelrc), the git commit it was built
// from and the build's UTC date. Shown by every binary's --version and
// exported as the pipetrain_build_info metric.
#ifndef PIPETRAIN_COMMON_BUILD_INFO_H_
#define PIPETRAIN_COMMON_BUILD_INFO_H_

#include <string>

namespace pipetrain {

struct BuildInfo {
  std::string version;     // the release, e.g. "0.1.0"
  std::string commit;      // abbreviated git commit; "unknown" when not built from a checkout
  std::string build_date;  // YYYY-MM-DD (UTC); "unknown" when not stamped
};

// The stamped values; the same object for the life of the process.
// Thread-safe.
const BuildInfo& GetBuildInfo();

// "<program> <version> (commit <commit>, built <date>)", one line without a
// newline: what --version prints.
std::string VersionLine(const std::string& program);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_BUILD_INFO_H_
