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
// Thread-safe, like absl::Mutex. Exclusive locking only.
#ifndef PIPETRAIN_COMMON_ANNOTATED_MUTEX_H_
#define PIPETRAIN_COMMON_ANNOTATED_MUTEX_H_

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
    Releasing();
    mu_.Unlock();
  }

  // Releases the mutex until `pred()` holds or `timeout` of real time has
  // passed, then holds it again. Returns whether `pred()` holds. `pred` must
  // be a `bool() const` callable; Abseil evaluates it with the mutex held,
  // possibly on another thread (the one unlocking), so it must only read
  // guarded state and must not block.
  template <typename Pred>
  bool AwaitWithTimeout(const Pred& pred, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    Check<Pred> check{this, &pred};
    Releasing();
    const bool met = mu_.AwaitWithTimeout(absl::Condition(&Check<Pred>::Eval, &check), timeout);
    Acquired();
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
