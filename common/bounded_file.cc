#include "common/bounded_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pipetrain {

absl::StatusOr<std::string> ReadBoundedFile(const std::string& path, int64_t max_bytes,
                                            absl::string_view what) {
  // O_NONBLOCK: a FIFO opens at once (refused below) instead of waiting for
  // a writer; regular files ignore it.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", what, " ", path));
  struct stat info;
  absl::Status status;
  if (fstat(fd, &info) != 0) {
    status = absl::ErrnoToStatus(errno, absl::StrCat("cannot stat ", what, " ", path));
  } else if (!S_ISREG(info.st_mode)) {
    status = absl::InvalidArgumentError(absl::StrCat(
        what, " ", path, " is not a regular file (a directory, FIFO, socket or device)"));
  } else if (info.st_size > max_bytes) {
    status = absl::InvalidArgumentError(absl::StrCat(what, " ", path, " is ", info.st_size,
                                                     " bytes, over the limit of ", max_bytes));
  }
  std::string text;
  // One byte more than the limit allows: a file that grew since the fstat
  // is caught, not read on without end.
  while (status.ok()) {
    char buffer[64 << 10];
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", what, " ", path));
    } else if (n == 0) {
      break;
    } else if (static_cast<int64_t>(text.size()) + n > max_bytes) {
      status = absl::InvalidArgumentError(absl::StrCat(what, " ", path, " grew past the limit of ",
                                                       max_bytes, " bytes while being read"));
    } else {
      text.append(buffer, static_cast<size_t>(n));
    }
  }
  close(fd);
  if (!status.ok()) return status;
  return text;
}

}  // namespace pipetrain
