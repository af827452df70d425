#include "worker/data/token_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

void AppendInt32(int32_t value, std::string* out) {
  uint32_t u = static_cast<uint32_t>(value);
  for (int shift = 0; shift < 32; shift += 8) out->push_back(static_cast<char>(u >> shift));
}

// The llm.c header with the given words, padded to 1024 bytes.
std::string Header(int32_t magic, int32_t version, int32_t count) {
  std::string header;
  AppendInt32(magic, &header);
  AppendInt32(version, &header);
  AppendInt32(count, &header);
  header.resize(kTokenFileHeaderBytes, '\0');
  return header;
}

std::string Uint16Bytes(const std::vector<uint16_t>& tokens) {
  std::string bytes;
  for (uint16_t t : tokens) {
    bytes.push_back(static_cast<char>(t & 0xff));
    bytes.push_back(static_cast<char>(t >> 8));
  }
  return bytes;
}

// Writes `bytes` to a fresh temp file and loads it.
absl::StatusOr<std::vector<uint16_t>> LoadBytes(const std::string& name, const std::string& bytes,
                                                DataFormat format, int vocab_size) {
  const std::string path = TempPath(name);
  EXPECT_TRUE(WriteBytesFile(path, bytes).ok());
  return LoadTokenFile(path, format, vocab_size);
}

// Asserts the status code, that the message starts with the path, and that it
// contains `fragment`.
void ExpectError(const absl::StatusOr<std::vector<uint16_t>>& result, const std::string& name,
                 absl::StatusCode code, const std::string& fragment) {
  ASSERT_FALSE(result.ok()) << name;
  EXPECT_EQ(result.status().code(), code) << result.status();
  EXPECT_TRUE(absl::StartsWith(result.status().message(), TempPath(name))) << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), fragment))
      << result.status() << " lacks \"" << fragment << "\"";
}

TEST(DataFormatTest, ParseDataFormat_KnownNames_RoundTrip) {
  for (DataFormat f :
       {DataFormat::kAuto, DataFormat::kText, DataFormat::kUint16, DataFormat::kUint16Header}) {
    absl::StatusOr<DataFormat> parsed = ParseDataFormat(DataFormatName(f));
    ASSERT_TRUE(parsed.ok()) << DataFormatName(f);
    EXPECT_EQ(*parsed, f);
  }
  EXPECT_EQ(DataFormatName(DataFormat::kUint16Header), "uint16-header");
}

TEST(DataFormatTest, ParseDataFormat_Unknown_InvalidArgumentListsAccepted) {
  absl::StatusOr<DataFormat> parsed = ParseDataFormat("utf8");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(parsed.status().message(), "\"utf8\""));
  EXPECT_TRUE(absl::StrContains(parsed.status().message(), "auto, text, uint16, uint16-header"));
  // Escaped: no control byte of a client's spec reaches a terminal or log.
  EXPECT_TRUE(absl::StrContains(ParseDataFormat("\x1b[2J").status().message(), "\"\\x1b[2J\""));
}

TEST(TokenFileTest, LoadTokenFile_Text_EachByteIsAToken) {
  const std::string bytes("Hi\n\0\xff", 5);
  auto tokens = LoadBytes("text.txt", bytes, DataFormat::kText, 256);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(*tokens, (std::vector<uint16_t>{'H', 'i', '\n', 0, 255}));
}

// A checked real path is opened following no link: the file as checked
// loads; once it is a link (swapped in after the check) it is refused.
TEST(TokenFileTest, LoadTokenFile_CheckedRealPathThatBecameALink_Refused) {
  char real[PATH_MAX];
  const std::string path = TempPath("checked.txt");
  ASSERT_TRUE(WriteBytesFile(path, "abc").ok());
  ASSERT_NE(realpath(path.c_str(), real), nullptr);
  TokenFileLoadOptions options;
  options.path_is_checked_real = true;
  auto loaded = LoadTokenFile(real, DataFormat::kText, 256, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, (std::vector<uint16_t>{'a', 'b', 'c'}));
  const std::string elsewhere = TempPath("elsewhere.txt");
  ASSERT_TRUE(WriteBytesFile(elsewhere, "secret").ok());
  ASSERT_EQ(unlink(real), 0);
  ASSERT_EQ(symlink(elsewhere.c_str(), real), 0);
  auto swapped = LoadTokenFile(real, DataFormat::kText, 256, options);
  EXPECT_EQ(swapped.status().code(), absl::StatusCode::kInvalidArgument) << swapped.status();
  EXPECT_TRUE(absl::StrContains(swapped.status().message(), "changed after it was checked"))
      << swapped.status();
  options.path_is_checked_real = false;  // train-local's --data: the user's own links are fine
  EXPECT_TRUE(LoadTokenFile(real, DataFormat::kText, 256, options).ok());
}

