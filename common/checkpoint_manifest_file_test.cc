#include "common/checkpoint_manifest_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "common/confined_path.h"
#include "common/testing/file_access_override.h"
#include "common/testing/test_case_dir.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// A checkpoint directory of the case's own, open as the function takes it.
class HoldsCheckpointManifestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ck_ = TestCaseDir() + "/ck";
    ASSERT_EQ(mkdir(ck_.c_str(), 0700), 0);
    dir_ = ScopedFd(open(ck_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_GE(dir_.get(), 0);
  }

  // Creates the step directory `name` in ck/, with a manifest file if asked.
  void MakeStep(const std::string& name, bool with_manifest) {
    ASSERT_EQ(mkdir((ck_ + "/" + name).c_str(), 0700), 0);
    if (with_manifest) std::ofstream(ck_ + "/" + name + "/" + kCheckpointManifestName) << "{}";
  }

  // What the function answers for `name`, as its callers name it in messages.
  absl::StatusOr<std::optional<bool>> Holds(const std::string& name) {
    return HoldsCheckpointManifest(dir_.get(), name, "ck/" + name);
  }

  // Holds(name) while `path` has `mode` (put back to 0700 after), with file
  // modes binding as they bind a process not run as root.
  absl::StatusOr<std::optional<bool>> HoldsWhileMode(const std::string& path, mode_t mode,
                                                     const std::string& name) {
    if (chmod(path.c_str(), mode) != 0) return absl::InternalError("cannot chmod " + path);
    absl::StatusOr<std::optional<bool>> holds = absl::InternalError("cannot drop the override");
    {
      const WithoutFileAccessOverride unprivileged;
      if (unprivileged.ok()) holds = Holds(name);
    }
    if (chmod(path.c_str(), 0700) != 0) return absl::InternalError("cannot restore " + path);
    return holds;
  }

  std::string ck_;
  ScopedFd dir_;
};

TEST_F(HoldsCheckpointManifestTest, ManifestFile_True) {
  MakeStep("step-00000002", /*with_manifest=*/true);
  const absl::StatusOr<std::optional<bool>> holds = Holds("step-00000002");
  ASSERT_TRUE(holds.ok()) << holds.status();
  EXPECT_EQ(*holds, std::optional<bool>(true));
}

TEST_F(HoldsCheckpointManifestTest, NoManifest_False) {
  MakeStep("step-00000002", /*with_manifest=*/false);
  std::ofstream(ck_ + "/step-00000002/unit-0000.safetensors") << "a unit, not the manifest";
  const absl::StatusOr<std::optional<bool>> holds = Holds("step-00000002");
  ASSERT_TRUE(holds.ok()) << holds.status();
  EXPECT_EQ(*holds, std::optional<bool>(false));
}

// The step is written whatever the manifest is: reading it reports a
// damaged one, rather than an older checkpoint being taken for the newest
// or the step being swept as incomplete.
TEST_F(HoldsCheckpointManifestTest, ManifestOfAnyType_True) {
  MakeStep("step-00000002", /*with_manifest=*/false);
  ASSERT_EQ(mkdir((ck_ + "/step-00000002/" + kCheckpointManifestName).c_str(), 0700), 0);
  MakeStep("step-00000004", /*with_manifest=*/false);
  ASSERT_EQ(symlink("/nonexistent", (ck_ + "/step-00000004/" + kCheckpointManifestName).c_str()),
            0);
  for (const char* step : {"step-00000002", "step-00000004"}) {
    const absl::StatusOr<std::optional<bool>> holds = Holds(step);
    ASSERT_TRUE(holds.ok()) << step << ": " << holds.status();
    EXPECT_EQ(*holds, std::optional<bool>(true)) << step;
  }
}

// A link is not followed even to a complete step: it could lead out of the
// directory the caller resolved and checked.
TEST_F(HoldsCheckpointManifestTest, NoDirectoryOrGone_Nullopt) {
  MakeStep("step-00000002", /*with_manifest=*/true);
  ASSERT_EQ(symlink("step-00000002", (ck_ + "/step-00000004").c_str()), 0);
  std::ofstream(ck_ + "/step-00000006") << "a file, not a step directory";
  for (const char* name : {"step-00000004", "step-00000006", "step-00000008"}) {
    const absl::StatusOr<std::optional<bool>> holds = Holds(name);
    ASSERT_TRUE(holds.ok()) << name << ": " << holds.status();
    EXPECT_EQ(*holds, std::nullopt) << name;
  }
}

// Unknown is an error naming the step, never "no manifest": the callers
// must not sweep or pass over a step that may be complete. Each of the
// three looks fails in turn: the step directory closed (its open), readable
// but not searchable (the look for the manifest), and the open checkpoint
// directory closed since it was listed (the stat).
TEST_F(HoldsCheckpointManifestTest, CannotTell_ErrnoCodeNamingTheStep) {
  MakeStep("step-00000002", /*with_manifest=*/true);
  const std::string step = ck_ + "/step-00000002";
  const struct {
    std::string path;
    mode_t mode;
    std::string message;
  } cases[] = {
      {step, 0, "cannot open ck/step-00000002: Permission denied"},
      {step, 0400, "cannot look for manifest.json in ck/step-00000002: Permission denied"},
      {ck_, 0, "cannot stat ck/step-00000002: Permission denied"},
  };
  for (const auto& c : cases) {
    const absl::StatusOr<std::optional<bool>> holds =
        HoldsWhileMode(c.path, c.mode, "step-00000002");
    EXPECT_EQ(holds.status().code(), absl::StatusCode::kPermissionDenied) << holds.status();
    EXPECT_EQ(holds.status().message(), c.message);
  }
}

}  // namespace
}  // namespace pipetrain
