#include "worker/transport/mailbox.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace pipetrain {

Mailbox::Reservation::Reservation(Reservation&& other) noexcept
    : mailbox_(std::exchange(other.mailbox_, nullptr)),
      ticket_(std::exchange(other.ticket_, 0)),
      bytes_(std::exchange(other.bytes_, 0)) {}

Mailbox::Reservation& Mailbox::Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    Release();
    mailbox_ = std::exchange(other.mailbox_, nullptr);
    ticket_ = std::exchange(other.ticket_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

Mailbox::Reservation::~Reservation() { Release(); }

void Mailbox::Reservation::Release() {
  if (mailbox_ == nullptr) return;
  AnnotatedMutexLock lock(&mailbox_->mu_);
  mailbox_->EndReservationLocked(ticket_);
  mailbox_ = nullptr;
  ticket_ = 0;
  bytes_ = 0;
}

void Mailbox::EndReservationLocked(int64_t ticket) {
  auto it = live_reservations_.find(ticket);
  if (it == live_reservations_.end()) return;  // revoked
  reserved_ -= it->second.bytes;
  --reservations_;
  live_reservations_.erase(it);
}

void Mailbox::RevokeReservationsLocked(const std::function<bool(const std::string&)>& revoke) {
  for (auto it = live_reservations_.begin(); it != live_reservations_.end();) {
    if (!revoke(it->second.job_id)) {
      ++it;
      continue;
    }
    reserved_ -= it->second.bytes;
    --reservations_;
    it = live_reservations_.erase(it);
  }
}

void Mailbox::OpenJob(const std::string& job_id, int64_t first_iteration) {
  Wakes wakes;
  {
    AnnotatedMutexLock lock(&mu_);
    open_job_ = job_id;
    current_iteration_ = first_iteration;
    eval_iteration_ = -1;
    eval_taken_ = -1;
    aborted_jobs_.clear();
    // What is left of earlier jobs (or plan versions) will never be taken,
    // nor will the tensors still being received for them.
    RevokeReservationsLocked([&](const std::string& job) { return job != job_id; });
    for (auto it = refused_.begin(); it != refused_.end();) {
      it = it->first.second.job_id == job_id ? std::next(it) : refused_.erase(it);
    }
    for (auto it = tensors_.begin(); it != tensors_.end();) {
      if (it->first.second.job_id == job_id) {
        ++it;
      } else {
        bytes_ -= it->second.wire_bytes();
        it = tensors_.erase(it);
      }
    }
    // Every hold is measured again: against another job (refused) or the
    // new window.
    wakes = ReleaseHoldsLocked([](const Hold&) { return true; });
  }
  RunWakes(std::move(wakes));
}

bool Mailbox::BeyondWindowLocked(const TensorAddress& address) const {
  if (address.job_id != open_job_) return false;
  // As a difference, not a sum: current_iteration_ + run_ahead would
  // overflow for a job opened near INT64_MAX. The difference of two int64
  // is exact in uint64 when it is positive.
  if (address.iteration > current_iteration_ &&
      static_cast<uint64_t>(address.iteration) - static_cast<uint64_t>(current_iteration_) >
          static_cast<uint64_t>(std::max<int64_t>(0, limits_.run_ahead_iterations))) {
    return true;
  }
  return BeyondEvalWindowLocked(address);
}

bool Mailbox::BeyondEvalWindowLocked(const TensorAddress& address) const {
  if (address.job_id != open_job_ || address.kind != v1::TENSOR_KIND_EVAL_ACTIVATION) {
    return false;
  }
  const int64_t taken = address.iteration == eval_iteration_ ? eval_taken_ : -1;
  // micro_batch is an int32 and both bounds are far inside int64.
  return int64_t{address.micro_batch} - taken >
         std::max<int64_t>(1, std::min<int64_t>(limits_.eval_run_ahead_micro_batches, 1 << 30));
}

absl::Status Mailbox::AdmitLocked(const TensorAddress& address, int64_t wire_bytes,
                                  bool* for_room) const {
  if (for_room != nullptr) *for_room = false;
  if (!open_job_.empty() && address.job_id != open_job_) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor for job ", address.job_id.substr(0, 64), " but this worker runs ",
                     open_job_, "; refused"));
  }
  if (BeyondEvalWindowLocked(address)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("validation activation of micro-batch ", address.micro_batch, ", iteration ",
                     address.iteration, " of job ", address.job_id,
                     " is beyond the evaluation window (this stage has taken micro-batch ",
                     address.iteration == eval_iteration_ ? eval_taken_ : -1, ", peers may be ",
                     limits_.eval_run_ahead_micro_batches, " ahead); refused"));
  }
  if (BeyondWindowLocked(address)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tensor for iteration ", address.iteration, " of job ", address.job_id,
        " is beyond the run-ahead window (this stage is at iteration ", current_iteration_,
        ", peers may be ", limits_.run_ahead_iterations, " ahead); refused"));
  }
  // A stopped job's frames would never be taken: stored, they would hold
  // max_bytes until the next OpenJob, and a job reopened under the same id
  // (OpenJob keeps that id's tensors) could take them as its own. Checked
  // after the window, which answers a held frame of the job as before.
  if (aborted_jobs_.count(address.job_id) > 0) {
    return absl::AbortedError(absl::StrCat("tensor for job ", address.job_id,
                                           ", which was stopped on this worker; refused"));
  }
  // Larger than the whole limit: no wait would let it in, and "mailbox
  // full" would send the operator looking for a stuck peer. Checked before
  // the count, so that such a tensor is never held for room.
  if (wire_bytes > limits_.max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a tensor of ", wire_bytes, " bytes is larger than this worker's whole mailbox limit of ",
        limits_.max_bytes, " bytes (--mailbox-limit); refused: raise the limit above it"));
  }
  if (static_cast<int64_t>(tensors_.size()) + reservations_ >= limits_.max_tensors) {
    if (for_room != nullptr) *for_room = limits_.max_tensors > 0;  // A Take frees a place.
    return absl::ResourceExhaustedError(absl::StrCat(
        "mailbox full: ", tensors_.size(), " tensors wait and ", reservations_,
        " are being received, the limit of ", limits_.max_tensors, " tensors; refused"));
  }
  // Tensors still being received count too: their memory is allocated
  // when their first frame is admitted.
  if (wire_bytes > limits_.max_bytes - bytes_ - reserved_) {
    if (for_room != nullptr) *for_room = true;  // It fits the whole limit (above).
    return absl::ResourceExhaustedError(absl::StrCat(
        "mailbox full: ", bytes_, " bytes wait, ", reserved_,
        " more are reserved for tensors being received, and a tensor of ", wire_bytes,
        " bytes would pass the limit of ", limits_.max_bytes, " (--mailbox-limit); refused"));
  }
  return absl::OkStatus();
}

