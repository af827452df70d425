#include "worker/transport/data_plane_server.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_server_limits.h"
#include "common/host_port.h"
#include "common/log_rate_limiter.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "proto/pipetrain/v1/dataplane.grpc.pb.h"
#include "worker/transport/data_plane_auth.h"
#include "worker/transport/frame_codec.h"
#include "worker/transport/frame_wire.h"
#include "worker/transport/tensor_pool.h"

namespace pipetrain {
namespace {

// Frames arrive as raw bytes, parsed without protobuf copies (frame_wire.h);
// replies are FrameError messages serialized by hand.
using StreamReactor = grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>;

grpc::ByteBuffer Serialized(const v1::FrameError& error) {
  const grpc::Slice slice(error.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

class FrameStreamReactor;

// What the streams share: where tensors go, which job is accepted, the
// streams alive (so that a job change can end the old job's) and how many
// reactors are still alive (Shutdown waits for none). Reactors hold it by
// shared_ptr, so the last one to finish may outlive the server object.
//
// Lock order: a reactor's mutex, then mu_ (a frame's check reads job()).
// So mu_ is never held while a reactor is called: SetJob pins the
// reactors it ends instead, and a pinned reactor's OnDone leaves
// its deletion to the last unpin.
class StreamShared {
 public:
  explicit StreamShared(Mailbox* mailbox) : mailbox_(mailbox), pool_(TensorPool::Create()) {}

  Mailbox* mailbox() const { return mailbox_; }
  // What peers can make the server log at will (streams without a proof,
  // frames it refuses): at most 10 lines per 10 s of each kind.
  LogRateLimiter& refused_streams_log() { return refused_streams_log_; }
  LogRateLimiter& rejected_frames_log() { return rejected_frames_log_; }
  // Received raw tensors' memory, recycled across streams (tensor_pool.h).
  const std::shared_ptr<TensorPool>& pool() const { return pool_; }

  // Accepts `job` from now on, and ends every stream of another job (see
  // DataPlaneServer::SetJob).
  void SetJob(AcceptedJob job);
  // Shared and immutable, so a frame's check costs no copy of its strings.
  std::shared_ptr<const AcceptedJob> job() const {
    AnnotatedMutexLock lock(&mu_);
    return job_;
  }

  // Admits `reactor`, a new stream proven as `stage` of `job_id`: takes
  // one of the kMaxStreamsPerSourceStage slots of (job, stage), counts the
  // reactor and registers it, so that a later job change ends it. Refused
  // (nothing taken) with RESOURCE_EXHAUSTED when all slots are held, or
  // FAILED_PRECONDITION when the accepted job changed since the stream's
  // proof was checked (a SetJob in between could not have ended it).
  absl::Status AdmitStream(FrameStreamReactor* reactor, const std::string& job_id, int stage) {
    AnnotatedMutexLock lock(&mu_);
    if (job_->job_id != job_id) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " ended on this worker as its stream opened"));
    }
    int& open = open_streams_[{job_id, stage}];
    if (open >= kMaxStreamsPerSourceStage) {
      return absl::ResourceExhaustedError(absl::StrCat("stage ", stage, " of job ", job_id, " has ",
                                                       kMaxStreamsPerSourceStage,
                                                       " streams open here, the most allowed"));
    }
    ++open;
    ++live_reactors_;
    streams_[reactor] = LiveStream{job_id};
    return absl::OkStatus();
  }
  // Gives the slot back: called before the stream's Finish, so a sender
  // that saw its stream end can open the next one at once.
  void ReleaseStreamSlot(const std::string& job_id, int stage) {
    AnnotatedMutexLock lock(&mu_);
    auto it = open_streams_.find({job_id, stage});
    PT_CHECK(it != open_streams_.end() && it->second > 0);
    if (--it->second == 0) open_streams_.erase(it);
  }
  // The reactor's OnDone: true when the caller deletes it now; false when
  // a pin holds it, and the last Unpin deletes it.
  bool StreamDone(FrameStreamReactor* reactor) {
    AnnotatedMutexLock lock(&mu_);
    auto it = streams_.find(reactor);
    PT_CHECK(it != streams_.end());
    if (it->second.pins > 0) {
      it->second.done = true;
      return false;
    }
    streams_.erase(it);
    return true;
  }
  // After a reactor's deletion.
  void ReactorDone() {
    AnnotatedMutexLock lock(&mu_);
    --live_reactors_;
  }
  void WaitForNoReactors() {
    AnnotatedMutexLock lock(&mu_);
    auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return live_reactors_ == 0; };
    mu_.AwaitWithTimeout(none, absl::InfiniteDuration());
  }

