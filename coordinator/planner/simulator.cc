#include "coordinator/planner/simulator.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <queue>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/data_parallel_buckets.h"
#include "common/enum_names.h"
#include "common/program_text.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

// (source worker, destination worker, kind, micro-batch, unit).
using MessageKey = std::tuple<int, int, int, int, int>;

MessageKey KeyOf(int src, int dst, const v1::TensorKey& key) {
  return {src, dst, static_cast<int>(key.kind()), key.micro_batch(), key.unit()};
}

bool BadNumber(double x) { return !std::isfinite(x) || x < 0; }

// The per-message part of a link is some of its latency (LinkParameters).
bool BadPerMessage(const LinkParameters& link) {
  return BadNumber(link.per_message_seconds) || link.per_message_seconds > link.latency_seconds;
}

absl::Status ValidateCosts(const SimulationCosts& costs, int workers) {
  if (workers == 0) return absl::InvalidArgumentError("no programs to simulate");
  if (static_cast<int>(costs.worker_speeds.size()) != workers) {
    return absl::InvalidArgumentError(absl::StrCat("worker_speeds has ", costs.worker_speeds.size(),
                                                   " entries for ", workers, " programs"));
  }
  for (int w = 0; w < workers; ++w) {
    const double s = costs.worker_speeds[w];
    if (!std::isfinite(s) || s <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker_speeds[", w, "] = ", s, "; must be > 0"));
    }
  }
  for (size_t u = 0; u < costs.units.size(); ++u) {
    const UnitSimulationCost& c = costs.units[u];
    if (BadNumber(c.fwd_seconds) || BadNumber(c.bwd_seconds) || BadNumber(c.activation_bytes) ||
        BadNumber(c.weight_bytes) || BadNumber(c.fwd_comm_seconds) ||
        BadNumber(c.bwd_comm_seconds)) {
      return absl::InvalidArgumentError(
          absl::StrCat("units[", u, "] has a negative or non-finite cost"));
    }
  }
  if (BadNumber(costs.tied_grad_bytes) || BadNumber(costs.optimizer_seconds_per_byte) ||
      !std::isfinite(costs.link.bandwidth_bytes_per_second) ||
      BadNumber(costs.link.latency_seconds)) {
    return absl::InvalidArgumentError(
        "tied_grad_bytes, optimizer_seconds_per_byte and link must be finite and non-negative "
        "(bandwidth may be <= 0 for infinite)");
  }
  for (const LinkParameters* link : {&costs.link, &costs.replica_link}) {
    if (BadPerMessage(*link)) {
      return absl::InvalidArgumentError(absl::StrCat(
          link == &costs.link ? "link" : "replica_link", ": per_message_seconds = ",
          link->per_message_seconds, "; must be finite, >= 0 and at most its latency_seconds (",
          link->latency_seconds, "), of which it is part"));
    }
  }
  if (BadNumber(costs.grad_clip_tensor_seconds)) {
    return absl::InvalidArgumentError(
        absl::StrCat("grad_clip_tensor_seconds = ", costs.grad_clip_tensor_seconds,
                     "; must be finite and >= 0 (0: no tensor ranks)"));
  }
  if (costs.data_parallel < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("data_parallel = ", costs.data_parallel, "; must be >= 1 (1: no replicas)"));
  }
  if (!std::isfinite(costs.replica_link.bandwidth_bytes_per_second) ||
      BadNumber(costs.replica_link.latency_seconds)) {
    return absl::InvalidArgumentError(
        "replica_link must be finite and non-negative (bandwidth may be <= 0 for infinite)");
  }
  // Shares of bytes sent: positive (a codec's headers may outweigh a tiny
  // tensor), and at most 1 for PowerSGD (it sends a matrix whole when its
  // factors would be larger).
  for (const auto& [codec, fraction] : costs.codec_wire_fraction) {
    if (!(fraction > 0) || !std::isfinite(fraction)) {
      return absl::InvalidArgumentError(
          absl::StrCat("codec_wire_fraction of ", codec, " = ", fraction, "; must be > 0"));
    }
  }
  if (BadNumber(costs.all_reduce_bucket_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("all_reduce_bucket_bytes = ", costs.all_reduce_bucket_bytes,
                     "; must be finite and >= 0 (0: no overlap)"));
  }
  for (double seconds : costs.all_reduce_cpu_seconds_per_byte) {
    if (BadNumber(seconds)) {
      return absl::InvalidArgumentError(
          absl::StrCat("all_reduce_cpu_seconds_per_byte ", seconds, "; must be finite and >= 0"));
    }
  }
  for (double fraction : costs.all_reduce_byte_fraction) {
    if (!(fraction > 0 && fraction <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("all_reduce_byte_fraction ", fraction, "; must be in (0, 1]"));
    }
  }
  for (const auto& [link, params] : costs.link_overrides) {
    const auto [src, dst] = link;
    if (src < 0 || src >= workers || dst < 0 || dst >= workers || src == dst ||
        !std::isfinite(params.bandwidth_bytes_per_second) || BadNumber(params.latency_seconds) ||
        BadPerMessage(params)) {
      return absl::InvalidArgumentError(absl::StrCat("link override (", src, ", ", dst,
                                                     ") names no link between two of the ", workers,
                                                     " workers or has a bad value"));
    }
  }
  return absl::OkStatus();
}

