#include "common/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/clock.h"

extern char** environ;

namespace pipetrain {
std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    const char* name = sigabbrev_np(signal);
    return absl::StrCat("killed by signal ", signal,
                        name != nullptr ? absl::StrCat(" (SIG", name, ")") : "");
  }
  return absl::StrCat("wait status ", status);
}

namespace {

// The last non-empty line of the file at `path` (at most its last 4 KiB are
// read); empty if it cannot be read.
std::string LastLine(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff start = size > 4096 ? size - 4096 : 0;
  in.seekg(start);
  std::string tail((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == '\r')) tail.pop_back();
  const size_t newline = tail.rfind('\n');
  return newline == std::string::npos ? tail : tail.substr(newline + 1);
}

// This process's environment without the `unset` variables; with
// `name_parent`, also with kExitWithParentVariable set to our pid (any
// value it had replaced).
std::vector<std::string> ChildEnvironment(const std::vector<std::string>& unset, bool name_parent) {
  const std::string prefix = absl::StrCat(kExitWithParentVariable, "=");
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view entry = *e;
    const absl::string_view name = entry.substr(0, entry.find('='));
    if (name_parent && absl::StartsWith(entry, prefix)) continue;
    if (std::find(unset.begin(), unset.end(), name) != unset.end()) continue;
    env.emplace_back(entry);
  }
  if (name_parent) env.push_back(absl::StrCat(prefix, getpid()));
  return env;
}

}  // namespace

void ExitWithParentIfAsked() {
  const char* value = std::getenv(kExitWithParentVariable);
  pid_t parent = 0;
  if (value == nullptr || !absl::SimpleAtoi(value, &parent) || parent <= 1) return;
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  // The parent may have died before the call above: then no signal comes.
  if (getppid() != parent) {
    std::fprintf(stderr, "exiting: the process that started this one (pid %d) is gone\n",
                 static_cast<int>(parent));
    std::_Exit(1);
  }
}

absl::StatusOr<Subprocess> Subprocess::Spawn(const std::vector<std::string>& argv,
                                             const std::string& log_path,
                                             const SpawnOptions& options) {
  if (argv.empty() || access(argv[0].c_str(), X_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot execute ", argv.empty() ? "(nothing)" : argv[0]));
  }
  // Ignored (it survives exec: a parent that ignores it passes that on),
  // SIGCHLD makes the kernel reap children at once, so waitpid never
  // returns this one's exit: a child that died at start-up went unseen
  // until a timeout, and Terminate killed a pid that may be reused.
  struct sigaction sigchld;
  if (sigaction(SIGCHLD, nullptr, &sigchld) == 0 && sigchld.sa_handler == SIG_IGN) {
    signal(SIGCHLD, SIG_DFL);
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  if (options.own_process_group) {
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attributes, 0);  // a group named after the child
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_strings =
      ChildEnvironment(options.unset_environment, options.exit_with_parent);
  std::vector<char*> env;
  for (std::string& e : env_strings) env.push_back(e.data());
  env.push_back(nullptr);
  pid_t pid = -1;
  const int error =
      posix_spawn(&pid, argv[0].c_str(), &actions, &attributes, args.data(), env.data());
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) {
    return absl::InternalError(absl::StrCat("spawn ", argv[0], ": ", std::strerror(error)));
  }
  return Subprocess(pid);
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(other.pid_), status_(other.status_) {
  other.pid_ = -1;
}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    if (pid_ > 0 && !status_) Terminate(absl::Seconds(5));
    pid_ = other.pid_;
    status_ = other.status_;
    other.pid_ = -1;
  }
  return *this;
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !status_) Terminate(absl::Seconds(5));
}

void Subprocess::Signal(int signal) {
  if (pid_ > 0 && !Poll().has_value()) kill(pid_, signal);
}

std::optional<int> Subprocess::Poll() {
  if (status_ || pid_ <= 0) return status_;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) status_ = status;
  return status_;
}

std::optional<int> Subprocess::Wait(absl::Duration timeout) {
  const absl::Time deadline = MonotonicClock()->Now() + timeout;
  while (!Poll().has_value() && MonotonicClock()->Now() < deadline)
    absl::SleepFor(absl::Milliseconds(5));
  return status_;
}

int Subprocess::Terminate(absl::Duration grace) {
  if (pid_ <= 0) return -1;
  if (!Poll().has_value()) {
    kill(pid_, SIGCONT);  // a stopped child cannot act on SIGTERM
    kill(pid_, SIGTERM);
    if (!Wait(grace).has_value()) {
      kill(pid_, SIGKILL);
      int status = 0;
      waitpid(pid_, &status, 0);
      status_ = status;
    }
  }
  return *status_;
}

void TerminateAll(const std::vector<Subprocess*>& processes, absl::Duration grace) {
  for (Subprocess* p : processes) {
    if (p == nullptr) continue;
    p->Signal(SIGCONT);  // a stopped child cannot act on SIGTERM
    p->Signal(SIGTERM);
  }
  const absl::Time deadline = MonotonicClock()->Now() + grace;
  for (Subprocess* p : processes) {
    if (p != nullptr) p->Wait(std::max(deadline - MonotonicClock()->Now(), absl::ZeroDuration()));
  }
  // Those that ended are reaped already; the rest get SIGKILL and are reaped.
  for (Subprocess* p : processes) {
    if (p != nullptr) p->Terminate(absl::ZeroDuration());
  }
}

absl::Status WaitForFile(const std::string& path, absl::Duration timeout, Subprocess* writer,
                         const std::string& writer_log, const std::function<bool()>& stop) {
  const absl::Time deadline = MonotonicClock()->Now() + timeout;
  auto written = [&path] {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && st.st_size > 0;
  };
  while (MonotonicClock()->Now() < deadline) {
    if (written()) return absl::OkStatus();
    if (writer != nullptr) {
      if (std::optional<int> status = writer->Poll(); status.has_value() && !written()) {
        std::string why = absl::StrCat("exited (", DescribeExit(*status), ") before writing ",
                                       path);
        if (!writer_log.empty()) {
          const std::string last = LastLine(writer_log);
          if (!last.empty()) absl::StrAppend(&why, "; its log ends: ", last);
        }
        return absl::FailedPreconditionError(why);
      }
    }
    if (stop && stop()) {
      return absl::CancelledError(absl::StrCat("stopped while waiting for ", path));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("waited ", absl::FormatDuration(timeout), " for ", path));
}

}  // namespace pipetrain
