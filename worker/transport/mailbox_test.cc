#include "worker/transport/mailbox.h"

#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TensorAddress Activation(const std::string& job_id, int unit) {
  return {job_id, /*iteration=*/7, v1::TENSOR_KIND_ACTIVATION, /*micro_batch=*/1, unit};
}

TEST(MailboxTest, Take_AfterPut_ReturnsTheTensorOnce) {
  Mailbox mailbox;
  ASSERT_TRUE(
      mailbox.Put(2, Activation("j-1", 3), WireTensor::Raw(Tensor::FromVector({2}, {1.5f, -2.f})))
          .ok());
  EXPECT_EQ(mailbox.size(), 1u);

  absl::StatusOr<WireTensor> got = mailbox.Take(2, Activation("j-1", 3), absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->tensor.ToVector(), (std::vector<float>{1.5f, -2.f}));
  EXPECT_EQ(mailbox.size(), 0u);
  EXPECT_EQ(mailbox.Take(2, Activation("j-1", 3), absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(MailboxTest, Take_EncodedPut_ReturnsItUnchanged) {
  Mailbox mailbox;
  const std::string payload("\x01\x00\xffpayload", 10);
  ASSERT_TRUE(
      mailbox.Put(0, Activation("j-1", 3), WireTensor::Encoded("fp16", payload, {2, 3})).ok());

  absl::StatusOr<WireTensor> got = mailbox.Take(0, Activation("j-1", 3), absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->encoded());
  EXPECT_EQ(got->codec, "fp16");
  EXPECT_EQ(got->payload, payload);
  EXPECT_EQ(got->shape, (Shape{2, 3}));
  EXPECT_TRUE(got->tensor.is_null());
}

TEST(MailboxTest, Take_SameAddressFromOtherStage_DoesNotMatch) {
  Mailbox mailbox;
  ASSERT_TRUE(mailbox.Put(0, Activation("j-1", 3), WireTensor::Raw(Tensor::Zeros({1}))).ok());
  EXPECT_EQ(mailbox.Take(1, Activation("j-1", 3), absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(mailbox.Take(0, Activation("j-1", 3), absl::ZeroDuration()).ok());
}

TEST(MailboxTest, Take_PutLaterFromAnotherThread_WakesAndReturnsIt) {
  Mailbox mailbox;
  absl::Notification taking;
  absl::StatusOr<WireTensor> got;
  std::thread consumer([&] {
    taking.Notify();
    got = mailbox.Take(0, Activation("j-1", 4), absl::Seconds(60));
  });
  taking.WaitForNotification();
  ASSERT_TRUE(
      mailbox.Put(0, Activation("j-1", 4), WireTensor::Raw(Tensor::FromVector({1}, {9.f}))).ok());
  consumer.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->tensor.ToVector(), std::vector<float>{9.f});
}

TEST(MailboxTest, Take_NeverPut_DeadlineExceededNamesSourceAndTensor) {
  Mailbox mailbox;
  absl::StatusOr<WireTensor> got = mailbox.Take(2, Activation("j-1", 3), absl::Milliseconds(1));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(got.status().message().find(
                "for ACTIVATION of unit 3, micro-batch 1, iteration 7 (job j-1) from stage 2"),
            std::string::npos)
      << got.status();
}

TEST(MailboxTest, Put_DuplicateBeforeTake_FailedPrecondition) {
  Mailbox mailbox;
  ASSERT_TRUE(mailbox.Put(1, Activation("j-1", 3), WireTensor::Raw(Tensor::Zeros({1}))).ok());
  absl::Status status = mailbox.Put(1, Activation("j-1", 3), WireTensor::Raw(Tensor::Zeros({1})));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("duplicate tensor from stage 1: ACTIVATION of unit 3"),
            std::string::npos)
      << status;
  EXPECT_EQ(mailbox.size(), 1u);
}

TEST(MailboxTest, Shutdown_WhileTakeWaits_WakesItWithAborted) {
  Mailbox mailbox;
  absl::Notification taking;
  absl::StatusOr<WireTensor> got;
  std::thread consumer([&] {
    taking.Notify();
    got = mailbox.Take(0, Activation("j-1", 4), absl::InfiniteDuration());
  });
  taking.WaitForNotification();
  mailbox.Shutdown();
  consumer.join();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kAborted);
}

TEST(MailboxTest, Take_AfterShutdown_AbortedEvenIfPresent) {
  Mailbox mailbox;
  ASSERT_TRUE(mailbox.Put(0, Activation("j-1", 3), WireTensor::Raw(Tensor::Zeros({1}))).ok());
  mailbox.Shutdown();
  EXPECT_EQ(mailbox.Take(0, Activation("j-1", 3), absl::Seconds(10)).status().code(),
            absl::StatusCode::kAborted);
}

TEST(MailboxTest, DropJob_RemovesOnlyThatJobsTensors) {
  Mailbox mailbox;
  ASSERT_TRUE(mailbox.Put(0, Activation("old", 1), WireTensor::Raw(Tensor::Zeros({1}))).ok());
  ASSERT_TRUE(mailbox.Put(1, Activation("old", 2), WireTensor::Raw(Tensor::Zeros({1}))).ok());
  ASSERT_TRUE(mailbox.Put(0, Activation("new", 1), WireTensor::Raw(Tensor::Zeros({1}))).ok());

  mailbox.DropJob("old");

  EXPECT_EQ(mailbox.size(), 1u);
  EXPECT_EQ(mailbox.Take(0, Activation("old", 1), absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(mailbox.Take(0, Activation("new", 1), absl::ZeroDuration()).ok());
  // A dropped key may be filled again (e.g. the job restarts).
  EXPECT_TRUE(mailbox.Put(0, Activation("old", 1), WireTensor::Raw(Tensor::Zeros({1}))).ok());
}

TEST(MailboxTest, AbortJob_WhileTakeWaits_WakesItWithAbortedNamingJob) {
  Mailbox mailbox;
  absl::Notification taking;
  absl::StatusOr<WireTensor> got;
  std::thread consumer([&] {
    taking.Notify();
    got = mailbox.Take(0, Activation("j-1", 4), absl::InfiniteDuration());
  });
  taking.WaitForNotification();
  mailbox.AbortJob("j-1");
  consumer.join();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(got.status().message().find("job j-1 was stopped"), std::string::npos) << got.status();
}

TEST(MailboxTest, AbortJob_OtherJobsUnaffected) {
  Mailbox mailbox;
  ASSERT_TRUE(mailbox.Put(0, Activation("j-1", 1), WireTensor::Raw(Tensor::Zeros({1}))).ok());
  ASSERT_TRUE(mailbox.Put(0, Activation("j-2", 1), WireTensor::Raw(Tensor::Zeros({1}))).ok());
  mailbox.AbortJob("j-1");
  EXPECT_EQ(mailbox.size(), 1u);
  EXPECT_EQ(mailbox.Take(0, Activation("j-1", 1), absl::Seconds(10)).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_TRUE(mailbox.Take(0, Activation("j-2", 1), absl::ZeroDuration()).ok());
}

// Between a runner's Stop (AbortJob) and the next OpenJob, peers may still
// send frames of the stopped job: they are refused, so they neither count
// against max_bytes nor survive into a reopened job of the same id.
TEST(MailboxTest, AbortJob_LaterPutOrAdmit_AbortedAndNothingStored) {
  Mailbox mailbox(MailboxLimits{.max_bytes = 16});
  mailbox.OpenJob("j-1", 7);
  mailbox.AbortJob("j-1");
  const WireTensor three = WireTensor::Raw(Tensor::FromVector({3}, {1, 2, 3}));  // 12 bytes
  absl::Status put = mailbox.Put(0, Activation("j-1", 1), three);
  EXPECT_EQ(put.code(), absl::StatusCode::kAborted) << put;
  EXPECT_NE(put.message().find("tensor for job j-1, which was stopped on this worker; refused"),
            std::string::npos)
      << put;
  EXPECT_EQ(mailbox.Admit(Activation("j-1", 1), 12).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(mailbox.size(), 0u);
  EXPECT_EQ(mailbox.bytes(), 0);
  // The job runs again: the stale frame is not there to be taken as its own.
  mailbox.OpenJob("j-1", 7);
  EXPECT_EQ(mailbox.Take(0, Activation("j-1", 1), absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(mailbox.Put(0, Activation("j-1", 1), three).ok());
}

TEST(MailboxTest, Put_BeyondByteLimit_ResourceExhaustedUntilTaken) {
  Mailbox mailbox(MailboxLimits{.max_bytes = 16});
  const WireTensor three = WireTensor::Raw(Tensor::FromVector({3}, {1, 2, 3}));  // 12 bytes
  ASSERT_TRUE(mailbox.Put(0, Activation("j-1", 1), three).ok());
  EXPECT_EQ(mailbox.bytes(), 12);
  absl::Status full = mailbox.Put(0, Activation("j-1", 2), three);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("the limit of 16 (--mailbox-limit)"), std::string::npos) << full;
  EXPECT_EQ(mailbox.Admit(Activation("j-1", 2), 12).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(mailbox.Take(0, Activation("j-1", 1), absl::ZeroDuration()).ok());
  EXPECT_EQ(mailbox.bytes(), 0);
  EXPECT_TRUE(mailbox.Put(0, Activation("j-1", 2), three).ok());
  mailbox.DropJob("j-1");
  EXPECT_EQ(mailbox.bytes(), 0);
}

// A tensor the data plane refused fails its Take at once with the reason,
// not at the timeout; only for the open job, not over a tensor that is
// there, forgotten when taken or with its job, and bounded in number.
TEST(MailboxTest, NoteRefused_TakeFailsAtOnceWithTheReason) {
  Mailbox mailbox;
  mailbox.OpenJob("j-1", 1);
  const absl::Status full = absl::ResourceExhaustedError("mailbox full");
  mailbox.NoteRefused(0, Activation("j-1", 1), full);
  const absl::StatusOr<WireTensor> refused =
      mailbox.Take(0, Activation("j-1", 1), absl::Hours(1));  // returns at once
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_NE(refused.status().message().find("from stage 0 arrived but this worker refused it: "
                                            "mailbox full"),
            std::string::npos)
      << refused.status();
  // Forgotten once reported; another stage's key is another key.
  EXPECT_EQ(mailbox.Take(0, Activation("j-1", 1), absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  mailbox.NoteRefused(1, Activation("j-1", 2), full);
  EXPECT_EQ(mailbox.Take(0, Activation("j-1", 2), absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  // A refused duplicate of a tensor that waits: the tensor is taken.
  const WireTensor one = WireTensor::Raw(Tensor::FromVector({1}, {1}));
  ASSERT_TRUE(mailbox.Put(0, Activation("j-1", 3), one).ok());
  mailbox.NoteRefused(0, Activation("j-1", 3), full);
  EXPECT_TRUE(mailbox.Take(0, Activation("j-1", 3), absl::ZeroDuration()).ok());
  // A refused copy that came first, then the tensor: taken, and the note
  // goes with it (a later Take of the key waits, as for any other).
  mailbox.NoteRefused(0, Activation("j-1", 6), full);
  ASSERT_TRUE(mailbox.Put(0, Activation("j-1", 6), one).ok());
  EXPECT_TRUE(mailbox.Take(0, Activation("j-1", 6), absl::ZeroDuration()).ok());
  EXPECT_EQ(mailbox.Take(0, Activation("j-1", 6), absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  // Another job's, or after OpenJob of another: nothing.
  mailbox.NoteRefused(0, Activation("j-2", 4), full);
  mailbox.NoteRefused(0, Activation("j-1", 5), full);
  mailbox.OpenJob("j-2", 1);
  EXPECT_EQ(mailbox.Take(0, Activation("j-2", 4), absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  mailbox.OpenJob("j-1", 1);
  EXPECT_EQ(mailbox.Take(0, Activation("j-1", 5), absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  // Bounded: past kMaxRefusalNotes, a refusal is not noted.
  for (int u = 0; u < static_cast<int>(Mailbox::kMaxRefusalNotes) + 1; ++u) {
    mailbox.NoteRefused(0, Activation("j-1", 100 + u), full);
  }
  EXPECT_EQ(mailbox.Take(0, Activation("j-1", 100), absl::ZeroDuration()).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(mailbox
                .Take(0, Activation("j-1", 100 + static_cast<int>(Mailbox::kMaxRefusalNotes)),
                      absl::ZeroDuration())
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded);
}

// Tensors of no bytes (a shape with a 0) cost memory all the same: their
// count is bounded too, reservations included, and taking one makes room.
TEST(MailboxTest, Put_EmptyTensorsBeyondCountLimit_ResourceExhaustedUntilTaken) {
  Mailbox mailbox(MailboxLimits{.max_bytes = 16, .max_tensors = 3});
  const WireTensor empty = WireTensor::Raw(Tensor::Zeros({0}));
  ASSERT_TRUE(mailbox.Put(0, Activation("j-1", 1), empty).ok());
  ASSERT_TRUE(mailbox.Put(0, Activation("j-1", 2), empty).ok());
  absl::StatusOr<Mailbox::Reservation> reserved = mailbox.Reserve(Activation("j-1", 3), 0);
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  EXPECT_EQ(mailbox.bytes(), 0);
  const absl::Status full = mailbox.Put(0, Activation("j-1", 4), empty);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find("the limit of 3 tensors"), std::string::npos) << full;
  EXPECT_EQ(mailbox.Admit(Activation("j-1", 4), 0).code(), absl::StatusCode::kResourceExhausted);
  // The reservation stored as its tensor still counts once; one taken frees a place.
  ASSERT_TRUE(mailbox.Put(0, Activation("j-1", 3), empty, *std::move(reserved)).ok());
  EXPECT_EQ(mailbox.Admit(Activation("j-1", 4), 0).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(mailbox.Take(0, Activation("j-1", 1), absl::ZeroDuration()).ok());
  EXPECT_TRUE(mailbox.Put(0, Activation("j-1", 4), empty).ok());
  // A reservation given back frees its place too.
  ASSERT_TRUE(mailbox.Take(0, Activation("j-1", 2), absl::ZeroDuration()).ok());
  {
    absl::StatusOr<Mailbox::Reservation> given_back = mailbox.Reserve(Activation("j-1", 5), 0);
    ASSERT_TRUE(given_back.ok()) << given_back.status();
    EXPECT_EQ(mailbox.Admit(Activation("j-1", 6), 0).code(), absl::StatusCode::kResourceExhausted);
  }
  EXPECT_TRUE(mailbox.Admit(Activation("j-1", 6), 0).ok());
}

// Tensors being received on several streams at once reserve their bytes
// when admitted, so together they stay within max_bytes: admitting each
// against the stored bytes alone would let them all allocate.
TEST(MailboxTest, Reserve_TwoPartialsOverByteLimit_SecondRefusedUntilFirstGivenBack) {
  Mailbox mailbox(MailboxLimits{.max_bytes = 16});
  absl::StatusOr<Mailbox::Reservation> first = mailbox.Reserve(Activation("j-1", 1), 12);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->bytes(), 12);
  EXPECT_EQ(mailbox.reserved(), 12);
  EXPECT_EQ(mailbox.bytes(), 0);

  absl::StatusOr<Mailbox::Reservation> second = mailbox.Reserve(Activation("j-1", 2), 12);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted) << second.status();
  EXPECT_NE(second.status().message().find(
                "mailbox full: 0 bytes wait, 12 more are reserved for tensors being received, "
                "and a tensor of 12 bytes would pass the limit of 16 (--mailbox-limit); refused"),
            std::string::npos)
      << second.status();
  EXPECT_EQ(mailbox.Admit(Activation("j-1", 2), 12).code(), absl::StatusCode::kResourceExhausted);
  const WireTensor three = WireTensor::Raw(Tensor::FromVector({3}, {1, 2, 3}));  // 12 bytes
  EXPECT_EQ(mailbox.Put(0, Activation("j-1", 2), three).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(mailbox.reserved(), 12);  // A refusal reserves nothing.

  *first = Mailbox::Reservation();  // The first tensor is abandoned: its bytes come back.
  EXPECT_EQ(mailbox.reserved(), 0);
  second = mailbox.Reserve(Activation("j-1", 2), 12);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(mailbox.reserved(), 12);
  { Mailbox::Reservation moved = *std::move(second); }  // Destroyed: given back.
  EXPECT_EQ(mailbox.reserved(), 0);
}

// Put with its tensor's reservation: the reserved bytes become the stored
// ones (not counted twice, so a tensor that filled the limit still fits).
TEST(MailboxTest, Put_WithReservation_BytesMoveFromReservedToStored) {
  Mailbox mailbox(MailboxLimits{.max_bytes = 16});
  const WireTensor three = WireTensor::Raw(Tensor::FromVector({3}, {1, 2, 3}));  // 12 bytes
  absl::StatusOr<Mailbox::Reservation> reservation = mailbox.Reserve(Activation("j-1", 1), 12);
  ASSERT_TRUE(reservation.ok()) << reservation.status();
  ASSERT_TRUE(mailbox.Put(0, Activation("j-1", 1), three, *std::move(reservation)).ok());
  EXPECT_EQ(mailbox.bytes(), 12);
  EXPECT_EQ(mailbox.reserved(), 0);
  ASSERT_TRUE(mailbox.Take(0, Activation("j-1", 1), absl::ZeroDuration()).ok());
  EXPECT_EQ(mailbox.bytes(), 0);
}

// A Put that refuses its tensor gives its reservation back all the same.
TEST(MailboxTest, Put_WithReservationRefused_ReservationGivenBack) {
  Mailbox mailbox(MailboxLimits{.max_bytes = 16});
  mailbox.OpenJob("j-1", 7);
  absl::StatusOr<Mailbox::Reservation> reservation = mailbox.Reserve(Activation("j-1", 1), 4);
  ASSERT_TRUE(reservation.ok()) << reservation.status();
  mailbox.AbortJob("j-1");  // Stopped while its tensor was being received: revoked.
  EXPECT_EQ(mailbox.reserved(), 0);
  absl::Status put = mailbox.Put(0, Activation("j-1", 1), WireTensor::Raw(Tensor::Zeros({1})),
                                 *std::move(reservation));
  EXPECT_EQ(put.code(), absl::StatusCode::kAborted) << put;
  EXPECT_EQ(mailbox.reserved(), 0);
  EXPECT_EQ(mailbox.bytes(), 0);
}

TEST(MailboxTest, Put_BeyondRunAhead_RefusedWindowFollowsTakes) {
  Mailbox mailbox;  // run-ahead 2
  mailbox.OpenJob("j-1", 5);
  TensorAddress far = Activation("j-1", 1);
  far.iteration = 8;  // 5 + 3
  absl::Status status = mailbox.Put(0, far, WireTensor::Raw(Tensor::Zeros({1})));
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("beyond the run-ahead window (this stage is at iteration 5"),
            std::string::npos)
      << status;
  TensorAddress near = far;
  near.iteration = 7;
  EXPECT_TRUE(mailbox.Put(0, near, WireTensor::Raw(Tensor::Zeros({1}))).ok());
  TensorAddress now = far;
  now.iteration = 6;
  (void)mailbox.Take(0, now, absl::ZeroDuration());  // the stage reached iteration 6
  EXPECT_TRUE(mailbox.Put(0, far, WireTensor::Raw(Tensor::Zeros({1}))).ok());
}

TensorAddress AtIteration(int64_t iteration, const std::string& job_id = "j-1") {
  TensorAddress address = Activation(job_id, 1);
  address.iteration = iteration;
  return address;
}

// A job opened near INT64_MAX: the window was current + run-ahead, a sum
// that overflowed (undefined; under UBSan an abort) for any frame of it. As
// a difference it holds at the top of the range and for the lowest
// iterations alike.
TEST(MailboxTest, Admit_JobOpenedNearInt64Max_WindowWithoutOverflow) {
  constexpr int64_t kTop = std::numeric_limits<int64_t>::max();
  Mailbox mailbox;  // run-ahead 2
  mailbox.OpenJob("j-1", kTop - 1);
  EXPECT_TRUE(mailbox.Admit(AtIteration(kTop), 4).ok());
  EXPECT_TRUE(mailbox.Admit(AtIteration(kTop - 1), 4).ok());
  EXPECT_TRUE(mailbox.Admit(AtIteration(0), 4).ok());  // behind the stage: not beyond
  Mailbox low;
  low.OpenJob("j-1", 0);
  EXPECT_TRUE(low.Admit(AtIteration(2), 4).ok());
  EXPECT_EQ(low.Admit(AtIteration(3), 4).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(low.Admit(AtIteration(kTop), 4).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(low.Admit(AtIteration(std::numeric_limits<int64_t>::min()), 4).ok());
}

// A wake that records its calls and, to prove it runs without the mailbox's
// lock, files `address` in the mailbox (a wake under the lock would deadlock).
class FilingWake {
 public:
  FilingWake(Mailbox* mailbox, TensorAddress address)
      : mailbox_(mailbox), address_(std::move(address)) {}
  Mailbox::WindowWake Make() {
    return [this] {
      ++calls_;
      put_ = mailbox_->Put(0, address_, WireTensor::Raw(Tensor::Zeros({1})));
    };
  }
  int calls() const { return calls_; }
  const absl::Status& put() const { return put_; }

 private:
  Mailbox* const mailbox_;
  const TensorAddress address_;
  int calls_ = 0;
  absl::Status put_ = absl::UnknownError("not woken");
};

TEST(MailboxTest, HoldBeyondWindow_WithinWindowOtherJobOrNoJob_HoldsNothing) {
  Mailbox unopened;
  EXPECT_EQ(unopened.HoldBeyondWindow(AtIteration(100), [] { FAIL(); }), 0);
  Mailbox mailbox;  // run-ahead 2
  mailbox.OpenJob("j-1", 5);
  EXPECT_EQ(mailbox.HoldBeyondWindow(AtIteration(7), [] { FAIL(); }), 0);
  EXPECT_EQ(mailbox.HoldBeyondWindow(AtIteration(8, "j-0"), [] { FAIL(); }), 0);  // Admit refuses
  EXPECT_EQ(mailbox.held(), 0u);
  mailbox.OpenJob("j-1", 6);  // wakes nothing: nothing is held
}

TEST(MailboxTest, HoldBeyondWindow_TakeMovesWindowOverIt_WakesOnceOutsideTheLock) {
  Mailbox mailbox;  // run-ahead 2
  mailbox.OpenJob("j-1", 5);
  FilingWake near(&mailbox, AtIteration(8));
  FilingWake far(&mailbox, AtIteration(9));
  EXPECT_GT(mailbox.HoldBeyondWindow(AtIteration(8), near.Make()), 0);
  EXPECT_GT(mailbox.HoldBeyondWindow(AtIteration(9), far.Make()), 0);
  EXPECT_EQ(mailbox.held(), 2u);
  // Held, not refused; nothing is buffered meanwhile.
  EXPECT_EQ(mailbox.size(), 0u);

  (void)mailbox.Take(0, AtIteration(5), absl::ZeroDuration());  // the window does not move
  EXPECT_EQ(near.calls(), 0);
  (void)mailbox.Take(0, AtIteration(6), absl::ZeroDuration());  // it now ends at 8
  EXPECT_EQ(near.calls(), 1);
  EXPECT_TRUE(near.put().ok()) << near.put();
  EXPECT_EQ(far.calls(), 0);
  EXPECT_EQ(mailbox.held(), 1u);
  EXPECT_TRUE(mailbox.Take(0, AtIteration(8), absl::ZeroDuration()).ok());

  // A Take of the held iteration itself: the wake runs before it waits, so
  // the Take finds what the wake filed.
  absl::StatusOr<WireTensor> got = mailbox.Take(0, AtIteration(9), absl::ZeroDuration());
  EXPECT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(far.calls(), 1);
  EXPECT_EQ(mailbox.held(), 0u);
}

TensorAddress EvalActivation(int64_t iteration, int micro_batch) {
  TensorAddress address = Activation("j-1", 3);
  address.kind = v1::TENSOR_KIND_EVAL_ACTIVATION;
  address.iteration = iteration;
  address.micro_batch = micro_batch;
  return address;
}

// The validation pass is forward only: all its EVAL_ACTIVATIONs are of one
// iteration, so the run-ahead window let a fast stage fill the next one's
// mailbox with a whole pass (thousands of micro-batches with a large
// eval_windows) until "mailbox full" failed the job. The evaluation window
// holds back those more than eval_run_ahead_micro_batches past the latest
// taken, releases them as the stage takes, starts again at each
// iteration's pass and at OpenJob, and leaves other kinds alone.
TEST(MailboxTest, EvalActivations_BeyondTheEvaluationWindow_HeldUntilTakesReachThem) {
  MailboxLimits limits;
  limits.eval_run_ahead_micro_batches = 2;
  Mailbox mailbox(limits);
  mailbox.OpenJob("j-1", 5);
  // Before any take: micro-batches 0 and 1 may come, 2 is beyond.
  EXPECT_TRUE(mailbox.Put(0, EvalActivation(6, 0), WireTensor::Raw(Tensor::Zeros({1}))).ok());
  EXPECT_TRUE(mailbox.Admit(EvalActivation(6, 1), 4).ok());
  const absl::Status refused = mailbox.Admit(EvalActivation(6, 2), 4);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(refused.message(), "beyond the evaluation window")) << refused;
  TensorAddress training = EvalActivation(6, 50);
  training.kind = v1::TENSOR_KIND_ACTIVATION;
  EXPECT_TRUE(mailbox.Admit(training, 4).ok());  // training frames: the iteration window only

  FilingWake second(&mailbox, EvalActivation(6, 2));
  FilingWake third(&mailbox, EvalActivation(6, 3));
  EXPECT_GT(mailbox.HoldBeyondWindow(EvalActivation(6, 2), second.Make()), 0);
  EXPECT_GT(mailbox.HoldBeyondWindow(EvalActivation(6, 3), third.Make()), 0);
  EXPECT_EQ(mailbox.held(), 2u);
  EXPECT_TRUE(mailbox.Take(0, EvalActivation(6, 0), absl::ZeroDuration()).ok());
  EXPECT_EQ(second.calls(), 1);  // within 0 + 2 now
  EXPECT_TRUE(second.put().ok()) << second.put();
  EXPECT_EQ(third.calls(), 0);
  EXPECT_EQ(mailbox.held(), 1u);
  (void)mailbox.Take(0, EvalActivation(6, 1), absl::ZeroDuration());
  EXPECT_EQ(third.calls(), 1);
  EXPECT_EQ(mailbox.held(), 0u);

  // The next validation pass (a later iteration) starts from micro-batch 0.
  EXPECT_TRUE(mailbox.Admit(EvalActivation(8, 1), 4).ok());
  EXPECT_EQ(mailbox.Admit(EvalActivation(8, 2), 4).code(), absl::StatusCode::kResourceExhausted);
  // As does a job opened again (a recovery), at the same iteration.
  EXPECT_TRUE(mailbox.Admit(EvalActivation(6, 3), 4).ok());  // taken up to 1
  mailbox.OpenJob("j-1", 5);
  EXPECT_EQ(mailbox.Admit(EvalActivation(6, 3), 4).code(), absl::StatusCode::kResourceExhausted);
}

TEST(MailboxTest, HoldBeyondWindow_TakeOnAnotherThread_WakesTheHold) {
  Mailbox mailbox;
  mailbox.OpenJob("j-1", 0);
  absl::Notification woken;
  ASSERT_GT(mailbox.HoldBeyondWindow(AtIteration(3), [&] { woken.Notify(); }), 0);
  std::thread stage([&] { (void)mailbox.Take(0, AtIteration(1), absl::ZeroDuration()); });
  woken.WaitForNotification();
  stage.join();
  EXPECT_EQ(mailbox.held(), 0u);
}

TEST(MailboxTest, CancelHold_BeforeRelease_WakeNeverRunsAfterReleaseFalse) {
  Mailbox mailbox;
  mailbox.OpenJob("j-1", 0);
  const int64_t cancelled = mailbox.HoldBeyondWindow(AtIteration(3), [] { FAIL(); });
  ASSERT_GT(cancelled, 0);
  EXPECT_TRUE(mailbox.CancelHold(cancelled));
  EXPECT_FALSE(mailbox.CancelHold(cancelled));
  EXPECT_EQ(mailbox.held(), 0u);

  int calls = 0;
  const int64_t released = mailbox.HoldBeyondWindow(AtIteration(3), [&] { ++calls; });
  ASSERT_GT(released, 0);
  EXPECT_NE(released, cancelled);
  (void)mailbox.Take(0, AtIteration(1), absl::ZeroDuration());
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(mailbox.CancelHold(released));  // its wake has run
}

TEST(MailboxTest, AbortJob_WhileHeld_WakesAndNoLongerHoldsButStillRefuses) {
  Mailbox mailbox;
  mailbox.OpenJob("j-1", 0);
  int calls = 0;
  ASSERT_GT(mailbox.HoldBeyondWindow(AtIteration(3), [&] { ++calls; }), 0);
  mailbox.AbortJob("j-1");
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(mailbox.held(), 0u);
  // Asked again, it is not held: the job was stopped; Admit refuses it.
  EXPECT_EQ(mailbox.HoldBeyondWindow(AtIteration(3), [] { FAIL(); }), 0);
  absl::Status admitted = mailbox.Admit(AtIteration(3), 4);
  EXPECT_EQ(admitted.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(admitted.message().find("beyond the run-ahead window (this stage is at iteration 0, "
                                    "peers may be 2 ahead); refused"),
            std::string::npos)
      << admitted;
}

TEST(MailboxTest, DropJob_WakesOnlyThatJobsHolds) {
  Mailbox mailbox;
  mailbox.OpenJob("j-1", 0);
  int calls = 0;
  ASSERT_GT(mailbox.HoldBeyondWindow(AtIteration(3), [&] { ++calls; }), 0);
  mailbox.DropJob("j-0");
  EXPECT_EQ(calls, 0);
  mailbox.DropJob("j-1");
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(mailbox.held(), 0u);
}

TEST(MailboxTest, OpenJob_WhileHeld_WakesAndMeasuresAgainstTheNewJob) {
  Mailbox mailbox;
  mailbox.OpenJob("j-1/1", 0);
  int calls = 0;
  ASSERT_GT(mailbox.HoldBeyondWindow(AtIteration(5, "j-1/1"), [&] { ++calls; }), 0);
  mailbox.OpenJob("j-1/2", 4);  // a re-plan resumes at iteration 4
  EXPECT_EQ(calls, 1);
  // The old plan's tensor is refused as another job's...
  EXPECT_EQ(mailbox.HoldBeyondWindow(AtIteration(5, "j-1/1"), [] { FAIL(); }), 0);
  EXPECT_EQ(mailbox.Admit(AtIteration(5, "j-1/1"), 4).code(),
            absl::StatusCode::kFailedPrecondition);
  // ...and the new plan's window starts at its first iteration.
  EXPECT_EQ(mailbox.HoldBeyondWindow(AtIteration(6, "j-1/2"), [] { FAIL(); }), 0);
  int new_calls = 0;
  EXPECT_GT(mailbox.HoldBeyondWindow(AtIteration(7, "j-1/2"), [&] { ++new_calls; }), 0);
  mailbox.Shutdown();
  EXPECT_EQ(new_calls, 1);
}

TEST(MailboxTest, Shutdown_WhileHeld_WakesAndHoldsNothingMore) {
  Mailbox mailbox;
  mailbox.OpenJob("j-1", 0);
  int calls = 0;
  ASSERT_GT(mailbox.HoldBeyondWindow(AtIteration(3), [&] { ++calls; }), 0);
  mailbox.Shutdown();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(mailbox.HoldBeyondWindow(AtIteration(3), [] { FAIL(); }), 0);
  EXPECT_EQ(mailbox.held(), 0u);
}

TEST(MailboxTest, AwaitHeld_CountReachedOrTimeout) {
  Mailbox mailbox;
  mailbox.OpenJob("j-1", 0);
  EXPECT_TRUE(mailbox.AwaitHeld(0, absl::ZeroDuration()));
  EXPECT_FALSE(mailbox.AwaitHeld(1, absl::ZeroDuration()));
  ASSERT_GT(mailbox.HoldBeyondWindow(AtIteration(3), [] {}), 0);
  EXPECT_TRUE(mailbox.AwaitHeld(1, absl::ZeroDuration()));
}

TEST(MailboxTest, Put_WithinWindowBeyondByteLimit_NotHeldButRefused) {
  Mailbox mailbox(MailboxLimits{.max_bytes = 8});
  mailbox.OpenJob("j-1", 0);
  EXPECT_EQ(mailbox.HoldBeyondWindow(AtIteration(2), [] { FAIL(); }), 0);
  absl::Status full = mailbox.Admit(AtIteration(2), 12);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("larger than this worker's whole mailbox limit of 8 bytes "
                                "(--mailbox-limit); refused: raise the limit above it"),
            std::string::npos)
      << full;
  // One that would fit an empty mailbox: full now, as the message says.
  ASSERT_TRUE(mailbox.Put(0, AtIteration(1), WireTensor::Raw(Tensor::Zeros({1}))).ok());
  full = mailbox.Admit(AtIteration(2), 8);
  EXPECT_NE(full.message().find("mailbox full: 4 bytes wait, 0 more are reserved"),
            std::string::npos)
      << full;
}

TEST(MailboxTest, OpenJob_RefusesOtherJobsAndDropsTheirTensors) {
  Mailbox mailbox;
  // Before any job is opened, frames of any job are taken (in-process tests).
  ASSERT_TRUE(mailbox.Put(0, Activation("j-1/1", 1), WireTensor::Raw(Tensor::Zeros({4}))).ok());
  ASSERT_TRUE(mailbox.Put(0, Activation("j-1/2", 1), WireTensor::Raw(Tensor::Zeros({2}))).ok());
  mailbox.OpenJob("j-1/2", 0);  // the job's second plan: the first plan's tensor goes
  EXPECT_EQ(mailbox.size(), 1u);
  EXPECT_EQ(mailbox.bytes(), 8);
  // A straggling frame of the old plan is refused, not buffered.
  absl::Status old = mailbox.Put(0, Activation("j-1/1", 2), WireTensor::Raw(Tensor::Zeros({1})));
  EXPECT_EQ(old.code(), absl::StatusCode::kFailedPrecondition) << old;
  EXPECT_NE(old.message().find("this worker runs j-1/2"), std::string::npos) << old;
  EXPECT_EQ(mailbox.Admit(Activation("j-1/1", 2), 4).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(mailbox.Take(0, Activation("j-1/2", 1), absl::ZeroDuration()).ok());
}

// A tensor of the old job still being received (its stream stalled in the
// middle of it) keeps no room from the next job: OpenJob revokes its
// reservation, and giving it back later changes nothing.
TEST(MailboxTest, OpenJob_RevokesOtherJobsReservations) {
  Mailbox mailbox(MailboxLimits{.max_bytes = 16, .max_tensors = 2});
  mailbox.OpenJob("j-1", 7);
  absl::StatusOr<Mailbox::Reservation> stalled = mailbox.Reserve(Activation("j-1", 1), 16);
  ASSERT_TRUE(stalled.ok()) << stalled.status();
  absl::StatusOr<Mailbox::Reservation> mine = mailbox.Reserve(Activation("j-1", 2), 0);
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(mailbox.Admit(Activation("j-1", 3), 1).code(), absl::StatusCode::kResourceExhausted);
  mailbox.OpenJob("j-2", 7);
  EXPECT_EQ(mailbox.reserved(), 0);
  absl::StatusOr<Mailbox::Reservation> next = mailbox.Reserve(Activation("j-2", 1), 16);
  ASSERT_TRUE(next.ok()) << next.status();
  absl::StatusOr<Mailbox::Reservation> another = mailbox.Reserve(Activation("j-2", 2), 0);
  ASSERT_TRUE(another.ok()) << another.status();  // the count was given back too
  *stalled = Mailbox::Reservation();              // its stream ends at last
  *mine = Mailbox::Reservation();
  EXPECT_EQ(mailbox.reserved(), 16);  // only the new job's
  EXPECT_EQ(mailbox.Admit(Activation("j-2", 3), 0).code(), absl::StatusCode::kResourceExhausted);
  // The old job's tensor completing: refused, and nothing counted twice.
  absl::StatusOr<Mailbox::Reservation> late = mailbox.Reserve(Activation("j-1", 9), 0);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  *next = Mailbox::Reservation();
  EXPECT_EQ(mailbox.reserved(), 0);
}

TEST(MailboxTest, OpenJob_ClearsAbortMarks) {
  Mailbox mailbox;
  mailbox.AbortJob("j-1");
  EXPECT_EQ(mailbox.Take(0, Activation("j-1", 1), absl::ZeroDuration()).status().code(),
            absl::StatusCode::kAborted);
  mailbox.OpenJob("j-1", 7);  // the job runs again (a new plan version)
  EXPECT_EQ(mailbox.Take(0, Activation("j-1", 1), absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

// A one-float tensor: 4 wire bytes.
WireTensor OneFloat(float value = 0) { return WireTensor::Raw(Tensor::FromVector({1}, {value})); }

// The wake of a hold that must never be released.
Mailbox::WindowWake NeverWoken() {
  return [] { ADD_FAILURE() << "a hold was woken"; };
}

// A hold for room (ReserveOrHold) that records its wakes.
struct RoomWake {
  int calls = 0;
  Mailbox::WindowWake Make() {
    return [this] { ++calls; };
  }
};

// The mailbox is full now, but the tensor fits once tensors are taken: it
// is held, nothing reserved, and woken once by the Take that makes room
// for it, not by one that makes too little or takes nothing.
TEST(MailboxTest, ReserveOrHold_FullButFitsTheLimit_HeldUntilATakeMakesRoom) {
  Mailbox mailbox(MailboxLimits{.max_bytes = 12});
  mailbox.OpenJob("j-1", 7);
  for (int unit = 1; unit <= 3; ++unit) {
    ASSERT_TRUE(mailbox.Put(0, Activation("j-1", unit), OneFloat()).ok());
  }
  RoomWake small;
  RoomWake large;
  int64_t small_hold = 0;
  int64_t large_hold = 0;
  absl::StatusOr<Mailbox::Reservation> held =
      mailbox.ReserveOrHold(0, Activation("j-1", 4), 4, small.Make(), &small_hold);
  EXPECT_EQ(held.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(held.status().message(), "mailbox full: 12 bytes wait"))
      << held.status();
  EXPECT_GT(small_hold, 0);
  held = mailbox.ReserveOrHold(0, Activation("j-1", 5), 8, large.Make(), &large_hold);
  EXPECT_EQ(held.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_GT(large_hold, 0);
  EXPECT_NE(small_hold, large_hold);
  EXPECT_EQ(mailbox.held(), 2u);
  EXPECT_EQ(mailbox.reserved(), 0);

  // A Take that finds nothing frees nothing, and says what may hold its tensor back.
  const absl::Status waited = mailbox.Take(0, Activation("j-1", 9), absl::ZeroDuration()).status();
  EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(waited.message(),
                                "or it is behind one of 2 streams waiting for room in this "
                                "worker's full mailbox (12 bytes, --mailbox-limit)"))
      << waited;
  EXPECT_EQ(small.calls + large.calls, 0);

  ASSERT_TRUE(mailbox.Take(0, Activation("j-1", 1), absl::ZeroDuration()).ok());
  EXPECT_EQ(small.calls, 1);  // 4 bytes free: room for it, not for the 8
  EXPECT_EQ(large.calls, 0);
  EXPECT_FALSE(mailbox.CancelHold(small_hold));  // its wake has run
  ASSERT_TRUE(mailbox.Take(0, Activation("j-1", 2), absl::ZeroDuration()).ok());
  EXPECT_EQ(large.calls, 1);
  EXPECT_EQ(small.calls, 1);
  EXPECT_EQ(mailbox.held(), 0u);
  // Asked again, they are reserved.
  int64_t hold = -1;
  absl::StatusOr<Mailbox::Reservation> reserved =
      mailbox.ReserveOrHold(0, Activation("j-1", 5), 8, NeverWoken(), &hold);
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  EXPECT_EQ(hold, 0);
  EXPECT_EQ(mailbox.reserved(), 8);
}

// The count limit is room too: a Take frees a place.
TEST(MailboxTest, ReserveOrHold_CountFull_HeldUntilATakeFreesAPlace) {
  Mailbox mailbox(MailboxLimits{.max_bytes = 16, .max_tensors = 2});
  const WireTensor empty = WireTensor::Raw(Tensor::Zeros({0}));
  ASSERT_TRUE(mailbox.Put(0, Activation("j-1", 1), empty).ok());
  ASSERT_TRUE(mailbox.Put(0, Activation("j-1", 2), empty).ok());
  RoomWake wake;
  int64_t hold = 0;
  absl::StatusOr<Mailbox::Reservation> held =
      mailbox.ReserveOrHold(0, Activation("j-1", 3), 0, wake.Make(), &hold);
  EXPECT_TRUE(absl::StrContains(held.status().message(), "the limit of 2 tensors"))
      << held.status();
  EXPECT_GT(hold, 0);
  ASSERT_TRUE(mailbox.Take(0, Activation("j-1", 1), absl::ZeroDuration()).ok());
  EXPECT_EQ(wake.calls, 1);
}

// No wait lets in a tensor larger than the whole limit, or one when no
// tensor may wait at all: refused at once as by Reserve, even while the
// mailbox is full. So is a tensor Admit refuses for anything but room.
TEST(MailboxTest, ReserveOrHold_LargerThanTheWholeLimitOrNotRoom_RefusedAtOnce) {
  Mailbox mailbox(MailboxLimits{.max_bytes = 12, .max_tensors = 3});
  mailbox.OpenJob("j-1", 7);
  for (int unit = 1; unit <= 3; ++unit) {
    ASSERT_TRUE(mailbox.Put(0, Activation("j-1", unit), OneFloat()).ok());
  }
  int64_t hold = -1;
  absl::StatusOr<Mailbox::Reservation> refused =
      mailbox.ReserveOrHold(0, Activation("j-1", 4), 16, NeverWoken(), &hold);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(refused.status().message(),
                                "a tensor of 16 bytes is larger than this worker's whole mailbox "
                                "limit of 12 bytes (--mailbox-limit); refused"))
      << refused.status();
  EXPECT_EQ(hold, 0);

  hold = -1;
  refused = mailbox.ReserveOrHold(0, Activation("j-0", 4), 4, NeverWoken(), &hold);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(hold, 0);
  refused = mailbox.ReserveOrHold(0, AtIteration(10), 4, NeverWoken(), &hold);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "beyond the run-ahead window"));
  EXPECT_EQ(hold, 0);
  EXPECT_EQ(mailbox.held(), 0u);

  Mailbox none(MailboxLimits{.max_bytes = 12, .max_tensors = 0});
  refused = none.ReserveOrHold(0, Activation("j-1", 1), 4, NeverWoken(), &hold);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(hold, 0);

  mailbox.Shutdown();
  refused = mailbox.ReserveOrHold(0, Activation("j-1", 4), 4, NeverWoken(), &hold);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(hold, 0);
  EXPECT_EQ(mailbox.held(), 0u);
}

// A Reservation given back frees room but wakes nothing by itself (its
// owner may hold a lock the wake takes): WakeHeldForRoom does.
TEST(MailboxTest, WakeHeldForRoom_AfterAReservationIsGivenBack_WakesTheHold) {
  Mailbox mailbox(MailboxLimits{.max_bytes = 12});
  absl::StatusOr<Mailbox::Reservation> filling = mailbox.Reserve(Activation("j-1", 1), 12);
  ASSERT_TRUE(filling.ok()) << filling.status();
  RoomWake wake;
  int64_t hold = 0;
  EXPECT_FALSE(mailbox.ReserveOrHold(0, Activation("j-1", 2), 4, wake.Make(), &hold).ok());
  ASSERT_GT(hold, 0);
  mailbox.WakeHeldForRoom();  // no room yet
  EXPECT_EQ(wake.calls, 0);
  *filling = Mailbox::Reservation();
  EXPECT_EQ(wake.calls, 0);
  mailbox.WakeHeldForRoom();
  EXPECT_EQ(wake.calls, 1);
  EXPECT_EQ(mailbox.held(), 0u);
}

// The end of a job releases holds for room: its own (asked again, they are
// refused), and those of any job its tensors kept out; a cancelled hold is
// never woken; OpenJob and Shutdown release every hold.
TEST(MailboxTest, ReserveOrHold_JobEndsOrCancelled_HoldReleasedOrForgotten) {
  Mailbox mailbox(MailboxLimits{.max_bytes = 8});
  ASSERT_TRUE(mailbox.Put(0, Activation("j-0", 1), OneFloat()).ok());  // no job open: any job
  ASSERT_TRUE(mailbox.Put(0, Activation("j-1", 1), OneFloat()).ok());
  RoomWake other;
  RoomWake cancelled;
  int64_t hold = 0;
  EXPECT_FALSE(mailbox.ReserveOrHold(0, Activation("j-2", 1), 4, other.Make(), &hold).ok());
  ASSERT_GT(hold, 0);
  EXPECT_FALSE(mailbox.ReserveOrHold(0, Activation("j-2", 2), 8, cancelled.Make(), &hold).ok());
  ASSERT_GT(hold, 0);
  EXPECT_TRUE(mailbox.CancelHold(hold));
  mailbox.DropJob("j-0");  // its tensor made room for j-2's first
  EXPECT_EQ(other.calls, 1);
  EXPECT_EQ(cancelled.calls, 0);

  mailbox.OpenJob("j-1", 7);
  ASSERT_TRUE(mailbox.Put(0, Activation("j-1", 2), OneFloat()).ok());
  RoomWake own;
  EXPECT_FALSE(mailbox.ReserveOrHold(0, Activation("j-1", 3), 4, own.Make(), &hold).ok());
  ASSERT_GT(hold, 0);
  mailbox.AbortJob("j-1");
  EXPECT_EQ(own.calls, 1);
  EXPECT_EQ(mailbox.ReserveOrHold(0, Activation("j-1", 3), 4, NeverWoken(), &hold).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(hold, 0);

  mailbox.OpenJob("j-1", 7);
  ASSERT_TRUE(mailbox.Put(0, Activation("j-1", 4), OneFloat()).ok());
  ASSERT_TRUE(mailbox.Put(0, Activation("j-1", 5), OneFloat()).ok());
  RoomWake reopened;
  RoomWake shut;
  EXPECT_FALSE(mailbox.ReserveOrHold(0, Activation("j-1", 6), 4, reopened.Make(), &hold).ok());
  ASSERT_GT(hold, 0);
  mailbox.OpenJob("j-1", 8);  // every hold is measured again
  EXPECT_EQ(reopened.calls, 1);
  EXPECT_FALSE(mailbox.ReserveOrHold(0, Activation("j-1", 6), 4, shut.Make(), &hold).ok());
  ASSERT_GT(hold, 0);
  mailbox.Shutdown();
  EXPECT_EQ(shut.calls, 1);
  EXPECT_EQ(mailbox.held(), 0u);
}

// The finding's case (a stage that takes slower than its peer sends): room
// for 3 tensors, a sender streams 6 of the current iteration as the data
// plane does (held when full, asking again at each wake), and the receiver
// takes them in order once the first 3 are in. All 6 arrive; none is
// refused (before holds for room, the 4th was).
TEST(MailboxTest, ReserveOrHold_SenderStreamsTwiceTheRoom_AllArriveInOrder) {
  constexpr absl::Duration kPatience = absl::Seconds(60);  // Deadlines only; never waited out.
  Mailbox mailbox(MailboxLimits{.max_bytes = 12});
  mailbox.OpenJob("j-1", 7);
  absl::Status sent;  // The sender's; read after join.
  std::thread sender([&] {
    for (int unit = 1; unit <= 6 && sent.ok(); ++unit) {
      for (;;) {
        auto woken = std::make_shared<absl::Notification>();
        int64_t hold = 0;
        Mailbox::WindowWake wake = [woken] { woken->Notify(); };
        absl::StatusOr<Mailbox::Reservation> reserved =
            mailbox.ReserveOrHold(0, Activation("j-1", unit), 4, std::move(wake), &hold);
        if (hold == 0) {
          sent = reserved.ok()
                     ? mailbox.Put(0, Activation("j-1", unit), OneFloat(unit), *std::move(reserved))
                     : reserved.status();
          break;
        }
        woken->WaitForNotification();  // Shutdown wakes it too, if the test fails.
      }
    }
  });
  const bool three_in = mailbox.AwaitHeld(1, kPatience);
  EXPECT_TRUE(three_in);
  EXPECT_EQ(mailbox.size(), 3u);
  for (int unit = 1; three_in && unit <= 6; ++unit) {
    absl::StatusOr<WireTensor> got = mailbox.Take(0, Activation("j-1", unit), kPatience);
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok()) break;
    EXPECT_EQ(got->tensor.ToVector(), std::vector<float>{static_cast<float>(unit)});
  }
  if (mailbox.held() > 0) mailbox.Shutdown();  // A failure above: let the sender end.
  sender.join();
  EXPECT_TRUE(sent.ok()) << sent;
  EXPECT_EQ(mailbox.held(), 0u);
  EXPECT_EQ(mailbox.bytes(), 0);
}


// A ring all-reduce's chunk from stage 2: what a stage waits for while its
// mailbox is full of tensors it takes only later.
TensorAddress Chunk(int unit) {
  return {"j-1", /*iteration=*/7, v1::TENSOR_KIND_COLLECTIVE, /*micro_batch=*/0, unit};
}

// Iteration 8's activation `unit`: within the run-ahead window of a stage
// at 7, which takes it only after its all-reduce of iteration 7.
TensorAddress NextIteration(int unit) {
  TensorAddress address = Activation("j-1", unit);
  address.iteration = 8;
  return address;
}

// Opens j-1 at iteration 7 and fills the mailbox (max_bytes 12) with
// iteration 8's activations.
void FillWithTheNextIteration(Mailbox& mailbox) {
  mailbox.OpenJob("j-1", 7);
  for (int unit = 1; unit <= 3; ++unit) {
    ASSERT_TRUE(mailbox.Put(0, NextIteration(unit), OneFloat()).ok());
  }
}

// The finding's case: the chunk the stage's all-reduce waits for comes
// while the mailbox is full of tensors the stage takes only after it, and
// is held for room. The Take wakes that hold on its own thread before it
// waits, and asked again the chunk is reserved past the limit: even a Take
// that does not wait gets it. Before, only the Take of an activation could
// free room, so the stage waited out its receive timeout.
TEST(MailboxTest, Take_OfATensorHeldForRoom_WakesItAndItIsAdmittedPastTheLimit) {
  Mailbox mailbox(MailboxLimits{.max_bytes = 12});
  FillWithTheNextIteration(mailbox);
  int64_t chunk_hold = 0;
  int64_t next_hold = 0;  // The next iteration's 4th: nobody waits for it.
  bool admitted = false;
  Mailbox::WindowWake wake = [&] {
    // Never one larger than the whole limit, awaited or not.
    int64_t hold = -1;
    const absl::Status too_large =
        mailbox.ReserveOrHold(2, Chunk(1), 16, NeverWoken(), &hold).status();
    EXPECT_TRUE(absl::StrContains(too_large.message(), "larger than this worker's whole mailbox"))
        << too_large;
    EXPECT_EQ(hold, 0);
    absl::StatusOr<Mailbox::Reservation> reserved =
        mailbox.ReserveOrHold(2, Chunk(1), 4, NeverWoken(), &hold);
    EXPECT_EQ(hold, 0);
    ASSERT_TRUE(reserved.ok()) << reserved.status();
    EXPECT_EQ(mailbox.reserved(), 4);  // Its bytes count, past the limit.
    // One per key Takes wait for: another copy of the chunk waits for room.
    int64_t copy_hold = 0;
    EXPECT_FALSE(mailbox.ReserveOrHold(2, Chunk(1), 4, NeverWoken(), &copy_hold).ok());
    EXPECT_GT(copy_hold, 0);
    EXPECT_TRUE(mailbox.CancelHold(copy_hold));
    EXPECT_TRUE(mailbox.Put(2, Chunk(1), OneFloat(5), *std::move(reserved)).ok());
    EXPECT_EQ(mailbox.bytes(), 16);
    admitted = true;
  };
  EXPECT_FALSE(mailbox.ReserveOrHold(2, Chunk(1), 4, std::move(wake), &chunk_hold).ok());
  ASSERT_GT(chunk_hold, 0);
  EXPECT_FALSE(mailbox.ReserveOrHold(0, NextIteration(4), 4, NeverWoken(), &next_hold).ok());
  ASSERT_GT(next_hold, 0);

  absl::StatusOr<WireTensor> chunk = mailbox.Take(2, Chunk(1), absl::ZeroDuration());
  ASSERT_TRUE(chunk.ok()) << chunk.status();
  EXPECT_TRUE(admitted);
  EXPECT_EQ(chunk->tensor.ToVector(), std::vector<float>{5.f});
  EXPECT_EQ(mailbox.bytes(), 12);
  EXPECT_EQ(mailbox.reserved(), 0);
  // The tensor nobody waits for is still held: the limit is full again.
  EXPECT_EQ(mailbox.held(), 1u);
  EXPECT_TRUE(mailbox.CancelHold(next_hold));
}

// A chunk that comes while its Take waits is reserved past the limit at
// once (or, if it came first, woken by the Take as above); either way the
// Take gets it without waiting out its timeout. Once the Take returns, the
// key is no longer awaited: another tensor of it waits for room again.
TEST(MailboxTest, ReserveOrHold_WhileATakeWaitsForIt_ReservedPastTheLimit) {
  constexpr absl::Duration kPatience = absl::Seconds(60);  // Deadlines only; never waited out.
  Mailbox mailbox(MailboxLimits{.max_bytes = 12});
  FillWithTheNextIteration(mailbox);
  absl::StatusOr<WireTensor> taken;
  std::thread stage([&] { taken = mailbox.Take(2, Chunk(1), kPatience); });
  // The data plane's loop: asked again at each wake (here, only the Take's).
  std::function<void()> offer = [&] {
    int64_t hold = 0;
    absl::StatusOr<Mailbox::Reservation> reserved =
        mailbox.ReserveOrHold(2, Chunk(1), 4, offer, &hold);
    if (hold != 0) return;
    EXPECT_TRUE(reserved.ok()) << reserved.status();
    if (reserved.ok()) {
      EXPECT_TRUE(mailbox.Put(2, Chunk(1), OneFloat(5), *std::move(reserved)).ok());
    }
  };
  offer();
  stage.join();
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->tensor.ToVector(), std::vector<float>{5.f});
  EXPECT_EQ(mailbox.held(), 0u);

  int64_t hold = 0;
  EXPECT_FALSE(mailbox.ReserveOrHold(2, Chunk(1), 4, NeverWoken(), &hold).ok());
  EXPECT_GT(hold, 0);
  EXPECT_TRUE(mailbox.CancelHold(hold));
}

}  // namespace
}  // namespace pipetrain