TEST(TokenFileTest, LoadTokenFile_Uint16Raw_RoundTrip) {
  const std::vector<uint16_t> tokens = {0, 1, 255, 256, 50256, 65535};
  const std::string path = TempPath("raw.tokens");
  ASSERT_TRUE(WriteUint16TokenFile(path, tokens, /*with_header=*/false).ok());
  auto loaded = LoadTokenFile(path, DataFormat::kUint16, 65536);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, tokens);
}

TEST(TokenFileTest, LoadTokenFile_Uint16Header_RoundTrip) {
  const std::vector<uint16_t> tokens = {50256, 15496, 11, 995, 0, 7};
  const std::string path = TempPath("header.tokens");
  ASSERT_TRUE(WriteUint16TokenFile(path, tokens, /*with_header=*/true).ok());
  auto loaded = LoadTokenFile(path, DataFormat::kUint16Header, 50257);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, tokens);
}

TEST(TokenFileTest, WriteUint16TokenFile_WithHeader_WritesLlmcLayout) {
  const std::string path = TempPath("layout.bin");
  ASSERT_TRUE(WriteUint16TokenFile(path, {0x1234, 0xabcd}, true).ok());
  auto raw = LoadTokenFile(path, DataFormat::kUint16, 65536);  // header read as tokens
  ASSERT_TRUE(raw.ok()) << raw.status();
  ASSERT_EQ(raw->size(), 512u + 2u);
  EXPECT_EQ((*raw)[0] | (*raw)[1] << 16, kTokenFileMagic);
  EXPECT_EQ((*raw)[2], 1);  // version
  EXPECT_EQ((*raw)[4], 2);  // count
  EXPECT_EQ((*raw)[512], 0x1234);
  EXPECT_EQ((*raw)[513], 0xabcd);
}

TEST(TokenFileTest, LoadTokenFile_AutoWithMagic_ReadsHeaderWhateverTheName) {
  const std::string path = TempPath("corpus.txt");
  ASSERT_TRUE(WriteUint16TokenFile(path, {3, 1, 4}, true).ok());
  auto loaded = LoadTokenFile(path, DataFormat::kAuto, 256);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, (std::vector<uint16_t>{3, 1, 4}));
}

TEST(TokenFileTest, LoadTokenFile_AutoBinOrU16WithoutMagic_ReadsRaw) {
  for (const char* name : {"plain.bin", "plain.u16"}) {
    auto loaded = LoadBytes(name, Uint16Bytes({300, 2, 1000}), DataFormat::kAuto, 1024);
    ASSERT_TRUE(loaded.ok()) << name << ": " << loaded.status();
    EXPECT_EQ(*loaded, (std::vector<uint16_t>{300, 2, 1000})) << name;
  }
}

TEST(TokenFileTest, LoadTokenFile_AutoShortBinStartingWithMagic_ReadsRaw) {
  // Below 1024 bytes the magic cannot be a header: the file is raw tokens.
  std::string bytes;
  AppendInt32(kTokenFileMagic, &bytes);
  auto loaded = LoadBytes("short_magic.bin", bytes, DataFormat::kAuto, 65536);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, (std::vector<uint16_t>{kTokenFileMagic & 0xffff, kTokenFileMagic >> 16}));
}

TEST(TokenFileTest, LoadTokenFile_AutoOtherName_ReadsText) {
  auto loaded = LoadBytes("story.md", "ab", DataFormat::kAuto, 256);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, (std::vector<uint16_t>{'a', 'b'}));
}

