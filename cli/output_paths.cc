#include "cli/output_paths.h"

#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/safetensors.h"
#include "common/temp_file.h"

namespace pipetrain {
namespace {

// The directory `path` lies in ("." for a bare name, "/" at the root), and
// its name there.
struct DirAndName {
  std::string dir, name;
};
DirAndName SplitPath(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

std::string WithoutTrailingSlashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

// `path` with its longest existing prefix resolved (realpath) and the
// missing rest taken by name ("." dropped, ".." dropping the name before
// it): two spellings of a directory yet to be created ("run", "./run",
// "/abs/run/.") compare equal. `path` itself when no prefix resolves.
std::string ResolvedEvenIfMissing(const std::string& path) {
  std::string existing = WithoutTrailingSlashes(path.empty() ? "." : path);
  std::vector<std::string> missing;  // outermost first
  char real[PATH_MAX];
  while (realpath(existing.c_str(), real) == nullptr) {
    const DirAndName split = SplitPath(existing);
    const std::string parent = WithoutTrailingSlashes(split.dir);
    if (parent == existing) return path;  // "." or "/" itself does not resolve
    missing.insert(missing.begin(), split.name);
    existing = parent;
  }
  std::vector<std::string> parts = absl::StrSplit(real, '/', absl::SkipEmpty());
  for (const std::string& name : missing) {
    if (name.empty() || name == ".") continue;
    if (name == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.push_back(name);
  }
  return "/" + absl::StrJoin(parts, "/");
}

}  // namespace

absl::Status CheckWritableParent(const char* flag, const std::string& path,
                                 const std::string& created_dir, OutputWrite write) {
  if (path.empty()) return absl::OkStatus();
  // Names a directory whether or not it exists yet: "x/", or the directory
  // the command creates (which would be one by the time of the write).
  if (path.back() == '/' || (!created_dir.empty() &&
                             WithoutTrailingSlashes(path) == WithoutTrailingSlashes(created_dir))) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, " is a directory; name a file"));
  }
  struct stat info;
  // The file whose directory must take a new file: `path`, or the target of
  // a link to a file not there yet, which a write through it creates.
  std::string created = path;
  // Written in place: the file must be writable, not its directory
  // (/dev/stderr, a FIFO, a link the user keeps in a read-only directory).
  if (path.back() != '/' && lstat(path.c_str(), &info) == 0 && !S_ISDIR(info.st_mode)) {
    const bool link = S_ISLNK(info.st_mode);
    const bool in_place = write == OutputWrite::kAppended ||
                          (link ? write == OutputWrite::kThroughLinks : !S_ISREG(info.st_mode));
    const bool dangling = link && stat(path.c_str(), &info) != 0 && errno == ENOENT;
    if (in_place && dangling) {
      char target[4096];
      const ssize_t n = readlink(path.c_str(), target, sizeof target - 1);
      if (n <= 0)
        return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, " is not writable"));
      created.assign(target, n);
      if (created.front() != '/') created = SplitPath(path).dir + "/" + created;
    } else if (in_place && !(link && S_ISDIR(info.st_mode))) {
      if (access(path.c_str(), W_OK) != 0) {
        return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, " is not writable"));
      }
      return absl::OkStatus();
    }
  }
  const std::string dir = SplitPath(created).dir;
  if (stat(dir.c_str(), &info) != 0) {
    if (errno == ENOENT && !created_dir.empty() &&
        WithoutTrailingSlashes(dir) == WithoutTrailingSlashes(created_dir)) {
      return absl::OkStatus();  // the command creates it
    }
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": the directory ", dir, " does not exist"));
  }
  if (!S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": ", dir, " is not a directory"));
  }
  if (access(dir.c_str(), W_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": the directory ", dir, " is not writable"));
  }
  // A directory in its place would fail the write only after the run.
  if (stat(created.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, " is a directory; name a file"));
  }
  return absl::OkStatus();
}

