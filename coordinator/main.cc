// pipetrain-coordinator: registers workers, plans and runs jobs (DESIGN.md
// §2, §7). Serves gRPC (workers and the CLI; with grpc.health.v1 and server
// reflection) and HTTP (REST, /healthz, /readyz, /metrics); runs until
// SIGINT or SIGTERM, then reports not ready, waits --shutdown-delay-seconds
// and shuts down cleanly (exit 0).
//
//   pipetrain-coordinator --join-token-file join.token --user-token-file user.token
//       --grpc-address 127.0.0.1:0 --http-address 127.0.0.1:0 --ports-file /tmp/ports.json
//
// It refuses to start without a join token and a user token (by value or
// from a file) unless --insecure says to run open; see docs/operations.md
// "Security" for what each credential allows.
//
// Exit codes: 0 after a signal, 1 when a server cannot start, 2 for bad flags,
// 5 when a leader loses its etcd lease (it restarts as a follower), or when
// its shutdown outlasts --stop-timeout-seconds or a further signal cuts it short
// (exiting without the rest of it, as in a crash).
#include <grpcpp/grpcpp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/annotated_mutex.h"
#include "common/build_identity.h"
#include "common/build_info.h"
#include "common/byte_size.h"
#include "common/clock.h"
#include "common/confined_path.h"
#include "common/coordinator_endpoints.h"
#include "common/exit_now.h"
#include "common/flag_set.h"
#include "common/grpc_log.h"
#include "common/grpc_server_limits.h"
#include "common/host_port.h"
#include "common/http_server.h"
#include "common/link_model.h"
#include "common/logging.h"
#include "common/ports_file.h"
#include "common/process_hardening.h"
#include "common/secrets.h"
#include "common/serving_health.h"
#include "common/signal_names.h"
#include "common/status_macros.h"
#include "common/stop_watchdog.h"
#include "common/subprocess.h"
#include "common/tls_credentials.h"
#include "coordinator/api/caller_auth.h"
#include "coordinator/api/coordinator_metrics.h"
#include "coordinator/api/follower_http.h"
#include "coordinator/api/follower_service.h"
#include "coordinator/api/grpc_service.h"
#include "coordinator/api/rest_service.h"
#include "coordinator/jobs/assignment_hub.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/memory_budget.h"
#include "coordinator/jobs/worker_profile_fetcher.h"
#include "coordinator/registry/worker_registry.h"
#include "coordinator/store/coordinator_state.h"
#include "coordinator/store/etcd_store.h"
#include "coordinator/store/leader_election.h"
#include "coordinator/store/memory_store.h"
#include "coordinator/store/sqlite_store.h"

