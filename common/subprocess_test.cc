#include "common/subprocess.h"

#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

std::string TempPath(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

// A child that dies before writing its file is reported at once, with its
// exit status and the last line of its log, not after the whole timeout.
TEST(WaitForFileTest, WriterExitsFirst_FailsAtOnceWithItsLastLogLine) {
  const std::string log = TempPath("dies.log");
  auto child = Subprocess::Spawn(
      {"/bin/sh", "-c", "echo starting; echo '--device cuda: no CUDA device' >&2; exit 3"}, log);
  ASSERT_TRUE(child.ok()) << child.status();
  const absl::Time start = absl::Now();
  absl::Status status =
      WaitForFile(TempPath("never.ports"), absl::Seconds(60), &*child, log);
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));  // not the 60 s timeout
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "exited (exit code 3) before writing"))
      << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "its log ends: --device cuda: no CUDA device"))
      << status;
}

TEST(WaitForFileTest, WriterWritesTheFile_Ok) {
  const std::string path = TempPath("written.ports");
  auto child = Subprocess::Spawn({"/bin/sh", "-c", "echo '{}' > " + path}, TempPath("w.log"));
  ASSERT_TRUE(child.ok()) << child.status();
  // The child exits right after writing: the file must still count.
  EXPECT_TRUE(WaitForFile(path, absl::Seconds(60), &*child, TempPath("w.log")).ok());
}

TEST(WaitForFileTest, NoWriter_TimesOutNamingThePath) {
  absl::Status status = WaitForFile(TempPath("absent"), absl::Milliseconds(50));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "absent")) << status;
}

}  // namespace
}  // namespace pipetrain
