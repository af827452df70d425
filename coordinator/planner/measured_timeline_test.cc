#include "coordinator/planner/measured_timeline.h"

#include <cmath>
#include <functional>
#include <string>

#include "coordinator/planner/timeline_render.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

v1::UnitRange Units(int begin, int end) {
  v1::UnitRange r;
  r.set_begin(begin);
  r.set_end(end);
  return r;
}

v1::TensorKey Key(v1::TensorKind kind, int unit, int micro_batch) {
  v1::TensorKey k;
  k.set_kind(kind);
  k.set_unit(unit);
  k.set_micro_batch(micro_batch);
  return k;
}

// Worker 0: F mb0 [0,2), send; worker 1: recv, F mb0 [2,4), optimizer.
v1::Program FirstStage() {
  v1::Program p;
  auto* f = p.add_instructions()->mutable_forward();
  *f->mutable_units() = Units(0, 2);
  f->set_micro_batch(0);
  auto* s = p.add_instructions()->mutable_send();
  *s->mutable_tensor() = Key(v1::TENSOR_KIND_ACTIVATION, 1, 0);
  s->set_peer_stage(1);
  *p.add_instructions()->mutable_optimizer_step()->mutable_units() = Units(0, 2);
  return p;
}

v1::Program SecondStage() {
  v1::Program p;
  auto* r = p.add_instructions()->mutable_recv();
  *r->mutable_tensor() = Key(v1::TENSOR_KIND_ACTIVATION, 1, 0);
  r->set_peer_stage(0);
  auto* f = p.add_instructions()->mutable_forward();
  *f->mutable_units() = Units(2, 4);
  f->set_micro_batch(0);
  *p.add_instructions()->mutable_optimizer_step()->mutable_units() = Units(2, 4);
  return p;
}

void Time(v1::StepTrace* trace, int instruction, double start, double end, double waited = 0) {
  v1::InstructionTiming* t = trace->add_instructions();
  t->set_instruction(instruction);
  t->set_start_seconds(start);
  t->set_end_seconds(end);
  t->set_waited_seconds(waited);
}

v1::StepTrace Trace(int64_t unix_seconds, int32_t nanos, double seconds) {
  v1::StepTrace trace;
  trace.set_iteration(10);
  trace.mutable_start_time()->set_seconds(unix_seconds);
  trace.mutable_start_time()->set_nanos(nanos);
  trace.set_seconds(seconds);
  return trace;
}

