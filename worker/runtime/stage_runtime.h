// StageRuntime: executes one stage's program (DESIGN.md §5) iteration by
// iteration — the worker's interpreter.
//
// The stage runs the forward pass of units `forward` and the backward pass
// of units `backward` (equal for equal-cut plans; different for Bi-Partition
// plans, schedule_compiler.h). It builds and initialises every unit of
// either range exactly as GptModel would (same Philox keys), keeps saved
// tensors only for units whose backward pass runs here (per micro-batch
// and unit, rebuilt by Recompute for units whose forward ran elsewhere),
// talks to other stages only through a Transport, and owns the AdamW state
// of its backward units: their weights are authoritative here; forward-only
// units get theirs by UNIT_WEIGHTS receives. Sends are encoded and receives
// decoded as the program says (LinkCompressor). With lossless transport the
// pipeline's losses and weights equal LocalTrainer's bitwise
// (pipeline_equivalence_test). Units run on setup.backend (the CPU by
// default); a device backend's error fails the instruction that hit it.
//
// Sends run in the background (send_queue.h): a Send instruction starts the
// tensor's host copy (Backend::StartDownload) and queues the rest — waiting
// for the copy, encoding, handing it to the transport — on one thread, in
// program order, so the interpreter computes the next micro-batch while the
// last one leaves (on a GPU, while its copy runs). The interpreter runs
// ahead only so far: before a compute instruction it waits while its queued
// sends hold more than StageSetup::max_queued_send_bytes (and more than one
// is queued; not after a Send, so that it always reaches its receives), so
// a stage on a slow link does not hold a host copy of every micro-batch's
// output. Every iteration and validation pass ends by waiting for its
// sends; a failed send fails the iteration (naming the send) at the next
// Send instruction, at that end, or at a Recv waiting meanwhile (whose peer
// may wait for that very send).
//
// Not thread-safe, except current_instruction(), which any thread may read.
#ifndef PIPETRAIN_WORKER_RUNTIME_STAGE_RUNTIME_H_
#define PIPETRAIN_WORKER_RUNTIME_STAGE_RUNTIME_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/annotated_mutex.h"
#include "common/data_parallel_buckets.h"
#include "kernels/compress/codec.h"
#include "proto/pipetrain/v1/plan.pb.h"
#include "worker/checkpoint/unit_checkpoint.h"
#include "worker/collectives/powersgd_all_reduce.h"
#include "worker/collectives/tensor_parallel_comm.h"
#include "worker/cube/cube_comm_collectives.h"
#include "worker/data/dataset.h"
#include "worker/model/cube_units.h"
#include "worker/model/device_channel.h"
#include "worker/model/device_collective.h"
#include "worker/model/unit.h"
#include "worker/runtime/device_link_encoder.h"
#include "worker/runtime/feedback_limits.h"
#include "worker/runtime/link_compressor.h"
#include "worker/runtime/partition_tuner.h"
#include "worker/runtime/send_queue.h"
#include "worker/train/adamw_optimizer.h"
#include "worker/train/train_config.h"
#include "worker/transport/transport.h"

