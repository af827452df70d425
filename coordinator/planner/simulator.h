// Pipeline simulator: runs one iteration of the compiled per-worker programs
// (DESIGN.md §5) on a cost model and reports when each instruction runs. It
// is the ground truth for a plan's predicted iteration time and bubble.
//
// The model (all times in seconds, one iteration, every worker starts at 0):
//  - Worker w runs programs[w] in order, one instruction at a time.
//  - Forward(units, mb) and Recompute(units, mb) take
//      sum_{u in units} fwd_seconds[u] / speed[w] + fwd_comm_seconds[u];
//    Backward(units, mb) takes sum bwd_seconds[u] / speed[w] +
//    bwd_comm_seconds[u] (the comm terms: waits the speed does not shorten);
//    OptimizerStep(units) takes
//      optimizer_seconds_per_byte * sum weight_bytes[u] / speed[w];
//    AddTiedGradient takes no time, unless fused (Optimus-CC §6,
//    fused_embedding_sync.h) with D > 1: then it is one all-reduce of
//    tied_grad_bytes over the 2D owners of the tied embedding (eq. 16),
//    which both owners of the simulated replica enter: the first waits
//    for the other (a kRecvWait event), and both go on after
//    MemberOrderAllReduceSeconds(2D, tied_grad_bytes, replica_link) from
//    the later one's arrival (a kAllReduce event on each, all-reduce time).
//    Their OptimizerStep's all-reduce then leaves the tied wte out.
//  - Data parallelism (DESIGN.md §12): the programs are ONE replica's, and
//    costs.data_parallel = D >= 1 replicas run the same programs on workers
//    of the same speeds (the caller passes, per stage position, the slowest
//    replica's speed). With D > 1 an OptimizerStep(units) with non-empty
//    units first all-reduces the stage's gradients with the D-1 other
//    replicas' copies of the stage (a ring: reduce-scatter + all-gather over
//    costs.replica_link), then steps. Of AllReduceBytes(units), the tied
//    wte's (tied_grad_bytes if the units hold the first or the last unit of
//    the model; none where the sync is fused, above) go whole and the rest
//    times all_reduce_byte_fraction[w]
//    (selective compression); the all-reduce of those b bytes takes
//      AllReduceSeconds(D, b, replica_link)
//        = 2(D-1) * latency + 2(D-1)/D * bytes / bandwidth
//    (bandwidth <= 0: the bytes term is 0), the latency-bandwidth model
//    T = alpha*c1 + beta*c2*m of acctfm.txt eq. 3 with the ring's c1 = 2(D-1)
//    steps and c2 = 2(D-1)/D of the message per device; for D = 2 one
//    exchange (c1 = 1, c2 = 1), as Collectives::AllReduce runs two
//    members. The replicas reach
//    the step at the same time (same programs, same speeds), so the one
//    simulated replica waits for nobody else. D = 1: no all-reduce, nothing
//    changes. The all-reduce occupies the worker (it is not overlapped with
//    compute) unless it overlaps as below.
//  - Overlap (StageRuntime::OverlapAllReduce), when D > 1,
//    all_reduce_bucket_bytes > 0 and all_reduce_overlaps[w] (missing:
//    true), exact or compressed alike: inside a Backward(units) instruction
//    the units finish one after another from the last, each after its
//    bwd_seconds / speed[w] + bwd_comm_seconds; when a unit's last Backward on w finishes, its
//    gradient (weight_bytes less the tied wte, tied_grad_bytes, for the
//    first and the last unit of the model) joins w's bucket, and once the
//    bucket holds >= all_reduce_bucket_bytes it is all-reduced on w's
//    all-reduce lane: AllReduceSeconds(D, bucket bytes x
//    all_reduce_byte_fraction[w], replica_link) + bucket bytes x
//    all_reduce_cpu_seconds_per_byte[w] / speed[w] (a compressed stage's
//    coding), starting when the lane is free (one collective at a time, in order),
//    while w goes on computing (a kAllReduceBucket event, not worker time).
//    OptimizerStep(units) then sends the last, partly filled bucket, waits
//    until the lane is free (a kAllReduceWait event: worker time), and
//    all-reduces what no bucket carried (the tied wte, units whose
//    backward ran elsewhere) as above before stepping. The lane does not
//    slow the worker's compute (on a CPU it shares the cores; under
//    emulated links it mostly waits for the pacing).
//  - Gradient clipping (costs.grad_clip: TrainConfig::grad_clip > 0): the
//    runtime's OptimizerStep (StageRuntime::PrepareOptimizerStep) needs the
//    global gradient norm, which the replica's stages that step (the
//    workers whose programs hold an OptimizerStep: its optimizer_stages)
//    exchange in one round after the all-reduce above: each sends its
//    squared norms to every other, then receives all
//    (Collectives::AllGatherSmall). Worker w arrives at
//      a_w = its clock after the all-reduce + grad_clip_tensor_seconds
//    (with T > 1 tensor ranks, their own round first), parks until every
//    member has arrived, and steps at
//      max(a_w, max over members m != w of
//               max(a_m, link m->w free) + latency of link (m -> w))
//    (a few KB of norms: no wire time), idle in between (a kRecvWait event
//    from its clock). So a stage whose backward ends early steps one
//    latency after the last stage arrives, and what follows its step (its
//    UNIT_WEIGHTS sends) waits with it. Each member's k-th OptimizerStep
//    waits for every member's k-th; a lone member waits for no other.
//  - Send(key, peer) takes no worker time: the worker goes on at once while
//    the transfer is in flight. The transfer goes on link (w -> peer); each
//    directed link carries one transfer at a time, FIFO in issue order (only
//    w issues on it, so this is w's program order). It starts at
//    max(issue time, link free), holds the link for the link's
//    per_message_seconds (the data plane's serial work per message,
//    data_plane_cost.h; part of its latency) plus bytes / bandwidth
//    (bandwidth <= 0: infinite, so 0), and arrives the rest of the latency
//    after that, as LinkShaper (shaped_transport.h) and TCP pipeline a link:
//      start = max(issue, free)   free = start + per_message + bytes / bandwidth
//      arrival = free + latency - per_message
//    so back-to-back sends overlap the rest of their latencies, and each
//    message alone takes latency + bytes / bandwidth. Bytes by key kind:
//      ACTIVATION unit u          activation_bytes[u]   (output of u)
//      ACTIVATION_GRAD unit u     activation_bytes[u-1] (gradient of u's input)
//      TIED_EMBEDDING_GRAD        tied_grad_bytes
//      UNIT_WEIGHTS unit u        weight_bytes[u]
//    times codec_wire_fraction[codec] for a Send that names a codec.
//  - Recv(key, peer) waits (idle) until the transfer of `key` from `peer` to
//    w has arrived; if it arrived earlier, there is no wait. Sends and
//    receives match by (source, destination, key).
//  - iteration_seconds: when the last worker finishes its last instruction.
//    busy = compute time; all_reduce = time in data-parallel all-reduces;
//    idle = iteration_seconds - busy - all_reduce (receive waits, the
//    clipping's wait, and the tail after the worker's own last instruction);
//    bubble_fraction = sum idle / (P * iteration_seconds), i.e. the pipeline
//    bubble only: the all-reduce is charged to itself, not to the bubble.
//    With D = 1 all_reduce is 0 and this is 1 - sum busy / (P * iteration).
//
// It is a discrete-event simulation: workers are advanced in order of their
// clocks (ties by worker index); a worker blocked on a receive whose send has
// not been issued yet is parked and woken by that send. Results depend only on
// the inputs (deterministic, no wall clock).
//
// Thread-safety: the functions are pure; call them from any thread.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_SIMULATOR_H_
#define PIPETRAIN_COORDINATOR_PLANNER_SIMULATOR_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/planner/partition.h"
#include "coordinator/planner/profile.h"
#include "proto/pipetrain/v1/plan.pb.h"

