#include "common/safetensors.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/confined_path.h"
#include "common/errno_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/temp_file.h"
#include "nlohmann/json.hpp"

// The format is little-endian and tensor bytes are copied as they are.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors I/O assumes a little-endian host");

namespace pipetrain {
namespace {

using nlohmann::json;

constexpr char kMetadataKey[] = "__metadata__";
// Real headers are a few hundred KiB at most; a larger length means the file
// is corrupt or not safetensors, and must not drive a huge allocation. Its
// JSON costs some 15 times its size to parse (a header of a million empty
// tensors), and a coordinator parses init.from's at submit: 16 MiB, not
// more.
constexpr uint64_t kMaxHeaderBytes = kMaxSafetensorsHeaderBytes;
constexpr uint64_t kLengthBytes = kSafetensorsLengthBytes;
constexpr uint64_t kDataAlignment = 8;

// ---------------------------------------------------------------------------
// File I/O.

absl::Status ErrnoError(int error_number, absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(error_number, absl::StrCat(what, " ", path));
}

// As ErrnoError, carrying the errno (ErrnoOf), for SafetensorsFileWriter::
// Create's errors alone: its caller tells a passing shortage (EMFILE: retry)
// from a full disk (ENOSPC: fail), both RESOURCE_EXHAUSTED. Not everywhere:
// ToString shows a payload, and the errors of the helpers Create shares
// with WriteSafetensors (exports, train-local, checkpoints) are printed to
// users: those carry it only when Create asks (`carry_errno`).
absl::Status ErrnoCarryingError(int error_number, absl::string_view what, const std::string& path) {
  return ErrnoStatus(error_number, absl::StrCat(what, " ", path));
}

// ErrnoCarryingError when `carry_errno`, else ErrnoError.
absl::Status ErrnoErrorCarryingIf(bool carry_errno, int error_number, absl::string_view what,
                                  const std::string& path) {
  return carry_errno ? ErrnoCarryingError(error_number, what, path)
                     : ErrnoError(error_number, what, path);
}

absl::Status WriteAll(int fd, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError(errno, "cannot write", path);
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

struct FileBytes {
  std::unique_ptr<char[]> data;  // Not value-initialised: the read fills it.
  uint64_t size = 0;
};

absl::Status ReadAll(int fd, FileBytes& bytes, const std::string& path) {
  uint64_t done = 0;
  while (done < bytes.size) {
    ssize_t n = read(fd, bytes.data.get() + done, bytes.size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError(errno, "cannot read", path);
    if (n == 0) {
      return absl::DataLossError(absl::StrCat("safetensors file ", path,
                                              " shrank while being read (", done, " of ",
                                              bytes.size, " bytes)"));
    }
    done += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

// ReadAll from `offset` on (pread: the descriptor's position is untouched).
absl::Status ReadAllAt(int fd, FileBytes& bytes, uint64_t offset, const std::string& path) {
  uint64_t done = 0;
  while (done < bytes.size) {
    ssize_t n =
        pread(fd, bytes.data.get() + done, bytes.size - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError(errno, "cannot read", path);
    if (n == 0) {
      return absl::DataLossError(absl::StrCat("safetensors file ", path,
                                              " shrank while being read (", done, " of ",
                                              bytes.size, " bytes at ", offset, ")"));
    }
    done += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<FileBytes> ReadWholeFile(const std::string& path) {
  // O_NONBLOCK: a FIFO opens at once (and is refused as not a regular file)
  // instead of blocking until some writer comes; regular files ignore it.
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoError(errno, "cannot open safetensors file", path);
  struct stat st;
  absl::Status status;
  FileBytes bytes;
  if (fstat(fd, &st) != 0) {
    status = ErrnoError(errno, "cannot stat", path);
  } else if (!S_ISREG(st.st_mode)) {
    status =
        absl::InvalidArgumentError(absl::StrCat("safetensors file ", path, ": not a regular file"));
  } else {
    bytes.size = static_cast<uint64_t>(st.st_size);
    bytes.data.reset(new char[std::max<uint64_t>(bytes.size, 1)]);
    status = ReadAll(fd, bytes, path);
  }
  close(fd);
  if (!status.ok()) return status;
  return bytes;
}


// ---------------------------------------------------------------------------
// Writing.

bool IsValidUtf8(const std::string& s) {
  try {
    json(s).dump();  // Throws type_error 316 on invalid UTF-8.
    return true;
  } catch (const json::exception&) {
    return false;
  }
}

// What a file's tensor names must be: non-empty, distinct, not the metadata
// key, valid UTF-8. `name_of(i)` is tensor i's name, for i < count.
template <typename NameOf>
absl::Status ValidateNames(size_t count, const NameOf& name_of) {
  std::set<std::string_view> seen;
  for (size_t i = 0; i < count; ++i) {
    const std::string& name = name_of(i);
    std::string who = absl::StrCat("tensor #", i, " \"", absl::CHexEscape(name), "\"");
    if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(who, " has an empty name"));
    if (name == kMetadataKey) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": the name ", kMetadataKey, " is reserved for metadata"));
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": duplicate tensor name"));
    }
    if (!IsValidUtf8(name)) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": name is not valid UTF-8"));
    }
  }
  return absl::OkStatus();
}

