// SendQueue: the stage runtime's sends, run in the background in the order
// they were queued (the CUDA issue, scope 3: compute overlaps sends).
//
// The interpreter queues a send (its host copy already started, backend.h
// StartDownload) and goes on with the next instruction; the queue's thread
// waits for the copy, encodes it and hands it to the transport. One thread,
// FIFO, so the sends of a link leave in program order and the link's codec
// state (error feedback, PowerSGD's Q) sees them in that order, exactly as
// when the interpreter sent them itself.
//
// Errors: the first failing task's error sticks: tasks queued after it are
// dropped unrun (the run has failed; a later send of the same link would
// carry codec state the failed one left half-updated), Enqueue returns the
// error instead of queueing, and Drain clears it, returning it unless an
// Enqueue did already: each error is reported once.
//
//   SendQueue sends;
//   RETURN_IF_ERROR(sends.Enqueue([=] { return transport->SendWire(...); }));
//   ...
//   RETURN_IF_ERROR(sends.Drain());  // every queued send handed over
//
// Memory: each task may say how many bytes it holds until it has run (a
// send's host copy); AwaitQueuedBytesAtMost paces a producer by them, so
// compute cannot run a whole pass ahead of a slow link, each queued send
// holding a copy.
//
// Thread-safe. The destructor waits for every queued task.
#ifndef PIPETRAIN_WORKER_RUNTIME_SEND_QUEUE_H_
#define PIPETRAIN_WORKER_RUNTIME_SEND_QUEUE_H_

#include <cstdint>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "common/annotated_mutex.h"
#include "common/serial_executor.h"

namespace pipetrain {

class SendQueue {
 public:
  using Task = std::function<absl::Status()>;

  SendQueue() = default;
  ~SendQueue() = default;  // executor_ runs what is queued, then joins
  SendQueue(const SendQueue&) = delete;
  SendQueue& operator=(const SendQueue&) = delete;

  // Queues `task`, which holds `bytes` (>= 0) of memory until it has run
  // (queued_bytes(); the task and what it captured are freed before they
  // stop counting). Returns the stuck error of an earlier task instead
  // (the task is then not queued) so a failing run stops queueing early.
  absl::Status Enqueue(Task task, int64_t bytes = 0);

  // Waits until every queued task has run. Returns the first error since
  // the last Drain (and clears it) unless an Enqueue returned it already,
  // else OK.
  absl::Status Drain();

  // The stuck error of a task that failed, reported now (as Enqueue
  // reports it: Drain then returns OK); OK when none has failed.
  absl::Status TakeError();

  // Waits until at most `most` (>= 0) tasks are queued and not yet
  // finished: paces a producer nothing else paces (the forward-only
  // validation pass), so its queued sends, each holding a host copy, stay
  // few. Errors are not taken: Enqueue or Drain report them as ever.
  void AwaitPendingAtMost(int64_t most);

  // Waits until the tasks queued and not yet finished hold at most `most`
  // (>= 0) bytes, or at most one is left: paces a producer by memory (the
  // training pass), whatever its tensors' sizes. One task larger than
  // `most` alone does not wait (each would otherwise wait for the one
  // before it), so on return the queue holds at most max(`most`, one
  // task's bytes). Errors are not taken, as AwaitPendingAtMost.
  void AwaitQueuedBytesAtMost(int64_t most);

  // Tasks queued and not yet finished.
  int64_t pending() const;

  // The bytes those tasks hold (Enqueue).
  int64_t queued_bytes() const;

 private:
  mutable AnnotatedMutex mu_;
  int64_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  bool error_returned_ ABSL_GUARDED_BY(mu_) = false;  // by an Enqueue
  SerialExecutor executor_;  // last: destroyed (joined) before the fields above
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_RUNTIME_SEND_QUEUE_H_
