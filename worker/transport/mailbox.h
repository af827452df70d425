// Mailbox: where received tensors wait until the program asks for them.
// It holds WireTensors as they arrived (raw or encoded); decoding is the
// receiver's (Transport::Recv).
//
// Keyed by (source stage, tensor address). Put never blocks; Take blocks
// until the tensor is there, the timeout passes (DEADLINE_EXCEEDED naming
// the source and tensor) or Shutdown is called (ABORTED). A second Put of
// the same key before it is taken is FAILED_PRECONDITION (a duplicate frame
// or a program bug).
//
// Memory is bounded (docs/operations.md "Security"), so no peer can make a
// worker buffer without end:
//   - bytes: at most MailboxLimits::max_bytes of tensors (their wire bytes)
//     wait at once, counting the tensors still being received that Reserve
//     admitted (their memory is allocated before their last frame comes);
//     an Admit, Reserve or Put beyond it is RESOURCE_EXHAUSTED, but a
//     receiver that can wait asks ReserveOrHold and holds a tensor that
//     only lacks room now until a Take (or a job's end) makes room, as the
//     windows below hold theirs: a stage that takes slower than its peer
//     sends (GPipe) slows the peer instead of failing the job. A tensor
//     larger than the whole limit is refused at once: no wait lets it in.
//     But a tensor a Take is blocked on is never held for room (it may be
//     what would free it): ReserveOrHold admits it past the limit, at most
//     one per key that Takes wait for, so the mailbox exceeds max_bytes
//     (and max_tensors) only by tensors its stage is blocked on, each of
//     them within max_bytes (one whose Take gave up first stays until it
//     is taken or its job ends).
//   - count: at most MailboxLimits::max_tensors tensors wait at once
//     (reserved ones included). Each costs memory besides its bytes (its
//     map entry, address and shape), and a tensor of no bytes (a shape
//     with a 0) costs no bytes at all: without a count, a peer could store
//     millions of them under any byte limit. Held for room alike.
//   - run-ahead window: once a job is opened (OpenJob), a tensor of an
//     iteration more than run_ahead_iterations past the job's current
//     iteration (the first iteration, or the latest one a Take asked for)
//     is beyond the window. Put and Admit refuse it (RESOURCE_EXHAUSTED),
//     but a receiver that can wait asks HoldBeyondWindow first and holds
//     such a tensor back until the window reaches it: the data plane stops
//     reading that peer's stream, so the peer's own bounded send queue
//     makes it wait (backpressure). Legal programs do run further ahead
//     than the window (e.g. a last stage that only runs a forward pass and
//     sends nothing back), so for them the window paces the sender instead
//     of failing the job.
//   - evaluation window: the validation pass is forward only, so nothing
//     paces a stage that sends its EVAL_ACTIVATIONs faster than the next
//     stage takes them (one iteration holds them all: up to thousands of
//     micro-batches with a large eval_windows). An EVAL_ACTIVATION of the
//     open job more than eval_run_ahead_micro_batches past the latest one
//     a Take asked for in its iteration (or past -1 before any) is beyond
//     the window too, held back and refused alike.
// Admit answers the same question before a tensor's frames are assembled,
// so a refused tensor is never buffered at all; Reserve also sets its bytes
// aside until it is stored (Put) or given up (the Reservation destroyed), so
// tensors being assembled on several streams at once cannot together pass
// max_bytes. A tensor of a job that is no longer open (OpenJob of another,
// DropJob, AbortJob) no longer counts: its reservation is revoked, and its
// buffer, if its stream stalls, is memory beyond the limit until the
// stream ends (the data plane ends the streams of a job it no longer
// accepts: DataPlaneServer::SetJob).
//
// Held tensors and their wake-ups (HoldBeyondWindow, ReserveOrHold):
//
//   HoldBeyondWindow --beyond the window--> held --released--> wake runs once
//   ReserveOrHold ----only room lacks-----> held      |
//         | otherwise: 0, nothing held        | CancelHold: true
//         v                                   v
//   Admit decides (ReserveOrHold: reserved)  forgotten, no wake
//
// Released by: a Take that moves the window over it (a window's hold) or
// that leaves room for it, or that starts waiting for its very tensor (a
// hold for room; asked again, it is admitted); WakeHeldForRoom when room for
// it was given back; OpenJob; DropJob or AbortJob of its job (and, for
// room, of any job whose tensors made room for it); Shutdown.
// A wake runs after the mailbox's lock is released, on the thread of the
// call that released it, so it may call the mailbox again.
//
// No wake is lost: a hold is registered under the same lock as the check
// that it must wait, and room is freed only under that lock too (a Take, a
// Reservation given back, a job dropped), so room freed before the check
// is seen by it and room freed after it releases the hold. Likewise a
// Take records the key it waits for under that lock before it looks for a
// hold of it, so its tensor is either released from its hold or admitted
// when it comes: a stage blocked on one tensor (a collective's chunk, a
// gradient) while the mailbox is full of tensors it takes only later (the
// next iteration's activations, within the run-ahead window) gets it.
// What is left: a tensor behind another that is held for room on the same
// stream waits with that stream, and its Take gets DEADLINE_EXCEEDED at its
// timeout (the message says streams wait for room), a peer failure the job
// recovers from (before holds for room, the one ahead was refused and the
// job failed at once).
//
// Thread-safe.
#ifndef PIPETRAIN_WORKER_TRANSPORT_MAILBOX_H_
#define PIPETRAIN_WORKER_TRANSPORT_MAILBOX_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/annotated_mutex.h"
#include "common/data_plane_limits.h"
#include "worker/transport/transport.h"

