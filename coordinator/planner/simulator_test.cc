#include "coordinator/planner/simulator.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/planner/schedule_compiler.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

using ::testing::HasSubstr;

// Hand-written program builders.
v1::Instruction Compute(const std::string& op, int begin, int end, int mb) {
  v1::Instruction in;
  v1::UnitRange* r = nullptr;
  if (op == "F") {
    r = in.mutable_forward()->mutable_units();
    in.mutable_forward()->set_micro_batch(mb);
  } else if (op == "B") {
    r = in.mutable_backward()->mutable_units();
    in.mutable_backward()->set_micro_batch(mb);
  } else if (op == "R") {
    r = in.mutable_recompute()->mutable_units();
    in.mutable_recompute()->set_micro_batch(mb);
  } else {
    r = in.mutable_optimizer_step()->mutable_units();
  }
  r->set_begin(begin);
  r->set_end(end);
  return in;
}

v1::TensorKey Key(v1::TensorKind kind, int unit, int mb) {
  v1::TensorKey key;
  key.set_kind(kind);
  key.set_unit(unit);
  key.set_micro_batch(mb);
  return key;
}

v1::Instruction Send(v1::TensorKind kind, int unit, int mb, int peer) {
  v1::Instruction in;
  *in.mutable_send()->mutable_tensor() = Key(kind, unit, mb);
  in.mutable_send()->set_peer_stage(peer);
  return in;
}

v1::Instruction Recv(v1::TensorKind kind, int unit, int mb, int peer) {
  v1::Instruction in;
  *in.mutable_recv()->mutable_tensor() = Key(kind, unit, mb);
  in.mutable_recv()->set_peer_stage(peer);
  return in;
}

v1::Program Program(const std::vector<v1::Instruction>& instructions) {
  v1::Program p;
  for (const auto& in : instructions) *p.add_instructions() = in;
  return p;
}

// Every unit costs fwd / bwd; activations `act_bytes`; speed 1 for `workers`.
SimulationCosts UniformCosts(int units, double fwd, double bwd, double act_bytes, int workers) {
  SimulationCosts costs;
  costs.units.assign(units, UnitSimulationCost{fwd, bwd, act_bytes, 0});
  costs.worker_speeds.assign(workers, 1.0);
  return costs;
}

// Worker w's events as "label@start-end", in timeline order.
std::vector<std::string> Timeline(const SimulationResult& r, int w) {
  std::vector<std::string> out;
  for (const TimelineEvent& e : r.events) {
    if (e.worker == w)
      out.push_back(absl::StrCat(e.label, "@", e.start_seconds, "-", e.end_seconds));
  }
  return out;
}

TEST(SimulatorTest, GPipe_TwoStagesTwoMicroBatches_HandComputedTimeline) {
  auto programs = CompilePrograms({{0, 2}, {2, 4}}, 4, 2, Schedule::kGPipe).value();
  SimulationCosts costs = UniformCosts(4, 1, 2, 100, 2);
  costs.link.bandwidth_bytes_per_second = 100;  // an activation takes 1 s
  const SimulationResult r = SimulateIteration(programs, costs).value();
  // Stage fwd 2 s, bwd 4 s; the tied gradient has 0 bytes and latency 0.
  EXPECT_EQ(Timeline(r, 0),
            (std::vector<std::string>{
                "F mb0 [0,2)@0-2", "send ACTIVATION u1 mb0 to 1@2-3", "F mb1 [0,2)@2-4",
                "send ACTIVATION u1 mb1 to 1@4-5", "wait ACTIVATION_GRAD u2 mb0 from 1@4-12",
                "B mb0 [0,2)@12-16", "B mb1 [0,2)@16-20", "send TIED_EMBEDDING_GRAD u0 to 1@20-20",
                "Opt [0,2)@20-20"}));
  EXPECT_EQ(
      Timeline(r, 1),
      (std::vector<std::string>{
          "wait ACTIVATION u1 mb0 from 0@0-3", "F mb0 [2,4)@3-5", "F mb1 [2,4)@5-7",
          "B mb0 [2,4)@7-11", "send ACTIVATION_GRAD u2 mb0 to 0@11-12", "B mb1 [2,4)@11-15",
          "send ACTIVATION_GRAD u2 mb1 to 0@15-16", "wait TIED_EMBEDDING_GRAD u0 from 0@15-20",
          "send TIED_EMBEDDING_GRAD u0 to 0@16-16", "Opt [2,4)@20-20"}));
  EXPECT_EQ(r.iteration_seconds, 20);
  EXPECT_EQ(r.busy_seconds, (std::vector<double>{12, 12}));
  EXPECT_EQ(r.idle_seconds, (std::vector<double>{8, 8}));
  EXPECT_DOUBLE_EQ(r.bubble_fraction, 0.4);
}

TEST(SimulatorTest, OneFOneB_TwoStagesThreeMicroBatches_HandComputedTimeline) {
  auto programs = CompilePrograms({{0, 2}, {2, 4}}, 4, 3, Schedule::kOneFOneB).value();
  SimulationCosts costs = UniformCosts(4, 1, 2, 100, 2);
  // Infinite bandwidth: a transfer holds its link for 0 s (a zero-length
  // send event) and arrives 0.5 s after it is sent.
  costs.link.latency_seconds = 0.5;
  const SimulationResult r = SimulateIteration(programs, costs).value();
  EXPECT_EQ(
      Timeline(r, 0),
      (std::vector<std::string>{
          "F mb0 [0,2)@0-2", "send ACTIVATION u1 mb0 to 1@2-2", "F mb1 [0,2)@2-4",
          "send ACTIVATION u1 mb1 to 1@4-4", "wait ACTIVATION_GRAD u2 mb0 from 1@4-9",
          "B mb0 [0,2)@9-13", "F mb2 [0,2)@13-15", "send ACTIVATION u1 mb2 to 1@15-15",
          "B mb1 [0,2)@15-19", "wait ACTIVATION_GRAD u2 mb2 from 1@19-22", "B mb2 [0,2)@22-26",
          "send TIED_EMBEDDING_GRAD u0 to 1@26-26", "Opt [0,2)@26-26"}));
  // Link 1->0 is free again at once, so the tied gradient leaves at 21.5
  // with the last activation gradient, not after its latency (it once did:
  // @22-22.5); both arrive at 21.5 + 0.5 = 22 (worker 0's wait for the
  // gradient ends then; it takes the tied gradient at 26).
  EXPECT_EQ(Timeline(r, 1),
            (std::vector<std::string>{
                "wait ACTIVATION u1 mb0 from 0@0-2.5", "F mb0 [2,4)@2.5-4.5", "B mb0 [2,4)@4.5-8.5",
                "send ACTIVATION_GRAD u2 mb0 to 0@8.5-8.5", "F mb1 [2,4)@8.5-10.5",
                "B mb1 [2,4)@10.5-14.5", "send ACTIVATION_GRAD u2 mb1 to 0@14.5-14.5",
                "wait ACTIVATION u1 mb2 from 0@14.5-15.5", "F mb2 [2,4)@15.5-17.5",
                "B mb2 [2,4)@17.5-21.5", "send ACTIVATION_GRAD u2 mb2 to 0@21.5-21.5",
                "send TIED_EMBEDDING_GRAD u0 to 0@21.5-21.5",
                "wait TIED_EMBEDDING_GRAD u0 from 0@21.5-26.5", "Opt [2,4)@26.5-26.5"}));
  EXPECT_EQ(r.iteration_seconds, 26.5);
  EXPECT_EQ(r.busy_seconds, (std::vector<double>{18, 18}));
  EXPECT_EQ(r.idle_seconds, (std::vector<double>{8.5, 8.5}));
  EXPECT_DOUBLE_EQ(r.bubble_fraction, 1 - 36.0 / 53.0);
}

// When worker w's waits for activations end, in timeline order.
std::vector<double> ActivationWaitEnds(const SimulationResult& r, int w) {
  std::vector<double> out;
  for (const TimelineEvent& e : r.events) {
    if (e.worker == w && e.kind == TimelineEventKind::kRecvWait &&
        e.tensor_kind == v1::TENSOR_KIND_ACTIVATION) {
      out.push_back(e.end_seconds);
    }
  }
  return out;
}

