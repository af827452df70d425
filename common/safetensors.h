// Reading and writing the safetensors file format (Hugging Face).
//
// Layout: an 8-byte little-endian uint64 N, then N bytes of UTF-8 JSON (the
// header), then the data buffer. The header maps each tensor name to
//   {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
// with byte offsets relative to the start of the data buffer (end exclusive),
// plus an optional "__metadata__" object of string -> string.
//
// Tensors here are fp32 (common/tensor.h). Writing always produces F32; reading
// also accepts F16, BF16 and F64 and converts them to fp32, because published
// checkpoints are often half precision. The host must be little-endian (the
// format is), which the implementation checks at compile time.
//
// Thread-safety: the functions keep no state but a counter of temporary
// files. Concurrent reads are fine; concurrent writes each use a temporary
// file of their own, and the last one renamed wins.
#ifndef PIPETRAIN_COMMON_SAFETENSORS_H_
#define PIPETRAIN_COMMON_SAFETENSORS_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/annotated_mutex.h"
#include "common/confined_path.h"
#include "common/tensor.h"

namespace pipetrain {

// A file's layout bounds: the 8-byte header length, then a header of at
// most 16 MiB (readers refuse a longer one: it would drive a huge
// allocation and parse), then the tensors' data. A writer that must stay
// readable (a checkpoint's unit file) counts these beside its data.
inline constexpr uint64_t kSafetensorsLengthBytes = 8;
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = uint64_t{16} << 20;

// The largest checkpoint unit file a worker reads back (ReadUnitCheckpoint
// reads it whole to check its checksum, worker/checkpoint/unit_checkpoint.h)
// and so writes: 64 GiB. Here, below both, so that the spec's validation
// (spec/job_spec.h) refuses a job whose unit files would pass it without
// depending on the worker's checkpoint code for the number. A unit with
// error feedback keeps every compressed replica's residual beside its
// weights and moments: an MLP unit reaches it from d_model about 13970
// with 8 compressed replicas, 16380 with 5.
inline constexpr int64_t kMaxReadableUnitFileBytes = int64_t{64} << 30;
// The most bytes of tensors such a file may hold: the rest is room for
// the length and the longest header a reader takes.
inline constexpr int64_t kMaxUnitFileTensorBytes =
    kMaxReadableUnitFileBytes -
    static_cast<int64_t>(kSafetensorsLengthBytes + kMaxSafetensorsHeaderBytes);

struct NamedTensor {
  std::string name;
  Tensor tensor;  // fp32.
};

using SafetensorsMetadata = std::map<std::string, std::string>;

// The metadata of a file meant for Hugging Face's loaders (a job's final
// weights, `train-local --save`, `checkpoint export`): {"format": "pt"},
// as the Hub's own GPT-2 model.safetensors carries; transformers before
// 4.48 and its Flax loader refuse a file without it.
inline const SafetensorsMetadata& HfWeightsMetadata() {
  static const SafetensorsMetadata* const metadata = new SafetensorsMetadata{{"format", "pt"}};
  return *metadata;
}

// Writes `tensors` to `path` in the given order, contiguous, dtype "F32", with
// shapes from Tensor::shape() and `metadata` as "__metadata__" (omitted when
// empty). The header is padded with spaces so the data buffer starts at an
// 8-byte aligned file offset, as Hugging Face does.
//
// Atomic: writes a temporary file in the same directory, "<name>.tmp.<pid>.<n>"
// with at most the first 200 bytes of the file's name (so any name up to
// NAME_MAX can be written), fsyncs it and renames it over `path`, so a crash
// never leaves a half-written file and an existing file is replaced only by
// a complete one. On failure the temporary file is removed.
//
// Errors:
//   INVALID_ARGUMENT: an empty, duplicate or "__metadata__" name, a null
//     tensor, or a name/metadata string that is not valid UTF-8 (the message
//     names the tensor).
//   FAILED_PRECONDITION: `path` is a device, FIFO or socket: never replaced
//     (a symbolic link is replaced, its target untouched).
//   errno mapped by absl::ErrnoToStatus (NOT_FOUND for a missing directory,
//     PERMISSION_DENIED, INTERNAL for an I/O error, ...): the file could not be
//     written; the message names the path and carries strerror.
absl::Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                              const SafetensorsMetadata& metadata = {});

