#include "worker/runtime/stage_runtime.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/clock.h"
#include "common/enum_names.h"
#include "common/logging.h"
#include "common/program_text.h"
#include "common/proto_time.h"
#include "common/status_macros.h"
#include "kernels/compress/codec_spec.h"
#include "worker/collectives/collectives.h"
#include "worker/model/tensor_parallel.h"
#include "worker/model/weights_io.h"
#include "worker/train/grad_clip.h"
#include "worker/train/lr_schedule.h"

namespace pipetrain {
namespace {

// Tag of the gradient-clipping all-gather of the stages' squared norms (one
// per step; Collectives::AllGatherSmall). The data-parallel gradient
// all-reduces' tags (one per parameter) start at kDataParallelTagBase.
constexpr int kGradClipTagBase = 1 << 20;
// Tags of the final all-gathers of tensor-parallel shards (one per
// parameter), above the tensor-parallel units' and validation's tags.
constexpr int kTensorParallelGatherTagBase =
    kTensorParallelTagBase + CollectivesTensorParallelComm::kStepTagSpan + (1 << 21);
// Tags of a checkpoint's all-gathers of shards and their moments (three per
// parameter), above the final ones.
constexpr int kTensorParallelCheckpointTagBase = kTensorParallelGatherTagBase + (1 << 20);
// Tag of the tensor ranks' all-gather of their norm shares (one per step).
constexpr int kGradClipTensorTagBase = (1 << 20) + (1 << 18);
constexpr int kDataParallelTagBase = 1 << 21;
// 3-D tensor parallelism's cube collectives (CollectivesCubeComm), and
// those of a validation pass.
constexpr int kCubeTagBase = 1 << 24;
// The tensor ranks' sum of their partition tunings (PartitionTuner), once.
constexpr int kTensorParallelTuneTag = kTensorParallelTagBase +
                                       CollectivesTensorParallelComm::kStepTagSpan +
                                       CollectivesTensorParallelComm::kEvalTagSpan;
constexpr int kCubeEvalTagOffset = 1 << 22;
static_assert(kTensorParallelTuneTag < kTensorParallelGatherTagBase &&
                  kTensorParallelCheckpointTagBase < kCubeTagBase,
              "the tensor-parallel tag spans must not overlap");
// Tags of the overlapped all-reduces (GroupTags of each bucket, in order;
// the step's group takes them from kDataParallelTagBase + 2 below this).
constexpr int kOverlapTagBase = (1 << 21) + (1 << 19);
// Tags of the loss stages' all-gather of the step's micro-batch losses and
// of the fused embedding synchronization.
constexpr int kLossGatherTag = 1 << 22;
constexpr int kEmbeddingSyncTag = (1 << 22) + 1;
// The tag of a checkpoint's gather of the replicas' error feedback, and of
// their pipeline links' PowerSGD warm starts.
constexpr int kFeedbackCheckpointTag = (1 << 22) + 2;
constexpr int kLinkWarmStartCheckpointTag = (1 << 22) + 3;
// The replicas' sum of their partition tunings (after each one's tensor
// ranks summed theirs under kTensorParallelTuneTag).
constexpr int kReplicaTuneTag = (1 << 22) + 4;
// Validation sends a stage may have queued (each holding a host copy of its
// activation) before its next forward pass waits: a few keep the link busy
// while the next micro-batch is computed.
constexpr int64_t kEvalSendsAhead = 4;

// The options of this runtime's collectives: the default message sizes
// (the ring's chunks, recursive doubling for small tensors) and the job's
// receive timeout.
CollectiveOptions GroupOptions(absl::Duration timeout) {
  CollectiveOptions options;
  options.timeout = timeout;
  return options;
}

// The same with recursive doubling off (small_bytes 0): an all-reduce of
// any size then sums in the ring's order (the fused embedding sync's must
// equal the unfused path's bitwise). Gathers and broadcasts run alike
// either way.
CollectiveOptions RingSumOptions(absl::Duration timeout) {
  CollectiveOptions options = GroupOptions(timeout);
  options.small_bytes = 0;
  return options;
}

// Whether `program` sends a tensor through PowerSGD (a codec spec naming
// it, alone or after token_topk): its links keep warm starts across steps.
bool SendsThroughPowerSgd(const v1::Program& program) {
  for (const v1::Instruction& i : program.instructions()) {
    if (i.has_send() && absl::StrContains(i.send().codec(), "powersgd")) return true;
  }
  return false;
}

using SteadyClock = std::chrono::steady_clock;

// `parts`' values one after another (host tensors), as one flat tensor: what
// a checkpoint's gather over the replicas sends.
Tensor Concatenated(const std::vector<const Tensor*>& parts) {
  int64_t numel = 0;
  for (const Tensor* t : parts) numel += t->numel();
  Tensor flat = Tensor::Zeros({numel});
  int64_t offset = 0;
  for (const Tensor* t : parts) {
    std::memcpy(flat.data() + offset, t->data(), t->size_bytes());
    offset += t->numel();
  }
  return flat;
}

// A checkpoint holds unsplit tensors (Snapshot): the shape of `p`'s there,
// and this rank's part of one, cut as the initialisation cuts it
// (SliceShard); a copy when `shard` splits nothing.
const Shape& UnsplitShape(const Parameter& p) {
  return p.shard.sharded() ? p.shard.full_shape : p.value.shape();
}
Tensor ThisRanksPart(const Tensor& full, const ParameterShard& shard) {
  return shard.sharded() ? SliceShard(full, shard) : full.Clone();
}

double SecondsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

// Adds one collective to `stats`: `bytes` of fp32 values, `wire_bytes` of
// them sent, begun at `start`.
void CountCollectiveCall(IterationResult::CollectiveStats* stats, int64_t bytes, int64_t wire_bytes,
                         SteadyClock::time_point start) {
  ++stats->count;
  stats->bytes += bytes;
  stats->wire_bytes += wire_bytes;
  stats->seconds += SecondsSince(start);
}

// Adds one collective to result->collectives[purpose].
void CountCollective(IterationResult* result, const char* purpose, int64_t bytes,
                     SteadyClock::time_point start, int64_t wire_bytes = -1) {
  if (result == nullptr) return;
  CountCollectiveCall(&result->collectives[purpose], bytes, wire_bytes < 0 ? bytes : wire_bytes,
                      start);
}

// Adds the time since `start`, blocked in a collective with other stages or
// replicas, to result->idle_seconds: it waits for them as a receive does,
// so that busy is this stage's own work (IterationResult).
void CountWaited(IterationResult* result, SteadyClock::time_point start) {
  if (result != nullptr) result->idle_seconds += SecondsSince(start);
}

// What a traced step's instruction `in` waited for so far (plan.proto
// InstructionTiming.waited_seconds): a receive's idle time, a compute
// pass's wait for queued sends, an optimizer
// step's data-parallel all-reduce (read without adding the phase to a
// result that has none). The step's other waits in collectives, idle too,
// are not drawn (the measured timeline names an optimizer step's wait the
// all-reduce's).
double WaitedSeconds(const IterationResult& result, const v1::Instruction& in) {
  // A compute instruction's: its wait for queued sends to leave first.
  if (in.has_recv() || in.has_forward() || in.has_backward() || in.has_recompute()) {
    return result.idle_seconds;
  }
  if (!in.has_optimizer_step()) return 0;
  auto it = result.phase_seconds.find("all_reduce");
  return it == result.phase_seconds.end() ? 0.0 : it->second;
}

absl::Status Internal(const std::string& what) {
  return absl::InternalError(absl::StrCat("program error: ", what));
}

// `failed`, with the error of a background send (or overlapped all-reduce)
// that failed too (possibly the cause: a peer that cannot be reached also
// sends nothing back). A receive that timed out while this stage's own
// send failed takes the send's code: the peer was most likely waiting for
// that send (as RecvWireWatchingSends says on the wire path; a device-path
// receive cannot watch the sends). Reported as a timeout, a send refused as
// "training diverged" read as a lost peer, and the job recovered into the
// same divergence until its recoveries ran out.
absl::Status WithFailedSends(absl::Status failed, const absl::Status& sends) {
  if (sends.ok()) return failed;
  const absl::StatusCode code = absl::IsDeadlineExceeded(failed) && !absl::IsDeadlineExceeded(sends)
                                    ? sends.code()
                                    : failed.code();
  return absl::Status(code, absl::StrCat(failed.message(), "; also failed: ", sends.message()));
}

// Takes map[key] out of `m`; INTERNAL naming `what` when absent.
absl::StatusOr<Tensor> TakeFrom(std::map<int, Tensor>& m, int key, const std::string& what) {
  auto it = m.find(key);
  if (it == m.end()) return Internal(absl::StrCat(what, " for micro-batch ", key, " missing"));
  Tensor t = std::move(it->second);
  m.erase(it);
  return t;
}

// A LINK_PATH_DEVICE instruction needs the device group's channel and
// carries a raw activation or activation gradient made on the device, as
// the coordinator marks them (coordinator/planner/device_links.h,
// MayUseDevice): UNIT_WEIGHTS are packed on the host, and the tied
// embedding's gradient is added into in place after its send (AddTied),
// which a device send still reading it must not see.
absl::Status CheckDevicePath(const v1::Instruction& in, bool have_channel) {
  const bool device = (in.has_send() && in.send().path() == v1::LINK_PATH_DEVICE) ||
                      (in.has_recv() && in.recv().path() == v1::LINK_PATH_DEVICE);
  if (!device) return absl::OkStatus();
  const v1::TensorKind kind = in.has_send() ? in.send().tensor().kind() : in.recv().tensor().kind();
  const bool activation =
      kind == v1::TENSOR_KIND_ACTIVATION || kind == v1::TENSOR_KIND_ACTIVATION_GRAD;
  // A receive names its send's codec, "none" for a raw one (the planner's
  // MarkRecvCodecs): that one is raw too.
  const std::string& codec = in.has_send() ? in.send().codec() : in.recv().codec();
  const bool compressed = !codec.empty() && codec != kCodecNone;
  const char* wrong = !have_channel                          ? "the worker joined no device group"
                      : compressed                           ? "it is compressed"
                      : kind == v1::TENSOR_KIND_UNIT_WEIGHTS ? "UNIT_WEIGHTS are packed on the host"
                      : !activation ? "only activations and their gradients take it"
                                    : nullptr;
  if (wrong == nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("\"", DescribeInstruction(in), "\" cannot take the device path: ", wrong));
}

// Forward, Recompute and Backward read their micro-batch's samples
// (BatchFor, EvalForward): a training one must be one of this replica's
// `per_replica` (program micro-batch k is the step's replica * per_replica
// + k, so any other is another replica's, or past the dataset's CHECKs); a
// validation Forward one of the planner's `eval` (ceil(eval_windows / rows
// per micro-batch), coordinator/planner/planner.cc). Sends and receives
// only name tensors (-1 for per-iteration ones such as UNIT_WEIGHTS and
// TIED_EMBEDDING_GRAD, a sequence number for COLLECTIVE) and read no
// samples: not checked here.
absl::Status CheckMicroBatch(const v1::Instruction& in, int stage, int per_replica, int eval) {
  int mb = 0;
  bool validation = false;
  if (in.has_forward()) {
    mb = in.forward().micro_batch();
    validation = in.forward().validation();
  } else if (in.has_recompute()) {
    mb = in.recompute().micro_batch();
  } else if (in.has_backward()) {
    mb = in.backward().micro_batch();
  } else {
    return absl::OkStatus();
  }
  const int count = validation ? eval : per_replica;
  if (mb >= 0 && mb < count) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("stage ", stage, ": \"", DescribeInstruction(in), "\" reads ",
                   validation ? "validation" : "training", " micro-batch ", mb, "; ",
                   validation ? "there are 0 .. " : "this replica's are 0 .. ", count - 1));
}

// What an instruction names beyond its micro-batch, checked before the
// constructor and Execute index by it: a Forward's, Recompute's or
// Backward's units lie within the model's `units` (begin <= end; the
// constructor notes each unit of a Backward, so an unbounded range would
// allocate without end), a Send's or Recv's peer is one of the replica's
// `num_stages` stages (GlobalWorker's product would overflow otherwise and
// reach another worker), and validation Forwards are the eval program's
// whole compute (`eval`: RunEval skips its micro-batches past the
// validation windows; the training program's iteration would read them).
absl::Status CheckInstructionReferences(const v1::Instruction& in, bool eval, int stage,
                                        int num_stages, int units) {
  auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", stage, ": \"", DescribeInstruction(in), "\" ", why));
  };
  const v1::UnitRange* range = nullptr;
  if (in.has_forward()) range = &in.forward().units();
  if (in.has_recompute()) range = &in.recompute().units();
  if (in.has_backward()) range = &in.backward().units();
  if (range != nullptr &&
      (range->begin() < 0 || range->begin() > range->end() || range->end() > units)) {
    return refuse(absl::StrCat("names units [", range->begin(), ", ", range->end(),
                               ") outside the ", units, "-unit model"));
  }
  int peer = -1;
  if (in.has_send()) peer = in.send().peer_stage();
  if (in.has_recv()) peer = in.recv().peer_stage();
  if ((in.has_send() || in.has_recv()) && (peer < 0 || peer >= num_stages)) {
    return refuse(
        absl::StrCat("names peer stage ", peer, "; the stages are 0 .. ", num_stages - 1));
  }
  const bool validation = in.has_forward() && in.forward().validation();
  if (eval && !validation && !in.has_send() && !in.has_recv()) {
    return refuse(
        "is in the validation program, which holds validation Forwards, Sends and "
        "Recvs only");
  }
  if (!eval && validation) return refuse("is a validation Forward in the training program");
  return absl::OkStatus();
}

int64_t WeightCount(Unit& unit) {
  int64_t n = 0;
  for (const Parameter* p : unit.parameters()) n += p->value.numel();
  return n;
}

// UNIT_WEIGHTS payload: every parameter value of the unit, concatenated in
// parameters() order (plan.proto), on the host.
Tensor PackWeights(Unit& unit) {
  Tensor out = Tensor::Zeros({WeightCount(unit)});
  int64_t offset = 0;
  for (const Parameter* p : unit.parameters()) {
    const Tensor host = unit.backend()->Download(p->value);
    std::copy(host.data(), host.data() + host.numel(), out.data() + offset);
    offset += p->value.numel();
  }
  return out;
}

