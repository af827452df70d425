#include "common/temp_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

std::string Dir() {
  const std::string dir =
      absl::StrCat(std::getenv("TEST_TMPDIR"), "/",
                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  mkdir(dir.c_str(), 0700);
  return dir;
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Names in the form the leftover sweeps recognise, never twice, with at
// most kTempPrefixBytes of the final name, in the final name's directory.
TEST(TempFileTest, Names_FreshEachTimeInTheFinalNamesDirectory) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(seen.insert(TempNameFor("w.safetensors")).second);
  const std::string name = TempNameFor("w.safetensors");
  EXPECT_TRUE(absl::StartsWith(name, absl::StrCat("w.safetensors.tmp.", getpid(), ".")));
  EXPECT_LE(TempNameFor(std::string(255, 'n')).size(), kTempPrefixBytes + 36);
  const std::string path = TempPathFor("/a/b/ports.json");
  EXPECT_TRUE(absl::StartsWith(path, "/a/b/ports.json.tmp.")) << path;
  EXPECT_TRUE(absl::StartsWith(TempPathFor("ports.json"), "ports.json.tmp.")) << path;
}

// A new file gets the bytes; anything already at the name (a file, a
// symbolic link another user planted) is neither written nor followed.
TEST(TempFileTest, WriteNewFile_CreatesOnly_NeverThroughWhatIsThere) {
  const std::string dir = Dir();
  const std::string fresh = dir + "/fresh";
  ASSERT_TRUE(WriteNewFile(fresh, "bytes\n", 0600).ok());
  EXPECT_EQ(Read(fresh), "bytes\n");
  struct stat st;
  ASSERT_EQ(stat(fresh.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);

  const absl::Status again = WriteNewFile(fresh, "other", 0600);
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists) << again;
  EXPECT_EQ(Read(fresh), "bytes\n");

  const std::string target = dir + "/target";
  std::ofstream(target) << "theirs";
  const std::string link = dir + "/link";
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  const absl::Status through = WriteNewFile(link, "mine", 0600);
  EXPECT_EQ(through.code(), absl::StatusCode::kAlreadyExists) << through;
  EXPECT_TRUE(absl::StrContains(through.message(), link)) << through;
  EXPECT_EQ(Read(target), "theirs");
}

// The same relative to an open directory (how the checkpoint manifest is
// written, in a directory opened without following links), synced or not.
TEST(TempFileTest, WriteNewFileAt_InTheOpenDirectory_NeverThroughALink) {
  const std::string dir = Dir();
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(WriteNewFileAt(fd, "synced", "one\n", 0600, /*sync=*/true).ok());
  EXPECT_EQ(Read(dir + "/synced"), "one\n");
  ASSERT_TRUE(WriteNewFileAt(fd, "empty", "", 0600).ok());
  EXPECT_EQ(Read(dir + "/empty"), "");
  const absl::Status again = WriteNewFileAt(fd, "synced", "two", 0600, true);
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists) << again;
  EXPECT_TRUE(absl::StrContains(again.message(), "synced")) << again;
  EXPECT_EQ(Read(dir + "/synced"), "one\n");
  std::ofstream(dir + "/target") << "theirs";
  ASSERT_EQ(symlinkat("target", fd, "link"), 0);
  const absl::Status through = WriteNewFileAt(fd, "link", "mine", 0600, true);
  EXPECT_EQ(through.code(), absl::StatusCode::kAlreadyExists) << through;
  EXPECT_TRUE(absl::StrContains(through.message(), "link")) << through;
  EXPECT_EQ(Read(dir + "/target"), "theirs");
  close(fd);
}

}  // namespace
}  // namespace pipetrain