// Back-to-back sends overlap their latencies, as on LinkShaper
// (shaped_transport.h) and TCP: start_i = max(sent_i, done_{i-1}),
// done_i = start_i + bytes / bandwidth, arrival_i = done_i + latency.
// Hand-derived: the planner does not link the worker's transport. GPipe,
// two stages, four micro-batches, stage 0's forward 0.25 s and stage 1's
// free, so worker 1 waits for every activation until it arrives.
TEST(SimulatorTest, GPipe_BackToBackSends_LatenciesOverlapAsOnLinkShaper) {
  auto programs = CompilePrograms({{0, 1}, {1, 2}}, 2, 4, Schedule::kGPipe).value();
  SimulationCosts costs;
  costs.units = {{0.25, 0, 0, 0}, {0, 0, 0, 0}};
  costs.worker_speeds = {1, 1};
  costs.link.latency_seconds = 1;  // infinite bandwidth: no time on the wire
  absl::StatusOr<SimulationResult> r = SimulateIteration(programs, costs);
  ASSERT_TRUE(r.ok()) << r.status();
  // Sent at 0.25, 0.5, 0.75, 1, each arriving 1 s later (a link held for
  // its latency delivered at 1.25, 2.25, 3.25, 4.25). Worker 1's
  // gradients all go at 2 and arrive at 3, when worker 0 runs its backward
  // passes and sends its tied gradient, which arrives at 4.
  EXPECT_EQ(Timeline(*r, 1),
            (std::vector<std::string>{
                "wait ACTIVATION u0 mb0 from 0@0-1.25", "F mb0 [1,2)@1.25-1.25",
                "wait ACTIVATION u0 mb1 from 0@1.25-1.5", "F mb1 [1,2)@1.5-1.5",
                "wait ACTIVATION u0 mb2 from 0@1.5-1.75", "F mb2 [1,2)@1.75-1.75",
                "wait ACTIVATION u0 mb3 from 0@1.75-2", "F mb3 [1,2)@2-2", "B mb0 [1,2)@2-2",
                "send ACTIVATION_GRAD u1 mb0 to 0@2-2", "B mb1 [1,2)@2-2",
                "send ACTIVATION_GRAD u1 mb1 to 0@2-2", "B mb2 [1,2)@2-2",
                "send ACTIVATION_GRAD u1 mb2 to 0@2-2", "B mb3 [1,2)@2-2",
                "send ACTIVATION_GRAD u1 mb3 to 0@2-2", "send TIED_EMBEDDING_GRAD u0 to 0@2-2",
                "wait TIED_EMBEDDING_GRAD u0 from 0@2-4",
                "Opt [1,2)@4-4"}));
  EXPECT_EQ(r->iteration_seconds, 4);

  // 50 bytes at 100 bytes/s: 0.5 s on the wire, longer than the 0.25 s
  // between sends, so each waits for the bytes before it: on the wire
  // 0.25-0.75, 0.75-1.25, 1.25-1.75, 1.75-2.25, arriving 1 s after each.
  costs.units[0].activation_bytes = 50;
  costs.link.bandwidth_bytes_per_second = 100;
  r = SimulateIteration(programs, costs);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ActivationWaitEnds(*r, 1), (std::vector<double>{1.75, 2.25, 2.75, 3.25}));
  std::vector<std::string> sends;
  for (const std::string& event : Timeline(*r, 0)) {
    if (absl::StartsWith(event, "send ACTIVATION ")) sends.push_back(event);
  }
  EXPECT_EQ(sends, (std::vector<std::string>{"send ACTIVATION u0 mb0 to 1@0.25-0.75",
                                             "send ACTIVATION u0 mb1 to 1@0.75-1.25",
                                             "send ACTIVATION u0 mb2 to 1@1.25-1.75",
                                             "send ACTIVATION u0 mb3 to 1@1.75-2.25"}));
}

// The data plane's work per message (data_plane_cost.h: s o, part of the
// folded latency) is serial: back-to-back sends queue behind it on their
// link and overlap only the rest of the latency, the wire's L. Here
// o = 0.25 s of a 1.25 s latency (L = 1 s). Sent together at 0 with no
// bytes on the wire, the two arrive at o + L = 1.25 and 2 o + L = 1.5 (with
// the whole latency overlapped they arrived together at 1.25).
TEST(SimulatorTest, BackToBackSends_PerMessagePartOfTheLatencyHoldsTheLink) {
  const std::vector<v1::Program> programs = {
      Program(
          {Send(v1::TENSOR_KIND_ACTIVATION, 0, 0, 1), Send(v1::TENSOR_KIND_ACTIVATION, 0, 1, 1)}),
      Program(
          {Recv(v1::TENSOR_KIND_ACTIVATION, 0, 0, 0), Recv(v1::TENSOR_KIND_ACTIVATION, 0, 1, 0)}),
  };
  SimulationCosts costs = UniformCosts(1, 0, 0, 100, 2);
  costs.link = {0, 1.25, 0.25};  // infinite bandwidth
  absl::StatusOr<SimulationResult> r = SimulateIteration(programs, costs);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Timeline(*r, 0), (std::vector<std::string>{"send ACTIVATION u0 mb0 to 1@0-0.25",
                                                       "send ACTIVATION u0 mb1 to 1@0.25-0.5"}));
  EXPECT_EQ(ActivationWaitEnds(*r, 1), (std::vector<double>{1.25, 1.5}));
  EXPECT_EQ(r->iteration_seconds, 1.5);
  // 100 bytes at 400 B/s: o then 0.25 s on the wire each, so the link is
  // held 0-0.5 and 0.5-1, and they arrive at 1.5 and 2 (overlapping o
  // too, the second followed the first's bytes by 0.25 s: 1.5, 1.75).
  costs.link.bandwidth_bytes_per_second = 400;
  r = SimulateIteration(programs, costs);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Timeline(*r, 0), (std::vector<std::string>{"send ACTIVATION u0 mb0 to 1@0-0.5",
                                                       "send ACTIVATION u0 mb1 to 1@0.5-1"}));
  EXPECT_EQ(ActivationWaitEnds(*r, 1), (std::vector<double>{1.5, 2}));
  // Every other model still charges the whole latency per message: eq. 3.
  EXPECT_EQ(AllReduceSeconds(2, 400, costs.link), 1.25 + 1);
}

TEST(SimulatorTest, BalancedStagesZeroComm_BubbleIsTheory) {
  for (Schedule schedule : {Schedule::kGPipe, Schedule::kOneFOneB}) {
    for (int p : {1, 2, 3, 4, 8}) {
      for (int m : {1, 2, 5, 8, 16}) {
        SCOPED_TRACE(absl::StrCat(ScheduleName(schedule), " P=", p, " m=", m));
        std::vector<Range> ranges;
        for (int s = 0; s < p; ++s) ranges.push_back({2 * s, 2 * s + 2});
        auto programs = CompilePrograms(ranges, 2 * p, m, schedule).value();
        const SimulationResult r =
            SimulateIteration(programs, UniformCosts(2 * p, 0.5, 1, 1e6, p)).value();
        // Stage fwd 1 s, bwd 2 s: (m + P - 1) slots of 3 s, m of them busy.
        EXPECT_EQ(r.iteration_seconds, 3.0 * (m + p - 1));
        ASSERT_EQ(r.busy_seconds.size(), static_cast<size_t>(p));
        for (double busy : r.busy_seconds) EXPECT_EQ(busy, 3.0 * m);
        EXPECT_DOUBLE_EQ(r.bubble_fraction, (p - 1.0) / (m + p - 1.0));
      }
    }
  }
}

// A profile's timed optimizer steps become one rate per weight byte, so a
// stage's OptimizerStep costs what its units' steps were timed at (AdamW's
// work per element is the same in every unit).
TEST(SimulatorTest, ProfileOptimizerSteps_ChargedPerWeightByte) {
  ModelProfile profile;
  profile.units = {{"embed", 1, 2, 100, 10, 0}, {"head", 1, 2, 300, 4, 0}};
  profile.units[0].optimizer_seconds = 0.001;
  profile.units[1].optimizer_seconds = 0.003;
  ClusterSpec cluster;
  cluster.workers = {{"w0", 1, 0}};
  const SimulationCosts costs = SimulationCostsFromProfile(profile, cluster, 0);
  EXPECT_DOUBLE_EQ(costs.optimizer_seconds_per_byte, 0.004 / 400);
  absl::StatusOr<SimulationResult> r =
      SimulateIteration({Program({Compute("O", 0, 2, -1)})}, costs);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->iteration_seconds, 0.004, 1e-12);
  // Not timed (an analytic profile): no optimizer cost, as before.
  profile.units[0].optimizer_seconds = profile.units[1].optimizer_seconds = 0;
  EXPECT_EQ(SimulationCostsFromProfile(profile, cluster, 0).optimizer_seconds_per_byte, 0);
}

TEST(SimulatorTest, TwoSendsOnOneLink_SecondWaitsForFirst) {
  const std::vector<v1::Program> programs = {
      Program({Send(v1::TENSOR_KIND_ACTIVATION, 0, 0, 1), Send(v1::TENSOR_KIND_ACTIVATION, 0, 1, 1),
               Recv(v1::TENSOR_KIND_ACTIVATION, 0, 2, 1)}),
      Program({Send(v1::TENSOR_KIND_ACTIVATION, 0, 2, 0), Recv(v1::TENSOR_KIND_ACTIVATION, 0, 1, 0),
               Recv(v1::TENSOR_KIND_ACTIVATION, 0, 0, 0)}),
  };
  SimulationCosts costs = UniformCosts(1, 0, 0, 100, 2);
  costs.link = {100, 0.25};  // 1 s on the wire, then 0.25 s latency
  const SimulationResult r = SimulateIteration(programs, costs).value();
  // mb1 waits for mb0's bytes (0-1), not for its latency: on the wire 1-2,
  // it arrives at 2 + 0.25 = 2.25.
  EXPECT_EQ(Timeline(r, 0), (std::vector<std::string>{"send ACTIVATION u0 mb0 to 1@0-1",
                                                      "wait ACTIVATION u0 mb2 from 1@0-1.25",
                                                      "send ACTIVATION u0 mb1 to 1@1-2"}));
  // The reverse direction is a separate link: its transfer is not delayed.
  EXPECT_EQ(Timeline(r, 1), (std::vector<std::string>{"send ACTIVATION u0 mb2 to 0@0-1",
                                                      "wait ACTIVATION u0 mb1 from 0@0-2.25"}));
  EXPECT_EQ(r.iteration_seconds, 2.25);
}