namespace pipetrain {

// How long a receive waits at a time while this stage's sends are queued,
// between looks at whether one failed (StageRuntime::RecvWireWatchingSends).
inline constexpr absl::Duration kSendWatchSlice = absl::Milliseconds(50);

// StageSetup::max_queued_send_bytes' default: as much as the gRPC
// transport's queue to one peer holds (GrpcTransportOptions::
// max_queued_bytes_per_peer), which the queued sends feed: a stage's sends
// then hold about twice that at most, both queues together (and a tensor or
// two more where one is larger).
inline constexpr int64_t kMaxQueuedSendBytes = int64_t{256} << 20;

// StageRuntime::current_instruction() outside an iteration: the stage has a
// job. Not "idle", which a worker reports when it runs no job at all.
inline constexpr char kBetweenSteps[] = "between steps";

struct StageSetup {
  std::string job_id;
  TrainConfig train;  // model shape, batch, micro-batches, AdamW, seed
  int stage = 0;
  int num_stages = 1;
  v1::UnitRange forward;   // units whose forward pass runs here
  v1::UnitRange backward;  // units whose backward pass (and weights) live here
  v1::Program program;     // one iteration
  absl::Duration recv_timeout = absl::Seconds(60);
  // The forward-only validation program (Assignment.eval_program; empty:
  // RunEval does nothing here, but the others' pass is waited for: see
  // RunEval).
  v1::Program eval_program;
  // Where the units compute (not owned; outlives the runtime). Tensors cross
  // the transport on the host: sends download, receives upload.
  Backend* backend = CpuBackend();
  // Data parallelism (DESIGN.md §12): this stage belongs to replica
  // `replica` of `replicas` copies of the pipeline. The program is the
  // replica's (stages 0..num_stages-1, its share of the step's
  // micro-batches: program micro-batch k is the step's micro-batch
  // replica * (train.micro_batches / replicas) + k); the transport and the
  // device channel number stages globally, replica * num_stages + stage
  // (GlobalStage). Before each optimizer
  // step every gradient is all-reduced (summed) over the replicas' copies
  // of this stage, so all replicas step alike.
  int replica = 0;
  int replicas = 1;
  // Asked between the validation pass's instructions: true ends the pass
  // with ABORTED (the job was stopped). A stage whose pass sends and
  // receives nothing (one stage per replica) is not woken by an aborted
  // transport, and ran the whole pass after a STOP. Null: never.
  std::function<bool()> stopped;
  // Tensor parallelism (DESIGN.md §12; worker/model/tensor_parallel.h):
  // this worker is rank `tensor_rank` of the `tensor_parallel` workers that
  // split every unit of this stage (ValidateTensorParallel must pass). They
  // run the same program; each unit's all-reduces run over their group. The
  // transport numbers workers with the tensor rank innermost, (replica *
  // num_stages + stage) * tensor_parallel + tensor_rank (GlobalWorker): a
  // send or receive goes to the same tensor rank of the peer stage, and
  // the data-parallel, tied-embedding and gradient-clipping collectives run
  // among workers of this tensor rank (clipping first sums the ranks'
  // shares of each norm). Every rank of the loss stage reports the same
  // losses.
  int tensor_rank = 0;
  int tensor_parallel = 1;
  // spec.parallelism.tensor_mode: "1d" (above) or "3d": the T = p^3 ranks
  // form a cube (tensor rank r is cube rank r, CubeRankIndex) and the
  // attention and MLP units are 3-D (worker/model/cube_units.h), the
  // embedding and the head 1-D over all T ranks; ValidateCubeTensorParallel
  // replaces ValidateTensorParallel. CPU backend only, without AccTFM
  // partitions or tensor compression (not built for the cube).
  std::string tensor_mode = "1d";
  // AccTFM's fine-grained pipeline (Unit::set_tensor_parallel_partitions):
  // each attention and MLP unit's micro-batch in this many partitions, in
  // forward and in backward ({1, 2, 4}; with tensor_parallel > 1).
  int tensor_partitions = 1;
  // Per unit (model order) instead, when not empty: AccTFM's Alg. 1 choice
  // (plan.proto), forward and backward, each 1, 2 or 4.
  std::vector<int> tensor_partitions_forward;
  std::vector<int> tensor_partitions_backward;
  // > 0 with the per-unit counts above (Alg. 1's, spec.parallelism
  // .tensor_partitions 0): measure them against uniform 1, 2 and 4 for this
  // many steps each and keep the fastest (worker/runtime/partition_tuner.h;
  // 1-D only, at most 16). 0: keep the plan's counts.
  int tensor_partition_tune_steps = 0;
  // AccTFM's hybrid compression of those all-reduces
  // (spec.parallelism.tensor_compression, MakeTensorParallelCompression's
  // specs, at most 256 bytes); "none" or "": exact.
  std::string tensor_compression = "none";
  // Selective stage compression (Optimus-CC §7): > 0 compresses this
  // stage's data-parallel all-reduce with PowerSGD of this rank and error
  // feedback (worker/collectives/powersgd_all_reduce.h), matrix gradients
  // only (weights of 2 dimensions whose rank-r factors are smaller than
  // the matrix); vectors and the tied embedding go uncompressed. Every
  // replica's copy of the stage must have the same value.
  int data_parallel_powersgd_rank = 0;
  // Or a quantizer for it (MakeQuantizer's specs: fp16, bf16,
  // linear:bits=N, piecewise:bits=N; at most 256 bytes): every gradient
  // but the tied embedding goes through Collectives::AllReduceEncoded, a
  // flat tensor per bucket (below), with error feedback (what the codec
  // dropped of this replica's contribution is added to its next one). Not
  // with a PowerSGD rank; the same on every replica's copy of the stage.
  std::string data_parallel_quantizer;
  // Data parallelism on host gradients (exact or compressed): gradients are
  // all-reduced in buckets of about this many bytes, each launched (on a
  // background thread) as soon as the backward pass has finished every
  // unit in it, overlapping the rest of the backward; the last bucket at
  // the optimizer step. Buckets amortise the per-collective latency. The
  // planner's simulator predicts the default's (data_parallel_buckets.h).
  int64_t data_parallel_bucket_bytes = kDataParallelBucketBytes;
  // Checkpoints of a compressed all-reduce (Snapshot): with at most this
  // many replicas each one's error feedback is kept (a resume on the same
  // layout is bitwise); with more, only their sum, so that neither the
  // writer's memory nor the checkpoint grows past this many copies of the
  // compressed gradients (no feedback is lost; the resume is not bitwise).
  // The same on every replica.
  int max_feedback_replicas = kMaxFeedbackReplicasKept;
  // The stages that hold backward units (ascending): with
  // train.grad_clip > 0 they exchange their parameters' squared gradient
  // sums before each optimizer step (worker/train/grad_clip.h). Empty:
  // this stage alone, for a one-stage program; with grad_clip > 0 a stage
  // of a multi-stage program that holds backward units must be in it
  // (Create refuses it otherwise).
  std::vector<int> optimizer_stages;
  // The device group's channel (not owned; outlives the runtime), which
  // carries the program's LINK_PATH_DEVICE sends and receives device to
  // device (worker/model/device_channel.h); null when the program has none.
  DeviceChannel* device_channel = nullptr;
  // Data parallelism between GPUs of one host (plan.proto
  // ReplicaDeviceGroup): the collective of this stage's replicas (not
  // owned; outlives the runtime) that sums its gradients on the device,
  // each bucket queued from the interpreter's thread as soon as it is full
  // and running beside the rest of the backward pass
  // (worker/model/device_collective.h). Only for an exact all-reduce (no
  // PowerSGD rank, no quantizer); the tied embedding's sum and every other
  // reduction stay on the gRPC collectives. Null: the gRPC collectives
  // carry the gradients.
  DeviceCollective* device_collective = nullptr;
  // Pacing of the sends (>= 0): after a Send instruction the interpreter
  // waits while this stage's queued sends hold more than this many bytes
  // (host copies, or payloads encoded on the device) and more than one is
  // queued (SendQueue::AwaitQueuedBytesAtMost). Bytes, not sends: a
  // 1F1B warm-up of small tensors queues many without waiting, a GPipe
  // forward pass on a slow link no more than this.
  int64_t max_queued_send_bytes = kMaxQueuedSendBytes;
};

struct IterationResult {
  int64_t iteration = 0;
  // StageSetup::job_id: the job and plan version this iteration ran in.
  // Observers start afresh where it changes (new peers, new units).
  std::string run;
  // Filled on the stage that owns head's forward pass: with data
  // parallelism, every replica's, in the step's micro-batch order.
  std::vector<float> micro_batch_losses;
  // The most bytes of activations held between instructions: stored
  // forward outputs (kept for a send or a recompute) and received inputs,
  // counted after each instruction has freed those it read last. Unit
  // contexts' stashes are not in it (a stashed input shares its storage).
  int64_t activation_bytes_peak = 0;
  // The iteration's wall time, in two parts. Idle is waiting for other
  // workers: in receives (the pipeline bubble), and blocked in collectives
  // with other stages or replicas: the data-parallel all-reduce at the
  // optimizer step (all of its time: its wait for the slowest replica is
  // not told apart from its own transfers and sums), the clipping's norm
  // broadcasts, a fused embedding sync, the replicas' loss gather and the
  // partition tuner's sums; and before a compute instruction, waiting while
  // queued sends hold over StageSetup::max_queued_send_bytes (a slow link).
  // Busy is the rest: this stage's compute (its
  // units' tensor-parallel all-reduces included), and handing sends over
  // and waiting for the last ones at the iteration's end.
  double busy_seconds = 0;
  double idle_seconds = 0;
  // Busy time of the interpreter by phase: "forward", "backward",
  // "recompute", "send" (starting each send's copy, a device encode,
  // and at the iteration's end waiting for sends still in the background; the
  // host encoding runs on the send thread and is in `sent`'s codec time),
  // "decode", "optimizer" (clipping, the schedule and AdamW; not the norms'
  // broadcasts), "tied" (not a fused sync's all-reduce); and one phase of
  // idle time, "all_reduce" (with replicas: the data-parallel all-reduce's
  // time at the step, the wait for the buckets that overlapped the
  // backward pass included; what they hid is not here).
  std::map<std::string, double> phase_seconds;
  // What crossed each link, by (peer stage, tensor kind name): sends (with
  // encode time and sampled compression error) and receives (decode time).
  std::map<std::pair<int, std::string>, LinkStats> sent;
  std::map<std::pair<int, std::string>, LinkStats> received;
  // Collectives this stage took part in, by purpose: "data_parallel" (the
  // gradient all-reduce over the replicas: one per bucket of about
  // kDataParallelBucketBytes of every gradient but the tied embedding's,
  // one per matrix PowerSGD compresses, and the tied embedding's),
  // "embedding_sync" (the tied
  // embedding's exchange between its two owners, or the fused all-reduce
  // that replaces the exchange and its data-parallel all-reduce),
  // "grad_clip" (the all-gather of the stages' squared norms, one per
  // step, and the tensor ranks' one), "loss_gather" and
  // "tensor_parallel" (the units' all-reduces over the stage's tensor
  // ranks: one per partition of each, a recompute's again; validation's
  // left out).
  struct CollectiveStats {
    int64_t count = 0;
    int64_t bytes = 0;  // fp32 bytes of the tensors reduced or exchanged
    // What their messages carried, data_parallel: each tensor once, in fp32,
    // as PowerSGD's factors or as the quantizer encodes it (whatever the
    // replica count; a ring sends 2(N-1)/N of it); tensor_parallel: the
    // bytes this rank sent (fp32 or payloads, with AccTFM's compression the
    // token scores' all-reduce too).
    int64_t wire_bytes = 0;
    // data_parallel on a replica device collective: the time to queue its
    // sums (they run on the device, beside the backward pass).
    double seconds = 0;
    // tensor_parallel only: the time the interpreter waited for them
    // (CollectivesTensorParallelComm::waited_seconds), and, with hybrid
    // compression, the squared norm of this rank's contributions and of
    // what compression took from them (dropped tokens, codec error).
    double waited_seconds = 0;
    double compressed_norm_squared = 0;
    double compression_error_squared = 0;
    // Of those the compressed (token-sparse) all-reduces: their fp32 size
    // and the bytes this rank sent for them.
    int64_t compressed_bytes = 0;
    int64_t compressed_wire_bytes = 0;
  };
  std::map<std::string, CollectiveStats> collectives;
  // With tensor_partition_tune_steps: the partition counts this iteration
  // ran, by this stage's attention and MLP unit names, forward and
  // backward.
  std::map<std::string, std::pair<int, int>> tensor_partitions;
  // With TrainConfig::grad_clip > 0, on every stage that ran the optimizer
  // step: the global L2 norm of the model's gradients before clipping
  // (sqrt of grad_clip.h's total; with data parallelism, of the summed
  // gradients), bitwise the same on every stage, replica and tensor rank.
  // Unset without clipping (no norm is computed).
  std::optional<double> grad_norm;
};

class StageRuntime {
 public:
  // INVALID_ARGUMENT when the setup is inconsistent (a range outside the
  // model, both ranges empty, config invalid, a LINK_PATH_DEVICE send or
  // receive without a device_channel, with a codec, or of UNIT_WEIGHTS,
  // which are packed on the host; a Forward, Recompute or Backward whose
  // micro-batch is not in [0, train.micro_batches / replicas), or a
  // validation Forward's not in [0, ceil(eval_windows / rows per
  // micro-batch))). `dataset` (must outlive the runtime) is
  // needed by stages with embed or head; `transport` by stages with peers.
  static absl::StatusOr<std::unique_ptr<StageRuntime>> Create(const StageSetup& setup,
                                                              const Dataset* dataset,
                                                              Transport* transport);

