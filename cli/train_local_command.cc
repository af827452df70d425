#include "cli/train_local_command.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/exit_codes.h"
#include "cli/flag_names.h"
#include "cli/output_paths.h"
#include "cli/progress.h"
#include "common/errno_status.h"
#include "common/flag_set.h"
#include "common/signal_names.h"
#include "common/status_macros.h"
#include "kernels/cpu/blas.h"
#include "nlohmann/json.hpp"
#include "spec/job_spec.h"
#include "worker/agent/device_info.h"
#include "worker/data/corpus.h"
#include "worker/model/backend_select.h"
#include "worker/model/gpt_config.h"
#include "worker/model/weights_io.h"
#include "worker/train/checkpoint.h"
#include "worker/train/divergence.h"
#include "worker/train/local_trainer.h"
#include "worker/train/lr_schedule.h"

namespace pipetrain {
namespace {

// SIGINT (Ctrl-C), SIGTERM (a supervisor, a preempted batch job) or SIGHUP
// (its terminal gone; not when ignored, as under nohup): the run stops
// after its current step and still writes --checkpoint (if it trained a
// step), then exits 128 + the signal, as a shell reports one (130, 143,
// 129). 0: none came.
// Before the first step it stops at once, exiting the same way, nothing
// written: the corpus loader asks g_stopping between reads, and the set-up
// asks before building the model, before --init-from and after it (a read
// under way finishes first). One that resumed goes on to write --save (the
// checkpoint's weights), as documented for a run stopped before its first
// step.
// A further SIGINT or SIGTERM ends the process at once, by that signal's default
// action (128 + it), as a further signal ends the coordinator's shutdown:
// a run held after the first (a stdout nobody reads, storage that stopped
// answering) gave way to SIGKILL alone. A checkpoint it was writing is
// left as a temporary, which the next run removes.
std::atomic<int> g_signal{0};
std::atomic<bool> g_stopping{false};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free,
              "set in a signal handler");
extern "C" void OnStopSignal(int signal) {
  // Not a further SIGHUP: a lost session delivers it twice within
  // milliseconds (the shell's, then the kernel's to the foreground group),
  // and the hang-up must still get its checkpoint.
  if (g_stopping.load() && signal != SIGHUP) {
    // sigaction and raise are async-signal-safe; the signal, blocked while
    // its handler runs, is taken once this returns.
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    sigaction(signal, &default_action, nullptr);
    raise(signal);
    return;
  }
  g_signal.store(signal);
  g_stopping.store(true);
}

// Installs OnStopSignal for `signal`. SA_RESTART, as std::signal did: a
// read under way in the set-up goes on, and is stopped after.
void CatchStopSignal(int signal) {
  struct sigaction action {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(signal, &action, nullptr);
}

// CANCELLED once a stop signal came: between the set-up's phases, which
// may each take minutes on a large model or slow storage.
absl::Status StopBefore(const char* what) {
  if (!g_stopping.load()) return absl::OkStatus();
  return absl::CancelledError(absl::StrCat("interrupted before ", what));
}

struct Options {
  TrainConfig train;
  std::string data, format = "auto", decay = "matrices";
  std::string lr_schedule = "constant";
  int64_t synthetic_bytes = 2'000'000;
  bool synthetic_bytes_given = false;  // on the command line
  double val_fraction = 0.1;
  int block_size = 0;  // 0: same as seq_len
  std::string init_from, resume, save, checkpoint, log;
  std::string device = "cpu", gemm = "fp32", attention = "auto";
  int64_t checkpoint_interval = 0;
  // The --log FIFO's write end (-1: --log is no FIFO), opened by
  // RunTrainLocal with the flags' checks, so that one nobody reads is
  // refused before any work (exit 2). Held until Train's LogOutput takes
  // it: closed and opened again, it would end a reader such as `cat` (it
  // reads EOF). RunTrainLocal closes one that Run left.
  int log_fifo = -1;
  // Set by Run: whether it wrote --checkpoint at the end (for the
  // interrupted run's last words).
  bool checkpoint_written = false;
};

void BindFlags(FlagSet& f, Options& o) {
  TrainConfig& t = o.train;
  f.String("data", &o.data, "training corpus; empty = generated English text");
  f.String("format", &o.format, "auto | text | uint16 | uint16-header");
  f.Int64("synthetic-bytes", &o.synthetic_bytes, "size of the generated corpus");
  f.Double("val-fraction", &o.val_fraction, "share of tokens held out for validation");
  f.Int("vocab", &t.model.vocab_size, "vocabulary size (256 for bytes)");
  f.Int("layers", &t.model.n_layer, "transformer blocks");
  f.Int("heads", &t.model.n_head, "attention heads (must divide d-model)");
  f.Int("d-model", &t.model.d_model, "embedding width");
  f.Int("seq-len", &t.seq_len, "tokens per training sequence");
  f.Int("block-size", &o.block_size, "position-embedding rows; 0 = seq-len");
  f.Int("batch", &t.batch_size, "sequences per optimizer step");
  f.Int("micro-batches", &t.micro_batches, "gradient-accumulation micro-batches per step");
  f.Int64("steps", &t.steps, "train until this many optimizer steps are done");
  f.Float("lr", &t.adam.lr, "AdamW learning rate");
  f.Float("beta1", &t.adam.beta1, "AdamW beta1");
  f.Float("beta2", &t.adam.beta2, "AdamW beta2");
  f.Float("eps", &t.adam.eps, "AdamW epsilon");
  f.Float("weight-decay", &t.adam.weight_decay, "AdamW decoupled weight decay");
  f.String("decay", &o.decay, "weight decay applies to: matrices | all");
  f.Float("grad-clip", &t.grad_clip, "clip gradients to this global L2 norm; 0 = off");
  f.String(
      "lr-schedule", &o.lr_schedule,
      "constant | cosine (from --lr after warm-up towards --min-lr, which the step after the last "
      "would reach)");
  f.Int64("warmup-steps", &t.warmup_steps, "linear learning-rate warm-up steps");
  f.Float("min-lr", &t.min_lr, "the cosine schedule's floor");
  f.Uint64("seed", &t.seed, "seed for initialisation and data order");
  f.Int("eval-interval", &t.eval_interval,
        "validate every N steps and at the end; 0 = only at the end (with --val-fraction > 0)");
  f.Int("eval-windows", &t.eval_windows, "validation windows per evaluation");
  f.Int("threads", &t.threads, "OpenBLAS threads (fixed count = reproducible)");
  f.String("device", &o.device,
           "cpu | cuda | cuda:N | auto (CUDA when built with it and a GPU is visible)");
  f.String("gemm", &o.gemm, "GEMM mode on CUDA: fp32 | tf32 | bf16");
  f.String("attention", &o.attention, kAttentionFlagHelp);
  f.String("init-from", &o.init_from, "start from these safetensors weights (HF GPT-2 names)");
  f.String("resume", &o.resume, "continue from this training checkpoint");
  f.String("save", &o.save, "write final weights here (safetensors)");
  f.String("checkpoint", &o.checkpoint,
           "write a training checkpoint here at the end (left as it was if no step was trained)");
  f.Int64("checkpoint-interval", &o.checkpoint_interval, "also checkpoint every N steps");
  f.String("log", &o.log, "append one JSON line per step here");
}

// The job spec's bounds (spec/job_spec.h, docs/operations.md "Bounds"), so that
// what a job may not ask for train-local refuses too, naming its flag,
// instead of failing an allocation (a CHECK) once the model is built.
absl::Status CheckBounds(const Options& o) {
  const TrainConfig& t = o.train;
  const struct {
    const char* flag;
    int64_t value, limit;
  } bounds[] = {
      {"--layers", t.model.n_layer, kMaxLayers},
      {"--heads", t.model.n_head, kMaxHeads},
      {"--d-model", t.model.d_model, kMaxDModel},
      {"--vocab", t.model.vocab_size, kMaxVocabSize},
      {"--seq-len", t.seq_len, kMaxTrainingSeqLen},
      {"--block-size", o.block_size, kMaxSeqLen},
      {"--batch", t.batch_size, kMaxBatchSize},
      {"--micro-batches", t.micro_batches, kMaxMicroBatches},
      {"--steps", t.steps, kMaxSteps},
      {"--eval-interval", t.eval_interval, kMaxSteps},
      {"--eval-windows", t.eval_windows, kMaxEvalWindows},
      {"--synthetic-bytes", o.synthetic_bytes, kMaxSyntheticBytes},
  };
  for (const auto& b : bounds) {
    if (b.value > b.limit) {
      return absl::InvalidArgumentError(
          absl::StrCat(b.flag, " ", b.value, " is over the limit of ", b.limit));
    }
  }
  if (t.grad_clip > kMaxGradClip) {  // NaN and negatives: ValidateTrainConfig
    return absl::InvalidArgumentError(
        absl::StrCat("--grad-clip ", t.grad_clip, " is over the limit of ", kMaxGradClip));
  }
  if (int64_t{t.batch_size} * t.seq_len > kMaxTokensPerStep) {
    return absl::InvalidArgumentError(
        absl::StrCat("--batch x --seq-len is ", int64_t{t.batch_size} * t.seq_len,
                     " tokens a step, over the limit of ", kMaxTokensPerStep));
  }
  return absl::OkStatus();
}

// The TrainConfig fields ValidateTrainConfig names, by the flags that set
// them (NameFlags). max_seq_len is --block-size, or --seq-len without it.
constexpr std::pair<absl::string_view, absl::string_view> kTrainLocalFlagNames[] = {
    {"vocab_size", "--vocab"},
    {"max_seq_len", "--block-size"},
    {"n_layer", "--layers"},
    {"n_head", "--heads"},
    {"d_model", "--d-model"},
    {"seq_len", "--seq-len"},
    {"batch_size", "--batch"},
    {"micro_batches", "--micro-batches"},
    {"steps", "--steps"},
    {"lr", "--lr"},
    {"beta1", "--beta1"},
    {"beta2", "--beta2"},
    {"eps", "--eps"},
    {"weight_decay", "--weight-decay"},
    {"eval_interval", "--eval-interval"},
    {"eval_windows", "--eval-windows"},
    {"threads", "--threads"},
    {"grad_clip", "--grad-clip"},
    {"warmup_steps", "--warmup-steps"},
    {"min_lr", "--min-lr"},
};

// On the CPU (a GPU's memory is its own, and its allocations fail as
// errors), a run past what this process may use aborted on its first
// failed allocation (or was killed by the kernel, silently) once its data
// was read: refused first, the weights alone and then with one
// micro-batch's activations kept for its backward, which grow with --batch
// / --micro-batches and --seq-len squared. The CPU is --device cpu, or auto
// where no CUDA device is visible (SelectBackend).
absl::Status CheckFitsMemory(const Options& o) {
  // A CUDA runtime that cannot count its devices is not "no GPU" (auto
  // would not be the CPU): SelectBackend reports its error.
  if (o.device != "cpu" && !(o.device == "auto" && CudaDevicesOrError().value_or(-1) == 0)) {
    return absl::OkStatus();
  }
  const int64_t limit = ProcessMemoryLimit();
  RETURN_IF_ERROR(NameFlags(CheckWeightsFitMemory(o.train.model, limit), kTrainLocalFlagNames));
  return NameFlags(CheckActivationsFitMemory(o.train, limit), kTrainLocalFlagNames);
}

// Flag combinations that a type check cannot catch.
absl::Status Resolve(Options& o) {
  RETURN_IF_ERROR(CheckBounds(o));
  // Checked here because seq-len also sizes max_seq_len below, whose own
  // message would name a field the user never set.
  if (o.train.seq_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--seq-len must be >= 1, got ", o.train.seq_len));
  }
  o.train.model.max_seq_len = o.block_size > 0 ? o.block_size : o.train.seq_len;
  if (o.block_size < 0) return absl::InvalidArgumentError("--block-size must be >= 0");
  RETURN_IF_ERROR(ParseDecayPolicy(o.decay, &o.train.decay));
  RETURN_IF_ERROR(ParseLrSchedule("--lr-schedule", o.lr_schedule, &o.train.lr_schedule));
  // The floor of a cosine decay: with the constant schedule it was
  // silently ignored, the run at --lr throughout.
  if (o.train.min_lr > 0 && o.train.lr_schedule != LrSchedule::kCosine) {
    return absl::InvalidArgumentError(
        "--min-lr is the cosine schedule's floor, and has no effect with --lr-schedule constant; "
        "add --lr-schedule cosine or leave it out");
  }
  // auto is the CPU where no CUDA device is visible: GPU-only modes are a
  // flag combination this host refuses, exit 2 before any work, as `up` and
  // the worker refuse them (SelectBackend would refuse them only once the
  // data was read, with exit 1).
  RETURN_IF_ERROR(ValidateDeviceFlagsHere(o.device, o.gemm, o.attention));
  // --device cuda or cuda:N this process cannot use: refused here (exit 2),
  // as `up` refuses its --worker-device, not by SelectBackend (exit 1).
  RETURN_IF_ERROR(
      CheckCudaDeviceVisible(o.device, "--device", BuiltWithCuda(), CudaDevicesOrError()));
  RETURN_IF_ERROR(ParseDataFormat(o.format).status());
  if (!(o.val_fraction >= 0 && o.val_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--val-fraction must be in [0, 1), got ", o.val_fraction));
  }
  if (o.train.eval_interval > 0 && o.val_fraction == 0) {
    return absl::InvalidArgumentError("--eval-interval needs --val-fraction > 0");
  }
  if (o.data.empty() && o.synthetic_bytes < 1) {
    return absl::InvalidArgumentError("--synthetic-bytes must be >= 1");
  }
  // Each sizes or reads one source of tokens: given with the other, it was
  // silently ignored.
  if (!o.data.empty() && o.synthetic_bytes_given) {
    return absl::InvalidArgumentError(
        "--synthetic-bytes sizes generated text, and has no effect with --data; leave it out");
  }
  if (o.data.empty() && (o.format == "uint16" || o.format == "uint16-header")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--format ", o.format, " reads a --data file; without --data the text is generated"));
  }
  if (o.checkpoint_interval < 0 || (o.checkpoint_interval > 0 && o.checkpoint.empty())) {
    return absl::InvalidArgumentError("--checkpoint-interval needs --checkpoint PATH and >= 0");
  }
  if (!o.init_from.empty() && !o.resume.empty()) {
    return absl::InvalidArgumentError("use either --init-from or --resume, not both");
  }
  if (o.data.empty() && o.train.model.vocab_size < 256) {
    return absl::InvalidArgumentError("generated text is byte-level: --vocab must be >= 256");
  }
  RETURN_IF_ERROR(NameFlags(ValidateTrainConfig(o.train), kTrainLocalFlagNames));
  if (CountParameters(o.train.model) > kMaxParameters) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model has ", CountParameters(o.train.model), " parameters, over the limit of ",
        kMaxParameters, "; use fewer --layers or a smaller --d-model or --vocab"));
  }
  RETURN_IF_ERROR(CheckFitsMemory(o));
  RETURN_IF_ERROR(CheckWritableParent("--save", o.save));
  RETURN_IF_ERROR(CheckWritableParent("--checkpoint", o.checkpoint));
  RETURN_IF_ERROR(CheckWritableParent("--log", o.log, "", OutputWrite::kAppended));
  // Renamed into place: a device there would be replaced (as root,
  // /dev/null itself).
  RETURN_IF_ERROR(CheckReplaceableFile("--save", o.save));
  RETURN_IF_ERROR(CheckReplaceableFile("--checkpoint", o.checkpoint));
  RETURN_IF_ERROR(
      CheckDistinctOutputs({{"--save", o.save}, {"--checkpoint", o.checkpoint}, {"--log", o.log}}));
  // (--checkpoint may be --resume's file: a resumed run checkpoints on.)
  const std::vector<std::pair<const char*, std::string>> inputs = {
      {"--data", o.data}, {"--init-from", o.init_from}, {"--resume", o.resume}};
  RETURN_IF_ERROR(CheckNotAnInput("--save", o.save, inputs));
  RETURN_IF_ERROR(CheckNotAnInput("--log", o.log, inputs));
  return CheckNotAnInput("--checkpoint", o.checkpoint,
                         {{"--data", o.data}, {"--init-from", o.init_from}});
}

