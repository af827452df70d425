#include "common/temp_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <random>

#include "absl/strings/str_cat.h"

namespace pipetrain {

std::string TempNameFor(const std::string& name) {
  // "<name>.tmp.<pid>" exceeded NAME_MAX for a name near it (CheckConfinedName
  // allows 255 bytes), failing the write after training. Keeping at most
  // kTempPrefixBytes of `name` leaves "unit-..." temporaries of a writer
  // that died recognisable (coordinator/jobs/checkpoint_catalog.cc): at most
  // 200 + 5 + 10 + 1 + 20 = 236 bytes.
  static std::atomic<uint64_t> next_temp{std::random_device()() |
                                         (uint64_t{std::random_device()()} << 32)};
  return absl::StrCat(name.substr(0, kTempPrefixBytes), ".tmp.", getpid(), ".",
                      next_temp.fetch_add(1));
}

std::string TempPathFor(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return TempNameFor(path);
  return absl::StrCat(path.substr(0, slash + 1), TempNameFor(path.substr(slash + 1)));
}

absl::Status WriteNewFile(const std::string& path, std::string_view bytes, mode_t mode) {
  return WriteNewFileAt(AT_FDCWD, path, bytes, mode);
}

absl::Status WriteNewFileAt(int dir_fd, const std::string& name, std::string_view bytes,
                            mode_t mode, bool sync) {
  const int fd =
      openat(dir_fd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", name));
  size_t done = 0;
  int error = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      error = errno;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (error == 0 && sync && fsync(fd) != 0) error = errno;
  if (close(fd) != 0 && error == 0) error = errno;
  if (error == 0) return absl::OkStatus();
  unlinkat(dir_fd, name.c_str(), 0);
  return absl::ErrnoToStatus(error, absl::StrCat("cannot write ", name));
}

}  // namespace pipetrain
