#include "worker/runtime/in_process_device_collective.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace pipetrain {

class InProcessDeviceCollective final : public DeviceCollective {
 public:
  InProcessDeviceCollective(InProcessCollectiveHub* hub, int rank) : hub_(hub), rank_(rank) {}

  absl::Status AllReduceSum(const std::vector<Tensor*>& tensors) override {
    return hub_->Contribute(rank_, next_seq_++, tensors);
  }
  absl::Status AwaitSums() override { return Check(); }
  absl::Status Flush(absl::Duration, const std::function<bool()>&) override { return Check(); }
  void Abort() override { hub_->Abort(); }

 private:
  absl::Status Check() const {
    if (!hub_->aborted()) return absl::OkStatus();
    return absl::AbortedError(absl::StrCat("replica collective of member ", rank_, " was aborted"));
  }

  InProcessCollectiveHub* hub_;
  const int rank_;
  int64_t next_seq_ = 0;  // the job thread's
};

InProcessCollectiveHub::InProcessCollectiveHub(int members, absl::Duration timeout)
    : members_(members), timeout_(timeout) {}

std::unique_ptr<DeviceCollective> InProcessCollectiveHub::CollectiveFor(int rank) {
  PT_CHECK(rank >= 0 && rank < members_) << "member " << rank << " of " << members_;
  return std::make_unique<InProcessDeviceCollective>(this, rank);
}

int64_t InProcessCollectiveHub::sums() const {
  AnnotatedMutexLock lock(&mu_);
  return sums_;
}

int64_t InProcessCollectiveHub::floats() const {
  AnnotatedMutexLock lock(&mu_);
  return floats_;
}

bool InProcessCollectiveHub::aborted() const {
  AnnotatedMutexLock lock(&mu_);
  return aborted_;
}

void InProcessCollectiveHub::Abort() {
  AnnotatedMutexLock lock(&mu_);
  aborted_ = true;
}

absl::Status InProcessCollectiveHub::Contribute(int rank, int64_t seq,
                                                const std::vector<Tensor*>& tensors) {
  std::vector<float> part;
  for (const Tensor* t : tensors) {
    if (t == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("replica collective of member ", rank, ": a null tensor in sum ", seq));
    }
    if (t->on_device()) {
      return absl::InvalidArgumentError("the in-process replica collective sums host tensors only");
    }
    part.insert(part.end(), t->data(), t->data() + t->numel());
  }
  AnnotatedMutexLock lock(&mu_);
  if (aborted_) {
    return absl::AbortedError(absl::StrCat("replica collective of member ", rank, " was aborted"));
  }
  Sum& sum = pending_[seq];
  sum.parts.resize(members_);
  sum.parts[rank] = std::move(part);
  if (++sum.arrived == members_) {
    // Member order: every member gets these floats.
    sum.total = sum.parts[0];
    for (int m = 1; m < members_ && sum.status.ok(); ++m) {
      if (sum.parts[m].size() != sum.total.size()) {
        sum.status = absl::InvalidArgumentError(absl::StrCat(
            "replica collective sum ", seq, ": member 0 gave ", sum.total.size(),
            " floats, member ", m, " ", sum.parts[m].size(), " (the replicas disagree)"));
        break;
      }
      for (size_t i = 0; i < sum.total.size(); ++i) sum.total[i] += sum.parts[m][i];
    }
    sum.done = true;
    ++sums_;
    floats_ += static_cast<int64_t>(sum.total.size());
  }
  auto ready = [this, &sum]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return aborted_ || sum.done; };
  const bool arrived = mu_.AwaitWithTimeout(ready, timeout_);
  if (aborted_) {
    return absl::AbortedError(absl::StrCat("replica collective of member ", rank, " was aborted"));
  }
  if (!arrived) {
    return absl::DeadlineExceededError(
        absl::StrCat("replica collective sum ", seq, ": ", members_ - sum.arrived, " of ", members_,
                     " members did not come within ", absl::FormatDuration(timeout_)));
  }
  const absl::Status status = sum.status;
  if (status.ok()) {
    size_t offset = 0;
    for (Tensor* t : tensors) {
      std::memcpy(t->data(), sum.total.data() + offset,
                  static_cast<size_t>(t->numel()) * sizeof(float));
      offset += static_cast<size_t>(t->numel());
    }
  }
  if (++sum.taken == members_) pending_.erase(seq);
  return status;
}

}  // namespace pipetrain
