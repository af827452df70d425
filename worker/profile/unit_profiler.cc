#include "worker/profile/unit_profiler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/device_kind.h"
#include "common/philox.h"
#include "common/status_macros.h"
#include "common/tensor.h"
#include "kernels/compress/codec_spec.h"
#include "nlohmann/json.hpp"
#include "spec/job_spec.h"
#include "worker/agent/device_info.h"
#include "worker/collectives/collectives.h"
#include "worker/collectives/powersgd_all_reduce.h"
#include "worker/data/dataset.h"
#include "worker/model/gpt_config.h"
#include "worker/model/unit.h"
#include "worker/train/adamw_optimizer.h"
#include "worker/train/train_config.h"
#include "worker/transport/in_process_transport.h"

namespace pipetrain {
namespace {

// Mixed into UniformIndex's `b` so the profiler's synthetic tokens never
// coincide with the training sampler's draws from the same seed.
constexpr uint32_t kProfileTokenPurpose = 0x50524631;  // "PRF1"
constexpr int64_t kBytesPerElement = 4;                // fp32 values, int32 token ids
// A job's bound (spec.model.n_layer), so that no profile is measured that
// no job or plan could use (the planner takes 2 * 256 + 2 units at most);
// and repetitions and warm-up runs far beyond any use (each repeats every
// unit's passes: a billion kept a profile running for ever).
constexpr int kMaxProfileLayers = kMaxLayers;
constexpr int kMaxProfileRuns = 1000;
constexpr int kDefaultVocabSize = 256;  // byte-level, as for a JobSpec

// A ProfileRequest with defaults applied, validated.
struct ResolvedRequest {
  GptConfig model;
  int seq_len = 0;
  int micro_batch_size = 0;
  int warmup = 0;
  int repetitions = 0;
  uint64_t seed = 0;
  std::vector<int> partitions;  // AccTFM micro-partition counts to time too
};

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("request.", field, ": ", why));
}

// Some kernel sizes are int, so no tensor a pass allocates may reach 2^31
// elements: parameters (a property of the model) and activations (which
// grow with the micro-batch) are checked apart to name the right field.
// Each unit is built and run whole (MakeUnit), so the bound is the whole
// unit's, not a tensor rank's share (T = 1): a job split over tensor ranks
// can pass ResolveJobSpec's per-rank bound and still be refused here, and
// the coordinator then plans it on the analytic profile (the message says
// so, as the plan's profile source quotes it).
absl::Status CheckTensorSizes(const ResolvedRequest& r) {
  const LargestTensors largest =
      LargestTensorElements(r.model, r.micro_batch_size, r.seq_len, /*tensor_parallel=*/1);
  if (largest.parameter > kMaxTensorElements) {
    return Invalid("model", absl::StrCat("a parameter tensor would hold ", largest.parameter,
                                         " elements, above 2^31 - 1; shrink d_model, "
                                         "vocab_size or max_seq_len"));
  }
  if (largest.activation > kMaxTensorElements) {
    return Invalid("micro_batch_size",
                   absl::StrFormat("%d sequences of %d tokens need a tensor of %.0f elements (the "
                                   "%s), above 2^31 - 1, in a unit profiled whole (no tensor "
                                   "rank's share: a job split over tensor ranks is planned on "
                                   "the analytic profile); lower micro_batch_size or seq_len",
                                   r.micro_batch_size, r.seq_len, largest.activation,
                                   largest.activation_name));
  }
  return absl::OkStatus();
}

