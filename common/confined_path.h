// Confined paths: where a request may make the coordinator write, or a
// worker read, a file (docs/operations.md "Security").
//
// Job specs name files (spec.output.weights_path, spec.data.path), and a
// spec comes from a user, not from the operator. The operator allows
// directories (the coordinator's --output-dir, a worker's --data-root);
// nothing outside them is written or read, whatever the spec says:
//
//   writes   CheckConfinedName (lexical: relative, no "..", bounded) at
//            submit, then ConfinedDir walks the path one component at a time
//            with O_NOFOLLOW, so a symbolic link anywhere on the way is
//            refused rather than followed; the file is created under a
//            temporary name and renamed (rename replaces a link at the final
//            name instead of writing through it).
//   reads    ResolveUnderRoots: the real path (symbolic links resolved)
//            must lie inside one of the roots; links that stay inside are
//            fine. Its error is the same whether a path is missing, outside
//            the roots or unreadable, so a user learns nothing about files
//            the operator did not allow. The reader then opens that real
//            path with OpenRealPathNoLinks, so a link swapped in between
//            (by a local user who can write in a root) is not followed.
//
// Thread-safe (no shared state).
#ifndef PIPETRAIN_COMMON_CONFINED_PATH_H_
#define PIPETRAIN_COMMON_CONFINED_PATH_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain {

// Longest path a spec may name, and longest component (NAME_MAX).
inline constexpr size_t kMaxSpecPathBytes = 1024;
inline constexpr size_t kMaxPathComponentBytes = 255;

// OK when `path` is a relative path of 1..kMaxSpecPathBytes bytes whose
// components are non-empty, at most kMaxPathComponentBytes, and neither "."
// nor ".."; no NUL, no leading or trailing '/'. Otherwise INVALID_ARGUMENT
// "<field>: ..." saying which rule it breaks.
absl::Status CheckConfinedName(absl::string_view field, absl::string_view path);

// Whether `name` ends in ".tmp.<digits>.<digits>": the form atomic writers
// give their temporaries (TempNameFor, common/safetensors.cc), whose
// leftovers in a directory are removed as abandoned. So no file a job
// names (spec.output.weights_path) may take that form.
bool HasTemporarySuffix(absl::string_view name);

// An open file descriptor, closed by the destructor. Move-only.
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& other) noexcept : fd_(other.release()) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd();
  int get() const { return fd_; }
  int release();

 private:
  int fd_ = -1;
};

// The directory a confined file goes into, opened, and the file's name.
struct ConfinedParent {
  ScopedFd dir;
  std::string name;
};

// Walks `relative` (which must pass CheckConfinedName) under the directory
// `root`, refusing symbolic links. `create_dirs`: missing directories on the
// way are created (mode 0700), each synced into its parent (fsync of the
// parent, so a crash cannot lose it); otherwise a missing one ends the walk
// early with OK and a closed `dir` (nothing to refuse yet: the write will
// create it). Errors, INVALID_ARGUMENT "<field>: ...": a component is a symbolic
// link, or not a directory, or the final name is an existing directory or
// symbolic link. FAILED_PRECONDITION when `root` itself is missing, not a
// directory or not open to this process (the operator's flag, which
// `root_flag` names, is wrong); UNAVAILABLE when a directory this call
// created was removed before it could be opened; other errno failures
// (EMFILE: RESOURCE_EXHAUSTED) as absl::ErrnoToStatus, naming the path and
// carrying the errno (common/errno_status.h: ErrnoOf).
absl::StatusOr<ConfinedParent> OpenConfinedParent(const std::string& root,
                                                  absl::string_view root_flag,
                                                  absl::string_view field,
                                                  const std::string& relative, bool create_dirs);

// The flags that name the roots above, as messages name them.
inline constexpr char kOutputDirFlag[] = "the coordinator's --output-dir";
inline constexpr char kCheckpointRootFlag[] = "this worker's --checkpoint-root";

// A directory given by `flag` that this process will write files under,
// checked at start-up: INVALID_ARGUMENT "<flag>: <dir> ..." saying whether it
// is missing, not a directory, or not readable, writable and searchable by
// this process; a misconfigured root would otherwise fail every job that writes
// there, later and quietly.
absl::Status CheckWritableDirectory(absl::string_view flag, const std::string& dir);

// The real path of `path` when it names a readable regular file inside one
// of `roots` (a relative `path` is tried under each root in order; an
// absolute one must resolve inside one). Errors: INVALID_ARGUMENT
// "<field>: <path> is not a readable file under <roots_flag> (<roots>)",
// identical for every cause, the path cut to 256 bytes on a UTF-8
// character boundary; with no roots, INVALID_ARGUMENT naming `roots_flag`
// as not given.
absl::StatusOr<std::string> ResolveUnderRoots(absl::string_view field, const std::string& path,
                                              const std::vector<std::string>& roots,
                                              absl::string_view roots_flag = "--data-root");

// The operator's --data-root list, checked at start-up: each an existing
// directory this process can list and read; else INVALID_ARGUMENT naming
// `flag` and the root (a typo would otherwise refuse every job's data, at
// submit, with a message about the job).
absl::Status CheckDataRoots(absl::string_view flag, const std::vector<std::string>& roots);

// Opens `real_path`, an absolute path without symbolic links (as
// ResolveUnderRoots returns), read-only, following no symbolic link on the
// way: each directory is opened with O_NOFOLLOW from "/", then the file
// (O_NOFOLLOW | O_NONBLOCK, so a FIFO does not block). A link swapped in
// after the check (a directory replaced by a link out of the roots) is
// refused, not followed. Errors: INVALID_ARGUMENT "<field>: <real_path>
// changed after it was checked ..." for a link or a component that is no
// longer a directory; NOT_FOUND / the errno's code otherwise, naming the
// path. The caller checks what it opened (fstat) before reading.
absl::StatusOr<ScopedFd> OpenRealPathNoLinks(absl::string_view field, const std::string& real_path);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_CONFINED_PATH_H_