// Metadata a header can hold: UTF-8 keys and values (nlohmann's dump()
// throws on anything else).
absl::Status ValidateMetadata(const SafetensorsMetadata& metadata) {
  for (const auto& [key, value] : metadata) {
    if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata entry \"", absl::CHexEscape(key), "\" is not valid UTF-8"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateForWrite(const std::vector<NamedTensor>& tensors,
                              const SafetensorsMetadata& metadata) {
  RETURN_IF_ERROR(ValidateNames(tensors.size(),
                                [&](size_t i) -> const std::string& { return tensors[i].name; }));
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].tensor.is_null()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor #", i, " \"", absl::CHexEscape(tensors[i].name), "\" is a null tensor"));
    }
  }
  return ValidateMetadata(metadata);
}

// The header JSON padded with spaces so that the data buffer, which follows
// the 8-byte length and the header, starts at an 8-byte aligned offset.
// Requires ValidateForWrite to have passed (so dump() cannot throw).
std::string BuildHeader(const std::vector<SafetensorsTensorSpec>& tensors,
                        const SafetensorsMetadata& metadata) {
  // ordered_json keeps the tensors in file order, which makes files readable.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsTensorSpec& t : tensors) {
    uint64_t end = offset + static_cast<uint64_t>(NumElements(t.shape)) * sizeof(float);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text = header.dump();
  text.append((kDataAlignment - text.size() % kDataAlignment) % kDataAlignment, ' ');
  return text;
}

std::string BuildHeader(const std::vector<NamedTensor>& tensors,
                        const SafetensorsMetadata& metadata) {
  std::vector<SafetensorsTensorSpec> specs;
  specs.reserve(tensors.size());
  for (const NamedTensor& t : tensors) specs.push_back({t.name, t.tensor.shape()});
  return BuildHeader(specs, metadata);
}

absl::Status WriteContents(int fd, const std::string& header,
                           const std::vector<NamedTensor>& tensors, const std::string& path,
                           const std::function<bool()>& stopped = nullptr) {
  uint64_t length = header.size();
  RETURN_IF_ERROR(WriteAll(fd, &length, sizeof(length), path));
  RETURN_IF_ERROR(WriteAll(fd, header.data(), header.size(), path));
  for (const NamedTensor& t : tensors) {
    if (stopped && stopped()) {
      return absl::CancelledError(absl::StrCat(path, ": the writer stopped before ", t.name));
    }
    if (t.tensor.numel() == 0) continue;
    // Host memory only: a device tensor's pointer cannot be written.
    PT_CHECK(!t.tensor.on_device()) << t.name << " is on a device: write a host copy";
    RETURN_IF_ERROR(
        WriteAll(fd, t.tensor.data(), static_cast<size_t>(t.tensor.size_bytes()), path));
  }
  return absl::OkStatus();
}

// Whether `entry` is "<prefix>.tmp.<digits>.<digits>": a temporary's name
// (TempNameFor) with `prefix` the final name's first kTempPrefixBytes.
bool IsTemporaryOf(const std::string& prefix, const std::string& entry) {
  return absl::StartsWith(entry, absl::StrCat(prefix, ".tmp.")) &&
         entry.rfind(".tmp.") == prefix.size() && HasTemporarySuffix(entry);
}

// The temporaries this process's writers hold, by name (TempNameFor's are
// unique within a process), from before the file is created until it is
// renamed or removed. The cleanup leaves them alone whatever their lock
// says: a writer locks its file a moment after creating it, and on NFS
// flock is a whole-file POSIX lock, which is per process, so another
// descriptor of this process would take it beside the writer's.
class OwnTemporaries {
 public:
  static void Add(const std::string& tmp) {
    AnnotatedMutexLock lock(&mu());
    names().insert(tmp);
  }
  static void Remove(const std::string& tmp) {
    AnnotatedMutexLock lock(&mu());
    names().erase(tmp);
  }
  static bool Holds(const std::string& tmp) {
    AnnotatedMutexLock lock(&mu());
    return names().count(tmp) > 0;
  }

 private:
  static AnnotatedMutex& mu() {
    static AnnotatedMutex* mu = new AnnotatedMutex();
    return *mu;
  }
  static std::set<std::string>& names() {
    static std::set<std::string>* names = new std::set<std::string>();
    return *names;
  }
};