absl::StatusOr<ResolvedRequest> Resolve(const v1::ProfileRequest& request) {
  ResolvedRequest r;
  const v1::ModelSpec& m = request.model();
  r.model.vocab_size = m.has_vocab_size() ? m.vocab_size() : kDefaultVocabSize;
  r.model.max_seq_len = m.has_max_seq_len() ? m.max_seq_len() : request.seq_len();
  r.model.n_layer = m.n_layer();
  r.model.n_head = m.n_head();
  r.model.d_model = m.d_model();
  r.seq_len = request.seq_len();
  r.micro_batch_size = request.micro_batch_size();
  r.warmup = request.warmup() == 0 ? kDefaultProfileWarmup : request.warmup();
  r.repetitions = request.repetitions() == 0 ? kDefaultProfileRepetitions : request.repetitions();
  r.seed = request.seed();
  if (r.seq_len < 1) return Invalid("seq_len", absl::StrCat("must be >= 1, got ", r.seq_len));
  if (absl::Status s = ValidateGptConfig(r.model); !s.ok()) return Invalid("model", s.message());
  if (r.model.n_layer > kMaxProfileLayers) {
    return Invalid("model", absl::StrCat("n_layer ", r.model.n_layer, " exceeds ",
                                         kMaxProfileLayers, ", a job's spec.model.n_layer bound"));
  }
  if (r.seq_len > r.model.max_seq_len) {
    return Invalid("seq_len", absl::StrCat(r.seq_len, " must be <= request.model.max_seq_len ",
                                           r.model.max_seq_len));
  }
  if (r.micro_batch_size < 1) {
    return Invalid("micro_batch_size", absl::StrCat("must be >= 1, got ", r.micro_batch_size));
  }
  if (r.warmup < 0 || r.warmup > kMaxProfileRuns) {
    return Invalid("warmup", absl::StrCat("must be in [0, ", kMaxProfileRuns, "], got ", r.warmup));
  }
  if (r.repetitions < 1 || r.repetitions > kMaxProfileRuns) {
    return Invalid("repetitions",
                   absl::StrCat("must be in [1, ", kMaxProfileRuns, "], got ", r.repetitions));
  }
  RETURN_IF_ERROR(CheckTensorSizes(r));
  if (request.partitions_size() > 2) {
    return Invalid("partitions",
                   absl::StrCat(request.partitions_size(), " counts; at most 2 (of 2 and 4)"));
  }
  for (int k : request.partitions()) {
    if ((k != 2 && k != 4) || r.micro_batch_size % k != 0 ||
        std::count(r.partitions.begin(), r.partitions.end(), k) > 0) {
      return Invalid("partitions",
                     absl::StrCat(k, " is not 2 or 4, does not divide micro_batch_size ",
                                  r.micro_batch_size, ", or is repeated"));
    }
    r.partitions.push_back(k);
  }
  return r;
}

// The first `samples` samples of `batch`.
TokenBatch FirstSamples(const TokenBatch& batch, int samples) {
  TokenBatch out;
  out.batch = samples;
  out.seq_len = batch.seq_len;
  const size_t n = static_cast<size_t>(samples) * batch.seq_len;
  out.inputs.assign(batch.inputs.begin(), batch.inputs.begin() + n);
  out.targets.assign(batch.targets.begin(), batch.targets.begin() + n);
  return out;
}

// Row b is a stream of seq_len + 1 uniform tokens; inputs are its first
// seq_len, targets the last seq_len, as in a real training window.
TokenBatch SyntheticBatch(const ResolvedRequest& r) {
  TokenBatch batch;
  batch.batch = r.micro_batch_size;
  batch.seq_len = r.seq_len;
  for (int b = 0; b < r.micro_batch_size; ++b) {
    for (int t = 0; t <= r.seq_len; ++t) {
      const auto token = static_cast<int32_t>(
          UniformIndex(r.seed, static_cast<uint32_t>(b), kProfileTokenPurpose,
                       static_cast<uint32_t>(t), static_cast<uint64_t>(r.model.vocab_size)));
      if (t < r.seq_len) batch.inputs.push_back(token);
      if (t > 0) batch.targets.push_back(token);
    }
  }
  return batch;
}

// dL/dy for a unit's output: 1 for the head's loss (a host scalar), N(0, 1)
// elsewhere (on the unit's backend).
Tensor OutputGradient(const Unit& unit, const Tensor& output, uint64_t seed) {
  if (unit.kind() == UnitKind::kHead) return Tensor::FromVector({1}, {1.0f});
  Tensor dy = Tensor::Zeros(output.shape());
  FillNormal(seed, HashName("profile.dy." + unit.name()), 0.0f, 1.0f, dy.data(), dy.numel());
  return unit.backend()->Upload(dy);
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  if (values.size() % 2 == 1) return values[mid];
  return 0.5 * (values[mid - 1] + values[mid]);
}