 private:
  Mailbox* const mailbox_;
  const std::shared_ptr<TensorPool> pool_;
  LogRateLimiter refused_streams_log_{10, absl::Seconds(10)};
  LogRateLimiter rejected_frames_log_{10, absl::Seconds(10)};
  mutable AnnotatedMutex mu_;
  std::shared_ptr<const AcceptedJob> job_ ABSL_GUARDED_BY(mu_) =
      std::make_shared<const AcceptedJob>();
  int live_reactors_ ABSL_GUARDED_BY(mu_) = 0;
  // The admitted reactors not yet deleted, with their job; `pins`: calls of
  // SetJob under way on it; `done`: its OnDone ran.
  struct LiveStream {
    std::string job_id;
    int pins = 0;
    bool done = false;
  };
  std::map<FrameStreamReactor*, LiveStream> streams_ ABSL_GUARDED_BY(mu_);
  // Streams open (not yet finished) per (job, source stage).
  std::map<std::pair<std::string, int>, int> open_streams_ ABSL_GUARDED_BY(mu_);
};

// One incoming stream. gRPC operations (StartRead, StartWrite, Finish) are
// started only after mu_ is released: a reaction must never wait for our own
// lock, and Finish may lead to OnDone deleting `this` on another thread, so
// it is always the last thing a method does.
//
// Reading, one frame at a time:
//
//   reading --frame--> the first frame of a tensor beyond a window, or one
//     ^  ^             that only lacks room in the mailbox (ReserveOrHold)?
//     |  |                 | no: handle it         | yes
//     |  +-----------------+                       v
//     |                                 held: no read in flight
//     +--- mailbox wake (still beyond, or no room: held again) -+
//     |                                             | OnCancel: CancelHold, or the
//     | !ok: peer closed, or cancelled              | wake already on its way;
//     v                                             | the frame is dropped
//   reads done <------------------------------------+
//     |
//     +--- error replies written ---> Finish ---> OnDone: delete this
//
// Ending early (EndForJobChange, when the server accepts another job): the
// stream finishes as soon as no frame is held and no reply is being
// written, with a read still in flight if the peer sends nothing (a
// stalled stream must not keep its half-assembled tensor); what arrives
// after is dropped unread.
//
// Lifetime: the wake the mailbox keeps for a held frame captures `this`. It
// cannot outlive the reactor, because Finish (so OnDone) needs hold_ == 0,
// a hold ends only in its wake (Unhold) or when CancelHold returns true
// (then the wake never runs), and no hold starts once Finish is due. The
// wake runs without the mailbox's lock (Mailbox::HoldBeyondWindow), so the
// lock order stays mu_ -> mailbox.
//
// Room: a tensor's reservation given back under mu_ (a rejected frame that
// dropped a half-assembled tensor, a refused Put, a stream ending with one)
// may let in a frame another stream holds for room. The mailbox does not
// wake it then (the wake would lock that stream's mu_ under this one's);
// Run does, with no lock held (Mailbox::WakeHeldForRoom), as OnDone does
// for what the stream's end gives back. A held stream has no tensor in
// assembly (frames are held only at a tensor's first), so its own end or
// job change gives nothing back.
class FrameStreamReactor final : public StreamReactor {
 public:
  // A stream proven to come from `source_stage` of `job_id`. Starts
  // nothing until Start, which follows StreamShared::AdmitStream; a
  // reactor that was refused there is deleted unstarted.
  FrameStreamReactor(std::shared_ptr<StreamShared> shared, std::string peer, std::string job_id,
                     int source_stage)
      : shared_(std::move(shared)),
        peer_(std::move(peer)),
        job_id_(std::move(job_id)),
        source_stage_(source_stage),
        assembler_(kDefaultMaxTensorBytes,
                   [pool = shared_->pool()](const Shape& shape) { return pool->Take(shape); }) {}

