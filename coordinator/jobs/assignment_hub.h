// AssignmentHub: each worker's current assignment, for WatchAssignments.
//
// State, not a queue: a worker that (re)connects is sent its current
// assignment, then every later one. Each Set bumps a per-hub sequence
// number so watchers can tell new from already-sent. Subscribers (gRPC
// stream reactors) are called outside the lock whenever their worker's
// assignment changes; they must not call back into the hub synchronously
// with a lock of their own held that Set's caller could hold. Thread-safe.
#ifndef PIPETRAIN_COORDINATOR_JOBS_ASSIGNMENT_HUB_H_
#define PIPETRAIN_COORDINATOR_JOBS_ASSIGNMENT_HUB_H_

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/annotated_mutex.h"
#include "proto/pipetrain/v1/plan.pb.h"

namespace pipetrain {

struct SequencedAssignment {
  int64_t sequence = 0;
  v1::Assignment assignment;
};

class AssignmentHub {
 public:
  void Set(const std::string& worker_id, v1::Assignment assignment);
  // The worker's assignment if its sequence is > `after`, else nullopt.
  std::optional<SequencedAssignment> Newer(const std::string& worker_id, int64_t after) const;
  // Like Newer, but waits up to `timeout` for one.
  std::optional<SequencedAssignment> AwaitNewer(const std::string& worker_id, int64_t after,
                                                absl::Duration timeout) const;
  // Calls `on_change` after every Set for `worker_id`; returns a handle.
  int Subscribe(const std::string& worker_id, std::function<void()> on_change);
  void Unsubscribe(int handle);
  // Drops the assignments of the workers for which `gone` is true (ones the
  // registry no longer knows: their ids never come back), so the hub holds
  // no assignment per address a worker ever had. Subscriptions stay until
  // their streams end. Returns how many were dropped. `gone` runs under the
  // hub's lock: it must not call the hub.
  int Forget(const std::function<bool(const std::string& worker_id)>& gone);
  // The workers the hub holds an assignment for.
  std::vector<std::string> WorkerIds() const;

 private:
  mutable AnnotatedMutex mu_;
  int64_t sequence_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, SequencedAssignment> current_ ABSL_GUARDED_BY(mu_);
  int next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int, std::pair<std::string, std::function<void()>>> subscribers_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_JOBS_ASSIGNMENT_HUB_H_
