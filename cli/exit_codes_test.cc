#include "cli/exit_codes.h"

#include <csignal>
#include <set>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// The documented table (exit_codes.h, docs/operations.md), row by row.
TEST(ExitCodesTest, ExitCodeFor_EveryCanonicalCode_MatchesDocumentedTable) {
  EXPECT_EQ(ExitCodeFor(absl::StatusCode::kOk), 0);
  EXPECT_EQ(ExitCodeFor(absl::StatusCode::kCancelled), 65);
  EXPECT_EQ(ExitCodeFor(absl::StatusCode::kUnknown), 66);
  EXPECT_EQ(ExitCodeFor(absl::StatusCode::kInvalidArgument), 67);
  EXPECT_EQ(ExitCodeFor(absl::StatusCode::kDeadlineExceeded), 68);
  EXPECT_EQ(ExitCodeFor(absl::StatusCode::kNotFound), 69);
  EXPECT_EQ(ExitCodeFor(absl::StatusCode::kAlreadyExists), 70);
  EXPECT_EQ(ExitCodeFor(absl::StatusCode::kPermissionDenied), 71);
  EXPECT_EQ(ExitCodeFor(absl::StatusCode::kResourceExhausted), 72);
  EXPECT_EQ(ExitCodeFor(absl::StatusCode::kFailedPrecondition), 73);
  EXPECT_EQ(ExitCodeFor(absl::StatusCode::kAborted), 74);
  EXPECT_EQ(ExitCodeFor(absl::StatusCode::kOutOfRange), 75);
  EXPECT_EQ(ExitCodeFor(absl::StatusCode::kUnimplemented), 76);
  EXPECT_EQ(ExitCodeFor(absl::StatusCode::kInternal), 77);
  EXPECT_EQ(ExitCodeFor(absl::StatusCode::kUnavailable), 78);
  EXPECT_EQ(ExitCodeFor(absl::StatusCode::kDataLoss), 79);
  EXPECT_EQ(ExitCodeFor(absl::StatusCode::kUnauthenticated), 80);
}

TEST(ExitCodesTest, ExitCodeFor_Errors_DistinctAndClearOfTheFixedCodes) {
  std::set<int> seen = {kExitOk,
                        kExitJobNotSucceeded,
                        kExitUsage,
                        kExitFollowFailed,
                        kExitSignalBase + SIGINT,
                        kExitSignalBase + SIGTERM,
                        kExitSignalBase + SIGPIPE};
  for (int code = 1; code <= 16; ++code) {
    const int exit_code = ExitCodeFor(static_cast<absl::StatusCode>(code));
    EXPECT_TRUE(seen.insert(exit_code).second) << "code " << code << " exits " << exit_code;
    EXPECT_LT(exit_code, 126) << "126 and up mean 'not executable' and signals to shells";
  }
}

TEST(ExitCodesTest, ExitCodeFor_CodeOutsideCanonical_ExitsAsUnknown) {
  EXPECT_EQ(ExitCodeFor(static_cast<absl::StatusCode>(17)), 66);
  EXPECT_EQ(ExitCodeFor(static_cast<absl::StatusCode>(-1)), 66);
}

}  // namespace
}  // namespace pipetrain
