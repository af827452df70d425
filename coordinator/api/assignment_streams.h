// The server side of WatchAssignments: one write stream per watching worker,
// fed from the AssignmentHub.
//
// A stream first writes the worker's current assignment (if it has one), then
// every newer one. Assignments are state, not events: when several change
// while a write is in flight, only the latest is sent next. One write is
// outstanding at a time; reactions never block (the hub's subscriber callback
// and OnWriteDone only look up the hub and start a write).
//
// A stream ends with
//   ABORTED      when a newer incarnation of its worker registers or opens a
//                stream (the old incarnation is gone: the worker re-registers),
//   UNAVAILABLE  after Shutdown (the coordinator is stopping; retry later),
//   CANCELLED    when the client goes away: the worker's process exited or
//                its connection broke. The set's WatcherGoneListener then
//                hears of it at once (a worker's death is known long before
//                its lease runs out; DESIGN.md §11 recovery time).
// A stream superseded (ABORTED) while a write is in flight does not wait for
// the client to take that write: its call is cancelled (the client sees
// CANCELLED), since a client that grants no flow-control window would
// otherwise keep the stream, its subscription and its message, one more
// per reopen. At shutdown the write is waited for (the server's shutdown
// deadline bounds it): the client is told UNAVAILABLE and moves on.
//
// Thread-safe. Lock order: a stream's lock before the hub's; the set's lock
// is never held while calling into a stream.
#ifndef PIPETRAIN_COORDINATOR_API_ASSIGNMENT_STREAMS_H_
#define PIPETRAIN_COORDINATOR_API_ASSIGNMENT_STREAMS_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "common/annotated_mutex.h"
#include "coordinator/jobs/assignment_hub.h"
#include "proto/pipetrain/v1/plan.pb.h"

namespace pipetrain {

class AssignmentStream;

class AssignmentStreams {
 public:
  // Called (outside every lock) when a watcher cancels its stream, not
  // after Shutdown.
  using WatcherGoneListener =
      std::function<void(const std::string& worker_id, int64_t incarnation)>;
  // Cancels one stream's call: the method's `context->TryCancel()`. Called
  // at most once, with the stream's lock held, and only while a write is in
  // flight, so before the call's Finish (its context is alive). It must not
  // run a reaction of the stream inline (gRPC's TryCancel does not).
  using CallCanceller = std::function<void()>;

  // `hub` is not owned and must outlive every stream (the grpc::Server's
  // Shutdown waits for them).
  explicit AssignmentStreams(AssignmentHub* hub, WatcherGoneListener on_gone = nullptr);
  AssignmentStreams(const AssignmentStreams&) = delete;
  AssignmentStreams& operator=(const AssignmentStreams&) = delete;

  // Opens a stream for `worker_id` at `incarnation`, which the caller has
  // validated against the registry, and ends the worker's other streams
  // (ABORTED), of older incarnations and of this one: a worker watches on
  // one stream, and each held a copy of its assignment, so a worker that
  // opened them by the thousand made the coordinator's memory grow without
  // end. An ended stream is no lost watcher (WatcherGone is not called).
  // After Shutdown the stream ends at once with UNAVAILABLE. `cancel`
  // cancels the call when it is superseded with a write in flight; without one
  // (nullptr) such a stream stays until the client takes that write, so a
  // gRPC method passes `[context] { context->TryCancel(); }`. Returns the
  // reactor for the gRPC method to return; it writes each assignment
  // serialized (a raw method's stream).
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Open(const std::string& worker_id,
                                                   int64_t incarnation,
                                                   CallCanceller cancel = nullptr);

  // Ends the streams of `worker_id` whose incarnation is older than
  // `incarnation`, or also of `incarnation` itself when `same_too`
  // (ABORTED, naming why).
  void Supersede(const std::string& worker_id, int64_t incarnation, bool same_too = false);

  // Ends every stream with UNAVAILABLE and makes later Opens do the same.
  // Call before grpc::Server::Shutdown, which otherwise waits forever for
  // streams that never end. Idempotent.
  void Shutdown();

  // Streams not yet done (for tests and diagnostics).
  int size() const;

 private:
  friend class AssignmentStream;
  void Remove(const AssignmentStream* stream);
  void WatcherGone(const std::string& worker_id, int64_t incarnation);

  AssignmentHub* const hub_;
  const WatcherGoneListener on_gone_;
  mutable AnnotatedMutex mu_;
  // Live streams by address; weak so that a stream's lifetime stays its own.
  std::map<const AssignmentStream*, std::weak_ptr<AssignmentStream>> streams_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_API_ASSIGNMENT_STREAMS_H_
