#include "worker/runtime/in_process_device_channel.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"

namespace pipetrain {

class InProcessDeviceChannel final : public DeviceChannel {
 public:
  InProcessDeviceChannel(InProcessDeviceHub* hub, int stage) : hub_(hub), stage_(stage) {}

  absl::Status Send(int peer_stage, const Tensor& t) override {
    return hub_->Put(stage_, peer_stage, t);
  }
  absl::StatusOr<Tensor> Recv(int peer_stage, const Shape& shape) override {
    return hub_->Take(peer_stage, stage_, shape);
  }
  absl::Status Flush(absl::Duration timeout, const std::function<bool()>& cancelled) override {
    return hub_->Drain(stage_, timeout, cancelled);
  }
  void Abort() override { hub_->Abort(); }

 private:
  InProcessDeviceHub* hub_;
  int stage_;
};

InProcessDeviceHub::InProcessDeviceHub(int num_stages, absl::Duration recv_timeout)
    : num_stages_(num_stages), recv_timeout_(recv_timeout) {}

std::unique_ptr<DeviceChannel> InProcessDeviceHub::ChannelFor(int stage) {
  PT_CHECK(stage >= 0 && stage < num_stages_) << "stage " << stage << " of " << num_stages_;
  return std::make_unique<InProcessDeviceChannel>(this, stage);
}

int64_t InProcessDeviceHub::sent() const {
  AnnotatedMutexLock lock(&mu_);
  return sent_;
}

int64_t InProcessDeviceHub::in_flight() const {
  AnnotatedMutexLock lock(&mu_);
  return in_flight_;
}

bool InProcessDeviceHub::aborted() const {
  AnnotatedMutexLock lock(&mu_);
  return aborted_;
}

int64_t InProcessDeviceHub::PendingFromLocked(int from) const {
  int64_t pending = 0;
  for (const auto& [pair, queue] : queues_) {
    if (pair.first == from) pending += static_cast<int64_t>(queue.size());
  }
  return pending;
}

absl::Status InProcessDeviceHub::Drain(int from, absl::Duration timeout,
                                       const std::function<bool()>& cancelled) {
  const absl::Time deadline = MonotonicClock()->Now() + timeout;
  while (true) {
    int64_t left = 0;
    {
      AnnotatedMutexLock lock(&mu_);
      auto drained = [this, from]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return aborted_ || PendingFromLocked(from) == 0;
      };
      const absl::Duration slice =
          std::max(absl::ZeroDuration(),
                   std::min(absl::Milliseconds(10), deadline - MonotonicClock()->Now()));
      const bool done = mu_.AwaitWithTimeout(drained, slice);
      if (aborted_) {
        return absl::AbortedError(absl::StrCat("device channel of stage ", from, " was aborted"));
      }
      if (done) return absl::OkStatus();
      left = PendingFromLocked(from);
    }
    if (MonotonicClock()->Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("device channel of stage ", from, ": ", left,
                                                      " sent tensor(s) not taken within ",
                                                      absl::FormatDuration(timeout)));
    }
    if (cancelled != nullptr && cancelled()) {
      return absl::CancelledError(
          absl::StrCat("device channel of stage ", from, ": flush cancelled"));
    }
  }
}

void InProcessDeviceHub::Abort() {
  AnnotatedMutexLock lock(&mu_);
  aborted_ = true;
}

namespace {

absl::Status Aborted(int from, int to) {
  return absl::AbortedError(
      absl::StrCat("device channel from stage ", from, " to stage ", to, " was aborted"));
}

}  // namespace

absl::Status InProcessDeviceHub::Put(int from, int to, const Tensor& t) {
  if (to == from || to < 0 || to >= num_stages_) {
    return absl::InvalidArgumentError(
        absl::StrCat("device channel of stage ", from, ": no peer stage ", to));
  }
  // A copy, as a device-to-device transfer makes one: later writes by the
  // sender do not reach the receiver.
  Tensor copy = t.Clone();
  AnnotatedMutexLock lock(&mu_);
  if (aborted_) return Aborted(from, to);
  queues_[{from, to}].push_back(std::move(copy));
  ++sent_;
  ++in_flight_;
  return absl::OkStatus();
}

absl::StatusOr<Tensor> InProcessDeviceHub::Take(int from, int to, const Shape& shape) {
  if (from == to || from < 0 || from >= num_stages_) {
    return absl::InvalidArgumentError(
        absl::StrCat("device channel of stage ", to, ": no peer stage ", from));
  }
  AnnotatedMutexLock lock(&mu_);
  std::deque<Tensor>& queue = queues_[{from, to}];
  auto ready = [this, &queue]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return aborted_ || !queue.empty(); };
  const bool arrived = mu_.AwaitWithTimeout(ready, recv_timeout_);
  if (aborted_) return Aborted(from, to);
  if (!arrived) {
    return absl::DeadlineExceededError(absl::StrCat("device channel: nothing from stage ", from,
                                                    " to stage ", to, " within ",
                                                    absl::FormatDuration(recv_timeout_)));
  }
  Tensor t = std::move(queue.front());
  queue.pop_front();
  --in_flight_;
  if (t.numel() != NumElements(shape)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device channel: stage ", from, " sent ", ShapeToString(t.shape()), " to stage ", to,
        ", which expected ", ShapeToString(shape), " (the two programs disagree on the order)"));
  }
  return t.Reshape(shape);
}

}  // namespace pipetrain
