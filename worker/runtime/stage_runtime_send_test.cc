// Sends run in the background (stage_runtime.h): a send the transport
// refuses still fails the iteration, naming the send, and sends queued
// behind a failed one are dropped. Stage 0 of a two-stage pipeline runs a
// hand-written program (forward of embed and attn_0, then sends) over a
// transport that refuses the first ACTIVATION send.
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/annotated_mutex.h"
#include "coordinator/planner/schedule_compiler.h"
#include "gtest/gtest.h"
#include "worker/runtime/pipeline_testing.h"
#include "worker/runtime/stage_runtime.h"
#include "worker/transport/in_process_transport.h"

namespace pipetrain {
namespace {

// Refuses every send with UNAVAILABLE and counts the calls; receives nothing.
class RefusingTransport : public Transport {
 public:
  explicit RefusingTransport(int stage = 0) : stage_(stage) {}
  int stage() const override { return stage_; }
  absl::Status SendWire(int peer, const TensorAddress& address, const WireTensor&) override {
    AnnotatedMutexLock lock(&mu_);
    ++sends_;
    return absl::UnavailableError(absl::StrCat("stage ", peer, " is gone"));
  }
  absl::StatusOr<WireTensor> RecvWire(int, const TensorAddress&, absl::Duration) override {
    return absl::AbortedError("nothing is received in this test");
  }
  int sends() const {
    AnnotatedMutexLock lock(&mu_);
    return sends_;
  }

 private:
  const int stage_;
  mutable AnnotatedMutex mu_;
  int sends_ ABSL_GUARDED_BY(mu_) = 0;
};

v1::Instruction ForwardOf(int mb) {
  v1::Instruction in;
  in.mutable_forward()->mutable_units()->set_begin(0);
  in.mutable_forward()->mutable_units()->set_end(2);
  in.mutable_forward()->set_micro_batch(mb);
  return in;
}

v1::Instruction SendOf(int mb) {
  v1::Instruction in;
  in.mutable_send()->mutable_tensor()->set_kind(v1::TENSOR_KIND_ACTIVATION);
  in.mutable_send()->mutable_tensor()->set_unit(1);
  in.mutable_send()->mutable_tensor()->set_micro_batch(mb);
  in.mutable_send()->set_peer_stage(1);
  return in;
}

// Stage 0 of 2 over units 0-1 (embed, attn_0) of the 2-layer model,
// running the forward pass and the send of micro-batches 0 .. count - 1.
StageSetup ForwardAndSendStage(const TrainConfig& c, int count) {
  v1::Program program;
  for (int mb = 0; mb < count; ++mb) {
    *program.add_instructions() = ForwardOf(mb);
    *program.add_instructions() = SendOf(mb);
  }
  v1::UnitRange units;
  units.set_begin(0);
  units.set_end(2);
  return StageSetup{"job-send", c, 0, 2, units, units, program, absl::Seconds(5)};
}

TEST(StageRuntimeSendTest, RefusedSend_FailsTheIterationNamingTheSend_LaterSendsDropped) {
  const Dataset data = testing::MakeDataset();
  const StageSetup setup = ForwardAndSendStage(testing::SmallConfig(), 2);
  RefusingTransport transport;
  auto runtime = StageRuntime::Create(setup, &data, &transport);
  ASSERT_TRUE(runtime.ok()) << runtime.status();

  absl::Status status = (*runtime)->RunIteration(0).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  // Whether it surfaced at the second send or at the iteration's end, the
  // message names the send that failed and the transport's reason.
  EXPECT_TRUE(absl::StrContains(status.message(), "stage 0, iteration 0")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(),
                                "send of ACTIVATION of unit 1, micro-batch 0, iteration 0"))
      << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "to stage 1: stage 1 is gone")) << status;
  // Once: surfaced at the second send, it was also the drain's ("also failed").
  EXPECT_FALSE(absl::StrContains(status.message(), "also failed")) << status;
  EXPECT_EQ(transport.sends(), 1);  // micro-batch 1's send never reached it
  // A failed iteration no longer shows its instruction as running.
  EXPECT_EQ((*runtime)->current_instruction(), kBetweenSteps);

  // The failure was reported once: the next iteration runs its sends again.
  status = (*runtime)->RunIteration(1).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "micro-batch 0, iteration 1")) << status;
  EXPECT_EQ(transport.sends(), 2);
}

