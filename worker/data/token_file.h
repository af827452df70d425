// Token files: the corpus formats a training job can read.
//
// A corpus is loaded whole into memory as uint16 token ids. Three on-disk
// forms are supported:
//   text           every byte is one token (byte-level vocabulary of 256);
//   uint16         raw little-endian uint16 tokens, no header;
//   uint16-header  llm.c's form: 256 little-endian int32 header words
//                  ([0] magic 20240520, [1] version 1, [2] token count, rest
//                  unused), then `count` little-endian uint16 tokens.
// All functions are thread-safe (they share no state).
#ifndef PIPETRAIN_WORKER_DATA_TOKEN_FILE_H_
#define PIPETRAIN_WORKER_DATA_TOKEN_FILE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pipetrain {

enum class DataFormat { kAuto, kText, kUint16, kUint16Header };

// Constants of the llm.c header form.
inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr int kTokenFileHeaderInts = 256;
inline constexpr int64_t kTokenFileHeaderBytes = kTokenFileHeaderInts * 4;

// "auto", "text", "uint16", "uint16-header" -> enum (exact, lower case).
// Errors: INVALID_ARGUMENT naming `name` and listing the accepted names.
absl::StatusOr<DataFormat> ParseDataFormat(std::string_view name);

// The inverse of ParseDataFormat ("auto", "text", ...).
std::string DataFormatName(DataFormat format);

// How LoadTokenFile reads a file.
struct TokenFileLoadOptions {
  // The name the file was given (spec.data.path, --data) when `path` is
  // another name for it, such as its real path (ResolveUnderRoots): a
  // symbolic link "train.bin" to a hash-named file must be read as the
  // name says, as train-local reads it. kAuto looks at this name's
  // extension, and messages about the contents name it. Empty: `path`.
  std::string name;
  // The most bytes the file may have: a larger one is RESOURCE_EXHAUSTED
  // ("<path>: N bytes exceeds the limit of M bytes for a token file")
  // before anything is allocated for it. A corpus takes up to 3x its file's
  // size while it loads (text: the bytes, then 2 bytes per token). 0: no
  // bound.
  int64_t max_bytes = 0;
  // `path` is a real path a root check approved (ResolveUnderRoots): it is
  // opened following no symbolic link (OpenRealPathNoLinks), so a link
  // swapped in after the check is refused (INVALID_ARGUMENT), not read.
  bool path_is_checked_real = false;
  // Set by another thread (a runner's Stop) to end the load early:
  // CANCELLED, checked before each kTokenFileReadChunkBytes read, so that
  // a large file on slow storage does not hold a stop up for minutes.
  // nullptr: read to the end.
  const std::atomic<bool>* stop = nullptr;
  // Tests: called after each read() with the bytes read so far (one that
  // changes the file there shows the load noticing). Empty: nothing.
  std::function<void(size_t read_so_far)> after_read_for_test;
};

// The most bytes LoadTokenFile reads in one read() call (between checks
// of TokenFileLoadOptions::stop).
inline constexpr size_t kTokenFileReadChunkBytes = size_t{64} << 20;

// Loads the whole corpus at `path` as token ids, reading the file in one go.
//   kText:         each byte is a token 0..255; requires vocab_size >= 256.
//   kUint16:       raw little-endian uint16 tokens; the byte count must be even.
//   kUint16Header: header form described above; the payload must hold exactly
//                  the number of tokens the header states.
//   kAuto:         kUint16Header if the file is >= 1024 bytes and starts with
//                  the magic, or holds a header whose magic alone is damaged
//                  (version 1 and a count matching the file's size: refused
//                  as "bad magic"); else kUint16 if the name (options.name,
//                  else `path`) ends in ".bin" or ".u16"; else kText.
// Requires vocab_size >= 1 (else INVALID_ARGUMENT).
// Errors (every message starts with `path`, or with options.name for
// those about the contents; with path_is_checked_real, an open that fails
// is OpenRealPathNoLinks' error, starting with "spec.data.path: ": its
// errno's code, e.g. PERMISSION_DENIED, or INVALID_ARGUMENT for a link
// swapped in):
//   NOT_FOUND         the file is missing, unreadable or not a regular file.
//   RESOURCE_EXHAUSTED the file is larger than options.max_bytes (only then).
//   UNAVAILABLE       the open failed for want of file descriptors or memory
//                     (EMFILE, ENFILE, ENOMEM), or the file changed while it
//                     was read (its size or modification time differs after
//                     the read, or it ended early): states that may pass. A
//                     rewrite of the same size within one tick of the file
//                     system's modification-time clock is not seen.
//   CANCELLED         options.stop was set during the read.
//   INVALID_ARGUMENT  empty file or zero tokens ("empty"); kText with
//                     vocab_size < 256; odd byte count for kUint16
//                     ("truncated"); for kUint16Header: file shorter than the
//                     header, bad magic (found vs expected), unsupported
//                     version, fewer payload bytes than the count says
//                     ("truncated: header says N tokens, file holds M"),
//                     trailing bytes after the tokens; any token id >=
//                     vocab_size (names the position, the id and vocab_size).
//   INTERNAL          a read error after the file was opened.
absl::StatusOr<std::vector<uint16_t>> LoadTokenFile(const std::string& path, DataFormat format,
                                                    int vocab_size,
                                                    const TokenFileLoadOptions& options = {});

// LoadTokenFile on a file's contents already in memory: `path` names the
// file in messages and picks kUint16 for kAuto by its extension, as above.
// The same INVALID_ARGUMENT errors; `bytes` is only read during the call.
absl::StatusOr<std::vector<uint16_t>> ParseTokenFile(const std::string& path,
                                                     std::string_view bytes, DataFormat format,
                                                     int vocab_size);

// Writes `tokens` as little-endian uint16, preceded by the llm.c header when
// `with_header`. Atomic: writes a fresh temporary beside `path` (TempPathFor;
// created exclusively, so nothing planted under its name is written
// through), syncs it and renames it over `path`, so readers never see a
// partial file.
// Errors: INVALID_ARGUMENT when with_header and tokens.size() > INT32_MAX;
// NOT_FOUND when the directory does not exist; another errno-derived code
// (e.g. PERMISSION_DENIED) for other I/O failures. Messages start with `path`.
absl::Status WriteUint16TokenFile(const std::string& path, const std::vector<uint16_t>& tokens,
                                  bool with_header);

// Writes `bytes` verbatim to `path`, atomically as above (text corpora, and
// tests that need malformed files). Errors as WriteUint16TokenFile.
absl::Status WriteBytesFile(const std::string& path, std::string_view bytes);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_DATA_TOKEN_FILE_H_