  // The first read, unless a job change ended the stream since its
  // admission (Finish is then its only operation): counted as every read
  // is (NextLocked), so no read can follow an ending stream's Finish.
  void Start() {
    Next next;
    {
      AnnotatedMutexLock lock(&mu_);
      next = NextLocked(/*read=*/true);
    }
    Run(next);
  }

  const std::string& job_id() const { return job_id_; }

  // The server accepts another job now (`now`: its id, empty for none):
  // this stream's frames can only be refused, so it ends, FAILED_PRECONDITION,
  // and its half-assembled tensor (allocated at its first frame, up to
  // kDefaultMaxTensorBytes, its mailbox reservation revoked with the job)
  // goes with it, however long its peer stays silent. Called by
  // StreamShared, which keeps `this` alive meanwhile.
  void EndForJobChange(const std::string& now) {
    Next next;
    {
      AnnotatedMutexLock lock(&mu_);
      if (ending_ || finished_) return;
      ending_ = true;
      finish_status_ = grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          absl::StrCat("job ", job_id_, " is over on this worker",
                       now.empty() ? " (it runs no job now)" : " (it runs another job now)",
                       "; stream ended"));
      if (hold_ != 0 && shared_->mailbox()->CancelHold(hold_)) hold_ = 0;
      // The tensor being assembled goes now, not at OnDone: a peer that
      // reads no replies can leave the reply being written unfinished, and
      // so this stream's Finish, for as long as it likes.
      if (assembler_.in_progress()) room_given_back_ = true;
      assembler_.Abandon();
      // Replies not yet written go: the stream ends (the one being written
      // stays until its OnWriteDone).
      outbox_.resize(writing_ ? 1 : 0);
      next = NextLocked(/*read=*/false);
    }
    Run(next);
  }

  void OnReadDone(bool ok) override {
    Next next;
    {
      AnnotatedMutexLock lock(&mu_);
      bool read = false;
      if (!ok) {
        reads_done_ = true;  // The peer closed its side, or the call was cancelled.
      } else if (!ending_) {
        read = ParseLocked() ? HandleOrHoldLocked() : true;
      }  // Ending: the frame is dropped unread, and no read follows.
      next = NextLocked(read);
    }
    Run(next);
  }

  void OnWriteDone(bool ok) override {
    Next next;
    {
      AnnotatedMutexLock lock(&mu_);
      writing_ = false;
      outbox_.pop_front();
      if (!ok) {
        write_failed_ = true;  // The stream is going away; nobody will read the rest.
        outbox_.clear();
      }
      next = NextLocked(/*read=*/false);
    }
    Run(next);
  }

  // A read in flight then ends with !ok; a held frame has no read in
  // flight, so its hold is ended here (or by its wake, if already released).
  void OnCancel() override {
    Next next;
    {
      AnnotatedMutexLock lock(&mu_);
      cancelled_ = true;
      if (hold_ != 0 && shared_->mailbox()->CancelHold(hold_)) {
        hold_ = 0;
        reads_done_ = true;  // The held frame goes: nobody would read a reply.
      }
      next = NextLocked(/*read=*/false);
    }
    Run(next);
  }

  void OnDone() override {
    std::shared_ptr<StreamShared> shared = shared_;
    bool gave_back = false;
    {
      AnnotatedMutexLock lock(&mu_);  // Orders every earlier reaction before the delete.
      PT_CHECK(hold_ == 0) << "a stream finished while the mailbox held its frame";
      // A stream cancelled mid-tensor gives its reservation back here.
      gave_back = assembler_.in_progress() || room_given_back_;
      assembler_.Abandon();
    }
    if (gave_back) shared->mailbox()->WakeHeldForRoom();
    if (!shared->StreamDone(this)) return;  // A job change still holds it.
    delete this;
    shared->ReactorDone();
  }

 private:
  struct Next {
    const grpc::ByteBuffer* write = nullptr;
    bool read = false;
    bool finish = false;
    grpc::Status status;  // With finish.
    // Room was given back: Mailbox::WakeHeldForRoom.
    bool wake_room = false;
  };

  // Splits incoming_ into frame_ (header and payload views into slices_);
  // a malformed message is answered with an error and skipped. Returns
  // whether frame_ holds a frame to handle.
  bool ParseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    slices_.clear();
    std::vector<absl::string_view> pieces;
    if (incoming_.Dump(&slices_).ok()) {
      pieces.reserve(slices_.size());
      for (const grpc::Slice& slice : slices_) {
        pieces.emplace_back(reinterpret_cast<const char*>(slice.begin()), slice.size());
      }
    }
    absl::StatusOr<FrameView> frame = ParseFrame(pieces);
    if (frame.ok()) {
      frame_ = *std::move(frame);
      return true;
    }
    if (int64_t dropped = 0; shared_->rejected_frames_log().Allow(&dropped)) {
      PT_LOG(WARNING) << "data plane: rejected a message from " << peer_ << ": " << frame.status()
                      << LogRateLimiter::Dropped(dropped);
    }
    ReplyLocked(v1::TensorFrame(), frame.status());
    return false;
  }

  // Queues an error reply for `frame` (bounded, see kMaxQueuedFrameErrors).
  void ReplyLocked(const v1::TensorFrame& frame, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (outbox_.size() >= static_cast<size_t>(kMaxQueuedFrameErrors) || write_failed_ || ending_) {
      return;
    }
    outbox_.push_back(Serialized(MakeFrameError(frame, status)));
  }

  // The mailbox's wake for the held frame (on the thread that moved the
  // window): handle the frame now, or hold it again.
  void Unhold() {
    Next next;
    {
      AnnotatedMutexLock lock(&mu_);
      PT_CHECK(hold_ != 0);
      hold_ = 0;
      bool read = false;
      if (cancelled_) {
        reads_done_ = true;  // The held frame goes: nobody would read a reply.
      } else if (ending_) {
        // The held frame goes with its job; NextLocked finishes.
      } else {
        read = HandleOrHoldLocked();
      }
      next = NextLocked(read);
    }
    Run(next);
  }

  // Handles frame_ unless a window or the lack of room holds it back;
  // returns whether to read the next frame.
  bool HandleOrHoldLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (HoldLocked()) return false;
    return HandleFrameLocked();
  }

  // Holds frame_ when it starts a tensor of this stream's job that is beyond
  // the mailbox's run-ahead window (the assembler checks it when its wake
  // comes); anything else is handled, and refused if it must be, at once.
  // Returns whether it is held.
  bool HoldLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const v1::TensorFrame& header = frame_.header;
    if (cancelled_ || assembler_.in_progress() || header.offset() != 0 ||
        !CheckBindingLocked().ok()) {
      return false;
    }
    hold_ = shared_->mailbox()->HoldBeyondWindow(
        MakeAddress(header.job_id(), header.iteration(), header.tensor()), [this] { Unhold(); });
    return hold_ != 0;
  }

  // Frames must be of the job and stage the stream proved it sends for.
  absl::Status CheckBindingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const v1::TensorFrame& header = frame_.header;
    if (header.job_id() == job_id_ && header.source_stage() == source_stage_) {
      return absl::OkStatus();
    }
    return absl::PermissionDeniedError(absl::StrCat(
        "frame for job \"", absl::CHexEscape(absl::string_view(header.job_id()).substr(0, 64)),
        "\" stage ", header.source_stage(), " on a stream of job ", job_id_, " stage ",
        source_stage_));
  }

  // Handles frame_: buffers it, or refuses it with a FrameError. Returns
  // false, nothing refused, when the mailbox holds it instead for lack of
  // room (its tensor fits the whole limit, and no Take waits for it:
  // Mailbox::ReserveOrHold): the assembler refused its first frame and took
  // nothing of it, so it accepts the same frame again at the wake (a Take
  // that starts waiting for it is one).
  bool HandleFrameLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::Status status = CheckBindingLocked();
    absl::StatusOr<std::optional<ReceivedTensor>> result = std::optional<ReceivedTensor>();
    int64_t held = 0;
    if (status.ok()) {
      // The mailbox says up front whether it would take the tensor, so a
      // refused one is never buffered, and reserves its bytes while it is
      // assembled: other streams' tensors cannot then take the same room.
      // A cancelled stream is not held: nobody would cancel the hold.
      Mailbox* mailbox = shared_->mailbox();
      const bool can_wait = !cancelled_;
      result = assembler_.Accept(
          frame_, *shared_->job(),
          [this, mailbox, can_wait, &held](const TensorAddress& address, int64_t bytes) {
            if (!can_wait) return mailbox->Reserve(address, bytes);
            Mailbox::WindowWake wake = [this] { Unhold(); };
            // Bound (checked above): this stream's stage sent it.
            return mailbox->ReserveOrHold(source_stage_, address, bytes, std::move(wake), &held);
          });
      status = result.status();
    }
    if (held != 0) {
      hold_ = held;
      return false;
    }
    if (result.ok() && result->has_value()) {
      ReceivedTensor& done = **result;
      status = shared_->mailbox()->Put(done.source_stage, done.address, std::move(done.wire),
                                       std::move(done.reservation));
    }
    if (status.ok()) return true;
    // A refused Put, or a rejection that dropped a half-assembled tensor,
    // gave its reservation back.
    room_given_back_ = true;
    if (int64_t dropped = 0; shared_->rejected_frames_log().Allow(&dropped)) {
      PT_LOG(WARNING) << "data plane: rejected a frame from " << peer_ << ": " << status
                      << LogRateLimiter::Dropped(dropped);
    }
    // The stage waiting for it hears now rather than at its timeout (only
    // for this stream's own stage: a bound frame).
    if (CheckBindingLocked().ok()) {
      const v1::TensorFrame& header = frame_.header;
      shared_->mailbox()->NoteRefused(
          header.source_stage(), MakeAddress(header.job_id(), header.iteration(), header.tensor()),
          status);
      // And the incomplete tensor the frame interrupted (dropped with it):
      // of the same stream, so of the same stage.
      if (const auto dropped = assembler_.interrupted();
          dropped.has_value() && dropped->first == source_stage_) {
        shared_->mailbox()->NoteRefused(dropped->first, dropped->second, status);
      }
    }
    ReplyLocked(frame_.header, status);
    return true;
  }

  // Decides the next gRPC operations (`read`: start the next read); marks
  // them started. Finish waits until reads are done (or the stream is
  // ending), nothing is held and every error reply is written.
  Next NextLocked(bool read) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Next next;
    next.wake_room = std::exchange(room_given_back_, false);
    next.read = read && !ending_;
    if (next.read) ++reads_starting_;
    if (writing_ || finished_) return next;
    if (!outbox_.empty()) {
      writing_ = true;
      next.write = &outbox_.front();  // deque::push_back keeps it in place.
    } else if ((reads_done_ || ending_) && hold_ == 0 && reads_starting_ == 0) {
      finished_ = true;
      next.finish = true;
      next.status = finish_status_;
    }
    return next;
  }

  // A read and Finish never go together, so nothing can delete `this`
  // before the last operation here is started: Finish needs reads done,
  // or the stream ending, and no read decided (reads_starting_) but not
  // yet started. A read decided just before EndForJobChange (on a
  // reaction's or a wake's thread) is started first, and the Finish that
  // EndForJobChange had to leave follows it here; the started read keeps
  // OnDone away until then.
  void Run(const Next& next) {
    // First, while `this` is surely alive: Finish, last below, may delete it.
    if (next.wake_room) shared_->mailbox()->WakeHeldForRoom();
    if (next.write != nullptr) StartWrite(next.write);
    if (next.read) {
      StartRead(&incoming_);
      Next after;
      {
        AnnotatedMutexLock lock(&mu_);
        --reads_starting_;
        after = NextLocked(/*read=*/false);
      }
      Run(after);  // Never a read: at most the Finish of an ending stream.
      return;
    }
    if (next.finish) {
      shared_->ReleaseStreamSlot(job_id_, source_stage_);
      Finish(next.status);  // Last: OnDone may follow at once.
    }
  }

  const std::shared_ptr<StreamShared> shared_;
  const std::string peer_;
  const std::string job_id_;
  const int source_stage_;
  AnnotatedMutex mu_;
  // Filled by the read in flight; then parsed under mu_ into frame_, whose
  // payload views point into slices_. A held frame stays in them (no read
  // is in flight) until its wake.
  grpc::ByteBuffer incoming_;
  std::vector<grpc::Slice> slices_ ABSL_GUARDED_BY(mu_);
  FrameView frame_ ABSL_GUARDED_BY(mu_);
  FrameAssembler assembler_ ABSL_GUARDED_BY(mu_);
  std::deque<grpc::ByteBuffer> outbox_ ABSL_GUARDED_BY(mu_);  // front() is being written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;  // OnCancel ran.
  bool ending_ ABSL_GUARDED_BY(mu_) = false;     // EndForJobChange ran.
  // Reads NextLocked decided that Run has not started yet.
  int reads_starting_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);  // OK unless ending_
  // The mailbox's ticket for the held frame_ (by a window or for room); 0
  // when none is held.
  int64_t hold_ ABSL_GUARDED_BY(mu_) = 0;
  // A reservation was given back under mu_ since NextLocked last ran.
  bool room_given_back_ ABSL_GUARDED_BY(mu_) = false;
};