// A send naming a codec carries its wire fraction of the bytes; one whose
// codec has no fraction listed, and a raw one, carry all of them.
TEST(SimulatorTest, CodecWireFraction_ShrinksThatSendsTransferOnly) {
  v1::Instruction compressed = Send(v1::TENSOR_KIND_ACTIVATION, 0, 0, 1);
  compressed.mutable_send()->set_codec("piecewise:bits=3");
  v1::Instruction unlisted = Send(v1::TENSOR_KIND_ACTIVATION, 0, 1, 1);
  unlisted.mutable_send()->set_codec("fp16");
  const std::vector<v1::Program> programs = {
      Program({compressed, unlisted, Send(v1::TENSOR_KIND_ACTIVATION, 0, 2, 1)}),
      Program({Recv(v1::TENSOR_KIND_ACTIVATION, 0, 0, 0), Recv(v1::TENSOR_KIND_ACTIVATION, 0, 1, 0),
               Recv(v1::TENSOR_KIND_ACTIVATION, 0, 2, 0)}),
  };
  SimulationCosts costs = UniformCosts(1, 0, 0, 100, 2);
  costs.link = {100, 0.25};  // raw: 1 s on the wire, then 0.25 s latency
  costs.codec_wire_fraction = {{"piecewise:bits=3", 0.25}};
  const SimulationResult r = SimulateIteration(programs, costs).value();
  // On the wire 25 bytes (0.25 s), then 100 and 100 (1 s each); the last
  // arrives at 2.25 + 0.25 = 2.5.
  EXPECT_EQ(Timeline(r, 0), (std::vector<std::string>{"send ACTIVATION u0 mb0 to 1@0-0.25",
                                                      "send ACTIVATION u0 mb1 to 1@0.25-1.25",
                                                      "send ACTIVATION u0 mb2 to 1@1.25-2.25"}));
  EXPECT_EQ(r.iteration_seconds, 2.5);
}

TEST(SimulatorTest, LinkOverride_AppliesToThatDirectionOnly) {
  const std::vector<v1::Program> programs = {
      Program(
          {Send(v1::TENSOR_KIND_ACTIVATION, 0, 0, 1), Recv(v1::TENSOR_KIND_ACTIVATION, 0, 1, 1)}),
      Program(
          {Send(v1::TENSOR_KIND_ACTIVATION, 0, 1, 0), Recv(v1::TENSOR_KIND_ACTIVATION, 0, 0, 0)}),
  };
  SimulationCosts costs = UniformCosts(1, 0, 0, 100, 2);
  costs.link = {100, 0};
  costs.link_overrides[{1, 0}] = {50, 1};  // 1 + 100 / 50 = 3 s
  const SimulationResult r = SimulateIteration(programs, costs).value();
  EXPECT_EQ(Timeline(r, 0), (std::vector<std::string>{"send ACTIVATION u0 mb0 to 1@0-1",
                                                      "wait ACTIVATION u0 mb1 from 1@0-3"}));
  EXPECT_EQ(r.iteration_seconds, 3);
}

TEST(SimulatorTest, ComputeWhileSending_WorkerDoesNotWaitForItsSend) {
  const std::vector<v1::Program> programs = {
      Program({Compute("F", 0, 1, 0), Send(v1::TENSOR_KIND_ACTIVATION, 0, 0, 1),
               Compute("F", 0, 1, 1)}),
      Program({Recv(v1::TENSOR_KIND_ACTIVATION, 0, 0, 0)}),
  };
  SimulationCosts costs = UniformCosts(1, 1, 0, 300, 2);
  costs.link.bandwidth_bytes_per_second = 100;  // 3 s transfer
  const SimulationResult r = SimulateIteration(programs, costs).value();
  EXPECT_EQ(Timeline(r, 0),
            (std::vector<std::string>{"F mb0 [0,1)@0-1", "send ACTIVATION u0 mb0 to 1@1-4",
                                      "F mb1 [0,1)@1-2"}));
  EXPECT_EQ(r.iteration_seconds, 4);
  EXPECT_EQ(r.busy_seconds, (std::vector<double>{2, 0}));
  EXPECT_EQ(r.idle_seconds, (std::vector<double>{2, 4}));
  EXPECT_DOUBLE_EQ(r.bubble_fraction, 0.75);
}

TEST(SimulatorTest, WorkerSpeeds_ScaleComputeTimes) {
  const std::vector<v1::Program> programs = {
      Program({Compute("F", 0, 2, 0), Compute("Opt", 0, 2, -1)}),
      Program({Compute("B", 0, 1, 0), Compute("R", 1, 2, 0)}),
  };
  SimulationCosts costs;
  costs.units = {{1, 3, 0, 1000}, {1, 5, 0, 3000}};
  costs.optimizer_seconds_per_byte = 1e-3;  // 4 s for both units at speed 1
  costs.worker_speeds = {2, 0.5};
  const SimulationResult r = SimulateIteration(programs, costs).value();
  EXPECT_EQ(Timeline(r, 0), (std::vector<std::string>{"F mb0 [0,2)@0-1", "Opt [0,2)@1-3"}));
  EXPECT_EQ(Timeline(r, 1), (std::vector<std::string>{"B mb0 [0,1)@0-6", "R mb0 [1,2)@6-8"}));
  EXPECT_EQ(r.busy_seconds, (std::vector<double>{3, 8}));
  EXPECT_EQ(r.iteration_seconds, 8);
}

// A unit's comm seconds (a tensor-parallel rank's all-reduce waits) are
// added after the speed divides its compute: a worker twice as fast waits
// as long. Recompute waits for the forward's, the optimizer for none.
TEST(SimulatorTest, WorkerSpeeds_DoNotScaleCommSeconds) {
  const std::vector<v1::Program> programs = {
      Program({Compute("F", 0, 2, 0), Compute("Opt", 0, 2, -1)}),
      Program({Compute("B", 0, 1, 0), Compute("R", 1, 2, 0)}),
  };
  SimulationCosts costs;
  costs.units = {{1, 3, 0, 1000, 0.25, 0.5}, {1, 5, 0, 3000, 0.75, 1}};
  costs.optimizer_seconds_per_byte = 1e-3;  // 4 s for both units at speed 1
  costs.worker_speeds = {2, 0.5};
  const SimulationResult r = SimulateIteration(programs, costs).value();
  // F: 2 / 2 + 0.25 + 0.75; B: 3 / 0.5 + 0.5; R: 1 / 0.5 + 0.75.
  EXPECT_EQ(Timeline(r, 0), (std::vector<std::string>{"F mb0 [0,2)@0-2", "Opt [0,2)@2-4"}));
  EXPECT_EQ(Timeline(r, 1),
            (std::vector<std::string>{"B mb0 [0,1)@0-6.5", "R mb0 [1,2)@6.5-9.25"}));
  EXPECT_EQ(r.iteration_seconds, 9.25);
}

