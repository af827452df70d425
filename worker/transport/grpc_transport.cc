#include "worker/transport/grpc_transport.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "common/annotated_mutex.h"
#include "common/clock.h"
#include "common/echo_input.h"
#include "common/log_rate_limiter.h"
#include "common/logging.h"
#include "common/loopback_channel.h"
#include "common/utf8_prefix.h"
#include "proto/pipetrain/v1/dataplane.grpc.pb.h"
#include "worker/transport/data_plane_auth.h"
#include "worker/transport/frame_wire.h"
#include "worker/transport/stream_hold.h"

namespace pipetrain {
namespace {

// Frames go out as ready-made bytes (frame_wire.h), replies come back as
// protobuf messages.
using FrameStub = grpc::TemplatedGenericStub<grpc::ByteBuffer, v1::FrameError>;
using StreamReactor = grpc::ClientBidiReactor<grpc::ByteBuffer, v1::FrameError>;

// The code a receiver's FrameError gives (its Status's): the sender's Send
// fails with it, so that a refusal for a job stopped there (ABORTED) is a
// lost peer to the sender's stage as to the receiver's. OK (a refusal is
// never one: an older receiver sends no code) and values that are no
// absl::StatusCode (any peer may send anything) are INTERNAL.
absl::StatusCode RejectionCode(int32_t code) {
  if (code <= 0 || code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::StatusCode::kInternal;
  }
  return static_cast<absl::StatusCode>(code);
}

// Frames up to this size are written with buffer_hint when another small
// frame follows (FrameStream::NextWriteLocked).
constexpr size_t kCoalescedFrameBytes = 256 << 10;

// "/pipetrain.v1.DataPlaneService/Stream"; gRPC keeps a pointer to it for the call.
const std::string& StreamMethod() {
  static const std::string* const method =
      new std::string(absl::StrCat("/", v1::DataPlaneService::service_full_name(), "/Stream"));
  return *method;
}

// How many Sends wait for room in a full queue, for tests
// (GrpcTransport::AwaitSendsWaitingForRoom).
class RoomWaits {
 public:
  void Add(int delta) {
    AnnotatedMutexLock lock(&mu_);
    waiting_ += delta;
  }
  bool Await(int count, absl::Duration timeout) {
    AnnotatedMutexLock lock(&mu_);
    auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return waiting_ == count; };
    return mu_.AwaitWithTimeout(reached, timeout);
  }