namespace pipetrain {
namespace {

// What a client may send in one message: job specs are small and weights
// chunks carry 1 MiB of floats, so 4 MiB leaves room without letting one
// request make the coordinator buffer much (docs/operations.md "Bounds").
constexpr int kMaxRequestBytes = 4 << 20;
// What the coordinator sends: assignments carry whole programs and the spec.
constexpr int kMaxResponseBytes = 64 << 20;
// How long in-flight RPCs get to finish at shutdown before they are cancelled.
constexpr auto kShutdownGrace = std::chrono::seconds(5);

struct Flags {
  std::string grpc_address = "127.0.0.1:7070";
  std::string http_address = "127.0.0.1:8080";
  std::string join_token;
  std::string join_token_file;
  double lease_seconds = 5;
  double heartbeat_seconds = 1;
  std::string user_token;
  std::string user_token_file;
  bool insecure = false;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  std::string ports_file;
  std::string output_dir;
  std::string data_roots;  // comma-separated
  std::string state_dir;
  double restart_grace_seconds = 15;
  double profile_timeout_seconds = 600;
  std::string etcd_endpoints;  // comma-separated
  std::string etcd_prefix = "/pipetrain/";
  // Whether --etcd-prefix or --leader-lease-seconds was given: they tune
  // the etcd of --etcd-endpoints, and are refused without it.
  bool etcd_tuning_given = false;
  std::string etcd_ca;    // TLS to etcd: its CA
  std::string etcd_cert;  // and this coordinator's client certificate
  std::string etcd_key;
  std::string etcd_user;           // etcd auth: log in as this user
  std::string etcd_password_file;  // with this password
  std::string advertise_address;
  double leader_lease_seconds = 5;
  double shutdown_delay_seconds = 0;
  // After the servers' grace (kShutdownGrace): the rest of the shutdown.
  double stop_timeout_seconds = 30;
  bool test_hold_io_at_stop = false;  // tests only
  bool allow_core_dumps = false;
  bool allow_mixed_builds = false;
  std::string network;  // BANDWIDTH,LATENCY (common/link_model.h)
  std::string gpu_memory_reserve = "1G";  // kDefaultGpuMemoryReserveBytes
  // The workers' data-plane TLS, as the coordinator reaches their ports.
  std::string worker_tls_ca, worker_tls_cert, worker_tls_key, worker_tls_server_name;
};

// Flags and what is derived from them, validated.
struct Config {
  Flags flags;
  std::shared_ptr<grpc::ServerCredentials> credentials;
  std::string http_host;
  int http_port = 0;
  std::vector<std::string> data_roots;  // --data-root, split and checked
  // --etcd-ca (and --etcd-cert, --etcd-key), read and checked; null:
  // plaintext to etcd.
  std::shared_ptr<grpc::ChannelCredentials> etcd_credentials;
  // Read from --etcd-password-file ("" without --etcd-user).
  std::string etcd_password;
  // --network, parsed (nullopt: not given).
  std::optional<LinkModel> network;
  // --gpu-memory-reserve, parsed (ParseGpuMemoryReserve).
  int64_t gpu_memory_reserve_bytes = kDefaultGpuMemoryReserveBytes;
  // --worker-tls-*, read and checked (null credentials: plaintext).
  WorkerChannelTls worker_tls;
};

// OK with `help` set when --help was given (usage printed).
absl::Status ParseFlags(int argc, char** argv, Flags& flags, bool& help) {
  FlagSet set("usage: pipetrain-coordinator [flags]");
  set.String("grpc-address", &flags.grpc_address, "gRPC listen address host:port (port 0: any)");
  set.String("http-address", &flags.http_address,
             "REST, /healthz and /metrics listen address host:port (port 0: any)");
  set.String("join-token", &flags.join_token,
             "token workers must present to register (visible in ps: prefer --join-token-file)");
  set.String("join-token-file", &flags.join_token_file, "read the join token from this file");
  set.Double("lease-seconds", &flags.lease_seconds,
             "a worker silent for longer than this is LOST");
  set.Double("heartbeat-seconds", &flags.heartbeat_seconds, "heartbeat interval told to workers");
  set.String("user-token", &flags.user_token,
             "bearer token users present on every user RPC and REST endpoint (not /healthz, "
             "/readyz, /metrics; visible in ps: prefer --user-token-file)");
  set.String("user-token-file", &flags.user_token_file, "read the user token from this file");
  set.Bool("insecure", &flags.insecure,
           "allow running without a join token or user token: anyone who can reach the ports "
           "may then register workers or use the job API (local experiments only)");
  set.String("tls-cert", &flags.tls_cert, "PEM certificate chain for gRPC TLS (with --tls-key)");
  set.String("tls-key", &flags.tls_key, "PEM private key for gRPC TLS (with --tls-cert)");
  set.String("tls-client-ca", &flags.tls_client_ca,
             "PEM CA: require client certificates it signed (mutual TLS; with --tls-cert) on the "
             "gRPC port; the HTTP port has no TLS");
  set.String("output-dir", &flags.output_dir,
             "the only directory jobs may write into (spec.output.weightsPath is a name under "
             "it); empty: jobs write no files");
  set.String("data-root", &flags.data_roots,
             "comma-separated directories spec.data.path must lie in, checked at submit "
             "(workers check their own --data-root again); empty: workers alone check");
  set.String("state-dir", &flags.state_dir,
             "keep the coordinator's state (workers, jobs, plans, histories, checkpoints, "
             "profiles) in an SQLite database in this directory, so a restart loses nothing; "
             "empty: in memory only");
  set.String("etcd-endpoints", &flags.etcd_endpoints,
             "highly available coordinators: keep the state in this etcd (comma-separated "
             "host:port of its members) instead of --state-dir; coordinators sharing it and "
             "--etcd-prefix elect one leader, and the others refuse calls naming it");
  set.String("etcd-prefix", &flags.etcd_prefix, "key prefix of this cluster's state in etcd");
  set.String("etcd-ca", &flags.etcd_ca,
             "with --etcd-endpoints: talk to etcd over TLS, verifying it with this PEM CA "
             "(etcd's --trusted-ca-file signed its --cert-file)");
  set.String("etcd-cert", &flags.etcd_cert,
             "with --etcd-ca: PEM client certificate presented to etcd (with --etcd-key), for "
             "an etcd started with --client-cert-auth; with etcd auth enabled its common name "
             "is the etcd user");
  set.String("etcd-key", &flags.etcd_key, "with --etcd-cert: its PEM private key");
  set.String("etcd-user", &flags.etcd_user,
             "with --etcd-endpoints: log in to etcd (auth enabled) as this user, with the "
             "password in --etcd-password-file; the user needs read and write on "
             "--etcd-prefix's keys (use with --etcd-ca: etcd takes passwords in the clear)");
  set.String("etcd-password-file", &flags.etcd_password_file,
             "with --etcd-user: the file holding that user's etcd password");
  set.String("advertise-address", &flags.advertise_address,
             "with --etcd-endpoints: the gRPC address followers name as the leader's (default: "
             "--grpc-address with the bound port; 127.0.0.1 for a wildcard host)");
  set.Double("leader-lease-seconds", &flags.leader_lease_seconds,
             "with --etcd-endpoints: the leader's etcd lease; a follower takes over within "
             "about this long after the leader dies");
  set.Double("restart-grace-seconds", &flags.restart_grace_seconds,
             "after a restart, how long a running job waits for its workers to register again "
             "before it resumes without them");
  set.Double("profile-timeout-seconds", &flags.profile_timeout_seconds,
             "how long the coordinator waits for a worker to profile a job's model (jobs "
             "queued after it wait meanwhile); past it another of the job's workers of that "
             "kind tries once, and after a second timeout the job plans on the analytic profile");
  set.Double("shutdown-delay-seconds", &flags.shutdown_delay_seconds,
             "on SIGTERM or SIGINT, report not ready (gRPC health NOT_SERVING, /readyz 503) "
             "and keep serving this long before shutting down, so load balancers and "
             "Kubernetes stop sending calls first; a second signal ends the wait");
  set.Double("stop-timeout-seconds", &flags.stop_timeout_seconds,
             "on SIGTERM or SIGINT, after the delay and the 5 s given to open calls: how long "
             "the rest of the shutdown (the jobs' last saves and file work on --output-dir, "
             "handing over the leadership) may take before the process exits without it "
             "(exit code 5; with --etcd-endpoints a follower takes over once the lease "
             "expires); a further signal exits so at once; in [1, 3600]");
  set.Bool("test-hold-io-at-stop", &flags.test_hold_io_at_stop,
           "tests only: at shutdown, hold the jobs' file and store work forever, as a file "
           "system that stopped answering would");
  set.String("worker-tls-ca", &flags.worker_tls_ca,
             "workers serve their data plane with mutual TLS (their --data-tls-*): reach them "
             "verifying this PEM CA (their --data-tls-ca), presenting --worker-tls-cert; "
             "workers without TLS are then refused, and without this flag those with it");
  set.String("worker-tls-cert", &flags.worker_tls_cert,
             "with --worker-tls-ca: PEM client certificate signed by that CA (with "
             "--worker-tls-key)");
  set.String("worker-tls-key", &flags.worker_tls_key, "with --worker-tls-cert: its private key");
  set.String("worker-tls-server-name", &flags.worker_tls_server_name,
             "with --worker-tls-ca: the name workers' certificates are checked for (their "
             "--data-tls-server-name; default: each worker's address host)");
  set.String("network", &flags.network,
             "the links between workers that jobs are planned over, as BANDWIDTH,LATENCY (e.g. "
             "1Gbit,0.2ms or 25Gbit,10us; bandwidth in Gbit or Mbit, or GB or MB for bytes); "
             "empty: an assumed 10Gbit,50us, which plans name as "
             "assumed (workers started with --emulate-link are planned over theirs)");
  set.String("gpu-memory-reserve", &flags.gpu_memory_reserve,
             "GPU memory kept out of each GPU worker's plan, e.g. 2G, for what plans do not "
             "count (the CUDA context, cuBLAS workspace, NCCL buffers, allocator slack), per "
             "worker, after workers on one GPU share it; 0: none; at most 1T");
  set.String("ports-file", &flags.ports_file,
             "after binding, write {\"grpc_port\": N, \"http_port\": M} here (atomically)");
  set.Bool("allow-core-dumps", &flags.allow_core_dumps, kAllowCoreDumpsHelp);
  set.Bool("allow-mixed-builds", &flags.allow_mixed_builds,
           "register workers of any build (each listed with its build); by default a worker "
           "whose version or commit is not this coordinator's is refused, since replicas of "
           "two builds may round apart and their protocols may differ");
  set.AddVersionFlag();
  RETURN_IF_ERROR(set.Parse(std::vector<std::string>(argv + 1, argv + argc)));
  flags.etcd_tuning_given = set.IsSet("etcd-prefix") || set.IsSet("leader-lease-seconds");
  help = set.help_requested() || set.version_requested();  // either way: print, exit 0
  if (set.help_requested()) std::printf("%s", set.Usage().c_str());
  if (set.version_requested()) {
    std::printf("%s\n", VersionLine("pipetrain-coordinator").c_str());
  }
  return absl::OkStatus();
}

// How often the coordinator pings an idle client connection, and how long
// it waits for the answer before it closes it: at least this, and at least
// the workers' --lease-seconds (at most a day). A closed connection ends
// its WatchAssignments stream, which marks the worker LOST: with a fixed
// 20 s, a lease raised to ride out longer outages bought nothing past
// about 80 s.
constexpr absl::Duration kCoordinatorServerKeepalive = absl::Seconds(60);
constexpr absl::Duration kCoordinatorServerKeepaliveTimeout = absl::Seconds(20);

// Binds the gRPC server; `port` receives the bound port.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpc(const Config& config,
                                                        const std::string& address,
                                                        grpc::Service* service, GrpcRedMetrics& red,
                                                        int& port) {
  grpc::ServerBuilder builder;
  builder.experimental().SetInterceptorCreators(red.Interceptors());
  builder.AddListeningPort(address, config.credentials, &port);
  // gRPC's default SO_REUSEPORT would let a second coordinator share the port.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(kMaxRequestBytes);
  builder.SetMaxSendMessageSize(kMaxResponseBytes);
  ApplyGrpcServerLimits(builder, "coordinator");
  // A WatchAssignments stream sends nothing between a worker's assignments:
  // one from a host that vanished without closing stayed open (its reactor,
  // connection and last message) for up to gRPC's default 2 h.
  PingIdleClients(builder, kCoordinatorServerKeepalive,
                  std::clamp(absl::Seconds(config.flags.lease_seconds),
                             kCoordinatorServerKeepaliveTimeout, absl::Hours(24)));
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve gRPC on --grpc-address ", address,
                                               "; is the port in use or the host not local?"));
  }
  return server;
}