absl::Status Mailbox::Admit(const TensorAddress& address, int64_t wire_bytes) const {
  AnnotatedMutexLock lock(&mu_);
  return AdmitLocked(address, wire_bytes);
}

absl::StatusOr<Mailbox::Reservation> Mailbox::Reserve(const TensorAddress& address,
                                                      int64_t wire_bytes) {
  PT_CHECK(wire_bytes >= 0) << "reserving " << wire_bytes << " bytes for " << address.DebugString();
  AnnotatedMutexLock lock(&mu_);
  if (absl::Status admitted = AdmitLocked(address, wire_bytes); !admitted.ok()) return admitted;
  return ReserveLocked(address.job_id, wire_bytes);
}

Mailbox::Reservation Mailbox::ReserveLocked(const std::string& job_id, int64_t wire_bytes,
                                            bool past_limit) {
  reserved_ += wire_bytes;
  ++reservations_;
  const int64_t ticket = next_ticket_++;
  live_reservations_.emplace(ticket, LiveReservation{job_id, wire_bytes, past_limit});
  return Reservation(this, ticket, wire_bytes);
}

// The check that the tensor must wait and the hold's registration are one
// step under mu_, and every change that frees room is made under mu_ and
// followed by ReleaseRoomHoldsLocked (or, for a Reservation given back, by
// its owner's WakeHeldForRoom): room freed between the two cannot be missed.
// A Take registers its key under mu_ before it releases the holds of it,
// so a tensor the stage waits for is never held for room after that.
absl::StatusOr<Mailbox::Reservation> Mailbox::ReserveOrHold(int source_stage,
                                                            const TensorAddress& address,
                                                            int64_t wire_bytes, WindowWake wake,
                                                            int64_t* hold) {
  PT_CHECK(wire_bytes >= 0) << "reserving " << wire_bytes << " bytes for " << address.DebugString();
  *hold = 0;
  AnnotatedMutexLock lock(&mu_);
  bool for_room = false;
  absl::Status admitted = AdmitLocked(address, wire_bytes, &for_room);
  if (admitted.ok()) return ReserveLocked(address.job_id, wire_bytes);
  if (!for_room || shut_down_) return admitted;
  const Key key{source_stage, address};
  // Held, it would wait for room that only the stage's Take of it frees
  // (the mailbox may be full of tensors the stage takes later): the
  // mailbox goes past its limit by this tensor instead, which fits it.
  if (MayPassLimitLocked(key)) {
    Reservation reservation = ReserveLocked(address.job_id, wire_bytes, /*past_limit=*/true);
    awaited_[key].past_limit = reservation.ticket_;
    return reservation;
  }
  *hold = next_ticket_++;
  holds_.emplace(*hold,
                 Hold{address, std::move(wake), /*for_room=*/true, wire_bytes, source_stage});
  return admitted;
}