// Refuses every send as INVALID_ARGUMENT (as a codec refuses non-finite
// values) and answers no receive: each waits out the timeout it is given.
class NothingComesBackTransport : public Transport {
 public:
  int stage() const override { return 0; }
  absl::Status SendWire(int, const TensorAddress&, const WireTensor&) override {
    return absl::InvalidArgumentError("element 3 is nan");
  }
  absl::StatusOr<WireTensor> RecvWire(int, const TensorAddress& address,
                                      absl::Duration timeout) override {
    AnnotatedMutexLock lock(&mu_);
    mu_.AwaitWithTimeout([] { return false; }, timeout);
    return absl::DeadlineExceededError("waited for " + address.DebugString());
  }

 private:
  AnnotatedMutex mu_;
};

// A receive that waits while a send of the same stage fails (its peer then
// never answers it) ends with the send's error, not its own timeout: both
// stages reported DEADLINE_EXCEEDED, a peer failure, and the coordinator
// recovered again and again from what was this stage's own error.
TEST(StageRuntimeSendTest, SendFailsWhileAReceiveWaits_TheSendsErrorNotTheTimeout) {
  const Dataset data = testing::MakeDataset();
  StageSetup setup = ForwardAndSendStage(testing::SmallConfig(), 1);
  setup.recv_timeout = absl::Seconds(10);
  v1::Instruction recv;
  recv.mutable_recv()->mutable_tensor()->set_kind(v1::TENSOR_KIND_ACTIVATION_GRAD);
  recv.mutable_recv()->mutable_tensor()->set_unit(1);
  recv.mutable_recv()->mutable_tensor()->set_micro_batch(0);
  recv.mutable_recv()->set_peer_stage(1);
  *setup.program.add_instructions() = recv;
  NothingComesBackTransport transport;
  auto runtime = StageRuntime::Create(setup, &data, &transport);
  ASSERT_TRUE(runtime.ok()) << runtime.status();

  const absl::Status status = (*runtime)->RunIteration(0).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StrContains(status.message(),
                                "not received: a send of this stage failed "
                                "first: "))
      << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "element 3 is nan")) << status;
  EXPECT_FALSE(absl::StrContains(status.message(), "also failed")) << status;  // said once
}

// Holds every send until `hold` after the first receive began (so it stays
// queued that much of the receive timeout, as to a stalled peer), and
// answers no receive, saying as the mailbox does how long each waited.
// Wall time from the first receive, not the receives' waits summed: those
// fall short of the runtime's timeout by its work between slices, and with
// `hold` 1 ms under the timeout a send waiting on the sum could wait for
// ever (the test timed out on a loaded machine).
class StalledPeerTransport : public Transport {
 public:
  explicit StalledPeerTransport(absl::Duration hold) : hold_(hold) {}
  int stage() const override { return 0; }
  absl::Status SendWire(int, const TensorAddress&, const WireTensor&) override {
    AnnotatedMutexLock lock(&mu_);
    mu_.AwaitWithTimeout(
        [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return first_recv_ != absl::InfiniteFuture(); },
        absl::Seconds(60));
    mu_.AwaitWithTimeout([] { return false; }, first_recv_ + hold_ - absl::Now());
    return absl::OkStatus();
  }
  absl::StatusOr<WireTensor> RecvWire(int, const TensorAddress& address,
                                      absl::Duration timeout) override {
    AnnotatedMutexLock lock(&mu_);
    first_recv_ = std::min(first_recv_, absl::Now());
    mu_.AwaitWithTimeout([] { return false; }, timeout);
    return absl::DeadlineExceededError(absl::StrCat("waited ", absl::FormatDuration(timeout),
                                                    " for ", address.DebugString(),
                                                    "; that stage is slow"));
  }