// Set when this coordinator resigns on its way out: its own on_change(false)
// is then no lost leadership.
std::atomic<bool> resigning{false};

// "host:N" for the host of `grpc_address` (127.0.0.1 for a wildcard).
std::string AddressWithPort(const std::string& grpc_address, int port) {
  std::string host = grpc_address.substr(0, grpc_address.rfind(':'));
  if (host == "0.0.0.0" || host == "[::]" || host.empty()) host = "127.0.0.1";
  return absl::StrCat(host, ":", port);
}

// Whether any flag of TLS to etcd is given.
bool EtcdTlsGiven(const Flags& flags) {
  return !flags.etcd_ca.empty() || !flags.etcd_cert.empty() || !flags.etcd_key.empty();
}

// Where etcd is (--etcd-endpoints, already parsed once by Configure) and
// how to reach it.
EtcdOptions EtcdOptionsOf(const Config& config) {
  EtcdOptions etcd;
  etcd.endpoints = ParseCoordinatorAddresses("--etcd-endpoints", config.flags.etcd_endpoints)
                       .value_or(std::vector<std::string>());
  etcd.prefix = config.flags.etcd_prefix;
  etcd.credentials = config.etcd_credentials;
  etcd.user = config.flags.etcd_user;
  etcd.password = config.etcd_password;
  return etcd;
}

// Highly available coordinators: serves refusals naming the leader
// (FollowerService; on the HTTP port, follower_http.h's routes: probes,
// /metrics, the API refused) until this coordinator wins the election,
// then hands both ports to the real servers. Its health service says
// NOT_SERVING (a follower is not ready: it serves only refusals). Returns
// the gRPC port (*http_port: the HTTP one), or CANCELLED when a
// signal came first. Losing the leadership later ends the process (exit
// code 5: its supervisor restarts it as a follower); the store's fenced
// commits keep a deposed leader from writing meanwhile.
absl::StatusOr<int> FollowUntilLeader(const Config& config, const sigset_t& signals,
                                      ServingHealth& health,
                                      std::unique_ptr<LeaderElection>* election,
                                      std::unique_ptr<FollowerService>* follower_service,
                                      std::unique_ptr<grpc::Server>* follower_server,
                                      const FollowerMetrics* follower_metrics,
                                      std::unique_ptr<HttpServer>* follower_http, int* http_port) {
  const Flags& flags = config.flags;
  std::string leader_seen;
  // Reads the election, which is made below (the port comes first).
  static AnnotatedMutex election_mu;  // one election per process
  AnnotatedMutex* mu = &election_mu;
  const auto leader = [mu, election] {
    AnnotatedMutexLock lock(mu);
    return *election ? (*election)->Leader() : std::string();
  };
  // Once elected, until the state is loaded and the real servers take the
  // ports: the refusals say so, naming no other leader.
  const auto leading = [mu, election] {
    AnnotatedMutexLock lock(mu);
    return *election && (*election)->IsLeader();
  };
  *follower_service = std::make_unique<FollowerService>(leader, leading);
  FollowerService& follower = **follower_service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(flags.grpc_address, config.credentials, &port);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  ApplyGrpcServerLimits(builder, "coordinator-follower");
  builder.RegisterCallbackGenericService(&follower);
  // Handed over at once: on every return from here (an error below, a
  // signal, leadership) the caller stops it, detaching `health` first, or
  // takes its port.
  *follower_server = builder.BuildAndStart();
  grpc::Server* server = follower_server->get();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve gRPC on --grpc-address ", flags.grpc_address));
  }
  health.Attach(server);
  *follower_http =
      std::make_unique<HttpServer>(HttpServer::Options{.bearer_token = flags.user_token});
  ServeFollowerHttp(**follower_http, &health, leader, leading, follower_metrics);
  ASSIGN_OR_RETURN(*http_port, (*follower_http)->Start(config.http_host, config.http_port));
  if (!flags.ports_file.empty()) {
    RETURN_IF_ERROR(
        WritePortsFile(flags.ports_file, {{"grpc_port", port}, {"http_port", *http_port}}));
  }
  const std::string identity = flags.advertise_address.empty()
                                   ? AddressWithPort(flags.grpc_address, port)
                                   : flags.advertise_address;
  const EtcdOptions etcd = EtcdOptionsOf(config);
  LeaderElectionOptions options;
  options.identity = identity;
  options.ttl = absl::Seconds(flags.leader_lease_seconds);
  options.on_change = [identity](bool leader) {
    static std::atomic<bool> led{false};
    if (leader) {
      led.store(true);
      return;
    }
    if (led.load() && !resigning.load()) {
      // Even if stderr blocks: a deposed leader that stays is no follower.
      ExitNow(5, absl::StrCat(identity,
                              " lost the leadership (its etcd lease ended); exiting so that it "
                              "restarts as a follower"));
    }
  };
  {
    ASSIGN_OR_RETURN(std::unique_ptr<LeaderElection> created,
                     LeaderElection::Create(etcd, options));
    AnnotatedMutexLock lock(mu);
    *election = std::move(created);
  }
  RETURN_IF_ERROR((*election)->Start());
  PT_LOG(INFO) << "pipetrain-coordinator " << identity << ": following (gRPC port " << port
               << "), campaigning in etcd " << flags.etcd_endpoints;
  const timespec tick{0, 50 * 1000 * 1000};
  while (!(*election)->IsLeader()) {
    if (sigtimedwait(&signals, nullptr, &tick) > 0) {
      health.Detach();
      server->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
      (*follower_http)->Stop();
      return absl::CancelledError("signal");
    }
    const std::string leader = (*election)->Leader();
    if (leader != leader_seen && !leader.empty()) {
      PT_LOG(INFO) << "the leader is " << leader;
      leader_seen = leader;
    }
  }
  PT_LOG(INFO) << identity << " is the leader now";
  // The caller frees the port (*follower_server) once it is ready to serve
  // on it.
  return port;
}

WorkerRegistry::Options RegistryOptions(const Flags& flags) {
  WorkerRegistry::Options options;
  options.join_token = flags.join_token;
  options.heartbeat_interval = absl::Seconds(flags.heartbeat_seconds);
  options.lease = absl::Seconds(flags.lease_seconds);
  options.clock = RealClock();
  options.lease_clock = MonotonicClock();
  // One cluster, one build (common/build_identity.h): a rolling upgrade
  // replaces the coordinator and its workers together, or allows mixing.
  if (!flags.allow_mixed_builds) options.required_build = ThisBuild();
  // Unstamped, the check compares the version alone, which every build of
  // a release shares: say so once, where an operator looks.
  if (options.required_build.has_value() && !CommitKnown(options.required_build->commit())) {
    PT_LOG(WARNING) << "this coordinator's build is not stamped with a commit ("
                    << DescribeBuild(*options.required_build)
                    << "): workers of any build of that version register; build with "
                       "PIPETRAIN_COMMIT set (or from a git checkout) to check commits";
  }
  return options;
}

