#include "common/confined_path.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

std::string RealPathForTest(const std::string& path) {
  char buffer[PATH_MAX];
  return realpath(path.c_str(), buffer) != nullptr ? buffer : "";
}

class ConfinedPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = std::string(std::getenv("TEST_TMPDIR")) + "/" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    root_ = base_ + "/root";
    outside_ = base_ + "/outside";
    ASSERT_EQ(mkdir(base_.c_str(), 0755), 0);
    ASSERT_EQ(mkdir(root_.c_str(), 0755), 0);
    ASSERT_EQ(mkdir(outside_.c_str(), 0755), 0);
  }
  void Touch(const std::string& path) { std::ofstream(path) << "x"; }

  std::string base_, root_, outside_;
};

TEST(CheckConfinedNameTest, GoodNames_Ok) {
  EXPECT_TRUE(CheckConfinedName("f", "weights.safetensors").ok());
  EXPECT_TRUE(CheckConfinedName("f", "runs/7/w.safetensors").ok());
  EXPECT_TRUE(CheckConfinedName("f", "a..b").ok());  // dots inside a name are fine
}

TEST(CheckConfinedNameTest, EscapingOrMalformed_InvalidArgumentNamingField) {
  const std::pair<std::string, std::string> cases[] = {
      {"/etc/x", "relative path"},
      {"../x", "\"..\""},
      {"a/../../x", "\"..\""},
      {"./x", "\".\""},
      {"a//b", "empty path component"},
      {"dir/", "not end with '/'"},
      {"", "empty path"},
      {std::string("a\0b", 3), "NUL"},
      // Names that would act on a terminal that lists them.
      {"a\nb.safetensors", "control character at byte 1"},
      {"runs/\x1b[2Jw", "control character at byte 5"},
      {"w\xe2\x80\xaesrotnesefas.exe", "control character at byte 1"},
      {std::string(1025, 'a'), "1025 bytes exceeds the limit of 1024"},
      {std::string(256, 'a'), "component exceeds 255"},
  };
  for (const auto& [path, why] : cases) {
    absl::Status status = CheckConfinedName("spec.output.weights_path", path);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << path;
    EXPECT_THAT(status.message(), HasSubstr("spec.output.weights_path: ")) << path;
    EXPECT_THAT(status.message(), HasSubstr(why)) << path;
  }
}

TEST_F(ConfinedPathTest, NestedName_CreatesDirsOnlyWhenAsked) {
  absl::StatusOr<ConfinedParent> probe =
      OpenConfinedParent(root_, "--root", "f", "a/b/w.bin", false);
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_LT(probe->dir.get(), 0);  // a is missing: nothing to refuse yet
  struct stat info;
  EXPECT_NE(stat((root_ + "/a").c_str(), &info), 0);  // and nothing was created
  absl::StatusOr<ConfinedParent> made = OpenConfinedParent(root_, "--root", "f", "a/b/w.bin", true);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_GE(made->dir.get(), 0);
  EXPECT_EQ(made->name, "w.bin");
  ASSERT_EQ(stat((root_ + "/a/b").c_str(), &info), 0);
  EXPECT_TRUE(S_ISDIR(info.st_mode));
}

// Creating directories also syncs each new one into its parent (a crash
// must not lose a checkpoint's step directory); that cannot be observed
// here, only that the walk still creates what is missing below what exists.
TEST_F(ConfinedPathTest, PartlyExistingPath_CreatesTheRest0700) {
  ASSERT_EQ(mkdir((root_ + "/a").c_str(), 0755), 0);
  absl::StatusOr<ConfinedParent> made =
      OpenConfinedParent(root_, "--root", "f", "a/b/c/w.bin", true);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_GE(made->dir.get(), 0);
  for (const char* dir : {"/a/b", "/a/b/c"}) {
    struct stat info;
    ASSERT_EQ(stat((root_ + dir).c_str(), &info), 0) << dir;
    EXPECT_TRUE(S_ISDIR(info.st_mode)) << dir;
    EXPECT_EQ(info.st_mode & 0777, 0700u) << dir;
  }
  // Again, with everything there: nothing to create.
  EXPECT_TRUE(OpenConfinedParent(root_, "--root", "f", "a/b/c/w.bin", true).ok());
}