namespace pipetrain {

struct UnitSimulationCost {
  double fwd_seconds = 0;  // one micro-batch at speed 1
  double bwd_seconds = 0;
  double activation_bytes = 0;  // output of the unit for one micro-batch
  double weight_bytes = 0;      // all parameters of the unit
  // Per micro-batch, added after the compute is divided by the speed
  // (UnitProfile::fwd_comm_seconds: a tensor-parallel rank's all-reduces).
  double fwd_comm_seconds = 0;
  double bwd_comm_seconds = 0;
};

struct LinkParameters {
  double bandwidth_bytes_per_second = 0;  // <= 0: infinite
  // What a message takes beyond bytes / bandwidth: every model charges it
  // once per message (the all-reduces, the clipping's norms, a Send).
  double latency_seconds = 0;
  // Of latency_seconds (0 <= this <= latency_seconds), the part a sender
  // does for each message in turn (the data plane's framing and copies,
  // ClusterSpec::per_message_seconds): a Send holds its link for it, where
  // back-to-back sends overlap the rest (the model above).
  double per_message_seconds = 0;
};

struct SimulationCosts {
  std::vector<UnitSimulationCost> units;  // index = unit (0 = embed ... L-1 = head)
  double tied_grad_bytes = 0;             // the TIED_EMBEDDING_GRAD tensor
  double optimizer_seconds_per_byte = 0;  // OptimizerStep cost per weight byte
  std::vector<double> worker_speeds;      // one per worker (program), > 0
  LinkParameters link;                    // every directed link, unless overridden
  std::map<std::pair<int, int>, LinkParameters> link_overrides;  // (src, dst)
  // Data parallelism: replicas of these programs (>= 1; 1 = none) and the
  // link each ring all-reduce step crosses between two replicas' copies of
  // a stage.
  int data_parallel = 1;
  LinkParameters replica_link;
  // Link compression (compression_marking.h): a Send whose instruction
  // names a codec carries this share of TransferBytes (the codec's encoded
  // size of the tensor over its fp32 size; LinkCodecWireFractions). Codecs
  // not listed, and raw sends, carry all of it. Encoding and decoding time
  // is not modelled.
  std::map<std::string, double> codec_wire_fraction;
  // Selective stage compression (selective_compression.h): per program,
  // the share of its data-parallel gradient bytes other than the tied
  // wte's that go on the wire (PowerSgdByteFractions or
  // QuantizerByteFractions for a compressed stage); missing entries: 1.
  // Only the bytes shrink: PowerSGD's second all-reduce round and its
  // orthogonalisation, and a codec's encoding time, are not modelled.
  std::vector<double> all_reduce_byte_fraction;
  // Overlap (the model above): the bucket size (>= 0; 0: no overlap, every
  // all-reduce at the step), and per program whether its worker overlaps
  // (false: its gradients are on a GPU, which the runtime all-reduces at
  // the step; missing entries: true). SimulationCostsFromProfile sets both
  // (kDataParallelBucketBytes, and false where the cluster's worker is a GPU).
  double all_reduce_bucket_bytes = 0;
  std::vector<bool> all_reduce_overlaps;
  // A compressed all-reduce's own CPU time (coding, summing, copying;
  // ModelProfile's QuantizedAllReduceSecondsPerByte), per program, in
  // seconds per byte of its gradients other than the tied wte's at speed 1
  // (missing or 0: not modelled): each bucket, and what the step
  // all-reduces, takes that much / speed[w] longer (CPU work, like the
  // compute; a GPU worker codes on its host's CPU, which its speed does
  // not describe: priced so too). With all_reduce_cpu_shared[w] (missing:
  // false) the worker's host has no core to spare, so a bucket's CPU time
  // also delays its compute: charged as worker time (kAllReduceCpu) at the
  // step, before the wait for the lane.
  std::vector<double> all_reduce_cpu_seconds_per_byte;
  std::vector<bool> all_reduce_cpu_shared;
  // Gradient clipping (the model above): whether every OptimizerStep waits
  // for the stages' norm exchange, and the seconds (>= 0) of the tensor
  // ranks' round before it (tensor parallelism T > 1: one latency of their
  // link; else 0). SimulationCostsFromProfile leaves both off.
  bool grad_clip = false;
  double grad_clip_tensor_seconds = 0;
};

// The bytes one worker all-reduces before OptimizerStep(units): the sum of
// weight_bytes over `units` (the gradient of every parameter of the
// worker's backward units), less tied_grad_bytes (at most the smaller of
// the two units' weight bytes) when `units` holds both the first and the
// last unit of a model of >= 2 units: the runtime all-reduces each
// parameter once (StageRuntime::parameters()), and embed and head share wte.
// Requires 0 <= begin <= end <= costs.units.size().
double AllReduceBytes(const Range& units, const SimulationCosts& costs);

// Seconds of an all-reduce of `bytes` over `replicas` copies as
// Collectives::AllReduce runs it (acctfm.txt eq. 3; see the model above):
// 0 for replicas <= 1; for 2 one exchange, link.latency_seconds + bytes /
// link.bandwidth_bytes_per_second; else the ring's 2(D-1) *
// link.latency_seconds + 2(D-1)/D * bytes / link.bandwidth_bytes_per_second
// (the bytes term 0 for bandwidth <= 0). A quantized all-reduce
// (AllReduceEncoded) runs so too. For a power-of-two D the runtime does
// recursive doubling below 64 KiB (all_reduce_algorithm.h), which this
// does not model: the bytes here are a stage's whole gradient, and its
// buckets (kDataParallelBucketBytes) are that small only in toy models.
double AllReduceSeconds(int replicas, double bytes, const LinkParameters& link);

// Seconds of Collectives::AllReduceInMemberOrder over `members` (the
// fused embedding sync's): 0 for members <= 1; for 2 one exchange; else
// each member's n - 1 segments sent at once (one latency) and the ring's
// all-gather: n * latency + 2(n-1)/n * bytes / bandwidth (eq. 3's form;
// the bytes term 0 for bandwidth <= 0).
double MemberOrderAllReduceSeconds(int members, double bytes, const LinkParameters& link);

// The messages each member sends in an exact all-reduce over `replicas`
// copies as Collectives::AllReduce runs it (eq. 3's c1), each `fraction` of
// the tensor: none for replicas <= 1, one of all of it for 2 (one
// exchange), else the ring's 2(D-1) of 1/D. AllReduceSeconds and the data
// plane's CPU demand (host_sharing.h) count these.
struct AllReduceMessages {
  int count = 0;
  double fraction = 0;
};
AllReduceMessages AllReduceMessagesFor(int replicas);

// The bytes a Send of `key` carries (the table in the model above).
// Requires: the key's unit valid for costs.units as InstructionProblem checks.
double TransferBytes(const v1::TensorKey& key, const SimulationCosts& costs);

// Costs from a model profile and a cluster description (one worker per
// cluster entry, one link setting for all links and for replica_link). The
// profile has no tied gradient size, so the caller passes it (the token
// embedding's bytes). data_parallel stays 1 for the caller to set.
// optimizer_seconds_per_byte is the profile's timed optimizer steps over its
// weight bytes (sum optimizer_seconds / sum weight_bytes; 0 when the profile
// did not time them, as an analytic one does not). The all-reduce overlaps
// in buckets of kDataParallelBucketBytes (common/data_parallel_buckets.h)
// on every worker but a GPU (WorkerSpec::gpu). The links take the cluster's
// per_message_seconds too.
SimulationCosts SimulationCostsFromProfile(const ModelProfile& profile, const ClusterSpec& cluster,
                                           double tied_grad_bytes);

enum class TimelineEventKind {
  kForward,
  kBackward,
  kRecompute,
  kOptimizer,
  // A transfer on link (worker -> peer), not worker time: the span it holds
  // the link (its per-message work, then its bytes until the last is out),
  // so a link's transfers never overlap; it arrives the rest of the latency
  // after the end (the receiver's wait shows that).
  kSendTransfer,
  kRecvWait,      // the worker idles in a receive (only waits > 0 are listed)
  kAllReduce,     // data-parallel gradient all-reduce before the optimizer step
  // One bucket of the data-parallel all-reduce on the worker's all-reduce
  // lane, overlapping its backward passes (not worker time).
  kAllReduceBucket,
  // The worker waits at the optimizer step for its buckets (worker time,
  // counted as all-reduce time).
  kAllReduceWait,
  // The CPU time its compressed buckets took from the worker's compute on
  // a host without a spare core, charged at the step (worker time, counted
  // as busy).
  kAllReduceCpu,
  // A tensor-parallel unit's all-reduce on its group's communication lane,
  // overlapping the worker's compute (not worker time: the part it does not
  // hide is inside the unit's cost). Added by AddTensorParallelLanes
  // (tensor_parallel_lanes.h), never by SimulateIteration.
  kTensorParallelAllReduce,
  // The worker hands a send over to its data plane (the tensor's copy, a
  // device encode, the queueing): worker time. Measured timelines only
  // (measured_timeline.h): the simulation counts that work in the data
  // plane's CPU demand, not on the worker's lane.
  kSendHandoff,
};

// "forward", "backward", "recompute", "optimizer", "send", "recv-wait",
// "all-reduce", "all-reduce-bucket", "all-reduce-wait", "all-reduce-cpu",
// "tp-all-reduce", "send-handoff".
const char* TimelineEventKindName(TimelineEventKind kind);

struct TimelineEvent {
  int worker = 0;
  TimelineEventKind kind = TimelineEventKind::kForward;
  double start_seconds = 0;
  double end_seconds = 0;
  int micro_batch = -1;  // -1: per-iteration (optimizer, tied gradient, weights)
  Range units;           // compute: the instruction's units; transfer/wait: the
                         // tensor key's unit as [u, u+1)
  int peer = -1;         // transfers: destination; waits: source; else -1
  v1::TensorKind tensor_kind = v1::TENSOR_KIND_UNSPECIFIED;  // transfers, waits
  double bytes = 0;     // transfers; all-reduce, bucket: the gradient bytes
  int instruction = 0;  // index in programs[worker]
  std::string label;    // e.g. "F mb3 [2,5)", "send ACTIVATION u4 mb3 to 2",
                        // "AllReduce [2,5) x2 replicas"
};

// The labels' pieces: "[2,5)" for units 2 to 4, "ACTIVATION u4 mb3" for a
// tensor key (no "mb" for per-iteration tensors).
std::string UnitRangeText(const v1::UnitRange& r);
std::string TensorKeyText(const v1::TensorKey& k);

struct SimulationResult {
  double iteration_seconds = 0;
  std::vector<double> busy_seconds;        // per worker
  std::vector<double> all_reduce_seconds;  // per worker; all 0 without data parallelism
  std::vector<double> idle_seconds;        // per worker, iteration_seconds - busy - all_reduce
                                           // (at least 0: rounding could leave -1e-19)
  double bubble_fraction = 0;              // 0 when iteration_seconds == 0
  // Sorted by (worker, start, instruction); transfers are listed under their
  // sender.
  std::vector<TimelineEvent> events;
};

// Simulates one iteration of `programs` (programs[w] runs on worker w).
// Errors:
//  INVALID_ARGUMENT   no programs; worker_speeds.size() != programs.size();
//                     a speed <= 0 or any cost negative or not finite;
//                     data_parallel < 1; a bad replica_link (as link); a
//                     link's per_message_seconds negative or above its
//                     latency_seconds;
//                     grad_clip_tensor_seconds negative or not finite; a link
//                     override naming a worker out of range or itself; an
//                     instruction with no op, a unit range outside
//                     [0, units.size()) or with begin > end, a tensor key of
//                     unspecified kind or whose unit is out of range
//                     (ACTIVATION_GRAD needs unit >= 1), a peer out of range
//                     or equal to the worker, or the same (src, dst, key)
//                     sent twice. Messages name worker and instruction index.
//  FAILED_PRECONDITION the programs cannot finish: some workers wait forever
//                     on receives (deadlock, or nobody sends that key) or
//                     in the clipping's exchange (a member steps more often
//                     than another), or a send is never received. The
//                     message lists each stuck worker's instruction
//                     (DescribeInstruction) or the unreceived send.
absl::StatusOr<SimulationResult> SimulateIteration(const std::vector<v1::Program>& programs,
                                                   const SimulationCosts& costs);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_SIMULATOR_H_