int64_t WeightBytes(Unit& unit) {
  int64_t bytes = 0;
  for (const Parameter* p : unit.parameters()) bytes += p->value.size_bytes();
  return bytes;
}

// See peak_memory_bytes in the header for what this counts and what it does not.
double PeakMemoryEstimate(const Unit& unit, int64_t weight_bytes, const Tensor& input,
                          const TokenBatch& batch, const Tensor& output, const UnitContext& ctx) {
  const int64_t token_bytes = int64_t{batch.batch} * batch.seq_len * kBytesPerElement;
  int64_t stash = 0;
  for (const Tensor& t : ctx.saved) {
    if (!t.SharesStorageWith(input) && !t.SharesStorageWith(output)) stash += t.size_bytes();
  }
  int64_t total = 4 * weight_bytes + output.size_bytes() + stash;
  if (unit.kind() != UnitKind::kEmbed) total += 2 * input.size_bytes();  // x and dx
  if (unit.kind() == UnitKind::kEmbed || unit.kind() == UnitKind::kHead) {
    total += token_bytes;  // embed reads the inputs, head the targets
  }
  return static_cast<double>(total);
}

// One forward + backward pass; returns {forward seconds, backward seconds},
// each to the end of its queued device work.
std::pair<double, double> TimedPass(Unit& unit, const Tensor& input, const TokenBatch& batch,
                                    const Tensor& dy, UnitContext* ctx) {
  using Clock = std::chrono::steady_clock;
  Backend* backend = unit.backend();
  // Frees the previous pass's stash before this forward allocates its own
  // (Forward replaces ctx->saved only at its end): otherwise the profiler
  // would hold two micro-batches' stashes at once, beyond the one-stash
  // peak the coordinator checks a worker's memory against. Done before
  // the clock starts, so the times do not include the freeing.
  ctx->Clear();
  backend->Synchronize();
  const Clock::time_point t0 = Clock::now();
  unit.Forward(input, batch, ctx);
  backend->Synchronize();
  const Clock::time_point t1 = Clock::now();
  unit.Backward(dy, batch, *ctx);
  backend->Synchronize();
  const Clock::time_point t2 = Clock::now();
  return {std::chrono::duration<double>(t1 - t0).count(),
          std::chrono::duration<double>(t2 - t1).count()};
}

// transient_bytes (see the header): one more forward + backward pass, on a
// fresh context, measured with the host tensor counters; 0 on a device
// backend, whose memory they do not see. The counters are process-wide,
// which is why ProfileUnits must not run beside other work. First frees
// the timed passes' stash in `timed_ctx` (on every backend), so that this
// pass's stash is the only one held and the steps after it (optimizer,
// partitions) hold none.
double MeasureTransientBytes(Unit& unit, const Tensor& input, const TokenBatch& batch,
                             const Tensor& dy, UnitContext* timed_ctx) {
  timed_ctx->Clear();
  if (unit.backend()->kind() != BackendKind::kCpu) return 0;
  const int64_t before = CurrentHostTensorMemory().live_bytes;
  ResetHostTensorPeak();
  int64_t stash = 0;  // what the forward kept, but the input (live before)
  {
    UnitContext ctx;
    const Tensor output = unit.Forward(input, batch, &ctx);  // held, as until it is sent
    for (const Tensor& t : ctx.saved) {
      if (!t.SharesStorageWith(input)) stash += t.size_bytes();
    }
    const Tensor input_gradient = unit.Backward(dy, batch, ctx);
  }
  const int64_t above = CurrentHostTensorMemory().peak_bytes - before - stash;
  return static_cast<double>(std::max<int64_t>(above, 0));
}