 private:
  AnnotatedMutex mu_;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

// A payload slice that references the bytes of a WireTensor nobody else
// holds; each slice keeps it alive until gRPC is done with the slice.
grpc::Slice LentSlice(const std::shared_ptr<const WireTensor>& owner, const char* bytes,
                      size_t size) {
  auto* hold = new std::shared_ptr<const WireTensor>(owner);
  return grpc::Slice(
      const_cast<char*>(bytes), size,
      [](void* p) { delete static_cast<std::shared_ptr<const WireTensor>*>(p); }, hold);
}

// The messages of `wire`'s frames: each the header's bytes, then its payload,
// not copied when `owner` (the same tensor, taken over) is given, else
// copied once straight into a gRPC slice. No protobuf copies either way.
std::vector<grpc::ByteBuffer> EncodeFrameBuffers(int source_stage, const TensorAddress& address,
                                                 const WireTensor& wire, int64_t max_frame_bytes,
                                                 const std::shared_ptr<const WireTensor>& owner) {
  const std::vector<v1::TensorFrame> headers =
      EncodeFrameHeaders(source_stage, address, wire, max_frame_bytes);
  const char* bytes = WireBytes(wire);
  std::vector<grpc::ByteBuffer> frames;
  frames.reserve(headers.size());
  for (size_t i = 0; i < headers.size(); ++i) {
    const int64_t size = FramePayloadBytes(headers, i);
    const char* payload = bytes + headers[i].offset();
    const grpc::Slice slices[2] = {grpc::Slice(EncodeFrameHeader(headers[i], size)),
                                   owner != nullptr
                                       ? LentSlice(owner, payload, static_cast<size_t>(size))
                                       : grpc::Slice(payload, static_cast<size_t>(size))};
    frames.emplace_back(slices, size > 0 ? 2 : 1);
  }
  return frames;
}

// One long-lived DataPlane/Stream to a peer.
//
// Lifetime: Start() takes a hold, so gRPC keeps the call alive while Send
// threads may still start writes from outside any reaction; it goes once
// a close was asked (BeginClose) and no such write is still to be started
// (stream_hold.h). The owner must call Close() (or BeginClose, then
// FinishClose) and destroys the stream after it returns (OnDone has run by
// then). Not a reaction: context_ may hold the last reference to the
// channel, and gRPC teardown stays on our threads (a variant that let
// OnDone drop the last reference once hit a double free inside gRPC's
// callback completion queue under ASan).
// gRPC operations are never started while mu_ is held.
class FrameStream final : public StreamReactor {
 public:
  // Starts the call on `stub`'s channel, proving to `peer_stage` that it
  // comes from `source_stage` of the credential's job (data_plane_auth.h).
  // `room_waits` counts Enqueues waiting for room; it must outlive the
  // stream.
  static std::shared_ptr<FrameStream> Start(FrameStub* stub, std::string peer_name,
                                            const GrpcTransportOptions& options, int source_stage,
                                            int peer_stage,
                                            std::function<void(const absl::Status&)> on_error,
                                            RoomWaits* room_waits) {
    std::shared_ptr<FrameStream> stream(
        new FrameStream(std::move(peer_name), options, std::move(on_error), room_waits));
    const JobCredential& credential = options.credential;
    if (!credential.job_id.empty()) {
      stream->context_.AddMetadata(kJobMetadataKey, credential.job_id);
      stream->context_.AddMetadata(kStageMetadataKey, absl::StrCat(source_stage));
      // Without a key for this peer the stream goes unproven, and a
      // receiver with keys refuses it (UNAUTHENTICATED, with the reason).
      if (peer_stage >= 0 && peer_stage < static_cast<int>(credential.send_keys.size())) {
        stream->context_.AddMetadata(
            kProofMetadataKey,
            StreamProof(credential.send_keys[peer_stage], credential.job_id, source_stage));
      }
    }
    stub->PrepareBidiStreamingCall(&stream->context_, StreamMethod(), grpc::StubOptions(),
                                   stream.get());
    stream->AddHold();
    stream->StartRead(&stream->incoming_);
    stream->StartCall();
    return stream;
  }

  // Bytes of frames queued and not yet handed to gRPC.
  int64_t queued_bytes() const {
    AnnotatedMutexLock lock(&mu_);
    return queued_bytes_;
  }

  // Queues one tensor's frames behind the earlier ones; waits for room
  // (see GrpcTransportOptions::max_queued_bytes_per_peer).
  absl::Status Enqueue(std::vector<grpc::ByteBuffer> frames) {
    int64_t bytes = 0;
    for (const grpc::ByteBuffer& f : frames) bytes += static_cast<int64_t>(f.Length());
    Write write;
    {
      AnnotatedMutexLock lock(&mu_);
      auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return closing_ || broken_ || aborted_ || queued_bytes_ == 0 ||
               queued_bytes_ + bytes <= options_.max_queued_bytes_per_peer;
      };
      bool roomy = room();
      if (!roomy) {
        room_waits_->Add(1);
        roomy = mu_.AwaitWithTimeout(room, options_.queue_wait_timeout);
        room_waits_->Add(-1);
      }
      if (aborted_) {
        return absl::AbortedError(absl::StrCat("the job stopped; not sending to ", peer_name_));
      }
      if (!roomy) {
        return absl::DeadlineExceededError(
            absl::StrCat("waited ", absl::FormatDuration(options_.queue_wait_timeout),
                         " for room in the queue to ", peer_name_, ": ", queued_bytes_,
                         " bytes are still unsent; that worker is not reading "
                         "its stream: check its status and log (a worker holds a stream "
                         "while the tensors on it are more than its run-ahead window "
                         "of iterations ahead: it may be that much slower)"));
      }
      if (closing_) {
        return absl::AbortedError(absl::StrCat("transport to ", peer_name_, " shut down"));
      }
      if (broken_) {
        return absl::UnavailableError(absl::StrCat("the stream to ", peer_name_, " broke"));
      }
      for (grpc::ByteBuffer& f : frames) queue_.push_back(std::move(f));
      queued_bytes_ += bytes;
      write = NextWriteLocked();
      // Started below, outside the lock and outside any reaction: the
      // hold must outlast it (stream_hold.h).
      if (write.frame != nullptr) hold_.WriteClaimed();
    }
    if (write.frame != nullptr) {
      StartWrite(write.frame, write.options);
      bool remove_hold = false;
      {
        AnnotatedMutexLock lock(&mu_);
        remove_hold = hold_.WriteStarted();
      }
      if (remove_hold) RemoveHold();  // a Close came while we started it
    }
    return absl::OkStatus();
  }