TEST(MeasuredTimeline, LanesAlignedByWallClockWithComputeAndWaits) {
  const v1::Program first = FirstStage(), second = SecondStage();
  // Worker 1 starts 1 ms after worker 0 and waits 4 ms for the activation,
  // then needs 0.5 ms to decode it; its optimizer step waits 1 ms for the
  // data-parallel all-reduce.
  v1::StepTrace t0 = Trace(1000, 0, 0.010);
  Time(&t0, 0, 0.000, 0.005);
  Time(&t0, 1, 0.005, 0.0052);
  Time(&t0, 2, 0.0052, 0.006);
  v1::StepTrace t1 = Trace(1000, 1000000, 0.012);
  Time(&t1, 0, 0.000, 0.0045, 0.004);
  Time(&t1, 1, 0.0045, 0.0095);
  Time(&t1, 2, 0.0095, 0.0115, 0.001);
  for (const v1::StepTrace* t : {&t0, &t1}) {
    ASSERT_TRUE(CheckStepTrace(*t, 10, t == &t0 ? first : second).ok());
  }
  absl::StatusOr<SimulationResult> r = MeasuredTimeline({&first, &second}, {&t0, &t1});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->iteration_seconds, 0.013);  // worker 1: 1 ms late, 12 ms long
  EXPECT_DOUBLE_EQ(r->busy_seconds[0], 0.010);
  EXPECT_DOUBLE_EQ(r->busy_seconds[1], 0.012 - 0.004 - 0.001);
  EXPECT_DOUBLE_EQ(r->all_reduce_seconds[1], 0.001);
  EXPECT_DOUBLE_EQ(r->idle_seconds[0], 0.003);
  EXPECT_NEAR(r->idle_seconds[1], 0.013 - 0.007 - 0.001, 1e-15);

  ASSERT_EQ(r->events.size(), 7u);  // F, send, Opt; wait, F, all-reduce wait, Opt
  const TimelineEvent& forward0 = r->events[0];
  EXPECT_EQ(forward0.kind, TimelineEventKind::kForward);
  EXPECT_EQ(forward0.label, "F mb0 [0,2)");
  const TimelineEvent& handoff = r->events[1];
  EXPECT_EQ(handoff.kind, TimelineEventKind::kSendHandoff);
  EXPECT_DOUBLE_EQ(handoff.start_seconds, 0.005);
  EXPECT_DOUBLE_EQ(handoff.end_seconds, 0.0052);
  EXPECT_EQ(handoff.peer, 1);
  EXPECT_EQ(handoff.label, "hand over ACTIVATION u1 mb0 to 1");
  EXPECT_EQ(r->events[2].kind, TimelineEventKind::kOptimizer);
  const TimelineEvent& wait = r->events[3];
  EXPECT_EQ(wait.worker, 1);
  EXPECT_EQ(wait.kind, TimelineEventKind::kRecvWait);
  EXPECT_DOUBLE_EQ(wait.start_seconds, 0.001);
  EXPECT_DOUBLE_EQ(wait.end_seconds, 0.005);
  EXPECT_EQ(wait.peer, 0);
  EXPECT_EQ(wait.label, "wait ACTIVATION u1 mb0 from 0");
  EXPECT_EQ(r->events[4].label, "F mb0 [2,4)");
  EXPECT_DOUBLE_EQ(r->events[4].start_seconds, 0.0055);
  EXPECT_EQ(r->events[5].kind, TimelineEventKind::kAllReduceWait);
  EXPECT_DOUBLE_EQ(r->events[5].end_seconds, 0.0115);
  EXPECT_EQ(r->events[6].kind, TimelineEventKind::kOptimizer);
  EXPECT_DOUBLE_EQ(r->events[6].start_seconds, 0.0115);

  const std::string svg = TimelineSvg(*r, {"w-1", "w-2"});
  EXPECT_NE(svg.find("F mb0 [2,4)"), std::string::npos);
  EXPECT_NE(svg.find("hand over ACTIVATION u1 mb0 to 1"), std::string::npos);
  EXPECT_NE(svg.find("send-handoff"), std::string::npos);  // in the legend
  EXPECT_NE(svg.find("w-2"), std::string::npos);
}

// The tied embedding: its fused sync is an all-reduce on the lane; the
// unfused addition is busy time but not drawn.
TEST(MeasuredTimeline, FusedEmbeddingSyncDrawnAsAllReduceUnfusedAddNot) {
  v1::Program program;
  program.add_instructions()->mutable_add_tied_gradient()->set_fused(true);
  program.add_instructions()->mutable_add_tied_gradient();
  v1::StepTrace trace = Trace(1000, 0, 0.004);
  Time(&trace, 0, 0.0, 0.003);
  Time(&trace, 1, 0.003, 0.004);
  ASSERT_TRUE(CheckStepTrace(trace, 10, program).ok());
  absl::StatusOr<SimulationResult> r = MeasuredTimeline({&program}, {&trace});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->events.size(), 1u);
  EXPECT_EQ(r->events[0].kind, TimelineEventKind::kAllReduce);
  EXPECT_EQ(r->events[0].label, "fused embedding sync (all-reduce)");
  EXPECT_DOUBLE_EQ(r->busy_seconds[0], 0.004);
}

// A compute pass that first waited for queued sends to leave (a slow
// link: the runtime paces its sends there) is drawn from its wait's end,
// the wait idle: it was drawn and counted as compute.
TEST(MeasuredTimeline, ComputeWaitForQueuedSendsIsIdleNotDrawn) {
  const v1::Program first = FirstStage();
  v1::StepTrace trace = Trace(1000, 0, 0.010);
  Time(&trace, 0, 0.000, 0.005, 0.003);  // 3 ms waiting, then 2 ms forward
  Time(&trace, 1, 0.005, 0.0052);
  Time(&trace, 2, 0.0052, 0.006);
  ASSERT_TRUE(CheckStepTrace(trace, 10, first).ok());
  absl::StatusOr<SimulationResult> r = MeasuredTimeline({&first}, {&trace});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->events.size(), 3u);
  EXPECT_EQ(r->events[0].kind, TimelineEventKind::kForward);
  EXPECT_DOUBLE_EQ(r->events[0].start_seconds, 0.003);
  EXPECT_DOUBLE_EQ(r->busy_seconds[0], 0.010 - 0.003);
  EXPECT_DOUBLE_EQ(r->idle_seconds[0], 0.003);
}