// The placeholder earlier manifests committed for both tokens
// ("REPLACE-ME-join-token"): public, so never a credential.
constexpr absl::string_view kPlaceholderToken = "REPLACE-ME";

// INVALID_ARGUMENT when the token of `flag` still is (or starts with) the
// placeholder, naming how to create real ones.
absl::Status RefusePlaceholder(absl::string_view flag, const std::string& token) {
  if (!absl::StartsWithIgnoreCase(token, kPlaceholderToken)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the ", flag, " is the published placeholder \"", kPlaceholderToken,
      "...\", which anyone can read; generate real tokens and give them as files, e.g. on "
      "Kubernetes: openssl rand -hex 32 > join-token; openssl rand -hex 32 > user-token; "
      "kubectl create secret generic pipetrain-tokens --from-file=join-token "
      "--from-file=user-token (docs/operations.md, \"Deploying on Kubernetes\")"));
}

// Resolves the join and user tokens; without --insecure both are required.
// The placeholder is refused either way.
absl::Status ConfigureTokens(Flags& flags) {
  ASSIGN_OR_RETURN(flags.join_token,
                   SecretFromFlags("join-token", flags.join_token, flags.join_token_file));
  ASSIGN_OR_RETURN(flags.user_token,
                   SecretFromFlags("user-token", flags.user_token, flags.user_token_file));
  RETURN_IF_ERROR(RefusePlaceholder("join token", flags.join_token));
  RETURN_IF_ERROR(RefusePlaceholder("user token", flags.user_token));
  // The REST server compares the Authorization header after percent-
  // decoding it (the HTTP library decodes header values), gRPC compares it
  // as sent: a token with a '%' would work over one API and not the other.
  if (absl::StrContains(flags.user_token, '%')) {
    return absl::InvalidArgumentError(
        "the user token contains '%', which HTTP percent-decodes in the Authorization header, "
        "so REST calls would not match it; generate one without (e.g. openssl rand -hex 32)");
  }
  // A worker host holds the join token; the same string as the user token
  // would let any of them submit, cancel and drain as a user.
  if (!flags.user_token.empty() && flags.user_token == flags.join_token) {
    return absl::InvalidArgumentError(
        "the join token and the user token are the same, which would give every worker host a "
        "user's rights (submit, cancel, drain); generate two (e.g. openssl rand -hex 32 twice)");
  }
  if (flags.insecure) return absl::OkStatus();
  if (flags.join_token.empty()) {
    return absl::InvalidArgumentError(
        "no join token: give --join-token-file (or --join-token) so only your workers can "
        "register, or --insecure to let anyone (e.g. openssl rand -hex 32 > join.token)");
  }
  if (flags.user_token.empty()) {
    return absl::InvalidArgumentError(
        "no user token: give --user-token-file (or --user-token) so only your users can submit "
        "and cancel jobs, or --insecure to let anyone");
  }
  return absl::OkStatus();
}

// --output-dir must be a directory the coordinator can write.
absl::Status CheckOutputDir(const std::string& dir) {
  if (dir.empty()) return absl::OkStatus();
  mkdir(dir.c_str(), 0700);  // created when missing (its parent must exist)
  return CheckWritableDirectory("--output-dir", dir);
}

// The absolute, symlink-free form of `path`, which may not exist yet (its
// parent must).
std::string RealPathOf(std::string path) {
  char buffer[PATH_MAX];
  if (realpath(path.c_str(), buffer) != nullptr) return buffer;
  // "state/" names "state" in ".", not "" in "state" (which does not exist
  // yet, and left the whole path unresolved).
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.find_last_of('/');
  const std::string parent = slash == std::string::npos ? "." : path.substr(0, slash);
  if (realpath(parent.empty() ? "/" : parent.c_str(), buffer) == nullptr) return path;
  return absl::StrCat(buffer, "/", path.substr(slash == std::string::npos ? 0 : slash + 1));
}

// Jobs write files under --output-dir by names their users choose: the
// state must not be among them.
absl::Status CheckStateDir(const std::string& state_dir, const std::string& output_dir) {
  if (state_dir.empty() || output_dir.empty()) return absl::OkStatus();
  const std::string state = RealPathOf(state_dir) + "/";
  const std::string output = RealPathOf(output_dir) + "/";
  if (absl::StartsWith(state, output) || absl::StartsWith(output, state)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--state-dir ", state_dir, " and --output-dir ", output_dir,
        " overlap; jobs write files under --output-dir by names users choose, so the state must "
        "lie outside it (e.g. --output-dir=/var/lib/pipetrain/out "
        "--state-dir=/var/lib/pipetrain/state)"));
  }
  return absl::OkStatus();
}

// A fresh job-id epoch per start: milliseconds since the Unix epoch in base
// 36, so ids never repeat across restarts (workers remember old job ids).
std::string JobIdEpoch() {
  constexpr char kDigits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
  uint64_t ms = static_cast<uint64_t>(absl::ToUnixMillis(absl::Now()));
  std::string out;
  do {
    out.insert(out.begin(), kDigits[ms % 36]);
    ms /= 36;
  } while (ms > 0);
  return out;
}

// --worker-tls-*: all three of ca, cert and key (the workers' ports
// require a client certificate), the server name only with them.
absl::Status ConfigureWorkerTls(Config& config) {
  const Flags& f = config.flags;
  ASSIGN_OR_RETURN(
      const bool on,
      CheckMutualTlsFlags({{"worker-tls-ca", f.worker_tls_ca},
                           {"worker-tls-cert", f.worker_tls_cert},
                           {"worker-tls-key", f.worker_tls_key}},
                          "worker-tls-server-name", f.worker_tls_server_name, "the workers'",
                          "workers' data planes with TLS require a client "
                          "certificate signed by their CA"));
  if (!on) return absl::OkStatus();
  ASSIGN_OR_RETURN(config.worker_tls.credentials,
                   ClientTlsCredentials(f.worker_tls_ca, f.worker_tls_cert, f.worker_tls_key,
                                        {"worker-tls-ca", "worker-tls-cert", "worker-tls-key",
                                         "the workers' data planes"}));
  config.worker_tls.server_name = f.worker_tls_server_name;
  return absl::OkStatus();
}

// --gpu-memory-reserve: a size as the workers' memory flags take them
// (ParseByteSize), or 0 for none; INVALID_ARGUMENT for anything else
// (negative) or past kMaxGpuMemoryReserveBytes.
absl::StatusOr<int64_t> ParseGpuMemoryReserve(const std::string& text) {
  if (text == "0") return 0;
  const absl::StatusOr<int64_t> bytes = ParseByteSize("gpu-memory-reserve", text);
  if (!bytes.ok() || *bytes > kMaxGpuMemoryReserveBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpu-memory-reserve \"", text, "\" is not 0 or a size up to 1T such as 512M or 2G"));
  }
  return *bytes;
}

