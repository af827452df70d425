#include "common/errno_status.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <functional>
#include <string>

#include "absl/strings/cord.h"
#include "common/confined_path.h"
#include "common/safetensors.h"
#include "common/testing/test_case_dir.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(ErrnoStatusTest, Emfile_ErrnoToStatusCodeAndMessage_ErrnoKept) {
  const absl::Status status = ErrnoStatus(EMFILE, "cannot open /x");
  const absl::Status plain = absl::ErrnoToStatus(EMFILE, "cannot open /x");
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(status.message(), plain.message());
  EXPECT_EQ(ErrnoOf(status), EMFILE);
  EXPECT_EQ(ErrnoOf(ErrnoStatus(ENOSPC, "cannot write /x")), ENOSPC);
}

TEST(ErrnoStatusTest, Zero_OkWithoutErrno) {
  const absl::Status status = ErrnoStatus(0, "nothing failed");
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(ErrnoOf(status), std::nullopt);
}

// Copies and moves keep the errno (a StatusOr's status, a stored one).
TEST(ErrnoStatusTest, CopiedOrMoved_ErrnoSurvives) {
  absl::Status status = ErrnoStatus(ENFILE, "cannot open /x");
  const absl::Status copy = status;
  const absl::StatusOr<int> held = copy;
  EXPECT_EQ(ErrnoOf(copy), ENFILE);
  EXPECT_EQ(ErrnoOf(held.status()), ENFILE);
  EXPECT_EQ(ErrnoOf(absl::Status(std::move(status))), ENFILE);
}

// A status that says the errno only in its text has none: the text is
// not read.
TEST(ErrnoOfTest, StatusWithoutThePayload_Nullopt) {
  EXPECT_EQ(ErrnoOf(absl::OkStatus()), std::nullopt);
  EXPECT_EQ(ErrnoOf(absl::ErrnoToStatus(EMFILE, "cannot open /x")), std::nullopt);
  EXPECT_EQ(ErrnoOf(absl::ResourceExhaustedError("cannot open /x: Too many open files")),
            std::nullopt);
  absl::Status not_a_number = absl::ResourceExhaustedError("cannot open /x");
  not_a_number.SetPayload(kErrnoPayloadUrl, absl::Cord("EMFILE"));
  EXPECT_EQ(ErrnoOf(not_a_number), std::nullopt);
}

// A status made anew from another's code and message loses the errno;
// WithMessage keeps it, and every other payload, with the new message.
TEST(WithMessageTest, Reworded_CodeAndPayloadsKept) {
  absl::Status failed = ErrnoStatus(EMFILE, "cannot open /x");
  failed.SetPayload("type.example/other", absl::Cord("kept"));
  EXPECT_EQ(ErrnoOf(absl::Status(failed.code(), "rewrapped")), std::nullopt);
  const absl::Status reworded = WithMessage(failed, "the weights file: cannot open /x");
  EXPECT_EQ(reworded.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(reworded.message(), "the weights file: cannot open /x");
  EXPECT_EQ(ErrnoOf(reworded), EMFILE);
  EXPECT_EQ(reworded.GetPayload("type.example/other"), absl::Cord("kept"));
  EXPECT_TRUE(WithMessage(absl::OkStatus(), "nothing failed").ok());
}

// Exit codes of RunOutOfDescriptors' child beside the errno it found.
constexpr int kNoErrno = 0;
constexpr int kSetupFailed = 200;
constexpr int kNotResourceExhausted = 201;

// Runs `make` in a child whose descriptor limit is its lowest free
// descriptor, so that its next open or dup fails with EMFILE, and returns
// the child's exit code: the errno ErrnoOf finds in what `make` returns,
// kNoErrno for none, or one of the codes above.
int RunOutOfDescriptors(const std::function<absl::Status()>& make) {
  const pid_t child = fork();
  if (child == 0) {
    const int lowest_free = dup(0);
    close(lowest_free);
    const struct rlimit limit = {static_cast<rlim_t>(lowest_free),
                                 static_cast<rlim_t>(lowest_free)};
    if (lowest_free < 0 || setrlimit(RLIMIT_NOFILE, &limit) != 0) _exit(kSetupFailed);
    const absl::Status status = make();
    if (!absl::IsResourceExhausted(status)) _exit(kNotResourceExhausted);
    _exit(ErrnoOf(status).value_or(kNoErrno));
  }
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status)) return kSetupFailed;
  return WEXITSTATUS(status);
}

// The weights file's creators (OpenConfinedParent, then
// SafetensorsFileWriter::Create) attach the errno, by which the
// coordinator tells a passing shortage (EMFILE: retry the upload) from a
// full disk (ENOSPC: fail the job); both are RESOURCE_EXHAUSTED.
TEST(ErrnoOfTest, OpenConfinedParentOutOfDescriptors_Emfile) {
  const std::string root = TestCaseDir();
  EXPECT_EQ(
      RunOutOfDescriptors([&root] {
        return OpenConfinedParent(root, kOutputDirFlag, "f", "a/w.safetensors", true).status();
      }),
      EMFILE);
}

TEST(ErrnoOfTest, SafetensorsFileWriterCreateOutOfDescriptors_Emfile) {
  const int dir_fd = open(TestCaseDir().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir_fd, 0);
  EXPECT_EQ(
      RunOutOfDescriptors([dir_fd] {
        return SafetensorsFileWriter::Create(dir_fd, "w.safetensors", {{"a", {2}}}, 0600).status();
      }),
      EMFILE);
  close(dir_fd);
}

}  // namespace
}  // namespace pipetrain