// Why one instruction of worker w is invalid, or nullptr when it is valid.
const char* InstructionProblem(const v1::Instruction& in, int w, int workers, int units) {
  auto range_ok = [units](const v1::UnitRange& r) {
    return r.begin() >= 0 && r.begin() <= r.end() && r.end() <= units;
  };
  auto key_ok = [units](const v1::TensorKey& k) {
    switch (k.kind()) {
      case v1::TENSOR_KIND_ACTIVATION:
      case v1::TENSOR_KIND_UNIT_WEIGHTS:
        return k.unit() >= 0 && k.unit() < units;
      case v1::TENSOR_KIND_ACTIVATION_GRAD:
        return k.unit() >= 1 && k.unit() < units;
      case v1::TENSOR_KIND_TIED_EMBEDDING_GRAD:
        return true;
      default:
        return false;
    }
  };
  auto peer_ok = [w, workers](int peer) { return peer >= 0 && peer < workers && peer != w; };
  bool ok = true;
  switch (in.op_case()) {
    case v1::Instruction::kForward:
      ok = range_ok(in.forward().units());
      break;
    case v1::Instruction::kBackward:
      ok = range_ok(in.backward().units());
      break;
    case v1::Instruction::kRecompute:
      ok = range_ok(in.recompute().units());
      break;
    case v1::Instruction::kOptimizerStep:
      ok = range_ok(in.optimizer_step().units());
      break;
    case v1::Instruction::kSend:
      ok = key_ok(in.send().tensor()) && peer_ok(in.send().peer_stage());
      break;
    case v1::Instruction::kRecv:
      ok = key_ok(in.recv().tensor()) && peer_ok(in.recv().peer_stage());
      break;
    case v1::Instruction::kAddTiedGradient: {
      // Fused: the two owners are workers here, this one of them.
      const v1::Instruction::AddTiedGradient& add = in.add_tied_gradient();
      ok = !add.fused() || (add.embed_stage() != add.head_stage() &&
                            (w == add.embed_stage() || w == add.head_stage()) &&
                            peer_ok(w == add.embed_stage() ? add.head_stage() : add.embed_stage()));
      break;
    }
    case v1::Instruction::OP_NOT_SET:
      return "has no op";
  }
  return ok ? nullptr : "unit range, tensor key, peer or tied-gradient owners out of range";
}

absl::Status ValidatePrograms(const std::vector<v1::Program>& programs, int units) {
  const int workers = static_cast<int>(programs.size());
  std::set<MessageKey> sent;
  for (int w = 0; w < workers; ++w) {
    for (int i = 0; i < programs[w].instructions_size(); ++i) {
      const v1::Instruction& in = programs[w].instructions(i);
      const char* problem = InstructionProblem(in, w, workers, units);
      if (problem == nullptr && in.has_send() &&
          !sent.insert(KeyOf(w, in.send().peer_stage(), in.send().tensor())).second) {
        problem = "the same tensor goes to that peer twice in one iteration";
      }
      if (problem != nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("worker ", w, " instruction ", i, " (", DescribeInstruction(in),
                         "): ", problem, " (the model has ", units, " units, there are ", workers,
                         " workers; ACTIVATION_GRAD needs unit >= 1; a peer is another worker)"));
      }
    }
  }
  return absl::OkStatus();
}

// The state of one simulated iteration; see the header for the model.
class Simulator {
 public:
  Simulator(const std::vector<v1::Program>& programs, const SimulationCosts& costs)
      : programs_(programs),
        costs_(costs),
        clock_(programs.size(), 0.0),
        busy_(programs.size(), 0.0),
        all_reduce_(programs.size(), 0.0),
        pc_(programs.size(), 0),
        lanes_(programs.size()),
        fused_tied_(programs.size(), false) {
    // Where each unit's gradient is final (its last Backward on the
    // worker), and which workers step.
    for (size_t w = 0; w < programs.size(); ++w) {
      Lane& lane = lanes_[w];
      lane.final_backward.assign(costs.units.size(), -1);
      bool steps = false;
      for (int i = 0; i < programs[w].instructions_size(); ++i) {
        const v1::Instruction& in = programs[w].instructions(i);
        if (in.has_add_tied_gradient() && in.add_tied_gradient().fused()) fused_tied_[w] = true;
        steps = steps || in.has_optimizer_step();
        if (!in.has_backward()) continue;
        for (int u = in.backward().units().begin(); u < in.backward().units().end(); ++u) {
          lane.final_backward[u] = i;
        }
      }
      if (steps) ++clip_members_;  // a member of the clipping's exchange
    }
  }

