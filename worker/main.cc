// pipetrain-worker: joins a coordinator and runs the pipeline stages it is
// assigned (DESIGN.md §2). Its data-plane port also serves grpc.health.v1
// (SERVING once registered with the coordinator, NOT_SERVING from a
// shutdown signal on) and server reflection; its metrics port serves
// /metrics, /healthz and /readyz.
//
//   pipetrain-worker --coordinator 127.0.0.1:7070 [--listen 127.0.0.1:0]
//       [--join-token-file PATH] [--threads 1] [--ports-file PATH]
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/annotated_mutex.h"
#include "common/build_info.h"
#include "common/byte_size.h"
#include "common/confined_path.h"
#include "common/coordinator_endpoints.h"
#include "common/data_plane_limits.h"
#include "common/exit_now.h"
#include "common/flag_set.h"
#include "common/grpc_log.h"
#include "common/host_port.h"
#include "common/http_server.h"
#include "common/logging.h"
#include "common/malloc_tuning.h"
#include "common/ports_file.h"
#include "common/process_hardening.h"
#include "common/secrets.h"
#include "common/serving_health.h"
#include "common/signal_names.h"
#include "common/stop_watchdog.h"
#include "common/subprocess.h"
#include "common/tls_credentials.h"
#include "kernels/cpu/blas.h"
#include "worker/agent/device_info.h"
#include "worker/agent/drain_retry.h"
#include "worker/agent/worker_agent.h"
#include "worker/agent/worker_control_service.h"
#include "worker/agent/worker_metrics.h"
#include "worker/checkpoint/checkpoint_hold.h"
#include "worker/collectives/data_plane_probe.h"
#include "worker/model/backend_select.h"
#include "worker/transport/data_plane_server.h"
#include "worker/transport/data_plane_tls.h"
#include "worker/transport/grpc_transport.h"
#include "worker/transport/shaped_transport.h"

namespace pipetrain {
namespace {

// Self-pipe: a byte means "shut down"; kSignalled for SIGTERM or SIGINT,
// kHungUp for SIGHUP (either: drain first), kFailed when the worker cannot
// go on (stop at once). A hang-up has a byte of its own because it never
// means "exit now" (StopBound): a lost ssh session delivers SIGHUP twice
// within milliseconds (bash resends it to its jobs, then the kernel to the
// foreground group as bash exits). g_signal: the last signal, for the log.
constexpr char kSignalled = 1, kFailed = 2, kHungUp = 3;
volatile sig_atomic_t g_signal = 0;
int g_wake[2] = {-1, -1};
void Wake(char why) {
  ssize_t ignored = write(g_wake[1], &why, 1);
  (void)ignored;
}
extern "C" void OnSignal(int signal) {  // write() is async-signal-safe
  g_signal = signal;
  Wake(signal == SIGHUP ? kHungUp : kSignalled);
}
bool IsSignal(char why) { return why == kSignalled || why == kHungUp; }

// Blocks until a byte arrives or `timeout` passes; the byte, or 0.
char AwaitWake(absl::Duration timeout) {
  pollfd fd{g_wake[0], POLLIN, 0};
  const int ms = timeout == absl::InfiniteDuration() ? -1 : absl::ToInt64Milliseconds(timeout);
  int ready = 0;
  while ((ready = poll(&fd, 1, ms)) < 0 && errno == EINTR) {
  }
  char byte = 0;
  if (ready > 0 && read(g_wake[0], &byte, 1) != 1) byte = 0;
  return byte;
}

// The wake pipe for DrainAfterDelay (DrainAfterDelayOptions::await_wake):
// waits up to `wait` for a byte; CANCELLED when a second signal ("go on
// now", as during the shutdown delay) or a failure came, its message
// ending with `waiting` (what it cut short); OK when nothing did.
absl::Status WokenWhile(absl::Duration wait, absl::string_view waiting) {
  const char why = AwaitWake(wait);
  if (IsSignal(why)) {
    return absl::CancelledError(
        absl::StrCat("signalled again (", ShutdownSignalName(g_signal), ") ", waiting));
  }
  if (why == kFailed) return absl::CancelledError("the worker cannot go on (see its log)");
  return absl::OkStatus();
}

// The agent as the shutdown's drain (DrainAfterDelay) sees it.
class AgentDrain final : public DrainingAgent {
 public:
  explicit AgentDrain(WorkerAgent& agent) : agent_(agent) {}
  absl::Status RequestDrain() override { return agent_.RequestDrain(); }
  absl::Status AwaitRegisteredAgain(absl::Duration timeout) override {
    return agent_.AwaitRegisteredAgain(timeout);
  }
  absl::Status AwaitDrained(absl::Duration timeout) override {
    return agent_.AwaitDrained(timeout);
  }
  absl::Status RecheckDrain() override { return agent_.RecheckDrain(); }