bool Mailbox::MayPassLimitLocked(const Key& key) const {
  auto it = awaited_.find(key);
  // Tickets start at 1, so past_limit 0 is never a live reservation.
  return it != awaited_.end() && live_reservations_.count(it->second.past_limit) == 0 &&
         tensors_.count(key) == 0;
}

bool Mailbox::RoomForLocked(int64_t wire_bytes) const {
  return static_cast<int64_t>(tensors_.size()) + reservations_ < limits_.max_tensors &&
         wire_bytes <= limits_.max_bytes - bytes_ - reserved_;
}

// Every hold that fits on its own is woken, not just as many as fit
// together: a woken stream may have been cancelled meanwhile and take
// nothing, and one that finds the room taken is held again (ReserveOrHold),
// so waking too many costs a retry, too few a hold left waiting.
Mailbox::Wakes Mailbox::ReleaseRoomHoldsLocked() {
  return ReleaseHoldsLocked([this](const Hold& held) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return held.for_room && RoomForLocked(held.bytes);
  });
}

void Mailbox::WakeHeldForRoom() {
  Wakes wakes;
  {
    AnnotatedMutexLock lock(&mu_);
    wakes = ReleaseRoomHoldsLocked();
  }
  RunWakes(std::move(wakes));
}

int64_t Mailbox::HoldBeyondWindow(const TensorAddress& address, WindowWake wake) {
  AnnotatedMutexLock lock(&mu_);
  if (shut_down_ || aborted_jobs_.count(address.job_id) > 0 || !BeyondWindowLocked(address)) {
    return 0;
  }
  const int64_t ticket = next_ticket_++;
  holds_.emplace(ticket, Hold{address, std::move(wake)});
  return ticket;
}

bool Mailbox::CancelHold(int64_t ticket) {
  AnnotatedMutexLock lock(&mu_);
  return holds_.erase(ticket) > 0;
}

size_t Mailbox::held() const {
  AnnotatedMutexLock lock(&mu_);
  return holds_.size();
}

bool Mailbox::AwaitHeld(size_t count, absl::Duration timeout) const {
  AnnotatedMutexLock lock(&mu_);
  auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return holds_.size() == count; };
  return mu_.AwaitWithTimeout(reached, timeout);
}

Mailbox::Wakes Mailbox::ReleaseHoldsLocked(const std::function<bool(const Hold&)>& release) {
  Wakes wakes;
  for (auto it = holds_.begin(); it != holds_.end();) {
    if (release(it->second)) {
      wakes.push_back(std::move(it->second.wake));
      it = holds_.erase(it);
    } else {
      ++it;
    }
  }
  return wakes;
}

