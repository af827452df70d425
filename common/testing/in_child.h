// InChild: runs a test's body in a forked child, for what must not touch
// the test process (a seccomp filter, a file size limit: both stay for
// good), and returns the text the body returned, sent back through a pipe;
// or why the child failed ("pipe: ...", "the child failed (wait status
// N): <what it sent>"). The child leaves with _exit (no destructors, no
// gtest teardown).
#ifndef PIPETRAIN_COMMON_TESTING_IN_CHILD_H_
#define PIPETRAIN_COMMON_TESTING_IN_CHILD_H_

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <string>

#include "absl/strings/str_cat.h"

namespace pipetrain {

inline std::string InChild(const std::function<std::string()>& body) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::StrCat("pipe: ", strerror(errno));
  const pid_t child = fork();
  if (child == 0) {
    close(fds[0]);
    const std::string said = body();
    _exit(write(fds[1], said.data(), said.size()) == static_cast<ssize_t>(said.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string said;
  char buffer[4096];
  for (ssize_t n; (n = read(fds[0], buffer, sizeof(buffer))) != 0;) {
    if (n > 0) said.append(buffer, static_cast<size_t>(n));
    if (n < 0 && errno != EINTR) break;
  }
  close(fds[0]);
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    return absl::StrCat("the child failed (wait status ", status, "): ", said);
  }
  return said;
}

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_TESTING_IN_CHILD_H_
