// Child processes for `pipetrain up` and the multi-process tests.
//
// Subprocess::Spawn starts a program (posix_spawn, no shell) with its
// stdout/stderr appended to a log file. The owner cleans up: the destructor
// (and Terminate) sends SIGTERM, waits up to a grace period, then SIGKILL
// and reaps, so no child outlives the object that started it. A parent
// killed with SIGKILL (or by a signal it does not handle) cannot clean up:
// a child spawned with SpawnOptions::exit_with_parent, whose program calls
// ExitWithParentIfAsked first thing, is then sent SIGTERM by the kernel
// (PR_SET_PDEATHSIG); others must notice on their own (workers watch their
// coordinator; a coordinator watches nothing). Not thread-safe per object.
#ifndef PIPETRAIN_COMMON_SUBPROCESS_H_
#define PIPETRAIN_COMMON_SUBPROCESS_H_

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pipetrain {

// The environment variable through which a child learns that it must not
// outlive its parent: the parent's pid.
inline constexpr char kExitWithParentVariable[] = "PIPETRAIN_EXIT_WITH_PARENT";

struct SpawnOptions {
  // Puts kExitWithParentVariable (this process's pid) in the child's
  // environment, for ExitWithParentIfAsked. Linux ties the parent-death
  // signal to the spawning THREAD: spawn from one that outlives the child
  // (e.g. main), or the child is sent SIGTERM when that thread ends.
  bool exit_with_parent = false;
  // Starts the child in a process group of its own (POSIX_SPAWN_SETPGROUP),
  // so that what a terminal sends to this process's group (Ctrl-C's
  // SIGINT, Ctrl-\'s SIGQUIT, Ctrl-Z's SIGTSTP) does not reach it: the
  // parent decides when and in which order its children end. Its stdin is
  // then /dev/null (a background group reading the terminal would stop).
  // A parent killed outright cannot stop it: use exit_with_parent too.
  bool own_process_group = false;
  // Variables of this process's environment the child does not get: a
  // secret the child has no use for (the CLI's PIPETRAIN_TOKEN, a token for
  // some other coordinator) stays out of its /proc/PID/environ.
  std::vector<std::string> unset_environment;
};

// "exit code 3" or "killed by signal 9 (SIGKILL)", from a waitpid status.
std::string DescribeExit(int status);

// The child's side of SpawnOptions::exit_with_parent; call it first thing
// in main, before any thread starts. When kExitWithParentVariable names a
// pid, asks the kernel to send this process SIGTERM when its parent dies
// (PR_SET_PDEATHSIG; the setting survives exec), and exits at once (status
// 1, saying so on stderr) if the parent has died already (getppid() is no
// longer that pid). Does nothing without the variable, or if its value is
// not a pid.
void ExitWithParentIfAsked();

class Subprocess {
 public:
  // argv[0] is the program path. The log is created mode 0600 (a child's
  // log may hold what only its user should read). NOT_FOUND if the program
  // does not exist; INTERNAL if spawning fails (with strerror). A SIGCHLD
  // this process ignores (inherited from its parent) is set back to the
  // default first: ignored, the kernel reaps children itself, and no exit
  // would ever be seen (Poll, Wait, Terminate).
  static absl::StatusOr<Subprocess> Spawn(const std::vector<std::string>& argv,
                                          const std::string& log_path,
                                          const SpawnOptions& options = {});
  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  ~Subprocess();  // Terminate(absl::Seconds(5)) if still running

  pid_t pid() const { return pid_; }
  // Sends `signal` (e.g. SIGKILL, SIGSTOP, SIGCONT) if still running.
  void Signal(int signal);
  // Non-blocking: the exit status (as from waitpid) once the child ended.
  std::optional<int> Poll();
  // Blocks up to `timeout`; nullopt if it is still running.
  std::optional<int> Wait(absl::Duration timeout);
  // SIGTERM, wait up to `grace`, then SIGKILL and reap. Returns the status.
  int Terminate(absl::Duration grace);

 private:
  explicit Subprocess(pid_t pid) : pid_(pid) {}
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// Terminates `processes` together: SIGTERM to each one still running, one
// `grace` period shared by all of them, then SIGKILL to those still
// running; every one is reaped. Null entries are skipped. N processes that
// ignore SIGTERM cost one `grace`, not N.
void TerminateAll(const std::vector<Subprocess*>& processes, absl::Duration grace);

// Waits up to `timeout` for `path` to exist and be non-empty (polling every
// 10 ms: used for files a child writes atomically, like its ports file).
// DEADLINE_EXCEEDED naming the path otherwise. With `writer` (the child that
// should write it), stops as soon as that child has exited without writing
// it: FAILED_PRECONDITION with its exit status and, when `writer_log` is
// given, the last line of its log (usually the reason). With `stop`,
// stops as soon as it returns true (a signal asked the caller to end):
// CANCELLED.
absl::Status WaitForFile(const std::string& path, absl::Duration timeout,
                         Subprocess* writer = nullptr, const std::string& writer_log = "",
                         const std::function<bool()>& stop = nullptr);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_SUBPROCESS_H_