void Mailbox::RunWakes(Wakes wakes) {
  for (WindowWake& wake : wakes) wake();
}

absl::Status Mailbox::Put(int source_stage, const TensorAddress& address, WireTensor wire,
                          Reservation reservation) {
  PT_CHECK(reservation.mailbox_ == nullptr || reservation.mailbox_ == this)
      << "a reservation of another mailbox for " << address.DebugString();
  AnnotatedMutexLock lock(&mu_);
  const int64_t wire_bytes = wire.wire_bytes();
  // Reserved past the limit for a Take (ReserveOrHold): room enough, even
  // though the bytes it gives back below leave too few.
  bool past_limit = false;
  if (auto live = live_reservations_.find(reservation.ticket_);
      reservation.mailbox_ != nullptr && live != live_reservations_.end()) {
    past_limit = live->second.past_limit && wire_bytes <= live->second.bytes;
  }
  // The reserved bytes end here: stored as this tensor's below, or given
  // back if it is refused. Ended before AdmitLocked, so they are room for it.
  if (reservation.mailbox_ != nullptr) EndReservationLocked(reservation.ticket_);
  reservation.mailbox_ = nullptr;
  reservation.ticket_ = 0;
  reservation.bytes_ = 0;
  bool for_room = false;
  if (absl::Status admitted = AdmitLocked(address, wire_bytes, &for_room);
      !admitted.ok() && !(past_limit && for_room)) {
    return admitted;
  }
  if (!tensors_.emplace(Key{source_stage, address}, std::move(wire)).second) {
    return absl::FailedPreconditionError(
        absl::StrCat("duplicate tensor from stage ", source_stage, ": ", address.DebugString()));
  }
  bytes_ += wire_bytes;
  return absl::OkStatus();
}

void Mailbox::NoteRefused(int source_stage, const TensorAddress& address, const absl::Status& why) {
  AnnotatedMutexLock lock(&mu_);
  const Key key{source_stage, address};
  if (why.ok() || shut_down_ || address.job_id != open_job_ || tensors_.count(key) > 0 ||
      refused_.size() >= kMaxRefusalNotes) {
    return;
  }
  refused_.emplace(key, why);
}

absl::StatusOr<WireTensor> Mailbox::Take(int source_stage, const TensorAddress& address,
                                         absl::Duration timeout) {
  const Key key{source_stage, address};
  Wakes wakes;
  {
    AnnotatedMutexLock lock(&mu_);
    bool moved = false;
    if (address.job_id == open_job_ && address.iteration > current_iteration_) {
      current_iteration_ = address.iteration;
      moved = true;
    }
    if (address.job_id == open_job_ && address.kind == v1::TENSOR_KIND_EVAL_ACTIVATION &&
        (address.iteration != eval_iteration_ || address.micro_batch > eval_taken_)) {
      if (address.iteration != eval_iteration_) eval_taken_ = -1;
      eval_iteration_ = address.iteration;
      eval_taken_ = std::max<int64_t>(eval_taken_, address.micro_batch);
      moved = true;
    }
    // From now until it returns, its tensor is admitted past the limit
    // (ReserveOrHold); one held for room already is asked again.
    ++awaited_[key].takers;
    wakes = ReleaseHoldsLocked([&](const Hold& held) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (held.for_room) return held.source_stage == source_stage && held.address == address;
      return moved && !BeyondWindowLocked(held.address);
    });
  }
  RunWakes(std::move(wakes));  // Before waiting: what they let in may be what this Take wants.
  absl::StatusOr<WireTensor> taken;
  Wakes room;
  {
    AnnotatedMutexLock lock(&mu_);
    taken = TakeLocked(key, timeout);
    if (auto it = awaited_.find(key); --it->second.takers == 0) awaited_.erase(it);
    // The room it leaves may be what a held stream waits for.
    if (taken.ok()) room = ReleaseRoomHoldsLocked();
  }
  RunWakes(std::move(room));
  return taken;
}