absl::StatusOr<Dataset> LoadData(const Options& o) {
  ASSIGN_OR_RETURN(DataFormat format, ParseDataFormat(o.format));
  CorpusSpec corpus{o.data, format, o.train.model.vocab_size, o.synthetic_bytes, o.train.seed};
  corpus.stop = &g_stopping;
  // A file (or generated text) past a third of what this process may use is
  // refused before its buffer is allocated, as a worker refuses it: text
  // peaks at 3x its size while it is tokenized, and a failed allocation
  // would end the process with no word on why (or the kernel would kill it).
  const int64_t memory = ProcessMemoryLimit();
  corpus.max_bytes = memory / 3;
  absl::StatusOr<std::vector<uint16_t>> loaded = LoadCorpus(corpus);
  if (loaded.status().code() == absl::StatusCode::kResourceExhausted) {
    return absl::ResourceExhaustedError(
        absl::StrCat(loaded.status().message(), " (a third of this process's memory limit of ",
                     memory, " bytes: RAM, or its cgroup's limit)"));
  }
  ASSIGN_OR_RETURN(std::vector<uint16_t> tokens, std::move(loaded));
  std::fprintf(stderr, "data: %s\n", DescribeCorpus(corpus, tokens.size()).c_str());
  absl::StatusOr<Dataset> dataset =
      Dataset::Create(std::move(tokens), o.train.seq_len, o.val_fraction);
  if (!dataset.ok() && !o.data.empty()) {  // messages about data start with its path
    return absl::Status(dataset.status().code(),
                        absl::StrCat(o.data, ": ", dataset.status().message()));
  }
  return dataset;
}