namespace pipetrain {

struct MailboxLimits {
  // Most bytes of tensors waiting at once, all jobs together (the worker's
  // --mailbox-limit). A GPipe stage may hold every micro-batch's activation
  // of an iteration; the default leaves room for large models, and for the
  // largest tensor the data plane takes (common/data_plane_limits.h).
  int64_t max_bytes = kMaxDataPlaneTensorBytes;
  // Iterations past the job's current one that frames may be for.
  int64_t run_ahead_iterations = 2;
  // Most tensors waiting (or reserved) at once, all jobs together: far
  // more than a program keeps in flight (micro-batches x links, a ring's
  // chunks), a few tens of MB of entries at most.
  int64_t max_tensors = 65536;
  // Validation micro-batches past the latest one taken that EVAL_ACTIVATION
  // frames may be for (the evaluation window above): enough to keep a
  // pipeline of forward passes busy, few enough that a stage holds a few
  // activations, not a whole validation pass.
  int64_t eval_run_ahead_micro_batches = 8;
};

class Mailbox {
 public:
  explicit Mailbox(MailboxLimits limits = {}) : limits_(limits) {}

  // Bytes Reserve set aside for one tensor being received: they count
  // against max_bytes until Put stores the tensor with it (they become the
  // stored tensor's), the Reservation is destroyed (they are given back),
  // or the mailbox revokes it, whichever comes first. OpenJob of another
  // job and DropJob or AbortJob of its own revoke it: a tensor of a job
  // that will never be taken must not keep room from the next job (a
  // stream that stalls in the middle of one holds its Reservation for as
  // long as it stays open). Move-only; a default one reserves nothing. Must
  // not outlive its Mailbox. Not thread-safe itself (one owner), but may be
  // destroyed on any thread, concurrently with calls on the mailbox.
  class Reservation {
   public:
    // (Members set here, not by default initializers, so that Put can
    // default its Reservation argument within Mailbox.)
    Reservation() noexcept : mailbox_(nullptr), ticket_(0), bytes_(0) {}
    Reservation(Reservation&& other) noexcept;
    Reservation& operator=(Reservation&& other) noexcept;
    ~Reservation();

    int64_t bytes() const { return bytes_; }

   private:
    friend class Mailbox;
    Reservation(Mailbox* mailbox, int64_t ticket, int64_t bytes)
        : mailbox_(mailbox), ticket_(ticket), bytes_(bytes) {}
    void Release();

    Mailbox* mailbox_;  // null: reserves nothing.
    int64_t ticket_;    // its key in Mailbox::live_reservations_ (gone once revoked)
    int64_t bytes_;
  };