  // Runs the program once for `iteration`. Errors carry the failing
  // instruction: DEADLINE_EXCEEDED from a receive names the peer and tensor;
  // INTERNAL for program errors (e.g. a backward without its forward).
  // With `trace` (may be null), on success it holds when each instruction
  // ran (plan.proto StepTrace: the wall clock at the start, then seconds
  // of a monotonic clock; a receive's wait and an optimizer step's
  // data-parallel all-reduce as waited_seconds).
  absl::StatusOr<IterationResult> RunIteration(int64_t iteration, v1::StepTrace* trace = nullptr);

  // Runs the validation program once, after `after_step` optimizer steps
  // (the tensors' iteration field): the forward pass of this stage's forward
  // units over the first W = min(eval_windows, the dataset's validation
  // windows) windows, micro-batch k holding windows [k·b, min((k+1)·b, W))
  // for micro-batch size b; micro-batches beyond W are skipped (every stage
  // holds the same dataset, so all skip the same ones). Returns the mean
  // validation loss, weighted by windows exactly as LocalTrainer::Evaluate,
  // on the stage that runs head's forward pass; nullopt elsewhere.
  // FAILED_PRECONDITION if the program is non-empty and the runtime has no
  // dataset or the dataset no validation windows; other errors as
  // RunIteration. Does not touch weights, gradients or optimizer state.
  absl::StatusOr<std::optional<float>> RunEval(int64_t after_step);

