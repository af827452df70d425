#include "common/subprocess.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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

TEST(DescribeExitTest, ExitCodeOrSignalWithItsName) {
  auto exits = Subprocess::Spawn({"/bin/sh", "-c", "exit 3"}, TempPath("exit3.log"));
  auto killed = Subprocess::Spawn({"/bin/sh", "-c", "kill -KILL $$"}, TempPath("kill9.log"));
  ASSERT_TRUE(exits.ok() && killed.ok());
  const std::optional<int> exit_status = exits->Wait(absl::Seconds(60));
  const std::optional<int> kill_status = killed->Wait(absl::Seconds(60));
  ASSERT_TRUE(exit_status.has_value() && kill_status.has_value());
  EXPECT_EQ(DescribeExit(*exit_status), "exit code 3");
  EXPECT_EQ(DescribeExit(*kill_status), "killed by signal 9 (SIGKILL)");
}

// A parent that ignores SIGCHLD passes that on across exec, and the kernel
// then reaps children itself: no exit was ever seen. Spawn sets it back.
TEST(SubprocessTest, SigchldIgnoredByTheParent_ExitStillSeen) {
  signal(SIGCHLD, SIG_IGN);
  auto child = Subprocess::Spawn({"/bin/sh", "-c", "exit 3"}, TempPath("sigchld.log"));
  ASSERT_TRUE(child.ok()) << child.status();
  const std::optional<int> status = child->Wait(absl::Seconds(30));
  signal(SIGCHLD, SIG_DFL);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(DescribeExit(*status), "exit code 3");
}

TEST(WaitForFileTest, WriterWritesTheFile_Ok) {
  const std::string path = TempPath("written.ports");
  auto child = Subprocess::Spawn({"/bin/sh", "-c", "echo '{}' > " + path}, TempPath("w.log"));
  ASSERT_TRUE(child.ok()) << child.status();
  // The child exits right after writing: the file must still count.
  EXPECT_TRUE(WaitForFile(path, absl::Seconds(60), &*child, TempPath("w.log")).ok());
}

// A stop request (a signal to the waiting process) ends the wait for a
// writer that hangs: CANCELLED, not the whole timeout.
TEST(WaitForFileTest, StopRequested_CancelledAtOnce) {
  auto child = Subprocess::Spawn({"/bin/sh", "-c", "exec sleep 600"}, TempPath("hangs.log"));
  ASSERT_TRUE(child.ok()) << child.status();
  int asked = 0;
  const absl::Time start = absl::Now();
  absl::Status status = WaitForFile(TempPath("hangs.ports"), absl::Seconds(600), &*child,
                                    TempPath("hangs.log"), [&asked] { return ++asked >= 3; });
  EXPECT_LT(absl::Now() - start, absl::Seconds(60));
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  EXPECT_EQ(asked, 3);
  EXPECT_TRUE(absl::StrContains(status.message(), "hangs.ports")) << status;
  child->Terminate(absl::ZeroDuration());
}

TEST(WaitForFileTest, NoWriter_TimesOutNamingThePath) {
  absl::Status status = WaitForFile(TempPath("absent"), absl::Milliseconds(50));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "absent")) << status;
}

// The helper program (exit_with_parent_testing_main.cc), from the runfiles.
std::string Helper() {
  return std::string(std::getenv("TEST_SRCDIR")) + "/pipetrain/common/exit_with_parent_testing";
}

// Whether process `pid` has ended: no /proc entry, or a zombie waiting for
// whoever adopted it to reap it.
bool Ended(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  const size_t close = line.rfind(')');  // "pid (name) S ..."
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}

// Polls (every 10 ms, as WaitForFile) until `pid` has ended or `timeout`.
bool EndsWithin(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!Ended(pid)) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

// Runs the helper as a parent of one child, kills the parent with SIGKILL
// (no clean-up possible) and returns the orphaned child's pid.
pid_t OrphanAChild(const std::string& name, bool plain) {
  const std::string pidfile = TempPath(name + ".pid");
  std::vector<std::string> argv = {Helper(), "parent", pidfile};
  if (plain) argv.push_back("plain");
  auto parent = Subprocess::Spawn(argv, TempPath(name + ".log"));
  EXPECT_TRUE(parent.ok()) << parent.status();
  if (!parent.ok()) return -1;
  EXPECT_TRUE(WaitForFile(pidfile, absl::Seconds(60), &*parent).ok());
  std::ifstream in(pidfile);
  pid_t child = -1;
  in >> child;
  parent->Signal(SIGKILL);
  EXPECT_TRUE(parent->Wait(absl::Seconds(30)).has_value());
  return child;
}

TEST(ExitWithParentTest, ParentKilled_ChildEndsToo) {
  const pid_t child = OrphanAChild("asked", /*plain=*/false);
  ASSERT_GT(child, 0);
  EXPECT_TRUE(EndsWithin(child, absl::Seconds(30))) << "child " << child << " outlived its parent";
  if (!Ended(child)) kill(child, SIGKILL);
}

// Without the option the orphan lives on: what the option is for.
TEST(ExitWithParentTest, NotAsked_ChildOutlivesItsParent) {
  const pid_t child = OrphanAChild("plain", /*plain=*/true);
  ASSERT_GT(child, 0);
  EXPECT_FALSE(Ended(child));
  kill(child, SIGKILL);
  EXPECT_TRUE(EndsWithin(child, absl::Seconds(30)));
}