  // The worker starts running `job_id` from `first_iteration`: the job's
  // current iteration for the run-ahead window (every hold is woken, so a
  // held tensor of another job is then refused and one of `job_id` is
  // measured against the new window), and it is no longer aborted
  // (AbortJob); other jobs' abort marks and tensors are forgotten (their
  // runners are gone), so the mailbox keeps no state for old jobs, and from
  // now on a tensor of any other job is refused (FAILED_PRECONDITION):
  // a worker runs one job, and a re-planned job is another data-plane job
  // (worker/agent/job_runner.h DataPlaneJobId), so a straggling frame of
  // the old plan can never be taken as one of the new.
  void OpenJob(const std::string& job_id, int64_t first_iteration);
  // OK when a tensor of `wire_bytes` for `address` would be accepted now
  // (the bytes stored and reserved leave room for it); RESOURCE_EXHAUSTED
  // naming the limit (bytes, or the run-ahead window), FAILED_PRECONDITION
  // for another job than the open one, or ABORTED for a job stopped by
  // AbortJob (until OpenJob) otherwise. Reserves nothing: two Admits may
  // both say OK for room that only one tensor fits (use Reserve for that).
  absl::Status Admit(const TensorAddress& address, int64_t wire_bytes) const;
  // Admit, and if it says OK, sets `wire_bytes` aside for the tensor until
  // the returned Reservation is passed to Put or destroyed (requires
  // wire_bytes >= 0). Admit's errors otherwise (nothing reserved).
  absl::StatusOr<Reservation> Reserve(const TensorAddress& address, int64_t wire_bytes);