 private:
  const absl::Duration hold_;
  AnnotatedMutex mu_;
  absl::Time first_recv_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
};

// A receive that times out while this stage's own send is still queued (the
// next stage stalled) says it waited the whole receive timeout, not the last
// 50 ms slice it waited in; nor, when the send went out half-way, the rest
// it waited after. `hold`: the part of the timeout the send stays queued.
void ExpectTheWholeTimeoutSaid(absl::Duration hold) {
  const Dataset data = testing::MakeDataset();
  StageSetup setup = ForwardAndSendStage(testing::SmallConfig(), 1);
  setup.recv_timeout = absl::Milliseconds(300);
  v1::Instruction recv;
  recv.mutable_recv()->mutable_tensor()->set_kind(v1::TENSOR_KIND_ACTIVATION_GRAD);
  recv.mutable_recv()->mutable_tensor()->set_unit(1);
  recv.mutable_recv()->mutable_tensor()->set_micro_batch(0);
  recv.mutable_recv()->set_peer_stage(1);
  *setup.program.add_instructions() = recv;
  StalledPeerTransport transport(hold);
  auto runtime = StageRuntime::Create(setup, &data, &transport);
  ASSERT_TRUE(runtime.ok()) << runtime.status();

  const absl::Status status = (*runtime)->RunIteration(0).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "waited 300ms for ")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "that stage is slow")) << status;
}
TEST(StageRuntimeSendTest, ReceiveTimesOutWhileASendIsQueued_SaysTheWholeTimeout) {
  ExpectTheWholeTimeoutSaid(absl::Milliseconds(299));
}
TEST(StageRuntimeSendTest, ReceiveTimesOutAfterAQueuedSendWentOut_SaysTheWholeTimeout) {
  ExpectTheWholeTimeoutSaid(absl::Milliseconds(150));
}

// Answers every receive at once with DEADLINE_EXCEEDED, recording the
// timeout it was given (the whole one: this stage has no sends queued).
class RecordingTimeoutsTransport : public Transport {
 public:
  int stage() const override { return 1; }
  absl::Status SendWire(int, const TensorAddress&, const WireTensor&) override {
    return absl::OkStatus();
  }
  absl::StatusOr<WireTensor> RecvWire(int, const TensorAddress& address,
                                      absl::Duration timeout) override {
    AnnotatedMutexLock lock(&mu_);
    timeouts_.push_back(timeout);
    return absl::DeadlineExceededError("waited for " + address.DebugString());
  }
  std::vector<absl::Duration> timeouts() const {
    AnnotatedMutexLock lock(&mu_);
    return timeouts_;
  }

 private:
  mutable AnnotatedMutex mu_;
  std::vector<absl::Duration> timeouts_ ABSL_GUARDED_BY(mu_);
};

v1::Instruction RecvOf(v1::TensorKind kind, int unit) {
  v1::Instruction in;
  in.mutable_recv()->mutable_tensor()->set_kind(kind);
  in.mutable_recv()->mutable_tensor()->set_unit(unit);
  in.mutable_recv()->mutable_tensor()->set_micro_batch(0);
  in.mutable_recv()->set_peer_stage(0);
  return in;
}

// Stage 1 of 2 (units 2-5 of the 2-layer model) whose step begins with a
// receive of an activation; with `eval_receives`, its validation program
// begins with one too (else it is empty: a stage taking no part in the
// pass, as a Bi-Partition stage without forward units).
StageSetup ReceivingStage(bool eval_receives) {
  v1::UnitRange units;
  units.set_begin(2);
  units.set_end(6);
  v1::Program program;
  *program.add_instructions() = RecvOf(v1::TENSOR_KIND_ACTIVATION, 1);
  StageSetup setup{"job-grace", testing::SmallConfig(), 1, 2, units, units,
                   program,     absl::Milliseconds(300)};
  if (eval_receives) {
    *setup.eval_program.add_instructions() = RecvOf(v1::TENSOR_KIND_EVAL_ACTIVATION, 1);
  }
  return setup;
}