// A Bi-Partition-style pair: worker 1 owns unit 1's backward and weights, so
// it recomputes unit 1 from x_1 and sends the updated weights back.
TEST(SimulatorTest, RecomputeAndUnitWeights_HandComputedTimeline) {
  const std::vector<v1::Program> programs = {
      Program({Compute("F", 0, 2, 0), Send(v1::TENSOR_KIND_ACTIVATION, 0, 0, 1),
               Recv(v1::TENSOR_KIND_ACTIVATION_GRAD, 1, 0, 1), Compute("B", 0, 1, 0),
               Compute("Opt", 0, 1, -1), Recv(v1::TENSOR_KIND_UNIT_WEIGHTS, 1, -1, 1)}),
      Program({Recv(v1::TENSOR_KIND_ACTIVATION, 0, 0, 0), Compute("R", 1, 2, 0),
               Compute("B", 1, 2, 0), Send(v1::TENSOR_KIND_ACTIVATION_GRAD, 1, 0, 0),
               Compute("Opt", 1, 2, -1), Send(v1::TENSOR_KIND_UNIT_WEIGHTS, 1, -1, 0)}),
  };
  SimulationCosts costs;
  costs.units = {{1, 3, 100, 50}, {2, 4, 10, 200}};
  costs.optimizer_seconds_per_byte = 0.01;
  costs.worker_speeds = {1, 1};
  costs.link.bandwidth_bytes_per_second = 100;
  const SimulationResult r = SimulateIteration(programs, costs).value();
  EXPECT_EQ(Timeline(r, 0),
            (std::vector<std::string>{"F mb0 [0,2)@0-3", "send ACTIVATION u0 mb0 to 1@3-4",
                                      "wait ACTIVATION_GRAD u1 mb0 from 1@3-11",
                                      "B mb0 [0,1)@11-14", "Opt [0,1)@14-14.5"}));
  // ACTIVATION_GRAD of unit 1 carries activation_bytes[0]; UNIT_WEIGHTS of
  // unit 1 weight_bytes[1], queued behind it on link 1->0.
  EXPECT_EQ(Timeline(r, 1),
            (std::vector<std::string>{"wait ACTIVATION u0 mb0 from 0@0-4", "R mb0 [1,2)@4-6",
                                      "B mb0 [1,2)@6-10", "send ACTIVATION_GRAD u1 mb0 to 0@10-11",
                                      "Opt [1,2)@10-12", "send UNIT_WEIGHTS u1 to 0@12-14"}));
  EXPECT_EQ(r.iteration_seconds, 14.5);
  EXPECT_EQ(r.busy_seconds, (std::vector<double>{6.5, 8}));
  for (const TimelineEvent& e : r.events) {
    if (e.kind == TimelineEventKind::kSendTransfer &&
        e.tensor_kind == v1::TENSOR_KIND_UNIT_WEIGHTS) {
      EXPECT_EQ(e.bytes, 200);
      EXPECT_EQ(e.micro_batch, -1);
      EXPECT_EQ(e.peer, 0);
    }
  }
}

// Gradient clipping (simulator.h): the pair above, where worker 1 ends its
// backward (10.5 s) before worker 0 (15 s). The norm exchange holds worker
// 1's step, and its UNIT_WEIGHTS sync behind it, until worker 0's norms
// arrive: 15 + 0.5 s latency. Worker 0's step does not wait: worker 1's
// norms left at 11.5 (behind its ACTIVATION_GRAD on link 1->0) and arrived
// at 12. Without clipping the sync hides behind worker 0's last backward.
TEST(SimulatorTest, GradClip_EarlyStageStepsAtLastStagesArrivalPlusLatency) {
  const std::vector<v1::Program> programs = {
      Program({Compute("F", 0, 2, 0), Send(v1::TENSOR_KIND_ACTIVATION, 0, 0, 1),
               Recv(v1::TENSOR_KIND_ACTIVATION_GRAD, 1, 0, 1), Compute("B", 0, 1, 0),
               Compute("Opt", 0, 1, -1), Recv(v1::TENSOR_KIND_UNIT_WEIGHTS, 1, -1, 1)}),
      Program({Recv(v1::TENSOR_KIND_ACTIVATION, 0, 0, 0), Compute("R", 1, 2, 0),
               Compute("B", 1, 2, 0), Send(v1::TENSOR_KIND_ACTIVATION_GRAD, 1, 0, 0),
               Compute("Opt", 1, 2, -1), Send(v1::TENSOR_KIND_UNIT_WEIGHTS, 1, -1, 0)}),
  };
  SimulationCosts costs;
  costs.units = {{1, 3, 100, 50}, {2, 4, 10, 200}};
  costs.optimizer_seconds_per_byte = 0.01;
  costs.worker_speeds = {1, 1};
  costs.link = {100, 0.5};
  const SimulationResult unclipped = SimulateIteration(programs, costs).value();
  EXPECT_EQ(Timeline(unclipped, 1),
            (std::vector<std::string>{
                "wait ACTIVATION u0 mb0 from 0@0-4.5", "R mb0 [1,2)@4.5-6.5",
                "B mb0 [1,2)@6.5-10.5", "send ACTIVATION_GRAD u1 mb0 to 0@10.5-11.5",
                "Opt [1,2)@10.5-12.5", "send UNIT_WEIGHTS u1 to 0@12.5-14.5"}));
  EXPECT_EQ(unclipped.iteration_seconds, 15.5);  // the weights arrive at 15, during Opt [0,1)

  costs.grad_clip = true;
  const SimulationResult r = SimulateIteration(programs, costs).value();
  EXPECT_EQ(Timeline(r, 0),
            (std::vector<std::string>{"F mb0 [0,2)@0-3", "send ACTIVATION u0 mb0 to 1@3-4",
                                      "wait ACTIVATION_GRAD u1 mb0 from 1@3-12",
                                      "B mb0 [0,1)@12-15", "Opt [0,1)@15-15.5",
                                      "wait UNIT_WEIGHTS u1 from 1@15.5-20"}));
  EXPECT_EQ(Timeline(r, 1),
            (std::vector<std::string>{
                "wait ACTIVATION u0 mb0 from 0@0-4.5", "R mb0 [1,2)@4.5-6.5",
                "B mb0 [1,2)@6.5-10.5", "send ACTIVATION_GRAD u1 mb0 to 0@10.5-11.5",
                "wait for the gradient norms (clipping), last from 0@10.5-15.5",
                "Opt [1,2)@15.5-17.5", "send UNIT_WEIGHTS u1 to 0@17.5-19.5"}));
  EXPECT_EQ(r.iteration_seconds, 20);
  EXPECT_EQ(r.busy_seconds, (std::vector<double>{6.5, 8}));
  EXPECT_EQ(r.all_reduce_seconds, (std::vector<double>{0, 0}));  // the wait is idle
  EXPECT_EQ(r.idle_seconds, (std::vector<double>{13.5, 12}));
  for (const TimelineEvent& e : r.events) {
    if (e.worker == 1 && e.kind == TimelineEventKind::kRecvWait && e.start_seconds == 10.5) {
      EXPECT_EQ(e.peer, 0);
      EXPECT_EQ(e.instruction, 4);  // the OptimizerStep's
    }
  }
}

// Each member steps once every other member's norms have reached it, the
// tensor ranks' round (0.25 s) first: arrivals 2.25 (worker 0) and 3.25
// (worker 1). With a 2 s latency worker 0 steps at 3.25 + 2 and worker 1,
// the last to arrive, at 2.25 + 2 = 4.25; with 0.5 s worker 1's norms from
// worker 0 are there (2.75) before its own round ends (3.25).
TEST(SimulatorTest, GradClip_EachMemberWaitsForTheOthersNormsAfterItsTensorRanks) {
  const std::vector<v1::Program> programs = {
      Program({Compute("F", 0, 1, 0), Compute("B", 0, 1, 0), Compute("Opt", 0, 1, -1)}),
      Program({Compute("F", 1, 2, 0), Compute("B", 1, 2, 0), Compute("Opt", 1, 2, -1)}),
  };
  SimulationCosts costs;
  costs.units = {{1, 1, 0, 0}, {1, 2, 0, 0}};
  costs.worker_speeds = {1, 1};
  costs.link.latency_seconds = 2;
  costs.grad_clip = true;
  costs.grad_clip_tensor_seconds = 0.25;
  SimulationResult r = SimulateIteration(programs, costs).value();
  EXPECT_EQ(Timeline(r, 0),
            (std::vector<std::string>{"F mb0 [0,1)@0-1", "B mb0 [0,1)@1-2",
                                      "wait for the gradient norms (clipping), last from 1@2-5.25",
                                      "Opt [0,1)@5.25-5.25"}));
  EXPECT_EQ(Timeline(r, 1),
            (std::vector<std::string>{"F mb0 [1,2)@0-1", "B mb0 [1,2)@1-3",
                                      "wait for the gradient norms (clipping), last from 0@3-4.25",
                                      "Opt [1,2)@4.25-4.25"}));
  EXPECT_EQ(r.iteration_seconds, 5.25);

  costs.link.latency_seconds = 0.5;
  r = SimulateIteration(programs, costs).value();
  EXPECT_EQ(Timeline(r, 1),
            (std::vector<std::string>{"F mb0 [1,2)@0-1", "B mb0 [1,2)@1-3",
                                      "wait for the tensor ranks' gradient norms@3-3.25",
                                      "Opt [1,2)@3.25-3.25"}));
  EXPECT_EQ(r.iteration_seconds, 3.75);  // worker 0 at 3.25 + 0.5
}

// One stage waits for no other stage, only for its tensor ranks' round,
// which follows the data-parallel all-reduce (PrepareOptimizerStep's order).
TEST(SimulatorTest, GradClip_OneStage_TensorRanksRoundAfterTheAllReduce) {
  const std::vector<v1::Program> programs = {
      Program({Compute("F", 0, 1, 0), Compute("B", 0, 1, 0), Compute("Opt", 0, 1, -1)})};
  SimulationCosts costs = UniformCosts(1, 1, 1, 0, 1);
  costs.data_parallel = 2;
  costs.replica_link.latency_seconds = 1;  // one exchange of 0 bytes: 1 s
  costs.link.latency_seconds = 100;        // no other stage's norms to wait for
  costs.grad_clip = true;
  costs.grad_clip_tensor_seconds = 0.25;
  const SimulationResult r = SimulateIteration(programs, costs).value();
  EXPECT_EQ(Timeline(r, 0),
            (std::vector<std::string>{
                "F mb0 [0,1)@0-1", "B mb0 [0,1)@1-2", "AllReduce [0,1) x2 replicas@2-3",
                "wait for the tensor ranks' gradient norms@3-3.25", "Opt [0,1)@3.25-3.25"}));
  costs.grad_clip_tensor_seconds = 0;  // and without tensor ranks nothing at all
  EXPECT_EQ(SimulateIteration(programs, costs).value().iteration_seconds, 3);
}