  // The parameters of the backward units, each once (a stage with embed and
  // head lists wte once): the ones this stage updates and whose values are
  // authoritative (for checkpoints and the final weights).
  std::vector<Parameter*> parameters() const;
  AdamWOptimizer& optimizer() { return optimizer_; }
  // Host copies of parameters() as the unsplit model holds them (Hugging
  // Face shapes), the tied wte.weight only on the stage holding the
  // embedding's backward (the final weights' one copy): a tensor-parallel
  // stage's shards gathered to its tensor
  // rank 0, a collective that every rank calls, after its last step
  // (`iteration` numbers the messages: the step count); the other ranks
  // send their shards and get an empty list (only rank 0 uploads). Without
  // tensor parallelism, plain host copies. Errors: the collective's, or
  // the backend's.
  absl::StatusOr<std::vector<Parameter>> UnsplitParameterCopies(int64_t iteration);

  // Checkpoints (worker/checkpoint/unit_checkpoint.h). Snapshot: host
  // copies of every backward unit's parameters and AdamW moments, taken
  // between iterations (the copies are the caller's: training goes on while
  // they are written), labelled `step`. They are the unsplit model's
  // tensors (Hugging Face shapes) whatever the layout, so a checkpoint
  // resumes on any other: a tensor-parallel stage gathers its shards and
  // their moments to its tensor rank 0, a collective that every rank of
  // the group calls after the same step; rank 0 gets the whole snapshot
  // (and writes it), the others send their shards and get a snapshot with
  // no units: no rank but the writer holds a copy of the whole stage.
  // With compressed data-parallel gradients (SnapshotsEveryReplica), every
  // replica calls it: each sends its error feedback (its residuals per
  // parameter) to replica 0 first, whose snapshot holds them all
  // (UnitState::feedback) with PowerSGD's warm starts; the others get a
  // snapshot with no units. A stage whose sends go through PowerSGD keeps
  // its links' warm starts in its first backward unit's state
  // (UnitState::link_warm_q), every replica's, gathered to replica 0 as the
  // feedback is; with tensor ranks, rank 0's (every rank sends the same
  // replicated tensors, a 3-D cube's too: what leaves a stage is full,
  // cube_units.h; so their warm starts agree). A stage with no backward
  // unit has no file to keep them in. A stage whose tuner has kept its AccTFM partition counts records
  // them there too (UnitState::tuned_partitions; every replica and tensor
  // rank keeps the same). Errors: the collective's, or the backend's.
  absl::StatusOr<StageSnapshot> Snapshot(int64_t step);
  // Whether every replica of this stage must call Snapshot, not only
  // replica 0: it has replicas and compresses their all-reduce, or sends
  // through PowerSGD.
  bool SnapshotsEveryReplica() const;
  // Sets every unit this stage holds (forward and backward) to the values in
  // `units` (unsplit tensors, as Snapshot gives them), and the AdamW moments
  // of its backward units and the step count to theirs; call before the
  // first iteration. A tensor-parallel rank keeps its shard of each split
  // tensor and of its moments (SliceShard, as the initialisation cuts
  // them). INVALID_ARGUMENT naming the unit or tensor when one this stage
  // needs is missing or mis-shaped (nothing is changed then). Error
  // feedback in `units` (UnitState::feedback, of D replicas) goes to this
  // stage's replica r as the sum over the replicas i = r mod replicas, in
  // the order of i: on the same layout each replica gets its own back
  // (bitwise the state of a run that never stopped), on another the total
  // is kept; PowerSGD's warm starts too when their shape fits. The links'
  // warm starts in the backward units' states (UnitState::link_warm_q) of
  // the checkpoint's replica r mod its replicas go to this replica r's
  // links of the same key (peer stage, tensor kind, unit), where a link's
  // first send takes one whose shape fits. A stage that tunes its
  // partitions keeps the counts recorded in its first backward unit's
  // state instead of measuring again when they were measured on this
  // layout (tensor ranks, samples per micro-batch, forward and backward
  // ranges), so it goes on as the run that never stopped; on another it
  // measures again (a log line says why).
  absl::Status Restore(const std::vector<UnitState>& units, int64_t optimizer_steps);
  // What the runtime is doing now, e.g. "recv ACTIVATION unit 3 mb 1 from stage 0".
  // The instruction running, or kBetweenSteps before the first iteration
  // and after each.
  std::string current_instruction() const;