// A worker opens spec.data.path's real path: the format follows the name
// given (options.name), not the name the file resolved to.
TEST(TokenFileTest, LoadTokenFile_AutoWithGivenName_DetectsFromThatName) {
  const std::string real = TempPath("5d41402abc4b2a76");
  ASSERT_TRUE(WriteBytesFile(real, Uint16Bytes({300, 2, 1000})).ok());
  TokenFileLoadOptions options;
  options.name = "corpora/x.bin";
  auto loaded = LoadTokenFile(real, DataFormat::kAuto, 1024, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, (std::vector<uint16_t>{300, 2, 1000}));
  // And the other way round: a .bin real path given as a text name.
  const std::string bin = TempPath("given_as_text.bin");
  ASSERT_TRUE(WriteBytesFile(bin, "ab").ok());
  options.name = "story.md";
  loaded = LoadTokenFile(bin, DataFormat::kAuto, 256, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, (std::vector<uint16_t>{'a', 'b'}));
}

// A file past options.max_bytes is refused from its size (a corpus of any
// size was read whole: an allocation that fails throws); one at the limit
// loads.
TEST(TokenFileTest, LoadTokenFile_PastMaxBytes_ResourceExhaustedNamingTheLimit) {
  const std::string path = TempPath("six_bytes.txt");
  ASSERT_TRUE(WriteBytesFile(path, "abcdef").ok());
  TokenFileLoadOptions options;
  options.max_bytes = 5;
  auto loaded = LoadTokenFile(path, DataFormat::kText, 256, options);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kResourceExhausted) << loaded.status();
  EXPECT_EQ(loaded.status().message(),
            path + ": 6 bytes exceeds the limit of 5 bytes for a token file");
  options.max_bytes = 6;
  loaded = LoadTokenFile(path, DataFormat::kText, 256, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->size(), 6u);
}

// Run in a child (EXPECT_EXIT forks): lowers this process's descriptor
// limit to its lowest free descriptor, so every open fails EMFILE, loads
// `path`, and exits with the status code, the status on stderr.
void LoadWithNoDescriptorLeft(const std::string& path, bool checked_real) {
  const int lowest_free = open("/dev/null", O_RDONLY | O_CLOEXEC);
  close(lowest_free);
  struct rlimit limit;
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = static_cast<rlim_t>(lowest_free);
  if (lowest_free < 0 || setrlimit(RLIMIT_NOFILE, &limit) != 0) _exit(100);
  TokenFileLoadOptions options;
  options.path_is_checked_real = checked_real;
  options.max_bytes = 1 << 20;  // far above the file: its size is not the trouble
  auto loaded = LoadTokenFile(path, DataFormat::kText, 256, options);
  std::fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
  _exit(static_cast<int>(loaded.status().code()));
}

// Out of descriptors is the process's state, not the file's: UNAVAILABLE,
// never the RESOURCE_EXHAUSTED of a file past max_bytes (a worker would
// tell the user to use a smaller file, and fail a job that can recover).
TEST(TokenFileTest, LoadTokenFile_NoDescriptorLeft_UnavailableNotTooLarge) {
  char real[PATH_MAX];
  const std::string path = TempPath("fits.txt");
  ASSERT_TRUE(WriteBytesFile(path, "abc").ok());
  ASSERT_NE(realpath(path.c_str(), real), nullptr);
  const int unavailable = static_cast<int>(absl::StatusCode::kUnavailable);
  EXPECT_EXIT(LoadWithNoDescriptorLeft(real, /*checked_real=*/true),
              testing::ExitedWithCode(unavailable), "UNAVAILABLE: .*out of file descriptors");
  EXPECT_EXIT(LoadWithNoDescriptorLeft(path, /*checked_real=*/false),
              testing::ExitedWithCode(unavailable), "UNAVAILABLE: .*out of file descriptors");
}

TEST(TokenFileTest, LoadTokenFile_StopSet_CancelledBeforeItReads) {
  const std::string path = TempPath("stopped.txt");
  ASSERT_TRUE(WriteBytesFile(path, "abcdef").ok());
  std::atomic<bool> stop{true};
  TokenFileLoadOptions options;
  options.stop = &stop;
  auto loaded = LoadTokenFile(path, DataFormat::kText, 256, options);
  ExpectError(loaded, "stopped.txt", absl::StatusCode::kCancelled,
              "stopped after reading 0 of 6 bytes");
  stop = false;
  loaded = LoadTokenFile(path, DataFormat::kText, 256, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->size(), 6u);
}