  // The first rejection not yet reported, with the receiver's code
  // (RejectionCode); OK if none.
  absl::Status TakeRejection() {
    AnnotatedMutexLock lock(&mu_);
    if (rejection_.empty()) return absl::OkStatus();
    absl::Status status(rejection_code_,
                        absl::StrCat(peer_name_, " rejected a tensor sent earlier: ", rejection_,
                                     more_rejections_ > 0 ? absl::StrCat(" (and ", more_rejections_,
                                                                         " more, see the log)")
                                                          : ""));
    rejection_.clear();
    more_rejections_ = 0;
    return status;
  }

  bool broken() const {
    AnnotatedMutexLock lock(&mu_);
    return broken_;
  }

  // Stops sending: a waiting Enqueue returns ABORTED, no further frame is
  // written, and the call is cancelled (which breaks the stream, so a
  // later Close finds nothing to drain). Does not wait.
  void Abort() {
    {
      AnnotatedMutexLock lock(&mu_);
      if (aborted_ || closing_) return;  // a Close is under way: it ends the call
      aborted_ = true;
    }
    context_.TryCancel();
  }

  // BeginClose, then FinishClose `drain` from now: half-closes the stream
  // once every queued frame is written, or cancels it if that takes longer
  // than `drain` (or the stream broke), then waits for gRPC to finish.
  // Returns the call's final status.
  grpc::Status Close(absl::Duration drain) {
    const absl::Time deadline = MonotonicClock()->Now() + drain;
    BeginClose(/*cancel=*/false);
    return FinishClose(deadline);
  }

  // Close's first half, which does not wait: no new frames from here on;
  // the stream half-closes once every queued frame is written (at once if
  // none is queued; else OnWriteDone, after the last), or is cancelled at
  // once if `cancel`, or if it broke or was aborted. Only the first call
  // (of this or Close) does anything.
  void BeginClose(bool cancel) {
    bool half_close = false;
    bool cancel_now = false;
    {
      AnnotatedMutexLock lock(&mu_);
      if (closing_) return;
      closing_ = true;  // Wakes Enqueue.
      cancel_now = cancel || broken_ || aborted_;
      if (cancel_now) {
        cancelled_ = true;  // Stops OnWriteDone from starting more writes.
      } else {
        half_close = HalfCloseDueLocked();
      }
    }
    if (half_close) StartWritesDone();  // The peer then finishes the call.
    if (cancel_now) context_.TryCancel();
    // Not while an Enqueue is between claiming a write and starting it
    // (when cancelling, before it started; drained, after it started and
    // completed but before the Enqueue said so): that Enqueue removes it.
    // Writes and the half-close still to come start in reactions, which
    // need no hold.
    bool remove_hold = false;
    {
      AnnotatedMutexLock lock(&mu_);
      remove_hold = hold_.CloseAsked();
    }
    if (remove_hold) RemoveHold();
  }

  // Close's second half: waits until `deadline` for the peer to finish the
  // call, cancels it if it has not (whatever was still queued is lost),
  // then waits for gRPC to finish. Returns the call's final status. Safe
  // to call from several threads. An empty queue is not enough to end
  // sooner: written frames may sit unread in the peer's flow-control
  // window (a stream it holds, mailbox.h), and a cancel drops them there;
  // the peer finishing the call after the half-close says it read them.
  grpc::Status FinishClose(absl::Time deadline) {
    auto finished = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; };
    bool done = false;
    {
      AnnotatedMutexLock lock(&mu_);
      done = mu_.AwaitWithTimeout(finished, deadline - MonotonicClock()->Now());
      if (!done) cancelled_ = true;  // No more writes, nor a half-close.
    }
    if (!done) context_.TryCancel();  // The peer did not finish the call in time.
    AnnotatedMutexLock lock(&mu_);
    mu_.AwaitWithTimeout(finished, absl::InfiniteDuration());
    return final_status_;
  }

