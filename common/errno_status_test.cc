#include "common/errno_status.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <functional>
#include <memory>
#include <string>

#include "absl/strings/cord.h"
#include "common/confined_path.h"
#include "common/safetensors.h"
#include "common/testing/sanitized_build.h"
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

// Exit codes of ErrnoInChild's child beside the errno it found.
constexpr int kNoErrno = 0;
constexpr int kSetupFailed = 200;
constexpr int kWrongCode = 201;

// Runs `make` in a child (which may change its own limits) and returns the
// child's exit code: the errno ErrnoOf finds in what `make` returns,
// kNoErrno for none, kWrongCode when its code is not `code`, or
// kSetupFailed (which `make` may exit with itself).
int ErrnoInChild(absl::StatusCode code, const std::function<absl::Status()>& make) {
  const pid_t child = fork();
  if (child == 0) {
    const absl::Status status = make();
    if (status.code() != code) _exit(kWrongCode);
    _exit(ErrnoOf(status).value_or(kNoErrno));
  }
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status)) return kSetupFailed;
  return WEXITSTATUS(status);
}

// ErrnoInChild of `make` run where the descriptor limit is the child's
// lowest free descriptor, so that its next open or dup fails with EMFILE
// (RESOURCE_EXHAUSTED).
int RunOutOfDescriptors(const std::function<absl::Status()>& make) {
  return ErrnoInChild(absl::StatusCode::kResourceExhausted, [&make] {
    const int lowest_free = dup(0);
    close(lowest_free);
    const struct rlimit limit = {static_cast<rlim_t>(lowest_free),
                                 static_cast<rlim_t>(lowest_free)};
    if (lowest_free < 0 || setrlimit(RLIMIT_NOFILE, &limit) != 0) _exit(kSetupFailed);
    return make();
  });
}

// In a child (ErrnoInChild), limits the size of files it writes to none,
// so that its next write fails with EFBIG (OUT_OF_RANGE) instead of
// raising SIGXFSZ; _exits kSetupFailed if it cannot.
void LimitFileSizeToNothing() {
  const struct rlimit limit = {0, RLIM_INFINITY};
  if (signal(SIGXFSZ, SIG_IGN) == SIG_ERR || setrlimit(RLIMIT_FSIZE, &limit) != 0) {
    _exit(kSetupFailed);
  }
}

// The weights file's creators (OpenConfinedParent, then
// SafetensorsFileWriter::Create) attach the errno, by which the
// coordinator tells a passing shortage (EMFILE: retry the upload) from a
// full disk (ENOSPC: fail the job); both are RESOURCE_EXHAUSTED.
TEST(ErrnoOfTest, OpenConfinedParentOutOfDescriptors_Emfile) {
  if (kSanitizedBuild) GTEST_SKIP() << kNoDescriptorsUnderSanitizers;
  const std::string root = TestCaseDir();
  EXPECT_EQ(
      RunOutOfDescriptors([&root] {
        return OpenConfinedParent(root, kOutputDirFlag, "f", "a/w.safetensors", true).status();
      }),
      EMFILE);
}

TEST(ErrnoOfTest, SafetensorsFileWriterCreateOutOfDescriptors_Emfile) {
  if (kSanitizedBuild) GTEST_SKIP() << kNoDescriptorsUnderSanitizers;
  const int dir_fd = open(TestCaseDir().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir_fd, 0);
  EXPECT_EQ(
      RunOutOfDescriptors([dir_fd] {
        return SafetensorsFileWriter::Create(dir_fd, "w.safetensors", {{"a", {2}}}, 0600).status();
      }),
      EMFILE);
  close(dir_fd);
}

// The header's write is Create's own too: it carries the errno.
TEST(ErrnoOfTest, SafetensorsFileWriterCreatePastFileSizeLimit_Efbig) {
  const int dir_fd = open(TestCaseDir().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir_fd, 0);
  EXPECT_EQ(ErrnoInChild(absl::StatusCode::kOutOfRange,
                         [dir_fd] {
                           LimitFileSizeToNothing();
                           return SafetensorsFileWriter::Create(dir_fd, "w.safetensors",
                                                                {{"a", {2}}}, 0600)
                               .status();
                         }),
            EFBIG);
  close(dir_fd);
}

// The helpers Create shares carry the errno only for Create: a file
// written whole (an export, train-local's weights, a checkpoint unit)
// fails with a status whose text users read, and a later chunk's write is
// no creation (the coordinator asks ErrnoOf of creations alone).
TEST(ErrnoOfTest, WriteSafetensorsAtOutOfDescriptors_NoErrno) {
  if (kSanitizedBuild) GTEST_SKIP() << kNoDescriptorsUnderSanitizers;
  const int dir_fd = open(TestCaseDir().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir_fd, 0);
  EXPECT_EQ(RunOutOfDescriptors([dir_fd] {
              return WriteSafetensorsAt(dir_fd, "w.safetensors",
                                        {{"a", Tensor::FromVector({2}, {1.0f, 2.0f})}}, {}, 0600);
            }),
            kNoErrno);
  close(dir_fd);
}

TEST(ErrnoOfTest, SafetensorsFileWriterWritePastFileSizeLimit_NoErrno) {
  const int dir_fd = open(TestCaseDir().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir_fd, 0);
  EXPECT_EQ(ErrnoInChild(absl::StatusCode::kOutOfRange,
                         [dir_fd] {
                           absl::StatusOr<std::unique_ptr<SafetensorsFileWriter>> writer =
                               SafetensorsFileWriter::Create(dir_fd, "w.safetensors", {{"a", {2}}},
                                                             0600);
                           if (!writer.ok()) _exit(kSetupFailed);
                           LimitFileSizeToNothing();
                           const float values[] = {1.0f, 2.0f};
                           return (*writer)->Write(0, 0, values, 2);
                         }),
            kNoErrno);
  close(dir_fd);
}

// What users read carries no payload: the errno is for code.
TEST(StatusTextForUsersTest, ErrnoCarried_CodeAndMessageOnly) {
  absl::Status full = ErrnoStatus(ENOSPC, "cannot write /x/w.safetensors");
  full.SetPayload("type.example/other", absl::Cord("left out too"));
  ASSERT_NE(full.ToString().find("type.pipetrain/errno"), std::string::npos);
  EXPECT_EQ(StatusTextForUsers(full),
            "RESOURCE_EXHAUSTED: cannot write /x/w.safetensors: No space left on device");
  EXPECT_EQ(StatusTextForUsers(absl::NotFoundError("no checkpoint")), "NOT_FOUND: no checkpoint");
  EXPECT_EQ(StatusTextForUsers(absl::OkStatus()), "OK");
}

}  // namespace
}  // namespace pipetrain