// INTERNAL "cannot write the --log file PATH (why)", the cause (a full
// disk, a reader gone) from write(2)'s `error`, when it set one.
absl::Status LogWriteError(const std::string& path, int error) {
  return absl::InternalError(
      absl::StrCat("cannot write the --log file ", path,
                   error != 0 ? absl::StrCat(" (", strerror(error), ")") : std::string()));
}

// Flushes what was written to the --log file since errno was cleared.
absl::Status FlushLog(std::ofstream& log, const std::string& path) {
  log.flush();
  return log ? absl::OkStatus() : LogWriteError(path, errno);
}

// One --log record: a JSON line.
std::string LogRecord(const StepResult& r, std::optional<float> val, double tokens_per_second) {
  nlohmann::json line = {{"step", r.step},
                         {"loss", r.loss},
                         {"val_loss", val.has_value() ? nlohmann::json(*val) : nullptr},
                         {"tokens_per_second", tokens_per_second}};
  return line.dump() + "\n";
}

// Whether `path` is a regular file whose last line has no newline: a run
// stopped by a full disk can leave part of a record (write(2) may store
// some of a buffer before ENOSPC). False for a FIFO or device, which are
// not opened here, and for a file this process cannot read.
bool LastLineTorn(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode) || info.st_size == 0) return false;
  // O_NONBLOCK: a FIFO put there since the stat must not hold the open.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  char last = '\n';
  const bool got = pread(fd, &last, 1, info.st_size - 1) == 1;
  close(fd);
  return got && last != '\n';
}