  void OnWriteDone(bool ok) override {
    Write write;
    bool now_broken = false;
    bool half_close = false;
    {
      AnnotatedMutexLock lock(&mu_);
      writing_ = false;
      queued_bytes_ -= static_cast<int64_t>(queue_.front().Length());
      queue_.pop_front();
      if (ok) {
        write = NextWriteLocked();
        half_close = HalfCloseDueLocked();
      } else {
        now_broken = MarkBrokenLocked();
      }
    }
    if (write.frame != nullptr) StartWrite(write.frame, write.options);
    if (half_close) StartWritesDone();  // The last frame queued before BeginClose is written.
    if (now_broken) ReportBroken("a write failed", /*log=*/true);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // The call ended: after our WritesDone, or the peer went away.
      bool now_broken = false;
      int64_t unsent = 0;
      {
        AnnotatedMutexLock lock(&mu_);
        unsent = queued_bytes_;
        now_broken = MarkBrokenLocked();
      }
      // With nothing unsent this is how every job ends: the peer's stage
      // finished first (the soak test logged it 3,000 times, every one a
      // success). Reported all the same, but logged only when frames were
      // lost. The report notes the break for the link (a later send or
      // receive timeout on it says the stream broke) and goes to
      // on_peer_error; it wakes no receive: one waiting on that peer
      // still waits out its timeout (a dead worker is found sooner by
      // the coordinator's lease, which stops the job's other stages).
      if (now_broken) {
        ReportBroken(unsent > 0 ? absl::StrCat("the peer ended the stream with ", unsent,
                                               " bytes still unsent")
                                : "the peer ended the stream",
                     /*log=*/unsent > 0);
      }
      return;
    }
    // The receiver's text, cut (an honest one is at most
    // kMaxFrameErrorBytes; a hostile one could send 8 MiB per message, at
    // will): logged at a bounded rate. Not escaped here: the log escapes a
    // message with control characters (LogMessage) and so do the CLI's
    // prints of a job's reason, and escaping twice doubles every backslash.
    const absl::string_view error = incoming_.error();
    // Cut whole characters: the text goes on in the job's error report, a
    // proto3 string (the parse checked that `error` is UTF-8).
    std::string said(Utf8Prefix(error, kMaxFrameErrorBytes));
    if (error.size() > kMaxFrameErrorBytes) {
      absl::StrAppend(&said, "... (", error.size(), " bytes)");
    }
    const absl::StatusCode code = RejectionCode(incoming_.code());
    const absl::Status rejected(code, absl::StrCat(peer_name_, " rejected a frame: ", said));
    static LogRateLimiter rejections_log(10, absl::Seconds(10));
    if (int64_t dropped = 0; rejections_log.Allow(&dropped)) {
      PT_LOG(WARNING) << "data plane: " << rejected << LogRateLimiter::Dropped(dropped);
    }
    {
      AnnotatedMutexLock lock(&mu_);
      if (rejection_.empty()) {
        rejection_ = said;
        rejection_code_ = code;
      } else {
        ++more_rejections_;
      }
    }
    if (on_error_) on_error_(rejected);
    StartRead(&incoming_);
  }

  void OnDone(const grpc::Status& status) override {
    AnnotatedMutexLock lock(&mu_);
    final_status_ = status;
    done_ = true;
  }

 private:
  FrameStream(std::string peer_name, const GrpcTransportOptions& options,
              std::function<void(const absl::Status&)> on_error, RoomWaits* room_waits)
      : peer_name_(std::move(peer_name)),
        options_(options),
        on_error_(std::move(on_error)),
        room_waits_(room_waits) {}

  // The front frame, if it should be written now; marks it in flight.
  // A small frame with another small one queued behind it may wait in
  // gRPC's buffer to go out with it in one system call (buffer_hint); the
  // next write without the hint flushes. That saves a send per frame when
  // small tensors queue up; large frames go out at once, so the receiver
  // starts on them while the next is written.
  struct Write {
    const grpc::ByteBuffer* frame = nullptr;
    grpc::WriteOptions options;
  };
  Write NextWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || queue_.empty() || broken_ || cancelled_ || aborted_) return {};
    writing_ = true;
    Write write{&queue_.front()};  // deque::push_back keeps it in place.
    if (queue_.size() > 1 && queue_.front().Length() <= kCoalescedFrameBytes &&
        queue_[1].Length() <= kCoalescedFrameBytes) {
      write.options.set_buffer_hint();
    }
    return write;
  }

  // Whether the stream should half-close now: closing, everything queued
  // written, and not half-closed yet, cancelled, broken or aborted. Marks
  // it half-closed.
  bool HalfCloseDueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!closing_ || half_closed_ || cancelled_ || broken_ || aborted_ || writing_ ||
        !queue_.empty()) {
      return false;
    }
    half_closed_ = true;
    return true;
  }

  // Drops what is unsent (even while closing, so Close stops waiting for
  // it). Returns true if this is news to report: the first end of the
  // stream that Close did not ask for.
  bool MarkBrokenLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const bool news = !broken_ && !closing_;
    broken_ = true;
    while (queue_.size() > (writing_ ? 1u : 0u)) {  // gRPC still reads the one in flight.
      queued_bytes_ -= static_cast<int64_t>(queue_.back().Length());
      queue_.pop_back();
    }
    return news;
  }

  void ReportBroken(const std::string& how, bool log) {
    absl::Status why =
        absl::UnavailableError(absl::StrCat("the stream to ", peer_name_, " broke: ", how));
    if (log) PT_LOG(WARNING) << "data plane: " << why;
    if (on_error_) on_error_(why);
  }

  const std::string peer_name_;
  const GrpcTransportOptions& options_;
  const std::function<void(const absl::Status&)> on_error_;
  RoomWaits* const room_waits_;
  grpc::ClientContext context_;
  v1::FrameError incoming_;  // Filled by the read in flight.

  mutable AnnotatedMutex mu_;
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(mu_);  // front() in flight if writing_
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // WritesDone started (at BeginClose, or after the last queued frame).
  bool half_closed_ ABSL_GUARDED_BY(mu_) = false;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;  // Abort(): nothing more is written
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  StreamHoldRelease hold_ ABSL_GUARDED_BY(mu_);  // who removes Start()'s hold
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
  std::string rejection_ ABSL_GUARDED_BY(mu_);
  absl::StatusCode rejection_code_ ABSL_GUARDED_BY(mu_) = absl::StatusCode::kInternal;
  int more_rejections_ ABSL_GUARDED_BY(mu_) = 0;
};