// WriteSafetensors into the open directory `dir_fd` under `name` (one path
// component), created with permission bits `mode` (before the umask). The
// temporary file is created with O_EXCL | O_NOFOLLOW and renamed over
// `name`, so a symbolic link at either name is never written through (see
// common/confined_path.h). Errors as WriteSafetensors, naming `name`.
// `stopped` (may be empty) is asked before each tensor: once true, the
// temporary is removed and the answer is CANCELLED (a checkpoint writer
// whose stage stopped, with a unit file of gigabytes to go).
absl::Status WriteSafetensorsAt(int dir_fd, const std::string& name,
                                const std::vector<NamedTensor>& tensors,
                                const SafetensorsMetadata& metadata, mode_t mode,
                                const std::function<bool()>& stopped = nullptr);

// Removes the temporary files that writers of `name` in `dir_fd` left when
// they died mid-write (a crash, a kill): entries "<name>.tmp.<pid>.<n>"
// (with `name` cut to its first 200 bytes, as the writers name them) that
// are regular files and that no writer holds. Every writer here holds an
// exclusive flock(2) on its temporary until the file is renamed or removed,
// and the kernel drops the lock with the process, so a temporary that can
// be locked belongs to no living writer, in this process or another on the
// same file system (a pid cannot say: a restarted container's process is
// often pid 1 again). This process's own writers are known by name besides,
// from before they create the file (it is locked a moment after), and left
// alone whatever their lock says. The candidate is opened for writing where
// it can be (NFS grants flock only there). Best effort: an entry that
// cannot be opened or locked (a file system without flock) is left alone.
// Returns the entries removed. Not to be raced against a writer creating a
// temporary in another process: that writer locks its file a moment after
// creating it.
std::vector<std::string> RemoveAbandonedTemporaries(int dir_fd, const std::string& name);

// One tensor of a file written piecewise: its name and shape (F32).
struct SafetensorsTensorSpec {
  std::string name;
  Shape shape;
};

// A safetensors file written piecewise, for tensors whose values arrive in
// chunks (a job's final weights, from its stages), so that none of it is
// held in memory: the header is fixed from the names and shapes when the
// file is created, each chunk goes straight to its place in a temporary
// file, and Commit makes the file appear whole, as WriteSafetensorsAt does
// (fsync, rename over the name; a crash never leaves a half-written file
// under the name). A writer destroyed uncommitted removes its temporary
// file. Values never written read as 0.
//
// Thread-safe: Writes and Commit take turns (a Commit waits for a Write in
// progress; a Write after it is refused), so writers of different tensors
// need no lock of their own around the file.
class SafetensorsFileWriter {
 public:
  // Creates the temporary file for `name` in `dir_fd` (duplicated: the
  // caller keeps its own) with permission bits `mode`, writes the header
  // and reserves the whole file's space, so a full disk says so now, not
  // halfway. A file system without fallocate(2) (NFS before 4.2, CephFS,
  // FUSE) reserves nothing: a full disk then fails a Write, Sync or Commit.
  // Errors: INVALID_ARGUMENT for names as WriteSafetensors (or a
  // negative dimension); errno codes naming the file and carrying the errno
  // (common/errno_status.h: ErrnoOf, which tells EMFILE from ENOSPC).
  // `metadata` goes into the header as WriteSafetensors' does (INVALID_ARGUMENT
  // if a key or value is not UTF-8).
  static absl::StatusOr<std::unique_ptr<SafetensorsFileWriter>> Create(
      int dir_fd, const std::string& name, std::vector<SafetensorsTensorSpec> tensors, mode_t mode,
      const SafetensorsMetadata& metadata = {});
  ~SafetensorsFileWriter();
  SafetensorsFileWriter(const SafetensorsFileWriter&) = delete;
  SafetensorsFileWriter& operator=(const SafetensorsFileWriter&) = delete;

  const std::vector<SafetensorsTensorSpec>& tensors() const { return tensors_; }
  // Writes `count` values at element `offset` of tensors()[index].
  // INVALID_ARGUMENT outside the tensor (nothing written); errno codes
  // naming the file (without the errno Create's carry: ErrnoOf is nullopt);
  // FAILED_PRECONDITION after Commit.
  absl::Status Write(size_t index, int64_t offset, const float* values, int64_t count);
  // Syncs what was written so far to the disk (the slow part of a commit,
  // which a caller may do before deciding to commit). Writes may follow.
  // Errors: errno codes naming the file; FAILED_PRECONDITION after Commit.
  absl::Status Sync();
  // Syncs the file (little, after a Sync) and renames it over the name.
  // Once; the writer is done afterwards, whatever the result (on failure
  // the temporary is removed).
  absl::Status Commit();

 private:
  SafetensorsFileWriter(int dir_fd, int fd, std::string name, std::string tmp,
                        std::vector<SafetensorsTensorSpec> tensors, std::vector<uint64_t> begin);