// Removes `entry` from `dir_fd` if it is a regular file that no writer holds
// (OwnTemporaries, or locked: CreateLockedTemporary); true if it was
// removed. Opened for writing where it can be: NFS refuses an exclusive
// flock on a descriptor open read-only (EBADF), and every dead writer's
// file there would stay. The lock taken to find out is held across the
// unlink, and the name must still be the file locked (a writer may have
// renamed it away between the open and the lock, and dropped its lock
// after). Never opened unless a regular file: opening a device can act.
bool RemoveIfAbandoned(int dir_fd, const std::string& entry) {
  struct stat before;
  if (OwnTemporaries::Holds(entry) ||
      fstatat(dir_fd, entry.c_str(), &before, AT_SYMLINK_NOFOLLOW) != 0 ||
      !S_ISREG(before.st_mode)) {
    return false;
  }
  constexpr int kFlags = O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
  int fd = openat(dir_fd, entry.c_str(), O_RDWR | kFlags);
  if (fd < 0 && errno == EACCES) fd = openat(dir_fd, entry.c_str(), O_RDONLY | kFlags);
  if (fd < 0) return false;
  struct stat locked, named;
  const bool abandoned = fstat(fd, &locked) == 0 && S_ISREG(locked.st_mode) &&
                         flock(fd, LOCK_EX | LOCK_NB) == 0 &&
                         fstatat(dir_fd, entry.c_str(), &named, AT_SYMLINK_NOFOLLOW) == 0 &&
                         named.st_dev == locked.st_dev && named.st_ino == locked.st_ino &&
                         unlinkat(dir_fd, entry.c_str(), 0) == 0;
  close(fd);
  return abandoned;
}

// Creates the temporary file `tmp` in `dir_fd` (never through a symbolic
// link) and locks it: a writer holds an exclusive flock on its temporary
// until the file is renamed or removed, which is how
// RemoveAbandonedTemporaries tells a living writer's file from a dead one's.
// The lock is taken a moment after the file appears; a file system without
// flock leaves it unlocked, and the cleanup then leaves such files alone too.
// TempNameFor's names do not repeat, so an existing file under the name is
// an error (EEXIST), not a dead writer's to take over. `carry_errno`: the
// error carries the errno (SafetensorsFileWriter::Create's alone).
absl::StatusOr<int> CreateLockedTemporary(int dir_fd, const std::string& tmp, mode_t mode,
                                          bool carry_errno) {
  OwnTemporaries::Add(tmp);  // until CommitTemporary or the writer removes it
  const int fd =
      openat(dir_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) {
    const int error = errno;
    OwnTemporaries::Remove(tmp);
    return ErrnoErrorCarryingIf(carry_errno, error, "cannot create temporary file", tmp);
  }
  flock(fd, LOCK_EX | LOCK_NB);  // see above: no lock is not an error
  return fd;
}

// Syncs the temporary `tmp` (open as `fd`), renames it over `name` and
// closes it, in that order: the descriptor, and so the lock, is held until
// the rename. On failure the temporary is removed. `shown` names the file.
absl::Status CommitTemporary(int dir_fd, int fd, const std::string& tmp, const std::string& name,
                             const std::string& shown, absl::Status status) {
  if (status.ok() && fsync(fd) != 0) status = ErrnoError(errno, "cannot fsync", shown);
  // The rename would put this file in place of a device, FIFO or socket
  // (as root, of /dev/null itself): refused. A symbolic link is replaced,
  // its target untouched; a directory makes the rename fail (EISDIR).
  struct stat existing;
  if (status.ok() && fstatat(dir_fd, name.c_str(), &existing, AT_SYMLINK_NOFOLLOW) == 0 &&
      (S_ISCHR(existing.st_mode) || S_ISBLK(existing.st_mode) || S_ISFIFO(existing.st_mode) ||
       S_ISSOCK(existing.st_mode))) {
    status = absl::FailedPreconditionError(
        absl::StrCat(shown, " is a device, FIFO or socket, not a file; not replaced"));
  }
  if (status.ok() && renameat(dir_fd, tmp.c_str(), dir_fd, name.c_str()) != 0) {
    status = ErrnoError(errno, absl::StrCat("cannot rename ", tmp, " to"), shown);
  }
  if (!status.ok()) unlinkat(dir_fd, tmp.c_str(), 0);
  OwnTemporaries::Remove(tmp);  // renamed or removed: no file has its name
  // After a good fsync, close reports nothing new about the data: the file
  // is in place and durable whatever it says.
  close(fd);
  if (!status.ok()) return status;
  // Makes the rename durable; best effort, since the data is already safe and
  // a failure here (a file system without directory fsync) is not an error.
  fsync(dir_fd);
  return absl::OkStatus();
}

