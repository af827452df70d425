#include "cli/cluster_commands.h"

#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/coordinator_client.h"
#include "cli/exit_codes.h"
#include "cli/flag_names.h"
#include "cli/interrupt.h"
#include "cli/job_progress.h"
#include "cli/job_report.h"
#include "cli/job_spec_file.h"
#include "cli/link_summary.h"
#include "cli/local_cluster.h"
#include "cli/output_paths.h"
#include "cli/progress.h"
#include "cli/stage_times.h"
#include "common/clock.h"
#include "common/connection_hint.h"
#include "common/coordinator_endpoints.h"
#include "common/enum_names.h"
#include "common/flag_set.h"
#include "common/job_state.h"
#include "common/link_model.h"
#include "common/rpc_status.h"
#include "common/secrets.h"
#include "common/subprocess.h"
#include "common/terminal_safe.h"
#include "common/tls_credentials.h"
#include "coordinator/jobs/plan_drawings.h"
#include "coordinator/planner/planner.h"
#include "google/protobuf/util/json_util.h"
#include "httplib.h"
#include "spec/job_spec.h"
#include "worker/agent/device_info.h"
#include "worker/data/token_file.h"
#include "worker/model/backend_select.h"

namespace pipetrain {
namespace {

// The steps whose losses a job keeps (docs/api.md, progress.lossHistory;
// the coordinator's kMaxLossHistory).
constexpr int64_t kLossHistorySteps = 10000;

// The deadline of `up`'s calls to the cluster it started.
constexpr absl::Duration kRpcTimeout = absl::Seconds(10);

// The signal that stopped the run (SIGINT, SIGTERM, SIGHUP, SIGPIPE for a
// closed stdout; cli/interrupt.h): the command exits 128 + it, as a shell
// reports a process that signal ended, so a script can tell Ctrl-C (130)
// from a supervisor's SIGTERM (143) and a reader gone (141).
int InterruptedExitCode() { return kExitSignalBase + InterruptSignal(); }

// What the last Connect() used, for Fail's hints: where the user token
// came from ("" when none was sent) and the --coordinator value.
std::string g_sent_token_from;
std::string g_coordinator;
ClientTlsSetup g_tls;

// The flags of every command that calls a coordinator. The address and CA
// may come from the environment (PIPETRAIN_COORDINATOR, PIPETRAIN_CA), the
// user token from PIPETRAIN_TOKEN (UserTokenFrom); flags override them.
struct Connection {
  std::string coordinator = "127.0.0.1:7070";
  std::string tls_ca, tls_cert, tls_key;
  std::string token_file;
  absl::Duration timeout = absl::Seconds(10);
  void Bind(FlagSet& flags) {
    flags.String("coordinator", &coordinator,
                 "coordinator gRPC address, or a comma-separated list of highly available "
                 "coordinators (the leader is found)");
    flags.FromEnv("coordinator", "PIPETRAIN_COORDINATOR");
    flags.String("tls-ca", &tls_ca, "PEM CA certificate for a TLS coordinator");
    flags.FromEnv("tls-ca", "PIPETRAIN_CA");
    flags.String("tls-cert", &tls_cert,
                 "PEM client certificate for a coordinator that requires one (with --tls-key)");
    flags.String("tls-key", &tls_key, "PEM private key of --tls-cert");
    // Mutual TLS needs all three on every command: from the environment
    // as the CA is.
    flags.FromEnv("tls-cert", "PIPETRAIN_TLS_CERT");
    flags.FromEnv("tls-key", "PIPETRAIN_TLS_KEY");
    flags.String(
        "token-file", &token_file,
        "file holding the coordinator's user token; without it, $PIPETRAIN_TOKEN is the token");
    flags.Duration("timeout", &timeout,
                   "deadline of each call to the coordinator, e.g. 500ms, 30s, 2m");
  }
  // Checks the parsed flags; `flags` tells where each value came from.
  absl::Status Check(const FlagSet& flags) {
    // --tls-ca= turns TLS off again (a flag wins over its variable): a
    // client certificate and key from $PIPETRAIN_TLS_CERT/_KEY then have no
    // channel to go on, and are dropped rather than refused as if typed.
    if (tls_ca.empty() && flags.FromEnvironment("tls-cert") && flags.FromEnvironment("tls-key")) {
      tls_cert.clear();
      tls_key.clear();
    }
    if (timeout <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("--timeout must be > 0");
    }
    // gRPC keeps deadlines in whole milliseconds, rounded up: a shorter one
    // would not be the deadline the user asked for.
    if (timeout < absl::Milliseconds(1)) {
      return absl::InvalidArgumentError(
          "--timeout must be at least 1ms (gRPC deadlines have millisecond resolution)");
    }
    // The flag combinations ClientTlsCredentials would refuse, refused here
    // as the command line's mistakes (exit 2) before any file is read.
    if (tls_cert.empty() != tls_key.empty()) {
      return absl::InvalidArgumentError("--tls-cert and --tls-key must be given together");
    }
    if (!tls_cert.empty() && tls_ca.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls-cert and --tls-key need --tls-ca (TLS)",
                       flags.FromEnvironment("tls-cert") || flags.FromEnvironment("tls-key")
                           ? " (one of them came from $PIPETRAIN_TLS_CERT or $PIPETRAIN_TLS_KEY)"
                           : ""));
    }
    // "a,,b" or "" is the command line's mistake (exit 2), not an address
    // to look up.
    return ParseCoordinatorAddresses("--coordinator", coordinator).status();
  }
  // A stub that sends the user token on every call. The token and the TLS
  // files are read by the first call that succeeds, and reused by every
  // later one (submit's retries, Follow's reconnects): read again, a
  // process substitution (--token-file <(...)) is empty, and a file
  // removed meanwhile turned a submit whose outcome was unknown into a
  // local error, hiding that the job may exist (run again, it made a
  // second one).
  absl::StatusOr<std::unique_ptr<v1::CoordinatorService::Stub>> Connect() {
    if (credentials_ == nullptr) {
      absl::StatusOr<std::string> token = UserTokenFrom(token_file);
      if (!token.ok()) return token.status();
      absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
          ClientTlsCredentials(tls_ca, tls_cert, tls_key);
      if (!credentials.ok()) return credentials.status();
      token_ = *std::move(token);
      credentials_ = *std::move(credentials);
    }
    g_sent_token_from = !token_file.empty() ? "--token-file " + token_file
                        : !token_.empty()   ? std::string("$PIPETRAIN_TOKEN")
                                            : std::string();
    g_coordinator = coordinator;
    g_tls = ClientTlsSetup{!tls_ca.empty(), !tls_cert.empty(), /*ca_from_env=*/true};
    // With several coordinators, finding the leader is bounded by --timeout
    // too.
    return FindCoordinator("--coordinator", coordinator, credentials_, token_, timeout);
  }

 private:
  // What the first Connect read (null credentials: nothing read yet).
  std::string token_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
};

// Prints the error with its code; the exit code says the code too (exit_codes.h).
int Fail(const std::string& command, const absl::Status& status) {
  // The message is the coordinator's, and may quote what others sent it.
  std::string text = TerminalSafe(status.ToString());
  // What the coordinator cannot know: which of the CLI's sources the
  // rejected token came from (an old $PIPETRAIN_TOKEN is easy to forget).
  if (status.code() == absl::StatusCode::kUnauthenticated && !g_sent_token_from.empty()) {
    absl::StrAppend(&text, " [the token sent was ", g_sent_token_from, "'s]");
  }
  // gRPC's words for a connection that failed, in terms of the flags.
  if (status.code() == absl::StatusCode::kUnavailable) {
    const std::string hint = CoordinatorConnectionHint(status.message(), g_tls);
    // Not for `up`, which has no --coordinator: it started its own.
    if (!hint.empty() && !g_coordinator.empty())
      absl::StrAppend(&text, " [--coordinator ", TerminalSafe(g_coordinator), ": ", hint, "]");
  }
  std::fprintf(stderr, "pipetrain %s: %s\n", command.c_str(), text.c_str());
  return ExitCodeFor(status.code());
}

// Parses flags plus `positional` required words (e.g. a job id). Returns -1
// to continue, else the exit code.
// `connection`, when given, is checked too.
int ParseArgs(FlagSet& flags, const std::vector<std::string>& args, int positional,
              std::vector<std::string>* words, const std::string& command,
              Connection* connection = nullptr) {
  // The words may stand before, between or after the flags. "-h" is the
  // help flag, not an id or a file: `pipetrain cancel -h` must print the
  // usage, not cancel a job named "-h".
  absl::Status parsed = flags.Parse(args, words);
  if (flags.help_requested()) return std::printf("%s", flags.Usage().c_str()), 0;
  if (parsed.ok() && static_cast<int>(words->size()) < positional) {
    parsed = absl::InvalidArgumentError("missing argument (see --help)");
  }
  if (parsed.ok() && static_cast<int>(words->size()) > positional) {
    parsed = absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", (*words)[positional], "'"));
  }
  // An empty id ("$JOB" unset) is the command line's mistake, not a name to
  // look up on the coordinator (which would answer NOT_FOUND, exit 69).
  for (int i = 0; parsed.ok() && i < positional; ++i) {
    if ((*words)[i].empty()) parsed = absl::InvalidArgumentError("the argument is empty");
  }
  if (parsed.ok() && connection != nullptr) parsed = connection->Check(flags);
  if (!parsed.ok()) {
    std::fprintf(stderr, "pipetrain %s: %s\n", command.c_str(),
                 std::string(parsed.message()).c_str());
    return kExitUsage;
  }
  return -1;
}

// proto3 JSON (camelCase names). `all_fields`: zeros, empty lists and
// default enums too, so that scripts see every field (--json).
std::string ToJson(const google::protobuf::Message& message, bool all_fields = false) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = all_fields;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

// `{"KEY": [item, ...]}`, each item as ToJson(item, true).
template <typename Message>
std::string ListJson(const std::string& key, const std::vector<Message>& items) {
  std::string out = absl::StrCat("{\"", key, "\": [");
  for (size_t i = 0; i < items.size(); ++i) {
    std::string item = ToJson(items[i], true);
    while (!item.empty() && item.back() == '\n') item.pop_back();
    absl::StrAppend(&out, i == 0 ? "" : ", ", item);
  }
  absl::StrAppend(&out, "]}\n");
  return out;
}


// The FlagSet of a command's options, described for completion.
template <typename Options>
std::vector<FlagSet::Info> Describe(FlagSet (*make)(Options&)) {
  Options options;
  return make(options).Describe();
}

// ---- up --------------------------------------------------------------------

// `path` with symbolic links resolved (itself when it does not exist: the
// workers then say so).
std::string RealPathOf(const std::string& path) {
  char buffer[PATH_MAX];
  return realpath(path.c_str(), buffer) != nullptr ? buffer : path;
}

// The directory holding the file `path`, as `up`'s data root.
std::string DataRootOf(const std::string& path) {
  const std::string real = RealPathOf(path);
  const size_t slash = real.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : real.substr(0, slash);
}