// The --log output, appended to. A FIFO or pipe (`--log >(plot)`, `cat
// fifo &`) is written through a non-blocking write end as its reader takes
// the text: a blocking write to a reader that stopped reading waited for
// ever, past SIGINT and SIGTERM (their handler only sets a flag, and the
// write is restarted), and --checkpoint was never written. Anything else
// (a file, a device) through a stream. Not thread-safe.
class LogOutput {
 public:
  LogOutput() = default;
  LogOutput(const LogOutput&) = delete;
  LogOutput& operator=(const LogOutput&) = delete;
  ~LogOutput() {
    if (fifo_ >= 0) close(fifo_);
  }

  // Opens `path` (OpenFifoWriteEnd's errors for a FIFO nobody reads; the
  // open's errno's code otherwise, e.g. a missing directory NOT_FOUND), or
  // takes `fifo` (>= 0), the write end of the FIFO `path` that
  // OpenFifoWriteEnd opened before, which it then owns.
  // Ends a torn last line of a regular file (LastLineTorn): a resumed run's
  // first record glued to it would make one unparsable line of both.
  absl::Status Open(const std::string& path, int fifo = -1);
  bool is_open() const { return fifo_ >= 0 || file_.is_open(); }
  // Appends `text`: LogWriteError's INTERNAL when a file cannot be
  // written, WriteToFifo's errors for a FIFO: CANCELLED when a stop signal
  // came (g_stopping) while its reader took nothing; the reader then has
  // none of a record shorter than PIPE_BUF (a record is), written at once
  // or not at all.
  absl::Status Append(const std::string& text);