// The runtime runs one exchange per OptimizerStep: a member that steps
// twice waits in its second for the others' second, forever.
TEST(SimulatorTest, GradClip_UnevenSteps_FailedPrecondition) {
  const std::vector<v1::Program> programs = {
      Program({Compute("Opt", 0, 1, -1), Compute("Opt", 0, 1, -1)}),
      Program({Compute("Opt", 1, 2, -1)}),
  };
  SimulationCosts costs = UniformCosts(2, 1, 1, 0, 2);
  costs.grad_clip = true;
  auto r = SimulateIteration(programs, costs);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("worker 0 waits forever at instruction 1"));
  costs.grad_clip = false;
  EXPECT_TRUE(SimulateIteration(programs, costs).ok());
}

// Data parallelism (simulator.h): before OptimizerStep(units) a ring
// all-reduce of the units' weight bytes over D replicas takes
// 2(D-1) latency + 2(D-1)/D bytes / bandwidth (acctfm.txt eq. 3).
TEST(SimulatorTest, AllReduce_OneStage_ClosedFormBeforeOptimizer) {
  const std::vector<v1::Program> programs = {
      Program({Compute("F", 0, 2, 0), Compute("B", 0, 2, 0), Compute("Opt", 0, 2, -1)})};
  SimulationCosts costs;
  costs.units = {{1, 2, 0, 1000}, {1, 2, 0, 3000}};
  costs.optimizer_seconds_per_byte = 1e-3;  // 4 s at speed 1
  costs.worker_speeds = {2};                // compute halves; the all-reduce does not
  costs.data_parallel = 4;
  costs.replica_link = {1000, 0.5};  // 6 x 0.5 s + 1.5 x 4000 B / 1000 B/s = 3 + 6 s
  costs.link = {1, 100};             // the pipeline's links: unused by the all-reduce
  const SimulationResult r = SimulateIteration(programs, costs).value();
  EXPECT_EQ(Timeline(r, 0),
            (std::vector<std::string>{"F mb0 [0,2)@0-1", "B mb0 [0,2)@1-3",
                                      "AllReduce [0,2) x4 replicas@3-12", "Opt [0,2)@12-14"}));
  EXPECT_EQ(r.iteration_seconds, 14);
  EXPECT_EQ(r.busy_seconds, (std::vector<double>{5}));
  EXPECT_EQ(r.all_reduce_seconds, (std::vector<double>{9}));
  EXPECT_EQ(r.idle_seconds, (std::vector<double>{0}));
  EXPECT_EQ(r.bubble_fraction, 0);  // the all-reduce is not pipeline bubble
  const TimelineEvent& e = r.events[2];
  EXPECT_EQ(e.kind, TimelineEventKind::kAllReduce);
  EXPECT_STREQ(TimelineEventKindName(e.kind), "all-reduce");
  EXPECT_EQ(e.bytes, 4000);
  EXPECT_EQ(e.units.begin, 0);
  EXPECT_EQ(e.units.end, 2);
  EXPECT_EQ(e.micro_batch, -1);
  EXPECT_EQ(e.peer, -1);
}

// Selective stage compression: a worker's all_reduce_byte_fraction scales
// the bytes term of its all-reduce (not the latency term).
TEST(SimulatorTest, AllReduceByteFraction_ScalesThatWorkersBytes) {
  const std::vector<v1::Program> programs = {
      Program({Compute("F", 0, 2, 0), Compute("B", 0, 2, 0), Compute("Opt", 0, 2, -1)})};
  SimulationCosts costs;
  costs.units = {{1, 2, 0, 1000}, {1, 2, 0, 3000}};
  costs.worker_speeds = {2};
  costs.data_parallel = 4;
  costs.replica_link = {1000, 0.5};         // 3 s of latency + 1.5 x bytes / 1000 B/s
  costs.all_reduce_byte_fraction = {0.25};  // 1000 of the 4000 bytes: 3 + 1.5 s
  const SimulationResult r = SimulateIteration(programs, costs).value();
  EXPECT_EQ(Timeline(r, 0),
            (std::vector<std::string>{"F mb0 [0,2)@0-1", "B mb0 [0,2)@1-3",
                                      "AllReduce [0,2) x4 replicas@3-7.5", "Opt [0,2)@7.5-7.5"}));
  EXPECT_EQ(r.events[2].bytes, 1000);
  costs.all_reduce_byte_fraction = {1.5};
  EXPECT_EQ(SimulateIteration(programs, costs).status().code(), absl::StatusCode::kInvalidArgument);
  costs.all_reduce_byte_fraction = {};
  costs.codec_wire_fraction = {{"fp16", 0}};
  EXPECT_EQ(SimulateIteration(programs, costs).status().code(), absl::StatusCode::kInvalidArgument);
}

// Overlap: units 1 and 2 carry 1000 B of gradient each; embed and head
// 100 B, all of it the tied wte (all-reduced at the step). Two
// micro-batches: only the second's backward makes the gradients final.
SimulationCosts OverlapCosts() {
  SimulationCosts costs;
  costs.units = {{0.5, 1, 0, 100}, {0.5, 2, 0, 1000}, {0.5, 2, 0, 1000}, {0.5, 1, 0, 100}};
  costs.tied_grad_bytes = 100;
  costs.worker_speeds = {1};
  costs.data_parallel = 2;
  costs.replica_link = {1000, 0};  // a 1000 B bucket: 1 s
  costs.all_reduce_bucket_bytes = 1000;
  return costs;
}

const std::vector<v1::Program>& OverlapPrograms() {
  static const auto* const programs = new std::vector<v1::Program>{
      Program({Compute("F", 0, 4, 0), Compute("F", 0, 4, 1), Compute("B", 0, 4, 0),
               Compute("B", 0, 4, 1), Compute("Opt", 0, 4, -1)})};
  return *programs;
}

// B mb1 runs 10-16: unit 2 finishes at 13 and unit 1 at 15, each filling a
// bucket that the lane all-reduces while the backward goes on; at the step
// only the tied wte is left (0.1 s).
TEST(SimulatorTest, Overlap_BucketsAllReduceDuringTheLastBackward) {
  const SimulationResult r = SimulateIteration(OverlapPrograms(), OverlapCosts()).value();
  EXPECT_EQ(Timeline(r, 0), (std::vector<std::string>{
                                "F mb0 [0,4)@0-2", "F mb1 [0,4)@2-4", "B mb0 [0,4)@4-10",
                                "B mb1 [0,4)@10-16", "AllReduce bucket [2,3) x2 replicas@13-14",
                                "AllReduce bucket [1,2) x2 replicas@15-16",
                                "AllReduce [0,4) x2 replicas@16-16.1", "Opt [0,4)@16.1-16.1"}));
  EXPECT_EQ(r.events[4].kind, TimelineEventKind::kAllReduceBucket);
  EXPECT_STREQ(TimelineEventKindName(r.events[4].kind), "all-reduce-bucket");
  EXPECT_EQ(r.events[4].bytes, 1000);
  EXPECT_EQ(r.events[6].bytes, 100);
  EXPECT_DOUBLE_EQ(r.iteration_seconds, 16.1);
  // Only the step's part is the worker's: the buckets ran beside compute.
  EXPECT_DOUBLE_EQ(r.all_reduce_seconds[0], 0.1);
  EXPECT_DOUBLE_EQ(r.busy_seconds[0], 16);
}

// A slower link: the second bucket queues behind the first (one collective
// at a time), and the step waits for the lane before the tied wte.
TEST(SimulatorTest, Overlap_BucketsQueueAndTheStepWaitsForThem) {
  SimulationCosts costs = OverlapCosts();
  costs.replica_link = {250, 0};  // a bucket: 4 s; the tied wte: 0.4 s
  const SimulationResult r = SimulateIteration(OverlapPrograms(), costs).value();
  EXPECT_EQ(Timeline(r, 0), (std::vector<std::string>{
                                "F mb0 [0,4)@0-2", "F mb1 [0,4)@2-4", "B mb0 [0,4)@4-10",
                                "B mb1 [0,4)@10-16", "AllReduce bucket [2,3) x2 replicas@13-17",
                                "wait for the AllReduce buckets of [0,4)@16-21",
                                "AllReduce bucket [1,2) x2 replicas@17-21",
                                "AllReduce [0,4) x2 replicas@21-21.4", "Opt [0,4)@21.4-21.4"}));
  EXPECT_EQ(r.events[5].kind, TimelineEventKind::kAllReduceWait);
  EXPECT_STREQ(TimelineEventKindName(r.events[5].kind), "all-reduce-wait");
  EXPECT_DOUBLE_EQ(r.all_reduce_seconds[0], 5.4);
  EXPECT_NEAR(r.idle_seconds[0], 0, 1e-12);  // the wait is all-reduce time, not bubble
}