 private:
  WorkerAgent& agent_;
};

// Bounds the worker's stop (--stop-timeout-seconds): past `limit` the
// process exits without the rest, as the coordinator's StopBound does, with
// code 5 (4 once the device failed: the supervisor must still restart it
// with a fresh context). Once armed, a further SIGINT or SIGTERM exits with
// code 5 at once: the main thread stops meanwhile, and nothing else reads
// the wake pipe then (an operator's second Ctrl-C waited out the whole
// bound, up to an hour). A SIGHUP never does (kHungUp), and a kFailed byte
// (a registration cut off by Leave, a device failure) is no signal: the
// stop goes on.
//
// Armed only once the worker has deregistered (Leave returned), and
// signals that came before are read then: a double Ctrl-C, or a "signal
// again" the drain left unread (the job let the worker go between its
// polls), exited before the coordinator heard the worker leave, which then
// showed it LOST, not LEFT (loss alerts; a job it held recovered as from a
// crash).
class StopBound {
 public:
  // `signalled`: the stop began with a signal, so any SIGINT or SIGTERM read
  // here is a further one. Otherwise it began with a failure, and the first
  // signal only finds the worker leaving already (a supervisor's SIGTERM
  // after a device failure must not turn exit code 4 into 5); a second one
  // exits. `device_failed` outlives the bound.
  StopBound(absl::Duration limit, double stop_timeout_seconds, bool signalled,
            const std::atomic<bool>* device_failed)
      : signalled_(signalled),
        watchdog_(limit, [this, stop_timeout_seconds, device_failed] {
          const int code = device_failed->load() ? 4 : 5;
          ExitNow(code, absl::StrCat("the stop did not end within ", stop_timeout_seconds,
                                     " s (--stop-timeout-seconds) of deregistering; it still "
                                     "waited for ", waiting_.load(),
                                     "; exiting without it (exit code ", code, ")"));
        }) {}
  ~StopBound() {
    done_.store(true);
    if (signals_.joinable()) signals_.join();
  }  // then watchdog_'s: Done(), join
  StopBound(const StopBound&) = delete;
  StopBound& operator=(const StopBound&) = delete;

  // Starts acting on signals; call once, after Leave() returned.
  void ArmSignals() {
    signals_ = std::thread([this] {
      // Polled, so that the destructor can end the wait.
      while (!done_.load()) Take(AwaitWake(absl::Milliseconds(50)));
    });
  }

  // What the stop waits for now, for the exit's log line (a literal).
  void Waiting(const char* what) { waiting_.store(what); }

 private:
  // One byte from the wake pipe (0: none), on the signals thread.
  void Take(char why) {
    if (!IsSignal(why)) return;
    const char* name = why == kHungUp ? "SIGHUP" : ShutdownSignalName(g_signal);
    if (why == kHungUp || !signalled_) {
      signalled_ = true;  // a SIGINT or SIGTERM after it is a further one
      PT_LOG(WARNING) << "received " << name << " while stopping; still waiting for "
                      << waiting_.load() << " (a further SIGINT or SIGTERM exits now, exit "
                      << "code 5)";
      return;
    }
    ExitNow(5, absl::StrCat("received ", name, " again while stopping; it still waited for ",
                            waiting_.load(), "; exiting without it (exit code 5)"));
  }

