// Child processes for `pipetrain up` and the multi-process tests.
//
// Subprocess::Spawn starts a program (posix_spawn, no shell) with its
// stdout/stderr appended to a log file. The owner cleans up: the destructor
// (and Terminate) sends SIGTERM, waits up to a grace period, then SIGKILL
// and reaps, so no child outlives the object that started it. (A parent
// killed with SIGKILL cannot clean up; children then see their coordinator
// vanish and exit on their own where they watch for it.) Not thread-safe
// per object.
#ifndef PIPETRAIN_COMMON_SUBPROCESS_H_
#define PIPETRAIN_COMMON_SUBPROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pipetrain {

class Subprocess {
 public:
  // argv[0] is the program path. NOT_FOUND if it does not exist; INTERNAL if
  // spawning fails (with strerror).
  static absl::StatusOr<Subprocess> Spawn(const std::vector<std::string>& argv,
                                          const std::string& log_path);
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

// Waits up to `timeout` for `path` to exist and be non-empty (polling every
// 10 ms: used for files a child writes atomically, like its ports file).
// DEADLINE_EXCEEDED naming the path otherwise. With `writer` (the child that
// should write it), stops as soon as that child has exited without writing
// it: FAILED_PRECONDITION with its exit status and, when `writer_log` is
// given, the last line of its log (usually the reason).
absl::Status WaitForFile(const std::string& path, absl::Duration timeout,
                         Subprocess* writer = nullptr, const std::string& writer_log = "");

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_SUBPROCESS_H_