TEST_F(ConfinedPathTest, SymlinkOnTheWayOrAtTheName_Refused) {
  ASSERT_EQ(symlink(outside_.c_str(), (root_ + "/link").c_str()), 0);
  Touch(outside_ + "/victim");
  ASSERT_EQ(symlink((outside_ + "/victim").c_str(), (root_ + "/w.bin").c_str()), 0);
  for (bool create : {false, true}) {
    absl::StatusOr<ConfinedParent> through =
        OpenConfinedParent(root_, "--root", "f", "link/x", create);
    EXPECT_EQ(through.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(through.status().message(), HasSubstr("\"link\" is a symbolic link"));
    absl::StatusOr<ConfinedParent> at = OpenConfinedParent(root_, "--root", "f", "w.bin", create);
    EXPECT_EQ(at.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(at.status().message(), HasSubstr("\"w.bin\" exists and is a symbolic link"));
  }
  struct stat info;
  EXPECT_NE(stat((outside_ + "/x").c_str(), &info), 0);
}

// The message names the operator's flag, not the job's field: the flag is
// what is wrong.
TEST_F(ConfinedPathTest, MissingRoot_FailedPreconditionNamingTheFlag) {
  const absl::Status status =
      OpenConfinedParent(base_ + "/nope", kCheckpointRootFlag, "f", "x", true).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(), "cannot open this worker's --checkpoint-root " + base_ +
                                  "/nope: No such file or directory");
}

// Out of descriptors when opening the root: not the operator's flag (a
// reader takes FAILED_PRECONDITION for a bad checkpoint and drops it), but
// RESOURCE_EXHAUSTED. In a child whose descriptor limit is its lowest free
// descriptor, so that its next open fails with EMFILE.
TEST_F(ConfinedPathTest, RootOpenOutOfDescriptors_ResourceExhaustedNotFailedPrecondition) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const int lowest_free = dup(0);
    close(lowest_free);
    const struct rlimit limit = {static_cast<rlim_t>(lowest_free),
                                 static_cast<rlim_t>(lowest_free)};
    if (lowest_free < 0 || setrlimit(RLIMIT_NOFILE, &limit) != 0) _exit(2);
    const absl::StatusCode code =
        OpenConfinedParent(base_, kCheckpointRootFlag, "f", "x", false).status().code();
    _exit(code == absl::StatusCode::kResourceExhausted    ? 0
          : code == absl::StatusCode::kFailedPrecondition ? 3
                                                          : 4);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: FAILED_PRECONDITION, 4: another code, 2: setup";
}