  absl::StatusOr<SimulationResult> Run() {
    for (int w = 0; w < static_cast<int>(programs_.size()); ++w) ready_.push({0.0, w});
    while (!ready_.empty()) {
      const int w = ready_.top().second;
      ready_.pop();
      Step(w);
    }
    RETURN_IF_ERROR(CheckFinished());
    return Result();
  }

 private:
  // Runs worker w's next instruction, then requeues w unless it finished or
  // parked in a receive.
  void Step(int w) {
    const v1::Program& program = programs_[w];
    if (pc_[w] >= program.instructions_size()) return;
    const v1::Instruction& in = program.instructions(pc_[w]);
    switch (in.op_case()) {
      case v1::Instruction::kForward:
        Compute(w, TimelineEventKind::kForward, in.forward().units(), in.forward().micro_batch());
        break;
      case v1::Instruction::kBackward: {
        const double start = clock_[w];
        Compute(w, TimelineEventKind::kBackward, in.backward().units(),
                in.backward().micro_batch());
        if (Overlaps(w)) FillBuckets(w, in.backward().units(), start);
        break;
      }
      case v1::Instruction::kRecompute:
        Compute(w, TimelineEventKind::kRecompute, in.recompute().units(),
                in.recompute().micro_batch());
        break;
      case v1::Instruction::kOptimizerStep:
        // A worker resumed from the clipping's exchange has all-reduced.
        if (clip_done_.erase(w) == 0) {
          AllReduce(w, in.optimizer_step().units());
          if (!ClipNormExchange(w)) return;  // parked until every member has arrived
        }
        Compute(w, TimelineEventKind::kOptimizer, in.optimizer_step().units(), -1);
        break;
      case v1::Instruction::kSend:
        Send(w, in.send());
        break;
      case v1::Instruction::kRecv:
        if (!Receive(w, in.recv())) return;  // parked until the send is issued
        break;
      case v1::Instruction::kAddTiedGradient:
        if (!FusedTiedAllReduce(w, in.add_tied_gradient())) return;  // parked for the other owner
        break;
      case v1::Instruction::OP_NOT_SET:
        break;  // rejected earlier
    }
    ++pc_[w];
    ready_.push({clock_[w], w});
  }

  double ComputeSeconds(TimelineEventKind kind, const v1::UnitRange& r) const {
    double sum = 0;
    for (int u = r.begin(); u < r.end(); ++u) {
      const UnitSimulationCost& c = costs_.units[u];
      switch (kind) {
        case TimelineEventKind::kBackward:
          sum += c.bwd_seconds;
          break;
        case TimelineEventKind::kOptimizer:
          sum += c.weight_bytes * costs_.optimizer_seconds_per_byte;
          break;
        default:
          sum += c.fwd_seconds;
          break;  // forward and recompute
      }
    }
    return sum;
  }

  // The part of the passes' time the worker's speed does not divide
  // (header: the comm terms); 0 for the optimizer.
  double CommSeconds(TimelineEventKind kind, const v1::UnitRange& r) const {
    if (kind == TimelineEventKind::kOptimizer) return 0;
    double sum = 0;
    for (int u = r.begin(); u < r.end(); ++u) {
      const UnitSimulationCost& c = costs_.units[u];
      sum += kind == TimelineEventKind::kBackward ? c.bwd_comm_seconds : c.fwd_comm_seconds;
    }
    return sum;
  }

  // Whether worker w's all-reduce overlaps its backward passes in buckets
  // (header: the model).
  bool Overlaps(int w) const {
    if (costs_.data_parallel <= 1 || costs_.all_reduce_bucket_bytes <= 0) return false;
    return w >= static_cast<int>(costs_.all_reduce_overlaps.size()) ||
           costs_.all_reduce_overlaps[w];
  }

  // The share of w's gradient bytes but the tied wte's that its
  // all-reduce sends (header: all_reduce_byte_fraction).
  double ByteFraction(int w) const {
    return w < static_cast<int>(costs_.all_reduce_byte_fraction.size())
               ? costs_.all_reduce_byte_fraction[w]
               : 1.0;
  }

