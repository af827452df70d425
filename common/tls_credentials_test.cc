#include "common/tls_credentials.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/match.h"

namespace pipetrain {
namespace {

// A path under the test's private temporary directory.
std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

std::string WriteFile(const std::string& name, const std::string& contents) {
  const std::string path = TempPath(name);
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

TEST(ReadFlagFile, RegularFile_ReturnsItsContents) {
  const std::string pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
  absl::StatusOr<std::string> read = ReadFlagFile("tls-ca", WriteFile("ca.pem", pem));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, pem);
}

TEST(ReadFlagFile, LargerThanOneChunk_ReturnsItWhole) {
  const std::string big(10000, 'x');
  EXPECT_EQ(ReadFlagFile("tls-ca", WriteFile("big.pem", big)).value(), big);
}

// /dev/zero never ends: the read stops past the limit instead of growing
// the process without end. A file of exactly the limit is read.
TEST(ReadFlagFile, EndlessOrOverTheLimit_InvalidArgument) {
  absl::StatusOr<std::string> read = ReadFlagFile("tls-ca", "/dev/zero");
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(read.status().message(), "--tls-ca: /dev/zero is over 4194304 bytes; give a PEM file");
  const std::string limit(kMaxPemFileBytes, 'x');
  EXPECT_EQ(ReadFlagFile("tls-ca", WriteFile("limit.pem", limit)).value().size(), kMaxPemFileBytes);
  const absl::Status over = ReadFlagFile("tls-ca", WriteFile("over.pem", limit + "x")).status();
  EXPECT_EQ(over.code(), absl::StatusCode::kInvalidArgument) << over;
  EXPECT_TRUE(absl::StrContains(over.message(), "is over 4194304 bytes")) << over;
}

TEST(ReadFlagFile, Missing_NotFoundNamingFlagAndPath) {
  const std::string path = TempPath("no-such.pem");
  absl::StatusOr<std::string> read = ReadFlagFile("tls-key", path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(read.status().message(),
            "--tls-key: cannot read " + path + "; check the path and permissions");
}

// An ifstream opens a directory; reading it fails (EISDIR). It used to
// return "" as the PEM contents.
TEST(ReadFlagFile, Directory_InvalidArgumentNamingFlagAndPath) {
  const std::string path = TempPath("a-directory");
  ASSERT_EQ(mkdir(path.c_str(), 0755), 0);
  absl::StatusOr<std::string> read = ReadFlagFile("tls-cert", path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(read.status().message(),
            "--tls-cert: cannot read " + path + " (a directory, or a read error); give a PEM file");
}

TEST(ReadFlagFile, EmptyFile_InvalidArgumentNamingFlagAndPath) {
  const std::string path = WriteFile("empty.pem", "");
  absl::StatusOr<std::string> read = ReadFlagFile("tls-client-ca", path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(read.status().message(), "--tls-client-ca: " + path + " is empty; give a PEM file");
}

// A file that opens but fails to read: this process's memory at address 0,
// which is not mapped (EIO).
TEST(ReadFlagFile, ReadError_InvalidArgument) {
  if (!std::ifstream("/proc/self/mem")) GTEST_SKIP() << "/proc/self/mem cannot be opened here";
  absl::StatusOr<std::string> read = ReadFlagFile("tls-ca", "/proc/self/mem");
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(read.status().message(), "--tls-ca: cannot read /proc/self/mem"))
      << read.status();
}

TEST(ServerTlsCredentials, DirectoryAsCert_InvalidArgumentNamingTheFlag) {
  const std::string dir = TempPath("cert-dir");
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  auto credentials = ServerTlsCredentials(dir, WriteFile("key.pem", "key"), "");
  EXPECT_EQ(credentials.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(credentials.status().message(), "--tls-cert: cannot read " + dir))
      << credentials.status();
}

}  // namespace
}  // namespace pipetrain