// A bucket larger than the gradients fills only at the step; a GPU worker
// and a size of 0 all-reduce everything at the step: each is the model
// without overlap, 2100 B (wte once) after the backward. A compressed stage
// overlaps as an exact one, its buckets shrunk (the tied wte exact).
TEST(SimulatorTest, Overlap_AtTheStepWhenNotOverlapping) {
  SimulationCosts costs = OverlapCosts();
  costs.all_reduce_bucket_bytes = 0;
  const SimulationResult plain = SimulateIteration(OverlapPrograms(), costs).value();
  EXPECT_EQ(Timeline(plain, 0).back(), "Opt [0,4)@18.1-18.1");
  EXPECT_DOUBLE_EQ(plain.all_reduce_seconds[0], 2.1);
  costs.all_reduce_bucket_bytes = 1e6;  // the last bucket is sent at the step, then the wte
  SimulationResult r = SimulateIteration(OverlapPrograms(), costs).value();
  EXPECT_DOUBLE_EQ(r.iteration_seconds, plain.iteration_seconds);
  EXPECT_EQ(Timeline(r, 0)[4], "AllReduce bucket [1,3) x2 replicas@16-18");
  costs.all_reduce_bucket_bytes = 1000;
  costs.all_reduce_overlaps = {false};  // a GPU
  r = SimulateIteration(OverlapPrograms(), costs).value();
  EXPECT_EQ(Timeline(r, 0), Timeline(plain, 0));
  costs.all_reduce_byte_fraction = {0.5};  // at the step: 100 B of wte + 1000 B of the rest
  r = SimulateIteration(OverlapPrograms(), costs).value();
  EXPECT_EQ(Timeline(r, 0).back(), "Opt [0,4)@17.1-17.1");
  costs.all_reduce_overlaps = {};  // two 500 B buckets, 0.5 s each, then the wte
  r = SimulateIteration(OverlapPrograms(), costs).value();
  EXPECT_EQ(Timeline(r, 0), (std::vector<std::string>{
                                "F mb0 [0,4)@0-2", "F mb1 [0,4)@2-4", "B mb0 [0,4)@4-10",
                                "B mb1 [0,4)@10-16", "AllReduce bucket [2,3) x2 replicas@13-13.5",
                                "AllReduce bucket [1,2) x2 replicas@15-15.5",
                                "AllReduce [0,4) x2 replicas@16-16.1", "Opt [0,4)@16.1-16.1"}));
  EXPECT_EQ(r.events[4].bytes, 500);
  costs.all_reduce_byte_fraction = {};
  costs.all_reduce_bucket_bytes = -1;
  EXPECT_EQ(SimulateIteration(OverlapPrograms(), costs).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A compressed all-reduce's own CPU time (1 ms per byte here: a 1000 B
// bucket codes for 1 s beside its 1 s on the link). With a spare core it
// only lengthens the lane: the buckets end at 15 and 17, the step waits
// until 17. On a host without one it also takes from compute, charged at
// the step (2 s of kAllReduceCpu, worker time, busy), by when the lane is
// done. The tied wte, not compressed, codes nothing.
TEST(SimulatorTest, Overlap_CompressedAllReducesCpuTime) {
  SimulationCosts costs = OverlapCosts();
  costs.all_reduce_cpu_seconds_per_byte = {1e-3};
  SimulationResult r = SimulateIteration(OverlapPrograms(), costs).value();
  EXPECT_EQ(Timeline(r, 0),
            (std::vector<std::string>{"F mb0 [0,4)@0-2", "F mb1 [0,4)@2-4", "B mb0 [0,4)@4-10",
                                      "B mb1 [0,4)@10-16",
                                      "AllReduce bucket [2,3) x2 replicas@13-15",
                                      "AllReduce bucket [1,2) x2 replicas@15-17",
                                      "wait for the AllReduce buckets of [0,4)@16-17",
                                      "AllReduce [0,4) x2 replicas@17-17.1", "Opt [0,4)@17.1-17.1"}));
  costs.all_reduce_cpu_shared = {true};
  r = SimulateIteration(OverlapPrograms(), costs).value();
  EXPECT_EQ(Timeline(r, 0),
            (std::vector<std::string>{"F mb0 [0,4)@0-2", "F mb1 [0,4)@2-4", "B mb0 [0,4)@4-10",
                                      "B mb1 [0,4)@10-16",
                                      "AllReduce bucket [2,3) x2 replicas@13-15",
                                      "AllReduce bucket [1,2) x2 replicas@15-17",
                                      "all-reduce coding of [0,4) on the worker's cores@16-18",
                                      "AllReduce [0,4) x2 replicas@18-18.1", "Opt [0,4)@18.1-18.1"}));
  EXPECT_EQ(r.events[6].kind, TimelineEventKind::kAllReduceCpu);
  EXPECT_STREQ(TimelineEventKindName(r.events[6].kind), "all-reduce-cpu");
  EXPECT_DOUBLE_EQ(r.busy_seconds[0], 16 + 2);
  EXPECT_DOUBLE_EQ(r.all_reduce_seconds[0], 0.1);
  // At the step (no overlap), the 2000 B of blocks code for 2 s there.
  costs.all_reduce_bucket_bytes = 0;
  EXPECT_EQ(Timeline(SimulateIteration(OverlapPrograms(), costs).value(), 0).back(),
            "Opt [0,4)@20.1-20.1");
  costs.all_reduce_cpu_seconds_per_byte = {-1};
  EXPECT_EQ(SimulateIteration(OverlapPrograms(), costs).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The coding is the worker's CPU work: at speed 0.5 it takes twice as
// long, as the compute does (a bucket's second on the link does not). The
// passes end at 32; the 1000 B buckets (units 2 and 1, done at 26 and 30)
// take 1 s on the link and 2 s of coding each, so the step waits until 33
// (with speed 1's 1 s of coding, the lane was free at 32). Without a spare
// core the step takes their 4 s of coding; without overlap it codes
// 2000 B for 4 s.
TEST(SimulatorTest, Overlap_CompressedAllReducesCpuTime_DividedBySpeed) {
  SimulationCosts costs = OverlapCosts();
  costs.worker_speeds = {0.5};
  costs.all_reduce_cpu_seconds_per_byte = {1e-3};
  SimulationResult r = SimulateIteration(OverlapPrograms(), costs).value();
  EXPECT_EQ(Timeline(r, 0),
            (std::vector<std::string>{"F mb0 [0,4)@0-4", "F mb1 [0,4)@4-8", "B mb0 [0,4)@8-20",
                                      "B mb1 [0,4)@20-32",
                                      "AllReduce bucket [2,3) x2 replicas@26-29",
                                      "AllReduce bucket [1,2) x2 replicas@30-33",
                                      "wait for the AllReduce buckets of [0,4)@32-33",
                                      "AllReduce [0,4) x2 replicas@33-33.1",
                                      "Opt [0,4)@33.1-33.1"}));
  costs.all_reduce_cpu_shared = {true};
  r = SimulateIteration(OverlapPrograms(), costs).value();
  ASSERT_EQ(Timeline(r, 0).size(), 9u);
  EXPECT_EQ(Timeline(r, 0)[6], "all-reduce coding of [0,4) on the worker's cores@32-36");
  EXPECT_DOUBLE_EQ(r.busy_seconds[0], 32 + 4);
  costs.all_reduce_bucket_bytes = 0;  // 2100 B on the link, 2.1 s, and 4 s of coding
  EXPECT_EQ(Timeline(SimulateIteration(OverlapPrograms(), costs).value(), 0).back(),
            "Opt [0,4)@38.1-38.1");
}

TEST(SimulatorTest, AllReduce_TwoStages_EachStageItsOwnGradientBytes) {
  auto programs = CompilePrograms({{0, 2}, {2, 4}}, 4, 2, Schedule::kGPipe).value();
  SimulationCosts costs = UniformCosts(4, 1, 2, 100, 2);
  costs.link.bandwidth_bytes_per_second = 100;  // as GPipe_TwoStagesTwoMicroBatches: both
                                                // workers reach the step at 20 s
  for (int u = 0; u < 4; ++u) costs.units[u].weight_bytes = 100 * (u + 1);  // 300 B, 700 B
  costs.optimizer_seconds_per_byte = 0.01;                                  // 3 s, 7 s
  costs.data_parallel = 2;
  costs.replica_link = {100, 0.5};  // one exchange: 0.5 s + bytes / 100: 3.5 s, 7.5 s
  const SimulationResult r = SimulateIteration(programs, costs).value();
  const std::vector<std::string> w0 = Timeline(r, 0), w1 = Timeline(r, 1);
  ASSERT_GE(w0.size(), 2u);
  ASSERT_GE(w1.size(), 2u);
  EXPECT_EQ(
      std::vector<std::string>(w0.end() - 2, w0.end()),
      (std::vector<std::string>{"AllReduce [0,2) x2 replicas@20-23.5", "Opt [0,2)@23.5-26.5"}));
  EXPECT_EQ(
      std::vector<std::string>(w1.end() - 2, w1.end()),
      (std::vector<std::string>{"AllReduce [2,4) x2 replicas@20-27.5", "Opt [2,4)@27.5-34.5"}));
  EXPECT_EQ(r.iteration_seconds, 34.5);
  EXPECT_EQ(r.busy_seconds, (std::vector<double>{15, 19}));
  EXPECT_EQ(r.all_reduce_seconds, (std::vector<double>{3.5, 7.5}));
  EXPECT_EQ(r.idle_seconds, (std::vector<double>{16, 8}));
  EXPECT_DOUBLE_EQ(r.bubble_fraction, 24.0 / 69.0);
}

// The fused embedding sync (Optimus-CC eq. 16): the owners' fused
// AddTiedGradient is one all-reduce over the 2D owners, which the head
// stage (there at 4) waits for the embedding's (there at 6); both go on
// after the 4 owners' all-reduce (AllReduceInMemberOrder: one latency for
// the segments, three for the all-gather, 1.5 x 100 B at 100 B/s); the
// steps' all-reduces then leave the tied wte out. Unfused, each step
// all-reduces it over the D = 2 replicas (1 s) instead.
TEST(SimulatorTest, FusedEmbeddingSync_OneAllReduceOverTheTwoDOwners) {
  auto tied = [](bool fused) {
    v1::Instruction in;
    in.mutable_add_tied_gradient()->set_fused(fused);
    in.mutable_add_tied_gradient()->set_embed_stage(0);
    in.mutable_add_tied_gradient()->set_head_stage(1);
    return in;
  };
  auto programs = [&](bool fused) {
    return std::vector<v1::Program>{
        Program({Compute("F", 0, 1, 0), Send(v1::TENSOR_KIND_ACTIVATION, 0, 0, 1),
                 Recv(v1::TENSOR_KIND_ACTIVATION_GRAD, 1, 0, 1), Compute("B", 0, 1, 0), tied(fused),
                 Compute("Opt", 0, 1, -1)}),
        Program({Recv(v1::TENSOR_KIND_ACTIVATION, 0, 0, 0), Compute("F", 1, 2, 0),
                 Compute("B", 1, 2, 0), Send(v1::TENSOR_KIND_ACTIVATION_GRAD, 1, 0, 0), tied(fused),
                 Compute("Opt", 1, 2, -1)})};
  };
  SimulationCosts costs;
  costs.units = {{1, 2, 0, 100}, {1, 2, 0, 100}};  // each unit's weights: the tied wte
  costs.tied_grad_bytes = 100;
  costs.worker_speeds = {1, 1};
  costs.data_parallel = 2;
  costs.replica_link = {100, 0};
  const SimulationResult fused = SimulateIteration(programs(true), costs).value();
  EXPECT_EQ(Timeline(fused, 1),
            (std::vector<std::string>{"wait ACTIVATION u0 mb0 from 0@0-1", "F mb0 [1,2)@1-2",
                                      "B mb0 [1,2)@2-4", "send ACTIVATION_GRAD u1 mb0 to 0@4-4",
                                      "wait for 0 at the fused embedding sync@4-6",
                                      "fused embedding sync x4 owners@6-7.5",
                                      "AllReduce [1,2) x2 replicas@7.5-7.5", "Opt [1,2)@7.5-7.5"}));
  EXPECT_EQ(Timeline(fused, 0)[4], "fused embedding sync x4 owners@6-7.5");
  EXPECT_DOUBLE_EQ(fused.iteration_seconds, 7.5);
  EXPECT_DOUBLE_EQ(fused.all_reduce_seconds[1], 1.5);  // the wait is not all-reduce time
  // Latency: one for the segments, three for the ring's all-gather.
  EXPECT_DOUBLE_EQ(MemberOrderAllReduceSeconds(4, 100, {100, 0.5}), 4 * 0.5 + 1.5);
  EXPECT_DOUBLE_EQ(MemberOrderAllReduceSeconds(2, 100, {100, 0.5}), 0.5 + 1);
  const SimulationResult unfused = SimulateIteration(programs(false), costs).value();
  EXPECT_DOUBLE_EQ(unfused.iteration_seconds, 7);  // B to 6, then 1 s for the wte
  // The owners must be two workers of the programs, this one among them.
  std::vector<v1::Program> bad = programs(true);
  bad[1].mutable_instructions(4)->mutable_add_tied_gradient()->set_head_stage(5);
  EXPECT_EQ(SimulateIteration(bad, costs).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SimulatorTest, DataParallelOne_AddsNothing) {
  auto programs = CompilePrograms({{0, 2}, {2, 4}}, 4, 3, Schedule::kOneFOneB).value();
  SimulationCosts plain = UniformCosts(4, 1, 2, 100, 2);
  plain.link.latency_seconds = 0.5;
  for (UnitSimulationCost& u : plain.units) u.weight_bytes = 1000;
  plain.optimizer_seconds_per_byte = 1e-3;
  SimulationCosts one = plain;
  one.replica_link = {1, 100};  // would cost hundreds of seconds if it were used
  const SimulationResult a = SimulateIteration(programs, plain).value();
  const SimulationResult b = SimulateIteration(programs, one).value();
  EXPECT_EQ(a.iteration_seconds, 26.5 + 2);  // OneFOneB_TwoStages... plus 2 s of optimizer
  EXPECT_EQ(b.iteration_seconds, a.iteration_seconds);
  EXPECT_EQ(Timeline(b, 0), Timeline(a, 0));
  EXPECT_EQ(Timeline(b, 1), Timeline(a, 1));
  EXPECT_EQ(b.busy_seconds, a.busy_seconds);
  EXPECT_EQ(b.idle_seconds, a.idle_seconds);
  EXPECT_EQ(b.all_reduce_seconds, (std::vector<double>{0, 0}));
  EXPECT_EQ(b.bubble_fraction, a.bubble_fraction);
  // The same link with two replicas does cost: 100 s + 2000 B / 1 B/s (one
  // exchange).
  one.data_parallel = 2;
  EXPECT_EQ(SimulateIteration(programs, one).value().all_reduce_seconds,
            (std::vector<double>{2100, 2100}));
}

TEST(SimulatorTest, AllReduce_NoBackwardUnits_NoAllReduce) {
  const std::vector<v1::Program> programs = {Program({Compute("Opt", 1, 1, -1)})};
  SimulationCosts costs = UniformCosts(2, 1, 1, 1, 1);
  costs.data_parallel = 3;
  costs.replica_link = {0, 1};  // latency alone would show
  const SimulationResult r = SimulateIteration(programs, costs).value();
  EXPECT_EQ(r.iteration_seconds, 0);
  EXPECT_EQ(r.all_reduce_seconds, (std::vector<double>{0}));
  EXPECT_EQ(Timeline(r, 0), (std::vector<std::string>{"Opt [1,1)@0-0"}));
}

TEST(SimulatorTest, AllReduceSeconds_ClosedForm) {
  EXPECT_EQ(AllReduceSeconds(1, 1e9, {1, 1}), 0);
  EXPECT_EQ(AllReduceSeconds(2, 800, {100, 0}), 8);     // all of it once: 8 s
  EXPECT_EQ(AllReduceSeconds(2, 800, {100, 0.5}), 8.5);  // + one latency (one exchange)
  EXPECT_EQ(AllReduceSeconds(3, 900, {100, 0.5}), 14);   // 2(2)/3 x 9 s + 2(2) x 0.5 s
  EXPECT_EQ(AllReduceSeconds(4, 800, {100, 0}), 12);    // 2(3)/4 x 8 s
  EXPECT_EQ(AllReduceSeconds(4, 800, {100, 0.5}), 15);  // + 2(3) x 0.5 s
  EXPECT_EQ(AllReduceSeconds(4, 800, {0, 0.5}), 3);     // infinite bandwidth: latency only
  EXPECT_EQ(AllReduceSeconds(4, 800, {-1, 0.5}), 3);
}

TEST(SimulatorTest, AllReduceMessagesFor_OneExchangeForTwoElseTheRing) {
  EXPECT_EQ(AllReduceMessagesFor(1).count, 0);
  EXPECT_EQ(AllReduceMessagesFor(2).count, 1);
  EXPECT_EQ(AllReduceMessagesFor(2).fraction, 1.0);
  EXPECT_EQ(AllReduceMessagesFor(4).count, 6);
  EXPECT_EQ(AllReduceMessagesFor(4).fraction, 0.25);
}

TEST(SimulatorTest, AllReduceBytes_TiedEmbeddingCountedOnceWhenBothOnOneStage) {
  SimulationCosts costs;
  costs.units = {{0, 0, 0, 10}, {0, 0, 0, 20}, {0, 0, 0, 30}};
  costs.tied_grad_bytes = 25;
  EXPECT_EQ(AllReduceBytes({0, 3}, costs), 50);  // 60 less min(25, 10, 30)
  EXPECT_EQ(AllReduceBytes({0, 2}, costs), 30);
  EXPECT_EQ(AllReduceBytes({1, 3}, costs), 50);
  EXPECT_EQ(AllReduceBytes({2, 2}, costs), 0);
  costs.tied_grad_bytes = 5;
  EXPECT_EQ(AllReduceBytes({0, 3}, costs), 55);
  costs.units.resize(1);  // one unit: nothing shared
  EXPECT_EQ(AllReduceBytes({0, 1}, costs), 10);
}

TEST(SimulatorTest, BadDataParallelCosts_InvalidArgument) {
  const std::vector<v1::Program> programs = {Program({Compute("F", 0, 1, 0)})};
  SimulationCosts costs = UniformCosts(1, 1, 1, 1, 1);
  costs.data_parallel = 0;
  auto r = SimulateIteration(programs, costs);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("data_parallel = 0; must be >= 1"));
  costs.data_parallel = 2;
  costs.replica_link.latency_seconds = -1;
  r = SimulateIteration(programs, costs);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("replica_link"));
}

TEST(SimulatorTest, CrossedReceives_FailedPreconditionNamesEachStuckWorker) {
  const std::vector<v1::Program> programs = {
      Program(
          {Recv(v1::TENSOR_KIND_ACTIVATION, 0, 0, 1), Send(v1::TENSOR_KIND_ACTIVATION, 0, 1, 1)}),
      Program({Compute("F", 0, 1, 0), Recv(v1::TENSOR_KIND_ACTIVATION, 0, 1, 0),
               Send(v1::TENSOR_KIND_ACTIVATION, 0, 0, 0)}),
  };
  auto r = SimulateIteration(programs, UniformCosts(1, 1, 1, 1, 2));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("worker 0 waits forever at instruction 0 (recv ACTIVATION unit 0 mb 0 "
                        "from stage 1); worker 1 waits forever at instruction 1 (recv ACTIVATION "
                        "unit 0 mb 1 from stage 0)"));
}

TEST(SimulatorTest, ReceiveNobodySends_FailedPrecondition) {
  const std::vector<v1::Program> programs = {
      Program({Compute("F", 0, 1, 0)}),
      Program({Recv(v1::TENSOR_KIND_ACTIVATION, 0, 0, 0)}),
  };
  auto r = SimulateIteration(programs, UniformCosts(1, 1, 1, 1, 2));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("worker 1 waits forever at instruction 0 (recv ACTIVATION unit 0 mb 0 "
                        "from stage 0)"));
}

TEST(SimulatorTest, SendNobodyReceives_FailedPrecondition) {
  const std::vector<v1::Program> programs = {
      Program({Compute("F", 0, 1, 0), Send(v1::TENSOR_KIND_ACTIVATION, 0, 0, 1)}),
      Program({}),
  };
  auto r = SimulateIteration(programs, UniformCosts(1, 1, 1, 1, 2));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("worker 0 instruction 1 (send ACTIVATION unit 0 mb 0 to stage 1) is never "
                        "received by worker 1"));
}