  // The CPU seconds of w's compressed all-reduce of `bytes` gradient bytes
  // (header: all_reduce_cpu_seconds_per_byte): work on w's cores, so at
  // w's speed as its compute.
  double CpuSeconds(int w, double bytes) const {
    return w < static_cast<int>(costs_.all_reduce_cpu_seconds_per_byte.size())
               ? bytes * costs_.all_reduce_cpu_seconds_per_byte[w] / costs_.worker_speeds[w]
               : 0.0;
  }
  bool CpuShared(int w) const {
    return w < static_cast<int>(costs_.all_reduce_cpu_shared.size()) &&
           costs_.all_reduce_cpu_shared[w];
  }

  // The bytes unit u adds to a bucket: its gradients but the tied wte,
  // which the runtime all-reduces at the step (or fuses with the other
  // owner's: AddTiedGradient).
  double BucketBytes(int u) const {
    double bytes = costs_.units[u].weight_bytes;
    const int last = static_cast<int>(costs_.units.size()) - 1;
    if (last >= 1 && (u == 0 || u == last)) bytes -= std::min(costs_.tied_grad_bytes, bytes);
    return bytes;
  }

  // Backward(r) of worker w began at `start`: the units whose gradients it
  // makes final join the bucket as each finishes (from the last unit down,
  // as the runtime runs them); a full bucket goes to the lane.
  void FillBuckets(int w, const v1::UnitRange& r, double start) {
    Lane& lane = lanes_[w];
    double t = start;
    for (int u = r.end() - 1; u >= r.begin(); --u) {
      const UnitSimulationCost& c = costs_.units[u];
      t += c.bwd_seconds / costs_.worker_speeds[w] + c.bwd_comm_seconds;
      if (lane.final_backward[u] != pc_[w]) continue;
      const double bytes = BucketBytes(u);
      if (bytes <= 0) continue;  // nothing to carry (the runtime skips it too)
      lane.pending_bytes += bytes;
      lane.bucketed_bytes += bytes;
      lane.pending_begin = u;
      if (lane.pending_end < 0) lane.pending_end = u + 1;
      if (lane.pending_bytes >= costs_.all_reduce_bucket_bytes) LaunchBucket(w, t);
    }
  }

  // The pending bucket's all-reduce on w's lane, issued at time `t`.
  void LaunchBucket(int w, double t) {
    Lane& lane = lanes_[w];
    if (lane.pending_end < 0) return;
    const double bytes = lane.pending_bytes * ByteFraction(w);
    const double cpu = CpuSeconds(w, lane.pending_bytes);
    if (CpuShared(w)) lane.cpu_on_compute += cpu;
    const double seconds = AllReduceSeconds(costs_.data_parallel, bytes, costs_.replica_link) + cpu;
    const double start = std::max(t, lane.free);
    TimelineEvent& e = AddEvent(w, TimelineEventKind::kAllReduceBucket, start, start + seconds);
    e.units = Range{lane.pending_begin, lane.pending_end};
    e.bytes = bytes;
    e.label = absl::StrCat("AllReduce bucket [", lane.pending_begin, ",", lane.pending_end, ") x",
                           costs_.data_parallel, " replicas");
    lane.free = start + seconds;
    lane.pending_bytes = 0;
    lane.pending_begin = lane.pending_end = -1;
  }

  // The data-parallel gradient all-reduce that precedes OptimizerStep(r)
  // (header: the model): with overlap, the last bucket and the wait for
  // the lane, then what no bucket carried. Nothing without replicas or
  // without units.
  void AllReduce(int w, const v1::UnitRange& r) {
    if (costs_.data_parallel <= 1 || r.begin() >= r.end()) return;
    // The tied wte's bytes here (exact; none where its sync is fused, as
    // FusedTiedAllReduce reduced them), and the others'.
    const double all = AllReduceBytes(Range{r.begin(), r.end()}, costs_);
    double others = 0;
    for (int u = r.begin(); u < r.end(); ++u) others += BucketBytes(u);
    others = std::min(others, all);
    const double tied = fused_tied_[w] ? 0.0 : all - others;
    if (Overlaps(w)) {
      Lane& lane = lanes_[w];
      LaunchBucket(w, clock_[w]);
      others = std::max(0.0, others - lane.bucketed_bytes);
      if (lane.cpu_on_compute > 0) {
        // What the buckets' coding took from compute, as if it had run here.
        TimelineEvent& e = AddEvent(w, TimelineEventKind::kAllReduceCpu, clock_[w],
                                    clock_[w] + lane.cpu_on_compute);
        e.units = Range{r.begin(), r.end()};
        e.label = absl::StrCat("all-reduce coding of ", UnitRangeText(r), " on the worker's cores");
        clock_[w] += lane.cpu_on_compute;
        busy_[w] += lane.cpu_on_compute;
        lane.cpu_on_compute = 0;
      }
      if (lane.free > clock_[w]) {
        TimelineEvent& e = AddEvent(w, TimelineEventKind::kAllReduceWait, clock_[w], lane.free);
        e.units = Range{r.begin(), r.end()};
        e.label = absl::StrCat("wait for the AllReduce buckets of ", UnitRangeText(r));
        all_reduce_[w] += lane.free - clock_[w];
        clock_[w] = lane.free;
      }
      if (tied + others <= 0) return;
    }
    const double bytes = tied + others * ByteFraction(w);
    const double seconds =
        AllReduceSeconds(costs_.data_parallel, bytes, costs_.replica_link) + CpuSeconds(w, others);
    TimelineEvent& e = AddEvent(w, TimelineEventKind::kAllReduce, clock_[w], clock_[w] + seconds);
    e.units = Range{r.begin(), r.end()};
    e.bytes = bytes;
    e.label = absl::StrCat("AllReduce ", UnitRangeText(r), " x", costs_.data_parallel, " replicas");
    clock_[w] += seconds;
    all_reduce_[w] += seconds;
  }

