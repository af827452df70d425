// StreamHoldRelease: when a client stream's hold may go.
//
// A gRPC callback stream (grpc::ClientBidiReactor) that is written from
// threads outside its reactions takes a hold before StartCall; gRPC ends
// the call (OnDone, after which no operation may start) only once the hold
// is removed and no operation is pending. The hold must therefore outlive
// every write such a thread has claimed but not yet started: a writer
// claims the next frame under the stream's mutex, then starts the write
// outside it (gRPC operations are not started under the mutex). If the
// owner, closing meanwhile (cancelling, since the queue did not drain),
// removed the hold in that window, the cancelled read could end the call
// first and the write would start on a finished call.
//
// This class decides who removes the hold: the closer, when no claimed
// write is outstanding, or else the writer whose start leaves none. Not
// thread-safe: the stream calls it under its own mutex, and removes the
// hold (RemoveHold) after unlocking when a call returns true.
#ifndef PIPETRAIN_WORKER_TRANSPORT_STREAM_HOLD_H_
#define PIPETRAIN_WORKER_TRANSPORT_STREAM_HOLD_H_

namespace pipetrain {

class StreamHoldRelease {
 public:
  // A writer outside the reactions claimed a write (it will start it).
  void WriteClaimed() { ++claimed_; }

  // That write was started. True: the hold goes now, by this caller.
  bool WriteStarted() {
    --claimed_;
    return Due();
  }

  // The owner closes the stream. True: the hold goes now, by this caller;
  // false: the last claimed write's WriteStarted returns true instead.
  bool CloseAsked() {
    asked_ = true;
    return Due();
  }

 private:
  // True once: when the close was asked and no claimed write is pending.
  bool Due() {
    if (!asked_ || claimed_ > 0 || released_) return false;
    released_ = true;
    return true;
  }

  int claimed_ = 0;
  bool asked_ = false;
  bool released_ = false;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRANSPORT_STREAM_HOLD_H_