// Requires packed.numel() == WeightCount(*unit); packed is on the host.
void UnpackWeights(const Tensor& packed, Unit* unit) {
  int64_t offset = 0;
  for (Parameter* p : unit->parameters()) {
    const Tensor part = packed.Reshape({packed.numel()}).Slice(offset, offset + p->value.numel());
    unit->backend()->CopyFromHost(part, &p->value);
    offset += p->value.numel();
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<StageRuntime>> StageRuntime::Create(const StageSetup& setup,
                                                                   const Dataset* dataset,
                                                                   Transport* transport) {
  RETURN_IF_ERROR(ValidateTrainConfig(setup.train));
  const int units = NumUnits(setup.train.model);
  for (const auto& [what, r] :
       {std::pair<const char*, const v1::UnitRange&>{"forward", setup.forward},
        {"backward", setup.backward}}) {
    if (r.begin() < 0 || r.begin() > r.end() || r.end() > units) {
      return absl::InvalidArgumentError(absl::StrCat("stage ", setup.stage, "'s ", what, " units [",
                                                     r.begin(), ", ", r.end(),
                                                     ") are not within a ", units, "-unit model"));
    }
  }
  if (setup.forward.begin() == setup.forward.end() &&
      setup.backward.begin() == setup.backward.end()) {
    return absl::InvalidArgumentError(absl::StrCat("stage ", setup.stage, " has no units"));
  }
  auto has = [&](int u) {
    return (setup.forward.begin() <= u && u < setup.forward.end()) ||
           (setup.backward.begin() <= u && u < setup.backward.end());
  };
  if ((has(0) || has(units - 1)) && dataset == nullptr) {
    return absl::InvalidArgumentError("the stage owning embed or head needs the dataset");
  }
  if (setup.replicas < 1 || setup.replica < 0 || setup.replica >= setup.replicas) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica ", setup.replica, " of ", setup.replicas, " is not a replica"));
  }
  // Gradient clipping's group (GlobalStage numbers them): distinct stages
  // of this replica, ascending, as the coordinator sends them.
  for (size_t k = 0; k < setup.optimizer_stages.size(); ++k) {
    const int s = setup.optimizer_stages[k];
    if (s < 0 || s >= setup.num_stages || (k > 0 && s <= setup.optimizer_stages[k - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer stages [", absl::StrJoin(setup.optimizer_stages, ", "),
                       "]; want distinct stages of 0 .. ", setup.num_stages - 1, ", ascending"));
    }
  }
  // Clipping's norm is over every stage's gradients: a stage that holds
  // backward units of a multi-stage program and is not in the group (an
  // empty group included) would fail every step at its first optimizer
  // step (no holder of another stage's units, or a collective group
  // without this stage), so it is refused here, before the run.
  if (setup.train.grad_clip > 0 && setup.num_stages > 1 &&
      setup.backward.begin() < setup.backward.end() &&
      !std::binary_search(setup.optimizer_stages.begin(), setup.optimizer_stages.end(),
                          setup.stage)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient clipping over ", setup.num_stages, " stages: optimizer stages [",
        absl::StrJoin(setup.optimizer_stages, ", "), "] leave out stage ", setup.stage,
        ", which holds backward units [", setup.backward.begin(), ", ", setup.backward.end(),
        ")"));
  }
  if (setup.train.micro_batches % setup.replicas != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.micro_batches (", setup.train.micro_batches,
                     ") is not divisible by the ", setup.replicas, " data-parallel replicas"));
  }
  if (setup.tensor_parallel < 1 || setup.tensor_rank < 0 ||
      setup.tensor_rank >= setup.tensor_parallel) {
    return absl::InvalidArgumentError(absl::StrCat("tensor rank ", setup.tensor_rank, " of ",
                                                   setup.tensor_parallel, " is not a rank"));
  }
  if (setup.tensor_partition_tune_steps < 0 || setup.tensor_partition_tune_steps > 16 ||
      (setup.tensor_partition_tune_steps > 0 &&
       (setup.tensor_parallel < 2 || setup.tensor_mode != "1d" ||
        setup.tensor_partitions_forward.empty() || setup.tensor_partitions_backward.empty()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor-partition tuning of ", setup.tensor_partition_tune_steps,
        " steps per candidate; want 0, or 1..16 with 1-D tensor parallelism and per-unit "
        "partitions"));
  }
  if (setup.tensor_mode == "3d") {
    if (setup.tensor_parallel == 1) {
      return absl::InvalidArgumentError("tensor mode 3d with one tensor rank");
    }
    RETURN_IF_ERROR(ValidateCubeTensorParallel(
        setup.train.model, setup.tensor_parallel,
        setup.train.batch_size / std::max(1, setup.train.micro_batches)));
    if (setup.backend->kind() != BackendKind::kCpu) {
      return absl::InvalidArgumentError(
          "3-D tensor parallelism runs on the CPU backend only (its CUDA path is not built)");
    }
    bool partitioned = setup.tensor_partitions != 1;
    for (const std::vector<int>* per_unit :
         {&setup.tensor_partitions_forward, &setup.tensor_partitions_backward}) {
      for (int k : *per_unit) partitioned = partitioned || k != 1;
    }
    if (partitioned) {
      return absl::InvalidArgumentError(
          "AccTFM's tensor-parallel partitions with tensor mode 3d (not built for the cube)");
    }
    if (!setup.tensor_compression.empty() && setup.tensor_compression != "none") {
      return absl::InvalidArgumentError(
          "tensor-parallel compression with tensor mode 3d (not built for the cube)");
    }
  } else if (setup.tensor_mode == "1d") {
    RETURN_IF_ERROR(ValidateTensorParallel(setup.train.model, setup.tensor_parallel));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor mode \"", absl::CEscape(setup.tensor_mode.substr(0, 16)), "\"; want 1d or 3d"));
  }
  if (setup.tensor_partitions != 1 && setup.tensor_partitions != 2 &&
      setup.tensor_partitions != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel partitions ", setup.tensor_partitions, "; want 1, 2 or 4"));
  }
  if (setup.tensor_compression.size() > 256) {
    return absl::InvalidArgumentError(absl::StrCat("tensor-parallel compression spec of ",
                                                   setup.tensor_compression.size(),
                                                   " bytes; at most 256"));
  }
  RETURN_IF_ERROR(
      MakeTensorParallelCompression(setup.tensor_compression, "tensor-parallel compression")
          .status());
  if (setup.max_feedback_replicas < 1) {
    return absl::InvalidArgumentError(absl::StrCat("error feedback of at most ",
                                                   setup.max_feedback_replicas,
                                                   " replicas per checkpoint; want 1 or more"));
  }
  if (setup.device_collective != nullptr &&
      (setup.replicas < 2 || setup.data_parallel_powersgd_rank > 0 ||
       !setup.data_parallel_quantizer.empty())) {
    return absl::InvalidArgumentError(
        absl::StrCat("a replica device collective with ", setup.replicas,
                     " replicas, PowerSGD rank ", setup.data_parallel_powersgd_rank,
                     setup.data_parallel_quantizer.empty() ? "" : " and a quantizer",
                     "; it sums exactly over 2 replicas or more"));
  }
  if (!setup.data_parallel_quantizer.empty()) {
    if (setup.data_parallel_quantizer.size() > 256 || setup.replicas < 2 ||
        setup.data_parallel_powersgd_rank > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("data-parallel quantizer of ", setup.data_parallel_quantizer.size(),
                       " bytes with ", setup.replicas, " replicas and PowerSGD rank ",
                       setup.data_parallel_powersgd_rank,
                       "; want at most 256 bytes, 2 replicas or more, and no rank"));
    }
    absl::StatusOr<std::unique_ptr<Codec>> quantizer =
        MakeQuantizer(setup.data_parallel_quantizer);
    if (!quantizer.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("data-parallel quantizer: ", quantizer.status().message()));
    }
  }
  for (const std::vector<int>* per_unit :
       {&setup.tensor_partitions_forward, &setup.tensor_partitions_backward}) {
    if (per_unit->empty()) continue;
    bool valid = static_cast<int>(per_unit->size()) == units;
    for (int k : *per_unit) valid = valid && (k == 1 || k == 2 || k == 4);
    if (!valid) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor-parallel partitions per unit [", absl::StrJoin(*per_unit, ", "),
                       "] for a ", units, "-unit model; want one of 1, 2 or 4 per unit"));
    }
  }
  if ((setup.num_stages > 1 || setup.replicas > 1 || setup.tensor_parallel > 1) &&
      transport == nullptr) {
    return absl::InvalidArgumentError(
        "a multi-stage, data- or tensor-parallel program needs a transport");
  }
  // Both divide (ValidateTrainConfig, and the replicas' check above).
  const int rows_per_micro_batch = setup.train.batch_size / setup.train.micro_batches;
  const int eval_micro_batches =
      (setup.train.eval_windows + rows_per_micro_batch - 1) / rows_per_micro_batch;
  for (const v1::Program* program : {&setup.program, &setup.eval_program}) {
    for (const v1::Instruction& in : program->instructions()) {
      RETURN_IF_ERROR(CheckInstructionReferences(in, program == &setup.eval_program, setup.stage,
                                                 setup.num_stages, units));
      RETURN_IF_ERROR(CheckDevicePath(in, setup.device_channel != nullptr));
      RETURN_IF_ERROR(CheckMicroBatch(in, setup.stage, setup.train.micro_batches / setup.replicas,
                                      eval_micro_batches));
      if (!in.has_add_tied_gradient() || !in.add_tied_gradient().fused()) continue;
      const v1::Instruction::AddTiedGradient& add = in.add_tied_gradient();
      const int e = add.embed_stage(), h = add.head_stage();
      if (setup.replicas < 2 || e < 0 || e >= setup.num_stages || h < 0 || h >= setup.num_stages ||
          e == h || (setup.stage != e && setup.stage != h)) {
        return absl::InvalidArgumentError(
            absl::StrCat("stage ", setup.stage, ": a fused AddTiedGradient of embed stage ", e,
                         " and head stage ", h, " (", setup.num_stages, " stages, ", setup.replicas,
                         " replicas) needs two replicas or more and this stage as one of the two"));
      }
    }
  }
  return std::unique_ptr<StageRuntime>(new StageRuntime(setup, dataset, transport));
}

StageRuntime::StageRuntime(const StageSetup& setup, const Dataset* dataset, Transport* transport)
    : setup_(setup),
      dataset_(dataset),
      transport_(transport),
      num_units_(NumUnits(setup.train.model)),
      optimizer_(setup.train.adam, setup.train.decay, setup.backend),
      device_encoder_(setup.backend),
      links_through_powersgd_(SendsThroughPowerSgd(setup.program)) {
  // Checked by Create.
  if (!setup.data_parallel_quantizer.empty()) {
    dp_quantizer_ = MakeQuantizer(setup.data_parallel_quantizer).value();
  }
  if (setup.tensor_parallel > 1) {
    std::vector<int> members;  // this stage's tensor ranks, in rank order
    for (int t = 0; t < setup.tensor_parallel; ++t) {
      members.push_back((setup.replica * setup.num_stages + setup.stage) * setup.tensor_parallel +
                        t);
    }
    tp_collectives_ = std::make_unique<Collectives>(
        transport, CollectiveGroup{members, setup.job_id}, GroupOptions(setup.recv_timeout));
    // Checked by Create.
    tp_comm_ = std::make_unique<CollectivesTensorParallelComm>(
        tp_collectives_.get(), setup.backend,
        MakeTensorParallelCompression(setup.tensor_compression, "").value());
    if (setup.tensor_mode == "3d") {
      cube_comm_ =
          std::make_unique<CollectivesCubeComm>(transport, CubeEdge(setup.tensor_parallel), members,
                                                setup.job_id, GroupOptions(setup.recv_timeout));
      cube_group_ = std::make_unique<CubeUnitGroup>(cube_comm_.get());
      cube_group_->Record(cube_comm_->status());
    }
  }
  for (const v1::UnitRange& r : {setup.forward, setup.backward}) {
    for (int u = r.begin(); u < r.end(); ++u) {
      if (units_.count(u)) continue;
      if (cube_group_) {
        units_[u] = MakeCubeTensorParallelUnit(setup.train.model, u, setup.backend,
                                               cube_group_.get(), tp_comm_.get());
        InitializeParameters(units_[u].get(), setup.train.seed);
        continue;
      }
      units_[u] = MakeUnit(setup.train.model, u, setup.backend, tp_comm_.get());
      units_[u]->set_tensor_parallel_partitions(
          setup.tensor_partitions_forward.empty() ? setup.tensor_partitions
                                                  : setup.tensor_partitions_forward[u],
          setup.tensor_partitions_backward.empty() ? setup.tensor_partitions
                                                   : setup.tensor_partitions_backward[u]);
      InitializeParameters(units_[u].get(), setup.train.seed);
    }
  }
  // Only units whose forward and backward both run here are tuned (see
  // PartitionTuner): a stage with none keeps the plan's counts unmeasured.
  std::vector<bool> tunable;
  for (int u = 0; u < num_units_; ++u) {
    tunable.push_back(IsBlockUnitKind(UnitKindAt(setup.train.model, u)) &&
                      setup.forward.begin() <= u && u < setup.forward.end() &&
                      setup.backward.begin() <= u && u < setup.backward.end());
  }
  if (setup.tensor_partition_tune_steps > 0 &&
      std::find(tunable.begin(), tunable.end(), true) != tunable.end()) {
    tuner_ = std::make_unique<PartitionTuner>(
        PartitionCandidate{setup.tensor_partitions_forward, setup.tensor_partitions_backward},
        tunable, setup.train.batch_size / setup.train.micro_batches,
        setup.tensor_partition_tune_steps);
  }
  // 3-D: a cube unit hands its next unit its block only when both run in
  // this stage's forward and backward ranges (so the forward, the
  // recompute and the backward chains agree); whatever leaves the stage or
  // reaches the embedding or the head is full (cube_units.h).
  auto in_both = [&](int u) {
    return setup.forward.begin() <= u && u < setup.forward.end() && setup.backward.begin() <= u &&
           u < setup.backward.end();
  };
  for (auto& [u, unit] : units_) {
    auto* cube = dynamic_cast<CubeBlockUnit*>(unit.get());
    auto next = units_.find(u + 1);
    if (cube == nullptr || next == units_.end()) continue;
    cube->set_output_full(!(in_both(u) && in_both(u + 1) &&
                            dynamic_cast<CubeBlockUnit*>(next->second.get()) != nullptr));
  }
  // Holding both ends of the model: tie the values as GptModel does.
  if (units_.count(0) && units_.count(num_units_ - 1)) {
    TieHeadToEmbedding(*units_[0], *units_[num_units_ - 1]);
  }
  // Outputs read after the forward pass, each micro-batch's last use and
  // each stored activation's last reader.
  std::map<int, int> last;
  std::map<std::pair<int, int>, int> last_read;
  const auto& ins = setup.program.instructions();
  for (int i = 0; i < ins.size(); ++i) {
    const v1::Instruction& in = ins[i];
    int mb = -1;
    if (in.has_forward()) {
      mb = in.forward().micro_batch();
      if (in.forward().units().begin() > 0) last_read[{mb, in.forward().units().begin() - 1}] = i;
    }
    if (in.has_backward()) mb = in.backward().micro_batch();
    if (in.has_recompute()) {
      mb = in.recompute().micro_batch();
      kept_outputs_.insert(in.recompute().units().begin() - 1);
      last_read[{mb, in.recompute().units().begin() - 1}] = i;
    }
    if (in.has_send()) {
      mb = in.send().tensor().micro_batch();
      if (in.send().tensor().kind() == v1::TENSOR_KIND_ACTIVATION) {
        kept_outputs_.insert(in.send().tensor().unit());
        last_read[{mb, in.send().tensor().unit()}] = i;
        if (absl::StartsWith(in.send().codec(), "token_topk")) {
          scored_outputs_.insert(in.send().tensor().unit());
        }
      }
    }
    if (in.has_recv()) mb = in.recv().tensor().micro_batch();
    if (mb >= 0) last[mb] = i;
  }
  for (int u : scored_outputs_) {
    if (units_.count(u)) units_[u]->KeepTokenImportance();
  }
  for (const auto& [mb, i] : last) last_touch_[i].push_back(mb);
  for (const auto& [key, i] : last_read) last_read_by_[i].push_back(key);
  for (int i = 0; i < ins.size(); ++i) {
    if (!ins[i].has_backward()) continue;
    const v1::UnitRange& r = ins[i].backward().units();
    for (int u = r.begin(); u < r.end(); ++u) final_backward_of_unit_[u] = i;
  }
}