// One AdamW step over the unit's parameters (from the gradients the timed
// passes accumulated), to the end of its queued device work.
double TimedOptimizerStep(Unit& unit, AdamWOptimizer& optimizer) {
  using Clock = std::chrono::steady_clock;
  Backend* backend = unit.backend();
  backend->Synchronize();
  const Clock::time_point t0 = Clock::now();
  optimizer.Step(unit.parameters());
  backend->Synchronize();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Profiles unit `index` on `input` (null for embed) and returns its output,
// the next unit's input. The unit is freed before returning. `stop_check`
// (may be null) is asked before each pass; its error ends the unit.
absl::StatusOr<Tensor> ProfileUnit(const ResolvedRequest& r, int index, const TokenBatch& batch,
                                   const Tensor& input, Backend* backend,
                                   const ProfileStopCheck& stop_check, v1::UnitProfile* out) {
  const auto go_on = [&stop_check]() { return stop_check ? stop_check() : absl::OkStatus(); };
  std::unique_ptr<Unit> unit = MakeUnit(r.model, index, backend);
  InitializeParameters(unit.get(), r.seed);
  UnitContext ctx;
  const Tensor output = unit->Forward(input, batch, &ctx);
  const int64_t weight_bytes = WeightBytes(*unit);
  out->set_name(unit->name());
  out->set_weight_bytes(static_cast<double>(weight_bytes));
  out->set_activation_bytes(static_cast<double>(output.size_bytes()));
  out->set_stash_bytes(static_cast<double>(ctx.bytes()));
  out->set_peak_memory_bytes(PeakMemoryEstimate(*unit, weight_bytes, input, batch, output, ctx));

  const Tensor dy = OutputGradient(*unit, output, r.seed);
  for (int i = 0; i < r.warmup; ++i) {
    RETURN_IF_ERROR(go_on());
    TimedPass(*unit, input, batch, dy, &ctx);
  }
  std::vector<double> forward, backward;
  for (int i = 0; i < r.repetitions; ++i) {
    RETURN_IF_ERROR(go_on());
    const auto [fwd, bwd] = TimedPass(*unit, input, batch, dy, &ctx);
    forward.push_back(fwd);
    backward.push_back(bwd);
  }
  out->set_fwd_seconds(Median(forward));
  out->set_bwd_seconds(Median(backward));
  RETURN_IF_ERROR(go_on());
  out->set_transient_bytes(MeasureTransientBytes(*unit, input, batch, dy, &ctx));
  // The unit's share of the optimizer step, as the runtime takes it (the
  // default hyperparameters and decay policy: AdamW's work per element
  // does not depend on their values). The first step allocates the moments.
  {
    RETURN_IF_ERROR(go_on());
    AdamWOptimizer optimizer(AdamWConfig{}, DecayPolicy::kMatricesOnly, backend);
    optimizer.Step(unit->parameters());
    for (int i = 0; i < r.warmup; ++i) TimedOptimizerStep(*unit, optimizer);
    std::vector<double> steps;
    for (int i = 0; i < r.repetitions; ++i) steps.push_back(TimedOptimizerStep(*unit, optimizer));
    out->set_optimizer_seconds(Median(steps));
  }
  // One of K micro-partitions: the first micro_batch_size / K samples of the
  // same input and output gradient (the head's loss gradient stays 1).
  for (int k : r.partitions) {
    const int samples = r.micro_batch_size / k;
    const TokenBatch part = FirstSamples(batch, samples);
    const Tensor part_input = input.is_null() ? input : input.Slice(0, samples);
    const Tensor part_dy = unit->kind() == UnitKind::kHead ? dy : dy.Slice(0, samples);
    UnitContext part_ctx;
    RETURN_IF_ERROR(go_on());
    unit->Forward(part_input, part, &part_ctx);
    for (int i = 0; i < r.warmup; ++i) {
      RETURN_IF_ERROR(go_on());
      TimedPass(*unit, part_input, part, part_dy, &part_ctx);
    }
    std::vector<double> part_forward, part_backward;
    for (int i = 0; i < r.repetitions; ++i) {
      RETURN_IF_ERROR(go_on());
      const auto [fwd, bwd] = TimedPass(*unit, part_input, part, part_dy, &part_ctx);
      part_forward.push_back(fwd);
      part_backward.push_back(bwd);
    }
    v1::PartitionTiming* timing = out->add_partitions();
    timing->set_count(k);
    timing->set_fwd_seconds(Median(part_forward));
    timing->set_bwd_seconds(Median(part_backward));
  }
  return output;
}

// Byte counts are whole numbers; writing them as JSON integers (3145728, not
// 3145728.0) matches docs/formats.md. Anything else is written as it is.
nlohmann::ordered_json ByteCount(double bytes) {
  constexpr double kExactIntegers = 9007199254740992.0;  // 2^53
  if (bytes == std::floor(bytes) && std::fabs(bytes) <= kExactIntegers) {
    return static_cast<int64_t>(bytes);
  }
  return bytes;
}

// Times `reduce`, one data-parallel all-reduce of a member's `data`
// (kCodecTimingElements N(0, 1e-3) values, fresh each run), between two
// members on threads of this process over an in-process fabric: member 0's
// median over `repetitions` runs after `warmup`, per fp32 byte, into `out`
// as `name`.
using MemberReduce = std::function<absl::Status(Collectives&, int run, int member, Tensor& data)>;
absl::Status TimeTwoMemberAllReduce(const std::string& name, const ResolvedRequest& r,
                                    const MemberReduce& reduce, v1::CodecTiming* out) {
  using Clock = std::chrono::steady_clock;
  InProcessFabric fabric(2);
  CollectiveOptions options;
  options.timeout = absl::Seconds(60);
  std::vector<double> seconds;
  absl::Status status[2];
  auto member = [&](int rank) {
    std::unique_ptr<Transport> transport = fabric.Connect(rank);
    Collectives collectives(transport.get(), CollectiveGroup{{0, 1}, "profile"}, options);
    Tensor values = Tensor::Zeros({kCodecTimingElements});
    FillNormal(r.seed, HashName(absl::StrCat("profile.codec.", rank)), 0.0f, 1e-3f, values.data(),
               values.numel());
    status[rank] = collectives.status();
    for (int run = 0; status[rank].ok() && run < r.warmup + r.repetitions; ++run) {
      Tensor data = values.Clone();
      const Clock::time_point start = Clock::now();
      status[rank] = reduce(collectives, run, rank, data);
      if (rank == 0 && run >= r.warmup) {
        seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
      }
    }
    if (!status[rank].ok()) fabric.Shutdown();  // the other member waits no longer
  };
  std::thread other(member, 1);
  member(0);
  other.join();
  RETURN_IF_ERROR(status[0]);
  RETURN_IF_ERROR(status[1]);
  out->set_codec(name);
  out->set_all_reduce_seconds_per_byte(Median(seconds) /
                                       static_cast<double>(kCodecTimingElements * 4));
  return absl::OkStatus();
}

// Collectives::AllReduceEncoded through quantizer `name` as a compressed
// data-parallel stage runs it (a flat tensor, its coding error kept).
absl::Status TimeQuantizedAllReduce(const std::string& name, const ResolvedRequest& r,
                                    v1::CodecTiming* out) {
  ASSIGN_OR_RETURN(const std::unique_ptr<Codec> codec, MakeQuantizer(name));
  return TimeTwoMemberAllReduce(
      codec->name(), r,
      [&codec](Collectives& collectives, int run, int, Tensor& data) {
        Tensor coding_error;
        return collectives.AllReduceEncoded(run, /*tag=*/0, *codec, data.numel(), data, nullptr,
                                            &coding_error);
      },
      out);
}

// PowerSgdAllReduce of rank `rank` with error feedback on a
// kPowerSgdTimingRows-row matrix, its warm start and residual kept from run
// to run, as a compressed stage runs it on each matrix.
absl::Status TimePowerSgdAllReduce(int rank, const ResolvedRequest& r, v1::CodecTiming* out) {
  PowerSgdAllReduceState states[2];
  // Constants: read in the lambda without a capture (clang warns of one).
  constexpr int64_t rows = kPowerSgdTimingRows, cols = kCodecTimingElements / kPowerSgdTimingRows;
  return TimeTwoMemberAllReduce(
      absl::StrCat("powersgd:rank=", rank), r,
      [&states, rank](Collectives& collectives, int run, int member, Tensor& data) {
        return PowerSgdAllReduce(collectives, run, /*tag=*/0, rank, rows, cols,
                                 /*error_feedback=*/true, data, &states[member]);
      },
      out);
}

}  // namespace