// Writes all of `data` at `offset` of `fd`; `carry_errno` as
// CreateLockedTemporary's.
absl::Status WriteAllAt(int fd, const void* data, size_t size, uint64_t offset,
                        const std::string& path, bool carry_errno) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = pwrite(fd, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoErrorCarryingIf(carry_errno, errno, "cannot write", path);
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

// Reserves the first `size` bytes of `fd` on the disk, so that a full disk
// or quota says so now: 0, or the errno of a failure (ENOSPC, EDQUOT, EFBIG,
// EIO, ...). A file system without fallocate(2) (EOPNOTSUPP: NFS before
// 4.2, EFS, Filestore, CephFS, FUSE; ENOSYS: a kernel without it) gets no
// reservation, and 0: the writes and the fsync still report a full disk.
// Not posix_fallocate: there glibc emulates it by reading and writing a byte
// of every block, which fails on a descriptor open for writing only (EBADF:
// every job's final weights failed on such a volume), and would be a write
// every 4 KiB over NFS.
int ReserveSpace(int fd, uint64_t size) {
  while (fallocate(fd, /*mode=*/0, 0, static_cast<off_t>(size)) != 0) {
    if (errno == EINTR) continue;
    if (errno == EOPNOTSUPP || errno == ENOSYS) return 0;
    return errno;
  }
  return 0;
}

// The writer behind WriteSafetensors and WriteSafetensorsAt: `name` in
// `dir_fd`, with `shown` naming the file in messages.
absl::Status WriteInDirectory(int dir_fd, const std::string& name, const std::string& shown,
                              const std::vector<NamedTensor>& tensors,
                              const SafetensorsMetadata& metadata, mode_t mode,
                              const std::function<bool()>& stopped = nullptr) {
  absl::Status valid = ValidateForWrite(tensors, metadata);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write safetensors file ", shown, ": ", valid.message()));
  }
  const std::string header = BuildHeader(tensors, metadata);
  const std::string tmp = TempNameFor(name);
  ASSIGN_OR_RETURN(const int fd, CreateLockedTemporary(dir_fd, tmp, mode, /*carry_errno=*/false));
  // Errors name the file the caller asked for, not the temporary.
  return CommitTemporary(dir_fd, fd, tmp, name, shown,
                         WriteContents(fd, header, tensors, shown, stopped));
}

// ---------------------------------------------------------------------------
// Reading: header validation.

enum class Dtype { kF32, kF16, kBF16, kF64 };

struct Entry {
  std::string name;
  Dtype dtype;
  uint64_t dtype_size;
  Shape shape;
  uint64_t begin;  // Relative to the data buffer.
  uint64_t end;
};

absl::Status FileError(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors file ", path, ": ", what));
}

absl::Status TensorError(const std::string& path, const std::string& name, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("safetensors file ", path, ", tensor \"", absl::CHexEscape(name), "\": ", what));
}

absl::Status ParseDtype(const std::string& path, const json& value, Entry& entry) {
  if (!value.is_string()) return TensorError(path, entry.name, "dtype must be a string");
  const std::string& name = value.get_ref<const std::string&>();
  if (name == "F32") {
    entry.dtype = Dtype::kF32, entry.dtype_size = 4;
  } else if (name == "F16") {
    entry.dtype = Dtype::kF16, entry.dtype_size = 2;
  } else if (name == "BF16") {
    entry.dtype = Dtype::kBF16, entry.dtype_size = 2;
  } else if (name == "F64") {
    entry.dtype = Dtype::kF64, entry.dtype_size = 8;
  } else {
    return TensorError(path, entry.name,
                       absl::StrCat("unsupported dtype \"", absl::CHexEscape(name),
                                    "\" (supported: F32, F16, BF16, F64)"));
  }
  return absl::OkStatus();
}

// Also rejects shapes whose element count overflows int64 (left to right, as
// NumElements multiplies), so a hostile header cannot trigger overflow later.
absl::Status ParseShape(const std::string& path, const json& value, Entry& entry) {
  if (!value.is_array()) return TensorError(path, entry.name, "shape must be an array of integers");
  int64_t numel = 1;
  for (const json& d : value) {
    if (d.is_number_unsigned()) {
      uint64_t dim = d.get<uint64_t>();
      int64_t product = 0;
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(numel, static_cast<int64_t>(dim), &product)) {
        // Worded for [2^32, 2^32, 0] too: no element, but the running
        // product (as NumElements forms it) passes 2^63 before the 0.
        return TensorError(path, entry.name,
                           "shape's dimensions, multiplied left to right, pass 2^63");
      }
      numel = product;
      entry.shape.push_back(static_cast<int64_t>(dim));
    } else if (d.is_number_integer()) {
      return TensorError(path, entry.name,
                         absl::StrCat("negative dimension ", d.get<int64_t>(), " in shape"));
    } else {
      return TensorError(path, entry.name, "shape must be an array of integers");
    }
  }
  return absl::OkStatus();
}

absl::Status ParseOffsets(const std::string& path, const json& value, uint64_t data_size,
                          Entry& entry) {
  if (!value.is_array() || value.size() != 2 || !value[0].is_number_unsigned() ||
      !value[1].is_number_unsigned()) {
    return TensorError(path, entry.name,
                       "data_offsets must be [begin, end] of non-negative integers");
  }
  entry.begin = value[0].get<uint64_t>();
  entry.end = value[1].get<uint64_t>();
  if (entry.begin > entry.end) {
    return TensorError(
        path, entry.name,
        absl::StrCat("data_offsets [", entry.begin, ", ", entry.end, "] has begin > end"));
  }
  if (entry.end > data_size) {
    return TensorError(
        path, entry.name,
        absl::StrCat("data_offsets end ", entry.end, " is beyond the data buffer of ", data_size,
                     " bytes (truncated file?)"));
  }
  return absl::OkStatus();
}

