#include "common/confined_path.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/errno_status.h"
#include "common/terminal_safe.h"
#include "common/utf8_prefix.h"

namespace pipetrain {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

// realpath(3), or "" when it fails.
std::string RealPath(const std::string& path) {
  std::unique_ptr<char, decltype(&free)> resolved(realpath(path.c_str(), nullptr), &free);
  return resolved == nullptr ? std::string() : std::string(resolved.get());
}

// Opens the directory `name` under `parent` without following a link.
// ENOTDIR/ELOOP mean "not a directory" or "a symbolic link".
int OpenDirNoFollow(int parent, const std::string& name) {
  return openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

}  // namespace

ScopedFd& ScopedFd::operator=(ScopedFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.release();
  }
  return *this;
}

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) close(fd_);
}

int ScopedFd::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

bool HasTemporarySuffix(absl::string_view name) {
  const size_t at = name.rfind(".tmp.");
  if (at == absl::string_view::npos) return false;
  const absl::string_view rest = name.substr(at + 5);
  const size_t dot = rest.find('.');
  if (dot == absl::string_view::npos || dot == 0 || dot + 1 == rest.size()) return false;
  auto digits = [](absl::string_view v) {
    return std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  return digits(rest.substr(0, dot)) && digits(rest.substr(dot + 1));
}

absl::Status CheckConfinedName(absl::string_view field, absl::string_view path) {
  if (path.empty()) return Invalid(field, "empty path");
  if (path.size() > kMaxSpecPathBytes) {
    return Invalid(field, absl::StrCat("path of ", path.size(), " bytes exceeds the limit of ",
                                       kMaxSpecPathBytes));
  }
  if (path.find('\0') != absl::string_view::npos) return Invalid(field, "path contains a NUL byte");
  // File names are listed on terminals (ls, the job's weightsPath).
  if (const std::optional<size_t> at = FirstTerminalControl(path)) {
    return Invalid(field, absl::StrCat("path has a control character at byte ", *at,
                                       " (escape sequences, line breaks and bidirectional "
                                       "overrides are not allowed in file names)"));
  }
  if (path.front() == '/') {
    return Invalid(field, "must be a relative path (it is resolved under the operator's "
                          "directory); absolute paths are not allowed");
  }
  if (path.back() == '/') return Invalid(field, "must name a file, not end with '/'");
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part.empty()) return Invalid(field, "empty path component (\"//\")");
    if (part == "." || part == "..") {
      return Invalid(field, "\".\" and \"..\" components are not allowed");
    }
    if (part.size() > kMaxPathComponentBytes) {
      return Invalid(field, absl::StrCat("a path component exceeds ", kMaxPathComponentBytes,
                                         " bytes"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ConfinedParent> OpenConfinedParent(const std::string& root,
                                                  absl::string_view root_flag,
                                                  absl::string_view field,
                                                  const std::string& relative, bool create_dirs) {
  if (absl::Status lexical = CheckConfinedName(field, relative); !lexical.ok()) return lexical;
  ScopedFd dir(open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() < 0) {
    const int error = errno;
    // Missing, not a directory, or closed to this process: the operator's
    // flag is wrong. Anything else (too many open files, a stale NFS
    // handle) passes: a reader must not take it for a bad checkpoint.
    if (error == ENOENT || error == ENOTDIR || error == EACCES) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot open ", root_flag, " ", root, ": ", strerror(error)));
    }
    return ErrnoStatus(error, absl::StrCat("cannot open ", root_flag, " ", root));
  }
  std::vector<std::string> parts = absl::StrSplit(relative, '/');
  const std::string name = parts.back();
  parts.pop_back();
  for (const std::string& part : parts) {
    ScopedFd next(OpenDirNoFollow(dir.get(), part));
    if (next.get() < 0 && errno == ENOENT && create_dirs) {
      if (mkdirat(dir.get(), part.c_str(), 0700) == 0) {
        // A new entry is durable only once its parent directory is synced:
        // a crash could otherwise lose a directory (a checkpoint's step-N)
        // whose files were all fsynced. EINVAL: the file system cannot sync
        // directories.
        if (fsync(dir.get()) != 0 && errno != EINVAL) {
          // Read before the message is built: StrCat allocates, and the
          // order of arguments is unspecified. A retry decision reads it.
          const int error = errno;
          return ErrnoStatus(
              error, absl::StrCat(field, ": cannot sync the directory of ", part, " under ", root));
        }
      } else if (errno != EEXIST) {
        const int error = errno;
        return ErrnoStatus(
            error, absl::StrCat(field, ": cannot create directory ", part, " under ", root));
      }
      next = ScopedFd(OpenDirNoFollow(dir.get(), part));
      if (next.get() < 0 && errno == ENOENT) {
        // Removed between our mkdir and open (a checkpoint's expiry): the
        // caller's write would go to a closed descriptor.
        return absl::UnavailableError(absl::StrCat(field, ": directory ", part, " under ", root,
                                                   " was removed while it was being created"));
      }
    }
    if (next.get() < 0 && errno == ENOENT) return ConfinedParent{ScopedFd(), name};
    if (next.get() < 0 && (errno == ELOOP || errno == ENOTDIR)) {
      return Invalid(field, absl::StrCat("\"", part,
                                         "\" is a symbolic link or not a directory; links are "
                                         "not followed out of the output directory"));
    }
    if (next.get() < 0) {
      const int error = errno;  // as above: before StrCat
      return ErrnoStatus(error, absl::StrCat(field, ": cannot open ", part));
    }
    dir = std::move(next);
  }
  struct stat info;
  if (fstatat(dir.get(), name.c_str(), &info, AT_SYMLINK_NOFOLLOW) == 0 &&
      (S_ISLNK(info.st_mode) || S_ISDIR(info.st_mode))) {
    // Worded for readers (a checkpoint's unit file) and writers alike.
    return Invalid(field, absl::StrCat("\"", name, "\" exists and is ",
                                       S_ISLNK(info.st_mode)
                                           ? "a symbolic link, which is not followed out of the "
                                             "output directory"
                                           : "a directory, not a file"));
  }
  return ConfinedParent{std::move(dir), name};
}

absl::Status CheckWritableDirectory(absl::string_view flag, const std::string& dir) {
  struct stat info;
  if (stat(dir.c_str(), &info) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": ", dir, " cannot be used (", strerror(errno), "); create it or fix the path"));
  }
  if (!S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", dir, " is not a directory"));
  }
  // Readable too: files go in through a descriptor of it
  // (OpenConfinedParent), and checkpoints are found by listing it.
  if (access(dir.c_str(), R_OK | W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", dir, " is not readable and writable by this process (uid ",
                     geteuid(), ": ", strerror(errno), "); fix its owner or mode"));
  }
  return absl::OkStatus();
}

absl::Status CheckDataRoots(absl::string_view flag, const std::vector<std::string>& roots) {
  for (const std::string& root : roots) {
    struct stat info;
    if (stat(root.c_str(), &info) != 0 || !S_ISDIR(info.st_mode) ||
        access(root.c_str(), R_OK | X_OK) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": ", root,
                       " is not a directory this process can read; create it or fix the path"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ResolveUnderRoots(absl::string_view field, const std::string& path,
                                              const std::vector<std::string>& roots,
                                              absl::string_view roots_flag) {
  if (roots.empty()) {
    return Invalid(field, absl::StrCat("this process reads no such files: it was started without ",
                                       roots_flag));
  }
  for (const std::string& root : roots) {
    const std::string real_root = RealPath(root);
    if (real_root.empty()) continue;
    const std::string candidate = path.front() == '/' ? path : absl::StrCat(root, "/", path);
    const std::string real = RealPath(candidate);
    struct stat info;
    const bool inside = real_root == "/" ? !real.empty()
                                         : absl::StartsWith(real, absl::StrCat(real_root, "/"));
    if (inside && stat(real.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
        access(real.c_str(), R_OK) == 0) {
      return real;
    }
  }
  // Cut on a character boundary: the message goes into proto strings (a
  // worker's failure report), which must be UTF-8 or the report is lost.
  return Invalid(field, absl::StrCat(Utf8Prefix(path, 256), " is not a readable file under ",
                                     roots_flag, " (", absl::StrJoin(roots, ", "), ")"));
}

absl::StatusOr<ScopedFd> OpenRealPathNoLinks(absl::string_view field,
                                             const std::string& real_path) {
  const auto changed = [&](absl::string_view what) {
    return Invalid(field,
                   absl::StrCat(real_path, " changed after it was checked (", what, "); not read"));
  };
  if (real_path.size() < 2 || real_path.front() != '/') {
    return Invalid(field, absl::StrCat(real_path, " is not an absolute path"));
  }
  std::vector<std::string> parts = absl::StrSplit(real_path.substr(1), '/');
  const std::string name = parts.back();
  parts.pop_back();
  ScopedFd dir(open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() < 0) return absl::ErrnoToStatus(errno, "cannot open /");
  for (const std::string& part : parts) {
    if (part.empty() || part == "." || part == "..") return changed("not a real path");
    // O_PATH: searching a directory needs x, not r (as path lookup does).
    // With O_NOFOLLOW it would open a link itself, so the type is checked.
    ScopedFd next(openat(dir.get(), part.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (next.get() < 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat(field, ": cannot open ", real_path));
    }
    struct stat info;
    if (fstat(next.get(), &info) != 0 || !S_ISDIR(info.st_mode)) {
      return changed(absl::StrCat("\"", part, "\" is a symbolic link or not a directory"));
    }
    dir = std::move(next);
  }
  ScopedFd file(openat(dir.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (file.get() < 0 && errno == ELOOP) {
    return changed(absl::StrCat("\"", name, "\" is a symbolic link"));
  }
  if (file.get() < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(field, ": cannot open ", real_path));
  }
  return file;
}

}  // namespace pipetrain