struct UpOptions {
  int workers = 4;
  int data_parallel = 1;
  int tensor_parallel = 1;
  int tensor_partitions = 1;
  std::string tensor_compression = "none";
  std::string tensor_mode = "1d";
  // What help shows as the default: the spec's when --tensor-partitions is
  // 0; the spec's own default (0 for other counts) applies unless given.
  int tensor_tune_steps = 2;
  bool tensor_tune_steps_given = false;
  bool synthetic_bytes_given = false;  // on the command line
  // Per user: a shared /tmp/pipetrain-up would be refused to all but the
  // first user (ClusterDir), and one user's runs would share it.
  std::string out = absl::StrCat("/tmp/pipetrain-up-", geteuid());
  bool keep_running = false;
  v1::JobSpec spec;
  int layers = 2, heads = 4, d_model = 128, seq_len = 64, batch = 16, micro = 4;
  int64_t steps = 800, synthetic_bytes = 1'000'000;
  float lr = 1e-3f;
  // spec.training's clipping and schedule (train-local's flags).
  float grad_clip = 0, min_lr = 0;
  std::string lr_schedule = "constant";
  int64_t warmup_steps = 0;
  uint64_t seed = 1;
  std::string data, solver = "uniform", schedule = "1f1b";
  std::string forward_codec = "none", backward_codec = "none";
  std::string dp_codec = "none", dp_stages;
  bool error_feedback = false, epilogue_only = false;
  int eval_interval = 100;
  int checkpoint_interval = 100;
  std::string emulate_link;
  std::string worker_device = "auto", worker_gemm = "fp32", worker_attention = "auto";
  std::string loss_log;
};

void BindUp(FlagSet& f, UpOptions& o) {
  f.Int("workers", &o.workers, "worker processes to start");
  f.CountOrAuto("data-parallel", &o.data_parallel,
                "replicas of the pipeline (spec.parallelism.data): --workers / (D x T) stages "
                "each, each replica training on --micro-batches / D of every step's "
                "micro-batches; auto: the planner tries every D dividing --workers / T and "
                "--micro-batches on the job's measured profile and keeps the fastest simulated "
                "step (T = --tensor-parallel)");
  f.CountOrAuto("tensor-parallel", &o.tensor_parallel,
                "workers per stage (spec.parallelism.tensor, 1-D Megatron split of every unit): "
                "--workers / (D x T) stages; T divides --heads, --d-model and the vocabulary; "
                "auto (with --data-parallel auto): the planner tries every such T dividing "
                "--workers as well");
  f.Int("tensor-partitions", &o.tensor_partitions,
        "with --tensor-parallel: AccTFM's partitions per micro-batch (1, 2 or 4), each "
        "partition's all-reduce overlapping the next one's compute; 0: each layer's own, "
        "from AccTFM's Alg. 1");
  f.String("tensor-compression", &o.tensor_compression,
           "with --tensor-parallel: AccTFM's hybrid compression of the tensor-parallel "
           "all-reduces (spec.parallelism.tensor_compression), e.g. "
           "\"token_topk:keep=0.5+piecewise:bits=3\"; lossy; \"none\" (default) is exact");
  f.Int("tensor-partitions-tune-steps", &o.tensor_tune_steps,
        "with --tensor-partitions 0: steps each of Alg. 1's counts and uniform 1, 2 and 4 run "
        "before each stage keeps the fastest measured; 0 keeps Alg. 1's");
  f.String("tensor-mode", &o.tensor_mode,
           "with --tensor-parallel: 1d (Megatron's split, the default) or 3d (T = p^3 workers "
           "per stage as a p x p x p cube of 3-D linear layers and LayerNorms; "
           "spec.parallelism.tensor_mode)");
  f.String("out", &o.out,
           "directory for logs, tokens, ports files, the timelines (SVG) and output/, where the "
           "jobs' weights and checkpoints go; made mode 0700 if missing (missing parents too, "
           "mode 0755, as mkdir -p), refused if another user owns it or others may write in it, "
           "and locked: one `up` at a time");
  f.Bool("keep-running", &o.keep_running, "leave the cluster up after the job (Ctrl-C ends it)");
  f.Int("layers", &o.layers, "transformer blocks");
  f.Int("heads", &o.heads, "attention heads");
  f.Int("d-model", &o.d_model, "embedding width");
  f.Int("seq-len", &o.seq_len, "tokens per sequence");
  f.Int("batch", &o.batch, "sequences per step");
  f.Int("micro-batches", &o.micro, "micro-batches per step");
  f.Int64("steps", &o.steps, "optimizer steps");
  f.Int("eval-interval", &o.eval_interval, "validate every N steps and at the end; 0 = never");
  f.Int("checkpoint-interval", &o.checkpoint_interval,
        "checkpoint every N steps under --out/output/checkpoints, so the job survives a worker's "
        "loss (kill one to see it recover); 0 = never");
  f.String("emulate-link", &o.emulate_link,
           "pace the workers' sends as over links of BANDWIDTH,LATENCY, e.g. 1Gbit,0.5ms "
           "(bandwidth in Gbit or Mbit, or GB or MB for bytes; loopback standing in for a "
           "network); empty: loopback as it is");
  f.Float("lr", &o.lr, "AdamW learning rate");
  f.Float("grad-clip", &o.grad_clip,
          "clip gradients to this global L2 norm over every stage and replica; 0 = off");
  f.String(
      "lr-schedule", &o.lr_schedule,
      "constant | cosine (from --lr after warm-up towards --min-lr, which the step after the last "
      "would reach)");
  f.Int64("warmup-steps", &o.warmup_steps, "linear learning-rate warm-up steps");
  f.Float("min-lr", &o.min_lr, "the cosine schedule's floor");
  f.Uint64("seed", &o.seed, "seed for initialisation and data order");
  f.String("data", &o.data,
           "training corpus, byte-level text (not a token file); empty = generated English "
           "text");
  f.Int64("synthetic-bytes", &o.synthetic_bytes, "size of the generated corpus");
  f.String("solver", &o.solver, "uniform | pipedream | bipartition | auto");
  f.String("schedule", &o.schedule, "1f1b | gpipe");
  f.String("forward-codec", &o.forward_codec,
           "codec for activations, e.g. token_topk:keep=0.5+piecewise:bits=3 (none = raw)");
  f.String("backward-codec", &o.backward_codec,
           "codec for activation gradients, e.g. powersgd:rank=4 (none = raw)");
  f.Bool("error-feedback", &o.error_feedback, "lazy error propagation on the backward codec");
  f.String("dp-codec", &o.dp_codec,
           "codec of the data-parallel all-reduce (with --data-parallel): none | powersgd:rank=R "
           "| a quantizer (fp16, bf16, linear:bits=N, piecewise:bits=N), with error feedback "
           "(Optimus-CC's selective stage compression)");
  f.String("dp-stages", &o.dp_stages,
           "stages whose all-reduce --dp-codec compresses: comma-separated, \"all\", or empty "
           "for the planner's choice (the stages on the simulated critical path)");
  f.Bool("epilogue-only", &o.epilogue_only,
         "compress only the cool-down's backward sends (under --schedule gpipe every backward "
         "send is one)");
  f.String("worker-device", &o.worker_device,
           "the workers' --device: auto (CUDA when built with it and a GPU is visible) | cpu | "
           "cuda | cuda:N | cuda:each (worker k on GPU k mod the visible GPUs, so that workers "
           "on GPUs of their own exchange tensors over NCCL)");
  f.String("worker-gemm", &o.worker_gemm, "the workers' --gemm on CUDA: fp32 | tf32 | bf16");
  f.String("worker-attention", &o.worker_attention,
           "the workers' --attention on CUDA: auto (gemm) | reference | gemm | flash");
  f.String("loss-log", &o.loss_log,
           "write every step's loss here, one per line at full float precision");
}

// The metrics pages of the workers that can be read, and which cannot
// (e.g. killed during the run): summaries of the first say so, not hide it.
struct WorkerPages {
  std::vector<std::string> pages;
  std::vector<std::string> unread;  // "worker-3 (exited)", "worker-1" (as their logs)
  // "" when every worker was read, else " (3 of 4 workers; not read: ...)".
  std::string Caveat(int workers) const {
    if (unread.empty()) return "";
    return absl::StrCat(" (", pages.size(), " of ", workers,
                        " workers; not read: ", absl::StrJoin(unread, ", "), ")");
  }
};

WorkerPages WorkerMetricsPages(LocalCluster& cluster) {
  WorkerPages out;
  for (int i = 0; i < cluster.num_workers(); ++i) {
    const bool exited = cluster.worker(i).Poll().has_value();
    absl::StatusOr<int> port = cluster.worker_metrics_port(i);
    if (port.ok() && !exited) {
      httplib::Client client("127.0.0.1", *port);
      auto response = client.Get("/metrics");
      if (response && response->status == 200) {
        out.pages.push_back(response->body);
        continue;
      }
    }
    out.unread.push_back(absl::StrCat("worker-", i, exited ? " (exited)" : ""));  // its log name
  }
  return out;
}

// From the workers' metrics: the partition counts they kept after measuring
// (tensor_partitions 0 with tuning), when they report any, and how much of
// the tensor-parallel all-reduce time their compute hid.
void PrintTensorParallelSummary(LocalCluster& cluster) {
  const WorkerPages read = WorkerMetricsPages(cluster);
  const std::vector<std::string>& pages = read.pages;
  if (pages.empty()) return;
  absl::StatusOr<std::string> tuned = FormatTunedPartitions(pages);
  if (!tuned.ok()) {
    std::fprintf(stderr, "tuned partitions: %s\n", std::string(tuned.status().message()).c_str());
    return;
  }
  const std::string caveat = read.Caveat(cluster.num_workers());
  if (!tuned->empty()) {
    std::printf("tensor partitions kept by measurement: %s%s\n", tuned->c_str(), caveat.c_str());
  }
  absl::StatusOr<std::string> overlap = FormatTensorParallelOverlap(pages);
  if (overlap.ok() && !overlap->empty()) {
    std::printf("tensor-parallel %s (summed over the workers%s)\n", overlap->c_str(),
                caveat.c_str());
  }
}

void PrintLinkSummary(LocalCluster& cluster) {
  const WorkerPages read = WorkerMetricsPages(cluster);
  if (read.pages.empty()) {
    std::fprintf(stderr, "link summary: no worker's metrics could be read\n");
    return;
  }
  absl::StatusOr<std::map<std::string, KindTotals>> totals = SumLinkMetrics(read.pages);
  if (!totals.ok()) {
    std::fprintf(stderr, "link summary: %s\n", std::string(totals.status().message()).c_str());
    return;
  }
  const std::string who = read.unread.empty() ? std::string("all workers")
                                              : absl::StrCat("the workers still up",
                                                             read.Caveat(cluster.num_workers()));
  const std::string table = FormatLinkSummary(*totals);
  if (table.empty()) {  // one worker, or a job that never got to send
    std::printf("links: no tensor sent by %s\n", who.c_str());
    return;
  }
  std::printf("links (bytes sent by %s):\n%s", who.c_str(), table.c_str());
}