// Ends a stream at once with `status`, reading nothing; deletes itself.
class RefusedStream final : public StreamReactor {
 public:
  explicit RefusedStream(const absl::Status& status) {
    Finish(
        grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message())));
  }
  void OnDone() override { delete this; }
};

// The single value of a metadata key; "" when absent or repeated.
std::string MetadataValue(const grpc::CallbackServerContext& context, const char* key) {
  const auto& metadata = context.client_metadata();
  if (metadata.count(key) != 1) return "";
  const grpc::string_ref value = metadata.find(key)->second;
  return std::string(value.data(), std::min<size_t>(value.size(), 256));
}

void StreamShared::SetJob(AcceptedJob job) {
  const std::string now = job.job_id;
  auto shared = std::make_shared<const AcceptedJob>(std::move(job));
  std::vector<FrameStreamReactor*> ending;
  {
    AnnotatedMutexLock lock(&mu_);
    job_ = std::move(shared);
    for (auto& [reactor, stream] : streams_) {
      if (stream.job_id == now || stream.done) continue;
      ++stream.pins;
      ending.push_back(reactor);
    }
  }
  for (FrameStreamReactor* reactor : ending) reactor->EndForJobChange(now);
  for (FrameStreamReactor* reactor : ending) {
    bool delete_now = false;
    {
      AnnotatedMutexLock lock(&mu_);
      auto it = streams_.find(reactor);
      PT_CHECK(it != streams_.end() && it->second.pins > 0);
      if (--it->second.pins == 0 && it->second.done) {
        streams_.erase(it);
        delete_now = true;
      }
    }
    if (delete_now) {  // Its OnDone ran while pinned and left this to us.
      delete reactor;
      ReactorDone();
    }
  }
}

}  // namespace

