// Reading a whole small input file a user names (a job spec, a model
// profile, a cluster description) without trusting what the path is: a
// FIFO would block the reader forever, /dev/zero would grow it without end,
// and a directory reads as an empty file with a parser's puzzling message.
#ifndef PIPETRAIN_COMMON_BOUNDED_FILE_H_
#define PIPETRAIN_COMMON_BOUNDED_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain {

// The contents of the regular file `path`, of at most `max_bytes` bytes.
// `what` names the file in messages ("job spec", "profile").
// Errors:
//   NOT_FOUND "cannot read <what> <path>: No such file or directory" (and
//     the other errno-mapped codes of open and read, e.g. PERMISSION_DENIED);
//   INVALID_ARGUMENT "<what> <path> is not a regular file (a directory,
//     FIFO, socket or device)", or "<what> <path> is N bytes, over the
//     limit of M".
// A FIFO is refused without blocking (the open does not wait for a
// writer). Thread-safe.
absl::StatusOr<std::string> ReadBoundedFile(const std::string& path, int64_t max_bytes,
                                            absl::string_view what);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_BOUNDED_FILE_H_