v1::JobSpec UpSpec(const UpOptions& o) {
  v1::JobSpec spec;
  spec.set_name("pipetrain-up");
  spec.mutable_model()->set_n_layer(o.layers);
  spec.mutable_model()->set_n_head(o.heads);
  spec.mutable_model()->set_d_model(o.d_model);
  auto* t = spec.mutable_training();
  t->set_seq_len(o.seq_len);
  t->set_batch_size(o.batch);
  t->set_micro_batches(o.micro);
  t->set_steps(o.steps);
  t->set_lr(o.lr);
  t->set_grad_clip(o.grad_clip);
  t->set_lr_schedule(o.lr_schedule);
  t->set_warmup_steps(o.warmup_steps);
  t->set_min_lr(o.min_lr);
  t->set_seed(o.seed);
  t->set_eval_interval(o.eval_interval);
  // The real path (the workers' --data-root is its directory), and text
  // whatever that path's name says: up trains byte-level text only, and
  // with format auto a link named corpus.txt to a file named x.bin was read
  // as uint16 tokens by every worker (train-local read it as text).
  if (!o.data.empty()) {
    spec.mutable_data()->set_path(RealPathOf(o.data));
    spec.mutable_data()->set_format("text");
  }
  if (o.data.empty()) spec.mutable_data()->set_synthetic_bytes(o.synthetic_bytes);
  // Checked by RunUp: D x T divides the workers (ResolveJobSpec checks the
  // rest).
  const int replicas = std::max(1, o.data_parallel);
  const int tensor = std::max(1, o.tensor_parallel);
  spec.mutable_parallelism()->set_data(o.data_parallel);
  if (o.data_parallel == kDataParallelAuto) {
    spec.mutable_parallelism()->set_workers(o.workers);  // the planner sets the stages
  } else {
    spec.mutable_parallelism()->set_stages(o.workers / (replicas * tensor));
  }
  spec.mutable_parallelism()->set_tensor(o.tensor_parallel);
  spec.mutable_parallelism()->set_tensor_partitions(o.tensor_partitions);
  spec.mutable_parallelism()->set_tensor_compression(o.tensor_compression);
  spec.mutable_parallelism()->set_tensor_mode(o.tensor_mode);
  if (o.tensor_tune_steps_given) {
    spec.mutable_parallelism()->set_tensor_partitions_tune_steps(o.tensor_tune_steps);
  }
  spec.mutable_parallelism()->set_solver(o.solver);
  spec.mutable_parallelism()->set_schedule(o.schedule);
  // Under the coordinator's --output-dir, which `up` sets to --out/output.
  spec.mutable_output()->set_weights_path("weights.safetensors");
  v1::CompressionSpec* c = spec.mutable_compression();
  c->set_forward(o.forward_codec);
  c->set_backward(o.backward_codec);
  c->set_error_feedback(o.error_feedback);
  c->set_epilogue_only(o.epilogue_only);
  c->mutable_data_parallel()->set_codec(o.dp_codec);
  if (o.dp_stages == "all") {
    for (int s = 0; s < o.workers / (replicas * tensor); ++s) {
      c->mutable_data_parallel()->add_stages(s);
    }
  } else {
    // Checked by RunUp (DpStagesValid); ResolveJobSpec checks the range.
    for (absl::string_view part : absl::StrSplit(o.dp_stages, ',', absl::SkipEmpty())) {
      int stage = 0;
      if (absl::SimpleAtoi(part, &stage)) c->mutable_data_parallel()->add_stages(stage);
    }
  }
  spec.mutable_checkpoint()->set_interval_steps(o.checkpoint_interval);
  return spec;
}

// The spec fields UpSpec sets, by the flags that set them, for the spec
// checks' messages (NameFlags). The stages are --workers / (D x T).
constexpr std::pair<absl::string_view, absl::string_view> kUpFlagNames[] = {
    {"spec.model.n_layer", "--layers"},
    {"n_layer", "--layers"},  // "2 * n_layer + 2" units
    {"spec.model.n_head", "--heads"},
    {"spec.model.d_model", "--d-model"},
    {"spec.training.seq_len", "--seq-len"},
    {"spec.training.batch_size", "--batch"},
    {"spec.training.micro_batches", "--micro-batches"},
    {"spec.training.steps", "--steps"},
    {"spec.training.lr", "--lr"},
    {"spec.training.grad_clip", "--grad-clip"},
    {"spec.training.lr_schedule", "--lr-schedule"},
    {"spec.training.warmup_steps", "--warmup-steps"},
    {"spec.training.min_lr", "--min-lr"},
    {"spec.training.seed", "--seed"},
    {"spec.training.eval_interval", "--eval-interval"},
    {"spec.data.path", "--data"},
    {"spec.data.synthetic_bytes", "--synthetic-bytes"},
    {"spec.parallelism.data", "--data-parallel"},
    {"spec.parallelism.workers", "--workers"},
    {"spec.parallelism.stages", "--workers / (--data-parallel x --tensor-parallel)"},
    {"spec.parallelism.tensor", "--tensor-parallel"},
    {"spec.parallelism.tensor_partitions", "--tensor-partitions"},
    {"spec.parallelism.tensor_compression", "--tensor-compression"},
    {"spec.parallelism.tensor_mode", "--tensor-mode"},
    {"spec.parallelism.tensor_partitions_tune_steps", "--tensor-partitions-tune-steps"},
    {"spec.parallelism.solver", "--solver"},
    {"spec.parallelism.schedule", "--schedule"},
    {"spec.compression.forward", "--forward-codec"},
    {"spec.compression.backward", "--backward-codec"},
    {"spec.compression.error_feedback", "--error-feedback"},
    {"spec.compression.epilogue_only", "--epilogue-only"},
    {"spec.compression.data_parallel.codec", "--dp-codec"},
    {"spec.compression.data_parallel.stages", "--dp-stages"},
    {"spec.checkpoint.interval_steps", "--checkpoint-interval"},
};

