// Which answers to a shutdown's first drain ask (WorkerAgent::RequestDrain,
// worker/main.cc) pass, so that the drain is asked again after the
// shutdown delay. A worker that leaves undrained costs its job the steps
// since its last checkpoint; one whose drain the coordinator refused for
// good (a job without checkpoints) leaves all the same.
// Thread-safe (pure functions).
#ifndef PIPETRAIN_WORKER_AGENT_DRAIN_RETRY_H_
#define PIPETRAIN_WORKER_AGENT_DRAIN_RETRY_H_

#include <optional>

#include "absl/status/status.h"

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
bool IsStaleSessionRefusal(const absl::Status& drain);

// Whether a shutdown asks for its drain after the shutdown delay: when it
// was not asked before the delay (`first` empty), or when that ask met a
// passing failure (UNAVAILABLE: a failover; DEADLINE_EXCEEDED: a
// coordinator busy past the deadline; a stale session,
// IsStaleSessionRefusal) and no second signal `hurried` the shutdown on.
bool AsksDrainAfterDelay(const std::optional<absl::Status>& first, bool hurried);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_AGENT_DRAIN_RETRY_H_