class DataPlaneServer::Service final
    : public v1::DataPlaneService::WithRawCallbackMethod_Stream<v1::DataPlaneService::Service> {
 public:
  explicit Service(Mailbox* mailbox) : shared_(std::make_shared<StreamShared>(mailbox)) {}

  StreamReactor* Stream(grpc::CallbackServerContext* context) override {
    const std::shared_ptr<const AcceptedJob> accepted = shared_->job();
    const AcceptedJob& job = *accepted;
    absl::StatusOr<int> stage = VerifyStreamOpen(
        job.job_id, job.num_stages, job.receive_key, MetadataValue(*context, kJobMetadataKey),
        MetadataValue(*context, kStageMetadataKey), MetadataValue(*context, kProofMetadataKey));
    if (!stage.ok()) {
      if (int64_t dropped = 0; shared_->refused_streams_log().Allow(&dropped)) {
        PT_LOG(WARNING) << "data plane: refused a stream from " << context->peer() << ": "
                        << stage.status() << LogRateLimiter::Dropped(dropped);
      }
      return new RefusedStream(stage.status());
    }
    auto reactor =
        std::make_unique<FrameStreamReactor>(shared_, context->peer(), job.job_id, *stage);
    const absl::Status admitted = shared_->AdmitStream(reactor.get(), job.job_id, *stage);
    if (!admitted.ok()) {
      if (int64_t dropped = 0; shared_->refused_streams_log().Allow(&dropped)) {
        PT_LOG(WARNING) << "data plane: refused a stream from " << context->peer() << ": "
                        << admitted << LogRateLimiter::Dropped(dropped);
      }
      return new RefusedStream(admitted);
    }
    reactor->Start();
    return reactor.release();  // OnDone deletes it.
  }

  StreamShared& shared() { return *shared_; }

 private:
  const std::shared_ptr<StreamShared> shared_;
};

