#include "common/checkpoint_manifest_file.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/confined_path.h"

namespace pipetrain {

absl::StatusOr<std::optional<bool>> HoldsCheckpointManifest(int dir, const std::string& name,
                                                            const std::string& shown) {
  const auto unknown = [&shown](int error, absl::string_view what) {
    return absl::ErrnoToStatus(error, absl::StrCat("cannot ", what, " ", shown));
  };
  struct stat st;
  if (fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    const int error = errno;
    if (error == ENOENT) return std::nullopt;  // removed since it was listed
    return unknown(error, "stat");
  }
  if (!S_ISDIR(st.st_mode)) return std::nullopt;
  ScopedFd step_dir(openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (step_dir.get() < 0) {
    const int error = errno;
    // Removed, or swapped for a link or a file, since the stat.
    if (error == ENOENT || error == ELOOP || error == ENOTDIR) return std::nullopt;
    return unknown(error, "open");
  }
  if (fstatat(step_dir.get(), kCheckpointManifestName, &st, AT_SYMLINK_NOFOLLOW) == 0) return true;
  const int error = errno;
  if (error == ENOENT) return false;
  return unknown(error, absl::StrCat("look for ", kCheckpointManifestName, " in"));
}

}  // namespace pipetrain