  void Compute(int w, TimelineEventKind kind, const v1::UnitRange& r, int micro_batch) {
    const double seconds =
        ComputeSeconds(kind, r) / costs_.worker_speeds[w] + CommSeconds(kind, r);
    TimelineEvent& e = AddEvent(w, kind, clock_[w], clock_[w] + seconds);
    e.micro_batch = micro_batch;
    e.units = Range{r.begin(), r.end()};
    static const char* const kLetters[] = {"F", "B", "R", "Opt"};
    e.label = kind == TimelineEventKind::kOptimizer
                  ? absl::StrCat("Opt ", UnitRangeText(r))
                  : absl::StrCat(kLetters[static_cast<int>(kind)], " mb", micro_batch, " ",
                                 UnitRangeText(r));
    clock_[w] += seconds;
    busy_[w] += seconds;
  }

  const LinkParameters& LinkOf(int src, int dst) const {
    auto it = costs_.link_overrides.find({src, dst});
    return it == costs_.link_overrides.end() ? costs_.link : it->second;
  }

  void Send(int w, const v1::Instruction::Send& send) {
    const int peer = send.peer_stage();
    const LinkParameters& link = LinkOf(w, peer);
    double bytes = TransferBytes(send.tensor(), costs_);
    if (!send.codec().empty()) {
      auto fraction = costs_.codec_wire_fraction.find(send.codec());
      if (fraction != costs_.codec_wire_fraction.end()) bytes *= fraction->second;
    }
    double& link_free = link_free_[{w, peer}];
    const double start = std::max(clock_[w], link_free);
    const double wire =
        link.bandwidth_bytes_per_second > 0 ? bytes / link.bandwidth_bytes_per_second : 0;
    // The link pipelines as LinkShaper (shaped_transport.h) and TCP do: it
    // is free for the next message once this one's bytes are on the wire,
    // and each arrives a latency after its last byte, so back-to-back
    // sends overlap their latencies. Not the data plane's work per
    // message (data_plane_cost.h), which one peer stream does for its
    // messages in turn: that part of the latency holds the link.
    link_free = start + link.per_message_seconds + wire;
    const double arrival = link_free + (link.latency_seconds - link.per_message_seconds);
    // The event is the link's busy span, start..link_free, not ..arrival:
    // transfers on one link never overlap on its lane (timeline_render.h).
    // The rest of the latency shows as the receiver's wait, which ends at
    // the arrival.
    TimelineEvent& e = AddEvent(w, TimelineEventKind::kSendTransfer, start, link_free);
    DescribeTransfer(send.tensor(), peer, &e);
    e.bytes = bytes;
    e.label = absl::StrCat("send ", TensorKeyText(send.tensor()), " to ", peer);
    const MessageKey key = KeyOf(w, peer, send.tensor());
    in_flight_[key] = InFlight{arrival, pc_[w]};
    auto parked = parked_.find(key);
    if (parked != parked_.end()) {
      ready_.push({clock_[parked->second], parked->second});
      parked_.erase(parked);
    }
  }