 private:
  std::string path_;
  int fifo_ = -1;  // a FIFO's write end, non-blocking; -1: file_ instead
  std::ofstream file_;
};

absl::Status LogOutput::Open(const std::string& path, int fifo) {
  path_ = path;
  fifo_ = fifo;
  if (fifo_ < 0) {
    ASSIGN_OR_RETURN(fifo_, OpenFifoWriteEnd("--log", path));
  }
  if (fifo_ >= 0) {
    // OpenFifoWriteEnd's is blocking: WriteToFifo waits for room itself.
    const int flags = fcntl(fifo_, F_GETFL);
    if (flags < 0 || fcntl(fifo_, F_SETFL, flags | O_NONBLOCK) != 0) {
      const int error = errno;
      return absl::ErrnoToStatus(error, absl::StrCat("cannot open --log file ", path));
    }
    return absl::OkStatus();
  }
  errno = 0;
  file_.open(path, std::ios::app);
  if (const int error = errno; !file_) {
    // Its errno's code (a read-only directory PERMISSION_DENIED), not
    // NOT_FOUND whatever the cause.
    return absl::ErrnoToStatus(error != 0 ? error : ENOENT,
                               absl::StrCat("cannot open --log file ", path));
  }
  if (!LastLineTorn(path)) return absl::OkStatus();
  errno = 0;
  file_ << "\n";
  return FlushLog(file_, path);
}

absl::Status LogOutput::Append(const std::string& text) {
  if (fifo_ >= 0) return WriteToFifo(fifo_, path_, text, [] { return g_stopping.load(); });
  errno = 0;
  file_ << text;
  return FlushLog(file_, path_);
}

