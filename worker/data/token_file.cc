#include "worker/data/token_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/confined_path.h"
#include "common/echo_input.h"
#include "common/status_macros.h"
#include "common/temp_file.h"

namespace pipetrain {
namespace {

constexpr char kAcceptedFormats[] = "auto, text, uint16, uint16-header";

absl::Status Invalid(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// An open that failed for want of descriptors or memory (EMFILE, ENFILE,
// ENOMEM): this process's state, not the file's. UNAVAILABLE, not the
// RESOURCE_EXHAUSTED that absl::ErrnoToStatus makes of it, which callers
// read as "the file is larger than max_bytes" (and a worker would tell the
// user to use a smaller file, and fail a job that can recover).
absl::Status OutOfDescriptors(const std::string& path, absl::string_view why) {
  return absl::UnavailableError(
      absl::StrCat(path, ": cannot open the token file now (", why,
                   "): this process is out of file descriptors or memory"));
}

// Reads the whole regular file at `path` with one fstat and a read loop (no
// per-byte stream reads: a 100 MB corpus loads at memory speed); one of more
// than `max_bytes` (> 0) is refused before its buffer is allocated.
// `options`: LoadTokenFile's (its name is not used here).
absl::StatusOr<std::string> ReadWholeFile(const std::string& path,
                                          const TokenFileLoadOptions& options) {
  const int64_t max_bytes = options.max_bytes;
  const std::atomic<bool>* const stop = options.stop;
  // O_NONBLOCK: a FIFO opens at once (and is refused as not a regular file)
  // instead of blocking until some writer comes; regular files ignore it.
  ScopedFd file;
  if (options.path_is_checked_real) {
    absl::StatusOr<ScopedFd> opened = OpenRealPathNoLinks("spec.data.path", path);
    if (opened.status().code() == absl::StatusCode::kResourceExhausted) {
      return OutOfDescriptors(path, opened.status().message());
    }
    RETURN_IF_ERROR(opened.status());
    file = std::move(*opened);
  } else {
    file = ScopedFd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
    const int open_errno = errno;
    if (file.get() < 0 && (open_errno == EMFILE || open_errno == ENFILE || open_errno == ENOMEM)) {
      return OutOfDescriptors(path, std::strerror(open_errno));
    }
    if (file.get() < 0) {
      return absl::NotFoundError(absl::StrCat(path, ": cannot open token file (",
                                              std::strerror(open_errno), "); check the path"));
    }
  }
  const int fd = file.get();
  struct stat info;
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    return absl::NotFoundError(absl::StrCat(path, ": not a regular file; check the path"));
  }
  if (max_bytes > 0 && info.st_size > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(path, ": ", info.st_size,
                                                     " bytes exceeds the limit of ", max_bytes,
                                                     " bytes for a token file"));
  }
  std::string bytes(static_cast<size_t>(info.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    if (stop != nullptr && stop->load()) {
      return absl::CancelledError(
          absl::StrCat(path, ": stopped after reading ", done, " of ", bytes.size(), " bytes"));
    }
    const size_t chunk = std::min(bytes.size() - done, kTokenFileReadChunkBytes);
    ssize_t got = read(fd, bytes.data() + done, chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      return absl::InternalError(
          absl::StrCat(path, ": read failed after ", done, " bytes: ", std::strerror(errno)));
    }
    if (got == 0) break;  // it shrank while it was read (below)
    done += static_cast<size_t>(got);
    if (options.after_read_for_test) options.after_read_for_test(done);
  }
  // Rewritten in place while it was read (a copy over the live file, a
  // sync tool): what was read may be a prefix, or old and new bytes mixed.
  // Trained on, it fixed the job's data digest, and the workers that read
  // it whole were failed as having other tokens. A state that passes: the
  // next load (a recovery's) reads the finished file.
  struct stat after;
  if (done != bytes.size() || fstat(fd, &after) != 0 || after.st_size != info.st_size ||
      after.st_mtim.tv_sec != info.st_mtim.tv_sec ||
      after.st_mtim.tv_nsec != info.st_mtim.tv_nsec) {
    return absl::UnavailableError(absl::StrCat(path, ": the file changed while it was read (",
                                               info.st_size, " bytes when opened, ", done,
                                               " read); load it again once it is written"));
  }
  return bytes;
}

int32_t ReadInt32Le(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<int32_t>(static_cast<uint32_t>(u[0]) | static_cast<uint32_t>(u[1]) << 8 |
                              static_cast<uint32_t>(u[2]) << 16 |
                              static_cast<uint32_t>(u[3]) << 24);
}

// Decodes `count` little-endian uint16 values starting at `p`.
std::vector<uint16_t> DecodeUint16Le(const char* p, size_t count) {
  std::vector<uint16_t> tokens(count);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  if (count > 0) std::memcpy(tokens.data(), p, count * sizeof(uint16_t));
#else
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  for (size_t i = 0; i < count; ++i) {
    tokens[i] = static_cast<uint16_t>(u[2 * i] | u[2 * i + 1] << 8);
  }
#endif
  return tokens;
}

std::vector<uint16_t> ParseText(std::string_view bytes) {
  std::vector<uint16_t> tokens(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) tokens[i] = static_cast<unsigned char>(bytes[i]);
  return tokens;
}

absl::StatusOr<std::vector<uint16_t>> ParseRaw(const std::string& path, std::string_view bytes) {
  if (bytes.size() % 2 != 0) {
    return Invalid(path, absl::StrCat("truncated: raw uint16 token file has an odd size of ",
                                      bytes.size(), " bytes; is it really a uint16 file?"));
  }
  return DecodeUint16Le(bytes.data(), bytes.size() / 2);
}

absl::StatusOr<std::vector<uint16_t>> ParseWithHeader(const std::string& path,
                                                      std::string_view bytes) {
  if (static_cast<int64_t>(bytes.size()) < kTokenFileHeaderBytes) {
    return Invalid(path, absl::StrCat("file has ", bytes.size(), " bytes, shorter than the ",
                                      kTokenFileHeaderBytes, "-byte uint16-header header"));
  }
  int32_t magic = ReadInt32Le(bytes.data());
  if (magic != kTokenFileMagic) {
    return Invalid(path, absl::StrCat("bad magic: found ", magic, ", expected ", kTokenFileMagic,
                                      "; not a uint16-header token file"));
  }
  int32_t version = ReadInt32Le(bytes.data() + 4);
  if (version != kTokenFileVersion) {
    return Invalid(path, absl::StrCat("unsupported version ", version, "; only version ",
                                      kTokenFileVersion, " is supported"));
  }
  int32_t count = ReadInt32Le(bytes.data() + 8);
  if (count < 0) return Invalid(path, absl::StrCat("header says ", count, " tokens"));
  int64_t payload = static_cast<int64_t>(bytes.size()) - kTokenFileHeaderBytes;
  int64_t needed = static_cast<int64_t>(count) * 2;
  if (payload < needed) {
    return Invalid(
        path, absl::StrCat("truncated: header says ", count, " tokens, file holds ", payload / 2));
  }
  if (payload > needed) {
    return Invalid(path, absl::StrCat("trailing bytes: ", payload - needed, " byte(s) after the ",
                                      count, " tokens the header announces"));
  }
  return DecodeUint16Le(bytes.data() + kTokenFileHeaderBytes, static_cast<size_t>(count));
}

DataFormat DetectFormat(const std::string& path, std::string_view bytes) {
  if (static_cast<int64_t>(bytes.size()) >= kTokenFileHeaderBytes &&
      ReadInt32Le(bytes.data()) == kTokenFileMagic) {
    return DataFormat::kUint16Header;
  }
  // A header whose magic was damaged, the rest intact (the version, and a
  // count that accounts for the file's size exactly): read as one, so the
  // error says "bad magic" instead of training on the header's 1024 bytes
  // as tokens. A raw token file matches this by chance practically never.
  if (static_cast<int64_t>(bytes.size()) >= kTokenFileHeaderBytes &&
      ReadInt32Le(bytes.data() + 4) == kTokenFileVersion && ReadInt32Le(bytes.data() + 8) >= 0 &&
      static_cast<int64_t>(bytes.size()) ==
          kTokenFileHeaderBytes + 2 * static_cast<int64_t>(ReadInt32Le(bytes.data() + 8))) {
    return DataFormat::kUint16Header;
  }
  if (absl::EndsWith(path, ".bin") || absl::EndsWith(path, ".u16")) return DataFormat::kUint16;
  return DataFormat::kText;
}

absl::Status CheckVocab(const std::string& path, const std::vector<uint16_t>& tokens,
                        int vocab_size) {
  if (vocab_size > std::numeric_limits<uint16_t>::max()) return absl::OkStatus();
  const uint16_t limit = static_cast<uint16_t>(vocab_size);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= limit) {
      return Invalid(path, absl::StrCat("token at position ", i, " has id ", tokens[i],
                                        ", not below the vocab size ", vocab_size,
                                        "; check the vocab size (train-local's --vocab, a job's "
                                        "spec.model.vocab_size) or the tokenizer"));
    }
  }
  return absl::OkStatus();
}