  // A fused AddTiedGradient (header: the model): false while the other
  // owner has not arrived (w parks until it does); else both go on after
  // the 2D owners' all-reduce. An unfused one, or D = 1: no time.
  bool FusedTiedAllReduce(int w, const v1::Instruction::AddTiedGradient& add) {
    if (!add.fused() || costs_.data_parallel <= 1) return true;
    if (tied_done_.erase(w) > 0) return true;  // the other owner finished it for both
    const int other = w == add.embed_stage() ? add.head_stage() : add.embed_stage();
    auto arrived = tied_arrival_.find(other);
    if (arrived == tied_arrival_.end()) {
      tied_arrival_[w] = clock_[w];
      return false;
    }
    const int owners = 2 * costs_.data_parallel;
    const double start = std::max(clock_[w], arrived->second);
    const double end =
        start + MemberOrderAllReduceSeconds(owners, costs_.tied_grad_bytes, costs_.replica_link);
    for (int owner : {w, other}) {
      if (start > clock_[owner]) {  // the first to arrive idles until the other does
        TimelineEvent& wait = AddEvent(owner, TimelineEventKind::kRecvWait, clock_[owner], start);
        wait.peer = owner == w ? other : w;
        wait.tensor_kind = v1::TENSOR_KIND_TIED_EMBEDDING_GRAD;
        wait.label = absl::StrCat("wait for ", wait.peer, " at the fused embedding sync");
      }
      TimelineEvent& e = AddEvent(owner, TimelineEventKind::kAllReduce, start, end);
      e.bytes = costs_.tied_grad_bytes;
      e.label = absl::StrCat("fused embedding sync x", owners, " owners");
      all_reduce_[owner] += end - start;
      clock_[owner] = end;
    }
    tied_arrival_.erase(arrived);
    tied_done_.insert(other);
    ready_.push({clock_[other], other});
    return true;
  }

  // Gradient clipping's norm exchange before w's optimizer step (header:
  // the model): false while another member has not arrived (w parks until
  // the last does, which resumes the others); then each member goes on
  // once every other member's norms have reached it. No clipping: true.
  bool ClipNormExchange(int w) {
    if (!costs_.grad_clip) return true;
    clip_arrival_[w] = clock_[w] + costs_.grad_clip_tensor_seconds;
    if (static_cast<int>(clip_arrival_.size()) < clip_members_) return false;
    for (const auto& [member, arrived] : clip_arrival_) {
      double release = arrived;
      int last = -1;  // whose norms came last, or -1: its own arrival
      for (const auto& [other, sent] : clip_arrival_) {
        if (other == member) continue;
        // Behind what `other` already queued on the link; a few KB: no wire
        // time, and one latency, its per-message part included.
        auto queued = link_free_.find({other, member});
        const double start = queued == link_free_.end() ? sent : std::max(sent, queued->second);
        const double received = start + LinkOf(other, member).latency_seconds;
        if (received > release) {
          release = received;
          last = other;
        }
      }
      if (release > clock_[member]) {
        TimelineEvent& e = AddEvent(member, TimelineEventKind::kRecvWait, clock_[member], release);
        e.peer = last;
        e.label = last < 0
                      ? std::string("wait for the tensor ranks' gradient norms")
                      : absl::StrCat("wait for the gradient norms (clipping), last from ", last);
      }
      clock_[member] = release;
      if (member != w) {
        clip_done_.insert(member);
        ready_.push({clock_[member], member});
      }
    }
    clip_arrival_.clear();
    return true;
  }

  // False when the tensor has not been sent yet: w parks until it is.
  bool Receive(int w, const v1::Instruction::Recv& recv) {
    const MessageKey key = KeyOf(recv.peer_stage(), w, recv.tensor());
    auto it = in_flight_.find(key);
    if (it == in_flight_.end()) {
      parked_[key] = w;
      return false;
    }
    const double arrival = it->second.arrival;
    in_flight_.erase(it);
    if (arrival > clock_[w]) {
      TimelineEvent& e = AddEvent(w, TimelineEventKind::kRecvWait, clock_[w], arrival);
      DescribeTransfer(recv.tensor(), recv.peer_stage(), &e);
      e.label = absl::StrCat("wait ", TensorKeyText(recv.tensor()), " from ", recv.peer_stage());
      clock_[w] = arrival;
    }
    return true;
  }

  static void DescribeTransfer(const v1::TensorKey& key, int peer, TimelineEvent* e) {
    e->micro_batch = key.micro_batch();
    e->units = Range{key.unit(), key.unit() + 1};
    e->peer = peer;
    e->tensor_kind = key.kind();
  }

  TimelineEvent& AddEvent(int w, TimelineEventKind kind, double start, double end) {
    TimelineEvent& e = events_.emplace_back();
    e.worker = w;
    e.kind = kind;
    e.start_seconds = start;
    e.end_seconds = end;
    e.instruction = pc_[w];
    return e;
  }

