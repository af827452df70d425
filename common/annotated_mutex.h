// An absl::Mutex whose hand-offs ThreadSanitizer can see.
//
// Debian's Abseil is compiled without TSan, so TSan never sees absl::Mutex
// lock and unlock: every field guarded by one looks racy, and a real race
// cannot be told from the noise. AnnotatedMutex wraps absl::Mutex and, in TSan
// builds only, reports each hand-off with __tsan_release / __tsan_acquire on
// the mutex's address. In other builds it is a plain absl::Mutex.
//
// It carries the same clang thread-safety attributes, so fields declare
// ABSL_GUARDED_BY(mu_) and -Wthread-safety checks them as usual.
//
//   AnnotatedMutex mu_;
//   int ready_ ABSL_GUARDED_BY(mu_);
//   ...
//   AnnotatedMutexLock lock(&mu_);
//   auto enough = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ready_ >= 3; };
//   bool met = mu_.AwaitWithTimeout(enough, absl::Seconds(1));
//
// Timed waits run on the monotonic clock. Debian's Abseil (20220623) turns
// a timeout into a wall-clock deadline (now + timeout, waited for in a
// CLOCK_REALTIME futex): a step of the system clock back by S (NTP's
// makestep at boot, a VM resumed, `date -s`) lengthened every wait under
// way by S, so a worker's heartbeat went unsent for S and its lease ran
// out, a leader's lease renewal stopped and etcd expired it. Here a timed
// wait sleeps on a std::condition_variable against std::chrono's
// steady_clock (pthread_cond_clockwait with CLOCK_MONOTONIC), and a thread
// releasing the mutex evaluates the predicates of those waiting, as Abseil
// does for its own waits, and wakes each whose predicate now holds.
//
// Thread-safe, like absl::Mutex. Exclusive locking only.
#ifndef PIPETRAIN_COMMON_ANNOTATED_MUTEX_H_
#define PIPETRAIN_COMMON_ANNOTATED_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/config.h"
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#ifdef ABSL_HAVE_THREAD_SANITIZER
#include <sanitizer/tsan_interface.h>
#endif

namespace pipetrain {

class ABSL_LOCKABLE AnnotatedMutex {
 public:
  AnnotatedMutex() = default;
  AnnotatedMutex(const AnnotatedMutex&) = delete;
  AnnotatedMutex& operator=(const AnnotatedMutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    mu_.Lock();
    Acquired();
  }
  // Takes the mutex if it is free; never waits.
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) {
    if (!mu_.TryLock()) return false;
    Acquired();
    return true;
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    WakeTimedWaiters();
    Releasing();
    mu_.Unlock();
  }

  // Releases the mutex until `pred()` holds or `timeout` has passed on the
  // monotonic clock (a step of the wall clock neither lengthens nor
  // shortens it), then holds it again. Returns whether `pred()` holds.
  // `pred` must be a `bool() const` callable; it is evaluated with the
  // mutex held, possibly on another thread (the one unlocking), so it must
  // only read guarded state and must not block. An infinite timeout waits
  // on Abseil's untimed Await (no clock involved).
  template <typename Pred>
  bool AwaitWithTimeout(const Pred& pred, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    Check<Pred> check{this, &pred};
    if (Check<Pred>::Eval(&check)) return true;
    if (timeout <= absl::ZeroDuration()) return false;
    if (timeout >= kUntimed) {
      WakeTimedWaiters();  // Abseil releases the mutex while it waits
      Releasing();
      mu_.Await(absl::Condition(&Check<Pred>::Eval, &check));
      Acquired();
      return true;
    }
    const std::chrono::steady_clock::time_point deadline =
        std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
    TimedWaiter waiter;
    waiter.eval = &EvalErased<Pred>;
    waiter.check = &check;
    waiter.next = timed_waiters_;
    timed_waiters_ = &waiter;
    bool met = false;
    for (;;) {
      WakeTimedWaiters();  // this thread may have made another's predicate true
      {
        std::unique_lock<std::mutex> wait_lock(waiter.wake_mu);
        waiter.woken = false;
        Releasing();
        mu_.Unlock();
        waiter.wake.wait_until(wait_lock, deadline, [&waiter] { return waiter.woken; });
      }
      mu_.Lock();
      Acquired();
      met = Check<Pred>::Eval(&check);
      if (met || std::chrono::steady_clock::now() >= deadline) break;
    }
    TimedWaiter** link = &timed_waiters_;
    while (*link != &waiter) link = &(*link)->next;
    *link = waiter.next;
    return met;
  }

 private:
  // Evaluates a predicate as its own acquire/release pair: when Abseil runs
  // it on the unlocking thread, TSan then orders the predicate's reads before
  // the next holder's writes.
  template <typename Pred>
  struct Check {
    const AnnotatedMutex* mu;
    const Pred* pred;
    // Abseil calls this with mu held; the analysis cannot see that.
    static bool Eval(Check* check) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      check->mu->Acquired();
      const bool result = (*check->pred)();
      check->mu->Releasing();
      return result;
    }
  };
  template <typename Pred>
  static bool EvalErased(void* check) {
    return Check<Pred>::Eval(static_cast<Check<Pred>*>(check));
  }

  // A timeout at least this long is no deadline: about 100 years, far
  // from steady_clock's overflow (292 years of nanoseconds).
  static constexpr absl::Duration kUntimed = absl::Hours(24 * 365 * 100);

  // A thread in a timed AwaitWithTimeout, on its own stack; listed (under
  // the mutex) from before it releases the mutex until it holds it again.
  struct TimedWaiter {
    bool (*eval)(void*);  // the predicate, through its Check (EvalErased)
    void* check;
    TimedWaiter* next = nullptr;
    // Set, under wake_mu, by an unlocking thread that found the predicate
    // true. wake_mu is taken while the mutex is held (both sides), never
    // the other way round.
    std::mutex wake_mu;
    std::condition_variable wake;
    bool woken = false;
  };

  // With the mutex held, about to release it: wakes each timed waiter whose
  // predicate holds now. (Predicates read only guarded state, which
  // changes only under the mutex, so every change is seen here before any
  // other thread can act on it.)
  void WakeTimedWaiters() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (TimedWaiter* waiter = timed_waiters_; waiter != nullptr; waiter = waiter->next) {
      if (!waiter->eval(waiter->check)) continue;
      std::lock_guard<std::mutex> wake_lock(waiter->wake_mu);
      waiter->woken = true;
      waiter->wake.notify_one();
    }
  }

  void Acquired() const {
#ifdef ABSL_HAVE_THREAD_SANITIZER
    __tsan_acquire(const_cast<AnnotatedMutex*>(this));
#endif
  }
  void Releasing() const {
#ifdef ABSL_HAVE_THREAD_SANITIZER
    __tsan_release(const_cast<AnnotatedMutex*>(this));
#endif
  }

  absl::Mutex mu_;
  TimedWaiter* timed_waiters_ ABSL_GUARDED_BY(this) = nullptr;
};

// Holds an AnnotatedMutex for the enclosing scope (like absl::MutexLock).
class ABSL_SCOPED_LOCKABLE AnnotatedMutexLock {
 public:
  explicit AnnotatedMutexLock(AnnotatedMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  ~AnnotatedMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  AnnotatedMutexLock(const AnnotatedMutexLock&) = delete;
  AnnotatedMutexLock& operator=(const AnnotatedMutexLock&) = delete;

 private:
  AnnotatedMutex* const mu_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_ANNOTATED_MUTEX_H_