std::string GrpcStatusText(const grpc::Status& status) {
  // gRPC's codes are absl's (both are the canonical codes): named, so a
  // reader need not look up "16".
  return absl::StrCat("gRPC status ", static_cast<int>(status.error_code()), " ",
                      absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
                      ": ", ValidUtf8(status.error_message()));  // a peer's text: any bytes
}

}  // namespace

// Everything about sending to one peer: its channel and current stream.
class GrpcTransport::PeerLink {
 public:
  PeerLink(int source_stage, int peer_stage, std::string address,
           const GrpcTransportOptions& options, RoomWaits* room_waits)
      : source_stage_(source_stage),
        peer_stage_(peer_stage),
        name_(absl::StrCat("stage ", peer_stage, " (", address, ")")),
        address_(std::move(address)),
        options_(options),
        room_waits_(room_waits) {}

  absl::Status Send(std::vector<grpc::ByteBuffer> frames) {
    AnnotatedMutexLock send_lock(&send_mu_);
    std::shared_ptr<FrameStream> stream;
    {
      AnnotatedMutexLock lock(&mu_);
      if (shut_down_) return ShutDownError();
      stream = stream_;
    }
    if (stream != nullptr) {
      // A break first: it is what the peer's state is now (gone, or on
      // another plan), and after one exactly one Send says so
      // (grpc_transport.h). Unless a rejection on the broken stream names
      // a fault of this job's own (a refused frame, a mailbox limit): a
      // break alone reads as a lost peer, and the job would recover into
      // the same fault again and again; that rejection is returned.
      absl::Status rejected = stream->TakeRejection();
      const bool own_fault = !rejected.ok() && !absl::IsAborted(rejected) &&
                             !absl::IsUnavailable(rejected) && !absl::IsDeadlineExceeded(rejected);
      if (own_fault) return rejected;  // the next Send reports a break
      if (stream->broken()) return RetireBroken(std::move(stream));
      if (!rejected.ok()) return rejected;
    } else {
      absl::StatusOr<std::shared_ptr<FrameStream>> opened = Open();
      if (!opened.ok()) return opened.status();
      stream = *std::move(opened);
    }
    absl::Status queued = stream->Enqueue(std::move(frames));
    if (absl::IsUnavailable(queued)) return RetireBroken(std::move(stream));  // Broke meanwhile.
    return queued;
  }