  // For a receiver that can wait instead of having a tensor refused as
  // beyond the run-ahead or evaluation window (DataPlaneServer). Returns 0 when the
  // window does not hold a tensor of `address` back: it is within the
  // window, of another job than the open one, of an aborted job, or the
  // mailbox is shut down; Admit then decides as for any tensor, and `wake`
  // is dropped. Otherwise keeps `wake` and returns its ticket (> 0).
  // `wake` then runs exactly once, unless CancelHold(ticket) returns true
  // first: when a Take moves the window over the tensor, or OpenJob,
  // DropJob or AbortJob of its job, or Shutdown is called; on that call's
  // thread, after the mailbox's lock is released (so it may call the
  // mailbox, but must not block for long: it delays that call). A wake is
  // no promise that the tensor is now within the window: ask again.
  using WindowWake = std::function<void()>;
  int64_t HoldBeyondWindow(const TensorAddress& address, WindowWake wake);
  // Reserve, for a receiver that can wait for room (DataPlaneServer, after
  // HoldBeyondWindow said 0), of the tensor at (source_stage, address):
  // sets *hold to 0 and returns what Reserve would (`wake` dropped), unless
  // Reserve would refuse the tensor only for lack of room now: the bytes
  // stored and reserved leave too few for it, or max_tensors wait or are
  // being received, though it fits the whole byte limit (and max_tensors >
  // 0) and the mailbox is not shut down. Then, if a Take waits for that key
  // and no other tensor of it is reserved past the limit or waiting, it is
  // reserved all the same (past the limit: the stage is blocked on it, and
  // only the Take frees room). Otherwise nothing is reserved, `wake` is
  // kept as a hold whose ticket (> 0) goes to *hold, and Reserve's
  // RESOURCE_EXHAUSTED ("mailbox full") is returned, so that the caller
  // takes nothing of the tensor yet. `wake` then runs exactly once, unless
  // CancelHold(ticket) returns true first: when a Take or WakeHeldForRoom
  // finds room for `wire_bytes`, or a Take starts waiting for the key (not
  // reserved for it: ask again, and the tensor may be held again), or
  // OpenJob, DropJob, AbortJob or Shutdown; as HoldBeyondWindow's wake.
  // Requires wire_bytes >= 0.
  absl::StatusOr<Reservation> ReserveOrHold(int source_stage, const TensorAddress& address,
                                            int64_t wire_bytes, WindowWake wake, int64_t* hold);
  // Wakes the holds for room (ReserveOrHold) whose tensor fits now, on this
  // thread after the lock is released. Take, OpenJob, DropJob and AbortJob
  // do it themselves; a Reservation given back (destroyed, or ended by a
  // Put that refused its tensor) does not, because its owner may hold a
  // lock that the wakes take (the data plane's stream holds its own): the
  // owner calls this once it holds no such lock, or the holds wait for the
  // next Take. Thread-safe; cheap when nothing is held.
  void WakeHeldForRoom();
  // Forgets the hold `ticket` (either kind): true when its wake will never
  // run; false when it has run or is about to (it was released already).
  bool CancelHold(int64_t ticket);
  // How many tensors are held back now, by a window or for room (one per
  // waiting stream at most).
  size_t held() const;
  // Waits up to `timeout` until exactly `count` tensors are held; returns
  // whether that happened. For tests and diagnostics.
  bool AwaitHeld(size_t count, absl::Duration timeout) const;
  // Stores `wire` under (source_stage, address). FAILED_PRECONDITION naming
  // the source and tensor if that key is already waiting; otherwise as
  // Admit (nothing is stored when it refuses), where the bytes of
  // `reservation` (from this mailbox's Reserve, for this tensor) count as
  // room for it, and one that ReserveOrHold made past the limit for a Take
  // is room enough. The reservation ends either way: its bytes become the
  // stored tensor's, or are given back.
  absl::Status Put(int source_stage, const TensorAddress& address, WireTensor wire,
                   Reservation reservation = Reservation());
  // The data plane refused a frame of the tensor at (source_stage,
  // address) with `why` (the mailbox full, a malformed frame): its sender
  // learns it only at its next send, and this stage's Take of it would
  // wait out its whole timeout and blame the peer. Noted, so that the Take
  // fails at once with `why`. Only for the open job, only while no tensor
  // waits at that key (a refused duplicate is no news), at most
  // kMaxRefusalNotes at once (beyond, the Take times out as before);
  // forgotten when taken, and with their job (OpenJob, DropJob, AbortJob).
  // The caller vouches that the frame came from `source_stage` (its
  // authenticated stream), so a peer can mark only the sends of a stage
  // its stream proved (a worker of the job can prove only itself:
  // common/data_plane_keys.h), never another job's.
  void NoteRefused(int source_stage, const TensorAddress& address, const absl::Status& why);
  static constexpr size_t kMaxRefusalNotes = 1024;
  // Waits up to `timeout` for the key and removes it (see the file comment
  // for DEADLINE_EXCEEDED and ABORTED; a refused tensor: NoteRefused). Asking
  // for a later iteration of the open job moves the run-ahead window, and
  // for a later validation micro-batch the evaluation window, which first
  // wakes the holds it releases (on this thread). The tensor taken frees
  // room: the holds for room it makes fit are woken before it returns (on
  // this thread). While it waits, its tensor is not held for room: a hold
  // of it is woken (on this thread, before the wait) and it is admitted
  // past the limit (ReserveOrHold). DEADLINE_EXCEEDED says so when streams
  // are held for room (the tensor may be behind one: --mailbox-limit).
  absl::StatusOr<WireTensor> Take(int source_stage, const TensorAddress& address,
                                  absl::Duration timeout);
  // Wakes all waiters with ABORTED; later Takes fail at once. Wakes every
  // hold (HoldBeyondWindow then holds nothing more).
  void Shutdown();
  // Drops every tensor of `job_id` (e.g. after a cancel) and wakes its holds,
  // and the holds for room (of any job) that now fit.
  void DropJob(const std::string& job_id);
  // DropJob, and every current or later Take for `job_id` fails with
  // ABORTED: how a STOP interrupts a stage blocked in a receive. Until the
  // next OpenJob, Admit and Put refuse its tensors (nothing of it is
  // stored). Its held tensors are woken and then no longer held (Admit
  // refuses them); so are the holds for room that now fit.
  void AbortJob(const std::string& job_id);
  size_t size() const;
  // Wire bytes of the tensors waiting.
  int64_t bytes() const;
  // Bytes set aside by the Reservations alive (tensors being received).
  int64_t reserved() const;