absl::Status CheckByteCount(const std::string& path, const Entry& entry) {
  uint64_t span = entry.end - entry.begin;
  uint64_t numel = static_cast<uint64_t>(NumElements(entry.shape));
  if (span % entry.dtype_size != 0 || span / entry.dtype_size != numel) {
    return TensorError(
        path, entry.name,
        absl::StrCat("data_offsets span ", span, " bytes but shape ", ShapeToString(entry.shape),
                     " needs ", numel, " elements of ", entry.dtype_size, " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Entry> ParseEntry(const std::string& path, const std::string& name,
                                 const json& value, uint64_t data_size) {
  Entry entry;
  entry.name = name;
  if (!value.is_object()) {
    return TensorError(path, name, "entry must be an object with dtype, shape and data_offsets");
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(key)) {
      return TensorError(path, name, absl::StrCat("entry has no \"", key, "\""));
    }
  }
  RETURN_IF_ERROR(ParseDtype(path, value["dtype"], entry));
  RETURN_IF_ERROR(ParseShape(path, value["shape"], entry));
  RETURN_IF_ERROR(ParseOffsets(path, value["data_offsets"], data_size, entry));
  RETURN_IF_ERROR(CheckByteCount(path, entry));
  return entry;
}

absl::StatusOr<SafetensorsMetadata> ParseMetadata(const std::string& path, const json& value) {
  if (!value.is_object()) {
    return FileError(path, "__metadata__ must be an object of string -> string");
  }
  SafetensorsMetadata metadata;
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string()) {
      return FileError(path, absl::StrCat("__metadata__ value for key \"", absl::CHexEscape(key),
                                          "\" must be a string"));
    }
    metadata[key] = v.get<std::string>();
  }
  return metadata;
}

// Requires entries sorted by (begin, end). Empty ranges hold no bytes and so
// overlap nothing.
absl::Status CheckNoOverlap(const std::string& path, const std::vector<Entry>& entries) {
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    if (e.begin == e.end) continue;
    if (previous != nullptr && e.begin < previous->end) {
      return TensorError(path, e.name,
                         absl::StrCat("bytes [", e.begin, ", ", e.end, ") overlap tensor \"",
                                      absl::CHexEscape(previous->name), "\" at [", previous->begin,
                                      ", ", previous->end, ")"));
    }
    previous = &e;
  }
  return absl::OkStatus();
}

absl::StatusOr<json> ParseHeaderJson(const std::string& path, const char* begin, const char* end) {
  json header;
  try {
    header = json::parse(begin, end);
  } catch (const json::exception& e) {
    return FileError(path, absl::StrCat("header is not valid JSON: ", e.what()));
  }
  if (!header.is_object()) return FileError(path, "header is not a JSON object");
  return header;
}

// ---------------------------------------------------------------------------
// Reading: conversion to fp32.

float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// IEEE binary16 -> binary32, exact (every half value is a float value).
float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  if (exponent == 0x1f) return BitsToFloat(sign | 0x7f800000 | (mantissa << 13));  // Inf / NaN.
  if (exponent != 0) return BitsToFloat(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
  if (mantissa == 0) return BitsToFloat(sign);  // +-0.
  // Subnormal: mantissa * 2^-24. Shift the leading 1 up to the implicit bit.
  int32_t e = 127 - 15 + 1;
  while ((mantissa & 0x400) == 0) {
    mantissa <<= 1;
    --e;
  }
  return BitsToFloat(sign | (static_cast<uint32_t>(e) << 23) | ((mantissa & 0x3ff) << 13));
}

// bfloat16 is the top half of a binary32.
float BFloat16ToFloat(uint16_t b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

Tensor Decode(const Entry& entry, const char* bytes) {
  Tensor t = Tensor::Zeros(entry.shape);
  float* out = t.data();
  const int64_t n = t.numel();
  // memcpy per element: offsets in a foreign file need not be aligned.
  switch (entry.dtype) {
    case Dtype::kF32:
      if (n > 0) std::memcpy(out, bytes, static_cast<size_t>(n) * sizeof(float));
      break;
    case Dtype::kF16:
    case Dtype::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, bytes + 2 * i, sizeof(v));
        out[i] = entry.dtype == Dtype::kF16 ? HalfToFloat(v) : BFloat16ToFloat(v);
      }
      break;
    case Dtype::kF64:
      for (int64_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, bytes + 8 * i, sizeof(v));
        out[i] = static_cast<float>(v);
      }
      break;
  }
  return t;
}

// Validates every header entry and returns the tensors' entries sorted by
// offset; fills `metadata` from "__metadata__".
absl::StatusOr<std::vector<Entry>> ParseEntries(const std::string& path, const json& header,
                                                uint64_t data_size, SafetensorsMetadata& metadata) {
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      ASSIGN_OR_RETURN(metadata, ParseMetadata(path, value));
      continue;
    }
    ASSIGN_OR_RETURN(Entry entry, ParseEntry(path, name, value, data_size));
    entries.push_back(std::move(entry));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  RETURN_IF_ERROR(CheckNoOverlap(path, entries));
  return entries;
}

}  // namespace


