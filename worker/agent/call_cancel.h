// CallCancel: lets one thread cancel a blocking call another thread makes
// (JobRunner::Stop cancelling the weights upload of its runner thread,
// which gRPC's flow control can hold for as long as its deadline when the
// coordinator's host vanished). The calling thread wraps its call in a
// CallCancel::Scope that says how to cancel it (for gRPC, the call's
// ClientContext::TryCancel); Cancel() runs that now, and makes every
// later Scope inactive (the call is then not started). Thread-safe.
#ifndef PIPETRAIN_WORKER_AGENT_CALL_CANCEL_H_
#define PIPETRAIN_WORKER_AGENT_CALL_CANCEL_H_

#include <functional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "common/annotated_mutex.h"

namespace pipetrain {

class CallCancel {
 public:
  // Cancels the call in flight, if any (its canceller runs on this thread,
  // under this object's lock: it must not block), and every later one.
  void Cancel() {
    AnnotatedMutexLock lock(&mu_);
    cancelled_ = true;
    if (cancel_) cancel_();
  }
  bool cancelled() const {
    AnnotatedMutexLock lock(&mu_);
    return cancelled_;
  }

  // Registers `cancel` for the caller's call while it lives; the call must
  // outlive it (declare the scope after what `cancel` touches). Inactive
  // (nothing registered) when `owner` is null or already cancelled.
  class Scope {
   public:
    Scope(CallCancel* owner, std::function<void()> cancel) : owner_(owner) {
      if (owner_ == nullptr) return;
      AnnotatedMutexLock lock(&owner_->mu_);
      if (owner_->cancelled_) {
        active_ = false;
        return;
      }
      owner_->cancel_ = std::move(cancel);
    }
    ~Scope() {
      if (owner_ == nullptr || !active_) return;
      AnnotatedMutexLock lock(&owner_->mu_);  // waits out a Cancel running it
      owner_->cancel_ = nullptr;
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    // False: cancelled before the call began; do not start it.
    bool active() const { return active_; }

   private:
    CallCancel* const owner_;
    bool active_ = true;
  };

 private:
  mutable AnnotatedMutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> cancel_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_AGENT_CALL_CANCEL_H_
