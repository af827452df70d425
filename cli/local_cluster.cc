#include "cli/local_cluster.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "common/temp_file.h"

namespace pipetrain {
namespace {

std::string SelfPath() {
  char buffer[PATH_MAX] = {};
  const ssize_t n = readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  return n > 0 ? std::string(buffer, n) : std::string();
}

// Writes `token` to `path`, readable by its owner only.
absl::Status WriteTokenFile(const std::string& path, const std::string& token) {
  std::remove(path.c_str());
  const absl::Status written = WriteNewFile(path, token + "\n", 0600);
  if (!written.ok()) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write token file ", path, ": ", written.message()));
  }
  return absl::OkStatus();
}

// The token flags both processes get: --<name>-token-file=<dir>/<name>.token.
absl::StatusOr<std::vector<std::string>> TokenFlags(const LocalClusterOptions& options,
                                                    bool coordinator) {
  std::vector<std::string> flags;
  for (const auto& [name, token] : {std::pair<std::string, std::string>{"join", options.join_token},
                                    {"user", options.user_token}}) {
    if (token.empty() || (!coordinator && name == "user")) continue;
    const std::string path = absl::StrCat(options.dir, "/", name, ".token");
    if (coordinator) RETURN_IF_ERROR(WriteTokenFile(path, token));
    flags.push_back(absl::StrCat("--", name, "-token-file=", path));
  }
  if (coordinator && (options.join_token.empty() || options.user_token.empty())) {
    flags.push_back("--insecure");
  }
  return flags;
}

// "NAME PATH: what: strerror(error)", with the errno's status code.
absl::Status ErrnoError(int error, const std::string& name, const std::string& path,
                        const std::string& what) {
  return absl::Status(absl::ErrnoToStatusCode(error),
                      absl::StrCat(name, " ", path, ": ", what, ": ", std::strerror(error)));
}

// Makes the missing parents of `path` (0755 less the umask, as `mkdir -p`),
// then `path` itself with mode 0700. `made` gets each directory made here,
// parents first (`path` last when it did not exist; the caller checks what
// it found otherwise).
absl::Status MakePrivateDir(const std::string& name, const std::string& path,
                            std::vector<std::string>* made) {
  for (size_t slash = path.find('/', 1); slash != std::string::npos;
       slash = path.find('/', slash + 1)) {
    const std::string parent = path.substr(0, slash);
    if (parent.back() == '/') continue;  // "a//b"
    if (mkdir(parent.c_str(), 0755) == 0) {
      made->push_back(parent);
    } else if (errno != EEXIST) {
      return ErrnoError(errno, name, path, absl::StrCat("cannot create its parent ", parent));
    }
  }
  if (mkdir(path.c_str(), 0700) == 0) {
    made->push_back(path);
  } else if (errno != EEXIST) {
    return ErrnoError(errno, name, path, "cannot create it");
  }
  return absl::OkStatus();
}

// Removes the directories MakePrivateDir made, deepest first, when they
// are still empty: a refused --out leaves nothing behind.
void RemoveMadeDirs(const std::vector<std::string>& made) {
  for (auto it = made.rbegin(); it != made.rend(); ++it) (void)rmdir(it->c_str());
}

// Refuses a directory that another user could have planted or can write in.
// `link`: lstat of the path; `dir`: fstat of the directory it leads to.
absl::Status CheckPrivate(const std::string& name, const std::string& path, uid_t owner,
                          const struct stat& link, const struct stat& dir) {
  const std::string next = absl::StrCat("; pick another ", name);
  // The link itself too: in /tmp anyone can point one at a directory of ours.
  if (S_ISLNK(link.st_mode) && link.st_uid != owner) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, " ", path, ": a symbolic link owned by uid ", link.st_uid,
                     ", not by this user (uid ", owner, ")", next));
  }
  if (dir.st_uid != owner) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, " ", path, ": owned by uid ", dir.st_uid, ", not by this user (uid ",
                     owner, "); the token files written there would be its owner's to read", next));
  }
  if ((dir.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s %s: mode %04o lets its group or others write in it, and so replace the ports "
        "files that say where the tokens go; chmod go-w it%s",
        name, path, dir.st_mode & 07777, next));
  }
  return absl::OkStatus();
}