// A file rewritten in place while it is read (shorter, longer, or the
// same size written again) is UNAVAILABLE, not parsed: a prefix or a mix
// of old and new bytes became the corpus, and its digest the job's.
TEST(TokenFileTest, LoadTokenFile_ChangedWhileRead_Unavailable) {
  const std::string path = TempPath("changing.txt");
  const std::vector<std::pair<std::string, std::function<void()>>> changes = {
      {"truncated", [&] { ASSERT_EQ(truncate(path.c_str(), 3), 0); }},
      {"appended", [&] { std::ofstream(path, std::ios::app) << "ghi"; }},
      {"rewritten",
       [&] {
         std::ofstream(path, std::ios::trunc) << "uvwxyz";
         // Its modification time moved on (a coarse clock could keep it).
         const timespec later[2] = {{0, UTIME_OMIT}, {time(nullptr) + 10, 0}};
         ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), later, 0), 0);
       }},
  };
  for (const auto& [what, change] : changes) {
    SCOPED_TRACE(what);
    ASSERT_TRUE(WriteBytesFile(path, "abcdef").ok());
    TokenFileLoadOptions options;
    options.after_read_for_test = [&, change = change](size_t) { change(); };
    auto loaded = LoadTokenFile(path, DataFormat::kText, 256, options);
    ExpectError(loaded, "changing.txt", absl::StatusCode::kUnavailable,
                "the file changed while it was read (6 bytes when opened, 6 read)");
  }
  ASSERT_TRUE(WriteBytesFile(path, "abcdef").ok());
  TokenFileLoadOptions unchanged;
  int reads = 0;
  unchanged.after_read_for_test = [&](size_t) { ++reads; };
  auto loaded = LoadTokenFile(path, DataFormat::kText, 256, unchanged);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->size(), 6u);
  EXPECT_EQ(reads, 1);
}

TEST(TokenFileTest, LoadTokenFile_LargeRawFile_LoadsEveryToken) {
  std::vector<uint16_t> tokens(4 << 20);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i * 2654435761u);
  const std::string path = TempPath("large.bin");
  ASSERT_TRUE(WriteUint16TokenFile(path, tokens, true).ok());
  auto loaded = LoadTokenFile(path, DataFormat::kAuto, 65536);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(*loaded == tokens);
}

TEST(TokenFileTest, LoadTokenFile_Missing_NotFoundNamingPath) {
  const std::string path = TempPath("does_not_exist.bin");
  auto loaded = LoadTokenFile(path, DataFormat::kAuto, 256);
  ExpectError(loaded, "does_not_exist.bin", absl::StatusCode::kNotFound, "cannot open");
}

TEST(TokenFileTest, LoadTokenFile_Directory_NotFound) {
  const std::string path = TempPath("a_directory");
  ASSERT_EQ(mkdir(path.c_str(), 0755), 0);
  auto loaded = LoadTokenFile(path, DataFormat::kText, 256);
  ExpectError(loaded, "a_directory", absl::StatusCode::kNotFound, "not a regular file");
}

TEST(TokenFileTest, LoadTokenFile_EmptyFile_InvalidArgumentEmptyInEveryFormat) {
  for (DataFormat f :
       {DataFormat::kAuto, DataFormat::kText, DataFormat::kUint16, DataFormat::kUint16Header}) {
    auto loaded = LoadBytes("empty.bin", "", f, 256);
    ExpectError(loaded, "empty.bin", absl::StatusCode::kInvalidArgument, "empty");
  }
}

TEST(TokenFileTest, LoadTokenFile_HeaderWithZeroTokens_InvalidArgumentEmpty) {
  auto loaded =
      LoadBytes("zero.bin", Header(kTokenFileMagic, 1, 0), DataFormat::kUint16Header, 256);
  ExpectError(loaded, "zero.bin", absl::StatusCode::kInvalidArgument, "empty");
}

TEST(TokenFileTest, LoadTokenFile_ShorterThanHeader_InvalidArgument) {
  std::string bytes = Header(kTokenFileMagic, 1, 1).substr(0, 1000);
  auto loaded = LoadBytes("short.bin", bytes, DataFormat::kUint16Header, 256);
  ExpectError(loaded, "short.bin", absl::StatusCode::kInvalidArgument,
              "1000 bytes, shorter than the 1024-byte");
}

TEST(TokenFileTest, LoadTokenFile_BadMagic_NamesFoundAndExpected) {
  auto loaded = LoadBytes("magic.bin", Header(12345, 1, 1) + Uint16Bytes({1}),
                          DataFormat::kUint16Header, 256);
  ExpectError(loaded, "magic.bin", absl::StatusCode::kInvalidArgument,
              "bad magic: found 12345, expected 20240520");
}

