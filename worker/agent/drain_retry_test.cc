// DrainAfterDelay, the shutdown's drain after its delay, against a scripted
// agent on a fake clock: which answers are asked again, within which
// budget, and what ends the asking.
#include "worker/agent/drain_retry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace pipetrain {
namespace {

// WorkerRegistry::AuthenticateSession's refusal, as RequestDrain returns it.
absl::Status StaleSession() {
  return absl::UnauthenticatedError(
      "the coordinator would not drain this worker: session credential not recognised: ... "
      "register again");
}

// The agent as the shutdown sees it, scripted, on `clock`. RequestDrain
// answers from `answers`, then `otherwise`, each ask taking `ask_takes`; a
// stale session's answer makes AwaitRegisteredAgain wait, as the agent's
// does, for `slices_to_register` calls (each DEADLINE_EXCEEDED after its
// whole timeout), then answer `registration` (OK, or the refusal of the
// agent's registration again). AwaitDrained waits out
// `slices_held_after_grant` calls before the job lets the worker go.
// `calls` records each call in order. `awaiting_registration`: a drain was
// refused for a stale session (the ask before the delay, say).
class FakeAgent final : public DrainingAgent {
 public:
  explicit FakeAgent(FakeClock* clock) : clock_(clock) {}

  absl::Status RequestDrain() override {
    calls.push_back("drain");
    clock_->Advance(ask_takes);
    absl::Status answer = otherwise;
    if (!answers.empty()) {
      answer = answers.front();
      answers.pop_front();
    }
    if (IsStaleSessionRefusal(answer)) awaiting_registration = true;
    return answer;
  }
  absl::Status AwaitRegisteredAgain(absl::Duration timeout) override {
    calls.push_back("await registered");
    if (!awaiting_registration) return absl::OkStatus();  // no drain refused so
    if (slices_to_register > 0) {
      --slices_to_register;
      clock_->Advance(timeout);
      return absl::DeadlineExceededError("not registered again");
    }
    if (registration.ok()) awaiting_registration = false;
    return registration;
  }
  absl::Status AwaitDrained(absl::Duration timeout) override {
    calls.push_back("await drained");
    if (slices_held_after_grant == 0) return absl::OkStatus();
    --slices_held_after_grant;
    clock_->Advance(timeout);
    return absl::DeadlineExceededError("held");
  }
  absl::Status RecheckDrain() override {
    calls.push_back("recheck");
    return absl::OkStatus();
  }

  std::deque<absl::Status> answers;
  absl::Status otherwise;
  absl::Duration ask_takes = absl::ZeroDuration();
  int slices_to_register = 0;
  absl::Status registration;
  int slices_held_after_grant = 0;
  std::vector<std::string> calls;
  bool awaiting_registration = false;

 private:
  FakeClock* const clock_;
};

// DrainAfterDelay on `agent` with `timeout`, its wake waits recorded in
// agent->calls ("wake 1s") and passed on the fake clock; the wake number
// `signal_at` (from 1; 0: none) is a second signal. A stale `first` is
// the agent's too, as its ask recorded it.
struct Shutdown {
  FakeClock clock;
  FakeAgent agent{&clock};
  int signal_at = 0;
  int wakes = 0;

