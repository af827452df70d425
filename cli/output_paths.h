// Checks of the CLI's output-file flags, made before a command does its
// work, so that a bad path fails the command line (exit 2) instead of
// failing after a long run or after other output was written.
#ifndef PIPETRAIN_CLI_OUTPUT_PATHS_H_
#define PIPETRAIN_CLI_OUTPUT_PATHS_H_

#include <string>

#include "absl/status/status.h"

namespace pipetrain {

// OK when `path` is empty, or when the directory it lies in exists and can
// be written and `path` is not itself a directory. INVALID_ARGUMENT
// "<flag> <path>: the directory D does not exist" (or "is not a directory",
// "is not writable"), or "<flag> <path> is a directory; name a file".
absl::Status CheckWritableParent(const char* flag, const std::string& path);

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_OUTPUT_PATHS_H_