// Trains to config.steps (or until SIGINT, or until the --log file or a
// --checkpoint-interval checkpoint cannot be written: `output_failed` says
// why then, and the run stops as an interrupt does, its checkpoint and
// weights still written). Returns the validation
// loss of the last step taken when that step evaluated, so it is not
// computed twice. `*checkpoint_saved_at`: the step of the last
// --checkpoint-interval write that succeeded (-1: none), which the final
// write need not repeat.
absl::StatusOr<std::optional<float>> Train(Options& o, LocalTrainer& trainer,
                                           absl::Status* output_failed,
                                           int64_t* checkpoint_saved_at) {
  *checkpoint_saved_at = -1;
  LogOutput log;
  if (!o.log.empty()) RETURN_IF_ERROR(log.Open(o.log, std::exchange(o.log_fifo, -1)));
  const TrainConfig& c = trainer.config();
  const int64_t tokens_per_step = int64_t{c.batch_size} * c.seq_len;
  const int64_t first_step = trainer.step();
  ProgressReporter progress(stderr, isatty(STDERR_FILENO));
  const auto start = std::chrono::steady_clock::now();
  std::optional<float> last_val;
  while (trainer.step() < c.steps && g_signal.load() == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(const StepResult r, trainer.Step());
    const auto t1 = std::chrono::steady_clock::now();
    // A diverged run stops (the same check the coordinator makes of jobs).
    if (absl::Status finite = CheckLossFinite(r.step, r.loss); !finite.ok()) {
      progress.Finish();
      return finite;
    }
    const double step_seconds = std::chrono::duration<double>(t1 - t0).count();
    std::optional<float> val;
    // Not once told to stop: a validation pass of a large model runs for
    // tens of seconds, past a scheduler's grace before its SIGKILL.
    if (c.eval_interval > 0 && g_signal.load() == 0 &&
        (r.step % c.eval_interval == 0 || r.step == c.steps)) {
      ASSIGN_OR_RETURN(val, trainer.Evaluate());
      // As the coordinator checks a job's: a NaN validation loss is a
      // diverged model (written to --log it read as null, "not evaluated").
      if (val.has_value()) {
        if (absl::Status finite = CheckLossFinite(r.step, *val); !finite.ok()) {
          progress.Finish();
          return absl::Status(finite.code(),
                              absl::StrCat("the validation loss: ", finite.message()));
        }
      }
    }
    const double elapsed = std::chrono::duration<double>(t1 - start).count();
    const double per_step = elapsed / (r.step - first_step);
    const double tps = tokens_per_step / step_seconds;
    progress.Update({r.step, c.steps, r.loss, val, tps, per_step * (c.steps - r.step)});
    last_val = val;
    if (log.is_open()) {
      absl::Status logged = log.Append(LogRecord(r, val, tps));
      // A signal came while the FIFO's reader took nothing: the record is
      // dropped, and the run stops after this step (the loop's test), as
      // asked, with its checkpoint.
      if (absl::IsCancelled(logged)) {
        progress.Message(absl::StrCat("--log ", o.log, ": the record of step ", r.step,
                                      " dropped on stopping (", logged.message(), ")"));
      } else if (!logged.ok()) {
        // Its reader gone (`--log >(head)`, a killed `cat fifo`) or its
        // disk full: hours of training since the last checkpoint must not
        // be lost with it.
        *output_failed = absl::Status(
            logged.code(), absl::StrCat(logged.message(), " at step ", r.step,
                                        "; training stopped there, as an interrupt would"));
        break;
      }
    }
    if (o.checkpoint_interval > 0 && r.step % o.checkpoint_interval == 0) {
      // Diverged weights (told by `diverged`: a write's EBUSY or EISDIR is
      // FAILED_PRECONDITION too) or a failed device end the run with no
      // output. A write that failed (a full disk, an I/O error) stops it
      // there, as a --log that fails does: --save, perhaps on another
      // disk, must not be lost with it.
      bool diverged = false;
      absl::Status saved = SaveCheckpoint(o.checkpoint, trainer, &diverged);
      if (diverged) return saved;
      RETURN_IF_ERROR(trainer.model().backend()->status());
      if (saved.ok()) *checkpoint_saved_at = r.step;
      if (!saved.ok()) {
        *output_failed = absl::Status(
            saved.code(), absl::StrCat(saved.message(), " at step ", r.step,
                                       "; training stopped there, as an interrupt would"));
        break;
      }
    }
  }
  progress.Finish();
  // As a job's last step (worker/agent/job_runner.cc): the last loss was
  // finite, but its update may have broken the weights; none are saved then.
  if (trainer.step() > first_step) {
    GptModel& model = trainer.model();
    const std::vector<Parameter> host = HostParameterCopies(model.backend(), model.parameters());
    RETURN_IF_ERROR(model.backend()->status());
    RETURN_IF_ERROR(CheckWeightsAfterStep(trainer.step(), CheckParametersFinite(host)));
  }
  return last_val;
}

// --init-from on any backend: read into host copies, then copy over.
absl::Status InitFrom(const std::string& path, GptModel& model) {
  std::vector<Parameter> host = HostParameterCopies(model.backend(), model.parameters());
  RETURN_IF_ERROR(LoadWeights(path, ParameterPointers(host)));
  for (size_t i = 0; i < host.size(); ++i) {
    Parameter* p = model.parameters()[i];
    if (p->value.on_device()) model.backend()->CopyFromHost(host[i].value, &p->value);
  }
  return model.backend()->status();
}

absl::Status SaveFinalWeights(const std::string& path, GptModel& model) {
  std::vector<Parameter> host = HostParameterCopies(model.backend(), model.parameters());
  RETURN_IF_ERROR(model.backend()->status());
  return SaveWeights(path, ParameterPointers(host), HfWeightsMetadata());
}

