#include "common/process_hardening.h"

#include <sys/wait.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// Both checks in one test: the setting cannot be undone by an unprivileged
// process's test order, so it must be read dumpable first.
TEST(ProcessHardening, MakesTheProcessAndItsForkedChildrenNonDumpable) {
  ASSERT_TRUE(ProcessIsDumpable()) << "a plain process starts dumpable";
  ASSERT_TRUE(ForbidCoreDumpsAndTracing().ok());
  EXPECT_FALSE(ProcessIsDumpable());
  // A child forked later (a thread pool's helper, a subprocess before its
  // exec) holds the same secrets and inherits the setting.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(ProcessIsDumpable() ? 1 : 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the forked child was dumpable";
}

}  // namespace
}  // namespace pipetrain