 private:
  StageRuntime(const StageSetup& setup, const Dataset* dataset, Transport* transport);
  absl::Status Execute(const v1::Instruction& in, int64_t iteration, IterationResult* result);
  absl::Status Forward(const v1::Instruction::Forward& f);
  absl::Status EvalForward(const v1::Instruction::Forward& f);
  int EvalCount(int micro_batch) const;  // windows in validation micro-batch
  absl::Status Recompute(const v1::Instruction::Recompute& r);
  absl::Status Backward(const v1::Instruction::Backward& b);
  absl::Status Send(const v1::Instruction::Send& s, int64_t iteration);
  // Before the compute instruction `in`: waits while the queued sends hold
  // over setup_.max_queued_send_bytes (SendQueue::AwaitQueuedBytesAtMost),
  // showing it in current_instruction(), and adds the wait to
  // result->idle_seconds.
  void AwaitSendRoom(const v1::Instruction& in, IterationResult* result);
  // The transport's RecvWire, up to setup_.recv_timeout, but while sends
  // of this stage are queued in slices of kSendWatchSlice, returning a
  // failed send's error (SendFailedFirst) as soon as there is one.
  absl::StatusOr<WireTensor> RecvWireWatchingSends(int peer, const TensorAddress& address);
  // sends_' stuck error, said to have stopped a receive; OK when none.
  absl::Status SendFailedFirst();
  // The last slice's DEADLINE_EXCEEDED restated as a wait of `waited` (the
  // whole receive timeout), else `last_slice` as it is.
  static absl::Status WholeWait(const absl::Status& last_slice, absl::Duration waited);
  // Waits for every queued send (time counted as the "send" phase of
  // `result`, if given); moves what they sent into result->sent.
  absl::Status DrainSends(IterationResult* result);
  absl::Status Recv(const v1::Instruction::Recv& r, int64_t iteration, IterationResult* result);
  // Puts a received tensor where the program reads it (weights_of: the unit
  // whose UNIT_WEIGHTS `t` holds, else null).
  absl::Status Store(const v1::TensorKey& key, Tensor t, Unit* weights_of);
  // The tied embedding's gradient: the other owner's part added, or (fused)
  // the all-reduce over both owners' replicas (plan.proto AddTiedGradient;
  // its time is idle).
  absl::Status AddTied(const v1::Instruction::AddTiedGradient& add, int64_t iteration,
                       IterationResult* result);
  // With data parallelism, sums each gradient over the replicas' copies of
  // this stage (AllReduceGradients); clips the gradients by the global
  // norm over every stage's (setup_.optimizer_stages exchange their sums;
  // grad_clip.h; the norm goes into result->grad_norm), and sets the
  // learning rate of the step (lr_schedule.h).
  // The time in those collectives goes into result->idle_seconds (and the
  // all-reduce's into phase "all_reduce" too).
  absl::Status PrepareOptimizerStep(int64_t iteration, IterationResult* result);
  // Tensor parallelism: replaces each squared-gradient sum in `mine` (slots
  // as PrepareOptimizerStep lays them out: each rank's copy's squares where
  // ParameterShard::CountsTowardNorm, else 0) with the sum over the tensor
  // ranks, in rank order: the whole parameter's, a shard's shares added and
  // a replica counted once. Every rank ends with bitwise the same slots.
  absl::Status SumTensorRankSquares(int64_t iteration, Tensor* mine, IterationResult* result);
  // Waits for the overlapped all-reduces (OverlapAllReduce); then every
  // gradient they did not cover but the tied embedding's as one group
  // (AllReduceGroup) over the replicas, and the tied one, unless a fused
  // sync reduced it already, in member order (collectives.h), so that
  // fused and unfused agree bitwise.
  absl::Status AllReduceGradients(int64_t iteration, IterationResult* result);
  // Whether unit u's gradients are all-reduced as soon as its last backward
  // pass of the iteration ends, overlapping the rest of the backward: with
  // data parallelism on host gradients, exact or compressed (on the
  // all-reduce thread), or on a device collective (queued on the device).
  bool OverlapsAllReduce() const;
  // Adds unit u's final gradients (the tied wte left out) to the bucket,
  // and queues the bucket when it is full (FlushBucket).
  absl::Status OverlapAllReduce(int unit);
  // Queues the bucket for AllReduceGroup on all_reduces_ (its tags from
  // kOverlapTagBase on).
  absl::Status FlushBucket();
  // `t` itself on the host, or a host copy of it on a device (the
  // collectives work on host tensors).
  Tensor OnHost(const Tensor& t) const;
  // Whether selective stage compression sends p's gradient through
  // PowerSGD (a rank is set and the factors are smaller than the matrix).
  bool PowerSgdPays(const Parameter& p) const;
  // The message tags AllReduceGroup uses for `params`: two per PowerSGD
  // matrix and one per flat tensor of the rest (FlatGroups: two with
  // tensor ranks).
  int GroupTags(const std::vector<Parameter*>& params) const;
  // `params` in the groups summed as one flat tensor each: all of them, or
  // with tensor ranks those every rank holds whole, then the shards (so
  // that the replicated ones lie at the same offsets, and are summed and
  // coded alike, on every rank). Order kept within a group.
  std::vector<std::vector<Parameter*>> FlatGroups(const std::vector<Parameter*>& params) const;
  // Sums `params`' gradients over the replicas' copies of this stage, with
  // tags from `tag` on (GroupTags of them): each matrix PowerSgdPays for
  // through PowerSgdAllReduce with error feedback, then the rest as flat
  // tensors (FlatGroups), exactly or through dp_quantizer_ with error feedback (both
  // in dp_feedback_). Gradients on the device go down and back up. Adds
  // each collective to `stats`. Every replica calls it with the same
  // parameters in the same order.
  absl::Status AllReduceGroup(Collectives& collectives, int64_t iteration, int tag,
                              const std::vector<Parameter*>& params,
                              IterationResult::CollectiveStats* stats);
  // AllReduceGroup's sum of `flat_params` as one flat tensor under `tag`.
  absl::Status AllReduceFlat(Collectives& collectives, int64_t iteration, int tag,
                             const std::vector<Parameter*>& flat_params,
                             IterationResult::CollectiveStats* stats);
  // Where this stage sums exactly: the residual a checkpoint restored for
  // p's error feedback (Restore), to go into this step's gradient once, so
  // forgotten here; empty when there is none (or of another size, dropped).
  Tensor TakeRestoredResidual(const Parameter& p);
  // AllReduceGroup on setup_.device_collective: queues the sum of
  // `params`' gradients over the replicas (a restored residual folded in
  // first, as AllReduceGroup's exact branch does) and counts it in `stats`;
  // AllReduceGradients orders the optimizer step after it (AwaitSums).
  absl::Status DeviceAllReduceGroup(const std::vector<Parameter*>& params,
                                    IterationResult::CollectiveStats* stats);
  // PowerSGD's warm start `q` [cols, rank] of a matrix split by `shard`,
  // every tensor rank's gathered to rank 0 (message (step, tag)) as
  // UnitState::warm_q_ranks holds them; the other ranks get an empty
  // Tensor. A collective of the tensor ranks.
  absl::StatusOr<Tensor> GatherWarmStarts(int64_t step, int tag, const Tensor& q,
                                          const ParameterShard& shard);
  // This stage's copies in every replica (at this tensor rank), in replica
  // order: the group of the data-parallel collectives.
  CollectiveGroup ReplicaGroup() const;
  // AccTFM partition tuning in checkpoints: this stage's layout as a
  // TunedPartitions without counts; the tuner's kept choice with it
  // (nullopt before it decided, or without a tuner); and, at Restore,
  // keeping a recorded choice when it was measured on this very layout
  // (else the stage measures again, saying why).
  TunedPartitions TuningLayout() const;
  std::optional<TunedPartitions> TunedChoice() const;
  void AdoptTunedChoice(const TunedPartitions& recorded);
  // The backward units' parameters (each once) that have error feedback
  // (dp_feedback_), in parameters() order: the same on every replica.
  std::vector<const Parameter*> FeedbackParameters() const;
  // This stage's pipeline links' PowerSGD warm starts for a checkpoint
  // (Snapshot): nothing without PowerSGD sends or on a tensor rank other
  // than 0; with SnapshotsEveryReplica every replica's, gathered to replica
  // 0 (a collective of this stage's replicas, message (step,
  // kLinkWarmStartCheckpointTag)), the others get none; else this one's.
  absl::StatusOr<std::vector<LinkWarmStart>> LinkWarmStarts(int64_t step);
  // Every replica's residuals of `held` (FeedbackParameters), concatenated,
  // gathered to replica 0 (a collective of this stage's replicas at this
  // tensor rank, message (step, kFeedbackCheckpointTag)): replica 0 gets
  // one tensor per replica, the others none. With more replicas than
  // setup_.max_feedback_replicas, their sum in member order instead (one
  // tensor, an all-reduce).
  absl::StatusOr<std::vector<Tensor>> GatherReplicaFeedback(
      int64_t step, const std::vector<const Parameter*>& held);
  // Restore's part for unit `index`'s error feedback: state.feedback's
  // replicas folded into this replica's residuals (Restore's rule), cut to
  // this rank's shards, and the warm starts of tensors held whole, into
  // `out`. INVALID_ARGUMENT naming the tensor when one is mis-shaped.
  absl::Status RestoreFeedback(int index, const UnitState& state,
                               const std::vector<Parameter*>& params,
                               std::map<std::string, PowerSgdAllReduceState>* out) const;
  // One replica (a re-plan left no other): the residuals a checkpoint
  // restored go into this step's gradients, once.
  void AddRestoredFeedback();
  // Data parallelism, on the loss stage: every replica's micro-batch
  // losses, all-gathered over the replicas' loss stages, replace this
  // replica's share in `result` (the step's micro-batch order). The
  // gather's time is idle.
  absl::Status GatherReplicaLosses(int64_t iteration, IterationResult* result);
  // The transport's number of replica `replica`'s stage `stage` at this
  // worker's tensor rank (StageSetup), and of this replica's.
  int GlobalWorker(int replica, int stage) const {
    return (replica * setup_.num_stages + stage) * setup_.tensor_parallel + setup_.tensor_rank;
  }
  int GlobalStage(int stage) const { return GlobalWorker(setup_.replica, stage); }
  // How messages name this replica's stage `stage` (at this tensor rank):
  // by the transport's number, which the transport's own errors and the
  // coordinator's "[stages: N=worker, ...]" list use too, with the
  // replica's stage and the tensor rank after it when they differ from it:
  // "stage 1" without data or tensor parallelism, else e.g. "stage 4
  // (replica 1's stage 1)" or "stage 11 (replica 1's stage 2, tensor rank
  // 1)". So one message never numbers stages two ways.
  std::string StageName(int stage) const;
  std::string OwnStageName() const { return StageName(setup_.stage); }
  // `status` (if an error) prefixed with the send it belongs to, its peer
  // (this replica's stage `peer_stage`) named by StageName.
  absl::Status NameSend(const absl::Status& status, int peer_stage,
                        const TensorAddress& address) const;
  Unit* OwnedUnit(int index);
  bool IsBackwardUnit(int index) const;
  TokenBatch BatchFor(int micro_batch) const;
  Parameter* TiedHolder();  // the wte Parameter whose gradient this stage sends
  // The unsplit tensor of which `mine` (host) is this rank's part cut by
  // `shard`, on tensor rank 0: every rank's part gathered there (message
  // (iteration, tag)), padded to the largest part (a cube's vectors are
  // empty off its diagonal), then reassembled by GatherShards. A collective
  // of the group; the other ranks get an empty Tensor.
  absl::StatusOr<Tensor> GatherUnsplit(int64_t iteration, int tag, const Tensor& mine,
                                       const ParameterShard& shard);
  // Runs the forward pass of `units` on micro-batch mb from the stored input
  // of units.begin; keeps contexts of backward units (all of them when
  // `recompute`) and stores outputs the program uses later.
  absl::Status RunForward(const v1::UnitRange& units, int mb, bool recompute);
  // The partition tuner's bookkeeping at the end of an iteration: records
  // its compute time and, after the last measured one, sums the group's
  // totals (time that is idle) and keeps the fastest candidate.
  absl::Status TunePartitions(int64_t iteration, IterationResult* result);
  // After instruction `instruction`: drops the activations it was the last
  // to read, and every activation of the micro-batches it last touched.
  void ForgetTensorsEndingAt(int instruction);

