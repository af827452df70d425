#include "worker/transport/mailbox.h"

#include "absl/strings/str_cat.h"

namespace pipetrain {

absl::Status Mailbox::Put(int source_stage, const TensorAddress& address, WireTensor wire) {
  AnnotatedMutexLock lock(&mu_);
  if (!tensors_.emplace(Key{source_stage, address}, std::move(wire)).second) {
    return absl::FailedPreconditionError(
        absl::StrCat("duplicate tensor from stage ", source_stage, ": ", address.DebugString()));
  }
  return absl::OkStatus();
}

absl::StatusOr<WireTensor> Mailbox::Take(int source_stage, const TensorAddress& address,
                                         absl::Duration timeout) {
  const Key key{source_stage, address};
  AnnotatedMutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return shut_down_ || aborted_jobs_.count(address.job_id) > 0 || tensors_.count(key) > 0;
  };
  mu_.AwaitWithTimeout(ready, timeout);
  if (shut_down_) return absl::AbortedError("transport shut down");
  if (aborted_jobs_.count(address.job_id) > 0) {
    return absl::AbortedError(absl::StrCat("job ", address.job_id, " was stopped"));
  }
  auto it = tensors_.find(key);
  if (it == tensors_.end()) {
    return absl::DeadlineExceededError(
        absl::StrCat("waited ", absl::FormatDuration(timeout), " for ", address.DebugString(),
                     " from stage ", source_stage,
                     "; that stage is slow, stalled or gone: check its "
                     "status and log"));
  }
  WireTensor wire = std::move(it->second);
  tensors_.erase(it);
  return wire;
}

void Mailbox::Shutdown() {
  AnnotatedMutexLock lock(&mu_);
  shut_down_ = true;
}

void Mailbox::DropJob(const std::string& job_id) {
  AnnotatedMutexLock lock(&mu_);
  for (auto it = tensors_.begin(); it != tensors_.end();) {
    it = it->first.second.job_id == job_id ? tensors_.erase(it) : std::next(it);
  }
}

void Mailbox::AbortJob(const std::string& job_id) {
  DropJob(job_id);
  AnnotatedMutexLock lock(&mu_);
  aborted_jobs_.insert(job_id);
}

size_t Mailbox::size() const {
  AnnotatedMutexLock lock(&mu_);
  return tensors_.size();
}

}  // namespace pipetrain