  const int dir_fd_;
  const int fd_;
  const std::string name_;
  const std::string tmp_;
  const std::vector<SafetensorsTensorSpec> tensors_;
  const std::vector<uint64_t> begin_;  // file offset of each tensor's first byte
  AnnotatedMutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // committed (or its commit failed)
};

struct SafetensorsContents {
  std::vector<NamedTensor> tensors;  // Ascending data_offsets order.
  SafetensorsMetadata metadata;

  // The tensor called `name`, or nullptr if absent. Linear in tensors.size().
  const Tensor* Find(std::string_view name) const;
};

// Reads and validates the file at `path`, converting every tensor to fp32.
// The whole file is read into memory with one read, so peak memory is about
// the file size plus the fp32 tensors.
//
// Errors:
//   NOT_FOUND: `path` does not exist (the message names it).
//   Other errno codes via absl::ErrnoToStatus: the file could not be read.
//   INVALID_ARGUMENT, naming the file and, where there is one, the tensor:
//     file shorter than 8 bytes; header length beyond the file or above
//     16 MiB; header not valid JSON or not an object; an entry that is not an
//     object, lacks dtype/shape/data_offsets or has wrong JSON types; a dtype
//     other than F32, F16, BF16, F64 (named); a negative dimension;
//     data_offsets not [begin, end] with begin <= end; end beyond the data
//     buffer; end - begin != numel * dtype size; two tensors' byte ranges
//     overlapping; "__metadata__" not an object of string -> string.
// Gaps between tensors in the data buffer are tolerated (the Hugging Face
// writer never produces them, but they do not make the data ambiguous).
absl::StatusOr<SafetensorsContents> ReadSafetensors(const std::string& path);

// The names and shapes of the file's tensors, in ascending data_offsets
// order, read from its header alone (at most 16 MiB, whatever the file's
// size): what a check of a file's fit needs without holding its data. The
// same header checks and errors as ReadSafetensors, against the file's
// size; the data itself is not read (nor its values checked).
struct SafetensorsShape {
  std::string name;
  Shape shape;
};
absl::StatusOr<std::vector<SafetensorsShape>> ReadSafetensorsShapes(const std::string& path);
// The same from the file open at `fd` (taken over and closed; e.g. opened
// by OpenRealPathNoLinks after a root check); `path` names it in errors.
absl::StatusOr<std::vector<SafetensorsShape>> ReadSafetensorsShapesFrom(ScopedFd fd,
                                                                        const std::string& path);

// ReadSafetensors of only the tensors `wanted` accepts (by name), in the
// file's data order: the header is read and checked whole as ReadSafetensors
// checks it, then each wanted tensor's bytes alone, one tensor at a time.
// So peak memory is the wanted tensors in fp32 plus the largest one's raw
// bytes, not the file: a stage loading its units from a large checkpoint,
// or a file with tensors nobody asked for. DATA_LOSS when the file shrinks
// while read; other errors as ReadSafetensors.
absl::StatusOr<SafetensorsContents> ReadSafetensorsTensors(
    const std::string& path, const std::function<bool(std::string_view)>& wanted);
// The same from the file open at `fd` (taken over and closed), as
// ReadSafetensorsShapesFrom.
absl::StatusOr<SafetensorsContents> ReadSafetensorsTensorsFrom(
    ScopedFd fd, const std::string& path, const std::function<bool(std::string_view)>& wanted);

// The "__metadata__" of the file open at `fd` (borrowed: left open, its
// position untouched), read leniently: for a caller whose strict read
// failed, to learn what the file says it is (a later format version that
// stores a dtype this reader does not know is another writer's file, not a
// corrupt one). The header's length is bounded as ReadSafetensors bounds it
// before anything is parsed, and the header must be a JSON object; nothing
// else is checked: the tensor entries are ignored, a "__metadata__" that is
// not an object reads as none, and values that are not strings are left
// out. Nothing it returns vouches for the file's data.
// Errors: INVALID_ARGUMENT naming the file (shorter than 8 bytes, header
// length beyond the file or above 16 MiB, header not a JSON object, not a
// regular file); DATA_LOSS when the file shrinks while read; other errno
// codes via absl::ErrnoToStatus.
absl::StatusOr<SafetensorsMetadata> ReadSafetensorsMetadataLeniently(int fd,
                                                                     const std::string& path);

// ReadSafetensors of a file already in memory (e.g. read once to check its
// checksum); `path` only names it in errors.
absl::StatusOr<SafetensorsContents> ParseSafetensors(std::string_view bytes,
                                                     const std::string& path);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_SAFETENSORS_H_
