// ClusterDir: the private, locked directory of one `pipetrain up` run.
#include "cli/local_cluster.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

std::string TempPath(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

mode_t ModeOf(const std::string& path) {
  struct stat st;
  EXPECT_EQ(lstat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

TEST(ClusterDirTest, Claim_Missing_MadeMode0700WithItsParents) {
  const std::string path = TempPath("made/a/out");
  absl::StatusOr<ClusterDir> dir = ClusterDir::Claim("--out", path);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(dir->path(), path);
  EXPECT_EQ(ModeOf(path), 0700);
  EXPECT_EQ(ModeOf(path + "/up.lock"), 0600);
}

TEST(ClusterDirTest, Claim_TrailingSlash_TheDirectoryIsStill0700) {
  const std::string path = TempPath("slash");
  absl::StatusOr<ClusterDir> dir = ClusterDir::Claim("--out", path + "/");
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(ModeOf(path), 0700);
}

// An existing directory of this user's keeps its mode (0755 is fine: only
// its owner writes in it).
TEST(ClusterDirTest, Claim_ExistingOwnDirectory_UsedAsItIs) {
  const std::string path = TempPath("existing");
  ASSERT_EQ(mkdir(path.c_str(), 0755), 0);
  ASSERT_EQ(chmod(path.c_str(), 0755), 0);  // whatever the umask
  absl::StatusOr<ClusterDir> dir = ClusterDir::Claim("--out", path);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(ModeOf(path), 0755);
}

// Someone else's directory (here: one that must be owned by another uid)
// is refused before anything is written in it.
TEST(ClusterDirTest, Claim_OwnedByAnotherUser_FailedPreconditionNamingBoth) {
  const std::string path = TempPath("theirs");
  ASSERT_EQ(mkdir(path.c_str(), 0700), 0);
  const uid_t me = geteuid(), other = geteuid() + 1;
  absl::StatusOr<ClusterDir> dir = ClusterDir::Claim("--out", path, other);
  ASSERT_EQ(dir.status().code(), absl::StatusCode::kFailedPrecondition) << dir.status();
  EXPECT_EQ(dir.status().message(),
            absl::StrCat("--out ", path, ": owned by uid ", me, ", not by this user (uid ", other,
                         "); the token files written there would be its owner's to read; pick "
                         "another --out"));
  EXPECT_NE(access((path + "/up.lock").c_str(), F_OK), 0);  // nothing written
}

TEST(ClusterDirTest, Claim_GroupOrWorldWritable_FailedPreconditionWithTheMode) {
  for (const mode_t mode : {0770, 0702, 01777}) {
    const std::string path = TempPath(absl::StrCat("writable-", mode));
    ASSERT_EQ(mkdir(path.c_str(), 0700), 0);
    ASSERT_EQ(chmod(path.c_str(), mode), 0);
    absl::StatusOr<ClusterDir> dir = ClusterDir::Claim("--out", path);
    ASSERT_EQ(dir.status().code(), absl::StatusCode::kFailedPrecondition) << dir.status();
    EXPECT_TRUE(absl::StartsWith(
        dir.status().message(),
        absl::StrFormat("--out %s: mode %04o lets its group or others write in it", path, mode)))
        << dir.status();
    EXPECT_TRUE(absl::StrContains(dir.status().message(), "chmod go-w it")) << dir.status();
    EXPECT_NE(access((path + "/up.lock").c_str(), F_OK), 0);
  }
}

// A link planted by someone else is refused even when it leads to a
// directory of ours; our own link is followed.
TEST(ClusterDirTest, Claim_SymbolicLink_OnlyOurOwnIsFollowed) {
  const std::string target = TempPath("link-target");
  ASSERT_EQ(mkdir(target.c_str(), 0700), 0);
  const std::string link = TempPath("link");
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  {
    absl::StatusOr<ClusterDir> ours = ClusterDir::Claim("--out", link);
    ASSERT_TRUE(ours.ok()) << ours.status();
    EXPECT_EQ(access((target + "/up.lock").c_str(), F_OK), 0);
    // Used by the real path from here on: a repointed link leads nowhere.
    std::unique_ptr<char, decltype(&free)> real(realpath(target.c_str(), nullptr), &free);
    ASSERT_NE(real, nullptr);
    EXPECT_EQ(ours->path(), real.get());
  }
  // Another user's claim of our link, as any user can test it: the link is
  // checked before the directory it leads to.
  const uid_t other = geteuid() + 1;
  absl::StatusOr<ClusterDir> not_theirs = ClusterDir::Claim("--out", link, other);
  ASSERT_EQ(not_theirs.status().code(), absl::StatusCode::kFailedPrecondition)
      << not_theirs.status();
  EXPECT_EQ(not_theirs.status().message(),
            absl::StrCat("--out ", link, ": a symbolic link owned by uid ", geteuid(),
                         ", not by this user (uid ", other, "); pick another --out"));
  // Only root can give a link away (the tests run as root in the sandbox).
  if (geteuid() != 0) GTEST_SKIP() << "not root: cannot make a link another user owns";
  const std::string planted = TempPath("planted");
  ASSERT_EQ(symlink(target.c_str(), planted.c_str()), 0);
  ASSERT_EQ(lchown(planted.c_str(), 4242, 4242), 0);
  absl::StatusOr<ClusterDir> theirs = ClusterDir::Claim("--out", planted);
  ASSERT_EQ(theirs.status().code(), absl::StatusCode::kFailedPrecondition) << theirs.status();
  EXPECT_EQ(theirs.status().message(),
            absl::StrCat("--out ", planted,
                         ": a symbolic link owned by uid 4242, not by this user (uid 0); pick "
                         "another --out"));
}

TEST(ClusterDirTest, Claim_NotADirectory_NamedWithTheReason) {
  const std::string file = TempPath("a-file");
  FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  absl::StatusOr<ClusterDir> dir = ClusterDir::Claim("--out", file + "/out");
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kFailedPrecondition) << dir.status();
  EXPECT_EQ(dir.status().message(),
            absl::StrCat("--out ", file, "/out: cannot create it: Not a directory"));
  dir = ClusterDir::Claim("--out", file);
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kFailedPrecondition) << dir.status();
  EXPECT_EQ(dir.status().message(),
            absl::StrCat("--out ", file, ": cannot open it as a directory: Not a directory"));
}

// A second run on the same directory fails at once, naming the first's pid,
// until the first lets go.
TEST(ClusterDirTest, Claim_HeldByAnotherRun_UnavailableUntilReleased) {
  const std::string path = TempPath("shared");
  std::optional<absl::StatusOr<ClusterDir>> first(ClusterDir::Claim("--out", path));
  ASSERT_TRUE(first->ok()) << first->status();
  absl::StatusOr<ClusterDir> second = ClusterDir::Claim("--out", path);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_EQ(second.status().message(),
            absl::StrCat("--out ", path, ": in use by another `pipetrain up` (pid ", getpid(),
                         "), which would overwrite this run's token and ports files; wait for "
                         "it to end or pick another --out"));
  // A moved claim still holds the lock.
  ClusterDir moved(std::move(**first));
  first.reset();
  EXPECT_EQ(ClusterDir::Claim("--out", path).status().code(), absl::StatusCode::kUnavailable);
  { ClusterDir released(std::move(moved)); }
  EXPECT_TRUE(ClusterDir::Claim("--out", path).ok());
}

// The names Start and its processes write in the cluster's directory, and
// others a user may put there (a loss log, say).
TEST(LocalClusterTest, WritesFileNamed_ItsOwnFilesOnly) {
  for (const char* own :
       {"up.lock", "join.token", "user.token", "coordinator.ports", "coordinator.log",
        "coordinator-2.log", "coordinator-standby-0.ports", "worker-0.log", "worker-12.ports"}) {
    EXPECT_TRUE(LocalCluster::WritesFileNamed(own)) << own;
  }
  // A user's files that only begin like the processes' (a run empties or
  // removes the processes' files at start).
  for (const char* other :
       {"losses.txt", "worker-0.txt", "my.log", "up.lock.bak", "", "coordinator-prod.log",
        "worker-notes.log", "worker-.log", "coordinator-standby-x.ports", "coordinators.log",
        "worker-1.log.bak"}) {
    EXPECT_FALSE(LocalCluster::WritesFileNamed(other)) << other;
  }
}

}  // namespace
}  // namespace pipetrain