absl::Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                              const SafetensorsMetadata& metadata) {
  const size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return ErrnoError(errno, "cannot open the directory of", path);
  absl::Status status =
      WriteInDirectory(dir_fd, slash == std::string::npos ? path : path.substr(slash + 1), path,
                       tensors, metadata, 0644);
  close(dir_fd);
  return status;
}

absl::StatusOr<std::unique_ptr<SafetensorsFileWriter>> SafetensorsFileWriter::Create(
    int dir_fd, const std::string& name, std::vector<SafetensorsTensorSpec> tensors, mode_t mode,
    const SafetensorsMetadata& metadata) {
  absl::Status valid = ValidateNames(
      tensors.size(), [&](size_t i) -> const std::string& { return tensors[i].name; });
  if (valid.ok()) valid = ValidateMetadata(metadata);
  for (size_t i = 0; valid.ok() && i < tensors.size(); ++i) {
    for (int64_t d : tensors[i].shape) {
      if (d < 0)
        valid =
            absl::InvalidArgumentError(absl::StrCat(tensors[i].name, " has a negative dimension"));
    }
  }
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write safetensors file ", name, ": ", valid.message()));
  }
  const std::string header = BuildHeader(tensors, metadata);
  std::vector<uint64_t> begin;
  uint64_t offset = kLengthBytes + header.size();
  for (const SafetensorsTensorSpec& t : tensors) {
    begin.push_back(offset);
    offset += static_cast<uint64_t>(NumElements(t.shape)) * sizeof(float);
  }
  const int dir = fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
  if (dir < 0) return ErrnoCarryingError(errno, "cannot duplicate the directory of", name);
  const std::string tmp = TempNameFor(name);
  absl::StatusOr<int> created = CreateLockedTemporary(dir, tmp, mode, /*carry_errno=*/true);
  if (!created.ok()) {
    close(dir);
    return created.status();
  }
  const int fd = *created;
  // From here the writer owns both descriptors and removes the file.
  std::unique_ptr<SafetensorsFileWriter> writer(
      new SafetensorsFileWriter(dir, fd, name, tmp, std::move(tensors), std::move(begin)));
  const uint64_t length = header.size();
  // Errors name the file being written, not its temporary.
  RETURN_IF_ERROR(WriteAllAt(fd, &length, sizeof(length), 0, name, /*carry_errno=*/true));
  RETURN_IF_ERROR(
      WriteAllAt(fd, header.data(), header.size(), kLengthBytes, name, /*carry_errno=*/true));
  const int reserved = ReserveSpace(fd, offset);
  if (reserved != 0) {
    return ErrnoCarryingError(reserved, absl::StrCat("cannot reserve ", offset, " bytes for"),
                              name);
  }
  return writer;
}

SafetensorsFileWriter::SafetensorsFileWriter(int dir_fd, int fd, std::string name, std::string tmp,
                                             std::vector<SafetensorsTensorSpec> tensors,
                                             std::vector<uint64_t> begin)
    : dir_fd_(dir_fd),
      fd_(fd),
      name_(std::move(name)),
      tmp_(std::move(tmp)),
      tensors_(std::move(tensors)),
      begin_(std::move(begin)) {}

SafetensorsFileWriter::~SafetensorsFileWriter() {
  AnnotatedMutexLock lock(&mu_);
  if (!done_) {
    unlinkat(dir_fd_, tmp_.c_str(), 0);  // before the close drops the lock
    OwnTemporaries::Remove(tmp_);
    close(fd_);
  }
  close(dir_fd_);
}

absl::Status SafetensorsFileWriter::Write(size_t index, int64_t offset, const float* values,
                                          int64_t count) {
  AnnotatedMutexLock lock(&mu_);
  if (done_) return absl::FailedPreconditionError(absl::StrCat(name_, " is already committed"));
  if (index >= tensors_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("no tensor #", index, " in ", name_));
  }
  const int64_t numel = NumElements(tensors_[index].shape);
  // Compared without a sum: offset + count could overflow.
  if (offset < 0 || count < 0 || offset > numel || count > numel - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat(offset, " + ", count, " values exceed ", tensors_[index].name, "'s ", numel));
  }
  return WriteAllAt(fd_, values, static_cast<size_t>(count) * sizeof(float),
                    begin_[index] + static_cast<uint64_t>(offset) * sizeof(float), name_,
                    /*carry_errno=*/false);
}

absl::Status SafetensorsFileWriter::Sync() {
  AnnotatedMutexLock lock(&mu_);
  if (done_) return absl::FailedPreconditionError(absl::StrCat(name_, " is already committed"));
  if (fsync(fd_) != 0) return ErrnoError(errno, "cannot fsync", name_);
  return absl::OkStatus();
}