// Whether stdout is a pipe or socket whose reader has gone (`up | true`).
// Progress goes to stderr and stdout is written only at the job's end, so
// SIGPIPE alone would say so only then: Follow asks at every poll.
// Only a pipe or socket: a terminal also says POLLHUP once it has hung
// up, and a run the user detached from it (`disown`) must go on (a
// terminal's hangup that should stop the run sends SIGHUP).
bool StdoutReaderGone() {
  struct stat st;
  if (fstat(STDOUT_FILENO, &st) != 0 || !(S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) {
    return false;
  }
  pollfd out{STDOUT_FILENO, 0, 0};
  return poll(&out, 1, 0) == 1 && (out.revents & (POLLERR | POLLHUP)) != 0;
}

// How long Follow looks for a coordinator it lost (UNAVAILABLE or no
// answer: a restart, a failover to another leader) before it gives up:
// a restart with state, or a lease and a takeover, fit well inside.
constexpr absl::Duration kRefindWindow = absl::Seconds(60);

// Whether `job` has yet to start on its first plan, for which it waits
// until every worker it asked for is READY (the elastic minimum applies
// only to recoveries): QUEUED, PROFILING or PLANNING with no plan before.
// A re-plan later (a drain's, a join's) plans again with plan_version > 0.
bool AwaitsFirstPlan(const v1::Job& job) {
  const v1::JobState state = job.state();
  return job.plan_version() == 0 &&
         (state == v1::JOB_STATE_QUEUED || state == v1::JOB_STATE_PROFILING ||
          state == v1::JOB_STATE_PLANNING);
}

// Where Follow gets a stub again after losing the coordinator: the
// command's --coordinator list, its leader found again (FindCoordinator).
using Reconnect = std::function<absl::StatusOr<std::unique_ptr<v1::CoordinatorService::Stub>>()>;

// Polls the job until it ends (or Ctrl-C, or a closed stdout: both
// interrupt, cli/interrupt.h), drawing progress. Returns the last Job. `timing`, when
// given, gets the step sightings of the job's last plan. With `reconnect`,
// a coordinator that stops answering is looked for again for up to
// kRefindWindow (the job goes on without it; a new leader or a restarted
// coordinator has it back), and `*reconnected` gets the stub found last.
// With `watch` (up: the processes it started), each poll asks it for news
// to show and whether to go on: a non-OK status ends the following with
// it (`polled`: the job as the poll found it; null after a failed call,
// which it may explain).
using LocalWatch =
    std::function<absl::Status(const v1::Job* polled, std::vector<std::string>* news)>;
absl::StatusOr<v1::Job> Follow(v1::CoordinatorService::Stub& stub, const std::string& id,
                               absl::Duration timeout, StepTiming* timing = nullptr,
                               const Reconnect& reconnect = nullptr,
                               std::unique_ptr<v1::CoordinatorService::Stub>* reconnected = nullptr,
                               const LocalWatch& watch = nullptr) {
  ProgressReporter progress(stderr, isatty(STDERR_FILENO));
  v1::Job job;
  int64_t timed_step = -1;
  JobProgressView view;
  JobNewsView news_view;
  v1::CoordinatorService::Stub* current = &stub;
  std::unique_ptr<v1::CoordinatorService::Stub> found;
  std::optional<absl::Time> lost_since;
  while (!Interrupted()) {
    if (StdoutReaderGone()) {
      Interrupt(SIGPIPE);
      break;
    }
    v1::GetJobRequest request;
    request.set_id(id);
    const std::unique_ptr<grpc::ClientContext> context = WithDeadline(timeout);
    grpc::Status s;
    {
      // Ctrl-C ends a call waiting on a coordinator that answers nothing
      // at once, not after --timeout.
      const CancelOnInterrupt cancel(context.get());
      s = current->GetJob(context.get(), request, &job);
    }
    if (Interrupted()) break;
    if (watch) {
      std::vector<std::string> news;
      const absl::Status going_on = watch(s.ok() ? &job : nullptr, &news);
      for (const std::string& line : news) progress.Message(TerminalSafe(line));
      if (!going_on.ok()) {
        progress.Finish();
        return going_on;
      }
    }
    if (!s.ok()) {
      // CANCELLED: a coordinator shutting down (SIGTERM: a restart, a
      // rolling update) ends the calls it is serving so (Ctrl-C's own
      // cancel ended the loop above).
      const bool lost = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                        s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                        s.error_code() == grpc::StatusCode::CANCELLED;
      if (!lost || reconnect == nullptr) return ToAbsl(s);
      if (!lost_since.has_value()) {
        lost_since = MonotonicClock()->Now();
        progress.Message(absl::StrCat("lost the coordinator (", TerminalSafe(s.error_message()),
                                      "); looking for it for up to ",
                                      absl::FormatDuration(kRefindWindow)));
      } else if (MonotonicClock()->Now() - *lost_since > kRefindWindow) {
        return ToAbsl(s);
      }
      absl::StatusOr<std::unique_ptr<v1::CoordinatorService::Stub>> again = reconnect();
      if (again.ok()) {
        found = *std::move(again);
        current = found.get();
      }
      absl::SleepFor(absl::Milliseconds(200));  // polls a remote state, as below
      continue;
    }
    if (lost_since.has_value()) {
      progress.Message("found the coordinator again");
      lost_since.reset();
    }
    // Why the job waits before its first plan, recoveries and re-plans:
    // each on a line of its own.
    const JobNewsView::News news = news_view.Poll(job);
    for (const std::string& line : news.lines) progress.Message(line);
    // The step time compared with the prediction is the new plan's.
    if (news.replanned && timing != nullptr) *timing = StepTiming();
    // A job started from a checkpoint begins at its step, with no loss of
    // its own yet ("loss 0.0000, 0 tok/s"): progress shows the steps run
    // since the first poll, and their rate.
    const absl::Time now = MonotonicClock()->Now();  // differences only
    if (std::optional<ProgressSample> sample = view.Poll(job, now); sample.has_value()) {
      // A line for an evaluation alone repeats its step: not a step time.
      if (timing != nullptr && job.state() == v1::JOB_STATE_RUNNING && sample->step != timed_step) {
        timing->Saw(sample->step, sample->total_steps, now);
        timed_step = sample->step;
      }
      progress.Update(*sample);
    }
    if (IsTerminal(job.state())) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  progress.Finish();
  if (reconnected != nullptr && found != nullptr) *reconnected = std::move(found);
  return job;
}

FlagSet UpFlags(UpOptions& o) {
  FlagSet flags(
      "usage: pipetrain up [flags]\n"
      "Starts a coordinator and workers on this machine and trains a GPT-2 model.");
  BindUp(flags, o);
  return flags;
}

// up's directory for the jobs' files in --out: the coordinator's
// --output-dir and the workers' --checkpoint-root. Jobs name their files
// there (spec.output.weights_path, spec.checkpoint.dir), so it is not --out
// itself, where a job's weights named up.lock or user.token were renamed
// over this run's lock or token (as the coordinator keeps --state-dir out
// of --output-dir).
constexpr char kUpOutputDir[] = "output";

// Makes <out>/output mode 0700 (as ClusterDir makes --out), or takes the
// existing directory; returns its path. `shown_out` is --out as the user
// gave it, for messages. Errors: the errno's code when it cannot be made;
// FAILED_PRECONDITION when something other than a directory has its name.
absl::StatusOr<std::string> MakeUpOutputDir(const std::string& out, const std::string& shown_out) {
  const std::string dir = absl::StrCat(out, "/", kUpOutputDir);
  const std::string shown = absl::StrCat(shown_out, "/", kUpOutputDir);
  // Exactly 0700 when made here, whatever the umask did.
  if (mkdir(dir.c_str(), 0700) == 0 && chmod(dir.c_str(), 0700) == 0) return dir;
  const int error = errno;
  struct stat info;
  if (error == EEXIST && stat(dir.c_str(), &info) == 0) {
    if (S_ISDIR(info.st_mode)) return dir;
    return absl::FailedPreconditionError(
        absl::StrCat("--out ", shown_out, ": ", shown,
                     " is not a directory; up keeps the jobs' weights and checkpoints there: "
                     "move it away or pick another --out"));
  }
  return absl::ErrnoToStatus(error, absl::StrCat("--out ", shown_out, ": cannot create ", shown,
                                                 ": ", std::strerror(error)));
}

// The plan's predicted step and the workers' measured one, as SVG files in
// `dir` for a browser, side by side, named in messages as in `shown_dir`
// (the --out the user gave for its real path); a file that cannot be
// written is reported and skipped (the job's outcome is printed already).
void WriteTimelines(const v1::Plan& plan, const std::string& dir, const std::string& shown_dir) {
  std::vector<std::string> written;
  for (const auto& [name, svg, what] :
       {std::tuple<const char*, const std::string&, std::string>{"timeline-predicted.svg",
                                                                 plan.timeline_svg(), "predicted"},
        {"timeline-measured.svg", plan.measured_timeline_svg(),
         absl::StrCat("measured (step ", plan.measured_step() + 1, ")")}}) {
    const std::string path = absl::StrCat(dir, "/", name);
    const std::string shown = absl::StrCat(shown_dir, "/", name);
    if (svg.empty()) {
      RemoveIfRegular(path);  // an earlier run's, in a reused --out
      continue;
    }
    // Whole or not at all, saying why not (a full disk, a missing
    // directory): its errno, not a bare "cannot write".
    const absl::Status status = WriteFilesOrNone({{path, svg}});
    if (status.ok()) {
      written.push_back(absl::StrCat(what, " ", shown));
    } else {
      std::fprintf(stderr, "pipetrain up: %s timeline %s: %s\n", what.c_str(), shown.c_str(),
                   TerminalSafe(status.message()).c_str());
    }
  }
  if (!written.empty()) std::printf("timelines: %s\n", absl::StrJoin(written, ", ").c_str());
}

}  // namespace

absl::Status ReadAllPages(
    const std::function<absl::StatusOr<std::string>(const std::string&)>& page) {
  std::string token;
  std::set<std::string> seen = {""};
  do {
    absl::StatusOr<std::string> next = page(token);
    if (!next.ok()) return next.status();
    if (!next->empty() && !seen.insert(*next).second) {
      return absl::InternalError(absl::StrCat("the coordinator returned page token \"",
                                              absl::CHexEscape(next->substr(0, 64)),
                                              "\" again: the list would never end"));
    }
    token = *std::move(next);
  } while (!token.empty());
  return absl::OkStatus();
}

std::string SharedCgroupMemoryLimit(int64_t cgroup_limit, int64_t physical, int workers) {
  if (cgroup_limit <= 0 || workers < 1 || (physical > 0 && cgroup_limit >= physical)) return "";
  const int64_t each = (cgroup_limit - cgroup_limit / 8) / workers;
  return each > 0 ? std::to_string(each) : "";
}

absl::Status CheckWorkerDeviceHere(const std::string& device, bool built_with_cuda,
                                   int visible_gpus) {
  return CheckCudaDeviceVisible(device, "--worker-device", built_with_cuda, visible_gpus);
}

int RunUp(const std::vector<std::string>& args) {
  UpOptions o;
  FlagSet flags = UpFlags(o);
  std::vector<std::string> words;
  if (int code = ParseArgs(flags, args, 0, &words, "up"); code >= 0) return code;
  o.tensor_tune_steps_given = flags.IsSet("tensor-partitions-tune-steps");
  o.synthetic_bytes_given = flags.IsSet("synthetic-bytes");
  absl::Status valid = absl::OkStatus();
  if (o.workers < 1) {
    valid = absl::InvalidArgumentError(absl::StrCat("--workers must be >= 1, got ", o.workers));
  } else if (o.tensor_parallel == kTensorParallelAuto && o.data_parallel != kDataParallelAuto) {
    valid = absl::InvalidArgumentError(
        "--tensor-parallel auto needs --data-parallel auto: the planner then chooses the whole "
        "layout of --workers (replicas, stages and tensor ranks)");
  } else if (o.data_parallel == kDataParallelAuto) {
    // The spec's checks name the fields (spec.parallelism.tensor, ...).
    if (!o.dp_stages.empty()) {
      valid = absl::InvalidArgumentError(
          "--dp-stages names stages of a known layout: leave it empty with --data-parallel auto "
          "(the planner picks the stages to compress in the layout it chooses)");
    }
  } else if (o.data_parallel < 1 || o.workers < 1 || o.workers % o.data_parallel != 0) {
    valid = absl::InvalidArgumentError(
        absl::StrCat("--data-parallel ", o.data_parallel, " must be >= 1 and divide --workers ",
                     o.workers, " (each replica gets --workers / --data-parallel stages)"));
  } else if (o.tensor_parallel < 1 || (o.workers / o.data_parallel) % o.tensor_parallel != 0) {
    valid = absl::InvalidArgumentError(
        absl::StrCat("--tensor-parallel ", o.tensor_parallel,
                     " must be >= 1 and divide --workers / "
                     "--data-parallel = ",
                     o.workers / o.data_parallel, " (each stage gets --tensor-parallel workers)"));
  }
  if (valid.ok() && o.dp_stages != "all" && !o.dp_stages.empty()) {
    // Every comma-separated part a number: "," or "0,,1" is a typo, not
    // "the planner's choice" (which is the flag left empty).
    for (absl::string_view part : absl::StrSplit(o.dp_stages, ',')) {
      int stage = 0;
      if (!absl::SimpleAtoi(part, &stage)) {
        valid = absl::InvalidArgumentError(absl::StrCat(
            "--dp-stages: \"", part, "\" is not a stage number (want e.g. 0,1 or all)"));
        break;
      }
    }
  }
  // It sizes generated text: given with --data, it was silently ignored.
  if (valid.ok() && !o.data.empty() && o.synthetic_bytes_given) {
    valid = absl::InvalidArgumentError(
        "--synthetic-bytes sizes generated text, and has no effect with --data; leave it out");
  }
  // The workers would refuse a bad --emulate-link, one by one after starting.
  if (valid.ok()) valid = ParseLinkModel("--emulate-link", o.emulate_link).status();
  // And the job a corpus this process cannot read (it runs them here).
  if (valid.ok() && !o.data.empty() && access(o.data.c_str(), R_OK) != 0) {
    valid = absl::NotFoundError(absl::StrCat("--data ", o.data, ": ", std::strerror(errno)));
  }
  // A directory, device or FIFO passes access(), and the coordinator
  // takes only regular files: refused there, after the cluster started.
  if (struct stat info;
      valid.ok() && !o.data.empty() && stat(o.data.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
    valid = absl::InvalidArgumentError(absl::StrCat(
        "--data ", o.data,
        S_ISDIR(info.st_mode) ? " is a directory" : " is not a regular file (a device or FIFO)",
        "; name a text file (docs/formats.md)"));
  }
  // up trains byte-level text (its model's vocabulary is 256, and it has no
  // --vocab or --format): a token file (.bin, .u16, or llm.c's header) of
  // GPT-2 ids failed every worker's load, after the whole cluster started.
  if (valid.ok() && !o.data.empty()) {
    int32_t magic = 0;
    if (std::FILE* f = std::fopen(o.data.c_str(), "rb")) {
      if (std::fread(&magic, sizeof(magic), 1, f) != 1) magic = 0;
      std::fclose(f);
    }
    // By the name given and by the file's own (a link's target).
    const std::string real = RealPathOf(o.data);
    const auto token_name = [](const std::string& name) {
      return absl::EndsWith(name, ".bin") || absl::EndsWith(name, ".u16");
    };
    if (token_name(o.data) || token_name(real) || magic == kTokenFileMagic) {
      valid = absl::InvalidArgumentError(absl::StrCat(
          "--data ", o.data,
          " reads as a file of token ids (its name or its llm.c header), and up trains on "
          "byte-level text only (a vocabulary of 256, no --vocab or --format flag): submit a job "
          "spec with spec.model.vocab_size and spec.data.format (pipetrain submit), or run "
          "train-local --vocab"));
    }
  }
  // Its directory becomes the processes' --data-root, a comma-separated
  // list: "runs/lr=3e-4,bs=32" would be two roots, neither the corpus's
  // (the coordinator then exited, and `up` reported an outage).
  if (valid.ok() && !o.data.empty() && absl::StrContains(DataRootOf(o.data), ',')) {
    valid = absl::InvalidArgumentError(absl::StrCat(
        "--data ", o.data, ": its directory ", DataRootOf(o.data),
        " has a comma, which the coordinator's and workers' --data-root (a comma-separated "
        "list) would split; move or copy the corpus to a directory without one"));
  }
  // The manual solver needs stage ranges, which up has no flag for (the
  // spec's check would name a field the user cannot set here).
  if (valid.ok() && o.solver == "manual") {
    valid = absl::InvalidArgumentError(
        "--solver manual needs spec.parallelism.manual_stages, which up has no flag for: write a "
        "job spec with them and run `pipetrain submit` (or pick uniform, pipedream, bipartition "
        "or auto)");
  }
  if (valid.ok()) {
    absl::StatusOr<ResolvedJobSpec> resolved = ResolveJobSpec(UpSpec(o));
    absl::Status checked = resolved.ok() ? CheckLinkCodecsSmaller(*resolved) : resolved.status();
    // The coordinator's planning budget too: over it, Submit refuses the
    // job only once the coordinator and every worker have started.
    if (checked.ok()) checked = CheckPlanningBudget(*resolved);
    if (checked.ok()) checked = CheckMinLrHasACosine(resolved->spec);
    valid = NameFlags(checked, kUpFlagNames);
  }
  // Written once the job ends: a path that cannot be must not cost the run.
  if (valid.ok()) {
    valid = CheckWritableParent("--loss-log", o.loss_log, o.out, OutputWrite::kThroughLinks);
  }
  // Every step's loss, from the job's loss history, which keeps the last
  // kLossHistorySteps: a longer run's log would start at a later step,
  // its first line read as step 1's.
  if (valid.ok() && !o.loss_log.empty() && o.steps > kLossHistorySteps) {
    valid = absl::InvalidArgumentError(
        absl::StrCat("--loss-log: the coordinator keeps the losses of the last ", kLossHistorySteps,
                     " steps (Job.progress.loss_history), so a log of --steps ", o.steps,
                     " would lack the first ", o.steps - kLossHistorySteps, "; ask for at most ",
                     kLossHistorySteps, " steps, or read the losses from the workers' metrics"));
  }
  // Written after the run: it must not be the corpus the run trains on,
  // nor a file the run writes in --out (the lock, the output directory) or
  // in its output directory (the weights).
  if (valid.ok()) valid = CheckNotAnInput("--loss-log", o.loss_log, {{"--data", o.data}});
  if (valid.ok()) {
    valid = CheckNotOwnedFile("--loss-log", o.loss_log, "--out", o.out, [](absl::string_view name) {
      return LocalCluster::WritesFileNamed(name) || name == kUpOutputDir ||
             name == "timeline-predicted.svg" || name == "timeline-measured.svg";
    });
  }
  if (valid.ok()) {
    valid = CheckNotOwnedFile("--loss-log", o.loss_log, "the output directory",
                              absl::StrCat(o.out, "/", kUpOutputDir), [](absl::string_view name) {
                                return name == "weights.safetensors" || name == "checkpoints";
                              });
  }
  const bool each_gpu = o.worker_device == "cuda:each";
  const int gpus = each_gpu ? VisibleCudaDevices() : 0;
  // 3-D tensor parallelism has no CUDA path (stage_runtime.cc): the
  // coordinator would wait for CPU workers that never come.
  if (valid.ok() && o.tensor_mode == "3d" &&
      (absl::StartsWith(o.worker_device, "cuda") ||
       (o.worker_device == "auto" && VisibleCudaDevices() > 0))) {
    valid = absl::InvalidArgumentError(absl::StrCat(
        "--tensor-mode 3d runs on CPU workers only (its CUDA path is not built), and with "
        "--worker-device ",
        o.worker_device, " the workers compute on a GPU: use --worker-device cpu"));
  }
  if (valid.ok() && each_gpu && gpus == 0) {
    valid = absl::FailedPreconditionError(absl::StrCat(
        "--worker-device cuda:each: no CUDA device visible",
        BuiltWithCuda() ? ""
                        : " (this binary was built without CUDA: rebuild with --config=cuda)"));
  }
  if (valid.ok()) {
    // The check is the workers' own; say which of up's flags it is about.
    // They run here: auto is the CPU where this process sees no GPU, so
    // GPU-only modes are refused now, not by every worker once started.
    valid = ValidateDeviceFlagsHere(each_gpu ? "cuda" : o.worker_device, o.worker_gemm,
                                    o.worker_attention, "--worker-device");
    if (!valid.ok()) {
      valid = absl::Status(valid.code(),
                           absl::StrCat("--worker-device/--worker-gemm/--worker-attention (the "
                                        "workers' flags): ",
                                        valid.message()));
    }
  }
  // cuda and cuda:N too: the workers would refuse them only once the
  // coordinator and they had started (exit 78). Only these ask CUDA.
  if (valid.ok() && !each_gpu && absl::StartsWith(o.worker_device, "cuda")) {
    valid = CheckWorkerDeviceHere(o.worker_device, BuiltWithCuda(), VisibleCudaDevices());
  }
  if (!valid.ok()) {
    return std::fprintf(stderr, "pipetrain up: %s\n", valid.ToString().c_str()), kExitUsage;
  }
  // --out only once every flag has passed: a refused command line leaves
  // nothing behind. It gets the tokens, and the ports files that say where
  // they are sent: ClusterDir refuses one that another user could have
  // planted or can write in, and locks it until this run's cluster is gone
  // (declared before it, so destroyed after). Its problems are the command
  // line's (exit 2, as an unreadable --data), with the reason.
  absl::StatusOr<ClusterDir> out_dir = ClusterDir::Claim("--out", o.out);
  if (!out_dir.ok()) {
    std::fprintf(stderr, "pipetrain up: %s\n", std::string(out_dir.status().message()).c_str());
    return kExitUsage;
  }
  // gRPC's own tracing (inherited by the coordinator and the workers)
  // prints every call's metadata: the tokens and session credentials
  // would land in the logs under --out.
  if (const char* trace = std::getenv("GRPC_TRACE"); trace != nullptr && *trace != '\0') {
    std::fprintf(stderr,
                 "pipetrain up: GRPC_TRACE is set: gRPC's traces print each call's credentials "
                 "(user token, worker session credentials) into the logs under %s; delete them "
                 "after debugging\n",
                 o.out.c_str());
  }
  auto coordinator = FindSiblingBinary("coordinator", "pipetrain-coordinator");
  auto worker = FindSiblingBinary("worker", "pipetrain-worker");
  if (!coordinator.ok()) return Fail("up", coordinator.status());
  if (!worker.ok()) return Fail("up", worker.status());
  CatchInterrupt(SIGINT);
  CatchInterrupt(SIGTERM);
  // Its terminal closed: stopped as on Ctrl-C (exit 129), not killed with
  // its cluster left to the kernel's SIGTERMs.
  CatchInterrupt(SIGHUP, /*unless_ignored=*/true);
  // A closed stdout (`pipetrain up | head`) ends the run as Ctrl-C does,
  // with the cluster stopped, rather than killing this process outright.
  CatchInterrupt(SIGPIPE);
  LocalClusterOptions cluster_options;
  cluster_options.coordinator_binary = *coordinator;
  cluster_options.worker_binary = *worker;
  cluster_options.workers = o.workers;
  // The checked real path: a link in --out repointed meanwhile is not
  // followed to another user's ports files (ClusterDir::path).
  const std::string out = out_dir->path();
  cluster_options.dir = out;
  // Killed outright (SIGKILL), `up` cannot stop them: the kernel does.
  cluster_options.exit_with_parent = true;
  // Ctrl-C reaches only `up`, which stops them in order (cancel the job,
  // then the workers, then the coordinator), rather than every process at
  // once by the terminal's SIGINT to its whole foreground group.
  cluster_options.own_process_groups = true;
  // Fresh tokens each time: only the processes `up` starts, and whoever can
  // read its --out directory (the token files are mode 0600), get in.
  cluster_options.join_token = RandomToken();
  cluster_options.user_token = RandomToken();
  // The jobs' files in a directory of their own (kUpOutputDir), which the
  // workers' checkpoints share: the coordinator reads them there.
  const absl::StatusOr<std::string> output = MakeUpOutputDir(out, o.out);
  if (!output.ok()) {
    std::fprintf(stderr, "pipetrain up: %s\n", std::string(output.status().message()).c_str());
    return kExitUsage;
  }
  cluster_options.coordinator_args = {"--output-dir=" + *output};
  // No drain, and a short stop: `up` owns the whole cluster and never needs
  // a worker drained (its Ctrl-C cancels the job first). Killed outright
  // (SIGKILL), it left each worker, signalled by the kernel, asking the
  // coordinator gone with it for a drain for the default 60 s and more,
  // holding its model's memory beside the workers of the next `up`. Now a
  // worker leaves at once, its stop bounded by 4 s (2, and 2 for its
  // deregistration's call), within the 5 s `up` gives it on Ctrl-C.
  cluster_options.worker_args = {"--gemm",
                                 o.worker_gemm,
                                 "--attention",
                                 o.worker_attention,
                                 "--checkpoint-root=" + *output,
                                 "--drain-timeout-seconds=0",
                                 "--stop-timeout-seconds=2"};
  if (!o.emulate_link.empty()) {
    cluster_options.worker_args.push_back("--emulate-link=" + o.emulate_link);
  }
  if (!o.data.empty()) {
    // Every process reads the corpus from the directory it lies in, and
    // nothing else (the data roots of docs/operations.md "Security").
    const std::string root = DataRootOf(o.data);
    cluster_options.coordinator_args.push_back("--data-root=" + root);
    cluster_options.worker_args.push_back("--data-root=" + root);
  }
  // CPU workers hold the model in this cgroup's memory, which they share
  // (GPU workers are planned by their devices' memory).
  const bool on_cpu = o.worker_device == "cpu" ||
                      (o.worker_device == "auto" && CudaDevicesOrError().value_or(-1) == 0);
  if (const std::string shared =
          on_cpu ? SharedCgroupMemoryLimit(CgroupMemoryLimit(), PhysicalMemoryBytes(), o.workers)
                 : "";
      !shared.empty()) {
    cluster_options.worker_args.push_back("--memory-limit=" + shared);
    std::fprintf(stderr,
                 "this cgroup's memory limit (%.1f GiB) is shared: --memory-limit %.2f GiB for "
                 "each worker\n",
                 static_cast<double>(CgroupMemoryLimit()) / (1 << 30),
                 std::stod(shared) / (1 << 30));
  }
  for (int k = 0; k < o.workers; ++k) {
    cluster_options.per_worker_args.push_back(
        {"--device", each_gpu ? absl::StrCat("cuda:", k % gpus) : o.worker_device});
  }
  std::fprintf(stderr, "starting a coordinator and %d workers (logs in %s)\n", o.workers,
               o.out.c_str());
  // Ctrl-C while it starts (the children no longer see it): no job, and
  // no waiting out a process that hangs before it binds its ports.
  cluster_options.stop = [] { return Interrupted(); };
  auto cluster = LocalCluster::Start(cluster_options);
  if (!cluster.ok() && !Interrupted()) return Fail("up", cluster.status());
  if (Interrupted()) {
    std::fprintf(stderr, "interrupted; stopping the cluster\n");
    return InterruptedExitCode();
  }
  // Why a call failed when the coordinator process ended: how, and where
  // its log is (gRPC's "connection refused" alone said neither). `wait`:
  // a moment for an exit that the failed call saw first to be seen too.
  const auto coordinator_ended = [&](absl::Duration wait) -> absl::Status {
    const std::optional<int> ended = (*cluster)->coordinator().Wait(wait);
    if (!ended.has_value()) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat("the coordinator ended: ", DescribeExit(*ended),
                                               "; its log: ", (*cluster)->coordinator_log()));
  };
  auto stub = ConnectCoordinator((*cluster)->grpc_address(), "", (*cluster)->user_token());
  v1::SubmitJobRequest request;
  *request.mutable_spec() = UpSpec(o);
  v1::Job job;
  grpc::Status submitted = stub->SubmitJob(WithDeadline(kRpcTimeout).get(), request, &job);
  if (!submitted.ok()) {
    const absl::Status ended = coordinator_ended(absl::Seconds(2));
    return Fail("up", ended.ok() ? ToAbsl(submitted) : ended);
  }
  const std::string layout =
      o.data_parallel == kDataParallelAuto
          ? absl::StrCat(o.workers, " workers, the layout chosen by the planner")
          : absl::StrCat(o.data_parallel, " replica(s) of ",
                         o.workers / (o.data_parallel * o.tensor_parallel), " stages of ",
                         o.tensor_parallel, " worker(s)");
  std::fprintf(stderr, "job %s: %s (%s, %s), %lld steps; metrics at http://%s/metrics\n",
               job.id().c_str(), layout.c_str(), o.solver.c_str(), o.schedule.c_str(),
               static_cast<long long>(o.steps), (*cluster)->http_address().c_str());
  // Its own processes, watched while the job runs: a worker that ended is
  // news at once, and a coordinator that ended ends the run, saying how.
  // So does a worker that ended before the job's first plan, which needs
  // every worker: nothing starts another, and the job would wait for it
  // until its queue timeout (an hour by default). After that plan, a lost
  // worker is the job's to recover from or fail on.
  std::set<std::string> workers_shown;
  const LocalWatch watch = [&](const v1::Job* polled,
                               std::vector<std::string>* news) -> absl::Status {
    const absl::Status ended =
        coordinator_ended(polled == nullptr ? absl::Seconds(2) : absl::ZeroDuration());
    if (!ended.ok()) return ended;
    for (absl::string_view line :
         absl::StrSplit((*cluster)->DescribeEndedWorkers(), '\n', absl::SkipEmpty())) {
      if (!workers_shown.insert(std::string(line)).second) continue;
      if (polled != nullptr && AwaitsFirstPlan(*polled)) {
        v1::CancelJobRequest cancel;
        cancel.set_id(job.id());
        v1::Job cancelled;
        // A courtesy, as on Ctrl-C: the cluster stops next anyway.
        (void)stub->CancelJob(WithDeadline(absl::Seconds(2)).get(), cancel, &cancelled);
        return absl::UnavailableError(absl::StrCat(line, "; job ", job.id(),
                                                   " cannot start without it (its first plan "
                                                   "needs every worker), so it was cancelled"));
      }
      news->emplace_back(line);
    }
    return absl::OkStatus();
  };
  StepTiming timing;
  absl::StatusOr<v1::Job> done =
      Follow(*stub, job.id(), kRpcTimeout, &timing, nullptr, nullptr, watch);
  if (!done.ok()) return Fail("up", done.status());
  if (Interrupted()) {
    v1::CancelJobRequest cancel;
    cancel.set_id(job.id());
    // A courtesy (the cluster stops next anyway), so briefly: a coordinator
    // that answers nothing held an interrupted `up` for the full 10 s.
    (void)stub->CancelJob(WithDeadline(absl::Seconds(2)).get(), cancel, &job);
    std::fprintf(stderr, "interrupted; stopping the cluster\n");
    return InterruptedExitCode();
  }
  // The loss history comes only in the full view.
  v1::GetJobRequest full_request;
  full_request.set_id(job.id());
  full_request.set_view(v1::JOB_VIEW_FULL);
  grpc::Status got = stub->GetJob(WithDeadline(kRpcTimeout).get(), full_request, &*done);
  if (!got.ok()) return Fail("up", ToAbsl(got));
  const v1::Job& end = *done;
  std::printf("%s", FormatJobOutcome(end).c_str());
  // A worker lost during the run: the job's reason says it "is gone", this
  // how it ended (e.g. killed for memory).
  const std::string ended_workers = (*cluster)->DescribeEndedWorkers();
  std::printf("%s", ended_workers.c_str());
  for (absl::string_view line : absl::StrSplit(ended_workers, '\n', absl::SkipEmpty())) {
    workers_shown.insert(std::string(line));  // said; --keep-running says only later ones
  }
  // Whole or not at all, its errno named (an unchecked final flush lost a
  // full disk's error); a failure is reported after the run's report. A
  // FIFO whose reader stalls is given up on at Ctrl-C (or SIGTERM), which
  // then stops the cluster as anywhere else in the run.
  absl::Status loss_log_written = absl::OkStatus();
  if (!o.loss_log.empty()) {
    if (end.progress().loss_history_start() != 0) {  // refused at the start; a guard
      loss_log_written = absl::OutOfRangeError(
          absl::StrCat("the job's loss history starts at step ",
                       end.progress().loss_history_start(), ", not 0; nothing written"));
    } else {
      std::string text;
      for (float loss : end.progress().loss_history()) text += absl::StrFormat("%.9g\n", loss);
      loss_log_written =
          WriteFilesOrNone({{o.loss_log, std::move(text)}}, [] { return Interrupted(); });
    }
  }
  // Given up on at an interrupt (CANCELLED): stop as anywhere else in the
  // run. Not for any other failure: a reader that closed the FIFO early
  // raises SIGPIPE, which counts as an interrupt too, but the run's report
  // and the --loss-log error exit still come.
  if (loss_log_written.code() == absl::StatusCode::kCancelled && Interrupted()) {
    std::fprintf(stderr, "pipetrain up: --loss-log: %s\n",
                 std::string(loss_log_written.message()).c_str());
    std::fprintf(stderr, "interrupted; stopping the cluster\n");
    return InterruptedExitCode();
  }
  v1::GetPlanRequest plan_request;
  plan_request.set_job_id(end.id());
  v1::Plan plan;
  if (const grpc::Status got_plan =
          stub->GetPlan(WithDeadline(kRpcTimeout).get(), plan_request, &plan);
      got_plan.ok()) {
    std::printf("%s", FormatPlanReport(end, plan, timing).c_str());
    if (plan.tensor_parallel() > 1) PrintTensorParallelSummary(**cluster);
    WriteTimelines(plan, out, o.out);
  } else {
    // Said, not skipped: the report's step times and the timelines are
    // missing from the output, and why (a job that failed before its plan
    // has none: "has no plan yet").
    std::fprintf(stderr, "pipetrain up: no plan report or timelines (GetPlan: %s)\n",
                 TerminalSafe(got_plan.error_message()).c_str());
  }
  PrintLinkSummary(**cluster);
  if (!loss_log_written.ok()) {
    return Fail("up", absl::Status(loss_log_written.code(),
                                   absl::StrCat("--loss-log: ", loss_log_written.message())));
  }
  // The metrics page only while the cluster stays up: it goes with `up`.
  if (o.keep_running && !Interrupted()) {
    std::printf("metrics: http://%s/metrics   logs: %s\n", (*cluster)->http_address().c_str(),
                o.out.c_str());
    std::printf("cluster running: --coordinator %s --token-file %s (Ctrl-C to stop)\n",
                (*cluster)->grpc_address().c_str(), (*cluster)->user_token_file().c_str());
    std::fflush(stdout);  // the summary too, when stdout is a file or a pipe
    // Its processes still watched: a worker that ends is said (and
    // reaped), and a coordinator that ends ends the run, saying how,
    // rather than leaving "cluster running" up beside a dead address.
    while (!Interrupted()) {
      std::vector<std::string> news;
      const absl::Status going_on = watch(&end, &news);
      for (const std::string& line : news) {
        std::fprintf(stderr, "%s\n", TerminalSafe(line).c_str());
      }
      if (!going_on.ok()) return Fail("up", going_on);
      absl::SleepFor(absl::Milliseconds(200));
    }
    return InterruptedExitCode();  // 128 + the signal, as documented
  } else {
    std::printf("logs: %s\n", o.out.c_str());
  }
  return end.state() == v1::JOB_STATE_SUCCEEDED ? kExitOk : kExitJobNotSucceeded;
}

namespace {

struct SubmitOptions {
  Connection c;
  bool follow = false;
  std::string request_id;
};

// A submit whose outcome is unknown is sent again this many times in all,
// 1 s after the first failure, then 2, 4 and 8 s.
constexpr int kSubmitAttempts = 5;
constexpr absl::Duration kFirstSubmitBackoff = absl::Seconds(1);

// Whether a call that failed with `status` was refused by a coordinator
// serving only refusals (FollowerService: a follower, or a leader still
// loading its state), which reads no request: UNAVAILABLE naming a leader
// (kLeaderMetadataKey), which nothing else sends. The call did nothing.
// A follower that knows no leader names none: its refusal reads as any
// other UNAVAILABLE.
bool RefusedUnread(const grpc::Status& status, const grpc::ClientContext& context) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE && !LeaderHint(context).empty();
}

// Whether a call that failed with `status` never left this process: gRPC
// failed it before giving it a connection, none to `addresses` (the
// --coordinator list) being made ("failed to connect to all addresses":
// refused, reset during the handshake; "DNS resolution failed"). The
// words alone are no proof (a coordinator may quote them from a client
// of its own): the call's peer must be the channel's target too, as it is
// for a call no connection took (gRPC 1.51); one that reached a server
// names the connection's ("ipv4:10.0.0.7:7070"). An address that is
// itself such a URI is never taken for proof.
bool NeverConnected(const grpc::Status& status, const grpc::ClientContext& context,
                    const std::vector<std::string>& addresses) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE ||
      !(absl::StartsWith(status.error_message(), "failed to connect to all addresses") ||
        absl::StartsWith(status.error_message(), "DNS resolution failed"))) {
    return false;
  }
  const std::string peer = context.peer();
  for (const char* scheme : {"ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:"}) {
    if (absl::StartsWith(peer, scheme)) return false;
  }
  return absl::c_linear_search(addresses, peer);
}

