#include "coordinator/api/assignment_streams.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/raw_request.h"

namespace pipetrain {

// One WatchAssignments call. Owned by itself (self_) from Start until OnDone;
// the hub's subscriber holds only a weak reference, so a notification racing
// with OnDone either sees the stream finished or finds it gone.
//
// Finish is deferred while a write is in flight and issued from its
// OnWriteDone, so the stream never has two operations outstanding. A
// superseding End that finds a write in flight cancels the call, so that
// OnWriteDone(false) comes even from a client that never reads.
class AssignmentStream final : public grpc::ServerWriteReactor<grpc::ByteBuffer>,
                               public std::enable_shared_from_this<AssignmentStream> {
 public:
  AssignmentStream(AssignmentHub* hub, AssignmentStreams* owner, std::string worker_id,
                   int64_t incarnation, AssignmentStreams::CallCanceller cancel)
      : hub_(hub),
        owner_(owner),
        worker_id_(std::move(worker_id)),
        incarnation_(incarnation),
        cancel_(std::move(cancel)) {}

  // Takes ownership of itself until OnDone. Then, unless the set was shut
  // down, subscribes to the hub and sends the current assignment; otherwise
  // ends at once without sending anything. Call once, on a stream held by a
  // shared_ptr.
  void Start(bool shut_down) {
    std::weak_ptr<AssignmentStream> weak = weak_from_this();
    {
      AnnotatedMutexLock lock(&mu_);
      self_ = shared_from_this();
      if (!shut_down) {
        subscription_ = hub_->Subscribe(worker_id_, [weak] {
          if (std::shared_ptr<AssignmentStream> stream = weak.lock()) stream->Pump();
        });
      }
    }
    if (shut_down) {
      End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is shutting down"));
      return;
    }
    Pump();  // after subscribing: an assignment set in between is not missed
  }

  const std::string& worker_id() const { return worker_id_; }
  int64_t incarnation() const { return incarnation_; }

  // Ends the stream with `status` once the write in flight (if any) is done.
  // With `cancel_write` (a superseded stream) that write is cancelled, not
  // waited for: a client that grants no window never completes it, and a
  // superseded stream kept its subscription and message, one more per
  // reopen (its client, which has moved on, sees CANCELLED). Not at
  // shutdown: the server's own shutdown deadline ends such calls, and a
  // worker told UNAVAILABLE moves on to the next coordinator, where
  // CANCELLED would keep it on this one. The first status wins; later calls
  // do nothing (so the OnWriteDone(false) and OnCancel that a cancel brings
  // report no lost watcher). Returns whether this call ended it.
  bool End(grpc::Status status, bool cancel_write = false) {
    {
      AnnotatedMutexLock lock(&mu_);
      if (end_status_.has_value()) return false;
      end_status_ = status;
      if (writing_) {
        // Under mu_: while the write is in flight the call is not finished
        // (OnDone, after which the context is gone, is still to come), and
        // the cancel runs no reaction inline.
        if (cancel_write && cancel_) cancel_();
        return true;  // OnWriteDone finishes
      }
      finished_ = true;
    }
    Finish(std::move(status));
    return true;
  }

  void OnWriteDone(bool ok) override {
    grpc::ByteBuffer sent;
    {
      AnnotatedMutexLock lock(&mu_);
      writing_ = false;
      // Written: gRPC is done with it. Not kept until the next assignment
      // (at a job's end), which for a RUN of a large job held a second copy
      // of its program, peers and keys per stream all its life. Swapped
      // out, not cleared (Clear keeps the strings' memory), and freed
      // outside the lock.
      sent.Swap(&message_);
    }
    // A write that failed and was not ours to end: the watcher went away,
    // as OnCancel says. Its End wins, so OnCancel's End that may follow
    // does nothing: the loss is reported here or never (the lease would
    // then find it, seconds later).
    if (!ok && End(grpc::Status(grpc::StatusCode::CANCELLED, "the watcher went away"))) {
      owner_->WatcherGone(worker_id_, incarnation_);
    }
    if (FinishIfEnded()) return;
    Pump();
  }

  void OnCancel() override {
    // Not one we ended: the worker went away (its process exited, or its
    // connection broke).
    if (End(grpc::Status(grpc::StatusCode::CANCELLED, "the watcher cancelled the stream"))) {
      owner_->WatcherGone(worker_id_, incarnation_);
    }
  }

  void OnDone() override {
    std::shared_ptr<AssignmentStream> last;
    int subscription;
    {
      AnnotatedMutexLock lock(&mu_);  // orders every reaction before the release
      subscription = subscription_;
      last = std::move(self_);
    }
    if (subscription != 0) hub_->Unsubscribe(subscription);
    owner_->Remove(this);
    // `last` may be the final reference: `this` is deleted on return.
  }

 private:
  // Starts writing the newest assignment not sent yet, unless a write is in
  // flight (its OnWriteDone pumps again) or the stream is ending.
  //
  // StartWrite runs under mu_ (it never calls a reaction inline: gRPC
  // dispatches OnWriteDone to its executor), so that the serialisation of
  // message_ is ordered before the next Pump's overwrite in a way TSan sees.
  //
  // The stream writes bytes (the service's method is a raw one, so that its
  // request is parsed after the caller's credential passed): the
  // assignment is serialized here, as StartWrite would have.
  void Pump() {
    absl::Status serialized;
    {
      AnnotatedMutexLock lock(&mu_);
      if (writing_ || end_status_.has_value()) return;
      std::optional<SequencedAssignment> next = hub_->Newer(worker_id_, sent_sequence_);
      if (!next.has_value()) return;
      sent_sequence_ = next->sequence;
      serialized = SerializeAnswer(next->assignment, &message_);
      if (serialized.ok()) {
        writing_ = true;
        StartWrite(&message_);  // message_ stays untouched until OnWriteDone
        return;
      }
    }
    End(grpc::Status(grpc::StatusCode::INTERNAL, std::string(serialized.message())));
  }

  // Finishes a stream whose End came while a write was in flight.
  bool FinishIfEnded() {
    grpc::Status status;
    {
      AnnotatedMutexLock lock(&mu_);
      if (!end_status_.has_value()) return false;
      if (finished_ || writing_) return true;
      finished_ = true;
      status = *end_status_;
    }
    Finish(std::move(status));
    return true;
  }

  AssignmentHub* const hub_;
  AssignmentStreams* const owner_;
  const std::string worker_id_;
  const int64_t incarnation_;
  const AssignmentStreams::CallCanceller cancel_;  // may be empty

  AnnotatedMutex mu_;
  std::shared_ptr<AssignmentStream> self_ ABSL_GUARDED_BY(mu_);  // reset by OnDone
  int subscription_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t sent_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  // Written under mu_ while no write is in flight; gRPC reads it during one.
  grpc::ByteBuffer message_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> end_status_ ABSL_GUARDED_BY(mu_);  // set once
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

AssignmentStreams::AssignmentStreams(AssignmentHub* hub, WatcherGoneListener on_gone)
    : hub_(hub), on_gone_(std::move(on_gone)) {}

void AssignmentStreams::WatcherGone(const std::string& worker_id, int64_t incarnation) {
  {
    AnnotatedMutexLock lock(&mu_);
    if (shut_down_) return;  // our own shutdown cancels streams too
  }
  if (on_gone_) on_gone_(worker_id, incarnation);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* AssignmentStreams::Open(const std::string& worker_id,
                                                                    int64_t incarnation,
                                                                    CallCanceller cancel) {
  Supersede(worker_id, incarnation, /*same_too=*/true);
  auto stream =
      std::make_shared<AssignmentStream>(hub_, this, worker_id, incarnation, std::move(cancel));
  bool shut_down;
  {
    AnnotatedMutexLock lock(&mu_);
    shut_down = shut_down_;
    streams_[stream.get()] = stream;
  }
  stream->Start(shut_down);
  return stream.get();  // owned by itself until OnDone
}

void AssignmentStreams::Supersede(const std::string& worker_id, int64_t incarnation,
                                  bool same_too) {
  std::vector<std::shared_ptr<AssignmentStream>> older;
  {
    AnnotatedMutexLock lock(&mu_);
    for (const auto& [key, weak] : streams_) {
      std::shared_ptr<AssignmentStream> stream = weak.lock();
      if (stream != nullptr && stream->worker_id() == worker_id &&
          (stream->incarnation() < incarnation ||
           (same_too && stream->incarnation() == incarnation))) {
        older.push_back(std::move(stream));
      }
    }
  }
  for (const auto& stream : older) {
    stream->End(
        grpc::Status(grpc::StatusCode::ABORTED,
                     stream->incarnation() == incarnation
                         ? absl::StrCat("worker ", worker_id, " incarnation ", incarnation,
                                        " opened another watch, which replaces this one")
                         : absl::StrCat("worker ", worker_id, " incarnation ",
                                        stream->incarnation(), " was superseded by incarnation ",
                                        incarnation, "; watch with the new incarnation")),
        /*cancel_write=*/true);
  }
}

void AssignmentStreams::Shutdown() {
  std::vector<std::shared_ptr<AssignmentStream>> all;
  {
    AnnotatedMutexLock lock(&mu_);
    shut_down_ = true;
    for (const auto& [key, weak] : streams_) {
      if (std::shared_ptr<AssignmentStream> stream = weak.lock()) all.push_back(std::move(stream));
    }
  }
  for (const auto& stream : all) {
    stream->End(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                             "the coordinator is shutting down; reconnect to its successor"));
  }
}

int AssignmentStreams::size() const {
  AnnotatedMutexLock lock(&mu_);
  return static_cast<int>(streams_.size());
}

void AssignmentStreams::Remove(const AssignmentStream* stream) {
  AnnotatedMutexLock lock(&mu_);
  streams_.erase(stream);
}

}  // namespace pipetrain