// Whoever may rename a directory on the way to `path` can put another
// directory (with ports files of their own) in its place after Claim's
// checks: every ancestor of its real path must be this user's or root's,
// and writable by nobody else unless sticky (as /tmp is).
absl::Status CheckAncestors(const std::string& name, const std::string& path, uid_t owner) {
  std::unique_ptr<char, decltype(&free)> real(realpath(path.c_str(), nullptr), &free);
  if (real == nullptr) return ErrnoError(errno, name, path, "cannot resolve it");
  std::string ancestor = real.get();
  while (ancestor != "/") {
    const size_t slash = ancestor.rfind('/');
    ancestor = slash == 0 ? "/" : ancestor.substr(0, slash);
    struct stat st;
    if (stat(ancestor.c_str(), &st) != 0) {
      return ErrnoError(errno, name, path, absl::StrCat("cannot stat its parent ", ancestor));
    }
    const bool others_write = (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
    if ((st.st_uid != owner && st.st_uid != 0) || (others_write && (st.st_mode & S_ISVTX) == 0)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s %s: its parent %s (uid %d, mode %04o) lets another user rename it and put a "
          "directory of theirs in its place, with ports files that say where the tokens go; "
          "use a directory under one only you (or root) can write in, or a sticky one like /tmp",
          name, path, ancestor, static_cast<int>(st.st_uid), st.st_mode & 07777));
    }
  }
  return absl::OkStatus();
}

// The pid a lock file holds (as Claim writes it), or 0.
long LockHolder(int fd) {
  char buffer[32] = {};
  const ssize_t n = pread(fd, buffer, sizeof(buffer) - 1, 0);
  long pid = 0;
  if (n <= 0 || !absl::SimpleAtoi(absl::StripTrailingAsciiWhitespace(buffer), &pid)) return 0;
  return pid;
}

SpawnOptions SpawnOptionsOf(const LocalClusterOptions& options) {
  SpawnOptions spawn;
  spawn.exit_with_parent = options.exit_with_parent;
  spawn.own_process_group = options.own_process_groups;
  // The CLI's own user token (for some coordinator): no child reads it.
  spawn.unset_environment = {"PIPETRAIN_TOKEN"};
  return spawn;
}

// A directory used before (up's --out is the same for every run by
// default) holds the earlier run's ports files and logs: ports files of
// workers this run does not start (a Prometheus file_sd built from
// worker-*.ports would scrape dead or reused ports) go, and logs are
// emptied, so that "its log ends: ..." quotes this run.
void RemoveEarlierRunsFiles(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  std::vector<std::string> names;
  while (const dirent* e = readdir(d)) names.emplace_back(e->d_name);
  closedir(d);
  for (const std::string& name : names) {
    // A run that fails before drawing its timelines must not show the
    // earlier run's.
    const bool timeline = name == "timeline-predicted.svg" || name == "timeline-measured.svg";
    const bool process_file =
        LocalCluster::WritesFileNamed(name) && name != "up.lock" && !absl::EndsWith(name, ".token");
    if (!process_file && !timeline) continue;
    const std::string path = absl::StrCat(dir, "/", name);
    struct stat info;
    if (lstat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) continue;
    // Best effort: a log that cannot be emptied is appended to, as before.
    if (absl::EndsWith(name, ".ports") || timeline) {
      std::remove(path.c_str());
    } else if (truncate(path.c_str(), 0) != 0) {
      continue;  // appended to, then
    }
  }
}

}  // namespace