  absl::Status CheckFinished() const {
    std::vector<std::string> problems;
    for (int w = 0; w < static_cast<int>(programs_.size()); ++w) {
      if (pc_[w] < programs_[w].instructions_size()) {
        problems.push_back(
            absl::StrCat("worker ", w, " waits forever at instruction ", pc_[w], " (",
                         DescribeInstruction(programs_[w].instructions(pc_[w])), ")"));
      }
    }
    for (const auto& [key, flight] : in_flight_) {
      const int src = std::get<0>(key);
      problems.push_back(
          absl::StrCat("worker ", src, " instruction ", flight.instruction, " (",
                       DescribeInstruction(programs_[src].instructions(flight.instruction)),
                       ") is never received by worker ", std::get<1>(key)));
    }
    if (problems.empty()) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "the programs cannot finish an iteration: ", absl::StrJoin(problems, "; "),
        ". Check that every recv has a matching send (same key, peers swapped) that the sender "
        "reaches without waiting on the receiver."));
  }

  SimulationResult Result() {
    SimulationResult r;
    const int workers = static_cast<int>(programs_.size());
    r.iteration_seconds = *std::max_element(clock_.begin(), clock_.end());
    r.busy_seconds = busy_;
    r.all_reduce_seconds = all_reduce_;
    double occupied = 0;  // compute and all-reduce: everything but the bubble
    for (int w = 0; w < workers; ++w) {
      // Never negative: busy and all-reduce are sums of the same spans
      // that make up the clock, and round differently (-4e-19 was seen).
      r.idle_seconds.push_back(std::max(0.0, r.iteration_seconds - busy_[w] - all_reduce_[w]));
      occupied += busy_[w] + all_reduce_[w];
    }
    if (r.iteration_seconds > 0) r.bubble_fraction = 1 - occupied / (workers * r.iteration_seconds);
    r.events = std::move(events_);
    std::stable_sort(r.events.begin(), r.events.end(),
                     [](const TimelineEvent& a, const TimelineEvent& b) {
                       return std::tie(a.worker, a.start_seconds, a.instruction) <
                              std::tie(b.worker, b.start_seconds, b.instruction);
                     });
    return r;
  }

  struct InFlight {
    double arrival = 0;
    int instruction = 0;  // the send's index in the sender's program
  };

  const std::vector<v1::Program>& programs_;
  const SimulationCosts& costs_;
  std::vector<double> clock_, busy_, all_reduce_;
  std::vector<int> pc_;
  // Each worker's all-reduce lane (overlap; header: the model).
  struct Lane {
    std::vector<int> final_backward;           // per unit: its last Backward's index, or -1
    double free = 0;                           // when the lane's last bucket ends
    double pending_bytes = 0;                  // the bucket being filled
    int pending_begin = -1, pending_end = -1;  // its units (-1: empty)
    double bucketed_bytes = 0;                 // every bucket's bytes, sent or pending
    double cpu_on_compute = 0;                 // the buckets' coding time owed to compute
  };
  std::vector<Lane> lanes_;
  // Min-heap of (clock, worker): the earliest worker runs next; ties by index.
  std::priority_queue<std::pair<double, int>, std::vector<std::pair<double, int>>, std::greater<>>
      ready_;
  std::map<std::pair<int, int>, double> link_free_;  // (src, dst) -> free from
  std::map<MessageKey, InFlight> in_flight_;         // sent, not yet received
  std::map<MessageKey, int> parked_;                 // key -> worker waiting for it
  // Fused embedding sync: per worker whether its program has a fused
  // AddTiedGradient; the owner waiting in it (-> its arrival); the owner
  // whose one the other finished.
  std::vector<bool> fused_tied_;
  std::map<int, double> tied_arrival_;
  std::set<int> tied_done_;
  // Gradient clipping: how many workers step (a program with an
  // OptimizerStep); those in the exchange (-> arrival); those it resumed.
  int clip_members_ = 0;
  std::map<int, double> clip_arrival_;
  std::set<int> clip_done_;
  std::vector<TimelineEvent> events_;
};

}  // namespace

double AllReduceBytes(const Range& units, const SimulationCosts& costs) {
  double bytes = 0;
  for (int u = units.begin; u < units.end; ++u) bytes += costs.units[u].weight_bytes;
  const int last = static_cast<int>(costs.units.size()) - 1;
  if (last >= 1 && units.begin == 0 && units.end == last + 1) {
    // wte is one parameter of this stage, listed by both embed and head.
    bytes -= std::min(
        {costs.tied_grad_bytes, costs.units[0].weight_bytes, costs.units[last].weight_bytes});
  }
  return bytes;
}

double AllReduceSeconds(int replicas, double bytes, const LinkParameters& link) {
  if (replicas <= 1) return 0;
  // acctfm.txt eq. 3, T = alpha*c1 + beta*c2*m, for a ring of D = replicas:
  // D-1 reduce-scatter and D-1 all-gather steps (c1 = 2(D-1)), each moving
  // m/D bytes per device (c2 = 2(D-1)/D); alpha = latency, beta = 1/bandwidth.
  // For D = 2 one exchange: c1 = 1, c2 = 1.
  const double wire =
      link.bandwidth_bytes_per_second > 0 ? bytes / link.bandwidth_bytes_per_second : 0;
  const AllReduceMessages messages = AllReduceMessagesFor(replicas);
  return messages.count * (link.latency_seconds + messages.fraction * wire);
}