// A child whose parent died before it could ask for the signal exits by
// itself: here the variable names a pid that is not its parent.
TEST(ExitWithParentTest, ParentAlreadyGone_ChildExitsAtOnceSayingSo) {
  const std::string log = TempPath("gone.log");
  setenv(kExitWithParentVariable, "999999999", /*overwrite=*/1);
  auto child = Subprocess::Spawn({Helper(), "child", TempPath("gone.pid")}, log);
  unsetenv(kExitWithParentVariable);
  ASSERT_TRUE(child.ok()) << child.status();
  const std::optional<int> status = child->Wait(absl::Seconds(30));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1) << *status;
  std::stringstream text;
  text << std::ifstream(log).rdbuf();
  EXPECT_TRUE(absl::StrContains(text.str(), "(pid 999999999) is gone")) << text.str();
}

// A child in a group of its own: what a terminal sends to this process's
// group (Ctrl-C) does not reach it. Its stdin is /dev/null, not ours.
TEST(SpawnTest, OwnProcessGroup_ChildLeadsItsOwnGroupReadingNothing) {
  const std::string stdin_is = TempPath("own-group.stdin");
  SpawnOptions options;
  options.own_process_group = true;
  auto child = Subprocess::Spawn({"/bin/sh", "-c",
                                  "readlink /proc/self/fd/0 > " + stdin_is + ".tmp; mv " +
                                      stdin_is + ".tmp " + stdin_is + "; exec sleep 600"},
                                 TempPath("own-group.log"), options);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(getpgid(child->pid()), child->pid());  // posix_spawn returns after the exec
  EXPECT_NE(getpgid(child->pid()), getpgrp());
  auto plain = Subprocess::Spawn({"/bin/sleep", "600"}, TempPath("plain.log"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(getpgid(plain->pid()), getpgrp());  // the default: ours
  ASSERT_TRUE(WaitForFile(stdin_is, absl::Seconds(60), &*child).ok());
  child->Terminate(absl::Seconds(5));
  std::stringstream text;
  text << std::ifstream(stdin_is).rdbuf();
  EXPECT_EQ(text.str(), "/dev/null\n");
}

// A child gets this process's environment but the variables named unset,
// and its log is its user's alone (0600): it may hold what others must not
// read.
TEST(SpawnTest, UnsetEnvironment_LeftOutOfTheChildsLogPrivate) {
  ASSERT_EQ(setenv("PIPETRAIN_SPAWN_TEST_SECRET", "hidden", 1), 0);
  ASSERT_EQ(setenv("PIPETRAIN_SPAWN_TEST_KEPT", "kept", 1), 0);
  const std::string done = TempPath("env.done");
  const std::string log = TempPath("env.log");
  SpawnOptions options;
  options.unset_environment = {"PIPETRAIN_SPAWN_TEST_SECRET"};
  auto child = Subprocess::Spawn(
      {"/bin/sh", "-c",
       "echo \"secret=${PIPETRAIN_SPAWN_TEST_SECRET-unset} kept=$PIPETRAIN_SPAWN_TEST_KEPT\"; "
       "echo x > " +
           done + "; exec sleep 600"},
      log, options);
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE(WaitForFile(done, absl::Seconds(60), &*child).ok());
  child->Terminate(absl::Seconds(5));
  std::stringstream text;
  text << std::ifstream(log).rdbuf();
  EXPECT_EQ(text.str(), "secret=unset kept=kept\n");
  struct stat info;
  ASSERT_EQ(stat(log.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600);
  unsetenv("PIPETRAIN_SPAWN_TEST_SECRET");
  unsetenv("PIPETRAIN_SPAWN_TEST_KEPT");
}

// Children that ignore SIGTERM share one grace period, then get SIGKILL;
// one that heeds SIGTERM ends by it. One at a time, 3 stubborn children
// would take 3 graces at least.
TEST(TerminateAllTest, ChildrenIgnoringSigterm_OneSharedGraceThenSigkill) {
  constexpr int kStubborn = 3;
  const absl::Duration grace = absl::Seconds(2);
  std::vector<Subprocess> children;
  for (int i = 0; i < kStubborn; ++i) {
    // The trap is set (and inherited by sleep) before the file appears.
    const std::string ready = TempPath(absl::StrCat("stubborn-", i, ".ready"));
    auto child =
        Subprocess::Spawn({"/bin/sh", "-c", "trap '' TERM; echo 1 > " + ready + "; exec sleep 600"},
                          TempPath(absl::StrCat("stubborn-", i, ".log")));
    ASSERT_TRUE(child.ok()) << child.status();
    children.push_back(*std::move(child));
    ASSERT_TRUE(WaitForFile(ready, absl::Seconds(60), &children.back()).ok());
  }
  auto polite = Subprocess::Spawn({"/bin/sleep", "600"}, TempPath("polite.log"));
  ASSERT_TRUE(polite.ok()) << polite.status();
  std::vector<Subprocess*> all = {&*polite, nullptr};
  for (Subprocess& c : children) all.push_back(&c);
  const absl::Time start = absl::Now();
  TerminateAll(all, grace);
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, grace);
  EXPECT_LT(took, kStubborn * grace);
  ASSERT_TRUE(polite->Poll().has_value());
  EXPECT_TRUE(WIFSIGNALED(*polite->Poll()) && WTERMSIG(*polite->Poll()) == SIGTERM);
  for (Subprocess& c : children) {
    const std::optional<int> status = c.Poll();
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL) << *status;
  }
}

}  // namespace
}  // namespace pipetrain