absl::Status Run(Options& o) {
  SetBlasThreads(o.train.threads);
  ASSIGN_OR_RETURN(SelectedBackend backend, SelectBackend(o.device, o.gemm, o.attention));
  // (Resolve refused a run past the CPU's memory: CheckFitsMemory.)
  ASSIGN_OR_RETURN(Dataset dataset, LoadData(o));
  // A run killed while writing one (SIGKILL past a scheduler's grace
  // period, the OOM killer) left a temporary beside it, up to three times
  // the model's size for --checkpoint (weights and both AdamW moments),
  // its size for --save: removed before this run writes there.
  for (const std::string* out : {&o.checkpoint, &o.save}) {
    for (const std::string& removed : RemoveAbandonedTemporariesOf(*out)) {
      std::fprintf(stderr, "removed %s, left by a run killed while writing %s\n", removed.c_str(),
                   out->c_str());
    }
  }
  RETURN_IF_ERROR(StopBefore("building the model"));
  ASSIGN_OR_RETURN(std::unique_ptr<LocalTrainer> trainer,
                   LocalTrainer::Create(o.train, &dataset, backend.backend));
  RETURN_IF_ERROR(StopBefore("loading weights"));
  if (!o.init_from.empty()) {
    RETURN_IF_ERROR(InitFrom(o.init_from, trainer->model()));
    std::fprintf(stderr, "initialised from %s (%zu tensors)\n", o.init_from.c_str(),
                 trainer->model().parameters().size());
    RETURN_IF_ERROR(StopBefore("training"));
  }
  if (!o.resume.empty()) {
    std::vector<std::string> changes;
    RETURN_IF_ERROR(RestoreCheckpoint(o.resume, trainer.get(), &changes));
    std::fprintf(stderr, "resumed from %s at step %lld\n", o.resume.c_str(),
                 static_cast<long long>(trainer->step()));
    if (!changes.empty()) {
      std::fprintf(stderr,
                   "warning: this run's updates differ from the checkpoint's run: %s; the steps "
                   "from here are not the uninterrupted run's\n",
                   absl::StrJoin(changes, ", ").c_str());
    }
    if (trainer->step() >= o.train.steps) {
      std::fprintf(stderr,
                   "nothing to train: the checkpoint is at step %lld, and --steps %lld counts "
                   "from the start (ask for more steps to go on)\n",
                   static_cast<long long>(trainer->step()), static_cast<long long>(o.train.steps));
    }
  }
  std::fprintf(stderr,
               "model: %d layers, %d heads, d_model %d, vocab %d, %lld parameters; "
               "batch %d x %d tokens in %d micro-batches; device %s; BLAS %s x%d\n",
               o.train.model.n_layer, o.train.model.n_head, o.train.model.d_model,
               o.train.model.vocab_size, static_cast<long long>(trainer->model().num_parameters()),
               o.train.batch_size, o.train.seq_len, o.train.micro_batches,
               backend.backend->Describe().c_str(), BlasCoreName().c_str(), BlasThreads());
  absl::Status output_failed = absl::OkStatus();
  const int64_t first_step = trainer->step();
  int64_t checkpoint_saved_at = -1;
  absl::StatusOr<std::optional<float>> trained =
      Train(o, *trainer, &output_failed, &checkpoint_saved_at);
  // A run that trained no step (stopped before its first, or resumed at
  // --steps already) leaves --checkpoint as it is: it would be the resumed
  // checkpoint again under this run's settings, or an untrained model over
  // a file that may hold an earlier run. --save too, unless it resumed
  // (then it exports the checkpoint's weights).
  const bool trained_a_step = trainer->step() > first_step;
  const bool write_checkpoint = !o.checkpoint.empty() && trained_a_step;
  const bool write_save = !o.save.empty() && (trained_a_step || !o.resume.empty());
  if (!o.checkpoint.empty() && !write_checkpoint) {
    std::fprintf(stderr, "no step trained in this run: --checkpoint %s left as it was\n",
                 o.checkpoint.c_str());
  }
  if (!o.save.empty() && !write_save) {
    std::fprintf(stderr, "no step trained in this run: --save %s not written\n", o.save.c_str());
  }
  // Write what was asked for even after an interrupt: nothing is lost. Not
  // after a failure (a diverged run's weights would overwrite the last good
  // --checkpoint-interval one).
  // Both are attempted even if the other fails (the first error is
  // returned): one bad output must not lose the other. The checkpoint
  // again after an interval's write failed: the trouble may have passed.
  absl::Status saved_checkpoint = absl::OkStatus(), saved_weights = absl::OkStatus();
  // Not again when the last step's interval write holds it already (the
  // same bytes: gigabytes, hashed and synced, twice).
  if (write_checkpoint && trained.ok()) {
    if (checkpoint_saved_at != trainer->step()) {
      saved_checkpoint = SaveCheckpoint(o.checkpoint, *trainer);
    }
    o.checkpoint_written = saved_checkpoint.ok();
  }
  RETURN_IF_ERROR(trained.status());
  if (write_save) saved_weights = SaveFinalWeights(o.save, trainer->model());
  if (output_failed.ok()) {
    RETURN_IF_ERROR(saved_checkpoint);
    RETURN_IF_ERROR(saved_weights);
  } else {
    // What stopped the run, then the outputs written all the same, and
    // any that failed too.
    std::vector<std::string> written;
    std::string also;
    for (const auto& [flag, asked, status] :
         {std::make_tuple("--checkpoint", write_checkpoint, saved_checkpoint),
          std::make_tuple("--save", write_save, saved_weights)}) {
      if (!asked) continue;
      if (status.ok()) {
        written.push_back(flag);
      } else {
        absl::StrAppend(&also, "; ", flag, " not written either: ", status.message());
      }
    }
    return absl::Status(
        output_failed.code(),
        absl::StrCat(output_failed.message(),
                     written.empty()
                         ? ""
                         : absl::StrCat(" (", absl::StrJoin(written, " and "),
                                        written.size() == 1 ? " is" : " are", " written)"),
                     also));
  }
  std::printf("final: step %lld", static_cast<long long>(trainer->step()));
  std::optional<float> val = *trained;
  // Not once interrupted: a validation pass of a large model runs for tens
  // of seconds after the Ctrl-C that asked to stop.
  if (!val.has_value() && dataset.num_val_windows() > 0 && g_signal.load() == 0) {
    ASSIGN_OR_RETURN(val, trainer->Evaluate());
  }
  if (val.has_value()) std::printf(" val_loss %.4f", *val);
  std::printf("%s%s%s%s\n", write_save ? " weights " : "", write_save ? o.save.c_str() : "",
              write_checkpoint ? " checkpoint " : "", write_checkpoint ? o.checkpoint.c_str() : "");
  if (const std::string paths = backend.backend->PathsTaken(); !paths.empty()) {
    std::fprintf(stderr, "device paths: %s\n", paths.c_str());
  }
  return absl::OkStatus();
}