absl::Status StageRuntime::TunePartitions(int64_t iteration, IterationResult* result) {
  const int64_t i = tuned_iterations_++;
  const PartitionCandidate& ran = tuner_->CandidateFor(i);
  // The units tuned: a count the plan fixed is not reported as measured.
  for (const auto& [u, unit] : units_) {
    if (tuner_->tunable(u))
      result->tensor_partitions[unit->name()] = {ran.forward[u], ran.backward[u]};
  }
  // The stage's compute, with the all-reduce time its units waited for.
  double compute = 0;
  for (const char* phase : {"forward", "backward", "recompute"}) {
    auto it = result->phase_seconds.find(phase);
    if (it != result->phase_seconds.end()) compute += it->second;
  }
  tuner_->Record(i, compute);
  if (!tuner_->DecidesAfter(i)) return absl::OkStatus();
  // Every rank decides from the group's sums, so all keep the same counts.
  const std::vector<double>& mine = tuner_->totals();
  Tensor totals = Tensor::Zeros({static_cast<int64_t>(mine.size())});
  for (size_t c = 0; c < mine.size(); ++c) totals.data()[c] = static_cast<float>(mine[c]);
  const auto summing = SteadyClock::now();  // the wait for the group: idle
  RETURN_IF_ERROR(tp_collectives_->AllReduce(iteration, kTensorParallelTuneTag, totals));
  // And over the replicas (each the same tensor rank of its group): every
  // replica keeps the same counts too, so a checkpoint, which replica 0
  // writes, records the choice of all (TunedChoice).
  if (setup_.replicas > 1) {
    Collectives replicas(transport_, ReplicaGroup(), RingSumOptions(setup_.recv_timeout));
    RETURN_IF_ERROR(replicas.status());
    RETURN_IF_ERROR(replicas.AllReduce(iteration, kReplicaTuneTag, totals));
  }
  CountWaited(result, summing);
  const std::vector<float> summed = totals.ToVector();
  const int chosen = tuner_->Decide(std::vector<double>(summed.begin(), summed.end()));
  std::string measured;
  for (size_t c = 0; c < summed.size(); ++c) {
    absl::StrAppend(&measured, c == 0 ? "" : "; ", tuner_->candidates()[c].ToString(), ": ",
                    absl::SixDigits(summed[c]), " s");
  }
  PT_LOG(INFO) << OwnStageName() << ": tensor partitions measured over "
               << setup_.tensor_partition_tune_steps << " steps each (compute seconds summed over "
               << setup_.tensor_parallel * setup_.replicas << " ranks): " << measured
               << "; keeping " << tuner_->candidates()[chosen].ToString();
  return absl::OkStatus();
}

TunedPartitions StageRuntime::TuningLayout() const {
  TunedPartitions layout;
  layout.tensor_parallel = setup_.tensor_parallel;
  layout.samples = setup_.train.batch_size / setup_.train.micro_batches;
  layout.forward_begin = setup_.forward.begin();
  layout.forward_end = setup_.forward.end();
  layout.backward_begin = setup_.backward.begin();
  layout.backward_end = setup_.backward.end();
  return layout;
}

std::optional<TunedPartitions> StageRuntime::TunedChoice() const {
  if (!tuner_ || !tuner_->decided()) return std::nullopt;
  TunedPartitions choice = TuningLayout();
  const PartitionCandidate& kept = tuner_->candidates()[tuner_->chosen()];
  choice.forward = kept.forward;
  choice.backward = kept.backward;
  return choice;
}

void StageRuntime::AdoptTunedChoice(const TunedPartitions& recorded) {
  if (!tuner_ || tuner_->decided()) return;
  // The layouts compared, not the counts: the tuner judges those.
  TunedPartitions layout = TuningLayout();
  layout.forward = recorded.forward;
  layout.backward = recorded.backward;
  if (!(recorded == layout) ||
      !tuner_->Adopt(PartitionCandidate{recorded.forward, recorded.backward})) {
    PT_LOG(INFO) << OwnStageName() << ": measuring tensor partitions again: the checkpoint's ("
                 << FormatTunedPartitions(recorded) << ") do not fit this stage ("
                 << FormatTunedPartitions(TuningLayout())
                 << "; tensor ranks, samples per micro-batch, forward and backward units, then "
                    "one count per unit as it runs)";
    return;
  }
  PT_LOG(INFO) << OwnStageName() << ": tensor partitions as measured before the checkpoint: "
               << tuner_->candidates()[tuner_->chosen()].ToString();
}

std::vector<Parameter*> StageRuntime::parameters() const {
  std::vector<Parameter*> out;
  std::set<std::string> seen;
  for (int u = setup_.backward.begin(); u < setup_.backward.end(); ++u) {
    for (Parameter* p : units_.at(u)->parameters()) {
      if (seen.insert(p->name).second) out.push_back(p);
    }
  }
  return out;
}

absl::StatusOr<Tensor> StageRuntime::GatherUnsplit(int64_t iteration, int tag, const Tensor& mine,
                                                   const ParameterShard& shard) {
  const int ranks = shard.ranks;
  std::vector<Shape> shapes;
  int64_t piece = 0;
  for (int r = 0; r < ranks; ++r) {
    ParameterShard at = shard;
    at.rank = r;
    shapes.push_back(ShardShape(at));
    int64_t numel = 1;
    for (int64_t d : shapes.back()) numel *= d;
    piece = std::max(piece, numel);
  }
  Tensor padded = Tensor::Zeros({piece});
  std::copy(mine.data(), mine.data() + mine.numel(), padded.data());
  ASSIGN_OR_RETURN(Tensor all,
                   tp_collectives_->Gather(iteration, tag, /*root=*/0, padded, piece * ranks));
  if (tp_collectives_->rank() != 0) return Tensor();
  std::vector<Tensor> parts;
  for (int r = 0; r < ranks; ++r) {
    Tensor part = Tensor::Zeros(shapes[r]);
    std::copy(all.data() + r * piece, all.data() + r * piece + part.numel(), part.data());
    parts.push_back(std::move(part));
  }
  return GatherShards(parts, shard);
}

absl::StatusOr<std::vector<Parameter>> StageRuntime::UnsplitParameterCopies(int64_t iteration) {
  std::vector<Parameter*> params = parameters();
  // The tied wte.weight is the embedding's stage's to give: a head's stage
  // holds a copy of its own, and both uploaded into one file whichever
  // chunk came last (a CPU and a GPU copy need not be equal), twice the
  // largest tensor's bytes.
  if (!IsBackwardUnit(0)) {
    params.erase(std::remove_if(params.begin(), params.end(),
                                [](const Parameter* p) { return p->name == "wte.weight"; }),
                 params.end());
  }
  std::vector<Parameter> out = HostParameterCopies(setup_.backend, params);
  RETURN_IF_ERROR(setup_.backend->status());
  if (!tp_collectives_) return out;
  int tag = kTensorParallelGatherTagBase;
  for (Parameter& p : out) {
    if (!p.shard.sharded()) continue;
    ASSIGN_OR_RETURN(p.value, GatherUnsplit(iteration, tag++, p.value, p.shard));
    p.grad = Tensor();
    p.shard = ParameterShard{};
  }
  if (tp_collectives_->rank() != 0) out.clear();  // rank 0 has them all
  return out;
}

absl::StatusOr<StageSnapshot> StageRuntime::Snapshot(int64_t step) {
  // A private host copy: the CPU backend's tensors are the host's.
  auto host_copy = [this](const Tensor& t) {
    return t.on_device() ? setup_.backend->Download(t) : t.Clone();
  };
  // Tensor parallelism: a split tensor's shards gathered into the unsplit
  // one, three tags per parameter (value, m, v), in the same order on every
  // rank (the units' parameter lists are the same).
  int tag = kTensorParallelCheckpointTagBase;
  // Only rank 0 keeps what it gathers and copies; the others send.
  const bool keeps = !tp_collectives_ || tp_collectives_->rank() == 0;
  // `t` already a private host tensor (a gathered residual): not copied
  // again, so the writing replica holds each residual once.
  auto unsplit = [&](const Tensor& t, const ParameterShard& shard,
                     bool host_private = false) -> absl::StatusOr<Tensor> {
    const int at = tag++;
    if (!tp_collectives_ || !shard.sharded()) {
      return keeps ? (host_private ? t : host_copy(t)) : Tensor();
    }
    Tensor part = host_private ? t : host_copy(t);
    // A device that failed meanwhile downloads NaN: sent on, rank 0 would
    // refuse the checkpoint as diverged (failing the job) where this
    // rank's device failure should recover it. Stop here with that error.
    if (t.on_device()) RETURN_IF_ERROR(setup_.backend->status());
    return GatherUnsplit(step, at, std::move(part), shard);
  };
  StageSnapshot snapshot;
  snapshot.step = step;
  snapshot.optimizer_steps = optimizer_.steps_taken();
  // The replicas' error feedback first: the other replicas take part in
  // nothing else.
  const std::vector<const Parameter*> held = FeedbackParameters();
  // Replica 0: by replica, `held` concatenated; and each one's offset.
  std::vector<Tensor> feedback;
  std::map<const Parameter*, int64_t> held_at;
  const bool dp_feedback = dp_quantizer_ != nullptr || setup_.data_parallel_powersgd_rank > 0;
  if (SnapshotsEveryReplica() && dp_feedback) {
    ASSIGN_OR_RETURN(feedback, GatherReplicaFeedback(step, held));
    int64_t offset = 0;
    for (const Parameter* p : held) {
      held_at[p] = offset;
      offset += p->value.numel();
    }
  }
  // The pipeline links' warm starts (every replica's), for the file of the
  // first backward unit.
  ASSIGN_OR_RETURN(std::vector<LinkWarmStart> links, LinkWarmStarts(step));
  if (SnapshotsEveryReplica() && setup_.replica != 0) return snapshot;
  const auto& moments = optimizer_.moments();
  for (int u = setup_.backward.begin(); u < setup_.backward.end(); ++u) {
    UnitState state;
    state.unit = u;
    for (const Parameter* p : units_.at(u)->parameters()) {
      ASSIGN_OR_RETURN(Tensor value, unsplit(p->value, p->shard));
      state.values.push_back({p->name, std::move(value)});
      auto m = moments.find(p->name);
      // Before the first step every rank has none (the same steps taken).
      if (m == moments.end()) {
        tag += 2;
        continue;
      }
      ASSIGN_OR_RETURN(Tensor m_value, unsplit(m->second.m, p->shard));
      ASSIGN_OR_RETURN(Tensor v_value, unsplit(m->second.v, p->shard));
      state.m.push_back({p->name, std::move(m_value)});
      state.v.push_back({p->name, std::move(v_value)});
    }
    // Then the residuals, replica by replica, one tag per (parameter,
    // replica), and the warm starts of tensors held whole.
    for (const Parameter* p : units_.at(u)->parameters()) {
      auto at = held_at.find(p);
      if (at == held_at.end()) continue;
      state.feedback.resize(feedback.size());
      for (size_t r = 0; r < feedback.size(); ++r) {
        const Tensor mine =
            feedback[r].Slice(at->second, at->second + p->value.numel()).Reshape(p->value.shape());
        ASSIGN_OR_RETURN(Tensor residual, unsplit(mine, p->shard, /*host_private=*/true));
        state.feedback[r].push_back({p->name, std::move(residual)});
      }
      const Tensor& q = dp_feedback_.at(p->name).q;
      if (q.numel() == 0) continue;
      if (!p->shard.sharded()) {
        state.warm_q.push_back({p->name, q.Clone()});
        continue;
      }
      ASSIGN_OR_RETURN(Tensor ranks_q, GatherWarmStarts(step, tag++, q, p->shard));
      if (keeps) state.warm_q_ranks.push_back({p->name, std::move(ranks_q)});
    }
    if (state.m.size() != state.values.size()) state.m.clear(), state.v.clear();
    if (u == setup_.backward.begin()) {
      state.link_warm_q = std::move(links);
      state.tuned_partitions = TunedChoice();
    }
    if (keeps) snapshot.units.push_back(std::move(state));
  }
  RETURN_IF_ERROR(setup_.backend->status());
  return snapshot;
}

absl::StatusOr<Tensor> StageRuntime::GatherWarmStarts(int64_t step, int tag, const Tensor& q,
                                                      const ParameterShard& shard) {
  // Each rank's Q has its shard's columns of rows; blocks as long as the
  // longest, zeros after a shorter one.
  const int64_t rank = q.shape()[1];
  int64_t rows = 0;
  for (int t = 0; t < shard.ranks; ++t) {
    ParameterShard at = shard;
    at.rank = t;
    rows = std::max(rows, ShardShape(at).back());
  }
  Tensor padded = Tensor::Zeros({rows * rank});
  std::copy(q.data(), q.data() + q.numel(), padded.data());
  ASSIGN_OR_RETURN(Tensor all, tp_collectives_->Gather(step, tag, /*root=*/0, padded,
                                                       rows * rank * shard.ranks));
  if (tp_collectives_->rank() != 0) return Tensor();
  return all.Reshape({shard.ranks, rows, rank});
}

bool StageRuntime::SnapshotsEveryReplica() const {
  return setup_.replicas > 1 && (dp_quantizer_ != nullptr ||
                                 setup_.data_parallel_powersgd_rank > 0 || links_through_powersgd_);
}

