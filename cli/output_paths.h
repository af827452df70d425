// Checks of the CLI's output-file flags, made before a command does its
// work, so that a bad path fails the command line (exit 2) instead of
// failing after a long run or after other output was written.
#ifndef PIPETRAIN_CLI_OUTPUT_PATHS_H_
#define PIPETRAIN_CLI_OUTPUT_PATHS_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain {

// How a command writes an output file, which decides what must be
// writable: the directory, for a file made or renamed into it; the file
// itself, for one written in place.
enum class OutputWrite {
  // Written whole and renamed into place (--save, --checkpoint, --out): a
  // symbolic link is replaced; a device, FIFO or socket is written in place
  // (or refused by CheckReplaceableFile).
  kRenamed,
  // WriteFilesOrNone: a symbolic link is written through in place too.
  kThroughLinks,
  // Appended (--log): any existing file is written in place.
  kAppended,
};

// OK when `path` is empty; or when it exists and is written in place (as
// `write` says) and can be written, whatever its directory allows
// (`--log /dev/stderr`, a FIFO); or when the directory it lies in exists
// and can be written and `path` is not itself a directory. INVALID_ARGUMENT
// "<flag> <path>: the directory D does not exist" (or "is not a directory",
// "is not writable"), "<flag> <path> is not writable", or "<flag> <path> is
// a directory; name a file".
// `created_dir`: a directory the command creates before it writes `path`
// (`up --out`); while it does not exist, a `path` directly in it passes
// (the write at the end says what fails). A `path` ending in '/', or equal
// to `created_dir`, is a directory, existing or not.
absl::Status CheckWritableParent(const char* flag, const std::string& path,
                                 const std::string& created_dir = "",
                                 OutputWrite write = OutputWrite::kRenamed);

// For an output written whole and renamed into place (safetensors files:
// --save, --checkpoint, --out): OK when `path` is empty, absent, a regular
// file or a symbolic link (the rename replaces the link, never its
// target); INVALID_ARGUMENT "<flag> <path> is not a regular file (a
// device, FIFO, socket or directory); name a file" otherwise, since the
// rename would put a file in place of /dev/null, say.
absl::Status CheckReplaceableFile(const char* flag, const std::string& path);

// For an output that may be a FIFO (--log, --loss-log): -1 unless `path`
// is a FIFO; for one with a reader, a blocking, close-on-exec write end
// (`--log >(tee x)`, `cat fifo &`), which the caller writes through or
// keeps open until its own writer is open, then closes: a check that opened
// and closed the write end would end a reader such as `cat` (it reads EOF).
// INVALID_ARGUMENT "<what> <path> is a FIFO with no reader; ..." for one
// nobody reads, whose blocking open would wait without end (past SIGINT).
absl::StatusOr<int> OpenFifoWriteEnd(absl::string_view what, const std::string& path);

// Writes `text` through `fd`, a FIFO's non-blocking write end (O_NONBLOCK
// set), as its reader takes it, asking `stop` (may be empty) each time the
// reader has taken nothing for a while. Not a blocking write: one to a
// stalled reader waited for ever, and a signal did not end it (a handler
// with SA_RESTART resumes it). CANCELLED "cannot write PATH: stopped while
// its reader took nothing (N of M bytes written)" once `stop` says so;
// the write's errno's code for a reader gone (EPIPE) or another failure.
absl::Status WriteToFifo(int fd, const std::string& path, const std::string& text,
                         const std::function<bool()>& stop);

// INVALID_ARGUMENT "<flag> <path> is also <flag2>; each output needs its own
// file" when two non-empty `outputs` name one file: the same existing file
// (links included), or, for files yet to be made, the same name in the same
// directory. One would silently overwrite the other.
absl::Status CheckDistinctOutputs(const std::vector<std::pair<const char*, std::string>>& outputs);

// INVALID_ARGUMENT "<flag> <path> is <input flag> <input>; writing it would
// destroy an input" when the existing file `path` is one of `inputs` (the
// same inode: links and other spellings included).
absl::Status CheckNotAnInput(const char* flag, const std::string& path,
                             const std::vector<std::pair<const char*, std::string>>& inputs);

// INVALID_ARGUMENT "<flag> <path> is one of the files the command writes in
// <dir_flag> <dir> (<name>); name another file" when `path` lies directly
// in `dir` (the same directory by inode, or while `dir` does not exist yet,
// by name) and `owned` accepts its file name: `up` writes its lock,
// tokens, ports files, logs and results there, and one write would destroy
// the other (a loss log renamed over the lock let a second run in).
absl::Status CheckNotOwnedFile(const char* flag, const std::string& path, const char* dir_flag,
                               const std::string& dir,
                               const std::function<bool(absl::string_view)>& owned);

// Removes the temporaries a killed writer of `path` left beside it (its
// directory's "<name>.tmp.*" that no living writer holds:
// RemoveAbandonedTemporaries, common/safetensors.h). A command killed
// mid-write (SIGKILL past a grace period, the OOM killer) leaves one of
// up to the file's size, which nothing else removes: repeated, they fill
// the volume. Returns the paths removed, for a warning each. Best effort:
// a directory that cannot be opened is left alone. To be called before
// this process writes `path`.
std::vector<std::string> RemoveAbandonedTemporariesOf(const std::string& path);

// Removes `path` when it is a regular file (not through a symbolic link):
// an output flag may name a device (/dev/null, /dev/stdout), which must
// never be unlinked, least of all by root.
void RemoveIfRegular(const std::string& path);

// One output file: where, and what it holds.
struct OutputFile {
  std::string path;
  std::string text;
};

// Writes `files`, all or none: each regular or new file goes to a
// temporary beside it, renamed into place once every file is written, so a
// failure leaves every file as it was (no half file, no earlier output, no
// file clobbered). A device, FIFO or symbolic link is written through in
// place, as a shell's ">" would, and cannot be undone: those go after every
// temporary is written, and before the renames (a rename that fails then,
// rare, leaves the earlier ones done). The error is "cannot
// write PATH" with the errno's code (a missing directory NOT_FOUND),
// UNKNOWN when there is no errno.
// A FIFO is written as fast as its reader takes the text. While the reader
// takes nothing, `stop` (when given) is asked every 200 ms: true ends the
// write with CANCELLED "cannot write PATH: stopped while its reader took
// nothing (N of M bytes written)", the reader left with part of the text
// (a stalled reader held `up`, past Ctrl-C, with its cluster running).
// Without `stop`, the write waits for the reader, as a shell's ">" would.
absl::Status WriteFilesOrNone(const std::vector<OutputFile>& files,
                              const std::function<bool()>& stop = nullptr);

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_OUTPUT_PATHS_H_
