#include "coordinator/jobs/assignment_hub.h"

#include <vector>

namespace pipetrain {

void AssignmentHub::Set(const std::string& worker_id, v1::Assignment assignment) {
  std::vector<std::function<void()>> to_call;
  {
    AnnotatedMutexLock lock(&mu_);
    current_[worker_id] = {++sequence_, std::move(assignment)};
    for (const auto& [handle, sub] : subscribers_) {
      if (sub.first == worker_id) to_call.push_back(sub.second);
    }
  }
  for (auto& call : to_call) call();
}

int AssignmentHub::Forget(const std::function<bool(const std::string& worker_id)>& gone) {
  AnnotatedMutexLock lock(&mu_);
  int dropped = 0;
  for (auto it = current_.begin(); it != current_.end();) {
    if (gone(it->first)) {
      it = current_.erase(it);
      ++dropped;
    } else {
      ++it;
    }
  }
  return dropped;
}

std::vector<std::string> AssignmentHub::WorkerIds() const {
  AnnotatedMutexLock lock(&mu_);
  std::vector<std::string> ids;
  for (const auto& [id, assignment] : current_) ids.push_back(id);
  return ids;
}

std::optional<SequencedAssignment> AssignmentHub::Newer(const std::string& worker_id,
                                                        int64_t after) const {
  AnnotatedMutexLock lock(&mu_);
  auto it = current_.find(worker_id);
  if (it == current_.end() || it->second.sequence <= after) return std::nullopt;
  return it->second;
}

std::optional<SequencedAssignment> AssignmentHub::AwaitNewer(const std::string& worker_id,
                                                             int64_t after,
                                                             absl::Duration timeout) const {
  AnnotatedMutexLock lock(&mu_);
  auto newer = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = current_.find(worker_id);
    return it != current_.end() && it->second.sequence > after;
  };
  if (!mu_.AwaitWithTimeout(newer, timeout)) return std::nullopt;
  return current_.at(worker_id);
}

int AssignmentHub::Subscribe(const std::string& worker_id, std::function<void()> on_change) {
  AnnotatedMutexLock lock(&mu_);
  const int handle = next_handle_++;
  subscribers_[handle] = {worker_id, std::move(on_change)};
  return handle;
}

void AssignmentHub::Unsubscribe(int handle) {
  AnnotatedMutexLock lock(&mu_);
  subscribers_.erase(handle);
}

}  // namespace pipetrain