absl::StatusOr<std::vector<LinkWarmStart>> StageRuntime::LinkWarmStarts(int64_t step) {
  std::vector<LinkWarmStart> out;
  // Tensor ranks: rank 0's (see the header); the others take no part.
  if (!links_through_powersgd_ || (tp_collectives_ && tp_collectives_->rank() != 0)) return out;
  // This replica's, the device path's where a link took it.
  std::map<LinkCompressor::LinkKey, Tensor> mine = encoder_.WarmStarts();
  for (auto& [key, q] : device_encoder_.WarmStarts()) mine[key] = std::move(q);
  if (!SnapshotsEveryReplica()) {
    for (auto& [key, q] : mine) {
      out.push_back({setup_.replica, std::get<0>(key), std::get<1>(key), std::get<2>(key), q});
    }
    return out;
  }
  // Every replica's, gathered to replica 0: the same links and shapes on
  // each (the same program), so replica 0 cuts them by its own.
  if (transport_ == nullptr) return Internal("data parallelism needs a transport");
  std::vector<const Tensor*> parts;
  for (const auto& [key, q] : mine) parts.push_back(&q);
  const Tensor flat = Concatenated(parts);
  const int64_t numel = flat.numel();
  Collectives collectives(transport_, ReplicaGroup(), GroupOptions(setup_.recv_timeout));
  RETURN_IF_ERROR(collectives.status());
  ASSIGN_OR_RETURN(Tensor all, collectives.Gather(step, kLinkWarmStartCheckpointTag, /*root=*/0,
                                                  flat, numel * setup_.replicas));
  if (setup_.replica != 0) return out;
  for (int r = 0; r < setup_.replicas; ++r) {
    const float* values = all.data() + r * numel;
    for (const auto& [key, q] : mine) {
      Tensor copy = Tensor::Zeros(q.shape());
      std::memcpy(copy.data(), values, q.size_bytes());
      values += q.numel();
      out.push_back({r, std::get<0>(key), std::get<1>(key), std::get<2>(key), copy});
    }
  }
  return out;
}

CollectiveGroup StageRuntime::ReplicaGroup() const {
  CollectiveGroup group{{}, setup_.job_id};
  for (int r = 0; r < setup_.replicas; ++r) group.members.push_back(GlobalWorker(r, setup_.stage));
  return group;
}

std::vector<const Parameter*> StageRuntime::FeedbackParameters() const {
  std::vector<const Parameter*> held;
  for (const Parameter* p : parameters()) {
    auto e = dp_feedback_.find(p->name);
    if (e != dp_feedback_.end() && e->second.residual.numel() == p->value.numel()) {
      held.push_back(p);
    }
  }
  return held;
}

absl::StatusOr<std::vector<Tensor>> StageRuntime::GatherReplicaFeedback(
    int64_t step, const std::vector<const Parameter*>& held) {
  if (transport_ == nullptr) return Internal("data parallelism needs a transport");
  std::vector<const Tensor*> residuals;
  for (const Parameter* p : held) residuals.push_back(&dp_feedback_.at(p->name).residual);
  Tensor mine = Concatenated(residuals);
  const int64_t numel = mine.numel();
  Collectives collectives(transport_, ReplicaGroup(), GroupOptions(setup_.recv_timeout));
  RETURN_IF_ERROR(collectives.status());
  std::vector<Tensor> by_replica;
  if (setup_.replicas > setup_.max_feedback_replicas) {
    RETURN_IF_ERROR(collectives.AllReduceInMemberOrder(step, kFeedbackCheckpointTag, mine));
    if (setup_.replica == 0) by_replica.push_back(std::move(mine));
    return by_replica;
  }
  ASSIGN_OR_RETURN(Tensor all, collectives.Gather(step, kFeedbackCheckpointTag, /*root=*/0, mine,
                                                  numel * setup_.replicas));
  if (setup_.replica != 0) return by_replica;
  // Views of `all`, not copies: the writing replica holds the D residuals
  // once (operations.md: at most max_feedback_replicas copies), through
  // the snapshot's unit states too.
  for (int r = 0; r < setup_.replicas; ++r) {
    by_replica.push_back(all.Slice(r * numel, (r + 1) * numel));
  }
  return by_replica;
}

void StageRuntime::AddRestoredFeedback() {
  for (Parameter* p : parameters()) {
    auto e = dp_feedback_.find(p->name);
    if (e == dp_feedback_.end() || e->second.residual.numel() != p->grad.numel()) continue;
    Tensor g = OnHost(p->grad);  // the gradient itself on the host
    float* x = g.data();
    const float* add = e->second.residual.data();
    for (int64_t i = 0; i < g.numel(); ++i) x[i] += add[i];
    if (p->grad.on_device()) setup_.backend->CopyFromHost(g, &p->grad);
  }
  dp_feedback_.clear();
}

absl::Status StageRuntime::RestoreFeedback(
    int index, const UnitState& state, const std::vector<Parameter*>& params,
    std::map<std::string, PowerSgdAllReduceState>* out) const {
  std::map<std::string, const Parameter*> by_name;
  for (const Parameter* p : params) by_name[p->name] = p;
  for (size_t r = 0; r < state.feedback.size(); ++r) {
    // This replica's share: the replicas r = replica mod replicas.
    if (static_cast<int>(r % static_cast<size_t>(setup_.replicas)) != setup_.replica) continue;
    for (const NamedTensor& e : state.feedback[r]) {
      auto p = by_name.find(e.name);
      if (p == by_name.end() || e.tensor.shape() != UnsplitShape(*p->second)) {
        return absl::InvalidArgumentError(
            absl::StrCat("restore: unit ", index, " error feedback of replica ", r, " for ", e.name,
                         " is ", ShapeToString(e.tensor.shape())));
      }
      const Tensor part = ThisRanksPart(e.tensor, p->second->shard);
      Tensor& residual = (*out)[e.name].residual;
      if (residual.numel() == 0) {
        residual = part;
        continue;
      }
      float* x = residual.data();
      for (int64_t i = 0; i < part.numel(); ++i) x[i] += part.data()[i];
    }
  }
  // Warm starts: a whole matrix's, or this rank's block of a split one's
  // when the checkpoint has as many ranks. Any other (another shape) is no
  // start: PowerSGD draws its fixed one instead (PowerSgdStartQ).
  for (const NamedTensor& q : state.warm_q) {
    auto p = by_name.find(q.name);
    if (p != by_name.end() && !p->second->shard.sharded()) (*out)[q.name].q = q.tensor.Clone();
  }
  for (const NamedTensor& q : state.warm_q_ranks) {
    auto p = by_name.find(q.name);
    if (p == by_name.end() || !p->second->shard.sharded()) continue;
    const ParameterShard& shard = p->second->shard;
    const Shape& shape = q.tensor.shape();  // [ranks, rows, rank]
    const int64_t cols = p->second->value.shape().back();
    if (shape[0] != shard.ranks || cols > shape[1]) continue;
    const int64_t block = shape[1] * shape[2];
    (*out)[q.name].q = q.tensor.Reshape({shape[0] * block})
                           .Slice(shard.rank * block, shard.rank * block + cols * shape[2])
                           .Clone()
                           .Reshape({cols, shape[2]});
  }
  return absl::OkStatus();
}

absl::Status StageRuntime::Restore(const std::vector<UnitState>& units, int64_t optimizer_steps) {
  std::map<int, const UnitState*> by_unit;
  for (const UnitState& u : units) by_unit[u.unit] = &u;
  // Check everything first: all or nothing. A split tensor's checkpoint is
  // the unsplit one: this rank keeps its shard (ThisRanksPart).
  struct Copy {
    Tensor from;
    Tensor* to;
  };
  std::vector<Copy> copies;
  std::map<std::string, AdamWMoments> moments;
  std::map<std::string, PowerSgdAllReduceState> feedback;
  std::vector<const LinkWarmStart*> links;  // in the backward units' files
  for (const auto& [index, unit] : units_) {
    auto found = by_unit.find(index);
    if (found == by_unit.end()) {
      return absl::InvalidArgumentError(absl::StrCat("restore: no state for unit ", index));
    }
    const UnitState& state = *found->second;
    const bool backward = IsBackwardUnit(index);
    if (backward && optimizer_steps > 0 && state.m.size() != state.values.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("restore: unit ", index, " has no AdamW moments"));
    }
    std::vector<Parameter*> params = unit->parameters();
    if (params.size() != state.values.size()) {
      return absl::InvalidArgumentError(absl::StrCat("restore: unit ", index, " holds ",
                                                     params.size(), " tensors, the state ",
                                                     state.values.size()));
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const NamedTensor& v = state.values[i];
      const ParameterShard& shard = params[i]->shard;
      const Shape& unsplit = UnsplitShape(*params[i]);
      if (v.name != params[i]->name || v.tensor.shape() != unsplit) {
        return absl::InvalidArgumentError(absl::StrCat("restore: unit ", index, " tensor ", i,
                                                       " is ", v.name, " ",
                                                       ShapeToString(v.tensor.shape())));
      }
      if (backward && optimizer_steps > 0) {
        for (const std::vector<NamedTensor>* moment : {&state.m, &state.v}) {
          const NamedTensor& t = (*moment)[i];
          if (t.name != v.name || t.tensor.shape() != unsplit) {
            return absl::InvalidArgumentError(absl::StrCat("restore: unit ", index, " moment of ",
                                                           v.name, " is ", t.name, " ",
                                                           ShapeToString(t.tensor.shape())));
          }
        }
        moments[v.name] = {setup_.backend->Upload(ThisRanksPart(state.m[i].tensor, shard)),
                           setup_.backend->Upload(ThisRanksPart(state.v[i].tensor, shard))};
      }
      copies.push_back({ThisRanksPart(v.tensor, shard), &params[i]->value});
    }
    if (backward) {
      RETURN_IF_ERROR(RestoreFeedback(index, state, params, &feedback));
      for (const LinkWarmStart& link : state.link_warm_q) links.push_back(&link);
    }
  }
  for (const Copy& c : copies) {
    if (c.to->on_device()) {
      setup_.backend->CopyFromHost(c.from, c.to);
    } else {
      c.to->CopyFrom(c.from);
    }
  }
  optimizer_.moments() = std::move(moments);
  optimizer_.set_steps_taken(optimizer_steps);
  dp_feedback_ = std::move(feedback);
  // The links' warm starts of replica r mod (the checkpoint's replicas): on
  // the same layout each link gets its own back.
  int replicas = 0;
  for (const LinkWarmStart* link : links) replicas = std::max(replicas, link->replica + 1);
  for (const LinkWarmStart* link : links) {
    if (link->replica != setup_.replica % replicas) continue;
    const LinkCompressor::LinkKey key{link->peer, link->kind, link->unit};
    encoder_.SetWarmStart(key, link->q.Clone());
    device_encoder_.SetWarmStart(key, link->q.Clone());
  }
  // The choice this stage measured before, in its first backward unit's
  // state: every tensor rank and replica reads the same one.
  auto first = by_unit.find(setup_.backward.begin());
  if (IsBackwardUnit(setup_.backward.begin()) && first != by_unit.end() &&
      first->second->tuned_partitions.has_value()) {
    AdoptTunedChoice(*first->second->tuned_partitions);
  }
  return setup_.backend->status();
}

std::string StageRuntime::current_instruction() const {
  AnnotatedMutexLock lock(&status_mu_);
  return current_;
}

void StageRuntime::ShowActivity(std::string what) {
  AnnotatedMutexLock lock(&status_mu_);
  current_ = std::move(what);
}

Unit* StageRuntime::OwnedUnit(int index) {
  auto it = units_.find(index);
  return it == units_.end() ? nullptr : it->second.get();
}

bool StageRuntime::IsBackwardUnit(int index) const {
  return setup_.backward.begin() <= index && index < setup_.backward.end();
}

TokenBatch StageRuntime::BatchFor(int micro_batch) const {
  const int per = setup_.train.batch_size / setup_.train.micro_batches;
  if (dataset_ == nullptr) return TokenBatch{per, setup_.train.seq_len, {}, {}};
  // This replica's share of the step's micro-batches (StageSetup).
  const int64_t global =
      int64_t{setup_.replica} * (setup_.train.micro_batches / setup_.replicas) + micro_batch;
  return dataset_->TrainBatch(setup_.train.seed, iteration_, global * per, per);
}

Parameter* StageRuntime::TiedHolder() {
  // The copy whose gradient this stage computes: embed's when its backward
  // runs here, else head's.
  if (IsBackwardUnit(0)) return FindParameter(*units_.at(0), "wte.weight");
  if (IsBackwardUnit(num_units_ - 1))
    return FindParameter(*units_.at(num_units_ - 1), "wte.weight");
  return nullptr;
}