FlagSet SubmitFlags(SubmitOptions& o) {
  FlagSet flags(
      "usage: pipetrain submit FILE [--coordinator HOST:PORT] [--follow] [--request-id ID]\n"
      "Submits a job spec (JSON or YAML; fields as in proto/pipetrain/v1/job.proto).\n"
      "A submit that fails with UNAVAILABLE, DEADLINE_EXCEEDED or CANCELLED (a coordinator\n"
      "that was stopping; the job may or may not exist) is sent again with the same request id, at most 5 attempts in all, 1, 2, 4\n"
      "and 8 s apart (each waiting up to --timeout for its answer): a repeat returns the\n"
      "job the first one made, never a second job.");
  o.c.Bind(flags);
  flags.Bool("follow", &o.follow,
             "show progress until the job ends, then what `up` reports (both on stderr); exit "
             "1 if it did not succeed, 3 if following it failed (the job may still run)");
  flags.String("request-id", &o.request_id,
               "the submission's request id (at most 128 of A-Z a-z 0-9 . _ : -); running the "
               "command again with the same id and spec returns the same job. Default: a "
               "random one");
  return flags;
}

}  // namespace

int RunSubmit(const std::vector<std::string>& args) {
  SubmitOptions o;
  FlagSet flags = SubmitFlags(o);
  std::vector<std::string> words;
  if (int code = ParseArgs(flags, args, 1, &words, "submit", &o.c); code >= 0) return code;
  // A spec that does not parse exits as the coordinator's refusal would
  // (INVALID_ARGUMENT; NOT_FOUND for a missing file).
  auto spec = ReadJobSpecFile(words[0]);
  if (!spec.ok()) return Fail("submit", spec.status());
  auto stub = o.c.Connect();
  if (!stub.ok()) return Fail("submit", stub.status());
  v1::SubmitJobRequest request;
  *request.mutable_spec() = *spec;
  request.set_request_id(o.request_id.empty() ? RandomHex(16) : o.request_id);
  int attempt = 0;
  // Whether every failed attempt is known to have done nothing: refused
  // unread, never connected, or no leader found to send it to; and
  // whether each of them never connected (the message says so then).
  bool none_sent = true;
  bool none_connected = true;
  // Checked by ParseArgs (Connection::Check).
  const std::vector<std::string> addresses =
      ParseCoordinatorAddresses("--coordinator", o.c.coordinator)
          .value_or(std::vector<std::string>());
  absl::StatusOr<v1::Job> submitted = SubmitWithRetries(
      [&]() -> absl::StatusOr<v1::Job> {
        // A repeat connects again: the leader may have changed.
        if (++attempt > 1) {
          auto fresh = o.c.Connect();
          if (!fresh.ok()) {
            none_connected = false;  // found no leader (the only failure left)
            return fresh.status();
          }
          *stub = std::move(*fresh);
        }
        v1::Job job;
        const std::unique_ptr<grpc::ClientContext> context = WithDeadline(o.c.timeout);
        grpc::Status s = (*stub)->SubmitJob(context.get(), request, &job);
        if (!s.ok()) {
          const bool never_connected = NeverConnected(s, *context, addresses);
          none_sent = none_sent && (never_connected || RefusedUnread(s, *context));
          none_connected = none_connected && never_connected;
          return ToAbsl(s);
        }
        return job;
      },
      kSubmitAttempts, kFirstSubmitBackoff,
      [&request](const absl::Status& failed, int n, absl::Duration wait) {
        std::fprintf(stderr,
                     "pipetrain submit: attempt %d of %d: %s; again in %s (request id %s)\n", n,
                     kSubmitAttempts, TerminalSafe(failed.ToString()).c_str(),
                     absl::FormatDuration(wait).c_str(), request.request_id().c_str());
      },
      [](absl::Duration wait) {
        absl::SleepFor(wait);
        return true;
      });
  if (!submitted.ok()) {
    const int exit_code = Fail("submit", submitted.status());
    if (!CoordinatorOutcomeUnknown(submitted.status())) return exit_code;
    // Certain, though the code says "retry" as for an unknown outcome: only
    // coordinators that do not serve the API answered, none was found, or
    // none could be connected to.
    if (none_sent && none_connected) {
      std::fprintf(stderr,
                   "pipetrain submit: nothing was submitted: no attempt could connect to a "
                   "coordinator; run this command again once one is up\n");
      return exit_code;
    }
    if (none_sent) {
      std::fprintf(stderr,
                   "pipetrain submit: nothing was submitted: every attempt was refused by a "
                   "coordinator that does not lead (or leads but is still loading its state), "
                   "found none that leads or could not connect; run this command again once one "
                   "leads\n");
      return exit_code;
    }
    // Whether the job exists is unknown (the id makes asking again safe),
    // unless the coordinator said nothing was submitted (a path held a
    // minute more, the state store refusing the job).
    if (!SaysNothingSubmitted(submitted.status())) {
      std::fprintf(stderr,
                   "pipetrain submit: the job may or may not have been created; running this "
                   "command again with --request-id %s never creates a second one\n",
                   request.request_id().c_str());
    }
    return exit_code;
  }
  const v1::Job& job = *submitted;
  // Ctrl-C from here on stops the following (Follow), not the job. Set
  // before the id is printed, so that a caller who has seen the id knows
  // the handler is in place.
  // A closed stdout likewise (`submit --follow | true`): SIGPIPE's default
  // ended the process before it said the job keeps running, or its id.
  if (o.follow) {
    CatchInterrupt(SIGINT);
    CatchInterrupt(SIGPIPE);
  }
  std::printf("%s %s\n", job.id().c_str(), EnumShortName(job.state()).c_str());
  if (!o.follow) return kExitOk;
  std::fflush(stdout);  // before the progress (stderr), when stdout is a pipe
  StepTiming timing;
  std::unique_ptr<v1::CoordinatorService::Stub> reconnected;
  auto done = Follow(
      **stub, job.id(), o.c.timeout, &timing, [&o] { return o.c.Connect(); }, &reconnected);
  if (reconnected != nullptr) *stub = std::move(reconnected);  // for the report below
  if (!done.ok()) {
    Fail("submit", done.status());
    std::fprintf(stderr,
                 "pipetrain submit: stopped following; job %s was submitted and may still be "
                 "running (pipetrain job %s shows it, pipetrain cancel %s stops it): submitting "
                 "it again would start a second one\n",
                 job.id().c_str(), job.id().c_str(), job.id().c_str());
    return kExitFollowFailed;
  }
  if (Interrupted()) {
    // Ctrl-C stops the following, not the job (it runs on the cluster):
    // saying so keeps the user from assuming it was cancelled.
    std::fprintf(stderr,
                 "\npipetrain submit: stopped following; job %s keeps running (pipetrain "
                 "cancel %s stops it)\n",
                 job.id().c_str(), job.id().c_str());
    return InterruptedExitCode();
  }
  // The report `up` prints, on stderr with the progress: stdout keeps its
  // two lines (the id and state at submission and at the end) for scripts.
  // A call failing here costs only the report.
  v1::GetJobRequest full_request;
  full_request.set_id(job.id());
  full_request.set_view(v1::JOB_VIEW_FULL);
  v1::Job full;
  if ((*stub)->GetJob(WithDeadline(o.c.timeout).get(), full_request, &full).ok()) {
    std::string report = FormatJobOutcome(full);
    v1::GetPlanRequest plan_request;
    plan_request.set_job_id(job.id());
    v1::Plan plan;
    if ((*stub)->GetPlan(WithDeadline(o.c.timeout).get(), plan_request, &plan).ok()) {
      report += FormatPlanReport(full, plan, timing);
    }
    std::fprintf(stderr, "%s", report.c_str());
  }
  // "job-… SUCCEEDED" exactly, for scripts (docs/operations.md); a reason
  // follows a space only when there is one.
  std::printf("%s %s%s%s\n", done->id().c_str(), EnumShortName(done->state()).c_str(),
              done->reason().empty() ? "" : " ", TerminalSafe(done->reason()).c_str());
  return done->state() == v1::JOB_STATE_SUCCEEDED ? kExitOk : kExitJobNotSucceeded;
}