 private:
  using Key = std::pair<int, TensorAddress>;
  struct Hold {
    TensorAddress address;
    WindowWake wake;
    bool for_room = false;  // ReserveOrHold's; else HoldBeyondWindow's.
    int64_t bytes = 0;      // For room: the tensor's wire bytes,
    int source_stage = 0;   // and its sender (a Take wakes the hold of its key).
  };
  // A key Takes wait for: how many, and the ticket of the Reservation
  // ReserveOrHold made past the limit for it (0: none yet).
  struct Awaited {
    int takers = 0;
    int64_t past_limit = 0;
  };
  using Wakes = std::vector<WindowWake>;

  // Beyond the run-ahead or the evaluation window.
  bool BeyondWindowLocked(const TensorAddress& address) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool BeyondEvalWindowLocked(const TensorAddress& address) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Admit; `for_room`, when given, says whether a refusal is only for lack
  // of room now (bytes or count), which Takes and given-back reservations
  // can end.
  absl::Status AdmitLocked(const TensorAddress& address, int64_t wire_bytes,
                           bool* for_room = nullptr) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reserves `wire_bytes` for a tensor of `job_id` that AdmitLocked took,
  // or (`past_limit`) that a Take waits for (ReserveOrHold).
  Reservation ReserveLocked(const std::string& job_id, int64_t wire_bytes, bool past_limit = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a tensor of `wire_bytes` fits the bytes and count left now.
  bool RoomForLocked(int64_t wire_bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropJobLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the Reservation `ticket`: its bytes no longer count. Nothing when
  // it was revoked already.
  void EndReservationLocked(int64_t ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Revokes the live Reservations whose job `revoke(job_id)` selects.
  void RevokeReservationsLocked(const std::function<bool(const std::string&)>& revoke)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the holds `release(hold)` selects and returns their wakes,
  // to be run by RunWakes once mu_ is released.
  Wakes ReleaseHoldsLocked(const std::function<bool(const Hold&)>& release)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The holds for room whose tensor fits now.
  Wakes ReleaseRoomHoldsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The holds of `job_id` (dropped or aborted), and those for room that fit.
  Wakes ReleaseJobHoldsLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether ReserveOrHold may reserve a tensor of `key` past the limit:
  // a Take waits for it, and no other of it is so reserved or waiting.
  bool MayPassLimitLocked(const Key& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Take's wait and removal of `key`.
  absl::StatusOr<WireTensor> TakeLocked(const Key& key, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void RunWakes(Wakes wakes);

  const MailboxLimits limits_;
  mutable AnnotatedMutex mu_;
  std::map<Key, WireTensor> tensors_ ABSL_GUARDED_BY(mu_);
  std::map<Key, absl::Status> refused_ ABSL_GUARDED_BY(mu_);  // NoteRefused
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Of the Reservations alive and not revoked; bytes_ + reserved_ <= max_bytes,
  // but for the tensors reserved past it for Takes (awaited_).
  int64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
  // The Reservations alive and not revoked; tensors_.size() + reservations_
  // <= max_tensors, but for those same tensors.
  int64_t reservations_ ABSL_GUARDED_BY(mu_) = 0;
  // Those Reservations by ticket: their job and bytes, and whether
  // ReserveOrHold made it past the limit for a Take.
  struct LiveReservation {
    std::string job_id;
    int64_t bytes = 0;
    bool past_limit = false;
  };
  std::map<int64_t, LiveReservation> live_reservations_ ABSL_GUARDED_BY(mu_);
  // The opened job and its current iteration (OpenJob, then Take).
  std::string open_job_ ABSL_GUARDED_BY(mu_);
  int64_t current_iteration_ ABSL_GUARDED_BY(mu_) = 0;
  // The evaluation window (OpenJob, then Take): the iteration of the latest
  // EVAL_ACTIVATION taken and the highest micro-batch taken in it.
  int64_t eval_iteration_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t eval_taken_ ABSL_GUARDED_BY(mu_) = -1;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::set<std::string> aborted_jobs_ ABSL_GUARDED_BY(mu_);
  // The keys Takes wait for now (added before a Take looks for holds of
  // its key, removed when it returns).
  std::map<Key, Awaited> awaited_ ABSL_GUARDED_BY(mu_);
  // Tensors held back by a window or for room, by ticket.
  std::map<int64_t, Hold> holds_ ABSL_GUARDED_BY(mu_);
  int64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRANSPORT_MAILBOX_H_