absl::StatusOr<IterationResult> StageRuntime::RunIteration(int64_t iteration,
                                                           v1::StepTrace* trace) {
  // On every return, failed ones too: a heartbeat showed a failed
  // instruction through the error's report and the teardown. Not "idle",
  // which a heartbeat reports for a worker that runs no job
  // (WorkerRegistry::Release waits for it).
  absl::Cleanup between_steps = [this] {
    ShowActivity(kBetweenSteps);
    eval_wait_grace_ = absl::ZeroDuration();  // one step after a validation pass (RunEval)
  };
  iteration_ = iteration;
  for (auto& [index, unit] : units_) unit->ZeroGrads();
  activations_.clear(), grads_in_.clear(), grads_out_.clear(), token_scores_.clear();
  contexts_.clear(), losses_.clear();
  tied_received_ = Tensor();
  tied_reduced_ = false;
  overlapped_units_.clear();
  group_stats_.clear();
  bucket_.clear();
  bucket_numel_ = 0;
  overlap_tags_used_ = 0;
  if (tp_comm_) tp_comm_->BeginIteration(iteration, /*eval=*/false);
  if (cube_comm_) cube_comm_->SetIteration(iteration, kCubeTagBase);
  if (tuner_) {
    const PartitionCandidate& c = tuner_->CandidateFor(tuned_iterations_);
    for (auto& [u, unit] : units_)
      unit->set_tensor_parallel_partitions(c.forward[u], c.backward[u]);
  }
  const int64_t cube_count = cube_comm_ ? cube_comm_->collectives() : 0;
  const int64_t cube_sent = cube_comm_ ? cube_comm_->sent_bytes() : 0;
  const double cube_seconds = cube_comm_ ? cube_comm_->seconds() : 0;
  const int64_t tp_count = tp_comm_ ? tp_comm_->all_reduces() : 0;
  const int64_t tp_bytes = tp_comm_ ? tp_comm_->bytes() : 0;
  const double tp_seconds = tp_comm_ ? tp_comm_->seconds() : 0;
  const double tp_waited = tp_comm_ ? tp_comm_->waited_seconds() : 0;
  const int64_t tp_wire = tp_comm_ ? tp_comm_->wire_bytes() : 0;
  const double tp_norm = tp_comm_ ? tp_comm_->compressed_norm_squared() : 0;
  const double tp_error = tp_comm_ ? tp_comm_->compression_error_squared() : 0;
  const int64_t tp_compressed = tp_comm_ ? tp_comm_->compressed_bytes() : 0;
  const int64_t tp_compressed_wire = tp_comm_ ? tp_comm_->compressed_wire_bytes() : 0;
  // sends_ is idle here: every iteration and validation pass drains it.
  encoder_.BeginIteration();
  device_encoder_.BeginIteration();
  sent_stats_.clear();
  IterationResult result;
  result.iteration = iteration;
  result.run = setup_.job_id;
  if (trace != nullptr) {
    trace->Clear();
    trace->set_iteration(iteration);
    *trace->mutable_start_time() = ToProtoTimestamp(absl::Now());
  }
  const auto start = SteadyClock::now();
  const auto& instructions = setup_.program.instructions();
  // A traced step's timings go into one buffer sized before the step and
  // become the proto after it. With a protobuf message allocated per
  // instruction, between the step's tensors (which malloc_tuning.h keeps
  // on the heap), each traced step grew a worker by about four
  // activations per micro-batch, never returned: small messages split the
  // freed tensor-sized blocks (512 micro-batches of 128 KiB: +250 MB, now
  // +25 MB; 4096 micro-batches: killed for memory at 1 GiB).
  struct Timing {
    int instruction;
    double start_seconds, end_seconds, waited_seconds;
  };
  std::vector<Timing> timings;
  if (trace != nullptr) timings.reserve(instructions.size());
  for (int i = 0; i < instructions.size(); ++i) {
    const v1::Instruction& in = instructions[i];
    {
      AnnotatedMutexLock lock(&status_mu_);
      current_ = DescribeInstruction(in);
    }
    current_instruction_ = i;
    // What the instruction waited for: a receive's idle time, an optimizer
    // step's data-parallel all-reduce (Execute adds them to the result).
    const double began = trace != nullptr ? SecondsSince(start) : 0;
    const double waited_before = trace != nullptr ? WaitedSeconds(result, in) : 0;
    absl::Status status = Execute(in, iteration, &result);
    if (trace != nullptr) {
      const double end = std::max(began, SecondsSince(start));
      timings.push_back({i, began, end,
                         std::clamp(WaitedSeconds(result, in) - waited_before, 0.0, end - began)});
    }
    if (status.ok()) status = setup_.backend->status();
    if (status.ok() && tp_comm_) status = tp_comm_->status();
    if (status.ok() && cube_group_) status = cube_group_->status();
    if (!status.ok()) {
      // Both background queues are drained: the overlapped all-reduces
      // too, whose failure may be the cause (a replica that is gone), and
      // whose tasks must not still write gradients and group_stats_ when
      // the next iteration starts, nor leave their error stuck for it.
      const absl::Status sends = DrainSends(nullptr);
      const absl::Status all_reduces = all_reduces_.Drain();
      return WithFailedSends(
          WithFailedSends(
              absl::Status(status.code(),
                           absl::StrCat(OwnStageName(), ", iteration ", iteration, ", '",
                                        DescribeInstruction(in), "': ", status.message())),
              sends),
          all_reduces);
    }
    ForgetTensorsEndingAt(i);
    int64_t held = 0;
    for (const auto& [key, tensor] : activations_) held += tensor.size_bytes();
    result.activation_bytes_peak = std::max(result.activation_bytes_peak, held);
  }
  absl::Status sent = DrainSends(&result);
  if (!sent.ok()) {
    return absl::Status(
        sent.code(), absl::StrCat(OwnStageName(), ", iteration ", iteration, ": ", sent.message()));
  }
  if (tp_comm_) {
    // The units' all-reduces over this stage's tensor ranks.
    IterationResult::CollectiveStats& stats = result.collectives["tensor_parallel"];
    stats.count += tp_comm_->all_reduces() - tp_count;
    stats.bytes += tp_comm_->bytes() - tp_bytes;
    stats.wire_bytes += tp_comm_->wire_bytes() - tp_wire;
    stats.seconds += tp_comm_->seconds() - tp_seconds;
    stats.waited_seconds += tp_comm_->waited_seconds() - tp_waited;
    stats.compressed_norm_squared += tp_comm_->compressed_norm_squared() - tp_norm;
    stats.compression_error_squared += tp_comm_->compression_error_squared() - tp_error;
    stats.compressed_bytes += tp_comm_->compressed_bytes() - tp_compressed;
    stats.compressed_wire_bytes += tp_comm_->compressed_wire_bytes() - tp_compressed_wire;
    if (cube_comm_) {
      // 3-D: the cube's collectives too (the 1-D ones are the embedding's
      // and the head's). Their all-gathers and reduce-scatters have no one
      // tensor "reduced", so both byte counts are what this rank sent; and
      // they run on this thread, so all their time is waited.
      const int64_t sent = cube_comm_->sent_bytes() - cube_sent;
      const double seconds = cube_comm_->seconds() - cube_seconds;
      stats.count += cube_comm_->collectives() - cube_count;
      stats.bytes += sent;
      stats.wire_bytes += sent;
      stats.seconds += seconds;
      stats.waited_seconds += seconds;
    }
  }
  if (tuner_) {
    absl::Status tuned = TunePartitions(iteration, &result);
    if (!tuned.ok()) {
      return absl::Status(tuned.code(), absl::StrCat(OwnStageName(), ", iteration ", iteration,
                                                     ": ", tuned.message()));
    }
  }
  for (const auto& [mb, loss] : losses_) {
    result.micro_batch_losses.push_back(LossValue(setup_.backend, loss));
  }
  // Reading the losses may be the step's first wait on the device (its
  // work is queued without one): a fault seen there leaves NaN losses,
  // which would read as a diverged model (the job FAILED) where a failed
  // device is what the worker must report (a peer failure: it recovers).
  if (const absl::Status device = setup_.backend->status(); !device.ok()) {
    return absl::Status(device.code(),
                        absl::StrCat(OwnStageName(), ", iteration ", iteration,
                                     ", after its instructions: ", device.message()));
  }
  // The stage that runs head's forward pass has the losses. A stage with no
  // forward pass (Bi-Partition can leave the last one none) has an empty
  // range ending at num_units_ too.
  const bool runs_head_forward =
      setup_.forward.begin() < setup_.forward.end() && setup_.forward.end() == num_units_;
  if (setup_.replicas > 1 && runs_head_forward) {
    absl::Status gathered = GatherReplicaLosses(iteration, &result);
    if (!gathered.ok()) {
      return absl::Status(gathered.code(), absl::StrCat(OwnStageName(), ", iteration ", iteration,
                                                        ": ", gathered.message()));
    }
  }
  // Idle holds the receives' waits and the collectives' (CountWaited).
  result.busy_seconds = SecondsSince(start) - result.idle_seconds;
  if (trace != nullptr) {
    trace->mutable_instructions()->Reserve(static_cast<int>(timings.size()));
    for (const Timing& t : timings) {
      v1::InstructionTiming* timing = trace->add_instructions();
      timing->set_instruction(t.instruction);
      timing->set_start_seconds(t.start_seconds);
      timing->set_end_seconds(t.end_seconds);
      timing->set_waited_seconds(t.waited_seconds);
    }
    const double last_end = timings.empty() ? 0.0 : timings.back().end_seconds;
    trace->set_seconds(std::max(last_end, SecondsSince(start)));
  }
  return result;
}

absl::Status StageRuntime::Execute(const v1::Instruction& in, int64_t iteration,
                                   IterationResult* result) {
  const auto start = SteadyClock::now();
  // A phase's time is its busy time: what it waited for in collectives
  // (CountWaited) is idle, not the phase's.
  const double idle_before = result->idle_seconds;
  absl::Status status;
  const char* phase = nullptr;
  switch (in.op_case()) {
    case v1::Instruction::kForward:
      phase = "forward";
      AwaitSendRoom(in, result);
      status = Forward(in.forward());
      break;
    case v1::Instruction::kBackward:
      phase = "backward";
      AwaitSendRoom(in, result);
      status = Backward(in.backward());
      break;
    case v1::Instruction::kRecompute:
      phase = "recompute";
      AwaitSendRoom(in, result);
      status = Recompute(in.recompute());
      break;
    case v1::Instruction::kSend:
      phase = "send";
      status = Send(in.send(), iteration);
      break;
    case v1::Instruction::kRecv: {
      // Waiting is idle; decoding what arrived is work ("decode").
      const double decode_before = result->phase_seconds["decode"];
      status = Recv(in.recv(), iteration, result);
      result->idle_seconds +=
          SecondsSince(start) - (result->phase_seconds["decode"] - decode_before);
      return status;
    }
    case v1::Instruction::kAddTiedGradient:
      phase = "tied";
      status = AddTied(in.add_tied_gradient(), iteration, result);
      break;
    case v1::Instruction::kOptimizerStep:
      // Its all-reduce (PrepareOptimizerStep's, with replicas: the phase
      // "all_reduce") and the clipping's norm all-gather are idle, not the
      // optimizer's.
      phase = "optimizer";
      status = PrepareOptimizerStep(iteration, result);
      if (status.ok()) optimizer_.Step(parameters());
      break;
    case v1::Instruction::OP_NOT_SET:
      return Internal("empty instruction");
  }
  result->phase_seconds[phase] += SecondsSince(start) - (result->idle_seconds - idle_before);
  return status;
}

void StageRuntime::ForgetTensorsEndingAt(int instruction) {
  // An activation goes once its last reader has run: a sent forward output
  // is not held until its micro-batch's backward pass unless a recompute
  // here reads it (what the planner's memory model counts, bipartition.h).
  // The send queue (up to setup_.max_queued_send_bytes of them,
  // AwaitSendRoom) and a device encode hold their own references.
  if (auto it = last_read_by_.find(instruction); it != last_read_by_.end()) {
    for (const std::pair<int, int>& key : it->second) activations_.erase(key);
  }
  // Anything else of a finished micro-batch (a received tensor no
  // instruction here reads).
  if (auto it = last_touch_.find(instruction); it != last_touch_.end()) {
    for (int mb : it->second) {
      activations_.erase(activations_.lower_bound({mb, -1}),
                         activations_.lower_bound({mb + 1, -1}));
    }
  }
}

absl::Status StageRuntime::RunForward(const v1::UnitRange& units, int mb, bool recompute) {
  Tensor x;
  if (units.begin() > 0) {
    auto it = activations_.find({mb, units.begin() - 1});
    if (it == activations_.end()) {
      return Internal(
          absl::StrCat("input of unit ", units.begin(), " for micro-batch ", mb, " missing"));
    }
    x = it->second;
  }
  const TokenBatch batch = BatchFor(mb);
  for (int u = units.begin(); u < units.end(); ++u) {
    Unit* unit = OwnedUnit(u);
    if (unit == nullptr) return Internal(absl::StrCat("unit ", u, " is not owned here"));
    UnitContext scratch;
    // Saved tensors are kept only where this unit's backward pass runs.
    UnitContext* ctx = IsBackwardUnit(u) ? &contexts_[{mb, u}] : &scratch;
    // AccTFM across units: a tensor-parallel block hands its partitions'
    // pending all-reduces to the next block of this range (Unit::
    // set_stream_output), which waits for each as it reaches its rows.
    Unit* next = u + 1 < units.end() ? OwnedUnit(u + 1) : nullptr;
    const bool stream =
        next != nullptr && unit->streams_tensor_parallel() && next->streams_tensor_parallel();
    unit->set_stream_output(stream);
    x = unit->Forward(x, batch, ctx);
    if (stream) unit->PassPendingTo(next);
    if (recompute) continue;
    // A collective of the tensor ranks (Unit::TokenImportance): all rank
    // the tokens alike, so each sends its next-stage peer the same tensor.
    if (scored_outputs_.count(u)) token_scores_[{mb, u}] = unit->TokenImportance(*ctx);
    if (u == num_units_ - 1) {
      losses_[mb] = x;
    } else if (kept_outputs_.count(u)) {
      activations_[{mb, u}] = x;
    }
  }
  return absl::OkStatus();
}

absl::Status StageRuntime::Forward(const v1::Instruction::Forward& f) {
  if (f.validation()) return EvalForward(f);
  return RunForward(f.units(), f.micro_batch(), /*recompute=*/false);
}

int StageRuntime::EvalCount(int micro_batch) const {
  const int per = setup_.train.batch_size / setup_.train.micro_batches;
  return static_cast<int>(
      std::max<int64_t>(0, std::min<int64_t>(per, eval_windows_ - int64_t{micro_batch} * per)));
}

absl::Status StageRuntime::EvalForward(const v1::Instruction::Forward& f) {
  const int mb = f.micro_batch();
  const v1::UnitRange& units = f.units();
  Tensor x;
  if (units.begin() > 0) {
    auto it = eval_activations_.find({mb, units.begin() - 1});
    if (it == eval_activations_.end()) {
      return Internal(absl::StrCat("validation input of unit ", units.begin(), " for micro-batch ",
                                   mb, " missing"));
    }
    x = std::move(it->second);
    eval_activations_.erase(it);
  }
  const int per = setup_.train.batch_size / setup_.train.micro_batches;
  const int count = EvalCount(mb);
  // RunEval skips these; the training program has none (Create).
  if (count <= 0) {
    return Internal(absl::StrCat("validation micro-batch ", mb, " lies past the ", eval_windows_,
                                 " validation windows"));
  }
  const TokenBatch batch = dataset_->ValBatch(int64_t{mb} * per, count);
  for (int u = units.begin(); u < units.end(); ++u) {
    Unit* unit = OwnedUnit(u);
    if (unit == nullptr) return Internal(absl::StrCat("unit ", u, " is not owned here"));
    UnitContext scratch;  // nothing is kept: no backward pass follows
    x = unit->Forward(x, batch, &scratch);
  }
  if (units.end() == num_units_) {
    // As LocalTrainer::Evaluate: each micro-batch's mean loss weighted by
    // its windows, summed in double in micro-batch order.
    eval_weighted_loss_ += static_cast<double>(LossValue(setup_.backend, x)) * count;
    eval_has_loss_ = true;
  } else {
    eval_activations_[{mb, units.end() - 1}] = x;
  }
  return absl::OkStatus();
}

std::string StageRuntime::StageName(int stage) const {
  std::string name = absl::StrCat("stage ", GlobalStage(stage));
  if (setup_.replicas == 1 && setup_.tensor_parallel == 1) return name;
  std::string layout = setup_.replicas > 1
                           ? absl::StrCat("replica ", setup_.replica, "'s stage ", stage)
                           : absl::StrCat("stage ", stage);
  if (setup_.tensor_parallel > 1) absl::StrAppend(&layout, ", tensor rank ", setup_.tensor_rank);
  return absl::StrCat(name, " (", layout, ")");
}

absl::Status StageRuntime::NameSend(const absl::Status& status, int peer_stage,
                                    const TensorAddress& address) const {
  if (status.ok()) return status;  // Named only when failed: sends are many.
  return absl::Status(status.code(), absl::StrCat("send of ", address.DebugString(), " to ",
                                                  StageName(peer_stage), ": ", status.message()));
}

