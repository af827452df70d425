// Temporary files beside the file they will replace: their names, and
// creating one so that nothing already there (a planted file, a symbolic
// link) is written through. Thread-safe.
#ifndef PIPETRAIN_COMMON_TEMP_FILE_H_
#define PIPETRAIN_COMMON_TEMP_FILE_H_

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace pipetrain {

// A temporary's name keeps at most this many bytes of the final name.
inline constexpr size_t kTempPrefixBytes = 200;

// A fresh name for a temporary of the file `name` in its directory,
// "<name>.tmp.<pid>.<n>" with at most the first kTempPrefixBytes of `name`
// (so any name up to NAME_MAX has one): <n> starts at a random 64-bit
// value and grows by one a call, so names repeat neither within a process
// nor across processes whose pids do (containers each pid 1 sharing a
// volume), and another user cannot plant a file under the next one.
std::string TempNameFor(const std::string& name);

// TempNameFor of `path`'s last component, in `path`'s directory.
std::string TempPathFor(const std::string& path);

// Creates `path`, which must not exist (not even as a symbolic link), with
// `mode` (less the umask) and writes `bytes` to it. On failure nothing is
// left at `path` that this call created. Errors: the errno's code naming
// `path` (ALREADY_EXISTS when something is there).
absl::Status WriteNewFile(const std::string& path, std::string_view bytes, mode_t mode);

// As WriteNewFile, for `name` relative to the directory `dir_fd` (AT_FDCWD:
// the working directory), and with `sync` the bytes reach the disk
// (fsync) before it returns OK. Errors name `name`.
absl::Status WriteNewFileAt(int dir_fd, const std::string& name, std::string_view bytes,
                            mode_t mode, bool sync = false);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_TEMP_FILE_H_
