// LinesWith: how many lines of a captured log hold a text. For tests that
// check what a component logged (::testing::internal::CaptureStderr), e.g.
// that a rate limit held.
#ifndef PIPETRAIN_COMMON_TESTING_LOG_LINES_H_
#define PIPETRAIN_COMMON_TESTING_LOG_LINES_H_

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace pipetrain {
namespace testing {

// The lines of `log` holding `text`.
inline int LinesWith(absl::string_view log, absl::string_view text) {
  int n = 0;
  for (const absl::string_view line : absl::StrSplit(log, '\n')) {
    if (absl::StrContains(line, text)) ++n;
  }
  return n;
}

}  // namespace testing
}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_TESTING_LOG_LINES_H_