absl::StatusOr<std::optional<float>> StageRuntime::RunEval(int64_t after_step) {
  absl::Cleanup between_steps = [this] { ShowActivity(kBetweenSteps); };  // as RunIteration
  // Stages finish their shares of the pass at different times (a stage
  // with no forward units takes no part at all), so the next step's
  // receives may wait for the rest of the others' pass: a receive timeout
  // per validation micro-batch (each of theirs waits one at most) is added
  // to every receive of that step (RunIteration clears it), where one
  // timeout failed the job at every pass longer than it. Not to the pass's
  // own receives: each waits for one forward upstream, as in a step, and
  // with the grace a peer that stalled mid-pass went unnoticed for hours.
  absl::Duration grace_after_pass;
  {
    const int per = std::max(1, setup_.train.batch_size / std::max(1, setup_.train.micro_batches));
    const int64_t windows =
        dataset_ != nullptr && dataset_->num_val_windows() > 0
            ? std::min<int64_t>(setup_.train.eval_windows, dataset_->num_val_windows())
            : setup_.train.eval_windows;
    grace_after_pass = setup_.recv_timeout * ((std::max<int64_t>(0, windows) + per - 1) / per);
  }
  eval_wait_grace_ = absl::ZeroDuration();
  absl::Cleanup grace_for_the_next_step = [this, grace_after_pass] {
    eval_wait_grace_ = grace_after_pass;
  };
  const auto& instructions = setup_.eval_program.instructions();
  if (instructions.empty()) return std::optional<float>();
  if (dataset_ == nullptr || dataset_->num_val_windows() == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(OwnStageName(), ": validation needs a dataset with a validation split"));
  }
  eval_windows_ = std::min<int64_t>(setup_.train.eval_windows, dataset_->num_val_windows());
  eval_activations_.clear();
  eval_weighted_loss_ = 0;
  eval_has_loss_ = false;
  if (tp_comm_) tp_comm_->BeginIteration(after_step, /*eval=*/true);
  if (cube_comm_) cube_comm_->SetIteration(after_step, kCubeTagBase + kCubeEvalTagOffset);
  IterationResult ignored;  // evaluation time is not an iteration's
  for (const v1::Instruction& in : instructions) {
    int mb = 0;
    if (in.has_forward()) mb = in.forward().micro_batch();
    if (in.has_send()) mb = in.send().tensor().micro_batch();
    if (in.has_recv()) mb = in.recv().tensor().micro_batch();
    if (EvalCount(mb) == 0) continue;  // beyond the validation windows
    if (setup_.stopped && setup_.stopped()) {
      return WithFailedSends(
          absl::AbortedError(absl::StrCat(OwnStageName(), ", validation after step ", after_step,
                                          ": stopped during the validation pass")),
          DrainSends(nullptr));
    }
    {
      AnnotatedMutexLock lock(&status_mu_);
      current_ = DescribeInstruction(in);
    }
    absl::Status status = Execute(in, after_step, &ignored);
    // Nothing else paces a forward-only pass but Execute's byte bound,
    // which small activations never reach: without this a first stage
    // queued every validation micro-batch's host copy while the link or
    // the next stage (its mailbox's evaluation window) held them up.
    if (in.has_send()) sends_.AwaitPendingAtMost(kEvalSendsAhead);
    if (status.ok()) status = setup_.backend->status();
    if (status.ok() && tp_comm_) status = tp_comm_->status();
    if (status.ok() && cube_group_) status = cube_group_->status();
    if (!status.ok()) {
      return WithFailedSends(
          absl::Status(status.code(),
                       absl::StrCat(OwnStageName(), ", validation after step ", after_step, ", '",
                                    DescribeInstruction(in), "': ", status.message())),
          DrainSends(nullptr));
    }
  }
  absl::Status sent = DrainSends(nullptr);
  if (!sent.ok()) {
    return absl::Status(sent.code(), absl::StrCat(OwnStageName(), ", validation after step ",
                                                  after_step, ": ", sent.message()));
  }
  if (!eval_has_loss_) return std::optional<float>();
  return std::optional<float>(static_cast<float>(eval_weighted_loss_ / eval_windows_));
}

absl::Status StageRuntime::Recompute(const v1::Instruction::Recompute& r) {
  return RunForward(r.units(), r.micro_batch(), /*recompute=*/true);
}

absl::Status StageRuntime::Backward(const v1::Instruction::Backward& b) {
  const int mb = b.micro_batch();
  Tensor dy;
  if (b.units().end() == num_units_) {
    // dL/dloss of one micro-batch: the mean over micro-batches scales by 1/m.
    dy = Tensor::FromVector({1}, {1.0f / setup_.train.micro_batches});
  } else {
    ASSIGN_OR_RETURN(dy, TakeFrom(grads_in_, mb, "output gradient"));
  }
  const TokenBatch batch = BatchFor(mb);
  // A streamed unit's LayerNorm gradients are final only once the next
  // unit's Backward has resolved its rows: its overlapped data-parallel
  // all-reduce waits until then.
  int deferred_all_reduce = -1;
  for (int u = b.units().end() - 1; u >= b.units().begin(); --u) {
    Unit* unit = OwnedUnit(u);
    auto ctx = contexts_.find({mb, u});
    if (unit == nullptr || ctx == contexts_.end()) {
      return Internal(absl::StrCat("no forward or recompute of unit ", u, " for micro-batch ", mb));
    }
    // AccTFM across units, as in RunForward, towards the model's start.
    Unit* next = u - 1 >= b.units().begin() ? OwnedUnit(u - 1) : nullptr;
    const bool stream =
        next != nullptr && unit->streams_tensor_parallel() && next->streams_tensor_parallel();
    unit->set_stream_output(stream);
    dy = unit->Backward(dy, batch, ctx->second);
    if (stream) unit->PassPendingTo(next);
    contexts_.erase(ctx);
    if (deferred_all_reduce >= 0) {
      RETURN_IF_ERROR(OverlapAllReduce(deferred_all_reduce));
      deferred_all_reduce = -1;
    }
    if (final_backward_of_unit_[u] == current_instruction_ && OverlapsAllReduce()) {
      if (stream) {
        deferred_all_reduce = u;
      } else {
        RETURN_IF_ERROR(OverlapAllReduce(u));
      }
    }
  }
  if (b.units().begin() > 0) grads_out_[mb] = dy;
  return absl::OkStatus();
}

absl::Status StageRuntime::Send(const v1::Instruction::Send& s, int64_t iteration) {
  const v1::TensorKey& key = s.tensor();
  Tensor tensor;
  switch (key.kind()) {
    case v1::TENSOR_KIND_ACTIVATION: {
      auto it = activations_.find({key.micro_batch(), key.unit()});
      if (it == activations_.end()) {
        return Internal(absl::StrCat("output of unit ", key.unit(), " for micro-batch ",
                                     key.micro_batch(), " missing"));
      }
      tensor = it->second;
      break;
    }
    case v1::TENSOR_KIND_ACTIVATION_GRAD: {
      ASSIGN_OR_RETURN(tensor, TakeFrom(grads_out_, key.micro_batch(), "gradient to send"));
      break;
    }
    case v1::TENSOR_KIND_TIED_EMBEDDING_GRAD: {
      Parameter* holder = TiedHolder();
      if (holder == nullptr) return Internal("no tied embedding on this stage");
      // Copied below like any host-path send, and that copy is needed: AddTied
      // adds the peer's part into this very buffer while the peer still reads
      // ours (an in-process wire hands the peer the copy's own storage).
      tensor = holder->grad;
      break;
    }
    case v1::TENSOR_KIND_UNIT_WEIGHTS: {
      Unit* unit = OwnedUnit(key.unit());
      if (unit == nullptr) return Internal(absl::StrCat("unit ", key.unit(), " is not owned here"));
      tensor = PackWeights(*unit);
      break;
    }
    case v1::TENSOR_KIND_EVAL_ACTIVATION: {
      auto it = eval_activations_.find({key.micro_batch(), key.unit()});
      if (it == eval_activations_.end()) {
        return Internal(absl::StrCat("validation output of unit ", key.unit(), " for micro-batch ",
                                     key.micro_batch(), " missing"));
      }
      tensor = std::move(it->second);
      eval_activations_.erase(it);
      break;
    }
    default:
      return Internal("send of an unknown tensor kind");
  }
  // Token importance for token_topk, if recorded: copied, not taken, since
  // a Bi-Partition plan may send one activation twice (the next stage's
  // forward input and another stage's recompute input), and both must be
  // ranked alike, as the papers prescribe. Cleared with the iteration.
  std::vector<float> scores;
  if (key.kind() == v1::TENSOR_KIND_ACTIVATION) {
    auto it = token_scores_.find({key.micro_batch(), key.unit()});
    if (it != token_scores_.end()) scores = it->second;
  }
  const TensorAddress address = MakeAddress(setup_.job_id, iteration, key);
  const std::pair<int, std::string> link{s.peer_stage(), EnumShortName(key.kind())};
  if (s.path() == v1::LINK_PATH_DEVICE) {
    // Device to device, in program order (the peer receives in the same
    // order): queued here, behind the work that made the tensor.
    RETURN_IF_ERROR(NameSend(setup_.device_channel->Send(GlobalStage(s.peer_stage()), tensor),
                             s.peer_stage(), address));
    CountDeviceTransfer(tensor, &device_sent_stats_[link]);
    return absl::OkStatus();
  }
  // A tensor whose codec the backend has on its device is encoded there,
  // error feedback and codec state included (device_link_encoder.h): only
  // the payload crosses to the host. Links the backend answers UNIMPLEMENTED
  // for (the CPU backend: all) take the host path below.
  if (!s.codec().empty()) {
    const auto start = SteadyClock::now();
    absl::StatusOr<std::string> payload = device_encoder_.Encode(s, tensor, scores);
    if (payload.ok()) {
      const double seconds = SecondsSince(start);
      if (device_encoded_links_.insert(link).second) {
        PT_LOG(INFO) << OwnStageName() << ": " << link.second << " to " << StageName(s.peer_stage())
                     << " encodes " << s.codec() << " on the device";
      }
      WireTensor wire = WireTensor::Encoded(s.codec(), *std::move(payload), tensor.shape());
      const int64_t bytes = wire.wire_bytes();
      return sends_.Enqueue(
          [this, &s, link, wire = std::move(wire), seconds, address]() -> absl::Status {
            CountTransfer(wire, seconds, &sent_stats_[link]);
            return NameSend(transport_->SendWire(GlobalStage(s.peer_stage()), address, wire),
                            s.peer_stage(), address);
          },
          bytes);
    }
    if (payload.status().code() != absl::StatusCode::kUnimplemented) {
      return NameSend(payload.status(), s.peer_stage(), address);
    }
  }
  // The wire carries host tensors: the copy starts now (behind the work that
  // made the tensor, ahead of later writes to it), the rest runs on sends_.
  Backend* copier = tensor.on_device() ? setup_.backend : CpuBackend();
  std::shared_ptr<PendingDownload> host_copy = copier->StartDownload(tensor);
  return sends_.Enqueue(
      [this, &s, link, host_copy, scores = std::move(scores), address]() -> absl::Status {
        absl::Status status = [&]() -> absl::Status {
          ASSIGN_OR_RETURN(Tensor host, host_copy->Wait());
          ASSIGN_OR_RETURN(WireTensor wire, encoder_.Encode(s, host, &sent_stats_[link], scores));
          host = Tensor();  // A raw wire's handle is then the copy's only one: no second copy.
          return transport_->SendWireOwned(GlobalStage(s.peer_stage()), address, std::move(wire));
        }();
        return NameSend(status, s.peer_stage(), address);
      },
      tensor.size_bytes());  // the host copy's
}

void StageRuntime::AwaitSendRoom(const v1::Instruction& in, IterationResult* result) {
  // Compute would otherwise run ahead of a slow link for as long as the
  // program sends without receiving (a GPipe stage 0's whole forward pass,
  // a last stage's gradients), each queued send holding a host copy that
  // no memory plan counts (ForgetTensorsEndingAt frees the activation).
  // Before compute, not after a Send: a Send followed by a Recv never waits
  // here, so the stage always reaches the receive its peers' progress may
  // hinge on. The wait is for sends already queued, which complete when
  // the peer's data plane takes their frames, on its own threads: at once,
  // or once the peer's receives move its mailbox's run-ahead window or free
  // room (a tensor a receive waits for is taken past the mailbox's limit,
  // Mailbox::ReserveOrHold), both of which need only tensors this stage
  // queued before (in earlier iterations, drained by their ends, or ahead
  // in this FIFO queue) or the peer's own; and the transport's own wait
  // times out, failing the send. (Not when the tensor a peer's receive
  // waits for is queued on a stream behind one held for room: a
  // Bi-Partition routed input filling a GPipe peer's mailbox. The peer's
  // receive then times out and the job recovers, as the mailbox says.)
  // A failed send ends the wait; the next Send, Recv or the drain reports
  // it. Waiting on the link is idle time.
  const int64_t most = setup_.max_queued_send_bytes;
  // Only this thread queues, so room once seen stays until its next Send.
  if (sends_.pending() <= 1 || sends_.queued_bytes() <= most) return;
  const auto start = SteadyClock::now();
  const std::string what = DescribeInstruction(in);
  ShowActivity(
      absl::StrCat(what, ": waiting for queued sends to leave (over ", most, " bytes of them)"));
  sends_.AwaitQueuedBytesAtMost(most);
  ShowActivity(what);
  result->idle_seconds += SecondsSince(start);
}

absl::StatusOr<WireTensor> StageRuntime::RecvWireWatchingSends(int peer,
                                                               const TensorAddress& address) {
  // In the step after a validation pass, also for the rest of the others'
  // pass (RunEval).
  const absl::Duration timeout = setup_.recv_timeout + eval_wait_grace_;
  const absl::Time deadline = MonotonicClock()->Now() + timeout;
  // While this stage's sends are queued, one may fail here (a codec that
  // refuses non-finite values, a refused frame): the peer waiting for it
  // then waits too, and this receive, often the very answer to it, would
  // wait out the whole timeout. Both stages then reported DEADLINE_EXCEEDED,
  // a peer failure that the coordinator recovers from, again and again,
  // instead of the send's own error. So wait in slices until the sends are
  // done, and give up at the first that fails.
  // Once sliced, a timeout says the whole wait (WholeWait), not the last
  // slice's or the rest's after the sends were done.
  bool sliced = false;
  while (sends_.pending() > 0) {
    sliced = true;
    const absl::Duration left = std::max(absl::ZeroDuration(), deadline - MonotonicClock()->Now());
    absl::StatusOr<WireTensor> wire =
        transport_->RecvWire(peer, address, std::min(kSendWatchSlice, left));
    if (!absl::IsDeadlineExceeded(wire.status())) return wire;
    RETURN_IF_ERROR(SendFailedFirst());  // a send that failed meanwhile first
    if (left <= kSendWatchSlice) return WholeWait(wire.status(), timeout);
  }
  RETURN_IF_ERROR(SendFailedFirst());
  absl::StatusOr<WireTensor> wire = transport_->RecvWire(
      peer, address, std::max(absl::ZeroDuration(), deadline - MonotonicClock()->Now()));
  if (sliced && absl::IsDeadlineExceeded(wire.status())) return WholeWait(wire.status(), timeout);
  return wire;
}

