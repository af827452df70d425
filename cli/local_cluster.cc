#include "cli/local_cluster.h"

#include <fcntl.h>
#include <unistd.h>

#include <climits>
#include <csignal>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

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
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  const std::string line = token + "\n";
  const bool ok =
      fd >= 0 && write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  if (fd >= 0) close(fd);
  if (!ok) return absl::PermissionDeniedError(absl::StrCat("cannot write token file ", path));
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

SpawnOptions SpawnOptionsOf(const LocalClusterOptions& options) {
  SpawnOptions spawn;
  spawn.exit_with_parent = options.exit_with_parent;
  return spawn;
}

}  // namespace

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
  return absl::NotFoundError(absl::StrCat("cannot find ", name, "; looked in ",
                                          absl::StrJoin(candidates, ", "),
                                          "; build it with bazel build //...",
                                          " or pass its path"));
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
  absl::Status ready =
      WaitForFile(ports, options_.start_timeout, coordinator_.get(), coordinator_log());
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
                                     cluster->standby_log(i));
    if (!ready.ok()) {
      return absl::UnavailableError(
          absl::StrCat("standby coordinator ", i, " did not start: ", ready.message()));
    }
    ASSIGN_OR_RETURN(int port, ReadPort(ports, "grpc_port"));
    cluster->standby_grpc_ports_.push_back(port);
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
  absl::Status up = WaitForFile(ports, options_.start_timeout, &workers_[i], worker_log(i));
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
  for (Subprocess& w : workers_) w.Terminate(absl::Seconds(5));
  for (Subprocess& s : standbys_) s.Terminate(absl::Seconds(5));
  if (coordinator_) coordinator_->Terminate(absl::Seconds(5));
}

absl::StatusOr<int> LocalCluster::worker_metrics_port(int i) const {
  return ReadPort(absl::StrCat(options_.dir, "/worker-", i, ".ports"), "metrics_port");
}

std::string LocalCluster::worker_log(int i) const {
  return absl::StrCat(options_.dir, "/worker-", i, ".log");
}

std::string LocalCluster::coordinator_log() const {
  // A restarted coordinator logs into a file of its own.
  return coordinator_starts_ == 0
             ? options_.dir + "/coordinator.log"
             : absl::StrCat(options_.dir, "/coordinator-", coordinator_starts_, ".log");
}

}  // namespace pipetrain