// `head` then `body` as `path`, atomically: into a fresh temporary beside
// it, created exclusively (a file or link planted under the name is not
// written through), synced, then renamed over `path`; a failure removes
// the temporary.
absl::Status WriteFileAtomically(const std::string& path, std::string_view head,
                                 std::string_view body) {
  const std::string temp = TempPathFor(path);
  std::string bytes;
  bytes.reserve(head.size() + body.size());
  bytes.append(head).append(body);
  if (absl::Status written = WriteNewFileAt(AT_FDCWD, temp, bytes, 0666, /*sync=*/true);
      !written.ok()) {
    return absl::Status(written.code(), absl::StrCat(path, ": ", written.message()));
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int rename_errno = errno;
    std::remove(temp.c_str());
    return absl::ErrnoToStatus(rename_errno, absl::StrCat(path, ": rename from ", temp));
  }
  return absl::OkStatus();
}

void AppendInt32Le(int32_t value, std::string* out) {
  uint32_t u = static_cast<uint32_t>(value);
  for (int shift = 0; shift < 32; shift += 8) out->push_back(static_cast<char>(u >> shift));
}

}  // namespace

absl::StatusOr<DataFormat> ParseDataFormat(std::string_view name) {
  if (name == "auto") return DataFormat::kAuto;
  if (name == "text") return DataFormat::kText;
  if (name == "uint16") return DataFormat::kUint16;
  if (name == "uint16-header") return DataFormat::kUint16Header;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown data format \"", EchoInput(absl::string_view(name.data(), name.size())),
                   "\"; accepted: ", kAcceptedFormats));
}

