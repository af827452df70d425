#include "cli/output_paths.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace pipetrain {

absl::Status CheckWritableParent(const char* flag, const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  const size_t slash = path.find_last_of('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  struct stat info;
  if (stat(dir.c_str(), &info) != 0) {
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
  if (stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, " is a directory; name a file"));
  }
  return absl::OkStatus();
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

// What identifies the file `path` names: its device and inode when it
// exists, else its directory's real path and its own name.
std::string OutputIdentity(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) == 0) return absl::StrCat("inode:", info.st_dev, ":", info.st_ino);
  const size_t slash = path.find_last_of('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  char real[PATH_MAX];
  return absl::StrCat("new:", realpath(dir.c_str(), real) != nullptr ? real : dir, "/", name);
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

void RemoveIfRegular(const std::string& path) {
  struct stat info;
  if (lstat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode)) std::remove(path.c_str());
}

absl::Status WriteFilesOrNone(const std::vector<OutputFile>& files) {
  for (size_t i = 0; i < files.size(); ++i) {
    errno = 0;
    std::ofstream out(files[i].path, std::ios::binary);
    const bool opened = out.is_open();
    out << files[i].text;
    out.close();
    if (out) continue;
    const int error = errno;
    if (opened) RemoveIfRegular(files[i].path);  // truncated here: half a file
    for (size_t done = 0; done < i; ++done) RemoveIfRegular(files[done].path);
    const std::string message = absl::StrCat("cannot write ", files[i].path);
    return error != 0 ? absl::ErrnoToStatus(error, message) : absl::UnknownError(message);
  }
  return absl::OkStatus();
}

}  // namespace pipetrain