absl::Status CheckNotOwnedFile(const char* flag, const std::string& path, const char* dir_flag,
                               const std::string& dir,
                               const std::function<bool(absl::string_view)>& owned) {
  if (path.empty() || dir.empty()) return absl::OkStatus();
  // The name `p` has in `dir` when it lies directly in it, else empty.
  const auto owned_name = [&](const std::string& p) -> std::string {
    const DirAndName split = SplitPath(p);
    if (!owned(split.name)) return "";
    struct stat parent_info, dir_info;
    bool same = false;
    if (stat(dir.c_str(), &dir_info) == 0) {
      same = stat(split.dir.c_str(), &parent_info) == 0 && parent_info.st_dev == dir_info.st_dev &&
             parent_info.st_ino == dir_info.st_ino;
    } else {
      same = ResolvedEvenIfMissing(split.dir) == ResolvedEvenIfMissing(dir);
    }
    return same ? split.name : "";
  };
  std::string name = owned_name(path);
  // A symbolic link is written through (WriteFilesOrNone): its target too.
  struct stat link;
  if (name.empty() && lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
    char resolved[PATH_MAX];
    if (realpath(path.c_str(), resolved) != nullptr) name = owned_name(resolved);
  }
  if (name.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " ", path, " is one of the files the command writes in ", dir_flag, " ",
                   dir, " (", name, "); name another file"));
}

absl::Status CheckReplaceableFile(const char* flag, const std::string& path) {
  struct stat info;
  if (path.empty() || lstat(path.c_str(), &info) != 0) return absl::OkStatus();
  if (S_ISREG(info.st_mode) || S_ISLNK(info.st_mode)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " ", path,
                   " is not a regular file (a device, FIFO, socket or directory); name a file"));
}

namespace {

// OpenFifoWriteEnd's write end, still non-blocking (as WriteOne keeps it).
absl::StatusOr<int> OpenNonBlockingFifoWriteEnd(absl::string_view what, const std::string& path) {
  struct stat info;
  if (path.empty() || stat(path.c_str(), &info) != 0 || !S_ISFIFO(info.st_mode)) return -1;
  // Non-blocking, a FIFO's write end opens only with a reader (ENXIO
  // without one), where a blocking open would wait for it.
  const int fd = open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENXIO) return -1;  // the caller's own open says what fails
    return absl::InvalidArgumentError(
        absl::StrCat(what, what.empty() ? "" : " ", path,
                     " is a FIFO with no reader; start its reader first, or name a regular file"));
  }
  return fd;
}

}  // namespace

absl::StatusOr<int> OpenFifoWriteEnd(absl::string_view what, const std::string& path) {
  absl::StatusOr<int> opened = OpenNonBlockingFifoWriteEnd(what, path);
  if (!opened.ok() || *opened < 0) return opened;
  const int fd = *opened;
  // Blocking from here on: writes wait for the reader, as a shell's ">".
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int error = errno;
    close(fd);
    return absl::ErrnoToStatus(error, absl::StrCat("cannot write ", path));
  }
  return fd;
}

namespace {

// What identifies the file `path` names: its device and inode when it
// exists, else its directory's real path and its own name.
std::string OutputIdentity(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) == 0) return absl::StrCat("inode:", info.st_dev, ":", info.st_ino);
  const DirAndName split = SplitPath(path);
  char real[PATH_MAX];
  return absl::StrCat("new:", realpath(split.dir.c_str(), real) != nullptr ? real : split.dir, "/",
                      split.name);
}

}  // namespace

absl::Status CheckDistinctOutputs(const std::vector<std::pair<const char*, std::string>>& outputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].second.empty()) continue;
    const std::string identity = OutputIdentity(outputs[i].second);
    for (size_t j = i + 1; j < outputs.size(); ++j) {
      if (outputs[j].second.empty() || OutputIdentity(outputs[j].second) != identity) continue;
      return absl::InvalidArgumentError(
          absl::StrCat(outputs[j].first, " ", outputs[j].second, " is also ", outputs[i].first, " ",
                       outputs[i].second, "; each output needs its own file"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckNotAnInput(const char* flag, const std::string& path,
                             const std::vector<std::pair<const char*, std::string>>& inputs) {
  struct stat out;
  if (path.empty() || stat(path.c_str(), &out) != 0) return absl::OkStatus();  // a new file
  for (const auto& [input_flag, input] : inputs) {
    struct stat in;
    if (input.empty() || stat(input.c_str(), &in) != 0) continue;
    if (in.st_dev == out.st_dev && in.st_ino == out.st_ino) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, " is ", input_flag, " ",
                                                     input, "; writing it would destroy an input"));
    }
  }
  return absl::OkStatus();
}

void RemoveIfRegular(const std::string& path) {
  struct stat info;
  if (lstat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode)) std::remove(path.c_str());
}

namespace {

// How long a write to a FIFO whose reader takes nothing waits before it
// asks `stop` again.
constexpr int kFifoStopPollMs = 200;

}  // namespace