  // Shutdown's first half, which does not wait: no more Sends; the
  // stream, if any, half-closes once its queue is written (cancelled at
  // once after an Abort). Returns it for FinishShutdown.
  std::shared_ptr<FrameStream> BeginShutdown() {
    std::shared_ptr<FrameStream> stream;
    {
      AnnotatedMutexLock lock(&mu_);
      shut_down_ = true;
      stream = std::move(stream_);
    }
    if (stream != nullptr) stream->BeginClose(/*cancel=*/aborted_.load());
    return stream;
  }

  // The second half: waits until `deadline` for the peer to finish
  // `stream` (BeginShutdown's), cancelling it then, and for a Send in
  // progress.
  void FinishShutdown(const std::shared_ptr<FrameStream>& stream, absl::Time deadline) {
    if (stream != nullptr) stream->FinishClose(deadline);
    AnnotatedMutexLock send_lock(&send_mu_);  // Waits out a Send in progress.
  }

  // "; this stage's own sends broke 12s ago (...)": the last break
  // of a stream to this peer (frames handed to gRPC then are lost, though
  // nothing was left unsent to say so), for a receive timeout's message;
  // "" if none broke.
  std::string LastBreakNote() const { return last_break_->Note(); }

  // What the current stream has queued for this peer (0 without one).
  int64_t QueuedBytes() {
    std::shared_ptr<FrameStream> stream;
    {
      AnnotatedMutexLock lock(&mu_);
      stream = stream_;
    }
    return stream == nullptr ? 0 : stream->queued_bytes();
  }

  // GrpcTransport::Abort for this peer: no waiting here; Shutdown (the
  // owner's, later) closes the cancelled stream.
  void Abort() {
    aborted_.store(true);  // Open's connection attempt checks it
    std::shared_ptr<FrameStream> stream;
    {
      AnnotatedMutexLock lock(&mu_);
      shut_down_ = true;
      stream = stream_;
    }
    if (stream != nullptr) stream->Abort();
  }

 private:
  absl::Status ShutDownError() const {
    return absl::AbortedError(absl::StrCat("transport shut down; not sending to ", name_));
  }