// Auto-detected: a header whose magic was damaged but whose version and
// count fit the file is refused as one, not read as raw tokens (header
// included); one whose count does not fit the size stays raw.
TEST(TokenFileTest, LoadTokenFile_AutoDamagedMagic_BadMagicNotRawTokens) {
  auto loaded = LoadBytes("damaged.bin", Header(12345, 1, 3) + Uint16Bytes({1, 2, 3}),
                          DataFormat::kAuto, 65536);
  ExpectError(loaded, "damaged.bin", absl::StatusCode::kInvalidArgument,
              "bad magic: found 12345, expected 20240520");
  auto raw = LoadBytes("raw-like.bin", Header(12345, 1, 4) + Uint16Bytes({1, 2, 3}),
                       DataFormat::kAuto, 65536);
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ(raw->size(), (kTokenFileHeaderBytes + 6) / 2);
}

TEST(TokenFileTest, LoadTokenFile_BadVersion_InvalidArgument) {
  auto loaded = LoadBytes("version.bin", Header(kTokenFileMagic, 2, 1) + Uint16Bytes({1}),
                          DataFormat::kAuto, 256);
  ExpectError(loaded, "version.bin", absl::StatusCode::kInvalidArgument, "unsupported version 2");
}

TEST(TokenFileTest, LoadTokenFile_TruncatedPayload_NamesBothCounts) {
  auto loaded = LoadBytes("trunc.bin",
                          Header(kTokenFileMagic, 1, 10) + Uint16Bytes({1, 2, 3, 4, 5, 6, 7, 8, 9}),
                          DataFormat::kUint16Header, 256);
  ExpectError(loaded, "trunc.bin", absl::StatusCode::kInvalidArgument,
              "truncated: header says 10 tokens, file holds 9");
}

TEST(TokenFileTest, LoadTokenFile_NegativeCount_InvalidArgument) {
  auto loaded = LoadBytes("negative.bin", Header(kTokenFileMagic, 1, -1) + Uint16Bytes({1}),
                          DataFormat::kUint16Header, 256);
  ExpectError(loaded, "negative.bin", absl::StatusCode::kInvalidArgument, "header says -1 tokens");
}

TEST(TokenFileTest, LoadTokenFile_TrailingBytes_InvalidArgument) {
  auto loaded = LoadBytes("trailing.bin", Header(kTokenFileMagic, 1, 2) + Uint16Bytes({1, 2, 3}),
                          DataFormat::kUint16Header, 256);
  ExpectError(loaded, "trailing.bin", absl::StatusCode::kInvalidArgument,
              "trailing bytes: 2 byte(s) after the 2 tokens");
}

TEST(TokenFileTest, LoadTokenFile_OddRawSize_InvalidArgumentTruncated) {
  auto loaded = LoadBytes("odd.u16", "abc", DataFormat::kAuto, 65536);
  ExpectError(loaded, "odd.u16", absl::StatusCode::kInvalidArgument,
              "truncated: raw uint16 token file has an odd size of 3 bytes");
}

TEST(TokenFileTest, LoadTokenFile_TokenOutsideVocab_NamesPositionIdAndVocab) {
  auto loaded = LoadBytes("vocab.bin", Uint16Bytes({1, 2, 300, 400}), DataFormat::kUint16, 256);
  ExpectError(loaded, "vocab.bin", absl::StatusCode::kInvalidArgument,
              "token at position 2 has id 300, not below the vocab size 256");
  // Jobs reach this too: the message names their field, not only the flag.
  EXPECT_NE(loaded.status().message().find("a job's spec.model.vocab_size"), std::string::npos)
      << loaded.status();
}

TEST(TokenFileTest, LoadTokenFile_HeaderTokenOutsideVocab_InvalidArgument) {
  auto loaded =
      LoadBytes("vocab_header.bin", Header(kTokenFileMagic, 1, 2) + Uint16Bytes({50256, 50257}),
                DataFormat::kAuto, 50257);
  ExpectError(loaded, "vocab_header.bin", absl::StatusCode::kInvalidArgument,
              "position 1 has id 50257");
}

TEST(TokenFileTest, LoadTokenFile_TextWithSmallVocab_InvalidArgument) {
  auto loaded = LoadBytes("small_vocab.txt", "hello", DataFormat::kText, 128);
  ExpectError(loaded, "small_vocab.txt", absl::StatusCode::kInvalidArgument, "vocab size >= 256");
}

