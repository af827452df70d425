#include "coordinator/planner/measured_timeline.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace pipetrain {
namespace {

absl::Status Invalid(const std::string& field, const std::string& problem) {
  return absl::InvalidArgumentError(
      absl::StrCat("ReportProgressRequest.trace", field, ": ", problem));
}

bool Within(double seconds, double high) {
  return std::isfinite(seconds) && seconds >= 0 && seconds <= high;
}

// google.protobuf.Timestamp's documented range: 0001-01-01 to 9999-12-31.
bool ValidTimestamp(const google::protobuf::Timestamp& t) {
  return t.seconds() >= -62135596800 && t.seconds() <= 253402300799 && t.nanos() >= 0 &&
         t.nanos() < 1000000000;
}

// a - b in seconds, from the integer parts (exact to the nanosecond for
// any two times within a few days: no Unix-time-sized double in between).
double SecondsBetween(const google::protobuf::Timestamp& a, const google::protobuf::Timestamp& b) {
  return static_cast<double>(a.seconds() - b.seconds()) + 1e-9 * (a.nanos() - b.nanos());
}

// A send's or receive's tensor and peer on its event, as the simulator
// describes its transfers and waits.
void DescribeTensor(const v1::TensorKey& key, int peer, TimelineEvent* e) {
  e->peer = peer;
  e->tensor_kind = key.kind();
  e->micro_batch = key.micro_batch();
  e->units = Range{key.unit(), key.unit() + 1};
}

}  // namespace

absl::Status CheckStepTrace(const v1::StepTrace& trace, int64_t iteration,
                            const v1::Program& program) {
  if (trace.iteration() != iteration) {
    return Invalid(".iteration",
                   absl::StrCat(trace.iteration(), " is not the reported iteration ", iteration));
  }
  if (!ValidTimestamp(trace.start_time())) {
    return Invalid(".start_time", "is not a valid timestamp");
  }
  if (!Within(trace.seconds(), kMaxTracedStepSeconds)) {
    return Invalid(".seconds",
                   absl::StrCat(trace.seconds(), " is outside [0, ", kMaxTracedStepSeconds, "]"));
  }
  if (trace.instructions_size() > program.instructions_size()) {
    return Invalid(".instructions",
                   absl::StrCat(trace.instructions_size(), " timings for a program of ",
                                program.instructions_size(), " instructions"));
  }
  int previous = -1;
  for (int i = 0; i < trace.instructions_size(); ++i) {
    const v1::InstructionTiming& t = trace.instructions(i);
    const std::string at = absl::StrCat(".instructions[", i, "]");
    if (t.instruction() <= previous || t.instruction() >= program.instructions_size()) {
      return Invalid(at + ".instruction",
                     absl::StrCat(t.instruction(), " is not an instruction after ", previous,
                                  " of a program of ", program.instructions_size()));
    }
    previous = t.instruction();
    if (!Within(t.start_seconds(), trace.seconds())) {
      return Invalid(at + ".start_seconds",
                     absl::StrCat(t.start_seconds(), " is outside [0, ", trace.seconds(), "]"));
    }
    if (!(Within(t.end_seconds(), trace.seconds()) && t.end_seconds() >= t.start_seconds())) {
      return Invalid(at + ".end_seconds",
                     absl::StrCat(t.end_seconds(), " is outside [", t.start_seconds(), ", ",
                                  trace.seconds(), "]"));
    }
    if (!Within(t.waited_seconds(), t.end_seconds() - t.start_seconds())) {
      return Invalid(at + ".waited_seconds",
                     absl::StrCat(t.waited_seconds(), " is outside [0, ",
                                  t.end_seconds() - t.start_seconds(), "]"));
    }
  }
  return absl::OkStatus();
}

int LeadingLanesWithin(const std::vector<int>& timings, int64_t max_timings) {
  int64_t sum = 0;
  int lanes = 0;
  for (int t : timings) {
    sum += t;
    if (sum > max_timings && lanes > 0) break;
    ++lanes;
  }
  return lanes;
}