  // Connects (waiting up to connect_timeout) and starts a stream.
  absl::StatusOr<std::shared_ptr<FrameStream>> Open() ABSL_EXCLUSIVE_LOCKS_REQUIRED(send_mu_) {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(kMaxFrameMessageBytes);
    args.SetMaxReceiveMessageSize(kMaxFrameMessageBytes);
    // A channel of our own per attempt: no reconnect backoff left over from
    // an earlier failure delays the attempt.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    if (!options_.tls_server_name.empty()) {
      args.SetSslTargetNameOverride(options_.tls_server_name);
    }
    SkipProxyForLoopback(address_, &args);  // `up`'s peers: not via $http_proxy
    std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
        address_,
        options_.channel_credentials != nullptr ? options_.channel_credentials
                                                : grpc::InsecureChannelCredentials(),
        args);
    // In slices, so that an Abort ends the attempt soon rather than after
    // connect_timeout (gRPC's wait cannot be woken).
    // The deadline on the monotonic clock (a wall-clock step must not end
    // or stretch the attempt); each slice's, which gRPC takes as a date,
    // from the wall clock.
    const absl::Time deadline = MonotonicClock()->Now() + options_.connect_timeout;
    while (!channel->WaitForConnected(absl::ToChronoTime(
        absl::Now() + std::min(kConnectAbortSlice, deadline - MonotonicClock()->Now())))) {
      if (aborted_.load()) return ShutDownError();
      if (MonotonicClock()->Now() < deadline) continue;
      // With TLS a refused handshake looks the same to gRPC's channel: the
      // hint names what both ends must agree on.
      const std::string tls_hint =
          options_.channel_credentials == nullptr
              ? std::string()
              : absl::StrCat(
                    "; or the TLS handshake failed: its certificate must chain to this worker's "
                    "--data-tls-ca and name ",
                    options_.tls_server_name.empty() ? "its address's host"
                                                     : "\"" + options_.tls_server_name + "\"",
                    " (--data-tls-server-name), and its --data-tls-ca must accept this worker's "
                    "--data-tls-cert (is its data plane on TLS at all?)");
      return absl::UnavailableError(absl::StrCat(
          "cannot connect to ", name_, " within ", absl::FormatDuration(options_.connect_timeout),
          ": nothing listens there or it is unreachable; check that the worker of stage ",
          peer_stage_, " is up and that the plan has its data-plane address", tls_hint));
    }
    channel_ = std::move(channel);
    stub_ = std::make_unique<FrameStub>(channel_);
    const int peer = peer_stage_;
    auto on_error = [peer, callback = options_.on_peer_error,
                     last_break = last_break_](const absl::Status& error) {
      if (absl::IsUnavailable(error)) last_break->Set(error);
      if (callback) callback(peer, error);
    };
    std::shared_ptr<FrameStream> stream = FrameStream::Start(
        stub_.get(), name_, options_, source_stage_, peer_stage_, on_error, room_waits_);
    {
      AnnotatedMutexLock lock(&mu_);
      if (!shut_down_) {
        stream_ = stream;
        return stream;
      }
    }
    stream->Close(absl::ZeroDuration());  // Shutdown came while we connected.
    return ShutDownError();
  }

  // Reports the break once and forgets the stream, so the next Send
  // reconnects.
  absl::Status RetireBroken(std::shared_ptr<FrameStream> stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(send_mu_) {
    const grpc::Status final_status = stream->Close(absl::ZeroDuration());
    {
      AnnotatedMutexLock lock(&mu_);
      if (stream_ == stream) stream_.reset();
    }
    return absl::UnavailableError(
        absl::StrCat("the stream to ", name_, " broke (", GrpcStatusText(final_status),
                     "); this tensor and frames queued before it were not delivered; the next Send "
                     "reconnects, check that worker's status and log"));
  }

  const int source_stage_;
  const int peer_stage_;
  const std::string name_;
  const std::string address_;
  const GrpcTransportOptions& options_;
  RoomWaits* const room_waits_;
  std::atomic<bool> aborted_{false};

  AnnotatedMutex send_mu_;  // Serialises Sends to this peer; held while connecting.
  std::shared_ptr<grpc::Channel> channel_ ABSL_GUARDED_BY(send_mu_);
  std::unique_ptr<FrameStub> stub_ ABSL_GUARDED_BY(send_mu_);

  AnnotatedMutex mu_;  // Never held while waiting, so Shutdown gets it at once.
  std::shared_ptr<FrameStream> stream_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;

  // Set on a gRPC thread by the streams' error callback (shared: a stream
  // may report after this link is gone).
  class BreakNote {
   public:
    void Set(const absl::Status& why) {
      AnnotatedMutexLock lock(&mu_);
      why_ = why;
      at_ = MonotonicClock()->Now();
    }
    std::string Note() const {
      AnnotatedMutexLock lock(&mu_);
      if (why_.ok()) return "";
      return absl::StrCat(
          "; this stage's own sends broke ",
          absl::FormatDuration(absl::Trunc(MonotonicClock()->Now() - at_, absl::Seconds(1))),
          " ago (", why_.message(), "): what it had handed to gRPC then was lost");
    }

   private:
    mutable AnnotatedMutex mu_;
    absl::Status why_ ABSL_GUARDED_BY(mu_);
    absl::Time at_ ABSL_GUARDED_BY(mu_);
  };
  const std::shared_ptr<BreakNote> last_break_ = std::make_shared<BreakNote>();
};

struct GrpcTransport::SendWaits {
  RoomWaits room;
};

void WaitForHeldStreamsAsLongAsReceivers(absl::Duration recv_timeout,
                                         GrpcTransportOptions* options) {
  options->queue_wait_timeout = std::max(options->queue_wait_timeout, recv_timeout);
  options->shutdown_drain_timeout = std::max(options->shutdown_drain_timeout, recv_timeout);
}

GrpcTransport::GrpcTransport(int stage, std::vector<std::string> peer_addresses, Mailbox* mailbox,
                             GrpcTransportOptions options)
    : stage_(stage),
      peer_addresses_(std::move(peer_addresses)),
      mailbox_(mailbox),
      options_(std::move(options)),
      send_waits_(std::make_unique<SendWaits>()) {
  PT_CHECK(mailbox_ != nullptr);
  PT_CHECK(stage_ >= 0 && stage_ < static_cast<int>(peer_addresses_.size()))
      << "stage " << stage_ << " of " << peer_addresses_.size();
  PT_CHECK(options_.max_frame_bytes >= 1 && options_.max_frame_bytes <= kMaxFramePayloadBytes)
      << "max_frame_bytes " << options_.max_frame_bytes;
  PT_CHECK(options_.max_queued_bytes_per_peer >= 0);
  for (size_t s = 0; s < peer_addresses_.size(); ++s) {
    links_.push_back(std::make_unique<PeerLink>(stage_, static_cast<int>(s), peer_addresses_[s],
                                                options_, &send_waits_->room));
  }
}

