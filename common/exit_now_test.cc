#include "common/exit_now.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// How long a child may take to exit before the case fails: far past
// kExitNowGrace, so a slow machine passes, and a hang ends in a failure,
// not at the test's timeout.
constexpr int kChildBoundSeconds = 30;

// The wait status of `child`, or -1 when it was still running at the
// bound (it is then killed). Polled: the parent holds the child's stderr
// pipe without reading it, so nothing else ends the wait.
int WaitBounded(pid_t child) {
  const timespec tick{0, 10 * 1000 * 1000};
  for (int i = 0; i < kChildBoundSeconds * 100; ++i) {
    int status = 0;
    const pid_t done = waitpid(child, &status, WNOHANG);
    if (done == child) return status;
    if (done < 0 && errno != EINTR) return -1;
    nanosleep(&tick, nullptr);
  }
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  return -1;
}

// Forks a child whose stderr is the write end of `fds`, which the parent
// keeps open; with `fill`, the pipe is full first, so that the log line
// blocks. The child calls ExitNow(code, message).
pid_t ExitNowInChild(int fds[2], bool fill, int code, const std::string& message) {
  const pid_t child = fork();
  if (child != 0) return child;
  close(fds[0]);
  if (dup2(fds[1], STDERR_FILENO) < 0) _exit(100);
  close(fds[1]);
  if (fill) {
    const int flags = fcntl(STDERR_FILENO, F_GETFL);
    if (flags < 0 || fcntl(STDERR_FILENO, F_SETFL, flags | O_NONBLOCK) != 0) _exit(101);
    const char block[4096] = {};
    while (write(STDERR_FILENO, block, sizeof(block)) > 0 ||
           (errno != EAGAIN && errno != EWOULDBLOCK)) {
    }
    // Blocking again, as a stalled reader's stderr is.
    if (fcntl(STDERR_FILENO, F_SETFL, flags) != 0) _exit(102);
  }
  ExitNow(code, message);
}

TEST(ExitNowTest, StderrBlocks_ExitsWithTheCodeAnyway) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = ExitNowInChild(fds, /*fill=*/true, 5, "giving up");
  ASSERT_GT(child, 0);
  close(fds[1]);
  const int status = WaitBounded(child);
  close(fds[0]);  // unread until here: the child's line never went out
  ASSERT_NE(status, -1) << "the child did not exit within " << kChildBoundSeconds
                        << " s of a blocked log line";
  ASSERT_TRUE(WIFEXITED(status)) << "wait status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 5);
}

TEST(ExitNowTest, StderrDrains_LogsTheLineAndExitsWithTheCode) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = ExitNowInChild(fds, /*fill=*/false, 7, "lost the leadership");
  ASSERT_GT(child, 0);
  close(fds[1]);
  std::string said;
  char buffer[4096];
  for (ssize_t n; (n = read(fds[0], buffer, sizeof(buffer))) != 0;) {
    if (n > 0) said.append(buffer, static_cast<size_t>(n));
    if (n < 0 && errno != EINTR) break;
  }
  close(fds[0]);
  const int status = WaitBounded(child);
  ASSERT_NE(status, -1);
  ASSERT_TRUE(WIFEXITED(status)) << "wait status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 7);
  // One ERROR line naming the caller (ExitNowInChild, in this file).
  EXPECT_EQ(said.rfind("E ", 0), 0u) << said;
  EXPECT_NE(said.find("exit_now_test.cc:"), std::string::npos) << said;
  EXPECT_NE(said.find("] lost the leadership\n"), std::string::npos) << said;
}

}  // namespace
}  // namespace pipetrain