TEST(SimulatorTest, BadPrograms_InvalidArgumentNamesInstruction) {
  struct Case {
    v1::Instruction instruction;
    std::string message;
  };
  const std::vector<Case> cases = {
      {Compute("F", 0, 3, 0), "worker 0 instruction 0 (forward [0, 3) mb 0): unit range"},
      {Compute("B", 2, 1, 0), "worker 0 instruction 0 (backward [2, 1) mb 0): unit range"},
      {Send(v1::TENSOR_KIND_ACTIVATION, 0, 0, 2),
       "(send ACTIVATION unit 0 mb 0 to stage 2): unit range"},
      {Send(v1::TENSOR_KIND_ACTIVATION, 0, 0, 0),
       "(send ACTIVATION unit 0 mb 0 to stage 0): unit range"},
      {Recv(v1::TENSOR_KIND_ACTIVATION_GRAD, 0, 0, 1),
       "(recv ACTIVATION_GRAD unit 0 mb 0 from stage 1)"},
      {Recv(v1::TENSOR_KIND_UNIT_WEIGHTS, 2, -1, 1),
       "(recv UNIT_WEIGHTS unit 2 mb -1 from stage 1)"},
      {Recv(v1::TENSOR_KIND_UNSPECIFIED, 0, 0, 1), "TENSOR_KIND_UNSPECIFIED"},
      {v1::Instruction(), "worker 0 instruction 0 (empty instruction): has no op"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    const std::vector<v1::Program> programs = {Program({c.instruction}), Program({})};
    auto r = SimulateIteration(programs, UniformCosts(2, 1, 1, 1, 2));
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message));
  }
}