// The step after a validation pass waits longer in its receives, a receive
// timeout per validation micro-batch (SmallConfig: 7 windows, 2 a
// micro-batch: 4), for the rest of the others' pass; the pass's own
// receives wait one timeout, as a step's do: with the grace, a peer that
// stalled mid-pass went unnoticed for as long.
TEST(StageRuntimeEvalGraceTest, PassReceivesWaitOneTimeout_TheNextStepsReceivesMore) {
  const Dataset data = testing::MakeDataset();
  for (bool eval_receives : {false, true}) {
    SCOPED_TRACE(eval_receives ? "the pass receives" : "no part in the pass");
    RecordingTimeoutsTransport transport;
    auto runtime = StageRuntime::Create(ReceivingStage(eval_receives), &data, &transport);
    ASSERT_TRUE(runtime.ok()) << runtime.status();
    const absl::StatusOr<std::optional<float>> pass = (*runtime)->RunEval(4);
    EXPECT_EQ(pass.ok(), !eval_receives) << pass.status();
    EXPECT_EQ((*runtime)->RunIteration(4).status().code(), absl::StatusCode::kDeadlineExceeded);
    // The step after it waits as any step again.
    EXPECT_EQ((*runtime)->RunIteration(5).status().code(), absl::StatusCode::kDeadlineExceeded);
    // The runtime gives what is left of its deadline: a little short of
    // the whole wait (up to 100 ms on a loaded machine), never more.
    std::vector<absl::Duration> expected = {absl::Milliseconds(300 + 4 * 300),
                                            absl::Milliseconds(300)};
    if (eval_receives) expected.insert(expected.begin(), absl::Milliseconds(300));
    const std::vector<absl::Duration> waited = transport.timeouts();
    ASSERT_EQ(waited.size(), expected.size());
    for (size_t i = 0; i < waited.size(); ++i) {
      EXPECT_LE(waited[i], expected[i]) << "receive " << i;
      EXPECT_GT(waited[i], expected[i] - absl::Milliseconds(100)) << "receive " << i;
    }
  }
}

// With data parallelism the transport numbers stages across replicas
// (replica 1's stage 0 is its stage 2): the message numbers every stage as
// the transport does, so its own reason ("stage 3 is gone") and the
// coordinator's list of which worker runs each stage read alike, with the
// replica's own numbering beside it.
TEST(StageRuntimeSendTest, RefusedSend_OfASecondReplica_NamesStagesAsTheTransportDoes) {
  const Dataset data = testing::MakeDataset();
  StageSetup setup = ForwardAndSendStage(testing::SmallConfig(), 1);
  setup.replica = 1;
  setup.replicas = 2;
  RefusingTransport transport(/*stage=*/2);
  auto runtime = StageRuntime::Create(setup, &data, &transport);
  ASSERT_TRUE(runtime.ok()) << runtime.status();

  const absl::Status status = (*runtime)->RunIteration(0).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_TRUE(absl::StartsWith(status.message(), "stage 2 (replica 1's stage 0), iteration 0"))
      << status;
  EXPECT_TRUE(
      absl::StrContains(status.message(), "to stage 3 (replica 1's stage 1): stage 3 is gone"))
      << status;
}