  absl::Status Drain(const std::optional<absl::Status>& first, bool hurried,
                     absl::Duration timeout) {
    if (first.has_value() && IsStaleSessionRefusal(*first)) agent.awaiting_registration = true;
    DrainAfterDelayOptions options;
    options.timeout = timeout;
    options.clock = &clock;
    options.await_wake = [this](absl::Duration wait, absl::string_view waiting) {
      agent.calls.push_back(absl::StrCat("wake ", absl::FormatDuration(wait)));
      clock.Advance(wait);
      if (++wakes == signal_at) return absl::CancelledError(absl::StrCat("signalled ", waiting));
      return absl::OkStatus();
    };
    return DrainAfterDelay(agent, first, hurried, options);
  }
  absl::Duration Elapsed(absl::Time start) const { return clock.Now() - start; }
};

using Calls = std::vector<std::string>;

// The drain is asked for after the delay when it was not before, or when
// the first ask met a passing failure, a stale session's included (the
// agent registers again meanwhile); never after a second signal said to go
// on now, nor after a refusal for good or a drain granted.
TEST(AsksDrainAfterDelayTest, PassingFailuresAndNotAskedYet_AskedAgainUnlessHurried) {
  EXPECT_TRUE(AsksDrainAfterDelay(std::nullopt, /*hurried=*/false));
  EXPECT_TRUE(AsksDrainAfterDelay(std::nullopt, /*hurried=*/true));
  for (const absl::Status& passing :
       {absl::UnavailableError("this coordinator follows"),
        absl::DeadlineExceededError("Deadline Exceeded"), StaleSession()}) {
    SCOPED_TRACE(passing.ToString());
    EXPECT_TRUE(DrainAnswerPasses(passing));
    EXPECT_TRUE(AsksDrainAfterDelay(passing, /*hurried=*/false));
    EXPECT_FALSE(AsksDrainAfterDelay(passing, /*hurried=*/true));
  }
  for (const absl::Status& final_answer :
       {absl::OkStatus(), absl::FailedPreconditionError("w-1 runs job j, which has no checkpoints"),
        absl::PermissionDeniedError("acts for w-2")}) {
    SCOPED_TRACE(final_answer.ToString());
    EXPECT_FALSE(DrainAnswerPasses(final_answer));
    EXPECT_FALSE(AsksDrainAfterDelay(final_answer, /*hurried=*/false));
  }
  EXPECT_TRUE(IsStaleSessionRefusal(StaleSession()));
  EXPECT_FALSE(IsStaleSessionRefusal(absl::FailedPreconditionError("worker w-1 is LOST")));
}

// The first ask met a failover (UNAVAILABLE); the ask after the delay
// reaches the new leader before the heartbeat loop registered with it,
// and is refused for the stale session. It is asked again once the agent
// registered again, and granted. It used to be the last ask: the worker
// left undrained, and deregistered with the stale session (LOST, not LEFT).
TEST(DrainAfterDelayTest, StaleSessionOnTheAskAfterTheDelay_AskedAgainOnceRegisteredAgain) {
  Shutdown shutdown;
  shutdown.agent.answers = {StaleSession()};
  shutdown.agent.slices_to_register = 2;
  const absl::Status drained = shutdown.Drain(absl::UnavailableError("no leader"),
                                              /*hurried=*/false, absl::Seconds(60));
  EXPECT_EQ(drained, absl::OkStatus());
  EXPECT_EQ(shutdown.agent.calls, Calls({"drain", "await registered", "wake 0", "await registered",
                                         "wake 0", "await registered", "drain", "await drained"}));
}

// The heartbeat loop gives up while the shutdown waits for it to register
// again (the new leader refuses the join token): the wait ends at once
// with that refusal, asking nothing more, instead of waiting out the whole
// drain timeout.
TEST(DrainAfterDelayTest, RegistrationRefusedWhileWaiting_EndsAtOnceWithTheRefusal) {
  Shutdown shutdown;
  shutdown.agent.slices_to_register = 1;
  shutdown.agent.registration = absl::UnauthenticatedError(
      "the coordinator refused this worker's registration again: join token rejected");
  const absl::Time start = shutdown.clock.Now();
  const absl::Status drained = shutdown.Drain(StaleSession(), /*hurried=*/false, absl::Seconds(60));
  EXPECT_EQ(drained, shutdown.agent.registration);
  EXPECT_EQ(shutdown.agent.calls, Calls({"await registered", "wake 0", "await registered"}));
  EXPECT_EQ(shutdown.Elapsed(start), kDrainWaitSlice);
}

// UNAVAILABLE and DEADLINE_EXCEEDED are asked again after a pause until
// the coordinator grants the drain.
TEST(DrainAfterDelayTest, PassingAnswers_AskedAgainAfterAPauseUntilGranted) {
  Shutdown shutdown;
  shutdown.agent.answers = {absl::UnavailableError("no leader"),
                            absl::DeadlineExceededError("Deadline Exceeded")};
  const absl::Status drained = shutdown.Drain(absl::DeadlineExceededError("Deadline Exceeded"),
                                              /*hurried=*/false, absl::Seconds(60));
  EXPECT_EQ(drained, absl::OkStatus());
  EXPECT_EQ(shutdown.agent.calls,
            Calls({"drain", "wake 1s", "drain", "wake 1s", "drain", "await drained"}));
}

// Every ask begins within the drain timeout; the last may run past it by
// its own deadline (the grace period counts one), never more.
TEST(DrainAfterDelayTest, PassingUntilTheTimeout_NoAskBeginsAfterIt) {
  Shutdown shutdown;
  shutdown.agent.otherwise = absl::UnavailableError("no leader");
  shutdown.agent.ask_takes = absl::Seconds(3);
  const absl::Time start = shutdown.clock.Now();
  const absl::Status drained = shutdown.Drain(absl::UnavailableError("no leader"),
                                              /*hurried=*/false, absl::Seconds(10));
  EXPECT_EQ(drained.code(), absl::StatusCode::kUnavailable) << drained;
  // Asks at 0, 4 and 8 s, each 3 s long, a pause of 1 s between.
  EXPECT_EQ(shutdown.agent.calls, Calls({"drain", "wake 1s", "drain", "wake 1s", "drain"}));
  EXPECT_EQ(shutdown.Elapsed(start), absl::Seconds(11));
}

// A stale session whose registration again never comes: the wait ends with
// the drain timeout, saying so.
TEST(DrainAfterDelayTest, StaleSessionNotRegisteredAgain_EndsWithTheTimeout) {
  Shutdown shutdown;
  shutdown.agent.slices_to_register = 1000;
  const absl::Time start = shutdown.clock.Now();
  const absl::Status drained = shutdown.Drain(StaleSession(), /*hurried=*/false, absl::Seconds(10));
  EXPECT_EQ(drained.code(), absl::StatusCode::kDeadlineExceeded) << drained;
  EXPECT_TRUE(absl::StrContains(drained.message(), "the drain timeout (10s) is spent")) << drained;
  EXPECT_EQ(shutdown.Elapsed(start), absl::Seconds(10));
  EXPECT_EQ(shutdown.agent.calls.front(), "await registered");
  EXPECT_EQ(std::count(shutdown.agent.calls.begin(), shutdown.agent.calls.end(), "drain"), 0);
}

// The asks and the job's re-plan share the drain timeout: what the asks
// took is not waited again.
TEST(DrainAfterDelayTest, GrantedAfterAsking_TheJobGetsWhatIsLeftOfTheTimeout) {
  Shutdown shutdown;
  shutdown.agent.answers = {absl::UnavailableError("no leader")};
  shutdown.agent.ask_takes = absl::Seconds(2);
  shutdown.agent.slices_held_after_grant = 1000;
  const absl::Time start = shutdown.clock.Now();
  const absl::Status drained = shutdown.Drain(absl::UnavailableError("no leader"),
                                              /*hurried=*/false, absl::Seconds(10));
  EXPECT_EQ(drained, absl::DeadlineExceededError("the job did not let this worker go within 5s"));
  EXPECT_EQ(shutdown.Elapsed(start), absl::Seconds(10));
}

// A second signal during the delay: a passing first answer is not asked
// again; a worker not asked before is asked once, not again.
TEST(DrainAfterDelayTest, Hurried_AskedOnceAtMost) {
  {
    Shutdown shutdown;
    EXPECT_EQ(
        shutdown.Drain(absl::UnavailableError("no leader"), /*hurried=*/true, absl::Seconds(60))
            .code(),
        absl::StatusCode::kUnavailable);
    EXPECT_EQ(shutdown.agent.calls, Calls());
  }
  {
    Shutdown shutdown;
    shutdown.agent.otherwise = absl::UnavailableError("no leader");
    EXPECT_EQ(shutdown.Drain(std::nullopt, /*hurried=*/true, absl::Seconds(60)).code(),
              absl::StatusCode::kUnavailable);
    EXPECT_EQ(shutdown.agent.calls, Calls({"drain"}));
  }
  {
    Shutdown shutdown;
    EXPECT_EQ(shutdown.Drain(absl::OkStatus(), /*hurried=*/true, absl::Seconds(60)),
              absl::OkStatus());
    EXPECT_EQ(shutdown.agent.calls, Calls({"await drained"}));
  }
}

// A second signal while pausing between asks ends the asking.
TEST(DrainAfterDelayTest, SignalledWhilePausing_EndsCancelled) {
  Shutdown shutdown;
  shutdown.agent.otherwise = absl::UnavailableError("no leader");
  shutdown.signal_at = 1;
  const absl::Status drained = shutdown.Drain(absl::UnavailableError("no leader"),
                                              /*hurried=*/false, absl::Seconds(60));
  EXPECT_EQ(drained, absl::CancelledError("signalled while asking for the drain again"));
  EXPECT_EQ(shutdown.agent.calls, Calls({"drain", "wake 1s"}));
}

// A refusal for good (a job without checkpoints) is not asked again.
TEST(DrainAfterDelayTest, RefusedForGood_NotAskedAgain) {
  const absl::Status for_good = absl::FailedPreconditionError("w-1 runs job j, no checkpoints");
  {
    Shutdown shutdown;
    shutdown.agent.answers = {for_good};
    EXPECT_EQ(
        shutdown.Drain(absl::UnavailableError("no leader"), /*hurried=*/false, absl::Seconds(60)),
        for_good);
    EXPECT_EQ(shutdown.agent.calls, Calls({"drain"}));
  }
  {
    Shutdown shutdown;
    EXPECT_EQ(shutdown.Drain(for_good, /*hurried=*/false, absl::Seconds(60)), for_good);
    EXPECT_EQ(shutdown.agent.calls, Calls());
  }
}

}  // namespace
}  // namespace pipetrain