GrpcTransport::~GrpcTransport() { Shutdown(); }

absl::Status GrpcTransport::CheckPeer(int peer_stage) const {
  if (peer_stage >= 0 && peer_stage < static_cast<int>(links_.size())) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("peer stage ", peer_stage, " is outside [0, ", links_.size(), ") of this plan"));
}

absl::Status GrpcTransport::SendWire(int peer_stage, const TensorAddress& address,
                                     const WireTensor& wire) {
  return SendFrames(peer_stage, address, wire, nullptr);
}

absl::Status GrpcTransport::SendWireOwned(int peer_stage, const TensorAddress& address,
                                          WireTensor wire) {
  const bool lend = wire.encoded() || wire.tensor.sole_owner();
  if (!lend) return SendFrames(peer_stage, address, wire, nullptr);
  auto owner = std::make_shared<const WireTensor>(std::move(wire));
  return SendFrames(peer_stage, address, *owner, owner);
}

absl::Status GrpcTransport::SendFrames(int peer_stage, const TensorAddress& address,
                                       const WireTensor& wire,
                                       const std::shared_ptr<const WireTensor>& owner) {
  if (absl::Status s = CheckPeer(peer_stage); !s.ok()) return s;
  // The description is built only for an encoded tensor (its checks can
  // fail), a null one or a raw one of more dimensions than a frame carries:
  // a raw send, the common case, skips the formatting.
  if (wire.encoded() || wire.tensor.is_null() ||
      static_cast<int>(wire.tensor.shape().size()) > kMaxFrameRank) {
    const std::string what = absl::StrCat(address.DebugString(), " to stage ", peer_stage);
    if (absl::Status s = CheckSendable(wire, what); !s.ok()) return s;
  }
  if (shut_down_.load()) {
    return absl::AbortedError(
        absl::StrCat("transport shut down; not sending to stage ", peer_stage));
  }
  return links_[peer_stage]->Send(
      EncodeFrameBuffers(stage_, address, wire, options_.max_frame_bytes, owner));
}

absl::StatusOr<WireTensor> GrpcTransport::RecvWire(int peer_stage, const TensorAddress& address,
                                                   absl::Duration timeout) {
  if (absl::Status s = CheckPeer(peer_stage); !s.ok()) return s;
  if (shut_down_.load()) return absl::AbortedError("transport shut down");
  absl::StatusOr<WireTensor> wire = mailbox_->Take(peer_stage, address, timeout);
  if (absl::IsDeadlineExceeded(wire.status())) {
    // A stream of this stage's own to that peer that broke is named: the
    // tensor this stage waits for may answer one that was lost with it.
    return WithOwnQueuedSends(
        absl::DeadlineExceededError(
            absl::StrCat(wire.status().message(), " (stage ", peer_stage, "'s data plane is at ",
                         peer_addresses_[peer_stage], ")", links_[peer_stage]->LastBreakNote())),
        peer_stage, links_[peer_stage]->QueuedBytes(), "in its gRPC stream");
  }
  return wire;
}

void GrpcTransport::Abort() {
  shut_down_.store(true);
  for (auto& link : links_) link->Abort();
}

bool GrpcTransport::AwaitSendsWaitingForRoom(int count, absl::Duration timeout) {
  return send_waits_->room.Await(count, timeout);
}

void GrpcTransport::Shutdown() {
  shut_down_.store(true);
  // Every stream starts closing before any is waited for, and all share
  // one deadline. Closed one after another, each peer that never finished
  // its call (its host gone: the channel has no keepalive) cost a whole
  // drain (60 s by default) in turn, and the streams behind it were not
  // even half-closed meanwhile.
  const absl::Time deadline = MonotonicClock()->Now() + options_.shutdown_drain_timeout;
  std::vector<std::shared_ptr<FrameStream>> closing;
  closing.reserve(links_.size());
  for (auto& link : links_) closing.push_back(link->BeginShutdown());
  for (size_t s = 0; s < links_.size(); ++s) links_[s]->FinishShutdown(closing[s], deadline);
}

}  // namespace pipetrain