  StageSetup setup_;
  const Dataset* dataset_;
  Transport* transport_;
  int num_units_ = 0;
  // Tensor parallelism: this stage's group of tensor ranks and the units'
  // view of it (null when tensor_parallel is 1). Before units_: they point
  // at it.
  std::unique_ptr<Collectives> tp_collectives_;
  std::unique_ptr<CollectivesTensorParallelComm> tp_comm_;
  // tensor_mode 3d: the cube over the same ranks and its units' view.
  std::unique_ptr<CollectivesCubeComm> cube_comm_;
  std::unique_ptr<CubeUnitGroup> cube_group_;
  // tensor_partition_tune_steps > 0: the candidates' schedule and choice,
  // over this runtime's iterations (tuned_iterations_ counts them).
  std::unique_ptr<PartitionTuner> tuner_;
  int64_t tuned_iterations_ = 0;
  std::map<int, std::unique_ptr<Unit>> units_;  // by unit index
  AdamWOptimizer optimizer_;
  // Codecs and error feedback of this stage's links: encoder_ for sends
  // (used only by tasks on sends_, and between its drains), decoder_ for
  // receives (the interpreter's).
  LinkCompressor encoder_;
  LinkCompressor decoder_;
  // Sends the backend encodes on its device (the interpreter's thread).
  DeviceLinkEncoder device_encoder_;
  // The links (peer, kind) whose payloads were encoded on the device, each
  // logged once (the GPU checks look for the line: the host path is a
  // silent fallback).
  std::set<std::pair<int, std::string>> device_encoded_links_;
  // Whether the program sends a tensor through PowerSGD (whose links keep
  // warm starts that checkpoints save).
  bool links_through_powersgd_ = false;
  int64_t iteration_ = 0;
  // Program facts, computed once: units whose outputs the program reads
  // after the forward pass (sends, recompute inputs), and per instruction
  // the micro-batches it is the last one to touch and the (micro-batch,
  // unit) activations it is the last one to read.
  std::set<int> kept_outputs_;
  // Units whose ACTIVATION sends use a token_topk codec: their forward pass
  // also records the unit's token importance (Unit::TokenImportance).
  std::set<int> scored_outputs_;
  std::map<int, std::vector<int>> last_touch_;
  std::map<int, std::vector<std::pair<int, int>>> last_read_by_;
  // State within an iteration, per (micro-batch, unit).
  std::map<std::pair<int, int>, Tensor> activations_;               // outputs, own or received
  std::map<std::pair<int, int>, std::vector<float>> token_scores_;  // of scored outputs
  std::map<std::pair<int, int>, UnitContext> contexts_;
  std::map<int, Tensor> grads_in_;   // received dL/d(output of backward.end-1)
  std::map<int, Tensor> grads_out_;  // dL/d(input of backward.begin) to send
  // The head's loss of each micro-batch, left where the backend put it
  // (unit.h): read once the iteration's work is queued, not per pass.
  std::map<int, Tensor> losses_;
  Tensor tied_received_;
  bool tied_reduced_ = false;  // a fused sync all-reduced wte this iteration
  // Selective stage compression's state across iterations, by parameter
  // name: PowerSGD's warm start Q, and the error feedback's residual (this
  // replica's, in the gradient's shape) of PowerSGD or of
  // setup_.data_parallel_quantizer's codec (dp_quantizer_; null: none).
  // Entries of the parameters one bucket carries are touched only by
  // all_reduces_' thread until it drains. A residual restored from a
  // checkpoint where this stage no longer compresses is added to the exact
  // all-reduce once, then dropped (nothing sent is lost).
  std::map<std::string, PowerSgdAllReduceState> dp_feedback_;
  std::unique_ptr<Codec> dp_quantizer_;
  // State within one RunEval: windows evaluated, EVAL_ACTIVATION tensors by
  // (micro-batch, unit), and the window-weighted loss sum on the head stage.
  int64_t eval_windows_ = 0;
  std::map<std::pair<int, int>, Tensor> eval_activations_;
  double eval_weighted_loss_ = 0;
  bool eval_has_loss_ = false;
  // What current_instruction() shows: the instruction, or what inside it
  // waits on other workers (the optimizer step's all-reduce over the
  // replicas), so that an operator can tell "waiting for a replica" from
  // "computing".
  void ShowActivity(std::string what);
  mutable AnnotatedMutex status_mu_;
  std::string current_ ABSL_GUARDED_BY(status_mu_) = kBetweenSteps;
  // What the background sends sent since the last drain, by (peer stage,
  // tensor kind name): written by tasks on sends_, read after Drain.
  std::map<std::pair<int, std::string>, LinkStats> sent_stats_;
  // What LINK_PATH_DEVICE sends sent since the last drain (the interpreter's).
  std::map<std::pair<int, std::string>, LinkStats> device_sent_stats_;
  // Data parallelism, overlapped with the backward pass (CPU gradients):
  // the program's last Backward instruction of each unit; the instruction
  // running now; the units whose gradients this iteration went to
  // all_reduces_ as soon as they were final (in buckets); each group's
  // stats (the buckets', then the step's), merged into the result at the
  // step.
  std::map<int, int> final_backward_of_unit_;
  int current_instruction_ = -1;
  std::set<int> overlapped_units_;
  std::vector<std::unique_ptr<IterationResult::CollectiveStats>> group_stats_;
  // The bucket being filled (final gradients not yet queued), and the tags
  // the buckets queued this iteration took.
  std::vector<Parameter*> bucket_;
  int64_t bucket_numel_ = 0;
  int overlap_tags_used_ = 0;
  // Last: destroyed first, so queued sends finish while what they use
  // exists; all_reduces_ (the overlapped all-reduces, in program order, on
  // their own thread) likewise.
  SendQueue all_reduces_;
  // Added to every receive's timeout in the step after a validation pass
  // (RunEval sets it as it returns, RunIteration clears it; zero during the
  // pass): a receive timeout per validation micro-batch, for the rest of
  // the other stages' pass.
  absl::Duration eval_wait_grace_ = absl::ZeroDuration();
  SendQueue sends_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_RUNTIME_STAGE_RUNTIME_H_