  std::atomic<const char*> waiting_{"the deregistration"};
  std::atomic<bool> done_{false};
  bool signalled_;  // the signals thread's once it runs
  StopWatchdog watchdog_;
  std::thread signals_;
};

// The longest --node-name: the coordinator's bound on names (kMaxNameBytes,
// coordinator/registry/registration_limits.h, which worker/ may not include:
// scripts/check_layering.sh), a Kubernetes node name's. Checked here: the
// coordinator refuses a longer one at registration, and one past its 16 KiB
// request limit with RESOURCE_EXHAUSTED, which the agent retries (a full
// registry answers so too), never ready and never exiting.
constexpr size_t kMaxNodeNameBytes = 253;

// --mailbox-limit's default, written in whole GiB for --help.
static_assert(kMaxDataPlaneTensorBytes % (int64_t{1} << 30) == 0);

struct Flags {
  std::string coordinator = "127.0.0.1:7070";
  std::string listen = "127.0.0.1:0";
  std::string join_token;
  std::string join_token_file;
  std::string data_roots;  // comma-separated
  std::string checkpoint_root;
  std::string memory_limit;
  std::string memory_reserve;
  // The data plane's per-tensor limit: every tensor a plan may send fits.
  std::string mailbox_limit = absl::StrCat(kMaxDataPlaneTensorBytes >> 30, "G");
  std::string node_name;
  std::string tls_ca;
  std::string tls_cert, tls_key;  // the worker's client certificate (mutual TLS)
  // The data plane's mutual TLS (worker/transport/data_plane_tls.h).
  std::string data_tls_cert, data_tls_key, data_tls_ca, data_tls_server_name;
  std::string ports_file;
  std::string metrics = "127.0.0.1:0";
  int threads = 1;
  double recv_timeout_seconds = 60;
  double drain_timeout_seconds = 60;
  double shutdown_delay_seconds = 0;
  double stop_timeout_seconds = 20;
  std::string emulate_link;
  std::string test_hold_checkpoint;
  std::string device = "auto", gemm = "fp32", attention = "auto";
  bool allow_core_dumps = false;
};

int Run(const std::vector<std::string>& args) {
  Flags f;
  FlagSet flags("usage: pipetrain-worker --coordinator HOST:PORT [flags]");
  flags.String("coordinator", &f.coordinator,
               "coordinator gRPC address, or every highly available coordinator's, "
               "comma-separated (the leader is followed)");
  flags.String("listen", &f.listen,
               "data-plane listen address, advertised to peers as it is: not a wildcard such "
               "as 0.0.0.0 (port 0 = any)");
  flags.String("join-token", &f.join_token,
               "the coordinator's join token (visible in ps: prefer --join-token-file)");
  flags.String("join-token-file", &f.join_token_file, "read the join token from this file");
  flags.String("node-name", &f.node_name,
               "node name reported to the coordinator (at most 253 bytes)");
  flags.String("memory-limit", &f.memory_limit,
               "memory this worker may use, e.g. 8G (default: the least of physical memory and "
               "its cgroup's limit); the coordinator admits jobs against it");
  flags.String("memory-reserve", &f.memory_reserve,
               "memory kept out of what the coordinator plans with, e.g. 1G, for what its plans "
               "do not count (received tensors up to --mailbox-limit, the corpus, the "
               "allocator): a CPU worker is planned with its memory limit, or its share of the "
               "host's RAM, less this (default none)");
  flags.String("mailbox-limit", &f.mailbox_limit,
               "most bytes of received tensors waiting for their stage at once, e.g. 4G; "
               "a sender waits for room, and only a tensor larger than the whole limit "
               "is refused");
  flags.String("data-root", &f.data_roots,
               "comma-separated directories jobs may read data files from (spec.data.path); "
               "empty: only generated corpora");
  flags.String("checkpoint-root", &f.checkpoint_root,
               "directory jobs write their checkpoints under (spec.checkpoint.dir): the "
               "coordinator's --output-dir, shared; empty: jobs with checkpoints fail here");
  flags.String("tls-ca", &f.tls_ca, "PEM CA certificate: connect to the coordinator with TLS");
  flags.String("tls-cert", &f.tls_cert,
               "PEM client certificate for a coordinator that requires one (with --tls-key)");
  flags.String("tls-key", &f.tls_key, "PEM private key of --tls-cert");
  flags.String("data-tls-cert", &f.data_tls_cert,
               "PEM certificate of this worker's data plane (with --data-tls-key and "
               "--data-tls-ca): served on --listen and presented to peers; mutual TLS");
  flags.String("data-tls-key", &f.data_tls_key, "PEM private key of --data-tls-cert");
  flags.String("data-tls-ca", &f.data_tls_ca,
               "PEM CA the peers' and the coordinator's certificates must chain to; connections "
               "without such a certificate are refused");
  flags.String("data-tls-server-name", &f.data_tls_server_name,
               "the name peers' certificates are checked for (default: each peer's address "
               "host), so that workers may share one certificate of a fixed name");
  flags.String("ports-file", &f.ports_file, "write the bound ports here (JSON)");
  flags.String("metrics-address", &f.metrics, "HTTP /metrics, /healthz and /readyz (port 0 = any)");
  flags.Int("threads", &f.threads, "OpenBLAS threads");
  flags.String("device", &f.device,
               "auto (CUDA when built with it and a GPU is visible) | cpu | cuda | cuda:N");
  flags.String("gemm", &f.gemm, "GEMM mode on CUDA: fp32 | tf32 | bf16");
  flags.String("attention", &f.attention, kAttentionFlagHelp);
  flags.Double("recv-timeout-seconds", &f.recv_timeout_seconds,
               "how long a stage waits for a tensor before failing the job");
  flags.String("emulate-link", &f.emulate_link,
               "benchmarks: pace this worker's sends as over a link of BANDWIDTH,LATENCY "
               "(e.g. 1Gbit,0.5ms or 10Gbit,50us; bandwidth in Gbit or Mbit, or GB or MB for "
               "bytes), so loopback stands in for a network; "
               "empty: the real link");
  flags.Double("drain-timeout-seconds", &f.drain_timeout_seconds,
               "on SIGTERM or SIGINT the worker asks to be drained at once (no job is placed "
               "on it from then on); this is how long it then waits for a job with checkpoints "
               "to re-plan without it (no step redone) before leaving anyway (a further signal "
               "ends the wait); 0: no wait, "
               "leave at once (asked to be drained only with --shutdown-delay-seconds above 0, "
               "so that no job is placed on it during the delay)");
  flags.Double("shutdown-delay-seconds", &f.shutdown_delay_seconds,
               "on SIGTERM or SIGINT, report not ready (gRPC health NOT_SERVING, /readyz 503) "
               "and keep serving this long (drained already: no new job) before waiting for "
               "its job to let it go, so probes and peers see it first; a second signal ends "
               "the wait");
  flags.Double("stop-timeout-seconds", &f.stop_timeout_seconds,
               "on SIGTERM or SIGINT, after the drain: how long to wait for the job's stage to "
               "stop (and the rest of the stop) before exiting without it (exit code 5; once "
               "deregistered, a further SIGTERM or SIGINT exits so at once)");
  flags.Bool("allow-core-dumps", &f.allow_core_dumps, kAllowCoreDumpsHelp);
  flags.String("test-hold-checkpoint", &f.test_hold_checkpoint,
               "tests only: STEP:UNIT:MARKER holds the write of checkpoint STEP by the stage "
               "with UNIT forever, in the one worker that creates the file MARKER first "
               "(worker/checkpoint/checkpoint_hold.h); empty: none");
  flags.AddVersionFlag();
  absl::Status parsed = flags.Parse(args);
  if (flags.help_requested()) return std::printf("%s", flags.Usage().c_str()), 0;
  if (flags.version_requested()) {
    return std::printf("%s\n", VersionLine("pipetrain-worker").c_str()), 0;
  }
  // Before the join token is read; main() has re-executed already, if at
  // all (process_hardening.h).
  if (parsed.ok() && !f.allow_core_dumps) parsed = ForbidCoreDumpsAndTracing();
  if (parsed.ok() && f.threads < 1) parsed = absl::InvalidArgumentError("--threads must be >= 1");
  if (parsed.ok() && f.node_name.size() > kMaxNodeNameBytes) {
    parsed = absl::InvalidArgumentError(absl::StrCat(
        "--node-name is ", f.node_name.size(), " bytes, more than the ", kMaxNodeNameBytes,
        " the coordinator accepts (a Kubernetes node name's bound)"));
  }
  // Each address with a port gRPC will not wrap: registration carries the
  // join token.
  if (parsed.ok()) parsed = ParseCoordinatorAddresses("--coordinator", f.coordinator).status();
  if (parsed.ok()) parsed = ParseLinkModel("--emulate-link", f.emulate_link).status();
  // Checked before binding: gRPC and the HTTP library keep a port's low 16
  // bits, so 70000 bound 4464 while the flag's value was advertised.
  if (parsed.ok()) {
    absl::StatusOr<HostPort> listen = SplitHostPort(f.listen, "--listen");
    parsed = listen.status();
    // The address is advertised as it is: peers told to dial 0.0.0.0 reach
    // their own host, and two workers on one port would share an id.
    if (parsed.ok() && IsWildcardHost(listen->host)) {
      parsed = absl::InvalidArgumentError(absl::StrCat(
          "--listen ", f.listen,
          " is a wildcard address, which the worker would advertise to its peers as it is; "
          "give the address they reach it at (e.g. --listen=$(POD_IP):7100, or 127.0.0.1:0 "
          "on one host)"));
    }
  }
  absl::StatusOr<HostPort> metrics_address = SplitHostPort(f.metrics, "--metrics-address");
  if (parsed.ok()) parsed = metrics_address.status();
  // Advertised as it is too (pipetrain_worker_info, the dashboard's worker
  // variable, `pipetrain up`'s reading of the worker's metrics): every
  // worker on 0.0.0.0:9100 would be the one address.
  if (parsed.ok() && IsWildcardHost(metrics_address->host)) {
    parsed = absl::InvalidArgumentError(
        absl::StrCat("--metrics-address ", f.metrics,
                     " is a wildcard address, which the worker would advertise to the "
                     "coordinator as it is; give the address it is scraped at (e.g. "
                     "--metrics-address=$(POD_IP):9100, or 127.0.0.1:0 on one host)"));
  }
  if (parsed.ok() && !(f.drain_timeout_seconds >= 0 && f.drain_timeout_seconds <= 86400)) {
    parsed = absl::InvalidArgumentError("--drain-timeout-seconds must be in [0, 86400]");
  }
  if (parsed.ok() && !(f.stop_timeout_seconds >= 1 && f.stop_timeout_seconds <= 3600)) {
    parsed = absl::InvalidArgumentError("--stop-timeout-seconds must be in [1, 3600]");
  }
  if (parsed.ok() && !(f.shutdown_delay_seconds >= 0 && f.shutdown_delay_seconds <= 3600)) {
    parsed = absl::InvalidArgumentError("--shutdown-delay-seconds must be in [0, 3600]");
  }
  if (parsed.ok() && !(f.recv_timeout_seconds > 0)) {
    parsed = absl::InvalidArgumentError("--recv-timeout-seconds must be > 0");
  }
  // Before the first CUDA call (ValidateDeviceFlagsHere's, SelectBackend's):
  // stages may link over NCCL.
  if (f.device != "cpu") PreferEagerCudaModuleLoading();
  // auto is the CPU where no GPU is visible: a GPU-only mode is a usage
  // error (exit 2), as train-local and `up` say, not a startup failure.
  if (parsed.ok()) parsed = ValidateDeviceFlagsHere(f.device, f.gemm, f.attention);
  absl::StatusOr<CheckpointHold> checkpoint_hold =
      ParseCheckpointHold("test-hold-checkpoint", f.test_hold_checkpoint);
  if (parsed.ok()) parsed = checkpoint_hold.status();
  const std::vector<std::string> data_roots = absl::StrSplit(f.data_roots, ',', absl::SkipEmpty());
  if (parsed.ok()) parsed = CheckDataRoots("--data-root", data_roots);
  // Else jobs' checkpoints would fail at every interval, later and quietly.
  if (parsed.ok() && !f.checkpoint_root.empty()) {
    parsed = CheckWritableDirectory("--checkpoint-root", f.checkpoint_root);
  }
  if (parsed.ok()) {
    absl::StatusOr<std::string> token =
        SecretFromFlags("join-token", f.join_token, f.join_token_file);
    if (token.ok()) f.join_token = *std::move(token);
    parsed = token.status();
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (parsed.ok()) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> tls =
        ClientTlsCredentials(f.tls_ca, f.tls_cert, f.tls_key);
    parsed = tls.status();
    if (tls.ok()) credentials = *std::move(tls);
  }
  DataPlaneTls data_tls;
  if (parsed.ok()) {
    absl::StatusOr<DataPlaneTls> tls = DataPlaneTlsFromFlags(f.data_tls_cert, f.data_tls_key,
                                                             f.data_tls_ca, f.data_tls_server_name);
    parsed = tls.status();
    if (tls.ok()) data_tls = *std::move(tls);
  }
  int64_t memory_limit = 0;
  if (parsed.ok() && !f.memory_limit.empty()) {
    absl::StatusOr<int64_t> bytes = ParseByteSize("memory-limit", f.memory_limit);
    parsed = bytes.status();
    memory_limit = bytes.value_or(0);
  }
  int64_t memory_reserve = 0;
  if (parsed.ok() && !f.memory_reserve.empty()) {
    absl::StatusOr<int64_t> reserve = ParseByteSize("memory-reserve", f.memory_reserve);
    // Reported apart (DeviceInfo.memory_reserve_bytes): the coordinator
    // takes it off the worker's own limit or its share of the host's RAM.
    parsed = reserve.ok()
                 ? ReservedMemoryLimit(EffectiveMemoryLimit(ProcessMemoryLimit(), 0, memory_limit),
                                       *reserve)
                       .status()
                 : reserve.status();
    memory_reserve = reserve.value_or(0);
  }
  MailboxLimits mailbox_limits;
  if (parsed.ok()) {
    absl::StatusOr<int64_t> bytes = ParseByteSize("mailbox-limit", f.mailbox_limit);
    parsed = bytes.status();
    mailbox_limits.max_bytes = bytes.value_or(0);
  }
  if (!parsed.ok()) {
    std::fprintf(stderr, "pipetrain-worker: %s\n", std::string(parsed.message()).c_str());
    return 2;
  }
  SetBlasThreads(f.threads);  // warns when OpenBLAS caps the count
  // Reported at registration: the coordinator plans no tensor above it.
  SetReportedMailboxLimit(mailbox_limits.max_bytes);
  absl::StatusOr<SelectedBackend> backend = SelectBackend(f.device, f.gemm, f.attention);
  if (!backend.ok()) {
    PT_LOG(ERROR) << "--device " << f.device << ": " << backend.status();
    return 1;
  }
  PT_LOG(INFO) << "computing on " << backend->backend->Describe();

  // OpenBLAS starts threads before main(), so blocking signals here cannot
  // route them to one thread; a handler that writes to a pipe can.
  if (pipe(g_wake) != 0) return 1;
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  // A hang-up (or an operator's habit of SIGHUP for a reload) killed the
  // worker outright, without its drain; there is nothing to reload (TLS
  // files and tokens are read at start), so it leaves as on SIGTERM.
  std::signal(SIGHUP, OnSignal);

  Mailbox mailbox(mailbox_limits);
  SessionCredential session;  // set by the agent, checked by WorkerControl
  // Profiles get a backend of their own, as --device chose (the job thread
  // has the other one).
  WorkerControlService control(&session,
                               [&f] { return SelectBackend(f.device, f.gemm, f.attention); });
  WorkerMetrics metrics;
  metrics.AddTlsCertificates(TlsCertificateExpiries({{"tls-cert", f.tls_cert},
                                                     {"tls-ca", f.tls_ca},
                                                     {"data-tls-cert", f.data_tls_cert},
                                                     {"data-tls-ca", f.data_tls_ca}}));
  EnableGrpcHealthAndReflection();  // before the data plane's server is built
  auto server = DataPlaneServer::Start(f.listen, &mailbox, &control, metrics.rpc().Interceptors(),
                                       data_tls.server);
  if (!server.ok()) {
    PT_LOG(ERROR) << "data plane: " << server.status();
    return 1;
  }
  // Ready once registered with the coordinator, until draining.
  ServingHealth health({"pipetrain.v1.DataPlaneService", "pipetrain.v1.WorkerControlService"},
                       "not registered with the coordinator yet");
  health.Attach((*server)->grpc_server());
  HttpServer http({.on_response = metrics.http().Observer()});
  ServePrometheus(http, metrics.registry());
  ServeHealthEndpoints(http, &health);
  metrics.http().DeclareRoutes(http);
  auto bound = http.Start(metrics_address->host, metrics_address->port);
  if (!bound.ok()) {
    PT_LOG(ERROR) << "metrics server: " << bound.status();
    return 1;
  }
  if (!f.ports_file.empty()) {
    absl::Status written =
        WritePortsFile(f.ports_file, {{"data_port", (*server)->port()}, {"metrics_port", *bound}});
    if (!written.ok()) {
      PT_LOG(ERROR) << written;
      return 1;
    }
  }
  WorkerAgentOptions options;
  {
    // The data plane's own cost per message, for the planner's link model
    // (data_plane_probe.h). A worker that cannot reach itself still runs;
    // the planner then models its links without it.
    const std::string listen_host = (*server)->address().substr(0, (*server)->address().rfind(':'));
    const std::string self_host =
        listen_host == "[::]" ? "[::1]" : (listen_host == "0.0.0.0" ? "127.0.0.1" : listen_host);
    absl::StatusOr<DataPlaneCost> cost =
        ProbeDataPlane(server->get(), &mailbox, absl::StrCat(self_host, ":", (*server)->port()),
                       data_tls.channel, data_tls.server_name);
    if (cost.ok()) {
      PT_LOG(INFO) << "data plane on this host: " << DescribeDataPlaneCost(*cost);
      options.data_plane_overhead_seconds = cost->overhead_seconds;
      options.data_plane_bytes_per_second = cost->bytes_per_second;
    } else {
      PT_LOG(WARNING) << "could not time the data plane (" << cost.status()
                      << "); the planner models this worker's links without its cost";
    }
  }
  options.coordinator_address = f.coordinator;
  options.credentials = credentials;
  options.coordinator_tls = ClientTlsSetup{!f.tls_ca.empty(), !f.tls_cert.empty()};
  options.join_token = f.join_token;
  options.node_name = f.node_name;
  // The host as given (an IPv6 one keeps its brackets), with the bound port.
  options.metrics_address = absl::StrCat(f.metrics.substr(0, f.metrics.rfind(':')), ":", *bound);
  options.recv_timeout = absl::Seconds(f.recv_timeout_seconds);
  options.backend = backend->backend;
  options.session = &session;
  options.metrics = &metrics;  // outlives the agent (declared before it)
  options.memory_limit_bytes = memory_limit;
  options.memory_reserve_bytes = memory_reserve;
  options.data_roots = data_roots;
  options.checkpoint_root = f.checkpoint_root;
  options.checkpoint_hold = *checkpoint_hold;
  std::atomic<bool> device_failed{false};
  options.on_backend_failure = [&device_failed](const absl::Status& status) {
    PT_LOG(ERROR) << "the device failed: " << status
                  << "; this worker stops (exit code 4) so that it restarts with a fresh "
                     "device context";
    device_failed.store(true);
    Wake(kFailed);
  };
  // Set before Wake(kFailed) (the main thread reads it after waking).
  absl::Status registration_refused;
  AnnotatedMutex refused_mu;
  // Ready only while registered (SetReady is ignored once draining).
  options.on_registration_change = [&health](bool registered) {
    if (registered) {
      health.SetReady();
    } else {
      health.SetNotReady("registering again: the coordinator dropped this worker");
    }
  };
  options.on_registration_refused = [&](const absl::Status& status) {
    {
      AnnotatedMutexLock lock(&refused_mu);
      registration_refused = status;
    }
    Wake(kFailed);
  };
  const std::optional<LinkModel> emulated_link =
      ParseLinkModel("--emulate-link", f.emulate_link).value_or(std::nullopt);
  if (emulated_link.has_value()) {
    PT_LOG(INFO) << "emulating links of " << emulated_link->bandwidth_bytes_per_second / 1e9
                 << " GB/s and " << absl::FormatDuration(emulated_link->latency)
                 << " latency on this worker's sends";
    options.emulated_bandwidth_bytes_per_second = emulated_link->bandwidth_bytes_per_second;
    options.emulated_latency_seconds = absl::ToDoubleSeconds(emulated_link->latency);
  }
  options.data_plane_tls = data_tls.enabled();
  const absl::Duration recv_timeout = options.recv_timeout;
  auto make_transport = [&mailbox, emulated_link, data_tls, recv_timeout](
                            int stage, const std::vector<std::string>& peers,
                            const JobCredential& credential) {
    GrpcTransportOptions transport_options;
    WaitForHeldStreamsAsLongAsReceivers(recv_timeout, &transport_options);
    transport_options.credential = credential;
    transport_options.channel_credentials = data_tls.channel;
    transport_options.tls_server_name = data_tls.server_name;
    auto transport = std::unique_ptr<Transport>(
        new GrpcTransport(stage, peers, &mailbox, std::move(transport_options)));
    if (!emulated_link.has_value()) return transport;
    return std::unique_ptr<Transport>(new ShapedTransport(std::move(transport), *emulated_link));
  };
  WorkerAgent agent(options, server->get(), &mailbox, make_transport,
                    [&metrics](const IterationResult& r) { metrics.Observe(r); });
  // Start() blocks until registered; run it aside so a signal can stop it.
  absl::Status started;
  std::thread starter([&] {
    started = agent.Start();
    if (started.ok()) {
      health.SetReady();
    } else {
      Wake(kFailed);
    }
  });
  // The drain is asked for as soon as the worker is leaving, before the
  // delay below, so that no job is placed on it meanwhile (a READY worker
  // would be given a queued job, or taken as a spare, and then leave it):
  // also with --drain-timeout-seconds 0, which only waits for none.
  const bool drains = f.drain_timeout_seconds > 0;
  const bool asks_drain = drains || f.shutdown_delay_seconds > 0;
  std::optional<absl::Status> drain_asked;
  // Go on now: signalled again during the delay, or the worker cannot go
  // on (the drain is asked once then, not again).
  bool hurried = false;
  // A signal began the stop, or a failure (StopBound: a first signal after
  // a failure finds the worker leaving already).
  const bool signalled = IsSignal(AwaitWake(absl::InfiniteDuration()));
  if (signalled) {
    PT_LOG(INFO) << "received " << ShutdownSignalName(g_signal) << "; leaving"
                 << (g_signal == SIGHUP
                         ? " (SIGHUP reloads nothing: restart to read new TLS files or tokens)"
                         : "");
    health.Drain("draining: shutting down after a signal");
    if (asks_drain && !device_failed.load()) drain_asked = agent.RequestDrain();
    if (f.shutdown_delay_seconds > 0) {
      PT_LOG(INFO) << "not ready; serving on for " << f.shutdown_delay_seconds
                   << " s (--shutdown-delay-seconds; signal again to go on now)";
      hurried = AwaitWake(absl::Seconds(f.shutdown_delay_seconds)) != 0;  // any byte
    }
  } else {
    health.Drain("stopping: the worker cannot go on (see its log)");
    hurried = true;
  }
  if (!device_failed.load() && drains) {
    // Asked again after the delay while the answer passes (DrainAfterDelay:
    // a failover, a coordinator busy past the deadline, this worker's
    // session gone stale, then once the agent registered again), unless
    // hurried. A drain granted so spares a job the coordinator still holds
    // the steps since its last checkpoint. After a stale session those are
    // lost already (the restored job recovers from that checkpoint); the
    // wait lets the job stop waiting --restart-grace-seconds for this
    // worker (it registered again said drained), and the deregistration
    // carry a current session (LEFT, not LOST). The asks and waits come
    // out of the drain's timeout, which a supervisor's grace period is
    // sized to.
    AgentDrain draining(agent);
    DrainAfterDelayOptions drain_options;
    drain_options.timeout = absl::Seconds(f.drain_timeout_seconds);
    drain_options.recheck_timeout = WorkerAgent::kRecheckDrainTimeout;
    drain_options.await_wake = WokenWhile;
    const absl::Status drained = DrainAfterDelay(draining, drain_asked, hurried, drain_options);
    if (!drained.ok()) PT_LOG(WARNING) << "leaving without a drain: " << drained;
  }
  // A stage stuck in a long computation or a send to a stalled peer can
  // hold Stop() for minutes (it joins the stage's thread); past the bound
  // the process leaves without it. The bound covers the deregistration
  // before it too (Leave: a runner already stopping on the watch or
  // heartbeat thread is joined there), with that call's own deadline
  // added: at the 1 s minimum the process could otherwise exit before the
  // coordinator heard it leave. It covers the rest of the stop as well: a
  // first registration attempt still in flight (Leave does not cut it
  // short: up to the RPC deadline, then its settling and deregistration)
  // and a running profile's current pass (the server waits for it; minutes
  // with --threads 1 on a large unit), which is told to end first so that
  // it winds down meanwhile.
  int code = 0;
  {
    StopBound bound(absl::Seconds(f.stop_timeout_seconds) + kDeregisterTimeout,
                    f.stop_timeout_seconds, signalled, &device_failed);
    control.Stop();  // a profile running ends before its next unit
    agent.Leave();
    bound.Waiting("the job's stage to stop");
    bound.ArmSignals();  // deregistered: a further signal may cut the rest short
    agent.Stop();
    bound.Waiting("a registration attempt in flight");
    starter.join();
    {
      AnnotatedMutexLock lock(&refused_mu);
      // A later registration's refusal: as a refused first one.
      if (started.ok() && !registration_refused.ok()) started = registration_refused;
    }
    if (device_failed.load()) {
      code = 4;
    } else if (!started.ok() && started.code() != absl::StatusCode::kCancelled) {
      PT_LOG(ERROR) << "cannot join " << f.coordinator << ": " << started;
      code = started.code() == absl::StatusCode::kUnauthenticated ? 3 : 1;
    } else {
      PT_LOG(INFO) << "shutting down";
    }
    bound.Waiting("the servers to stop (a running profile's current pass)");
    http.Stop();
    health.Detach();
    (*server)->Shutdown();
  }
  return code;
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  // Started by `pipetrain up`: SIGTERM (leave, as on a drain) if it dies.
  pipetrain::ExitWithParentIfAsked();
  pipetrain::ConfigureBlasOrReexec(argv);
  pipetrain::RateLimitGrpcLogs();  // before gRPC can log (grpc_log.h)
  // Before any thread starts: large buffers reuse heap pages (malloc_tuning.h).
  pipetrain::TuneMallocForLargeBuffers();
  return pipetrain::Run(std::vector<std::string>(argv + 1, argv + argc));
}