absl::StatusOr<v1::ModelProfile> ProfileUnits(const v1::ProfileRequest& request,
                                              const ProfileProgressFn& progress, Backend* backend,
                                              const ProfileStopCheck& stop_check) {
  ASSIGN_OR_RETURN(const ResolvedRequest r, Resolve(request));
  v1::ModelProfile profile;
  profile.set_micro_batch_size(r.micro_batch_size);
  profile.set_repetitions(r.repetitions);
  v1::DeviceInfo device;  // just the fields DeviceKind reads
  device.set_gpu_model(backend->device_facts().name);
  device.set_cpu_model(CpuModelName());
  profile.set_device_kind(DeviceKind(device));
  const TokenBatch batch = SyntheticBatch(r);
  Tensor activation;  // embed ignores its x
  for (int i = 0; i < NumUnits(r.model); ++i) {
    if (progress) RETURN_IF_ERROR(progress(i, UnitName(r.model, i)));
    ASSIGN_OR_RETURN(
        activation, ProfileUnit(r, i, batch, activation, backend, stop_check, profile.add_units()));
  }
  RETURN_IF_ERROR(backend->status());
  for (const char* name : kProfiledQuantizers) {
    RETURN_IF_ERROR(TimeQuantizedAllReduce(name, r, profile.add_codecs()));
  }
  for (int rank : kProfiledPowerSgdRanks) {
    RETURN_IF_ERROR(TimePowerSgdAllReduce(rank, r, profile.add_codecs()));
  }
  return profile;
}