namespace {

// The options of the listing commands (jobs, workers).
struct ListOptions {
  Connection c;
  bool json = false;
  int page_size = 0;
};

void BindPageSize(FlagSet& flags, ListOptions& o) {
  flags.Int("page-size", &o.page_size,
            "items per call (0: the coordinator's default); every page is read either way");
}

// -1 to go on, else the exit code: a negative --page-size is the command
// line's mistake (the coordinator would refuse it with INVALID_ARGUMENT).
int CheckPageSize(const char* command, const ListOptions& o) {
  if (o.page_size >= 0) return -1;
  std::fprintf(stderr, "pipetrain %s: --page-size must be 0 or more, got %d\n", command,
               o.page_size);
  return kExitUsage;
}

FlagSet JobsFlags(ListOptions& o) {
  FlagSet flags("usage: pipetrain jobs [--coordinator HOST:PORT] [--json]");
  o.c.Bind(flags);
  flags.Bool("json", &o.json, "print the jobs as JSON ({\"jobs\": [...]}, proto3 JSON names)");
  BindPageSize(flags, o);
  return flags;
}

}  // namespace

int RunJobs(const std::vector<std::string>& args) {
  ListOptions o;
  FlagSet flags = JobsFlags(o);
  std::vector<std::string> words;
  if (int code = ParseArgs(flags, args, 0, &words, "jobs", &o.c); code >= 0) return code;
  if (int code = CheckPageSize("jobs", o); code >= 0) return code;
  auto stub = o.c.Connect();
  if (!stub.ok()) return Fail("jobs", stub.status());
  std::vector<v1::Job> jobs;
  absl::Status listed = ReadAllPages([&](const std::string& token) -> absl::StatusOr<std::string> {
    v1::ListJobsRequest request;
    request.set_page_token(token);
    request.set_page_size(o.page_size);
    v1::ListJobsResponse page;
    grpc::Status s = (*stub)->ListJobs(WithDeadline(o.c.timeout).get(), request, &page);
    if (!s.ok()) return ToAbsl(s);
    for (v1::Job& job : *page.mutable_jobs()) jobs.push_back(std::move(job));
    return page.next_page_token();
  });
  if (!listed.ok()) return Fail("jobs", listed);
  if (o.json) return std::printf("%s", ListJson("jobs", jobs).c_str()), kExitOk;
  int id_width = 2;  // the column fits the longest id ("job-mx1au5pb-1")
  for (const v1::Job& j : jobs) id_width = std::max(id_width, static_cast<int>(j.id().size()));
  std::printf("%-*s %-10s %10s %10s  %s\n", id_width, "ID", "STATE", "STEP", "LOSS", "NAME");
  for (const v1::Job& j : jobs) {
    std::printf("%-*s %-10s %10lld %10.4f  %s\n", id_width, j.id().c_str(),
                EnumShortName(j.state()).c_str(), static_cast<long long>(j.progress().step()),
                j.progress().loss(), TerminalSafe(j.spec().name()).c_str());
  }
  return kExitOk;
}