absl::StatusOr<WireTensor> Mailbox::TakeLocked(const Key& key, absl::Duration timeout) {
  const int source_stage = key.first;
  const TensorAddress& address = key.second;
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return shut_down_ || aborted_jobs_.count(address.job_id) > 0 || tensors_.count(key) > 0 ||
           refused_.count(key) > 0;
  };
  mu_.AwaitWithTimeout(ready, timeout);
  if (shut_down_) return absl::AbortedError("transport shut down");
  if (aborted_jobs_.count(address.job_id) > 0) {
    return absl::AbortedError(absl::StrCat("job ", address.job_id, " was stopped"));
  }
  auto it = tensors_.find(key);
  if (it == tensors_.end()) {
    if (auto refused = refused_.find(key); refused != refused_.end()) {
      const absl::Status why = std::move(refused->second);
      refused_.erase(refused);
      return absl::Status(why.code(),
                          absl::StrCat(address.DebugString(), " from stage ", source_stage,
                                       " arrived but this worker refused it: ", why.message()));
    }
    const auto held_for_room = std::count_if(holds_.begin(), holds_.end(),
                                             [](const auto& held) { return held.second.for_room; });
    return absl::DeadlineExceededError(absl::StrCat(
        "waited ", absl::FormatDuration(timeout), " for ", address.DebugString(), " from stage ",
        source_stage, "; that stage is slow, stalled or gone: check its status and log",
        held_for_room == 0
            ? ""
            : absl::StrCat("; or it is behind one of ", held_for_room,
                           " streams waiting for room in this worker's full mailbox (",
                           limits_.max_bytes, " bytes, --mailbox-limit)")));
  }
  WireTensor wire = std::move(it->second);
  tensors_.erase(it);
  bytes_ -= wire.wire_bytes();
  // A refusal noted for the same key (a malformed copy that came first)
  // is moot once the tensor is taken: kept, it would count towards
  // kMaxRefusalNotes for the rest of the job.
  refused_.erase(key);
  return wire;
}

void Mailbox::Shutdown() {
  Wakes wakes;
  {
    AnnotatedMutexLock lock(&mu_);
    shut_down_ = true;
    wakes = ReleaseHoldsLocked([](const Hold&) { return true; });
  }
  RunWakes(std::move(wakes));
}

void Mailbox::DropJobLocked(const std::string& job_id) {
  RevokeReservationsLocked([&](const std::string& job) { return job == job_id; });
  for (auto it = refused_.begin(); it != refused_.end();) {
    it = it->first.second.job_id == job_id ? refused_.erase(it) : std::next(it);
  }
  for (auto it = tensors_.begin(); it != tensors_.end();) {
    if (it->first.second.job_id == job_id) {
      bytes_ -= it->second.wire_bytes();
      it = tensors_.erase(it);
    } else {
      it = std::next(it);
    }
  }
}

// Its tensors and reservations gone, the holds for room of any job may fit.
Mailbox::Wakes Mailbox::ReleaseJobHoldsLocked(const std::string& job_id) {
  return ReleaseHoldsLocked([&](const Hold& held) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return held.address.job_id == job_id || (held.for_room && RoomForLocked(held.bytes));
  });
}

void Mailbox::DropJob(const std::string& job_id) {
  Wakes wakes;
  {
    AnnotatedMutexLock lock(&mu_);
    DropJobLocked(job_id);
    wakes = ReleaseJobHoldsLocked(job_id);
  }
  RunWakes(std::move(wakes));
}

void Mailbox::AbortJob(const std::string& job_id) {
  Wakes wakes;
  {
    AnnotatedMutexLock lock(&mu_);
    DropJobLocked(job_id);
    aborted_jobs_.insert(job_id);
    wakes = ReleaseJobHoldsLocked(job_id);
  }
  RunWakes(std::move(wakes));
}

size_t Mailbox::size() const {
  AnnotatedMutexLock lock(&mu_);
  return tensors_.size();
}

int64_t Mailbox::bytes() const {
  AnnotatedMutexLock lock(&mu_);
  return bytes_;
}

int64_t Mailbox::reserved() const {
  AnnotatedMutexLock lock(&mu_);
  return reserved_;
}

}  // namespace pipetrain