absl::StatusOr<ClusterDir> ClusterDir::Claim(const std::string& name, const std::string& path,
                                             uid_t owner) {
  // "out/" is "out" (else its parents' loop below would make it 0755, and
  // lstat follow a link).
  if (path.size() > 1 && path.back() == '/') {
    return Claim(name, path.substr(0, path.size() - 1), owner);
  }
  std::vector<std::string> made;
  if (absl::Status status = MakePrivateDir(name, path, &made); !status.ok()) {
    RemoveMadeDirs(made);
    return status;
  }
  const bool created = !made.empty() && made.back() == path;
  // Every check is on what was opened, so that it cannot be swapped between
  // the check and the use; O_DIRECTORY follows a link (checked via lstat).
  struct stat link, dir_stat;
  if (lstat(path.c_str(), &link) != 0) {
    const absl::Status status = ErrnoError(errno, name, path, "cannot stat it");
    RemoveMadeDirs(made);
    return status;
  }
  const int dir = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) {
    const absl::Status status = ErrnoError(errno, name, path, "cannot open it as a directory");
    RemoveMadeDirs(made);
    return status;
  }
  // Exactly 0700 when made here, whatever the umask or a default ACL did.
  absl::Status checked = created && fchmod(dir, 0700) != 0
                             ? ErrnoError(errno, name, path, "cannot chmod it 0700")
                             : absl::OkStatus();
  if (checked.ok()) {
    checked = fstat(dir, &dir_stat) == 0 ? CheckPrivate(name, path, owner, link, dir_stat)
                                         : ErrnoError(errno, name, path, "cannot stat it");
  }
  if (checked.ok()) checked = CheckAncestors(name, path, owner);
  const int lock =
      checked.ok() ? openat(dir, "up.lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600) : -1;
  if (checked.ok() && lock < 0) checked = ErrnoError(errno, name, path, "cannot open up.lock");
  close(dir);
  if (!checked.ok()) {
    RemoveMadeDirs(made);
    return checked;
  }
  if (flock(lock, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    const long holder = LockHolder(lock);
    close(lock);
    if (error != EWOULDBLOCK) return ErrnoError(error, name, path, "cannot lock up.lock");
    return absl::UnavailableError(absl::StrCat(
        name, " ", path, ": in use by another `pipetrain up`",
        holder > 0 ? absl::StrCat(" (pid ", holder, ")") : "",
        ", which would overwrite this run's token and ports files; wait for it to end or pick "
        "another ",
        name));
  }
  // Who holds it, for the message above; the lock is the flock, not this.
  const std::string pid = absl::StrCat(getpid(), "\n");
  const bool recorded =
      ftruncate(lock, 0) == 0 && pwrite(lock, pid.data(), pid.size(), 0) == ssize_t(pid.size());
  (void)recorded;  // unrecorded, only a second run's message lacks the pid
  // Used from here on by its real path: resolved once more, its ancestors
  // checked as above, and it must be the directory locked (a link on the
  // way repointed since would lead elsewhere). Its components are real
  // directories only this user or root may rename, so the path stays.
  std::unique_ptr<char, decltype(&free)> real(realpath(path.c_str(), nullptr), &free);
  absl::Status same = real == nullptr ? ErrnoError(errno, name, path, "cannot resolve it")
                                      : CheckAncestors(name, real.get(), owner);
  struct stat real_stat;
  if (same.ok() && (stat(real.get(), &real_stat) != 0 || real_stat.st_dev != dir_stat.st_dev ||
                    real_stat.st_ino != dir_stat.st_ino)) {
    same = absl::FailedPreconditionError(
        absl::StrCat(name, " ", path,
                     ": a symbolic link on the way changed while it was checked; "
                     "pick another ",
                     name));
  }
  if (!same.ok()) {
    close(lock);
    return same;
  }
  return ClusterDir(real.get(), lock);
}

ClusterDir::ClusterDir(ClusterDir&& other) noexcept
    : path_(std::move(other.path_)), lock_fd_(other.lock_fd_) {
  other.lock_fd_ = -1;
}

ClusterDir& ClusterDir::operator=(ClusterDir&& other) noexcept {
  if (this != &other) {
    if (lock_fd_ >= 0) close(lock_fd_);
    path_ = std::move(other.path_);
    lock_fd_ = other.lock_fd_;
    other.lock_fd_ = -1;
  }
  return *this;
}

ClusterDir::~ClusterDir() {
  if (lock_fd_ >= 0) close(lock_fd_);  // drops the flock
}

absl::StatusOr<std::string> FindSiblingBinary(const std::string& package, const std::string& name) {
  const std::string self = SelfPath();
  const std::string dir = self.substr(0, self.rfind('/'));
  std::vector<std::string> candidates = {
      absl::StrCat(self, ".runfiles/pipetrain/", package, "/", name),
      absl::StrCat(dir, "/../", package, "/", name), absl::StrCat(dir, "/", name)};
  if (const char* srcdir = std::getenv("TEST_SRCDIR")) {
    candidates.insert(candidates.begin(), absl::StrCat(srcdir, "/pipetrain/", package, "/", name));
  }
  for (const std::string& c : candidates) {
    if (access(c.c_str(), X_OK) == 0) return c;
  }
  return absl::NotFoundError(
      absl::StrCat("cannot find ", name, "; looked in ", absl::StrJoin(candidates, ", "),
                   "; build it with bazel build //...", " or install it next to this pipetrain"));
}

absl::Status LocalCluster::StartCoordinator(int grpc_port, int http_port) {
  const std::string ports = options_.dir + "/coordinator.ports";
  std::remove(ports.c_str());
  std::vector<std::string> argv = {options_.coordinator_binary,
                                   absl::StrCat("--grpc-address=127.0.0.1:", grpc_port),
                                   absl::StrCat("--http-address=127.0.0.1:", http_port),
                                   "--ports-file=" + ports};
  ASSIGN_OR_RETURN(std::vector<std::string> tokens, TokenFlags(options_, true));
  argv.insert(argv.end(), tokens.begin(), tokens.end());
  argv.insert(argv.end(), options_.coordinator_args.begin(), options_.coordinator_args.end());
  ASSIGN_OR_RETURN(Subprocess coordinator, Subprocess::Spawn(argv, coordinator_log(), SpawnOptionsOf(options_)));
  coordinator_ = std::make_unique<Subprocess>(std::move(coordinator));
  absl::Status ready = WaitForFile(ports, options_.start_timeout, coordinator_.get(),
                                   coordinator_log(), options_.stop);
  if (absl::IsCancelled(ready)) return ready;
  if (!ready.ok()) {
    return absl::UnavailableError(absl::StrCat("the coordinator did not start: ", ready.message(),
                                               "; see ", coordinator_log()));
  }
  ASSIGN_OR_RETURN(grpc_port_, ReadPort(ports, "grpc_port"));
  ASSIGN_OR_RETURN(http_port_, ReadPort(ports, "http_port"));
  return absl::OkStatus();
}

std::string LocalCluster::grpc_address() const {
  std::string out = absl::StrCat("127.0.0.1:", grpc_port_);
  for (int port : standby_grpc_ports_) absl::StrAppend(&out, ",127.0.0.1:", port);
  return out;
}

std::string LocalCluster::standby_log(int i) const {
  return absl::StrCat(options_.dir, "/coordinator-standby-", i, ".log");
}

absl::Status LocalCluster::KillAndRestartCoordinator() {
  coordinator_->Signal(SIGKILL);
  coordinator_->Wait(absl::Seconds(30));
  ++coordinator_starts_;
  return StartCoordinator(grpc_port_, http_port_);
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(
    const LocalClusterOptions& options) {
  std::unique_ptr<LocalCluster> cluster(new LocalCluster(options));
  RemoveEarlierRunsFiles(options.dir);
  RETURN_IF_ERROR(cluster->StartCoordinator(0, 0));
  ASSIGN_OR_RETURN(std::vector<std::string> tokens, TokenFlags(options, true));
  for (int i = 0; i < options.standby_coordinators; ++i) {
    const std::string ports = absl::StrCat(options.dir, "/coordinator-standby-", i, ".ports");
    std::remove(ports.c_str());
    std::vector<std::string> argv = {options.coordinator_binary, "--grpc-address=127.0.0.1:0",
                                     "--http-address=127.0.0.1:0", "--ports-file=" + ports};
    argv.insert(argv.end(), tokens.begin(), tokens.end());
    argv.insert(argv.end(), options.coordinator_args.begin(), options.coordinator_args.end());
    ASSIGN_OR_RETURN(Subprocess standby, Subprocess::Spawn(argv, cluster->standby_log(i), SpawnOptionsOf(options)));
    cluster->standbys_.push_back(std::move(standby));
    absl::Status ready = WaitForFile(ports, options.start_timeout, &cluster->standbys_.back(),
                                     cluster->standby_log(i), options.stop);
    if (absl::IsCancelled(ready)) return ready;
    if (!ready.ok()) {
      return absl::UnavailableError(absl::StrCat("standby coordinator ", i,
                                                 " did not start: ", ready.message(), "; see ",
                                                 cluster->standby_log(i)));
    }
    ASSIGN_OR_RETURN(int port, ReadPort(ports, "grpc_port"));
    cluster->standby_grpc_ports_.push_back(port);
    ASSIGN_OR_RETURN(int http_port, ReadPort(ports, "http_port"));
    cluster->standby_http_ports_.push_back(http_port);
  }
  for (int i = 0; i < options.workers; ++i) RETURN_IF_ERROR(cluster->SpawnWorker(i));
  for (int i = 0; i < options.workers; ++i) RETURN_IF_ERROR(cluster->AwaitWorker(i));
  return cluster;
}

absl::Status LocalCluster::SpawnWorker(int i) {
  ASSIGN_OR_RETURN(const std::vector<std::string> worker_tokens, TokenFlags(options_, false));
  const std::string ports = absl::StrCat(options_.dir, "/worker-", i, ".ports");
  std::remove(ports.c_str());
  std::vector<std::string> wargv = {options_.worker_binary, "--coordinator=" + grpc_address(),
                                    "--listen=127.0.0.1:0", "--ports-file=" + ports,
                                    absl::StrCat("--node-name=local-", i)};
  wargv.insert(wargv.end(), worker_tokens.begin(), worker_tokens.end());
  wargv.insert(wargv.end(), options_.worker_args.begin(), options_.worker_args.end());
  if (i < static_cast<int>(options_.per_worker_args.size())) {
    const std::vector<std::string>& own = options_.per_worker_args[i];
    wargv.insert(wargv.end(), own.begin(), own.end());
  }
  ASSIGN_OR_RETURN(Subprocess worker, Subprocess::Spawn(wargv, worker_log(i), SpawnOptionsOf(options_)));
  workers_.push_back(std::move(worker));
  return absl::OkStatus();
}

absl::Status LocalCluster::AwaitWorker(int i) {
  const std::string ports = absl::StrCat(options_.dir, "/worker-", i, ".ports");
  absl::Status up =
      WaitForFile(ports, options_.start_timeout, &workers_[i], worker_log(i), options_.stop);
  if (absl::IsCancelled(up)) return up;
  if (!up.ok()) {
    return absl::UnavailableError(
        absl::StrCat("worker ", i, " did not start: ", up.message(), "; see ", worker_log(i)));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> LocalCluster::AddWorker() {
  const int i = num_workers();
  RETURN_IF_ERROR(SpawnWorker(i));
  RETURN_IF_ERROR(AwaitWorker(i));
  return i;
}

LocalCluster::~LocalCluster() {
  // Workers first, while the coordinator still listens, all signalled at
  // once against one 5 s deadline (one at a time, N stuck workers took
  // N x 5 s); then the standbys likewise; then the coordinator.
  auto all = [](std::vector<Subprocess>& processes) {
    std::vector<Subprocess*> out;
    for (Subprocess& p : processes) out.push_back(&p);
    return out;
  };
  TerminateAll(all(workers_), absl::Seconds(5));
  TerminateAll(all(standbys_), absl::Seconds(5));
  if (coordinator_) coordinator_->Terminate(absl::Seconds(5));
}

absl::StatusOr<int> LocalCluster::worker_metrics_port(int i) const {
  return ReadPort(absl::StrCat(options_.dir, "/worker-", i, ".ports"), "metrics_port");
}

std::string LocalCluster::worker_log(int i) const {
  return absl::StrCat(options_.dir, "/worker-", i, ".log");
}

bool LocalCluster::WritesFileNamed(absl::string_view name) {
  if (name == "up.lock" || name == "join.token" || name == "user.token") return true;
  // Exactly the processes' names: a run empties or removes these at start
  // (RemoveEarlierRunsFiles), so a user's coordinator-prod.log or
  // worker-notes.log beside them must not match.
  if (!absl::ConsumeSuffix(&name, ".ports") && !absl::ConsumeSuffix(&name, ".log")) return false;
  const auto numbered = [](absl::string_view rest) {
    return !rest.empty() && std::all_of(rest.begin(), rest.end(), absl::ascii_isdigit);
  };
  if (name == "coordinator") return true;
  for (absl::string_view prefix : {"coordinator-standby-", "coordinator-", "worker-"}) {
    if (absl::ConsumePrefix(&name, prefix)) return numbered(name);
  }
  return false;
}

std::string LocalCluster::DescribeEndedWorkers() {
  std::string out;
  for (int i = 0; i < num_workers(); ++i) {
    const std::optional<int> status = workers_[i].Poll();
    if (!status.has_value()) continue;
    const bool killed = WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL;
    absl::StrAppend(&out, "worker-", i, " ended: ", DescribeExit(*status),
                    killed ? ", which the kernel's out-of-memory killer sends (dmesg says "
                             "whether it did)"
                           : "",
                    "; its log: ", worker_log(i), "\n");
  }
  return out;
}

std::string LocalCluster::coordinator_log() const {
  // A restarted coordinator logs into a file of its own.
  return coordinator_starts_ == 0
             ? options_.dir + "/coordinator.log"
             : absl::StrCat(options_.dir, "/coordinator-", coordinator_starts_, ".log");
}

}  // namespace pipetrain