absl::StatusOr<SimulationResult> MeasuredTimeline(const std::vector<const v1::Program*>& programs,
                                                  const std::vector<const v1::StepTrace*>& traces) {
  if (programs.empty() || programs.size() != traces.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a measured timeline needs one trace per "
                     "program, got ",
                     traces.size(), " for ", programs.size()));
  }
  const int workers = static_cast<int>(programs.size());
  const google::protobuf::Timestamp* first_start = &traces[0]->start_time();
  for (const v1::StepTrace* trace : traces) {
    if (SecondsBetween(trace->start_time(), *first_start) < 0) first_start = &trace->start_time();
  }
  SimulationResult r;
  r.busy_seconds.assign(workers, 0.0);
  r.all_reduce_seconds.assign(workers, 0.0);
  for (int w = 0; w < workers; ++w) {
    const v1::StepTrace& trace = *traces[w];
    const double offset = SecondsBetween(trace.start_time(), *first_start);
    double received = 0;  // waited in receives (and for queued sends to leave)
    auto add = [&](TimelineEventKind kind, double start, double end, int instruction) {
      TimelineEvent& e = r.events.emplace_back();
      e.worker = w;
      e.kind = kind;
      e.start_seconds = offset + start;
      e.end_seconds = offset + end;
      e.instruction = instruction;
      return &e;
    };
    for (const v1::InstructionTiming& t : trace.instructions()) {
      const v1::Instruction& in = programs[w]->instructions(t.instruction());
      const double start = t.start_seconds(), end = t.end_seconds(), waited = t.waited_seconds();
      switch (in.op_case()) {
        case v1::Instruction::kForward:
        case v1::Instruction::kBackward:
        case v1::Instruction::kRecompute: {
          const bool forward = in.has_forward(), backward = in.has_backward();
          const v1::UnitRange& units = forward    ? in.forward().units()
                                       : backward ? in.backward().units()
                                                  : in.recompute().units();
          const int micro_batch = forward    ? in.forward().micro_batch()
                                  : backward ? in.backward().micro_batch()
                                             : in.recompute().micro_batch();
          // Its wait first, for queued sends to leave (a slow link): idle,
          // left blank.
          const double waited_first = std::clamp(waited, 0.0, end - start);
          received += waited_first;
          TimelineEvent* e = add(forward    ? TimelineEventKind::kForward
                                 : backward ? TimelineEventKind::kBackward
                                            : TimelineEventKind::kRecompute,
                                 start + waited_first, end, t.instruction());
          e->micro_batch = micro_batch;
          e->units = Range{units.begin(), units.end()};
          e->label = absl::StrCat(forward    ? "F"
                                  : backward ? "B"
                                             : "R",
                                  " mb", micro_batch, " ", UnitRangeText(units));
          break;
        }
        case v1::Instruction::kOptimizerStep: {
          const v1::UnitRange& units = in.optimizer_step().units();
          if (waited > 0) {
            TimelineEvent* e =
                add(TimelineEventKind::kAllReduceWait, start, start + waited, t.instruction());
            e->units = Range{units.begin(), units.end()};
            e->label =
                absl::StrCat("wait for the data-parallel all-reduce of ", UnitRangeText(units));
            r.all_reduce_seconds[w] += waited;
          }
          TimelineEvent* e =
              add(TimelineEventKind::kOptimizer, start + waited, end, t.instruction());
          e->units = Range{units.begin(), units.end()};
          e->label = absl::StrCat("Opt ", UnitRangeText(units));
          break;
        }
        case v1::Instruction::kRecv: {
          if (waited <= 0) break;
          const v1::Instruction::Recv& recv = in.recv();
          TimelineEvent* e =
              add(TimelineEventKind::kRecvWait, start, start + waited, t.instruction());
          DescribeTensor(recv.tensor(), recv.peer_stage(), e);
          e->label =
              absl::StrCat("wait ", TensorKeyText(recv.tensor()), " from ", recv.peer_stage());
          received += waited;
          break;
        }
        case v1::Instruction::kAddTiedGradient: {
          // Fused, an all-reduce over the owners of every replica; unfused,
          // an addition of what the exchange brought (busy, not drawn).
          if (end <= start || !in.add_tied_gradient().fused()) break;
          TimelineEvent* e = add(TimelineEventKind::kAllReduce, start, end, t.instruction());
          e->label = "fused embedding sync (all-reduce)";
          break;
        }
        case v1::Instruction::kSend: {  // its hand-off; the wire is not measured
          if (end <= start) break;
          const v1::Instruction::Send& send = in.send();
          TimelineEvent* e = add(TimelineEventKind::kSendHandoff, start, end, t.instruction());
          DescribeTensor(send.tensor(), send.peer_stage(), e);
          e->label =
              absl::StrCat("hand over ", TensorKeyText(send.tensor()), " to ", send.peer_stage());
          break;
        }
        case v1::Instruction::OP_NOT_SET:
          break;
      }
    }
    r.busy_seconds[w] = std::max(0.0, trace.seconds() - received - r.all_reduce_seconds[w]);
    r.iteration_seconds = std::max(r.iteration_seconds, offset + trace.seconds());
  }
  double occupied = 0;
  for (int w = 0; w < workers; ++w) {
    r.idle_seconds.push_back(
        std::max(0.0, r.iteration_seconds - r.busy_seconds[w] - r.all_reduce_seconds[w]));
    occupied += r.busy_seconds[w] + r.all_reduce_seconds[w];
  }
  if (r.iteration_seconds > 0) r.bubble_fraction = 1 - occupied / (workers * r.iteration_seconds);
  std::stable_sort(r.events.begin(), r.events.end(),
                   [](const TimelineEvent& a, const TimelineEvent& b) {
                     return std::tie(a.worker, a.start_seconds, a.instruction) <
                            std::tie(b.worker, b.start_seconds, b.instruction);
                   });
  return r;
}

}  // namespace pipetrain