absl::Status StageRuntime::WholeWait(const absl::Status& last_slice, absl::Duration waited) {
  // The transport's timeout reads "waited <its timeout> for <tensor>...":
  // that of the last slice, often a few milliseconds, where the stage
  // waited the whole receive timeout.
  const absl::string_view message = last_slice.message();
  const size_t rest = message.find(" for ");
  if (!absl::StartsWith(message, "waited ") || rest == absl::string_view::npos) return last_slice;
  return absl::DeadlineExceededError(
      absl::StrCat("waited ", absl::FormatDuration(waited), message.substr(rest)));
}

absl::Status StageRuntime::SendFailedFirst() {
  const absl::Status failed = sends_.TakeError();
  if (failed.ok()) return failed;
  return absl::Status(
      failed.code(),
      absl::StrCat("not received: a send of this stage failed first: ", failed.message()));
}

absl::Status StageRuntime::DrainSends(IterationResult* result) {
  const auto start = SteadyClock::now();
  absl::Status status = sends_.Drain();
  if (result != nullptr) {
    result->phase_seconds["send"] += SecondsSince(start);
    for (auto& [link, stats] : sent_stats_) AddLinkStats(stats, &result->sent[link]);
    for (auto& [link, stats] : device_sent_stats_) AddLinkStats(stats, &result->sent[link]);
  }
  sent_stats_.clear();
  device_sent_stats_.clear();
  return status;
}

absl::Status StageRuntime::Recv(const v1::Instruction::Recv& r, int64_t iteration,
                                IterationResult* result) {
  const v1::TensorKey& key = r.tensor();
  const TensorAddress address = MakeAddress(setup_.job_id, iteration, key);
  Unit* weights_of = nullptr;
  if (key.kind() == v1::TENSOR_KIND_UNIT_WEIGHTS) {
    weights_of = OwnedUnit(key.unit());
    if (weights_of == nullptr)
      return Internal(absl::StrCat("unit ", key.unit(), " is not owned here"));
  }
  const GptConfig& m = setup_.train.model;
  const int per = setup_.train.batch_size / setup_.train.micro_batches;
  Shape expected{per, setup_.train.seq_len, m.d_model};
  if (key.kind() == v1::TENSOR_KIND_TIED_EMBEDDING_GRAD) {
    expected = {m.vocab_size / setup_.tensor_parallel, m.d_model};  // this rank's rows
  }
  if (key.kind() == v1::TENSOR_KIND_EVAL_ACTIVATION) {
    expected = {EvalCount(key.micro_batch()), setup_.train.seq_len, m.d_model};
  }
  if (weights_of != nullptr) expected = {WeightCount(*weights_of)};
  const std::string what = absl::StrCat(address.DebugString(), " from ", StageName(r.peer_stage()));
  LinkStats& link = result->received[{r.peer_stage(), EnumShortName(key.kind())}];
  if (r.path() == v1::LINK_PATH_DEVICE) {
    absl::StatusOr<Tensor> t = setup_.device_channel->Recv(GlobalStage(r.peer_stage()), expected);
    if (!t.ok()) {
      return absl::Status(t.status().code(), absl::StrCat(what, ": ", t.status().message()));
    }
    CountDeviceTransfer(*t, &link);
    return Store(key, *std::move(t), weights_of);
  }
  ASSIGN_OR_RETURN(WireTensor wire, RecvWireWatchingSends(GlobalStage(r.peer_stage()), address));
  // The codec is the program's choice, not the sender's: a frame encoded
  // otherwise is refused before it is decoded (a codec can cost its decoder
  // far more than its bytes; plan.proto Instruction.Recv.codec).
  if (!r.codec().empty()) {
    const std::string& sent = wire.encoded() ? wire.codec : std::string(kCodecNone);
    if (sent != r.codec()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " arrived as codec \"", sent,
                                                     "\"; the program receives it as \"", r.codec(),
                                                     "\""));
    }
  }
  // The size the sender declares is checked before anything is decoded: a
  // 256 KiB PowerSGD payload can declare 4 GiB of values.
  if (NumElements(wire.decoded_shape()) != NumElements(expected)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has shape ",
                                                   ShapeToString(wire.decoded_shape()),
                                                   "; expected ", ShapeToString(expected)));
  }
  Tensor t;
  bool on_device = false;
  // A payload the backend can decode on its device is decoded there: no
  // fp32 copy crosses from the host (packed weights are unpacked on the host).
  if (wire.encoded() && weights_of == nullptr) {
    const auto start = SteadyClock::now();
    absl::StatusOr<Tensor> decoded =
        setup_.backend->DecodeOnDevice(wire.codec, wire.payload, expected);
    if (decoded.ok()) {
      const double seconds = SecondsSince(start);
      CountTransfer(wire, seconds, &link);
      result->phase_seconds["decode"] += seconds;
      t = *std::move(decoded);
      on_device = true;
    } else if (decoded.status().code() != absl::StatusCode::kUnimplemented) {
      return absl::Status(decoded.status().code(),
                          absl::StrCat(what, ": ", decoded.status().message()));
    }
  }
  if (!on_device) {
    const double decode_before = link.codec_seconds;
    ASSIGN_OR_RETURN(t, decoder_.Decode(wire, what, &link));
    result->phase_seconds["decode"] += link.codec_seconds - decode_before;
    if (t.numel() != NumElements(expected)) {
      return absl::InvalidArgumentError(absl::StrCat(what, " has shape ", ShapeToString(t.shape()),
                                                     "; expected ", ShapeToString(expected)));
    }
    t = t.Reshape(expected);
    // Units compute on the backend's device (a no-op on the CPU backend),
    // without waiting for the work queued before (the copy queues behind
    // it); packed weights are unpacked from the host copy.
    if (weights_of == nullptr) t = setup_.backend->UploadAsync(t);
  }
  return Store(key, std::move(t), weights_of);
}

absl::Status StageRuntime::Store(const v1::TensorKey& key, Tensor t, Unit* weights_of) {
  switch (key.kind()) {
    case v1::TENSOR_KIND_ACTIVATION:
      activations_[{key.micro_batch(), key.unit()}] = t;
      break;
    case v1::TENSOR_KIND_ACTIVATION_GRAD:
      grads_in_[key.micro_batch()] = t;
      break;
    case v1::TENSOR_KIND_TIED_EMBEDDING_GRAD:
      tied_received_ = t;
      break;
    case v1::TENSOR_KIND_UNIT_WEIGHTS:
      UnpackWeights(t, weights_of);
      break;
    case v1::TENSOR_KIND_EVAL_ACTIVATION:
      eval_activations_[{key.micro_batch(), key.unit()}] = t;
      break;
    default:
      return Internal("receive of an unknown tensor kind");
  }
  return absl::OkStatus();
}

absl::Status StageRuntime::GatherReplicaLosses(int64_t iteration, IterationResult* result) {
  const int share = setup_.train.micro_batches / setup_.replicas;
  if (static_cast<int>(result->micro_batch_losses.size()) != share) {
    return Internal(
        absl::StrCat(result->micro_batch_losses.size(), " losses for ", share, " micro-batches"));
  }
  // Replica order: the gather is in the step's micro-batch order.
  Collectives collectives(transport_, ReplicaGroup(), RingSumOptions(setup_.recv_timeout));
  RETURN_IF_ERROR(collectives.status());
  const auto start = SteadyClock::now();
  ASSIGN_OR_RETURN(Tensor all,
                   collectives.AllGather(iteration, kLossGatherTag,
                                         Tensor::FromVector({share}, result->micro_batch_losses),
                                         setup_.train.micro_batches));
  CountCollective(result, "loss_gather", all.size_bytes(), start);
  CountWaited(result, start);  // mostly for the slowest replica
  result->micro_batch_losses = all.ToVector();
  return absl::OkStatus();
}

bool StageRuntime::OverlapsAllReduce() const {
  if (setup_.replicas < 2) return false;
  if (setup_.device_collective != nullptr) return true;  // queued on this thread
  for (const auto& [index, unit] : units_) {
    for (const Parameter* p : unit->parameters()) {
      if (p->grad.on_device()) return false;  // downloads belong to the interpreter's thread
    }
  }
  return true;
}

absl::Status StageRuntime::OverlapAllReduce(int unit) {
  // The gradients are final: nothing touches them again before the
  // optimizer step drains all_reduces_ (the tied wte, which AddTied and the
  // clipping read, stays out). Their host buffers are the backend's own.
  overlapped_units_.insert(unit);
  for (Parameter* p : units_.at(unit)->parameters()) {
    if (p->name == "wte.weight") continue;
    bucket_.push_back(p);
    // By a size every tensor rank counts alike (a shard's: the whole
    // tensor's over the ranks), so that the ranks cut the same buckets: a
    // cube's vector shards live on its diagonal only, and ranks cutting
    // by their own sizes put the tensors all hold whole (wpe, ln_f) in
    // different sums, added in other orders.
    bucket_numel_ +=
        p->shard.sharded() ? NumElements(p->shard.full_shape) / p->shard.ranks : p->grad.numel();
  }
  if (bucket_numel_ * 4 >= setup_.data_parallel_bucket_bytes) return FlushBucket();
  return absl::OkStatus();
}

absl::Status StageRuntime::FlushBucket() {
  if (bucket_numel_ == 0) return absl::OkStatus();
  std::vector<Parameter*> params = std::move(bucket_);
  bucket_.clear();
  bucket_numel_ = 0;
  group_stats_.push_back(std::make_unique<IterationResult::CollectiveStats>());
  IterationResult::CollectiveStats* stats = group_stats_.back().get();
  // On the device the sum is only queued: no thread needed.
  if (setup_.device_collective != nullptr) return DeviceAllReduceGroup(params, stats);
  const CollectiveGroup replicas = ReplicaGroup();
  const int64_t iteration = iteration_;
  // Every replica fills the same buckets in the same order (same program),
  // so the tags and the residual's slot agree across them.
  const int tag = kOverlapTagBase + overlap_tags_used_;
  overlap_tags_used_ += GroupTags(params);
  return all_reduces_.Enqueue([this, params, stats, replicas, iteration, tag]() -> absl::Status {
    Collectives collectives(transport_, replicas, GroupOptions(setup_.recv_timeout));
    RETURN_IF_ERROR(collectives.status());
    // The bucket's residuals are this thread's alone: the interpreter
    // touches none of them before it drains.
    return AllReduceGroup(collectives, iteration, tag, params, stats);
  });
}

Tensor StageRuntime::OnHost(const Tensor& t) const {
  return t.on_device() ? setup_.backend->Download(t) : t;
}

bool StageRuntime::PowerSgdPays(const Parameter& p) const {
  // PowerSGD pays where r (rows + cols) < rows * cols (Vogels et al.
  // leave vectors uncompressed too).
  const int rank = setup_.data_parallel_powersgd_rank;
  const Shape& shape = p.grad.shape();
  return rank > 0 && shape.size() == 2 && int64_t{rank} * (shape[0] + shape[1]) < p.grad.numel();
}

int StageRuntime::GroupTags(const std::vector<Parameter*>& params) const {
  int tags = setup_.tensor_parallel > 1 ? 2 : 1;  // the flat tensors'
  for (const Parameter* p : params) tags += PowerSgdPays(*p) ? 2 : 0;
  return tags;
}

std::vector<std::vector<Parameter*>> StageRuntime::FlatGroups(
    const std::vector<Parameter*>& params) const {
  if (setup_.tensor_parallel <= 1) return {params};
  std::vector<std::vector<Parameter*>> groups(2);  // replicated, then sharded
  for (Parameter* p : params) groups[p->shard.sharded() ? 1 : 0].push_back(p);
  return groups;
}

absl::Status StageRuntime::AllReduceGroup(Collectives& collectives, int64_t iteration, int tag,
                                          const std::vector<Parameter*>& params,
                                          IterationResult::CollectiveStats* stats) {
  const int rank = setup_.data_parallel_powersgd_rank;
  std::vector<Parameter*> flat_params;
  for (Parameter* p : params) {
    if (!PowerSgdPays(*p)) {
      flat_params.push_back(p);
      continue;
    }
    Tensor g = OnHost(p->grad).Clone();
    const int64_t rows = p->grad.shape()[0], cols = p->grad.shape()[1];
    const auto start = SteadyClock::now();
    RETURN_IF_ERROR(PowerSgdAllReduce(collectives, iteration, tag, rank, rows, cols,
                                      /*error_feedback=*/true, g, &dp_feedback_[p->name]));
    tag += 2;
    // What crossed: P [rows, r] and Q [cols, r], all-reduced.
    CountCollectiveCall(stats, g.size_bytes(), int64_t{rank} * (rows + cols) * 4, start);
    if (p->grad.on_device()) {
      setup_.backend->CopyFromHost(g, &p->grad);
    } else {
      std::memcpy(p->grad.data(), g.data(), g.size_bytes());
    }
  }
  // With tensor ranks, the tensors every rank holds whole (LayerNorms,
  // biases, wpe) go in a flat tensor of their own: beside the shards, whose
  // sizes differ between ranks (a cube's vectors), they sat at other
  // offsets on each rank's replica group, summed in another order or coded
  // raw on one rank and fp16 on another, and the ranks' copies drifted.
  for (const std::vector<Parameter*>& group : FlatGroups(flat_params)) {
    RETURN_IF_ERROR(AllReduceFlat(collectives, iteration, tag++, group, stats));
  }
  return absl::OkStatus();
}