// Stage 0's side of an in-process fabric whose first ACTIVATION send waits
// in the transport, as behind a slow link, until `release` (asked on the
// send thread, once a millisecond) says the stage has gone as far as it
// will; everything else passes straight through.
class SlowFirstSendTransport : public Transport {
 public:
  SlowFirstSendTransport(std::unique_ptr<Transport> inner, std::function<bool()> release)
      : inner_(std::move(inner)), release_(std::move(release)) {}
  int stage() const override { return inner_->stage(); }
  absl::Status SendWire(int peer, const TensorAddress& address, const WireTensor& wire) override {
    if (address.kind == v1::TENSOR_KIND_ACTIVATION && !held_) {
      held_ = true;  // read and written on the send thread only
      while (!release_()) absl::SleepFor(absl::Milliseconds(1));
    }
    return inner_->SendWire(peer, address, wire);
  }
  absl::StatusOr<WireTensor> RecvWire(int peer, const TensorAddress& address,
                                      absl::Duration timeout) override {
    return inner_->RecvWire(peer, address, timeout);
  }

 private:
  std::unique_ptr<Transport> inner_;
  const std::function<bool()> release_;
  bool held_ = false;
};

// A GPipe stage 0 sends its whole forward pass without receiving: while
// its first send was held on a slow link, it ran every micro-batch's
// forward pass and queued a host copy of each, reaching the receives of
// the backward pass. With room for two activations' bytes it waits before
// the forward pass of micro-batch 3 (the held send and two behind it),
// computing nothing further until the link moves; then the step ends as
// ever.
TEST(StageRuntimeSendTest, SlowLink_GPipeStage0WaitsOnceItsQueuedSendsHoldTheBound) {
  TrainConfig c = testing::SmallConfig();
  c.micro_batches = 8;  // one sequence each
  const Dataset data = testing::MakeDataset();
  const int units = NumUnits(c.model);
  const std::vector<Range> ranges = {{0, 2}, {2, units}};
  absl::StatusOr<std::vector<v1::Program>> programs =
      CompilePrograms(ranges, units, c.micro_batches, Schedule::kGPipe);
  ASSERT_TRUE(programs.ok()) << programs.status();
  std::vector<StageSetup> setups;
  for (int s = 0; s < 2; ++s) {
    setups.push_back({"job-paced", c, s, 2, ToUnitRange(ranges[s]), ToUnitRange(ranges[s]),
                      (*programs)[s], absl::Seconds(60)});
  }
  const int64_t activation = int64_t{c.seq_len} * c.model.d_model * sizeof(float);
  setups[0].max_queued_send_bytes = 2 * activation;

  InProcessFabric fabric(2);
  std::unique_ptr<Transport> second_link = fabric.Connect(1);
  std::unique_ptr<StageRuntime> first;
  std::string shown;  // stage 0's instruction when the link moved (send thread's)
  SlowFirstSendTransport first_link(fabric.Connect(0), [&] {
    // Either stage 0 waits for its sends (paced), or it ran its forward
    // pass to the end and waits for a gradient (not paced): each lasts
    // until the held send goes.
    shown = first->current_instruction();
    return absl::StrContains(shown, "waiting for queued sends") || absl::StartsWith(shown, "recv ");
  });
  auto made = StageRuntime::Create(setups[0], &data, &first_link);
  ASSERT_TRUE(made.ok()) << made.status();
  first = *std::move(made);
  auto second = StageRuntime::Create(setups[1], &data, second_link.get());
  ASSERT_TRUE(second.ok()) << second.status();

  absl::StatusOr<IterationResult> last_stage;
  std::thread runs_last([&] { last_stage = (*second)->RunIteration(0); });
  const absl::StatusOr<IterationResult> first_stage = first->RunIteration(0);
  runs_last.join();
  ASSERT_TRUE(first_stage.ok()) << first_stage.status();
  ASSERT_TRUE(last_stage.ok()) << last_stage.status();
  EXPECT_EQ(shown,
            absl::StrCat("forward [0, 2) mb 3: waiting for queued sends to "
                         "leave (over ",
                         2 * activation, " bytes of them)"));
  EXPECT_EQ(last_stage->micro_batch_losses.size(), 8u);
}

}  // namespace
}  // namespace pipetrain