absl::Status WriteToFifo(int fd, const std::string& path, const std::string& text,
                         const std::function<bool()>& stop) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", path));
    }
    if (n == 0) return absl::UnknownError(absl::StrCat("cannot write ", path));
    // Full: wait for room (an ended reader wakes it too, and the next
    // write says EPIPE), asking `stop` between waits.
    if (stop && stop()) {
      return absl::CancelledError(absl::StrCat("cannot write ", path,
                                               ": stopped while its reader took nothing (", done,
                                               " of ", text.size(), " bytes written)"));
    }
    pollfd room = {fd, POLLOUT, 0};
    if (poll(&room, 1, kFifoStopPollMs) < 0 && errno != EINTR) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", path));
    }
  }
  return absl::OkStatus();
}

namespace {

// Writes `text` to `path` (created or truncated). The error names `path`.
absl::Status WriteOne(const std::string& path, const std::string& text,
                      const std::function<bool()>& stop) {
  // A FIFO through a write end opened only with a reader (as in
  // OpenFifoWriteEnd): a blocking open of one nobody reads waits for ever
  // (past signals). Its message, as FAILED_PRECONDITION: at the write, not
  // the command line.
  absl::StatusOr<int> fifo = OpenNonBlockingFifoWriteEnd("", path);
  if (!fifo.ok()) return absl::FailedPreconditionError(fifo.status().message());
  if (*fifo >= 0) {
    const absl::Status wrote = WriteToFifo(*fifo, path, text, stop);
    close(*fifo);
    return wrote;
  }
  errno = 0;
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (out) return absl::OkStatus();
  const int error = errno;
  const std::string message = absl::StrCat("cannot write ", path);
  return error != 0 ? absl::ErrnoToStatus(error, message) : absl::UnknownError(message);
}

}  // namespace

absl::Status WriteFilesOrNone(const std::vector<OutputFile>& files,
                              const std::function<bool()>& stop) {
  // A regular (or new) file is written to a temporary beside it and renamed
  // over it only once every file is written, so a failure leaves each as it
  // was. A device, FIFO or symbolic link (/dev/stdout, a link the user
  // keeps) is written through in place, as a shell's ">" would; a FIFO
  // nobody reads is FAILED_PRECONDITION, not waited for.
  struct Staged {
    std::string temp, path;
  };
  std::vector<Staged> staged;
  const auto discard = [&staged] {
    for (const Staged& s : staged) std::remove(s.temp.c_str());
  };
  // In place, written once every temporary is: a write there cannot be
  // undone, so it must not come before a temporary that fails.
  std::vector<const OutputFile*> in_place;
  for (const OutputFile& file : files) {
    struct stat info;
    if (lstat(file.path.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
      in_place.push_back(&file);
      continue;
    }
    // Created exclusively under a name nobody can guess: an existing file
    // or link there (planted in a shared directory) is not written through.
    const std::string temp = TempPathFor(file.path);
    absl::Status wrote = WriteNewFile(temp, file.text, 0666);
    if (!wrote.ok()) {
      wrote = absl::Status(wrote.code(),
                           absl::StrCat("cannot write ", file.path, " (", wrote.message(), ")"));
      discard();  // WriteNewFile left nothing of its own at `temp`
      return wrote;
    }
    staged.push_back({temp, file.path});
  }
  for (const OutputFile* file : in_place) {
    if (absl::Status wrote = WriteOne(file->path, file->text, stop); !wrote.ok()) {
      discard();
      return wrote;
    }
  }
  for (size_t i = 0; i < staged.size(); ++i) {
    if (std::rename(staged[i].temp.c_str(), staged[i].path.c_str()) != 0) {
      const int error = errno;
      for (size_t rest = i; rest < staged.size(); ++rest) std::remove(staged[rest].temp.c_str());
      return absl::ErrnoToStatus(error, absl::StrCat("cannot write ", staged[i].path));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> RemoveAbandonedTemporariesOf(const std::string& path) {
  std::vector<std::string> removed;
  if (path.empty()) return removed;
  const DirAndName split = SplitPath(path);
  const int dir_fd = open(split.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return removed;
  for (const std::string& name : RemoveAbandonedTemporaries(dir_fd, split.name)) {
    removed.push_back(split.dir == "/" ? "/" + name : absl::StrCat(split.dir, "/", name));
  }
  close(dir_fd);
  return removed;
}

}  // namespace pipetrain