std::string DataFormatName(DataFormat format) {
  switch (format) {
    case DataFormat::kAuto:
      return "auto";
    case DataFormat::kText:
      return "text";
    case DataFormat::kUint16:
      return "uint16";
    case DataFormat::kUint16Header:
      return "uint16-header";
  }
  return "unknown";
}

absl::StatusOr<std::vector<uint16_t>> LoadTokenFile(const std::string& path, DataFormat format,
                                                    int vocab_size,
                                                    const TokenFileLoadOptions& options) {
  if (vocab_size < 1) return Invalid(path, absl::StrCat("vocab size ", vocab_size, " < 1"));
  ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path, options));
  // The format follows the given name, not the name `path` resolved to.
  return ParseTokenFile(options.name.empty() ? path : options.name, bytes, format, vocab_size);
}

absl::StatusOr<std::vector<uint16_t>> ParseTokenFile(const std::string& path,
                                                     std::string_view bytes, DataFormat format,
                                                     int vocab_size) {
  if (vocab_size < 1) return Invalid(path, absl::StrCat("vocab size ", vocab_size, " < 1"));
  if (bytes.empty()) return Invalid(path, "token file is empty");
  if (format == DataFormat::kAuto) format = DetectFormat(path, bytes);
  if (format == DataFormat::kText && vocab_size < 256) {
    return Invalid(path, absl::StrCat("text format needs a byte vocabulary (vocab size >= 256)",
                                      ", got vocab size ", vocab_size));
  }
  absl::StatusOr<std::vector<uint16_t>> tokens;
  switch (format) {
    case DataFormat::kText:
      tokens = ParseText(bytes);
      break;
    case DataFormat::kUint16:
      tokens = ParseRaw(path, bytes);
      break;
    default:
      tokens = ParseWithHeader(path, bytes);
      break;
  }
  if (!tokens.ok()) return tokens.status();
  if (tokens->empty()) return Invalid(path, "token file is empty (zero tokens)");
  // Text ids are bytes, already below the (>= 256) vocab size.
  if (format != DataFormat::kText) RETURN_IF_ERROR(CheckVocab(path, *tokens, vocab_size));
  return tokens;
}

absl::Status WriteUint16TokenFile(const std::string& path, const std::vector<uint16_t>& tokens,
                                  bool with_header) {
  std::string head;
  if (with_header) {
    if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
      return Invalid(
          path, absl::StrCat(tokens.size(), " tokens do not fit the int32 count of the header"));
    }
    head.reserve(kTokenFileHeaderBytes);
    AppendInt32Le(kTokenFileMagic, &head);
    AppendInt32Le(kTokenFileVersion, &head);
    AppendInt32Le(static_cast<int32_t>(tokens.size()), &head);
    head.resize(kTokenFileHeaderBytes, '\0');
  }
  std::string body(tokens.size() * 2, '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    body[2 * i] = static_cast<char>(tokens[i] & 0xff);
    body[2 * i + 1] = static_cast<char>(tokens[i] >> 8);
  }
  return WriteFileAtomically(path, head, body);
}

absl::Status WriteBytesFile(const std::string& path, std::string_view bytes) {
  return WriteFileAtomically(path, {}, bytes);
}

}  // namespace pipetrain