absl::Status SafetensorsFileWriter::Commit() {
  AnnotatedMutexLock lock(&mu_);
  if (done_) return absl::FailedPreconditionError(absl::StrCat(name_, " is already committed"));
  done_ = true;
  return CommitTemporary(dir_fd_, fd_, tmp_, name_, name_, absl::OkStatus());
}

std::vector<std::string> RemoveAbandonedTemporaries(int dir_fd, const std::string& name) {
  const std::string prefix = name.substr(0, kTempPrefixBytes);
  std::vector<std::string> candidates;
  // The directory opened anew, not dup'ed: a dup shares dir_fd's read
  // position, which the first listing leaves at the end, and every later
  // call on the same dir_fd listed nothing.
  const int listing = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (listing < 0) return {};
  DIR* dir = fdopendir(listing);
  if (dir == nullptr) {
    close(listing);
    return {};
  }
  while (const dirent* entry = readdir(dir)) {
    if (IsTemporaryOf(prefix, entry->d_name)) candidates.emplace_back(entry->d_name);
  }
  closedir(dir);  // closes `listing`
  std::vector<std::string> removed;
  for (const std::string& entry : candidates) {
    if (RemoveIfAbandoned(dir_fd, entry)) removed.push_back(entry);
  }
  return removed;
}

absl::Status WriteSafetensorsAt(int dir_fd, const std::string& name,
                                const std::vector<NamedTensor>& tensors,
                                const SafetensorsMetadata& metadata, mode_t mode,
                                const std::function<bool()>& stopped) {
  return WriteInDirectory(dir_fd, name, name, tensors, metadata, mode, stopped);
}

const Tensor* SafetensorsContents::Find(std::string_view name) const {
  for (const NamedTensor& t : tensors) {
    if (t.name == name) return &t.tensor;
  }
  return nullptr;
}

namespace {

// The checks of a file's first 8 bytes, the same whether it is read whole
// (ParseSafetensors) or header first (ReadHeader): the file holds them, and
// the length they give fits the file and the 16 MiB bound.
absl::Status CheckHoldsHeaderLength(const std::string& path, uint64_t file_size) {
  if (file_size >= kLengthBytes) return absl::OkStatus();
  return FileError(
      path, absl::StrCat("file is ", file_size, " bytes, shorter than the 8-byte header length"));
}

absl::Status CheckHeaderLength(const std::string& path, uint64_t header_size, uint64_t file_size) {
  if (header_size <= kMaxHeaderBytes && header_size <= file_size - kLengthBytes) {
    return absl::OkStatus();
  }
  return FileError(path,
                   absl::StrCat("header length ", header_size, " exceeds the file size ", file_size,
                                " or the 16 MiB limit; not a safetensors file or corrupt"));
}

}  // namespace

absl::StatusOr<SafetensorsContents> ParseSafetensors(std::string_view bytes,
                                                     const std::string& path) {
  RETURN_IF_ERROR(CheckHoldsHeaderLength(path, bytes.size()));
  uint64_t header_size;
  std::memcpy(&header_size, bytes.data(), sizeof(header_size));
  RETURN_IF_ERROR(CheckHeaderLength(path, header_size, bytes.size()));
  const char* header_begin = bytes.data() + kLengthBytes;
  const char* data = header_begin + header_size;
  const uint64_t data_size = bytes.size() - kLengthBytes - header_size;
  ASSIGN_OR_RETURN(json header, ParseHeaderJson(path, header_begin, data));
  SafetensorsContents contents;
  ASSIGN_OR_RETURN(std::vector<Entry> entries,
                   ParseEntries(path, header, data_size, contents.metadata));
  contents.tensors.reserve(entries.size());
  for (const Entry& e : entries) contents.tensors.push_back({e.name, Decode(e, data + e.begin)});
  return contents;
}

absl::StatusOr<SafetensorsContents> ReadSafetensors(const std::string& path) {
  ASSIGN_OR_RETURN(FileBytes file, ReadWholeFile(path));
  return ParseSafetensors(std::string_view(file.data.get(), file.size), path);
}