TEST(TokenFileTest, LoadTokenFile_NonPositiveVocab_InvalidArgument) {
  auto loaded = LoadBytes("vocab0.bin", Uint16Bytes({0}), DataFormat::kUint16, 0);
  ExpectError(loaded, "vocab0.bin", absl::StatusCode::kInvalidArgument, "vocab size 0 < 1");
}

TEST(TokenFileTest, ParseTokenFile_Bytes_SameTokensAndErrorsAsTheFile) {
  const std::string bytes = Header(kTokenFileMagic, 1, 3) + Uint16Bytes({7, 300, 50256});
  auto parsed = ParseTokenFile("in-memory.bin", bytes, DataFormat::kAuto, 50257);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, (std::vector<uint16_t>{7, 300, 50256}));
  EXPECT_EQ(*parsed, LoadBytes("same.bin", bytes, DataFormat::kAuto, 50257).value());
  // The name picks raw uint16 for kAuto and leads every message.
  EXPECT_EQ(ParseTokenFile("x.u16", Uint16Bytes({1, 2}), DataFormat::kAuto, 256).value(),
            (std::vector<uint16_t>{1, 2}));
  auto odd = ParseTokenFile("odd.bin", "abc", DataFormat::kUint16, 256);
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(odd.status().message(), "odd.bin: truncated")) << odd.status();
}

TEST(TokenFileTest, WriteUint16TokenFile_Overwrite_ReplacesAndLeavesNoTempFile) {
  const std::string dir = TempPath("atomic");
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  const std::string path = dir + "/tokens.bin";
  ASSERT_TRUE(WriteUint16TokenFile(path, {1, 2, 3, 4}, false).ok());
  ASSERT_TRUE(WriteUint16TokenFile(path, {9}, false).ok());
  auto loaded = LoadTokenFile(path, DataFormat::kUint16, 256);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, (std::vector<uint16_t>{9}));
  std::vector<std::string> names;
  DIR* listing = opendir(dir.c_str());
  ASSERT_NE(listing, nullptr);
  while (dirent* entry = readdir(listing)) {
    if (entry->d_name[0] != '.') names.push_back(entry->d_name);
  }
  closedir(listing);
  EXPECT_EQ(names, (std::vector<std::string>{"tokens.bin"}));
}

// The temporary is created exclusively under an unpredictable name: links
// planted under "<path>.tmp.<pid>.<n>", the names it used to take in
// turn, are not written through (the file they point to keeps its bytes).
TEST(TokenFileTest, WriteBytesFile_PlantedTemporaryLinks_NotWrittenThrough) {
  const std::string dir = TempPath("planted");
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  const std::string victim = dir + "/victim";
  ASSERT_TRUE(WriteBytesFile(victim, "keep").ok());
  const std::string path = dir + "/out.bin";
  for (int n = 0; n < 100; ++n) {
    const std::string planted = path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(n);
    ASSERT_EQ(symlink(victim.c_str(), planted.c_str()), 0) << planted;
  }
  ASSERT_TRUE(WriteBytesFile(path, "xy").ok());
  auto kept = LoadTokenFile(victim, DataFormat::kText, 256);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(*kept, (std::vector<uint16_t>{'k', 'e', 'e', 'p'}));
  auto written = LoadTokenFile(path, DataFormat::kText, 256);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(*written, (std::vector<uint16_t>{'x', 'y'}));
  struct stat st;
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

TEST(TokenFileTest, WriteUint16TokenFile_MissingDirectory_NotFoundNamingPath) {
  const std::string path = TempPath("no_such_dir/tokens.bin");
  absl::Status status = WriteUint16TokenFile(path, {1}, true);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_TRUE(absl::StartsWith(status.message(), path)) << status;
}

// A FIFO is refused as not a regular file at once, not read from until a
// writer comes (which would hang the worker that loads it).
TEST(TokenFileTest, LoadTokenFile_Fifo_RefusedWithoutBlocking) {
  const std::string path = TempPath("fifo.bin");
  unlink(path.c_str());
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  ExpectError(LoadTokenFile(path, DataFormat::kUint16, 256), "fifo.bin",
              absl::StatusCode::kNotFound, "not a regular file");
}

}  // namespace
}  // namespace pipetrain