double MemberOrderAllReduceSeconds(int members, double bytes, const LinkParameters& link) {
  if (members <= 1) return 0;
  const double wire =
      link.bandwidth_bytes_per_second > 0 ? bytes / link.bandwidth_bytes_per_second : 0;
  if (members == 2) return link.latency_seconds + wire;  // one exchange
  // Each member's n - 1 segments at once (one latency), then the ring's
  // all-gather (n - 1 steps): eq. 3 with c1 = n, c2 = 2(n - 1)/n.
  return members * link.latency_seconds + 2.0 * (members - 1) / members * wire;
}

AllReduceMessages AllReduceMessagesFor(int replicas) {
  if (replicas <= 1) return {};
  // Two members exchange the whole tensor once (Collectives::AllReduce).
  if (replicas == 2) return {1, 1.0};
  return {2 * (replicas - 1), 1.0 / replicas};
}

double TransferBytes(const v1::TensorKey& key, const SimulationCosts& costs) {
  switch (key.kind()) {
    case v1::TENSOR_KIND_ACTIVATION:
      return costs.units[key.unit()].activation_bytes;
    case v1::TENSOR_KIND_ACTIVATION_GRAD:
      return costs.units[key.unit() - 1].activation_bytes;
    case v1::TENSOR_KIND_UNIT_WEIGHTS:
      return costs.units[key.unit()].weight_bytes;
    default:
      return costs.tied_grad_bytes;
  }
}

SimulationCosts SimulationCostsFromProfile(const ModelProfile& profile, const ClusterSpec& cluster,
                                           double tied_grad_bytes) {
  SimulationCosts costs;
  double optimizer_seconds = 0, weight_bytes = 0;
  for (const UnitProfile& u : profile.units) {
    costs.units.push_back({u.fwd_seconds, u.bwd_seconds, u.activation_bytes, u.weight_bytes,
                           u.fwd_comm_seconds, u.bwd_comm_seconds});
    optimizer_seconds += u.optimizer_seconds;
    weight_bytes += u.weight_bytes;
  }
  // AdamW does the same work per element whatever the unit: the profile's
  // timed steps as one rate per weight byte.
  if (weight_bytes > 0) costs.optimizer_seconds_per_byte = optimizer_seconds / weight_bytes;
  for (const WorkerSpec& w : cluster.workers) costs.worker_speeds.push_back(w.speed);
  costs.link = {cluster.bandwidth_bytes_per_second, cluster.latency_seconds,
                cluster.per_message_seconds};
  costs.replica_link = costs.link;
  costs.tied_grad_bytes = tied_grad_bytes;
  costs.all_reduce_bucket_bytes = static_cast<double>(kDataParallelBucketBytes);
  for (const WorkerSpec& w : cluster.workers) costs.all_reduce_overlaps.push_back(!w.gpu);
  return costs;
}

const char* TimelineEventKindName(TimelineEventKind kind) {
  switch (kind) {
    case TimelineEventKind::kForward:
      return "forward";
    case TimelineEventKind::kBackward:
      return "backward";
    case TimelineEventKind::kRecompute:
      return "recompute";
    case TimelineEventKind::kOptimizer:
      return "optimizer";
    case TimelineEventKind::kSendTransfer:
      return "send";
    case TimelineEventKind::kRecvWait:
      return "recv-wait";
    case TimelineEventKind::kAllReduce:
      return "all-reduce";
    case TimelineEventKind::kAllReduceBucket:
      return "all-reduce-bucket";
    case TimelineEventKind::kAllReduceWait:
      return "all-reduce-wait";
    case TimelineEventKind::kAllReduceCpu:
      return "all-reduce-cpu";
    case TimelineEventKind::kTensorParallelAllReduce:
      return "tp-all-reduce";
    case TimelineEventKind::kSendHandoff:
      return "send-handoff";
  }
  return "unknown";
}

absl::StatusOr<SimulationResult> SimulateIteration(const std::vector<v1::Program>& programs,
                                                   const SimulationCosts& costs) {
  const int workers = static_cast<int>(programs.size());
  RETURN_IF_ERROR(ValidateCosts(costs, workers));
  RETURN_IF_ERROR(ValidatePrograms(programs, static_cast<int>(costs.units.size())));
  return Simulator(programs, costs).Run();
}

std::string UnitRangeText(const v1::UnitRange& r) {
  return absl::StrCat("[", r.begin(), ",", r.end(), ")");
}

std::string TensorKeyText(const v1::TensorKey& k) {
  std::string text = absl::StrCat(EnumShortName(k.kind()), " u", k.unit());
  if (k.micro_batch() >= 0) absl::StrAppend(&text, " mb", k.micro_batch());
  return text;
}

}  // namespace pipetrain