namespace {

// A file's validated header, its descriptor left open.
struct OpenedHeader {
  int fd = -1;
  uint64_t data_start = 0;  // the data buffer's offset in the file
  std::vector<Entry> entries;
  SafetensorsMetadata metadata;
  OpenedHeader() = default;
  OpenedHeader(OpenedHeader&& other) noexcept
      : fd(std::exchange(other.fd, -1)),
        data_start(other.data_start),
        entries(std::move(other.entries)),
        metadata(std::move(other.metadata)) {}
  OpenedHeader& operator=(OpenedHeader&&) = delete;
  ~OpenedHeader() {
    if (fd >= 0) close(fd);
  }
};

// The header of the file open at `fd`, parsed as JSON but not checked
// beyond that: its length is checked against the file's size and the
// 16 MiB bound before anything is allocated or parsed. Read at offsets
// (the descriptor's position is untouched); `*data_start` and
// `*data_size` get the data buffer's offset and size.
absl::StatusOr<json> ReadHeaderJson(int fd, const std::string& path, uint64_t* data_start,
                                    uint64_t* data_size) {
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoError(errno, "cannot stat", path);
  if (!S_ISREG(st.st_mode)) return FileError(path, "not a regular file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  RETURN_IF_ERROR(CheckHoldsHeaderLength(path, file_size));
  FileBytes length;
  length.size = kLengthBytes;
  length.data.reset(new char[kLengthBytes]);
  RETURN_IF_ERROR(ReadAllAt(fd, length, 0, path));
  uint64_t header_size;
  std::memcpy(&header_size, length.data.get(), sizeof(header_size));
  RETURN_IF_ERROR(CheckHeaderLength(path, header_size, file_size));
  FileBytes header_bytes;
  header_bytes.size = header_size;
  header_bytes.data.reset(new char[std::max<uint64_t>(header_size, 1)]);
  RETURN_IF_ERROR(ReadAllAt(fd, header_bytes, kLengthBytes, path));
  *data_start = kLengthBytes + header_size;
  *data_size = file_size - *data_start;
  return ParseHeaderJson(path, header_bytes.data.get(), header_bytes.data.get() + header_size);
}

// Reads and checks the header alone (at most 16 MiB, whatever the file's
// size), against the file's size: ReadSafetensors's checks but the data's.
// ReadHeader of the file open at `fd` (taken over).
absl::StatusOr<OpenedHeader> ReadHeaderFrom(ScopedFd file, const std::string& path) {
  OpenedHeader opened;
  opened.fd = file.release();
  uint64_t data_size = 0;
  ASSIGN_OR_RETURN(json header, ReadHeaderJson(opened.fd, path, &opened.data_start, &data_size));
  ASSIGN_OR_RETURN(opened.entries, ParseEntries(path, header, data_size, opened.metadata));
  return opened;
}

absl::StatusOr<OpenedHeader> ReadHeader(const std::string& path) {
  ScopedFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));  // as ReadWholeFile
  if (fd.get() < 0) return ErrnoError(errno, "cannot open safetensors file", path);
  return ReadHeaderFrom(std::move(fd), path);
}

absl::StatusOr<SafetensorsContents> ReadWanted(
    OpenedHeader opened, const std::string& path,
    const std::function<bool(std::string_view)>& wanted) {
  SafetensorsContents contents;
  contents.metadata = std::move(opened.metadata);
  for (const Entry& e : opened.entries) {
    if (!wanted(e.name)) continue;
    FileBytes raw;  // one tensor's bytes at a time
    raw.size = e.end - e.begin;
    raw.data.reset(new char[std::max<uint64_t>(raw.size, 1)]);
    RETURN_IF_ERROR(ReadAllAt(opened.fd, raw, opened.data_start + e.begin, path));
    contents.tensors.push_back({e.name, Decode(e, raw.data.get())});
  }
  return contents;
}

}  // namespace

absl::StatusOr<std::vector<SafetensorsShape>> ReadSafetensorsShapesFrom(ScopedFd fd,
                                                                        const std::string& path) {
  ASSIGN_OR_RETURN(OpenedHeader opened, ReadHeaderFrom(std::move(fd), path));
  std::vector<SafetensorsShape> shapes;
  shapes.reserve(opened.entries.size());
  for (Entry& e : opened.entries) shapes.push_back({std::move(e.name), std::move(e.shape)});
  return shapes;
}

absl::StatusOr<std::vector<SafetensorsShape>> ReadSafetensorsShapes(const std::string& path) {
  ScopedFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) return ErrnoError(errno, "cannot open safetensors file", path);
  return ReadSafetensorsShapesFrom(std::move(fd), path);
}

absl::StatusOr<SafetensorsContents> ReadSafetensorsTensors(
    const std::string& path, const std::function<bool(std::string_view)>& wanted) {
  ASSIGN_OR_RETURN(OpenedHeader opened, ReadHeader(path));
  return ReadWanted(std::move(opened), path, wanted);
}

absl::StatusOr<SafetensorsContents> ReadSafetensorsTensorsFrom(
    ScopedFd fd, const std::string& path, const std::function<bool(std::string_view)>& wanted) {
  ASSIGN_OR_RETURN(OpenedHeader opened, ReadHeaderFrom(std::move(fd), path));
  return ReadWanted(std::move(opened), path, wanted);
}

absl::StatusOr<SafetensorsMetadata> ReadSafetensorsMetadataLeniently(int fd,
                                                                     const std::string& path) {
  uint64_t data_start = 0;
  uint64_t data_size = 0;
  ASSIGN_OR_RETURN(json header, ReadHeaderJson(fd, path, &data_start, &data_size));
  SafetensorsMetadata metadata;
  const auto found = header.find(kMetadataKey);
  if (found == header.end() || !found->is_object()) return metadata;
  for (const auto& [key, value] : found->items()) {
    if (value.is_string()) metadata[key] = value.get<std::string>();
  }
  return metadata;
}

}  // namespace pipetrain