// Everything checked before anything starts: flag errors exit with 2.
absl::Status Configure(int argc, char** argv, Config& config, bool& help) {
  RETURN_IF_ERROR(ParseFlags(argc, argv, config.flags, help));
  if (help) return absl::OkStatus();
  // Before the tokens are read (process_hardening.h).
  if (!config.flags.allow_core_dumps) RETURN_IF_ERROR(ForbidCoreDumpsAndTracing());
  RETURN_IF_ERROR(ConfigureTokens(config.flags));
  RETURN_IF_ERROR(CheckOutputDir(config.flags.output_dir));
  RETURN_IF_ERROR(CheckStateDir(config.flags.state_dir, config.flags.output_dir));
  ASSIGN_OR_RETURN(config.network, ParseLinkModel("--network", config.flags.network));
  ASSIGN_OR_RETURN(config.gpu_memory_reserve_bytes,
                   ParseGpuMemoryReserve(config.flags.gpu_memory_reserve));
  RETURN_IF_ERROR(ConfigureWorkerTls(config));
  config.data_roots = absl::StrSplit(config.flags.data_roots, ',', absl::SkipEmpty());
  RETURN_IF_ERROR(CheckDataRoots("--data-root", config.data_roots));
  if (config.flags.etcd_endpoints.empty() && !config.flags.advertise_address.empty()) {
    return absl::InvalidArgumentError(
        "--advertise-address names the leader's address to followers, so it needs "
        "--etcd-endpoints (highly available coordinators)");
  }
  // Flags about the etcd of --etcd-endpoints, refused without it.
  const std::pair<bool, const char*> etcd_only[] = {
      {EtcdTlsGiven(config.flags), "--etcd-ca, --etcd-cert and --etcd-key are"},
      {!config.flags.etcd_user.empty(), "--etcd-user is"},
      // Else an empty $(ETCD) in a manifest ran on the in-memory store,
      // saying nothing.
      {config.flags.etcd_tuning_given, "--etcd-prefix and --leader-lease-seconds are"},
  };
  for (const auto& [given, flags] : etcd_only) {
    if (given && config.flags.etcd_endpoints.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(flags, " for the etcd of --etcd-endpoints, which is not given"));
    }
  }
  if (config.flags.etcd_user.empty() != config.flags.etcd_password_file.empty()) {
    return absl::InvalidArgumentError("--etcd-user and --etcd-password-file go together");
  }
  if (!config.flags.etcd_endpoints.empty()) {
    if (!config.flags.state_dir.empty()) {
      return absl::InvalidArgumentError(
          "--etcd-endpoints and --state-dir both name where the state goes; give one");
    }
    RETURN_IF_ERROR(
        ParseCoordinatorAddresses("--etcd-endpoints", config.flags.etcd_endpoints).status());
    // Read and checked now (exit 2 naming the flag), not at the first
    // handshake, which fails only as "UNAVAILABLE" without naming a file.
    // Null unless --etcd-ca is given (the others alone are refused).
    if (EtcdTlsGiven(config.flags)) {
      ASSIGN_OR_RETURN(
          config.etcd_credentials,
          ClientTlsCredentials(config.flags.etcd_ca, config.flags.etcd_cert, config.flags.etcd_key,
                               {"etcd-ca", "etcd-cert", "etcd-key", "etcd"}));
    }
    if (!config.flags.etcd_user.empty()) {
      ASSIGN_OR_RETURN(config.etcd_password,
                       ReadSecretFile("--etcd-password-file", config.flags.etcd_password_file,
                                      SecretUse::kPassword));
      if (config.flags.etcd_ca.empty()) {
        PT_LOG(WARNING) << "--etcd-user without --etcd-ca: the etcd password crosses the "
                           "network in plaintext";
      }
    }
    // Scheme and credentials agree (an https:// endpoint needs --etcd-ca).
    RETURN_IF_ERROR(CheckEtcdOptions(EtcdOptionsOf(config)));
    // etcd's leases are whole seconds.
    if (!(config.flags.leader_lease_seconds >= 2 && config.flags.leader_lease_seconds <= 600) ||
        config.flags.leader_lease_seconds != std::floor(config.flags.leader_lease_seconds)) {
      return absl::InvalidArgumentError(
          "--leader-lease-seconds must be a whole number of seconds in [2, 600]");
    }
  }
  if (!(config.flags.shutdown_delay_seconds >= 0 &&
        config.flags.shutdown_delay_seconds <= 3600)) {
    return absl::InvalidArgumentError("--shutdown-delay-seconds must be in [0, 3600]");
  }
  if (!(config.flags.stop_timeout_seconds >= 1 && config.flags.stop_timeout_seconds <= 3600)) {
    return absl::InvalidArgumentError("--stop-timeout-seconds must be in [1, 3600]");
  }
  if (!(config.flags.restart_grace_seconds >= 0 && config.flags.restart_grace_seconds <= 86400)) {
    return absl::InvalidArgumentError("--restart-grace-seconds must be in [0, 86400]");
  }
  // Below 10 s a real profile rarely finishes: every fetch would time out,
  // and each model would then plan on the analytic profile for an hour.
  if (!(config.flags.profile_timeout_seconds >= 10 &&
        config.flags.profile_timeout_seconds <= 86400)) {
    return absl::InvalidArgumentError("--profile-timeout-seconds must be in [10, 86400]");
  }
  // Workers beat at most every 50 ms (WorkerAgent): a shorter interval
  // would start, and then lose every worker against a lease sized for it.
  if (!(config.flags.heartbeat_seconds >= 0.05)) {
    return absl::InvalidArgumentError(
        "--heartbeat-seconds must be >= 0.05 (workers heartbeat at most every 50 ms)");
  }
  absl::Status lease = WorkerRegistry::ValidateOptions(RegistryOptions(config.flags));
  if (!lease.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(lease.message(), " (--heartbeat-seconds, --lease-seconds)"));
  }
  ASSIGN_OR_RETURN(config.credentials,
                   ServerTlsCredentials(config.flags.tls_cert, config.flags.tls_key,
                                        config.flags.tls_client_ca));
  // Checked here: gRPC would bind a port out of range modulo 65536.
  RETURN_IF_ERROR(SplitHostPort(config.flags.grpc_address, "--grpc-address").status());
  if (!config.flags.advertise_address.empty()) {
    RETURN_IF_ERROR(SplitHostPort(config.flags.advertise_address, "--advertise-address").status());
  }
  ASSIGN_OR_RETURN(const HostPort http, SplitHostPort(config.flags.http_address, "--http-address"));
  config.http_host = http.host;
  config.http_port = http.port;
  return absl::OkStatus();
}

pthread_t g_main_thread;

// Runs only on a thread that did not block the signals: one started before
// main (OpenBLAS starts its pool while the library loads). It passes the
// signal on to the main thread, where it is blocked and WaitForSignal or
// DrainBeforeShutdown takes it. Without it, such a thread would take the
// default action and kill the process (a second SIGTERM during the drain
// ended it with signal 15 in CI). pthread_kill is async-signal-safe, and so
// is the count, lock-free: StopBound, on a thread of its own while the main
// thread tears down, learns of a forwarded signal from it.
std::atomic<int> g_forwarded_signals{0};
std::atomic<int> g_last_forwarded_signal{0};  // for its name
static_assert(std::atomic<int>::is_always_lock_free);
extern "C" void ForwardShutdownSignal(int signal) {
  g_last_forwarded_signal.store(signal);
  g_forwarded_signals.fetch_add(1);
  pthread_kill(g_main_thread, signal);
}

