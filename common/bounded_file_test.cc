#include "common/bounded_file.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

std::string TempDir() { return std::getenv("TEST_TMPDIR"); }

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(ReadBoundedFileTest, RegularFileUpToTheLimit_ReadWhole) {
  const std::string path = TempDir() + "/spec.json";
  const std::string text(100000, 'x');  // more than one read's buffer
  Write(path, text);
  absl::StatusOr<std::string> read = ReadBoundedFile(path, 100000, "job spec");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, text);
  Write(path, "");
  EXPECT_EQ(ReadBoundedFile(path, 0, "job spec").value(), "");
}

TEST(ReadBoundedFileTest, OverTheLimit_InvalidArgumentNamingSizes) {
  const std::string path = TempDir() + "/big.json";
  Write(path, std::string(11, 'x'));
  const absl::Status status = ReadBoundedFile(path, 10, "profile").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "profile " + path + " is 11 bytes, over the limit of 10");
}

TEST(ReadBoundedFileTest, Missing_NotFoundNamingThePath) {
  const std::string path = TempDir() + "/absent.json";
  const absl::Status status = ReadBoundedFile(path, 10, "job spec").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(status.message().find("cannot read job spec " + path), std::string::npos) << status;
}

// Neither blocks nor grows: a FIFO with no writer, a directory, and a
// device that never ends.
TEST(ReadBoundedFileTest, FifoDirectoryOrDevice_RefusedAtOnce) {
  const std::string fifo = TempDir() + "/spec.fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {fifo, TempDir(), std::string("/dev/zero")}) {
    const absl::Status status = ReadBoundedFile(path, 1 << 20, "cluster").status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << path;
    EXPECT_EQ(status.message(),
              "cluster " + path + " is not a regular file (a directory, FIFO, socket or device)");
  }
}

}  // namespace
}  // namespace pipetrain