namespace {

// The plan in a few lines: solver, prediction, and each stage's ranges.
void PrintPlanSummary(const v1::Plan& plan) {
  std::printf("plan v%lld: solver %s, objective %s, %s, %s\n",
              static_cast<long long>(plan.version()), plan.solver().c_str(),
              plan.objective().c_str(), plan.schedule().c_str(),
              FormatPlanMicroBatches(plan).c_str());
  std::printf("predicted iteration %.4g s, bubble %.1f %%, bottleneck %.4g s, solved in %.3g s\n",
              plan.predicted_iteration_seconds(), 100 * plan.bubble_fraction(),
              plan.bottleneck_seconds(), plan.solve_seconds());
  // Names the profiling worker's device and host, and its error text: inert.
  std::printf("costs: %s\n", TerminalSafe(plan.profile_source()).c_str());
  for (const auto& [solver, seconds] : plan.candidates()) {
    std::printf("  candidate %-12s predicted %.4g s\n", solver.c_str(), seconds);
  }
  for (const auto& [solver, why] : plan.candidates_skipped()) {
    std::printf("  candidate %-12s skipped: %s\n", solver.c_str(), TerminalSafe(why).c_str());
  }
  auto range = [](const v1::UnitRange& r) {
    return r.begin() == r.end() ? std::string("-") : absl::StrCat(r.begin(), "..", r.end() - 1);
  };
  // Labelled as the report's table labels them: with replicas or tensor
  // ranks, entry g is not stage g.
  std::vector<std::string> where;
  size_t width = 0;
  for (int g = 0; g < plan.stages_size(); ++g) {
    where.push_back(PlanEntryLabel(plan, g));
    width = std::max(width, where.back().size());
  }
  for (int g = 0; g < plan.stages_size(); ++g) {
    std::printf("  %-*s %-8s forward %-8s backward %s\n", static_cast<int>(width), where[g].c_str(),
                plan.stages(g).worker_id().c_str(), range(plan.stages(g).forward()).c_str(),
                range(plan.stages(g).backward()).c_str());
  }
}

struct JobOptions {
  Connection c;
  bool show_plan = false;
  bool report = false;
  bool json = false;
  bool full = false;
  std::string timeline;
  std::string measured_timeline;
};

FlagSet JobFlags(JobOptions& o) {
  FlagSet flags(
      "usage: pipetrain job ID [--coordinator HOST:PORT] [--plan] [--timeline FILE.svg]\n"
      "                        [--measured-timeline FILE.svg] [--json]\n"
      "       pipetrain job ID --report\n"
      "  (prints the job as JSON; --plan adds its plan, --timeline writes the plan's "
      "simulated timeline, --measured-timeline the workers' measured one; --report prints "
      "what `up` reports at a job's end instead)");
  o.c.Bind(flags);
  flags.Bool("plan", &o.show_plan, "also print the job's plan (solver, prediction, stages)");
  flags.Bool("report", &o.report,
             "print how the job went, as `up` does at its end (loss, step time measured by the "
             "workers next to the prediction, each worker's busy and waiting time), not JSON");
  flags.String("timeline", &o.timeline, "write the plan's simulated timeline (SVG) to this file");
  flags.String("measured-timeline", &o.measured_timeline,
               "write the workers' measured timeline of a step (SVG; the plan's 11th step, then "
               "every 100th) to this file");
  flags.Bool("full", &o.full, "include the loss history (progress.lossHistory; JOB_VIEW_FULL)");
  flags.Bool("json", &o.json,
             "print JSON only, every field included: the job, or with --plan "
             "{\"job\": ..., \"plan\": ...}");
  return flags;
}

}  // namespace

