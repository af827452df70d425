// LocalCluster: a coordinator and N workers as child processes on loopback,
// every port chosen by the kernel (port 0) and read back from ports files.
// Used by `pipetrain up` and by the multi-process tests. The destructor
// terminates every child (all workers together, then the standbys, then
// the coordinator), so nothing outlives the cluster.
// Not thread-safe.
#ifndef PIPETRAIN_CLI_LOCAL_CLUSTER_H_
#define PIPETRAIN_CLI_LOCAL_CLUSTER_H_

#include <sys/types.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/ports_file.h"
#include "common/subprocess.h"

namespace pipetrain {

struct LocalClusterOptions {
  std::string coordinator_binary;
  std::string worker_binary;
  int workers = 4;
  std::string dir;  // logs, ports and token files go here (must exist)
  // Written to <dir>/join.token and <dir>/user.token (mode 0600) and passed
  // by file, never on a command line (which `ps` shows to every user).
  // An empty token leaves its flag out, and adds --insecure (the
  // coordinator refuses to run with either missing otherwise).
  std::string join_token;
  std::string user_token;
  std::vector<std::string> coordinator_args;  // extra flags
  std::vector<std::string> worker_args;       // extra flags for every worker
  // Per worker i < size(), flags after worker_args (e.g. its own --device).
  std::vector<std::vector<std::string>> per_worker_args;
  absl::Duration start_timeout = absl::Seconds(30);
  // Highly available coordinators: this many more coordinators with the
  // same flags (which must then name an etcd: --etcd-endpoints), started
  // after the first; the workers are given every coordinator's address.
  int standby_coordinators = 0;
  // Every process started is told to end when this one does, even killed
  // (subprocess.h, SpawnOptions::exit_with_parent): call Start, AddWorker
  // and KillAndRestartCoordinator from a thread that outlives the cluster.
  bool exit_with_parent = false;
  // Every process started is in a process group of its own
  // (SpawnOptions::own_process_group): a terminal's Ctrl-C reaches only
  // this process, which then stops the cluster in order (the destructor).
  bool own_process_groups = false;
  // Asked while Start and AddWorker wait for a process to bind its ports:
  // true (a signal came) ends the wait, and the call returns CANCELLED
  // (Start stops what it started) instead of waiting out start_timeout
  // for a process that hangs.
  std::function<bool()> stop;
};

class LocalCluster {
 public:
  // Starts the coordinator, waits for its ports, then starts the workers
  // and waits until each has bound its data plane. A process that did not
  // start is named with its log file; a ports file it wrote that does not
  // parse, with that file (ReadPort).
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const LocalClusterOptions& options);
  // Whether the cluster (its processes included) writes a file named `name`
  // in options.dir: up.lock, the token files, and each process's ports
  // file and log (coordinator, coordinator-N, coordinator-standby-N and
  // worker-N, each .ports and .log; N digits).
  static bool WritesFileNamed(absl::string_view name);
  ~LocalCluster();

  // The first coordinator's gRPC address, then the standbys', comma-separated.
  std::string grpc_address() const;
  std::string http_address() const { return "127.0.0.1:" + std::to_string(http_port_); }
  int http_port() const { return http_port_; }
  const std::string& user_token() const { return options_.user_token; }
  std::string user_token_file() const { return options_.dir + "/user.token"; }
  Subprocess& coordinator() { return *coordinator_; }
  Subprocess& standby(int i) { return standbys_[i]; }
  // Standby i's HTTP port (its follower routes, then the leader's).
  int standby_http_port(int i) const { return standby_http_ports_[i]; }
  std::string standby_log(int i) const;
  // Kills the coordinator with SIGKILL (no clean shutdown) and starts a new
  // one on the same ports with the same flags; the workers are left alone
  // (they find out and register again). Errors as Start.
  absl::Status KillAndRestartCoordinator();
  Subprocess& worker(int i) { return workers_[i]; }
  // Starts one more worker (as Start does) and waits until its data plane
  // is bound; returns its index.
  absl::StatusOr<int> AddWorker();
  int num_workers() const { return static_cast<int>(workers_.size()); }
  std::string worker_log(int i) const;
  // One line per worker process that has ended, for a summary: "worker-1
  // ended: killed by signal 9 (SIGKILL) ...; its log: DIR/worker-1.log".
  // A job that lost a worker only says it "is gone"; this says how. On
  // SIGKILL, which nothing here sends while the cluster runs, the line
  // adds that the kernel's out-of-memory killer sends it. Empty when
  // every worker still runs.
  std::string DescribeEndedWorkers();
  // The Prometheus /metrics port worker i bound (from its ports file).
  absl::StatusOr<int> worker_metrics_port(int i) const;
  std::string coordinator_log() const;

