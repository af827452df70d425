#include "worker/transport/shaped_transport.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/time/clock.h"

namespace pipetrain {
namespace {

// The emulated links keep time by a monotonic clock: a wall clock stepped
// back (NTP) would hold every later message by the step.
absl::Time MonotonicNow() {
  return absl::UnixEpoch() + absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

}  // namespace

absl::Time LinkShaper::Schedule(absl::Time now, int64_t bytes) {
  const absl::Time start = std::max(now, done_);
  done_ = start + absl::Seconds(double(bytes) / model_.bandwidth_bytes_per_second);
  return done_ + model_.latency;
}

ShapedTransport::ShapedTransport(std::unique_ptr<Transport> inner, LinkModel model,
                                 int64_t max_queued_bytes)
    : inner_(std::move(inner)), model_(model), max_queued_bytes_(max_queued_bytes) {}

ShapedTransport::~ShapedTransport() {
  std::vector<Link*> links;
  {
    AnnotatedMutexLock lock(&mu_);
    stopping_ = true;  // no new link from now on
    for (auto& [peer, link] : links_) links.push_back(link.get());
  }
  // Each thread delivers what its link has queued, then ends.
  for (Link* link : links) {
    if (link->thread.joinable()) link->thread.join();
  }
}

absl::Status ShapedTransport::SendWire(int peer_stage, const TensorAddress& address,
                                       const WireTensor& wire) {
  WireTensor copy = wire;                                  // an encoded payload is copied here
  if (!copy.encoded()) copy.tensor = wire.tensor.Clone();  // the caller may reuse its tensor
  return Enqueue(peer_stage, address, std::move(copy));
}

absl::Status ShapedTransport::SendWireOwned(int peer_stage, const TensorAddress& address,
                                            WireTensor wire) {
  // Another handle to the tensor could write it while it waits in the queue.
  if (!wire.encoded() && !wire.tensor.sole_owner()) wire.tensor = wire.tensor.Clone();
  return Enqueue(peer_stage, address, std::move(wire));
}

absl::Status ShapedTransport::Enqueue(int peer_stage, const TensorAddress& address,
                                      WireTensor wire) {
  AnnotatedMutexLock lock(&mu_);
  if (stopping_ || aborted_) return absl::AbortedError("shaped transport stopping");
  std::unique_ptr<Link>& slot = links_[peer_stage];
  if (slot == nullptr) {
    slot = std::make_unique<Link>(model_);
    Link* link = slot.get();
    link->thread = std::thread([this, peer_stage, link] { Run(peer_stage, link); });
  }
  Link* link = slot.get();
  if (!link->error.ok()) return std::exchange(link->error, absl::OkStatus());
  const int64_t bytes = wire.wire_bytes();
  // Room for it (one larger than the bound passes alone), unless the
  // transport stops or a handoff fails meanwhile: no room may ever come then.
  auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return link->queued_bytes == 0 || link->queued_bytes + bytes <= max_queued_bytes_ ||
           stopping_ || aborted_ || !link->error.ok();
  };
  if (!room()) {
    ++sends_waiting_;
    mu_.AwaitWithTimeout(room, absl::InfiniteDuration());
    --sends_waiting_;
  }
  if (stopping_ || aborted_) return absl::AbortedError("shaped transport stopping");
  // The queue ahead was dropped for this error (Run): report it, as a Send
  // arriving after it would, instead of queueing behind it.
  if (!link->error.ok()) return std::exchange(link->error, absl::OkStatus());
  Pending p{address, std::move(wire), link->shaper.Schedule(MonotonicNow(), bytes), bytes};
  link->queued_bytes += bytes;
  link->queue.push_back(std::move(p));
  return absl::OkStatus();
}

absl::StatusOr<WireTensor> ShapedTransport::RecvWire(int peer_stage, const TensorAddress& address,
                                                     absl::Duration timeout) {
  absl::StatusOr<WireTensor> wire = inner_->RecvWire(peer_stage, address, timeout);
  if (!absl::IsDeadlineExceeded(wire.status())) return wire;
  int64_t queued = 0;
  std::string send_failed;  // a handoff to that stage failed (Run): the likelier cause
  {
    AnnotatedMutexLock lock(&mu_);
    auto it = links_.find(peer_stage);
    if (it != links_.end() && it->second != nullptr) {
      queued = it->second->queued_bytes;
      // Copied as text: the Send that reports the error owns it alone (Run).
      if (!it->second->error.ok()) send_failed = it->second->error.ToString();
    }
  }
  if (!send_failed.empty()) {
    return absl::DeadlineExceededError(
        absl::StrCat(wire.status().message(), "; this worker's own send to stage ", peer_stage,
                     " failed meanwhile: ", send_failed));
  }
  return WithOwnQueuedSends(wire.status(), peer_stage, queued, "on its emulated link");
}

void ShapedTransport::Abort() {
  {
    AnnotatedMutexLock lock(&mu_);
    aborted_ = true;  // wakes the Sends waiting for room
    for (auto& [peer, link] : links_) {
      for (const Pending& p : link->queue) link->queued_bytes -= p.bytes;
      link->queue.clear();  // a message already taken by Run finishes alone
    }
  }
  inner_->Abort();
}

bool ShapedTransport::AwaitSendsWaiting(int count, absl::Duration timeout) {
  AnnotatedMutexLock lock(&mu_);
  auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return sends_waiting_ == count; };
  return mu_.AwaitWithTimeout(reached, timeout);
}

bool ShapedTransport::AwaitHandoffsWaiting(int count, absl::Duration timeout) {
  AnnotatedMutexLock lock(&mu_);
  auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return handoffs_waiting_ == count; };
  return mu_.AwaitWithTimeout(reached, timeout);
}

void ShapedTransport::Run(int peer_stage, Link* link) {
  while (true) {
    Pending next;
    {
      AnnotatedMutexLock lock(&mu_);
      mu_.AwaitWithTimeout(
          [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !link->queue.empty() || stopping_; },
          absl::InfiniteDuration());
      if (link->queue.empty()) return;  // stopping, all delivered
      next = std::move(link->queue.front());
      link->queue.pop_front();
    }
    const absl::Duration wait = next.handoff - MonotonicNow();
    if (wait > absl::ZeroDuration()) {
      // The emulated link's time, which Abort cuts short: at a slow
      // emulated rate one message can take hours, and the destructor joins
      // this thread.
      AnnotatedMutexLock lock(&mu_);
      ++handoffs_waiting_;
      const bool aborted = mu_.AwaitWithTimeout(
          [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return aborted_; }, wait);
      --handoffs_waiting_;
      if (aborted) {
        link->queued_bytes -= next.bytes;  // dropped, as Abort drops the queue
        continue;
      }
    }
    // Its own (Enqueue's contract): the inner transport need not copy it.
    absl::Status sent = inner_->SendWireOwned(peer_stage, next.address, std::move(next.wire));
    AnnotatedMutexLock lock(&mu_);
    link->queued_bytes -= next.bytes;
    if (sent.ok()) continue;
    // Moved, not shared: the Send that reports it owns it alone (Debian's
    // Abseil counts a shared Status's references where TSan cannot see).
    if (link->error.ok()) link->error = std::move(sent);
    // The peer is unreachable: each of the queued messages would most
    // likely fail the same way, each after the inner transport's own
    // timeout (a connect can take 10 s), which would hold up the senders
    // and the destructor for (queued messages) x timeout. They are dropped
    // instead; the next Send reports the error.
    link->queue.clear();
    link->queued_bytes = 0;
  }
}

}  // namespace pipetrain
