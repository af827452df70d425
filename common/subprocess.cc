#include "common/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace pipetrain {

absl::StatusOr<Subprocess> Subprocess::Spawn(const std::vector<std::string>& argv,
                                             const std::string& log_path) {
  if (argv.empty() || access(argv[0].c_str(), X_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot execute ", argv.empty() ? "(nothing)" : argv[0]));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int error = posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, args.data(), environ);
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
  const absl::Time deadline = absl::Now() + timeout;
  while (!Poll().has_value() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
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

absl::Status WaitForFile(const std::string& path, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    struct stat st;
    if (stat(path.c_str(), &st) == 0 && st.st_size > 0) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("waited ", absl::FormatDuration(timeout), " for ", path));
}

}  // namespace pipetrain