absl::Status StageRuntime::AllReduceFlat(Collectives& collectives, int64_t iteration, int tag,
                                         const std::vector<Parameter*>& flat_params,
                                         IterationResult::CollectiveStats* stats) {
  int64_t numel = 0;
  for (const Parameter* p : flat_params) numel += p->grad.numel();
  if (numel == 0) return absl::OkStatus();
  Tensor flat = Tensor::Uninitialized({numel});  // every element written next
  int64_t offset = 0;
  for (const Parameter* p : flat_params) {
    const Tensor g = OnHost(p->grad);
    std::memcpy(flat.data() + offset, g.data(), g.size_bytes());
    offset += g.numel();
  }
  const auto start = SteadyClock::now();
  if (dp_quantizer_ != nullptr) {
    // Error feedback: what the codec dropped of each gradient's last
    // contribution goes with this one (every replica's residual is its
    // own). Before the first step, + 0 as the residual (the same bits).
    offset = 0;
    for (const Parameter* p : flat_params) {
      const Tensor& e = dp_feedback_[p->name].residual;
      float* x = flat.data() + offset;
      const int64_t n = p->grad.numel();
      for (int64_t i = 0; i < n; ++i) x[i] += e.numel() == n ? e.data()[i] : 0.0f;
      offset += n;
    }
    // Wire: the tensor encoded once, the basis of the exact path (its fp32
    // size) and PowerSGD's (its factors' size); what a member sends is
    // 2(N-1)/N of that for N >= 3, which made fp16 look 0.875 of exact at
    // 8 replicas. No stats: their norms would cost two passes. A chunk the
    // codec refused (fp16 past 65504) travels raw, and is counted here at
    // the codec's size all the same.
    Tensor dropped;
    RETURN_IF_ERROR(collectives.AllReduceEncoded(iteration, tag, *dp_quantizer_, numel, flat,
                                                 /*stats=*/nullptr, &dropped));
    CountCollectiveCall(stats, flat.size_bytes(), dp_quantizer_->EncodedBytes({numel}), start);
    offset = 0;
    for (const Parameter* p : flat_params) {
      const int64_t n = p->grad.numel();
      dp_feedback_[p->name].residual =
          dropped.Slice(offset, offset + n).Clone().Reshape(p->grad.shape());
      offset += n;
    }
  } else {
    // Residuals a checkpoint restored where this stage sends exactly.
    offset = 0;
    for (const Parameter* p : flat_params) {
      const Tensor e = TakeRestoredResidual(*p);
      float* x = flat.data() + offset;
      for (int64_t i = 0; i < e.numel(); ++i) x[i] += e.data()[i];
      offset += p->grad.numel();
    }
    RETURN_IF_ERROR(collectives.AllReduce(iteration, tag, flat));
    CountCollectiveCall(stats, flat.size_bytes(), flat.size_bytes(), start);
  }
  offset = 0;
  for (Parameter* p : flat_params) {
    const int64_t n = p->grad.numel();
    if (p->grad.on_device()) {
      setup_.backend->CopyFromHost(flat.Slice(offset, offset + n).Reshape(p->grad.shape()),
                                   &p->grad);
    } else {
      std::memcpy(p->grad.data(), flat.data() + offset, static_cast<size_t>(n) * sizeof(float));
    }
    offset += n;
  }
  return absl::OkStatus();
}

Tensor StageRuntime::TakeRestoredResidual(const Parameter& p) {
  auto pending = dp_feedback_.find(p.name);
  if (pending == dp_feedback_.end()) return Tensor();
  Tensor e = pending->second.residual;
  dp_feedback_.erase(pending);
  return e.numel() == p.grad.numel() ? e : Tensor();
}

absl::Status StageRuntime::DeviceAllReduceGroup(const std::vector<Parameter*>& params,
                                                IterationResult::CollectiveStats* stats) {
  for (Parameter* p : params) {
    const Tensor e = TakeRestoredResidual(*p);
    if (e.numel() > 0) {
      Tensor g = OnHost(p->grad).Clone();
      for (int64_t i = 0; i < g.numel(); ++i) g.data()[i] += e.data()[i];
      if (p->grad.on_device()) {
        setup_.backend->CopyFromHost(g, &p->grad);
      } else {
        std::memcpy(p->grad.data(), g.data(), g.size_bytes());
      }
    }
  }
  // The replicated tensors apart from the shards, as AllReduceGroup does;
  // each sum counted as the host branch counts its flat tensors (none for
  // no elements), with the time to queue it (the stand-in's: the whole
  // sum) and what crossed as fp32.
  for (const std::vector<Parameter*>& group : FlatGroups(params)) {
    std::vector<Tensor*> sums;
    int64_t group_bytes = 0;
    for (Parameter* p : group) {
      sums.push_back(&p->grad);
      group_bytes += p->grad.size_bytes();
    }
    if (group_bytes == 0) continue;
    const auto start = SteadyClock::now();
    RETURN_IF_ERROR(setup_.device_collective->AllReduceSum(sums));
    CountCollectiveCall(stats, group_bytes, group_bytes, start);
  }
  return absl::OkStatus();
}

absl::Status StageRuntime::AllReduceGradients(int64_t iteration, IterationResult* result) {
  RETURN_IF_ERROR(FlushBucket());  // the last, partly filled bucket
  RETURN_IF_ERROR(all_reduces_.Drain());
  if (transport_ == nullptr) return Internal("data parallelism needs a transport");
  Collectives collectives(transport_, ReplicaGroup(), GroupOptions(setup_.recv_timeout));
  RETURN_IF_ERROR(collectives.status());
  Parameter* tied = TiedHolder();
  std::set<const Parameter*> overlapped;
  for (int u : overlapped_units_) {
    for (const Parameter* p : units_.at(u)->parameters()) overlapped.insert(p);
  }
  std::vector<Parameter*> rest;  // what no bucket carried
  for (Parameter* p : parameters()) {
    if (p != tied && overlapped.count(p) == 0) rest.push_back(p);
  }
  group_stats_.push_back(std::make_unique<IterationResult::CollectiveStats>());
  if (setup_.device_collective != nullptr) {
    RETURN_IF_ERROR(DeviceAllReduceGroup(rest, group_stats_.back().get()));
  } else {
    RETURN_IF_ERROR(AllReduceGroup(collectives, iteration, kDataParallelTagBase + 2, rest,
                                   group_stats_.back().get()));
  }
  for (const auto& stats : group_stats_) {
    if (result == nullptr || stats->count == 0) continue;
    IterationResult::CollectiveStats& total = result->collectives["data_parallel"];
    total.count += stats->count;
    total.bytes += stats->bytes;
    total.wire_bytes += stats->wire_bytes;
    total.seconds += stats->seconds;
  }
  if (tied != nullptr && !tied_reduced_) {
    Tensor g = OnHost(tied->grad);
    const auto start = SteadyClock::now();
    RETURN_IF_ERROR(collectives.AllReduceInMemberOrder(iteration, kDataParallelTagBase + 1, g));
    CountCollective(result, "data_parallel", g.size_bytes(), start);
    if (tied->grad.on_device()) setup_.backend->CopyFromHost(g, &tied->grad);
  }
  // The optimizer step, queued next, reads the device sums.
  if (setup_.device_collective != nullptr) RETURN_IF_ERROR(setup_.device_collective->AwaitSums());
  return setup_.backend->status();
}

absl::Status StageRuntime::PrepareOptimizerStep(int64_t iteration, IterationResult* result) {
  const TrainConfig& train = setup_.train;
  optimizer_.set_lr(LearningRate(train, optimizer_.steps_taken()));
  if (setup_.replicas == 1 && !dp_feedback_.empty()) AddRestoredFeedback();
  const std::string step = current_instruction();
  if (setup_.replicas > 1) {
    // The all-reduce's time at the step (the wait for the overlapped
    // buckets, then the rest): its own phase, not the optimizer's, and
    // idle. Its wait for the slowest replica is not told apart from its
    // transfers and sums (a ring interleaves them, a device sum hides
    // them), so all of it counts as waiting, as a traced step draws it.
    ShowActivity(
        absl::StrCat(step, ": all-reduce of the gradients over ", setup_.replicas, " replicas"));
    const auto start = SteadyClock::now();
    const absl::Status reduced = AllReduceGradients(iteration, result);
    if (result != nullptr) result->phase_seconds["all_reduce"] += SecondsSince(start);
    CountWaited(result, start);
    ShowActivity(step);
    RETURN_IF_ERROR(reduced);
  }
  if (!(train.grad_clip > 0)) return absl::OkStatus();
  // The global norm below waits for every other stage's (and replica's).
  ShowActivity(absl::StrCat(step, ": global gradient norm for clipping"));
  absl::Cleanup shown = [&] { ShowActivity(step); };
  // Every parameter of the model in GptModel::parameters() order (the
  // head's tied copy of wte left out), and its squared-gradient sum: this
  // stage's own, the others' from their broadcasts. Three floats per
  // parameter: 1 when present, then the double's bytes: the copy's squares
  // where it counts toward the norm (ParameterShard::CountsTowardNorm), 0
  // where another tensor rank's copy counts instead.
  std::vector<std::pair<int, std::string>> order;
  std::map<std::pair<int, std::string>, int> index;
  for (int u = 0; u < num_units_; ++u) {
    for (const ParameterShape& p : UnitParameterShapes(train.model, u)) {
      if (u == num_units_ - 1 && p.name == "wte.weight") continue;
      index[{u, p.name}] = static_cast<int>(order.size());
      order.emplace_back(u, p.name);
    }
  }
  const int64_t slots = 3 * static_cast<int64_t>(order.size());
  Tensor mine = Tensor::Zeros({slots});
  std::vector<const Parameter*> own;  // the copies that count
  std::vector<int> own_slots;
  for (int u = setup_.backward.begin(); u < setup_.backward.end(); ++u) {
    for (const Parameter* p : units_.at(u)->parameters()) {
      auto it = index.find({u, p->name});
      if (it == index.end()) continue;  // the head's tied copy
      mine.data()[3 * it->second] = 1.0f;
      if (!p->shard.CountsTowardNorm()) continue;
      own.push_back(p);
      own_slots.push_back(it->second);
    }
  }
  // One backend call: a device backend waits once, not once per parameter.
  const std::vector<double> own_squares = ParametersSquares(setup_.backend, own);
  for (size_t k = 0; k < own.size(); ++k) {
    std::memcpy(mine.data() + 3 * own_slots[k] + 1, &own_squares[k], sizeof(double));
  }
  if (tp_comm_) RETURN_IF_ERROR(SumTensorRankSquares(iteration, &mine, result));
  std::vector<Tensor> all = {mine};
  const std::vector<int>& group = setup_.optimizer_stages;
  if (group.size() > 1) {
    if (transport_ == nullptr) return Internal("gradient clipping needs a transport");
    std::vector<int> members;  // the transport's numbers of this replica's stages
    for (int stage : group) members.push_back(GlobalStage(stage));
    Collectives collectives(transport_, CollectiveGroup{members, setup_.job_id},
                            RingSumOptions(setup_.recv_timeout));
    RETURN_IF_ERROR(collectives.status());
    // Every stage's slots in member order, in one round: each sends to all,
    // then receives (one latency, not one per stage). The bytes arrive as
    // sent, so the doubles are exact. It blocks until every stage reaches
    // its step too (the pipeline's cool-down).
    const auto start = SteadyClock::now();
    ASSIGN_OR_RETURN(all, collectives.AllGatherSmall(iteration, kGradClipTagBase, mine));
    CountCollective(result, "grad_clip", mine.size_bytes() * collectives.size(), start);
    CountWaited(result, start);
  }
  // Every stage sums the same slots in the same (parameter) order: the
  // same total, bit for bit, so every stage scales by the same factor.
  double total = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const Tensor* from = nullptr;
    for (const Tensor& t : all) {
      if (t.data()[3 * i] == 1.0f) from = &t;
    }
    if (from == nullptr) {
      return Internal(absl::StrCat("gradient clipping: no stage of [", absl::StrJoin(group, ", "),
                                   "] holds ", order[i].second, " of unit ", order[i].first));
    }
    double squares;
    std::memcpy(&squares, from->data() + 3 * i + 1, sizeof(double));
    total += squares;
  }
  if (result != nullptr) result->grad_norm = std::sqrt(total);
  ScaleGradients(setup_.backend, parameters(), ClipScale(total, train.grad_clip));
  return setup_.backend->status();
}

absl::Status StageRuntime::SumTensorRankSquares(int64_t iteration, Tensor* mine,
                                                IterationResult* result) {
  // Every rank's slots, in rank order and one round (AllGatherSmall copies
  // bytes: the doubles arrive exactly).
  const auto start = SteadyClock::now();
  ASSIGN_OR_RETURN(const std::vector<Tensor> ranks,
                   tp_collectives_->AllGatherSmall(iteration, kGradClipTensorTagBase, *mine));
  CountCollective(result, "grad_clip", mine->size_bytes() * tp_collectives_->size(), start);
  CountWaited(result, start);
  // Each rank's slot holds only what CountsTowardNorm lets it add (a
  // shard's share, a replica's squares on one rank, 0 on the others), so
  // the sum over the ranks, in rank order, counts every tensor once.
  for (int64_t slot = 0; slot < mine->numel(); slot += 3) {
    if (mine->data()[slot] != 1.0f) continue;  // another stage's
    double total = 0;
    for (const Tensor& of_rank : ranks) {
      double squares;
      std::memcpy(&squares, of_rank.data() + slot + 1, sizeof(double));
      total += squares;
    }
    std::memcpy(mine->data() + slot + 1, &total, sizeof(double));
  }
  return absl::OkStatus();
}

absl::Status StageRuntime::AddTied(const v1::Instruction::AddTiedGradient& add, int64_t iteration,
                                   IterationResult* result) {
  Parameter* holder = TiedHolder();
  if (holder == nullptr) return Internal("no tied embedding gradient on this stage");
  if (add.fused()) {
    // Optimus-CC §6: one all-reduce over [embed, head] of every replica,
    // checked by Create. Member order makes it bitwise the exchange
    // followed by the replicas' member-order all-reduce.
    std::vector<int> members;
    for (int r = 0; r < setup_.replicas; ++r) {
      members.push_back(GlobalWorker(r, add.embed_stage()));
      members.push_back(GlobalWorker(r, add.head_stage()));
    }
    Collectives collectives(transport_, CollectiveGroup{members, setup_.job_id},
                            RingSumOptions(setup_.recv_timeout));
    RETURN_IF_ERROR(collectives.status());
    Tensor g = OnHost(holder->grad);
    const auto start = SteadyClock::now();
    RETURN_IF_ERROR(collectives.AllReduceInMemberOrder(iteration, kEmbeddingSyncTag, g));
    CountCollective(result, "embedding_sync", g.size_bytes(), start);
    CountWaited(result, start);  // as the unfused exchange's receive
    if (holder->grad.on_device()) setup_.backend->CopyFromHost(g, &holder->grad);
    tied_reduced_ = true;
    return setup_.backend->status();
  }
  if (IsBackwardUnit(0) && IsBackwardUnit(num_units_ - 1)) {
    // Both parts are here: embed part + head part, as GptModel does.
    AddTiedGradient(setup_.backend, holder,
                    FindParameter(*units_.at(num_units_ - 1), "wte.weight")->grad);
    return absl::OkStatus();
  }
  if (tied_received_.is_null()) return Internal("tied gradient not received");
  // Taken, not copied: the peer's wte-sized gradient goes once added, before
  // the optimizer step and a validation pass, which the plan's memory_i does
  // not charge it to (bipartition.h).
  const Tensor received = std::move(tied_received_);
  tied_received_ = Tensor();
  AddTiedGradient(setup_.backend, holder, received);
  // The exchange (a send and a receive earlier in the program) counts as
  // one collective of the two owners; its time is in "send" and idle.
  if (result != nullptr) {
    IterationResult::CollectiveStats& stats = result->collectives["embedding_sync"];
    ++stats.count;
    stats.bytes += static_cast<int64_t>(received.numel()) * 4;
    stats.wire_bytes += static_cast<int64_t>(received.numel()) * 4;
  }
  return absl::OkStatus();
}

}  // namespace pipetrain