absl::StatusOr<std::unique_ptr<DataPlaneServer>> DataPlaneServer::Start(
    const std::string& listen_address, Mailbox* mailbox, grpc::Service* control,
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors,
    std::shared_ptr<grpc::ServerCredentials> credentials) {
  PT_CHECK(mailbox != nullptr);
  // gRPC would bind a port out of range modulo 65536.
  RETURN_IF_ERROR(SplitHostPort(listen_address, "data-plane listen address").status());
  auto service = std::make_unique<Service>(mailbox);
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(
      listen_address,
      credentials != nullptr ? std::move(credentials) : grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(kMaxFrameMessageBytes);
  builder.SetMaxSendMessageSize(kMaxFrameMessageBytes);
  // gRPC sets SO_REUSEPORT by default: a second server (another worker, or a
  // stale one) could then bind the same port, even via port 0, and take a
  // share of the connections meant for this one.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  ApplyGrpcServerLimits(builder, "worker-data-plane");
  // A peer that vanished without closing (a host lost, a partition) would
  // keep its stream, and its slot, for hours (TCP's own keepalive): pings
  // end such a connection within kDataPlaneKeepalive + its timeout.
  // Pings go on while the server sends nothing (it only ever replies with
  // errors).
  PingIdleClients(builder, kDataPlaneKeepalive, kDataPlaneKeepaliveTimeout);
  builder.RegisterService(service.get());
  if (control != nullptr) builder.RegisterService(control);
  if (!interceptors.empty()) builder.experimental().SetInterceptorCreators(std::move(interceptors));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("could not start the data-plane server on ", listen_address,
                     ": the port is in use or the host is not an address of this machine"));
  }
  return std::unique_ptr<DataPlaneServer>(
      new DataPlaneServer(std::move(service), std::move(server),
                          listen_address.substr(0, listen_address.rfind(':')), port));
}

DataPlaneServer::DataPlaneServer(std::unique_ptr<Service> service,
                                 std::unique_ptr<grpc::Server> server, std::string host, int port)
    : service_(std::move(service)),
      server_(std::move(server)),
      host_(std::move(host)),
      port_(port) {}

DataPlaneServer::~DataPlaneServer() { Shutdown(); }

void DataPlaneServer::SetJob(const std::string& job_id, int num_stages,
                             const std::string& receive_key) {
  service_->shared().SetJob(AcceptedJob{job_id, num_stages, receive_key});
}

void DataPlaneServer::ClearJob() { service_->shared().SetJob(AcceptedJob{}); }

std::string DataPlaneServer::address() const { return absl::StrCat(host_, ":", port_); }

void DataPlaneServer::Shutdown() {
  AnnotatedMutexLock lock(&shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  // Streams are long-lived, so waiting for them to end on their own would
  // never return: a deadline of now cancels them right away.
  server_->Shutdown(std::chrono::system_clock::now());
  server_->Wait();
  service_->shared().WaitForNoReactors();
}

}  // namespace pipetrain