TEST(SimulatorTest, SameTensorSentTwice_InvalidArgument) {
  const std::vector<v1::Program> programs = {
      Program(
          {Send(v1::TENSOR_KIND_ACTIVATION, 0, 0, 1), Send(v1::TENSOR_KIND_ACTIVATION, 0, 0, 1)}),
      Program(
          {Recv(v1::TENSOR_KIND_ACTIVATION, 0, 0, 0), Recv(v1::TENSOR_KIND_ACTIVATION, 0, 0, 0)}),
  };
  auto r = SimulateIteration(programs, UniformCosts(1, 1, 1, 1, 2));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("worker 0 instruction 1 (send ACTIVATION unit 0 mb 0 to stage 1): the "
                        "same tensor goes to that peer twice"));
}

TEST(SimulatorTest, BadCosts_InvalidArgument) {
  const std::vector<v1::Program> programs = {Program({Compute("F", 0, 1, 0)})};
  SimulationCosts costs = UniformCosts(1, 1, 1, 1, 1);
  costs.worker_speeds = {1, 1};
  EXPECT_THAT(std::string(SimulateIteration(programs, costs).status().message()),
              HasSubstr("worker_speeds has 2 entries for 1 programs"));
  costs.worker_speeds = {0};
  EXPECT_THAT(std::string(SimulateIteration(programs, costs).status().message()),
              HasSubstr("worker_speeds[0] = 0; must be > 0"));
  costs.worker_speeds = {1};
  costs.units[0].bwd_seconds = -1;
  EXPECT_THAT(std::string(SimulateIteration(programs, costs).status().message()),
              HasSubstr("units[0] has a negative or non-finite cost"));
  costs.units[0].bwd_seconds = 1;
  costs.grad_clip_tensor_seconds = -1;
  EXPECT_THAT(std::string(SimulateIteration(programs, costs).status().message()),
              HasSubstr("grad_clip_tensor_seconds = -1; must be finite and >= 0"));
  costs.grad_clip_tensor_seconds = 0;
  costs.link = {0, 1, 2};  // the per-message part is more than the latency
  EXPECT_THAT(std::string(SimulateIteration(programs, costs).status().message()),
              HasSubstr("link: per_message_seconds = 2; must be finite, >= 0 and at most its "
                        "latency_seconds (1)"));
  costs.link = {};
  costs.replica_link.per_message_seconds = -1;
  EXPECT_THAT(std::string(SimulateIteration(programs, costs).status().message()),
              HasSubstr("replica_link: per_message_seconds = -1"));
  costs.replica_link = {};
  costs.link_overrides[{0, 0}] = {};
  auto r = SimulateIteration(programs, costs);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("link override (0, 0)"));
  EXPECT_EQ(SimulateIteration({}, costs).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SimulatorTest, CostsFromProfile_CopiesUnitsWorkersAndLink) {
  ModelProfile profile;
  profile.units = {{"embed", 1, 2, 30, 40, 50}, {"head", 3, 4, 70, 80, 90}};
  ClusterSpec cluster;
  cluster.workers = {{"a", 1.5, 0}, {"b", 0.5, 0}};
  cluster.bandwidth_bytes_per_second = 1e9;
  cluster.latency_seconds = 1e-4;
  cluster.per_message_seconds = 4e-5;
  const SimulationCosts costs = SimulationCostsFromProfile(profile, cluster, 12);
  ASSERT_EQ(costs.units.size(), 2u);
  EXPECT_EQ(costs.units[1].fwd_seconds, 3);
  EXPECT_EQ(costs.units[1].bwd_seconds, 4);
  EXPECT_EQ(costs.units[1].weight_bytes, 70);
  EXPECT_EQ(costs.units[1].activation_bytes, 80);
  EXPECT_EQ(costs.worker_speeds, (std::vector<double>{1.5, 0.5}));
  EXPECT_EQ(costs.link.bandwidth_bytes_per_second, 1e9);
  EXPECT_EQ(costs.link.latency_seconds, 1e-4);
  EXPECT_EQ(costs.replica_link.bandwidth_bytes_per_second, 1e9);
  EXPECT_EQ(costs.replica_link.latency_seconds, 1e-4);
  EXPECT_EQ(costs.link.per_message_seconds, 4e-5);
  EXPECT_EQ(costs.replica_link.per_message_seconds, 4e-5);
  EXPECT_EQ(costs.data_parallel, 1);
  EXPECT_EQ(costs.tied_grad_bytes, 12);
}

}  // namespace
}  // namespace pipetrain
