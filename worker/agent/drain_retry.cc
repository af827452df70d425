#include "worker/agent/drain_retry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

// What is left of the drain timeout that ends at `until`; never negative.
absl::Duration Left(const DrainAfterDelayOptions& options, absl::Time until) {
  return std::max(absl::ZeroDuration(), until - options.clock->Now());
}

// AwaitRegisteredAgain until `until`, in slices, between which a wake is
// looked for: after a drain refused for a stale session, one asked before
// the heartbeat loop registered again would be refused again.
absl::Status AwaitRegisteredAgainUntil(DrainingAgent& agent, absl::Time until,
                                       const DrainAfterDelayOptions& options) {
  bool said = false;
  while (true) {
    const absl::Duration left = Left(options, until);
    const absl::Status registered = agent.AwaitRegisteredAgain(std::min(left, kDrainWaitSlice));
    if (!absl::IsDeadlineExceeded(registered)) return registered;  // OK, refused, stopping
    if (left <= kDrainWaitSlice) {
      return absl::DeadlineExceededError(absl::StrCat(registered.message(), "; the drain timeout (",
                                                      absl::FormatDuration(options.timeout),
                                                      ") is spent"));
    }
    if (!said) {
      PT_LOG(INFO) << "the coordinator no longer takes this worker's session (it restarted or "
                      "failed over): waiting up to "
                   << absl::FormatDuration(left) << " to register again, then draining";
      said = true;
    }
    RETURN_IF_ERROR(options.await_wake(absl::ZeroDuration(), "while registering again"));
  }
}

// Asks for the drain until it is granted or refused for good, or the
// timeout ending at `until` is spent (no ask begins after it); once only
// when `hurried`. `stale`: the last answer refused a stale session.
absl::Status AskUntil(DrainingAgent& agent, bool stale, bool hurried, absl::Time until,
                      const DrainAfterDelayOptions& options) {
  bool said = false;
  while (true) {
    if (stale) RETURN_IF_ERROR(AwaitRegisteredAgainUntil(agent, until, options));
    const absl::Status asked = agent.RequestDrain();
    if (!DrainAnswerPasses(asked) || hurried || Left(options, until) == absl::ZeroDuration()) {
      return asked;
    }
    if (!said) {
      PT_LOG(INFO) << "the coordinator would not drain this worker yet (" << asked
                   << "): asking again for up to " << absl::FormatDuration(Left(options, until));
      said = true;
    }
    stale = IsStaleSessionRefusal(asked);
    if (stale) continue;  // asked again once registered again
    RETURN_IF_ERROR(options.await_wake(std::min(kDrainAskPause, Left(options, until)),
                                       "while asking for the drain again"));
    if (Left(options, until) == absl::ZeroDuration()) return asked;
  }
}

// AwaitDrained until `until`, in slices, between which a wake is looked
// for: a second signal or a failure ends the wait (CANCELLED) instead of
// being lost until the drain or its timeout (up to a day). Every few
// seconds it asks again whether a job the drain named still holds this
// worker (RecheckDrain: an abandoned placement sends it no word).
absl::Status AwaitDrainedUntil(DrainingAgent& agent, absl::Time until,
                               const DrainAfterDelayOptions& options) {
  constexpr absl::Duration kRecheck = absl::Seconds(5);
  const absl::Duration timeout = Left(options, until);
  absl::Time recheck = options.clock->Now() + kRecheck;
  bool said = false;
  while (true) {
    const absl::Duration left = Left(options, until);
    const absl::Status drained = agent.AwaitDrained(std::min(left, kDrainWaitSlice));
    if (!absl::IsDeadlineExceeded(drained)) return drained;
    if (!said) {  // not for a worker that nothing holds: it leaves at once
      PT_LOG(INFO) << "draining: waiting up to " << absl::FormatDuration(timeout)
                   << " for the job to re-plan without this worker (signal again to leave now)";
      said = true;
    }
    // Not near the end: a recheck (two tries at most) would overrun it.
    if (options.clock->Now() >= recheck && left > 3 * options.recheck_timeout) {
      if (absl::Status asked = agent.RecheckDrain(); !asked.ok()) {
        PT_LOG(WARNING) << "asking again whether a job holds this worker: " << asked;
      }
      recheck = options.clock->Now() + kRecheck;
    }
    if (left <= kDrainWaitSlice) {
      if (agent.AwaitDrained(absl::ZeroDuration()).ok()) return absl::OkStatus();  // rechecked
      return absl::DeadlineExceededError(absl::StrCat("the job did not let this worker go within ",
                                                      absl::FormatDuration(timeout)));
    }
    RETURN_IF_ERROR(options.await_wake(absl::ZeroDuration(), "while draining"));
  }
}

}  // namespace

bool IsStaleSessionRefusal(const absl::Status& drain) { return absl::IsUnauthenticated(drain); }

bool DrainAnswerPasses(const absl::Status& drain) {
  return absl::IsUnavailable(drain) || absl::IsDeadlineExceeded(drain) ||
         IsStaleSessionRefusal(drain);
}

bool AsksDrainAfterDelay(const std::optional<absl::Status>& first, bool hurried) {
  if (!first.has_value()) return true;
  return !hurried && DrainAnswerPasses(*first);
}

absl::Status DrainAfterDelay(DrainingAgent& agent, const std::optional<absl::Status>& first,
                             bool hurried, const DrainAfterDelayOptions& options) {
  const absl::Time until = options.clock->Now() + options.timeout;
  absl::Status drained = first.value_or(absl::OkStatus());
  if (AsksDrainAfterDelay(first, hurried)) {
    const bool stale = first.has_value() && IsStaleSessionRefusal(*first);
    drained = AskUntil(agent, stale, hurried, until, options);
  }
  if (!drained.ok()) return drained;
  return AwaitDrainedUntil(agent, until, options);
}

}  // namespace pipetrain