std::string ProfileToFileJson(const v1::ModelProfile& profile) {
  // ordered_json keeps the documented key order (name first) in the file.
  using nlohmann::ordered_json;
  ordered_json units = ordered_json::array();
  for (const v1::UnitProfile& u : profile.units()) {
    units.push_back({{"name", u.name()},
                     {"fwd_seconds", u.fwd_seconds()},
                     {"bwd_seconds", u.bwd_seconds()},
                     {"weight_bytes", ByteCount(u.weight_bytes())},
                     {"activation_bytes", ByteCount(u.activation_bytes())},
                     {"stash_bytes", ByteCount(u.stash_bytes())}});
    if (u.transient_bytes() > 0) units.back()["transient_bytes"] = ByteCount(u.transient_bytes());
    if (u.optimizer_seconds() > 0) units.back()["optimizer_seconds"] = u.optimizer_seconds();
    if (u.partitions_size() > 0) {  // AccTFM's timings, as the planner reads them
      ordered_json partitions = ordered_json::array();
      for (const v1::PartitionTiming& t : u.partitions()) {
        partitions.push_back({{"count", t.count()},
                              {"fwd_seconds", t.fwd_seconds()},
                              {"bwd_seconds", t.bwd_seconds()}});
      }
      units.back()["partitions"] = std::move(partitions);
    }
  }
  ordered_json file = {{"micro_batch_size", profile.micro_batch_size()},
                       {"units", std::move(units)}};
  if (profile.codecs_size() > 0) {
    ordered_json codecs = ordered_json::array();
    for (const v1::CodecTiming& c : profile.codecs()) {
      codecs.push_back(
          {{"codec", c.codec()}, {"all_reduce_seconds_per_byte", c.all_reduce_seconds_per_byte()}});
    }
    file["codecs"] = std::move(codecs);
  }
  return file.dump(2, ' ', /*ensure_ascii=*/false, ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace pipetrain