TEST(LeadingLanesWithin, AsManyLeadingLanesAsFitButAlwaysOne) {
  EXPECT_EQ(LeadingLanesWithin({}, 10), 0);
  EXPECT_EQ(LeadingLanesWithin({3, 3, 3}, 10), 3);
  EXPECT_EQ(LeadingLanesWithin({3, 3, 3}, 9), 3);
  EXPECT_EQ(LeadingLanesWithin({3, 3, 3}, 8), 2);
  EXPECT_EQ(LeadingLanesWithin({3, 3, 3}, 5), 1);
  EXPECT_EQ(LeadingLanesWithin({20, 1}, 10), 1);  // the first lane even when too long
  EXPECT_EQ(LeadingLanesWithin({1, 20, 1}, 10), 1);
}

TEST(MeasuredTimeline, NeedsOneTracePerProgram) {
  const v1::Program first = FirstStage();
  const v1::StepTrace t0 = Trace(1000, 0, 0.01);
  EXPECT_EQ(MeasuredTimeline({}, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MeasuredTimeline({&first, &first}, {&t0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Each bad field is refused, naming it.
TEST(CheckStepTrace, OutOfBoundsFieldsNamed) {
  const v1::Program program = FirstStage();
  auto valid = [] {
    v1::StepTrace t = Trace(1000, 0, 0.01);
    Time(&t, 0, 0.0, 0.005);
    Time(&t, 2, 0.005, 0.006, 0.0005);
    return t;
  };
  ASSERT_TRUE(CheckStepTrace(valid(), 10, program).ok());
  struct Case {
    std::string field;
    std::function<void(v1::StepTrace*)> spoil;
  };
  const Case cases[] = {
      {".iteration", [](v1::StepTrace* t) { t->set_iteration(11); }},
      {".start_time", [](v1::StepTrace* t) { t->mutable_start_time()->set_nanos(-1); }},
      {".start_time",
       [](v1::StepTrace* t) { t->mutable_start_time()->set_seconds(int64_t{1} << 40); }},
      {".seconds", [](v1::StepTrace* t) { t->set_seconds(2e6); }},
      {".seconds", [](v1::StepTrace* t) { t->set_seconds(NAN); }},
      {".instructions",
       [](v1::StepTrace* t) {
         for (int i = 0; i < 2; ++i) Time(t, 2, 0.006, 0.006);
       }},
      {".instructions[1].instruction",
       [](v1::StepTrace* t) { t->mutable_instructions(1)->set_instruction(0); }},
      {".instructions[1].instruction",
       [](v1::StepTrace* t) { t->mutable_instructions(1)->set_instruction(3); }},
      {".instructions[0].instruction",
       [](v1::StepTrace* t) { t->mutable_instructions(0)->set_instruction(-1); }},
      {".instructions[0].start_seconds",
       [](v1::StepTrace* t) { t->mutable_instructions(0)->set_start_seconds(-1e-9); }},
      {".instructions[0].start_seconds",
       [](v1::StepTrace* t) { t->mutable_instructions(0)->set_start_seconds(INFINITY); }},
      {".instructions[0].end_seconds",
       [](v1::StepTrace* t) { t->mutable_instructions(0)->set_end_seconds(0.02); }},
      {".instructions[1].end_seconds",
       [](v1::StepTrace* t) { t->mutable_instructions(1)->set_end_seconds(0.004); }},
      {".instructions[1].waited_seconds",
       [](v1::StepTrace* t) { t->mutable_instructions(1)->set_waited_seconds(0.002); }},
      {".instructions[1].waited_seconds",
       [](v1::StepTrace* t) { t->mutable_instructions(1)->set_waited_seconds(NAN); }},
  };
  for (const Case& c : cases) {
    v1::StepTrace t = valid();
    c.spoil(&t);
    const absl::Status status = CheckStepTrace(t, 10, program);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(std::string(status.message()).find("ReportProgressRequest.trace" + c.field + ":"),
              std::string::npos)
        << status;
  }
}

}  // namespace
}  // namespace pipetrain