// Blocks SIGINT and SIGTERM in this thread and (by inheritance) every thread
// started afterwards, so WaitForSignal receives them synchronously; threads
// that already run forward them here (ForwardShutdownSignal).
sigset_t BlockShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  // A hang-up killed the coordinator outright (no drain, no lease given
  // up); nothing reloads (TLS files and tokens are read at start), so it
  // shuts down as on SIGTERM.
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  g_main_thread = pthread_self();
  struct sigaction forward {};
  forward.sa_handler = ForwardShutdownSignal;
  sigemptyset(&forward.sa_mask);
  forward.sa_flags = SA_RESTART;
  sigaction(SIGINT, &forward, nullptr);
  sigaction(SIGTERM, &forward, nullptr);
  sigaction(SIGHUP, &forward, nullptr);
  return signals;
}

int WaitForSignal(const sigset_t& signals) {
  int signal = 0;
  while (sigwait(&signals, &signal) != 0) {
  }
  return signal;
}

// After the first signal: not ready at once, then serving on for `delay`
// (--shutdown-delay-seconds) or until a second signal, whichever is first.
void DrainBeforeShutdown(const sigset_t& signals, int signal, ServingHealth& health,
                         absl::Duration delay) {
  const char* name = ShutdownSignalName(signal);
  health.Drain(absl::StrCat("draining: shutting down after ", name));
  if (delay <= absl::ZeroDuration()) return;
  PT_LOG(INFO) << "received " << name << "; not ready, serving on for "
               << absl::FormatDuration(delay) << " (--shutdown-delay-seconds; signal again to "
               << "stop now)";
  const timespec wait = absl::ToTimespec(delay);
  while (sigtimedwait(&signals, nullptr, &wait) < 0 && errno == EINTR) {
  }
}

// What a leader's shutdown waits for, for the error of one that outlasts
// --stop-timeout-seconds. Thread-safe.
class TeardownProgress {
 public:
  // How long the job manager's queues had waited when the servers stopped
  // (JobManager's IoQueueAge, WeightsSyncAge, PlanningAge; zero: idle),
  // read then because the queues may be gone by the time the error is
  // written.
  struct JobQueues {
    absl::Duration io, weights_sync, planning;
  };
  // The servers stopped; the job manager's teardown (its last saves, its
  // file work, a final weights sync or a plan it waits for) comes next.
  void ServersStopped(const JobQueues& queues) {
    AnnotatedMutexLock lock(&mu_);
    stage_ = Stage::kJobs;
    queues_ = queues;
  }
  // ~JobManager returned.
  void JobsGone() {
    AnnotatedMutexLock lock(&mu_);
    stage_ = Stage::kLeadership;
  }
  std::string Describe() const {
    AnnotatedMutexLock lock(&mu_);
    switch (stage_) {
      case Stage::kServers:
        return "the open gRPC and HTTP calls";
      case Stage::kJobs:
        return DescribeJobsLocked();
      case Stage::kLeadership:
        break;
    }
    return "handing over the leadership and closing the store";
  }

 private:
  enum class Stage { kServers, kJobs, kLeadership };
  // ~JobManager waits for its I/O queue, and for the final weights sync and
  // the plan in progress (their executors' destructors).
  std::string DescribeJobsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::string out = absl::StrCat(
        "the job manager's last saves and its file work on --output-dir, one at a time (",
        queues_.io > absl::ZeroDuration()
            ? absl::StrCat("the oldest had waited ", absl::FormatDuration(queues_.io))
            : std::string("none was queued"),
        " when the servers stopped; a file system that stopped answering holds them all)");
    if (queues_.weights_sync > absl::ZeroDuration()) {
      // Cut off, the job was never saved SUCCEEDED: it trains again from
      // its last checkpoint (operations.md).
      absl::StrAppend(&out, ", and a finished job's final weights file sync on --output-dir (",
                      absl::FormatDuration(queues_.weights_sync),
                      " old when the servers stopped; cut off, the job is restored RUNNING and "
                      "trains again from its last checkpoint)");
    }
    if (queues_.planning > absl::ZeroDuration()) {
      absl::StrAppend(&out, ", and a job's plan being computed (",
                      absl::FormatDuration(queues_.planning), " old when the servers stopped)");
    }
    return out;
  }

  mutable AnnotatedMutex mu_;
  Stage stage_ ABSL_GUARDED_BY(mu_) = Stage::kServers;
  JobQueues queues_ ABSL_GUARDED_BY(mu_);
};

// Bounds a leader's shutdown: `give_up`, which must not return (it exits
// the process), runs unless the bound is destroyed within `limit`, or at
// once on another SIGINT, SIGTERM or SIGHUP. The main thread tears down
// meanwhile, so without this nothing takes a further signal: it stayed
// pending, and an operator's second Ctrl-C did nothing.
class StopBound {
 public:
  StopBound(const sigset_t& signals, absl::Duration limit,
            std::function<void(const std::string& why)> give_up)
      : give_up_(std::move(give_up)),
        watchdog_(limit, [this, limit] {
          GiveUp(absl::StrCat("the shutdown did not end within ", absl::FormatDuration(limit)));
        }) {
    // Read before the thread starts: a signal forwarded from now on is one
    // more than those that began and hurried the shutdown.
    const int forwarded = g_forwarded_signals.load();
    signals_ = std::thread([this, signals, forwarded] {
      // Polled, not one sigwait: a signal that ForwardShutdownSignal passed
      // to the main thread shows only in the count, and the destructor must
      // be able to end the wait.
      const timespec tick{0, 50 * 1000 * 1000};
      while (!done_.load()) {
        int signal = sigtimedwait(&signals, nullptr, &tick);
        if (signal <= 0 && g_forwarded_signals.load() != forwarded) {
          signal = g_last_forwarded_signal.load();
        }
        if (signal > 0) GiveUp(absl::StrCat("received ", ShutdownSignalName(signal), " again"));
      }
    });
  }
  ~StopBound() {
    done_.store(true);
    signals_.join();
  }  // then watchdog_'s: Done(), join
  StopBound(const StopBound&) = delete;
  StopBound& operator=(const StopBound&) = delete;

 private:
  // One caller only: the other (a signal as the time runs out) waits for
  // the exit.
  void GiveUp(const std::string& why) {
    AnnotatedMutexLock lock(&give_up_mu_);  // never released: give_up_ exits
    give_up_(why);
  }

  const std::function<void(const std::string&)> give_up_;
  AnnotatedMutex give_up_mu_;
  std::atomic<bool> done_{false};
  StopWatchdog watchdog_;
  std::thread signals_;
};

// When each TLS file this coordinator serves with, or reaches etcd or the
// workers with, expires, for the expiry gauge: the leader's, and a standby's (it serves
// gRPC with them already, and campaigns in etcd).
std::vector<TlsCertificateExpiry> ServedCertificates(const Flags& flags) {
  return TlsCertificateExpiries({{"tls-cert", flags.tls_cert},
                                 {"tls-client-ca", flags.tls_client_ca},
                                 {"etcd-cert", flags.etcd_cert},
                                 {"etcd-ca", flags.etcd_ca},
                                 {"worker-tls-cert", flags.worker_tls_cert},
                                 {"worker-tls-ca", flags.worker_tls_ca}});
}