int RunJob(const std::vector<std::string>& args) {
  JobOptions o;
  FlagSet flags = JobFlags(o);
  std::vector<std::string> words;
  if (int code = ParseArgs(flags, args, 1, &words, "job", &o.c); code >= 0) return code;
  if (o.report &&
      (o.json || o.show_plan || o.full || !o.timeline.empty() || !o.measured_timeline.empty())) {
    std::fprintf(stderr,
                 "pipetrain job: --report prints text on its own: drop --json, --plan, "
                 "--full, --timeline and --measured-timeline\n");
    return kExitUsage;
  }
  for (const auto& [flag, path] :
       {std::pair<const char*, const std::string&>{"--timeline", o.timeline},
        {"--measured-timeline", o.measured_timeline}}) {
    // Written by WriteFilesOrNone, which writes through a link in place.
    if (absl::Status writable = CheckWritableParent(flag, path, "", OutputWrite::kThroughLinks);
        !writable.ok()) {
      std::fprintf(stderr, "pipetrain job: %s\n", std::string(writable.message()).c_str());
      return kExitUsage;
    }
  }
  // One file for both would hold the measured timeline alone.
  if (absl::Status distinct = CheckDistinctOutputs(
          {{"--timeline", o.timeline}, {"--measured-timeline", o.measured_timeline}});
      !distinct.ok()) {
    std::fprintf(stderr, "pipetrain job: %s\n", std::string(distinct.message()).c_str());
    return kExitUsage;
  }
  auto stub = o.c.Connect();
  if (!stub.ok()) return Fail("job", stub.status());
  v1::GetJobRequest request;
  request.set_id(words[0]);
  if (o.full || o.report) request.set_view(v1::JOB_VIEW_FULL);
  v1::Job job;
  grpc::Status s = (*stub)->GetJob(WithDeadline(o.c.timeout).get(), request, &job);
  if (!s.ok()) return Fail("job", ToAbsl(s));
  if (!o.show_plan && o.timeline.empty() && o.measured_timeline.empty() && !o.report) {
    std::printf("%s", ToJson(job, o.json).c_str());
    return kExitOk;
  }
  v1::GetPlanRequest plan_request;
  plan_request.set_job_id(words[0]);
  v1::Plan plan;
  s = (*stub)->GetPlan(WithDeadline(o.c.timeout).get(), plan_request, &plan);
  if (o.report) {
    // A job not yet planned (queued) has no plan: its outcome alone.
    if (!s.ok() && s.error_code() != grpc::StatusCode::FAILED_PRECONDITION) {
      return Fail("job", ToAbsl(s));
    }
    std::printf("%s%s", FormatJobOutcome(job).c_str(),
                s.ok() ? FormatPlanReport(job, plan, StepTiming()).c_str() : "");
    return kExitOk;
  }
  if (!s.ok()) return Fail("job", ToAbsl(s));
  // A reply over its size limit leaves drawings out, naming them
  // (grpc_service.h): said so, with where to fetch the drawing whole.
  for (const auto& [wanted, drawing, route] :
       {std::tuple<bool, const char*, const char*>{!o.timeline.empty(), "timeline_svg",
                                                   "timeline.svg"},
        {!o.measured_timeline.empty(), "measured_timeline_svg", "measured-timeline.svg"}}) {
    if (wanted && absl::c_linear_search(plan.drawings_omitted(), drawing)) {
      return Fail("job", absl::ResourceExhaustedError(
                             absl::StrCat("the plan's ", route,
                                          " was left out of the reply to fit gRPC's "
                                          "message limit; fetch it over REST: GET /v1/jobs/",
                                          job.id(), "/", route)));
    }
  }
  if (!o.timeline.empty() && plan.timeline_svg().empty()) {
    return Fail("job", NoTimelineError(job.id(), job.state(), IsTerminal(job.state())));
  }
  if (!o.measured_timeline.empty() && plan.measured_timeline_svg().empty()) {
    return Fail("job", NoMeasuredTimelineError(job.id(), job.state(), IsTerminal(job.state())));
  }
  // The files first: a write that fails leaves neither them nor half the
  // output behind.
  std::vector<std::pair<const char*, std::string>> written;  // what, path
  std::vector<OutputFile> files;
  for (const auto& [path, svg, what] :
       {std::tuple<const std::string&, const std::string&, const char*>{
            o.timeline, plan.timeline_svg(), "timeline"},
        {o.measured_timeline, plan.measured_timeline_svg(), "measured timeline"}}) {
    if (path.empty()) continue;
    files.push_back({path, svg});
    written.emplace_back(what, path);
  }
  if (absl::Status wrote = WriteFilesOrNone(files); !wrote.ok()) return Fail("job", wrote);
  if (o.json && o.show_plan) {
    std::printf("{\"job\": %s, \"plan\": %s}\n", ToJson(job, true).c_str(),
                ToJson(plan, true).c_str());
  } else if (o.json) {
    // As without a timeline: the job alone (docs/operations.md, "JSON").
    std::printf("%s", ToJson(job, true).c_str());
  } else {
    std::printf("%s", ToJson(job).c_str());
    if (o.show_plan) PrintPlanSummary(plan);
  }
  // On stderr with --json, so that stdout stays one JSON document.
  for (const auto& [what, path] : written) {
    std::fprintf(o.json ? stderr : stdout, "%s: %s\n", what, path.c_str());
  }
  return kExitOk;
}

namespace {

// The options of the commands that act on one job or worker (drain, cancel).
struct ActOptions {
  Connection c;
};

FlagSet DrainFlags(ActOptions& o) {
  FlagSet flags(
      "usage: pipetrain drain WORKER [--coordinator HOST:PORT]\n"
      "  (takes a worker out of service: its job re-plans without it at the next step\n"
      "  boundary, redoing no step, and it gets no job until its process restarts)");
  o.c.Bind(flags);
  return flags;
}

FlagSet CancelFlags(ActOptions& o) {
  FlagSet flags("usage: pipetrain cancel ID [--coordinator HOST:PORT]");
  o.c.Bind(flags);
  return flags;
}

}  // namespace

int RunDrain(const std::vector<std::string>& args) {
  ActOptions o;
  FlagSet flags = DrainFlags(o);
  std::vector<std::string> words;
  if (int code = ParseArgs(flags, args, 1, &words, "drain", &o.c); code >= 0) return code;
  v1::DrainWorkerRequest request;
  request.set_worker_id(words[0]);
  v1::Worker worker;
  auto stub = o.c.Connect();
  if (!stub.ok()) return Fail("drain", stub.status());
  grpc::Status s = (*stub)->DrainWorker(WithDeadline(o.c.timeout).get(), request, &worker);
  if (!s.ok()) return Fail("drain", ToAbsl(s));
  std::printf("%s draining%s\n", worker.id().c_str(),
              worker.job_id().empty() ? "" : (" from job " + worker.job_id()).c_str());
  return kExitOk;
}

int RunCancel(const std::vector<std::string>& args) {
  ActOptions o;
  FlagSet flags = CancelFlags(o);
  std::vector<std::string> words;
  if (int code = ParseArgs(flags, args, 1, &words, "cancel", &o.c); code >= 0) return code;
  v1::CancelJobRequest request;
  request.set_id(words[0]);
  v1::Job job;
  auto stub = o.c.Connect();
  if (!stub.ok()) return Fail("cancel", stub.status());
  grpc::Status s = (*stub)->CancelJob(WithDeadline(o.c.timeout).get(), request, &job);
  if (!s.ok()) return Fail("cancel", ToAbsl(s));
  std::printf("%s %s\n", job.id().c_str(), EnumShortName(job.state()).c_str());
  return kExitOk;
}

namespace {

FlagSet WorkersFlags(ListOptions& o) {
  FlagSet flags("usage: pipetrain workers [--coordinator HOST:PORT] [--json]");
  o.c.Bind(flags);
  flags.Bool("json", &o.json,
             "print the workers as JSON ({\"workers\": [...]}, proto3 JSON names)");
  BindPageSize(flags, o);
  return flags;
}

}  // namespace

int RunWorkers(const std::vector<std::string>& args) {
  ListOptions o;
  FlagSet flags = WorkersFlags(o);
  std::vector<std::string> words;
  if (int code = ParseArgs(flags, args, 0, &words, "workers", &o.c); code >= 0) return code;
  if (int code = CheckPageSize("workers", o); code >= 0) return code;
  auto stub = o.c.Connect();
  if (!stub.ok()) return Fail("workers", stub.status());
  std::vector<v1::Worker> workers;
  absl::Status listed = ReadAllPages([&](const std::string& token) -> absl::StatusOr<std::string> {
    v1::ListWorkersRequest request;
    request.set_page_token(token);
    request.set_page_size(o.page_size);
    v1::ListWorkersResponse page;
    grpc::Status s = (*stub)->ListWorkers(WithDeadline(o.c.timeout).get(), request, &page);
    if (!s.ok()) return ToAbsl(s);
    for (v1::Worker& worker : *page.mutable_workers()) workers.push_back(std::move(worker));
    return page.next_page_token();
  });
  if (!listed.ok()) return Fail("workers", listed);
  if (o.json) return std::printf("%s", ListJson("workers", workers).c_str()), kExitOk;
  // The id and job columns fit their longest entries.
  int id_width = 6, job_width = 8;
  for (const v1::Worker& w : workers) {
    id_width = std::max(id_width, static_cast<int>(w.id().size()));
    job_width = std::max(job_width, static_cast<int>(w.job_id().size()));
  }
  std::printf("%-*s %-9s %-22s %-24s %8s %-12s %-*s %s\n", id_width, "ID", "STATE", "DATA ADDRESS",
              "DEVICE", "GFLOP/s", "BUILD", job_width, "JOB", "DOING");
  for (const v1::Worker& w : workers) {
    // The GPU's name, or "cpu" for a worker computing on its CPU.
    const std::string device = w.device().gpu_model().empty() ? "cpu" : w.device().gpu_model();
    const std::string doing = WorkerDoing(w);
    // The commit it was built from (--json has the version too); "none"
    // for a worker older than RegisterWorkerRequest.build.
    const std::string build = !w.has_build()               ? "none"
                              : w.build().commit().empty() ? "unknown"
                                                           : w.build().commit();
    // What a worker sent (its address, device name, build and instruction)
    // is printed inert: a join-token holder's escape sequences would act
    // on the operator's terminal.
    std::printf("%-*s %-9s %-22s %-24s %8.0f %-12s %-*s %s\n", id_width, w.id().c_str(),
                EnumShortName(w.state()).c_str(), TerminalSafe(w.data_address()).c_str(),
                TerminalSafe(device).c_str(), w.device().measured_gflops(),
                TerminalSafe(build).c_str(), job_width, w.job_id().c_str(),
                TerminalSafe(doing).c_str());
  }
  return kExitOk;
}

std::string WorkerDoing(const v1::Worker& worker) {
  const std::string& last = worker.current_instruction();
  if (worker.state() == v1::WORKER_STATE_LOST || worker.state() == v1::WORKER_STATE_LEFT) {
    const char* gone = worker.state() == v1::WORKER_STATE_LOST ? "lost" : "left";
    // What it was doing when it went; "idle" (no job) says nothing more.
    return last.empty() || last == "idle" ? gone : absl::StrCat(gone, "; last: ", last);
  }
  return worker.drained() ? absl::StrCat("drained; ", last) : last;
}

std::vector<FlagSet::Info> UpFlagInfo() { return Describe(UpFlags); }
std::vector<FlagSet::Info> SubmitFlagInfo() { return Describe(SubmitFlags); }
std::vector<FlagSet::Info> JobsFlagInfo() { return Describe(JobsFlags); }
std::vector<FlagSet::Info> JobFlagInfo() { return Describe(JobFlags); }
std::vector<FlagSet::Info> CancelFlagInfo() { return Describe(CancelFlags); }
std::vector<FlagSet::Info> DrainFlagInfo() { return Describe(DrainFlags); }
std::vector<FlagSet::Info> WorkersFlagInfo() { return Describe(WorkersFlags); }

}  // namespace pipetrain