FlagSet TrainLocalFlags(Options& options) {
  FlagSet flags(
      "usage: pipetrain train-local [flags]\n"
      "Trains a GPT-2 model in this process (the reference for pipeline runs).");
  BindFlags(flags, options);
  return flags;
}

}  // namespace

std::vector<FlagSet::Info> TrainLocalFlagInfo() {
  Options options;
  return TrainLocalFlags(options).Describe();
}

int RunTrainLocal(const std::vector<std::string>& args) {
  Options options;
  FlagSet flags = TrainLocalFlags(options);
  absl::Status parsed = flags.Parse(args);
  if (flags.help_requested()) {
    std::printf("%s", flags.Usage().c_str());
    return 0;
  }
  options.synthetic_bytes_given = flags.IsSet("synthetic-bytes");
  if (parsed.ok()) parsed = Resolve(options);
  // A --log FIFO nobody reads, refused with the other outputs' checks
  // (Train would refuse it only once the data, the model and any
  // --resume were loaded); one with a reader keeps this write end.
  if (parsed.ok()) {
    absl::StatusOr<int> fifo = OpenFifoWriteEnd("--log", options.log);
    if (fifo.ok()) options.log_fifo = *fifo;
    parsed = fifo.status();
  }
  if (!parsed.ok()) {
    std::fprintf(stderr, "pipetrain train-local: %s\n", std::string(parsed.message()).c_str());
    return 2;
  }
  CatchStopSignal(SIGINT);
  CatchStopSignal(SIGTERM);
  // A terminal's hangup (an ssh session lost) stops it as Ctrl-C does,
  // with --checkpoint written; not under nohup, which keeps it ignored.
  if (struct sigaction hangup;
      sigaction(SIGHUP, nullptr, &hangup) == 0 && hangup.sa_handler != SIG_IGN) {
    CatchStopSignal(SIGHUP);
  }
  // A --log reader that went away fails the write (Train stops, and the
  // checkpoint is written) instead of killing the process mid-run.
  std::signal(SIGPIPE, SIG_IGN);
  absl::Status status = Run(options);
  if (options.log_fifo >= 0) close(options.log_fifo);  // Run failed before Train took it
  if (const int signal = g_signal.load(); signal != 0 && absl::IsCancelled(status)) {
    // Stopped while setting up: nothing trained, nothing to write.
    std::fprintf(stderr, "interrupted (%s): %s\n", ShutdownSignalName(signal),
                 std::string(status.message()).c_str());
    return kExitSignalBase + signal;
  }
  if (!status.ok()) {
    // Code and message only: a payload (an errno, for code) is no reading.
    std::fprintf(stderr, "pipetrain train-local: %s\n", StatusTextForUsers(status).c_str());
    return 1;
  }
  if (const int signal = g_signal.load(); signal != 0) {
    std::fprintf(stderr, "interrupted (%s)%s\n",
                 signal == SIGTERM  ? "SIGTERM"
                 : signal == SIGHUP ? "SIGHUP"
                                    : "SIGINT",
                 options.checkpoint_written ? "; checkpoint written" : "");
    return kExitSignalBase + signal;
  }
  return 0;
}

}  // namespace pipetrain