// Wires the managers and servers, serves until a signal, shuts down.
int Serve(const Config& config, const sigset_t& signals) {
  const Flags& flags = config.flags;
  // A leader's shutdown after a signal, bounded by --stop-timeout-seconds (made
  // when it begins). Declared first, so destroyed last: the bound covers
  // handing over the lease (`resign`), the election's end and the store's
  // close (~SqliteStore checkpoints its WAL on --state-dir) too. Its
  // give_up reads `teardown` and `flags` only, which outlive it.
  TeardownProgress teardown;
  std::optional<StopBound> stop_bound;
  // Durable state first: a coordinator that cannot keep what it promised
  // does not start.
  std::unique_ptr<Store> store;
  std::unique_ptr<LeaderElection> election;  // with --etcd-endpoints
  // On the way out, after everything declared below (the job manager's
  // last saves included): revoke the lease, so a follower takes over at
  // once rather than after it expires.
  absl::Cleanup resign = [&election] {
    if (election == nullptr) return;
    resigning.store(true);
    if (absl::Status resigned = election->Resign(); !resigned.ok()) {
      PT_LOG(WARNING) << "could not hand over the leadership (" << resigned
                      << "); a follower takes over once the lease expires";
    }
  };
  std::unique_ptr<FollowerService> follower_service;
  std::unique_ptr<grpc::Server> follower_server;  // until the real service binds
  std::unique_ptr<HttpServer> follower_http;      // until the real HTTP server binds
  std::optional<FollowerMetrics> follower_metrics;
  int http_port = config.http_port;
  std::string grpc_address = flags.grpc_address;
  ServingHealth health({"pipetrain.v1.CoordinatorService"}, "following: another coordinator leads");
  // An error return after following (the store fails to open or load once
  // this process leads) finds the follower's servers still running, serving
  // from `health` and `follower_metrics`: they stop here, before those go,
  // and before `resign` hands the lease over. With a deadline: a client's
  // open health Watch holds a bare Shutdown() forever.
  absl::Cleanup stop_follower = [&health, &follower_server, &follower_http] {
    if (follower_server != nullptr) {
      health.Detach();
      follower_server->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
      follower_server->Wait();
      follower_server.reset();
    }
    if (follower_http != nullptr) follower_http->Stop();
  };
  if (!flags.etcd_endpoints.empty()) {
    absl::StatusOr<int> port = FollowUntilLeader(
        config, signals, health, &election, &follower_service, &follower_server,
        &follower_metrics.emplace(ServedCertificates(flags)), &follower_http, &http_port);
    if (port.status().code() == absl::StatusCode::kCancelled) return 0;
    if (!port.ok()) {
      PT_LOG(ERROR) << "--etcd-endpoints: " << port.status();
      return 1;
    }
    // Elected: /readyz says so while the state loads (the follower's
    // servers still answer, refusing as a loading leader).
    health.SetNotReady("leading: loading the state; ready once it is loaded");
    // The real service listens where the follower did (a wildcard stays
    // one: "[::]" had become 127.0.0.1, unreachable to remote workers).
    grpc_address =
        JoinHostPort(SplitHostPort(flags.grpc_address, "--grpc-address").value().host, *port);
    absl::StatusOr<std::unique_ptr<EtcdStore>> opened =
        EtcdStore::Open(EtcdOptionsOf(config), election.get());
    if (!opened.ok()) {
      PT_LOG(ERROR) << "--etcd-endpoints: " << opened.status();
      return 1;
    }
    store = std::move(*opened);
  } else if (flags.state_dir.empty()) {
    store = std::make_unique<MemoryStore>();
  } else {
    absl::StatusOr<std::unique_ptr<SqliteStore>> opened = SqliteStore::Open(flags.state_dir);
    if (!opened.ok()) {
      PT_LOG(ERROR) << "--state-dir: " << opened.status();
      return 1;
    }
    store = std::move(*opened);
  }
  // The flag that names where the state is, for errors about it.
  const char* store_flag = flags.etcd_endpoints.empty() ? "--state-dir" : "--etcd-endpoints";
  CoordinatorState state(store.get());
  if (absl::Status initialized = state.Initialize(); !initialized.ok()) {
    PT_LOG(ERROR) << store_flag << ": " << initialized;
    return 1;
  }
  WorkerRegistry::Options registry_options = RegistryOptions(flags);
  registry_options.data_plane_tls = config.worker_tls.credentials != nullptr;
  registry_options.persist = [&state](const v1::Worker& w) { return state.SaveWorker(w); };
  registry_options.forget = [&state](const std::string& id) {
    // Logged only: a record left behind is forgotten again at the next start.
    if (absl::Status dropped = state.DeleteWorker(id); !dropped.ok()) {
      PT_LOG(WARNING) << "could not drop the saved record of " << id << ": " << dropped;
    }
  };
  WorkerRegistry registry(registry_options);
  absl::StatusOr<std::vector<v1::Worker>> known = state.LoadWorkers();
  if (!known.ok()) {
    PT_LOG(ERROR) << store_flag << ": " << known.status();
    return 1;
  }
  registry.Restore(*known);
  AssignmentHub hub;
  JobManagerOptions job_options;
  job_options.state = &state;
  job_options.restart_grace = absl::Seconds(flags.restart_grace_seconds);
  job_options.elapsed_clock = MonotonicClock();  // timeouts survive a step of the wall clock
  job_options.output_dir = flags.output_dir;
  job_options.data_roots = config.data_roots;
  job_options.network = config.network;
  job_options.gpu_memory_reserve_bytes = config.gpu_memory_reserve_bytes;
  job_options.id_epoch = JobIdEpoch();
  // Declared before the jobs, made after them (it reads them): the job
  // manager's destructor still runs planning and store tasks whose events
  // go to the metrics, so the metrics must outlive it.
  std::optional<CoordinatorMetrics> metrics_holder;
  // Runs once ~JobManager returned, for the error of a shutdown that
  // outlasts --stop-timeout-seconds.
  absl::Cleanup jobs_gone = [&teardown] { teardown.JobsGone(); };
  JobManager jobs(&registry, &hub, RealClock(), job_options);
  // Jobs profile the model on a worker first (cached).
  // Cancelled at shutdown: a leader waiting out a profile would hold its
  // etcd lease with its ports closed (no follower could take over).
  CancellableProfileFetcher fetcher =
      MakeCancellableWorkerProfileFetcher(absl::Seconds(flags.profile_timeout_seconds),
                                          config.worker_tls);
  jobs.SetProfileFetcher(std::move(fetcher.fetch), std::move(fetcher.cancel_all),
                         std::move(fetcher.cancel_to));
  // Before Restore, which reports the jobs it resumes as recoveries.
  CoordinatorMetrics& metrics = metrics_holder.emplace(&registry, &jobs);
  metrics.AddTlsCertificates(ServedCertificates(flags));
  jobs.SetEvents(metrics.Events());
  if (absl::Status restored = jobs.Restore(); !restored.ok()) {
    PT_LOG(ERROR) << store_flag << ": " << restored;
    return 1;
  }
  PT_LOG(INFO) << "state: " << state.Describe() << " (" << known->size() << " workers known)";
  registry.SetLossListener(
      [&jobs](const std::string& worker, const std::string& job, const std::string& reason,
              int64_t incarnation) { jobs.OnWorkerLost(worker, job, reason, incarnation); });
  const CallerAuth auth(flags.user_token, &registry);
  CoordinatorGrpcService service(&registry, &jobs, &hub, &metrics, &auth);

  int grpc_port = 0;
  if (follower_server != nullptr) {
    // The state is loaded: swap the refusals for the service, on the port
    // clients know (a moment without a listener; they retry).
    health.Detach();
    follower_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    follower_server->Wait();
    follower_server.reset();
  }
  absl::StatusOr<std::unique_ptr<grpc::Server>> grpc_server =
      StartGrpc(config, grpc_address, &service, metrics.rpc(), grpc_port);
  if (!grpc_server.ok()) {
    PT_LOG(ERROR) << grpc_server.status().message();
    return 1;
  }
  // The state is loaded and gRPC serves: ready.
  health.Attach(grpc_server->get());
  health.SetReady();
  HttpServer http({.bearer_token = flags.user_token, .on_response = metrics.HttpObserver()});
  ServeHealthEndpoints(http, &health);
  RegisterRestRoutes(http, &registry, &jobs);
  ServePrometheus(http, metrics.registry(), [&metrics] { metrics.Refresh(); });
  metrics.http().DeclareRoutes(http);
  // A leader that followed takes over the port its follower server held.
  if (follower_http != nullptr) follower_http->Stop();
  absl::StatusOr<int> bound = http.Start(config.http_host, http_port);
  auto fail_to_start = [&](const absl::Status& why) {
    PT_LOG(ERROR) << why.message();
    service.Shutdown();
    health.Detach();
    (*grpc_server)->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
    return 1;
  };
  if (!bound.ok()) return fail_to_start(bound.status());
  const char* tls = flags.tls_cert.empty()        ? "without TLS"
                    : flags.tls_client_ca.empty() ? "with TLS"
                                                  : "with mutual TLS";
  PT_LOG(INFO) << "pipetrain-coordinator: gRPC on port " << grpc_port << ", HTTP on port "
               << *bound << " (gRPC " << tls << ")";
  // The hosts as given (an IPv6 one keeps its brackets), with the bound
  // ports: port 0 in a flag says nothing of where to reach.
  const std::string grpc_at =
      absl::StrCat(flags.grpc_address.substr(0, flags.grpc_address.rfind(':')), ":", grpc_port);
  const std::string http_at =
      absl::StrCat(flags.http_address.substr(0, flags.http_address.rfind(':')), ":", *bound);
  if (flags.join_token.empty()) {
    PT_LOG(WARNING) << "--insecure without a join token: anyone who can reach " << grpc_at
                    << " may register as a worker";
  }
  if (flags.user_token.empty()) {
    PT_LOG(WARNING) << "--insecure without a user token: anyone who can reach " << grpc_at << " or "
                    << http_at << " may submit, list and cancel jobs";
  }
  // TLS (and --tls-client-ca) cover gRPC only: the REST API takes the
  // same user token in plaintext, from any caller that can reach it.
  const bool http_loopback = config.http_host == "localhost" || config.http_host == "::1" ||
                             absl::StartsWith(config.http_host, "127.");
  if (!flags.tls_cert.empty() && !http_loopback) {
    PT_LOG(WARNING) << "HTTP on " << http_at << " has no TLS"
                    << (flags.tls_client_ca.empty() ? "" : " and no client-certificate check")
                    << ": the REST API takes the user token in plaintext from any caller that "
                       "reaches it; keep --http-address on loopback, or put a TLS proxy in front "
                       "(docs/operations.md, \"What to expose\")";
  }
  // The ports file says "started" (to `up`, to tests, to scripts): all the
  // start-up lines above come before it.
  if (!flags.ports_file.empty()) {
    if (absl::Status ports =
            WritePortsFile(flags.ports_file, {{"grpc_port", grpc_port}, {"http_port", *bound}});
        !ports.ok()) {
      return fail_to_start(ports);
    }
  }
  registry.StartStalenessLoop();
  jobs.StartSchedulingLoop();

  const int signal = WaitForSignal(signals);
  DrainBeforeShutdown(signals, signal, health, absl::Seconds(flags.shutdown_delay_seconds));
  // From here (before the line below, which tests wait for) the shutdown
  // is bounded, and a further signal cuts it short: a leader stuck in it
  // (its jobs' file work on a volume that stopped answering) held its etcd
  // lease with its ports closed, so no follower could take over. The lease
  // is not revoked on the way out (that would join the election's thread,
  // which may wait out an RPC): it expires by itself. Saves not made by
  // then are lost, as in a crash; a restart or the next leader restores
  // the jobs as last saved.
  const absl::Duration stop_timeout = absl::Seconds(flags.stop_timeout_seconds);
  const absl::Duration stop_limit = absl::FromChrono(kShutdownGrace) + stop_timeout;
  // ExitNow: a stalled stderr (a stopped `| tee`, a blocking log driver)
  // holds the main thread's log lines, and must not hold this exit too.
  stop_bound.emplace(signals, stop_limit, [&teardown, &flags](const std::string& why) {
    ExitNow(5, absl::StrCat(why, " (--stop-timeout-seconds ", flags.stop_timeout_seconds,
                            " after the servers' grace); it still waits for ",
                            teardown.Describe(), "; exiting without it (exit code 5)",
                            flags.etcd_endpoints.empty()
                                ? ""
                                : "; a follower takes over once this leader's etcd lease "
                                  "expires (--leader-lease-seconds)"));
  });
  PT_LOG(INFO) << "received " << ShutdownSignalName(signal) << "; shutting down"
               << (signal == SIGHUP
                       ? " (SIGHUP reloads nothing: restart to read new TLS files or tokens)"
                       : "");
  // Leases stop being checked before heartbeats stop being served: the
  // gRPC shutdown below may wait kShutdownGrace for open calls (a health
  // Watch, a weights upload), longer than a short lease, and a lease that
  // ran out then would start a worker_lost recovery of every running job,
  // saved to the store, for workers that are alive.
  registry.SetLossListener(nullptr);
  registry.Stop();
  service.Shutdown();  // ends WatchAssignments streams, which never end by themselves
  health.Detach();
  // The REST API gets the same grace as gRPC, at the same time: a call it
  // has taken (a submit, a cancel, a drain that did its work) is answered,
  // not cut off with the connection; new ones on open connections are
  // answered 503, new connections refused.
  std::thread http_stop([&http] { http.Stop(absl::FromChrono(kShutdownGrace)); });
  (*grpc_server)->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
  http_stop.join();
  teardown.ServersStopped({jobs.IoQueueAge(), jobs.WeightsSyncAge(), jobs.PlanningAge()});
  if (flags.test_hold_io_at_stop) jobs.HoldIoForTesting();
  // jobs' destructor stops the scheduling loop and makes the last saves,
  // then `resign` hands the lease over: in that order, so that the saves
  // are the leader's (the store's commits are fenced by its term; made
  // after the hand-over they would fail), within stop_bound's limit.
  return 0;
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  // Started by `pipetrain up`: SIGTERM (a clean shutdown) if it dies.
  pipetrain::ExitWithParentIfAsked();
  pipetrain::RateLimitGrpcLogs();                              // before gRPC can log (grpc_log.h)
  const sigset_t signals = pipetrain::BlockShutdownSignals();  // before any thread starts
  pipetrain::EnableGrpcHealthAndReflection();                   // before any gRPC server
  pipetrain::Config config;
  bool help = false;
  absl::Status configured = pipetrain::Configure(argc, argv, config, help);
  if (!configured.ok()) {
    std::fprintf(stderr, "pipetrain-coordinator: %s\n",
                 std::string(configured.message()).c_str());
    return 2;
  }
  if (help) return 0;
  return pipetrain::Serve(config, signals);
}