 private:
  explicit LocalCluster(LocalClusterOptions options) : options_(std::move(options)) {}
  // Starts the coordinator on the given ports (0: any) and reads them back.
  absl::Status StartCoordinator(int grpc_port, int http_port);
  // Spawns worker `i` (== workers_.size()); AwaitWorker waits for its ports.
  absl::Status SpawnWorker(int i);
  absl::Status AwaitWorker(int i);
  LocalClusterOptions options_;
  std::unique_ptr<Subprocess> coordinator_;
  std::vector<Subprocess> standbys_;
  std::vector<int> standby_grpc_ports_;
  std::vector<int> standby_http_ports_;
  std::vector<Subprocess> workers_;
  int grpc_port_ = 0, http_port_ = 0;
  int coordinator_starts_ = 0;  // restarts so far
};

// The directory of one cluster run (`pipetrain up --out`), private to this
// user and to this run. It holds the token files and the ports files from
// which the CLI learns where to send them, so a directory that someone else
// can write is refused: they could swap coordinator.ports and have the
// tokens sent to them. And two runs sharing one would delete and rewrite
// each other's files, so the run holds a lock in it while it lives.
// Not thread-safe.
class ClusterDir {
 public:
  // Makes `path` (mode 0700; missing parents as `mkdir -p` does) or takes
  // the existing one, then locks it: flock(2) on <path>/up.lock, held until
  // this object is destroyed (the kernel drops it if the process dies).
  // `name` (e.g. "--out") starts every error message. `owner`: the uid that
  // must own it (this process's effective uid; other values for tests).
  // Errors, each naming `name`, the path and what to do:
  //   the errno's code (e.g. PERMISSION_DENIED, FAILED_PRECONDITION for a
  //     parent that is a file) when the directory cannot be made or opened,
  //     with strerror;
  //   FAILED_PRECONDITION when it is not a directory, another user owns it
  //     (or the symbolic link at `path`), or its group or others may write
  //     in it;
  //   UNAVAILABLE when another run holds the lock (its pid is named).
  static absl::StatusOr<ClusterDir> Claim(const std::string& name, const std::string& path,
                                          uid_t owner = geteuid());
  ClusterDir(ClusterDir&& other) noexcept;
  ClusterDir& operator=(ClusterDir&& other) noexcept;  // releases this one's lock first
  ~ClusterDir();  // releases the lock; the directory and its files stay

  // The directory's real path (no symbolic link in it), as checked: use
  // it, not the path given, for every file written there.
  const std::string& path() const { return path_; }

 private:
  ClusterDir(std::string path, int lock_fd) : path_(std::move(path)), lock_fd_(lock_fd) {}
  std::string path_;
  int lock_fd_ = -1;
};

// Finds a sibling program of the running binary: first in its Bazel
// runfiles (<self>.runfiles/pipetrain/<package>/<name>), then
// <self dir>/../<package>/<name> (bazel-bin layout), then <self dir>/<name>
// (an installed layout). NOT_FOUND listing the places it looked.
absl::StatusOr<std::string> FindSiblingBinary(const std::string& package, const std::string& name);

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_LOCAL_CLUSTER_H_
