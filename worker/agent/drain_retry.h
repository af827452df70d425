// A shutdown's drain after its delay (worker/main.cc): which answers to a
// drain ask (WorkerAgent::RequestDrain) pass, so that it is asked again,
// and DrainAfterDelay, which asks until the drain is granted or refused for
// good or --drain-timeout-seconds is spent, and then waits for the job to
// let the worker go.
//
// What asking again buys depends on why the ask failed:
//  - UNAVAILABLE (a failover in flight, a leader briefly unreachable) or
//    DEADLINE_EXCEEDED (a coordinator busy past the deadline): a
//    coordinator that still holds the job re-plans it without this worker
//    at the next step boundary; a worker that left undrained instead costs
//    its job the steps since its last checkpoint.
//  - A stale session (IsStaleSessionRefusal: the coordinator restarted or
//    failed over): those steps are lost already. The restored coordinator
//    recovers the job from its last checkpoint whatever the worker does,
//    and the agent stopped the runner before it registered again. Waiting
//    for that registration (said drained) lets the recovering job stop
//    waiting --restart-grace-seconds for this worker (a drained worker is
//    not waited for), and the deregistration then carries a current
//    session: the coordinator shows the worker LEFT, not LOST after its
//    lease.
// A drain the coordinator refused for good (a job without checkpoints)
// leaves all the same.
#ifndef PIPETRAIN_WORKER_AGENT_DRAIN_RETRY_H_
#define PIPETRAIN_WORKER_AGENT_DRAIN_RETRY_H_

#include <functional>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace pipetrain {

// Whether `drain`, the answer to this worker's own DrainWorker, refused its
// session credential as not current: the coordinator restarted or failed
// over (or forgot this worker) and the agent has not registered again yet.
// Its heartbeat loop then does (the heartbeat is refused so too), with a
// new session the coordinator takes (WorkerAgent::AwaitRegisteredAgain).
// Told by the code alone: UNAUTHENTICATED. A worker's drain carries only
// its session credential, and the coordinator refuses a drain itself with
// other codes (FAILED_PRECONDITION: a job without checkpoints, a LOST
// worker; PERMISSION_DENIED: another worker's), so no message is matched.
// Thread-safe (pure).
bool IsStaleSessionRefusal(const absl::Status& drain);

// Whether a drain ask's answer passes, so that it is asked again:
// UNAVAILABLE, DEADLINE_EXCEEDED or a stale session (IsStaleSessionRefusal).
// Thread-safe (pure).
bool DrainAnswerPasses(const absl::Status& drain);

// Whether a shutdown asks for its drain after the shutdown delay: when it
// was not asked before the delay (`first` empty), or when that ask's answer
// passed (DrainAnswerPasses) and no second signal `hurried` the shutdown
// on. Thread-safe (pure).
bool AsksDrainAfterDelay(const std::optional<absl::Status>& first, bool hurried);

// What DrainAfterDelay asks of the worker's agent: WorkerAgent's calls of
// the same names (see there). Tests put a fake in its place.
class DrainingAgent {
 public:
  virtual ~DrainingAgent() = default;
  virtual absl::Status RequestDrain() = 0;
  virtual absl::Status AwaitRegisteredAgain(absl::Duration timeout) = 0;
  virtual absl::Status AwaitDrained(absl::Duration timeout) = 0;
  virtual absl::Status RecheckDrain() = 0;
};

struct DrainAfterDelayOptions {
  // --drain-timeout-seconds, from the end of the delay: no ask begins after
  // it, and every wait ends by it. The last ask may run past it by its own
  // deadline (RequestDrain: two tries of the RPC timeout), which a
  // supervisor's grace period counts (deploy/k8s/base/worker.yaml).
  absl::Duration timeout;
  // WorkerAgent::kRecheckDrainTimeout: no RecheckDrain begins within three
  // of it of the end, which it would overrun.
  absl::Duration recheck_timeout = absl::Seconds(2);
  // Waits up to `wait` (zero: only looks) for a second signal ("go on
  // now", as during the shutdown delay) or a failure of the worker:
  // CANCELLED naming it, its message ending with `waiting` (what it cut
  // short); OK when none came by then. Required.
  std::function<absl::Status(absl::Duration wait, absl::string_view waiting)> await_wake;
  // Times `timeout` (not owned).
  Clock* clock = MonotonicClock();
};

// How long DrainAfterDelay waits after an answer of UNAVAILABLE or
// DEADLINE_EXCEEDED before it asks again, and how long each of the agent's
// waits lasts between looks for a wake.
inline constexpr absl::Duration kDrainAskPause = absl::Seconds(1);
inline constexpr absl::Duration kDrainWaitSlice = absl::Milliseconds(200);

// The shutdown's drain after its delay. `first`: the answer to the ask
// before the delay (empty: none was made); `hurried`: a second signal came
// during the delay. When AsksDrainAfterDelay says so, asks for the drain
// (RequestDrain), and asks again while the answer passes and the timeout
// is not spent, unless `hurried` (then once): after UNAVAILABLE or
// DEADLINE_EXCEEDED once kDrainAskPause passed; after a stale session once
// the agent registered again (AwaitRegisteredAgain; asked before, it would
// be refused again). That registration said drained, which the ask only
// confirms (the coordinator does nothing more for a drained worker); it
// is asked all the same, as the attempt that registered may have left
// before the first ask set drained (each attempt reads it as it leaves),
// and then only the heartbeat thread's one ask after it, whose failure is
// only logged, drains the worker. Once granted (or `first` was), waits for
// the job to let the worker go (AwaitDrained, rechecking every 5 s:
// RecheckDrain) within what is left of the timeout. Each wait ends early
// on a wake. Returns OK once drained and let go (or nothing held the
// worker); otherwise why the worker leaves without a drain: the last
// answer (a refusal for good, or a passing one when the timeout is spent
// or the shutdown was hurried); from AwaitRegisteredAgain, the
// registration's refusal (the coordinator refused the agent's
// registration again: at once), DEADLINE_EXCEEDED (not registered again
// in time) or CANCELLED (the agent stopping); CANCELLED on a wake;
// DEADLINE_EXCEEDED when the job did not let the worker go in time. Logs
// its waits (INFO), once each. Call from one thread.
absl::Status DrainAfterDelay(DrainingAgent& agent, const std::optional<absl::Status>& first,
                             bool hurried, const DrainAfterDelayOptions& options);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_AGENT_DRAIN_RETRY_H_