// (Not writable is not tested: the tests run as root, whom access() lets
// write anywhere.)
TEST_F(ConfinedPathTest, CheckWritableDirectory_SaysWhatIsWrong) {
  EXPECT_TRUE(CheckWritableDirectory("--checkpoint-root", root_).ok());
  const absl::Status missing = CheckWritableDirectory("--checkpoint-root", base_ + "/nope");
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(missing.message(), "--checkpoint-root: " + base_ +
                                   "/nope cannot be used (No such file or directory); create it "
                                   "or fix the path");
  Touch(root_ + "/file");
  const absl::Status file = CheckWritableDirectory("--checkpoint-root", root_ + "/file");
  EXPECT_EQ(file.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(file.message(), "--checkpoint-root: " + root_ + "/file is not a directory");
}

TEST_F(ConfinedPathTest, ResolveUnderRoots_InsideOk_OutsideAndMissingSameError) {
  Touch(root_ + "/data.txt");
  Touch(outside_ + "/secret.txt");
  ASSERT_EQ(symlink((root_ + "/data.txt").c_str(), (root_ + "/inner-link").c_str()), 0);
  ASSERT_EQ(symlink((outside_ + "/secret.txt").c_str(), (root_ + "/outer-link").c_str()), 0);
  const std::vector<std::string> roots = {outside_ + "-none", root_};
  EXPECT_EQ(ResolveUnderRoots("spec.data.path", "data.txt", roots).value_or(""),
            RealPathForTest(root_ + "/data.txt"));
  EXPECT_TRUE(ResolveUnderRoots("spec.data.path", "inner-link", roots).ok());
  EXPECT_TRUE(ResolveUnderRoots("spec.data.path", root_ + "/data.txt", roots).ok());
  for (const std::string path : {"outer-link", "../outside/secret.txt", "missing.txt",
                                  "/etc/passwd"}) {
    absl::Status status = ResolveUnderRoots("spec.data.path", path, roots).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << path;
    EXPECT_THAT(status.message(), HasSubstr("is not a readable file under --data-root ("));
  }
  // A long path of multi-byte characters is cut on a character boundary
  // (the message travels in proto strings, which must be UTF-8), and the
  // flag named is the caller's.
  std::string wide = "corpora/";
  for (int i = 0; i < 100; ++i) wide += "\xe8\xaa\x9e";  // U+8A9E, 3 bytes
  const absl::Status cut =
      ResolveUnderRoots("spec.init.from", wide, {root_}, "--checkpoint-root").status();
  const std::string want_prefix = "spec.init.from: " + wide.substr(0, 8 + 3 * 82) +
                                  " is not a readable file under --checkpoint-root (";
  EXPECT_EQ(std::string(cut.message()).substr(0, want_prefix.size()), want_prefix) << cut;
  absl::Status none = ResolveUnderRoots("spec.data.path", "data.txt", {}).status();
  EXPECT_THAT(none.message(), HasSubstr("without --data-root"));
  EXPECT_THAT(ResolveUnderRoots("spec.init.from", "w", {}, "--checkpoint-root").status().message(),
              HasSubstr("without --checkpoint-root"));
}

// The swap ResolveUnderRoots cannot see: after the check, a directory on
// the way (or the file) becomes a link out of the root. Opening the checked
// real path then refuses it instead of reading what the link points to.
TEST_F(ConfinedPathTest, OpenRealPathNoLinks_LinkSwappedInAfterTheCheck_Refused) {
  ASSERT_EQ(mkdir((root_ + "/corpus").c_str(), 0755), 0);
  Touch(root_ + "/corpus/data.txt");
  Touch(outside_ + "/data.txt");
  const std::string real =
      ResolveUnderRoots("spec.data.path", "corpus/data.txt", {root_}).value_or("");
  ASSERT_FALSE(real.empty());
  absl::StatusOr<ScopedFd> opened = OpenRealPathNoLinks("spec.data.path", real);
  ASSERT_TRUE(opened.ok()) << opened.status();
  char byte = 0;
  EXPECT_EQ(read(opened->get(), &byte, 1), 1);
  EXPECT_EQ(byte, 'x');

  // The directory swapped for a link to the outside.
  ASSERT_EQ(rename((root_ + "/corpus").c_str(), (root_ + "/corpus-was").c_str()), 0);
  ASSERT_EQ(symlink(outside_.c_str(), (root_ + "/corpus").c_str()), 0);
  absl::Status dir = OpenRealPathNoLinks("spec.data.path", real).status();
  EXPECT_EQ(dir.code(), absl::StatusCode::kInvalidArgument) << dir;
  EXPECT_THAT(dir.message(), HasSubstr("spec.data.path: " + real +
                                       " changed after it was "
                                       "checked (\"corpus\" is a symbolic link or not a "
                                       "directory); not read"));

  // The file itself swapped for a link.
  ASSERT_EQ(unlink((root_ + "/corpus").c_str()), 0);
  ASSERT_EQ(rename((root_ + "/corpus-was").c_str(), (root_ + "/corpus").c_str()), 0);
  ASSERT_EQ(unlink(real.c_str()), 0);
  ASSERT_EQ(symlink((outside_ + "/data.txt").c_str(), real.c_str()), 0);
  absl::Status file = OpenRealPathNoLinks("spec.data.path", real).status();
  EXPECT_EQ(file.code(), absl::StatusCode::kInvalidArgument) << file;
  EXPECT_THAT(file.message(), HasSubstr("(\"data.txt\" is a symbolic link); not read"));

  // Gone: the errno's code, naming the path.
  ASSERT_EQ(unlink(real.c_str()), 0);
  absl::Status gone = OpenRealPathNoLinks("spec.data.path", real).status();
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound) << gone;
  EXPECT_THAT(gone.message(), HasSubstr(real));
  EXPECT_EQ(OpenRealPathNoLinks("f", "relative/x").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
// The temporaries' form (TempNameFor): a suffix ".tmp.<digits>.<digits>".
TEST(HasTemporarySuffixTest, OnlyTmpThenTwoNumbers) {
  for (const char* name : {"w.tmp.1.2", "w.safetensors.tmp.1234.18446744073709551615",
                           "a.tmp.x.tmp.0.0", ".tmp.1.1"}) {
    EXPECT_TRUE(HasTemporarySuffix(name)) << name;
  }
  for (const char* name : {"w", "w.tmp", "w.tmp.1", "w.tmp.1.", "w.tmp..1", "w.tmp.1.2.3",
                           "w.tmp.1.2x", "w.tmp.-1.2", "w.tmp.1.2.tmp", "wtmp.1.2"}) {
    EXPECT_FALSE(HasTemporarySuffix(name)) << name;
  }
}

}  // namespace pipetrain
