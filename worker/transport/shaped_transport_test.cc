#include "worker/transport/shaped_transport.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "worker/transport/in_process_transport.h"

namespace pipetrain {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(LinkShaperTest, LoneMessage_TakesSizeOverBandwidthPlusLatency) {
  LinkShaper link({1e6, absl::Milliseconds(5)});  // 1 MB/s
  EXPECT_EQ(link.Schedule(kT0, 1000), kT0 + absl::Milliseconds(1) + absl::Milliseconds(5));
}

TEST(LinkShaperTest, BackToBack_SerialiseAtTheBandwidthOverlapTheLatency) {
  LinkShaper link({1e6, absl::Milliseconds(5)});
  // Three 1 ms messages handed over together: they leave the link at 1, 2
  // and 3 ms, and arrive 5 ms later each (not 5 ms apart).
  EXPECT_EQ(link.Schedule(kT0, 1000), kT0 + absl::Milliseconds(6));
  EXPECT_EQ(link.Schedule(kT0, 1000), kT0 + absl::Milliseconds(7));
  EXPECT_EQ(link.Schedule(kT0, 1000), kT0 + absl::Milliseconds(8));
  // An idle link starts the next one at its own hand-over.
  EXPECT_EQ(link.Schedule(kT0 + absl::Seconds(1), 2000),
            kT0 + absl::Seconds(1) + absl::Milliseconds(2 + 5));
}

TEST(LinkShaperTest, Throughput_IsTheBandwidth) {
  LinkShaper link({125e6, absl::Microseconds(500)});  // 1 Gbit/s
  absl::Time last;
  for (int i = 0; i < 1000; ++i) last = link.Schedule(kT0, 125000);  // 125 MB in all
  EXPECT_EQ(last - absl::Microseconds(500), kT0 + absl::Seconds(1));
}

TEST(ShapedTransportTest, DeliversEveryTensorIntactInOrderOfTheLink) {
  InProcessFabric fabric(2);
  ShapedTransport sender(fabric.Connect(0), {1e9, absl::Microseconds(100)});
  std::unique_ptr<Transport> receiver = fabric.Connect(1);
  for (int i = 0; i < 20; ++i) {
    TensorAddress a;
    a.job_id = "j";
    a.micro_batch = i;
    Tensor t = Tensor::Filled({100}, float(i));
    ASSERT_TRUE(sender.Send(1, a, t).ok());
    t.Fill(-1);  // the caller may reuse its tensor at once
  }
  for (int i = 0; i < 20; ++i) {
    TensorAddress a;
    a.job_id = "j";
    a.micro_batch = i;
    absl::StatusOr<Tensor> got = receiver->Recv(0, a, absl::Seconds(10));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->ToVector(), std::vector<float>(100, float(i)));
  }
}

// What an inner transport was handed, kept beyond its life.
struct Handed {
  absl::Mutex mu;
  std::vector<WireTensor> wires ABSL_GUARDED_BY(mu);
};

// An inner transport that keeps what it is handed, to see whether the
// shaped transport copied it.
class KeepingTransport final : public Transport {
 public:
  explicit KeepingTransport(Handed* handed) : handed_(handed) {}
  int stage() const override { return 0; }
  absl::Status SendWire(int, const TensorAddress&, const WireTensor& wire) override {
    return SendWireOwned(0, {}, wire);
  }
  absl::Status SendWireOwned(int, const TensorAddress&, WireTensor wire) override {
    absl::MutexLock lock(&handed_->mu);
    handed_->wires.push_back(std::move(wire));
    return absl::OkStatus();
  }
  absl::StatusOr<WireTensor> RecvWire(int, const TensorAddress&, absl::Duration) override {
    return absl::UnimplementedError("send only");
  }

 private:
  Handed* const handed_;
};

TEST(ShapedTransportTest, SendOwned_HandsASoleTensorOnUncopied_CopiesAShared) {
  Handed handed;
  std::vector<const float*> sent_storage;
  {
    ShapedTransport sender(std::make_unique<KeepingTransport>(&handed),
                           {1e9, absl::Microseconds(10)});
    Tensor sole = Tensor::Filled({1000}, 1.0f);
    sent_storage.push_back(sole.data());
    ASSERT_TRUE(sender.SendOwned(1, {}, std::move(sole)).ok());

    Tensor shared = Tensor::Filled({1000}, 2.0f);
    Tensor other_handle = shared;
    sent_storage.push_back(shared.data());
    ASSERT_TRUE(sender.SendOwned(1, {}, std::move(shared)).ok());
    other_handle.Fill(-1);  // its holder may write it: the queue must have a copy

    Tensor plain = Tensor::Filled({1000}, 3.0f);
    sent_storage.push_back(plain.data());
    ASSERT_TRUE(sender.Send(1, {}, plain).ok());
    plain.Fill(-1);
  }  // delivers everything queued
  absl::MutexLock lock(&handed.mu);
  const std::vector<WireTensor>& got = handed.wires;
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].tensor.data(), sent_storage[0]);  // taken over
  EXPECT_EQ(got[0].tensor.ToVector(), std::vector<float>(1000, 1.0f));
  EXPECT_NE(got[1].tensor.data(), sent_storage[1]);  // shared: copied
  EXPECT_EQ(got[1].tensor.ToVector(), std::vector<float>(1000, 2.0f));
  EXPECT_NE(got[2].tensor.data(), sent_storage[2]);  // Send: always copied
  EXPECT_EQ(got[2].tensor.ToVector(), std::vector<float>(1000, 3.0f));
}

// What an unreachable inner transport saw, kept beyond its life.
struct FailedSends {
  std::atomic<int> calls{0};
  std::atomic<int> aborts{0};
  absl::Notification first_entered;  // the first send is in the inner transport
  absl::Notification fail_first;     // the test lets it fail
};

// An inner transport whose peer is gone: every send fails, as one does after
// the gRPC transport's connect timeout. The first waits until the test lets
// it fail, so that messages can queue behind it meanwhile.
class UnreachableTransport final : public Transport {
 public:
  explicit UnreachableTransport(FailedSends* sends) : sends_(sends) {}
  int stage() const override { return 0; }
  absl::Status SendWire(int peer, const TensorAddress& address, const WireTensor& wire) override {
    return SendWireOwned(peer, address, wire);
  }
  absl::Status SendWireOwned(int peer, const TensorAddress&, WireTensor) override {
    if (sends_->calls.fetch_add(1) == 0) {
      sends_->first_entered.Notify();
      sends_->fail_first.WaitForNotification();
    }
    return absl::UnavailableError(absl::StrCat("stage ", peer, " is unreachable"));
  }
  absl::StatusOr<WireTensor> RecvWire(int peer, const TensorAddress&, absl::Duration) override {
    return absl::DeadlineExceededError(absl::StrCat("nothing from stage ", peer));
  }
  void Abort() override { ++sends_->aborts; }

 private:
  FailedSends* const sends_;
};

TensorAddress MicroBatch(int i) {
  TensorAddress a;
  a.job_id = "j";
  a.micro_batch = i;
  return a;
}

// Once a handoff to a peer fails, the messages queued behind it are dropped:
// neither the link's thread nor the destructor hands each to the inner
// transport (each could take its connect timeout), only the first failed.
TEST(ShapedTransportTest, HandoffFails_QueuedBehindItDroppedNotHandedOn) {
  FailedSends sends;
  {
    ShapedTransport sender(std::make_unique<UnreachableTransport>(&sends),
                           {1e12, absl::ZeroDuration()});
    ASSERT_TRUE(sender.Send(1, MicroBatch(0), Tensor::Zeros({4})).ok());
    sends.first_entered.WaitForNotification();
    for (int i = 1; i <= 5; ++i) {
      ASSERT_TRUE(sender.Send(1, MicroBatch(i), Tensor::Zeros({4})).ok());  // queued behind it
    }
    sends.fail_first.Notify();
  }  // the destructor delivers what is queued: nothing is left
  EXPECT_EQ(sends.calls.load(), 1);
}

// A Send waiting for room in a full queue gets the failed handoff's error
// (the queue ahead of it was dropped), instead of being queued behind it.
TEST(ShapedTransportTest, HandoffFailsWhileSendWaitsForRoom_SendReturnsTheError) {
  FailedSends sends;
  {
    // Room for one 16-byte tensor: the one being handed off fills it.
    ShapedTransport sender(std::make_unique<UnreachableTransport>(&sends),
                           {1e12, absl::ZeroDuration()}, /*max_queued_bytes=*/16);
    ASSERT_TRUE(sender.Send(1, MicroBatch(0), Tensor::Zeros({4})).ok());
    sends.first_entered.WaitForNotification();
    absl::Status waited;
    std::thread waiting([&] { waited = sender.Send(1, MicroBatch(1), Tensor::Zeros({4})); });
    EXPECT_TRUE(sender.AwaitSendsWaiting(1, absl::Seconds(60)));  // a deadline, never waited out
    sends.fail_first.Notify();
    waiting.join();
    EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable) << waited;
    EXPECT_EQ(waited.message(), "stage 1 is unreachable");
    // The error is reported once; the link is tried again after it.
    EXPECT_TRUE(sender.Send(1, MicroBatch(2), Tensor::Zeros({4})).ok());
  }
  EXPECT_EQ(sends.calls.load(), 2);  // the first and the retry, not the waiting one
}

// A receive from a stage whose handoff failed times out naming that
// failure (the likelier cause), and the next Send still reports it.
TEST(ShapedTransportTest, HandoffFailed_RecvTimeoutNamesIt) {
  FailedSends sends;
  ShapedTransport sender(std::make_unique<UnreachableTransport>(&sends),
                         {1e12, absl::ZeroDuration()});
  ASSERT_TRUE(sender.Send(1, MicroBatch(0), Tensor::Zeros({4})).ok());
  sends.first_entered.WaitForNotification();
  sends.fail_first.Notify();
  // The link's thread stores the error once the failed send returns: until
  // then a receive times out as the inner one does.
  absl::Status timed_out;
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  do {
    timed_out = sender.Recv(1, MicroBatch(0), absl::ZeroDuration()).status();
    std::this_thread::yield();
  } while (timed_out.message().find("failed meanwhile") == absl::string_view::npos &&
           absl::Now() < give_up);
  EXPECT_EQ(timed_out.code(), absl::StatusCode::kDeadlineExceeded) << timed_out;
  EXPECT_EQ(timed_out.message(),
            "nothing from stage 1; this worker's own send to stage 1 failed meanwhile: "
            "UNAVAILABLE: stage 1 is unreachable");
  const absl::Status next = sender.Send(1, MicroBatch(1), Tensor::Zeros({4}));
  EXPECT_EQ(next.code(), absl::StatusCode::kUnavailable) << next;
}

// Abort (a stopped job): a Send waiting for room returns ABORTED, as does
// every later one; what was queued is dropped, not handed on; the inner
// transport is aborted too.
TEST(ShapedTransportTest, Abort_EndsTheWaitingSendDropsTheQueueAbortsTheInner) {
  FailedSends sends;
  {
    // Room for two 16-byte tensors: the one being handed off and one queued.
    ShapedTransport sender(std::make_unique<UnreachableTransport>(&sends),
                           {1e12, absl::ZeroDuration()}, /*max_queued_bytes=*/32);
    ASSERT_TRUE(sender.Send(1, MicroBatch(0), Tensor::Zeros({4})).ok());
    sends.first_entered.WaitForNotification();
    ASSERT_TRUE(sender.Send(1, MicroBatch(1), Tensor::Zeros({4})).ok());  // queued
    absl::Status waited;
    std::thread waiting([&] { waited = sender.Send(1, MicroBatch(2), Tensor::Zeros({4})); });
    EXPECT_TRUE(sender.AwaitSendsWaiting(1, absl::Seconds(60)));  // a deadline, never waited out
    sender.Abort();
    waiting.join();
    EXPECT_EQ(waited.code(), absl::StatusCode::kAborted) << waited;
    EXPECT_EQ(sender.Send(1, MicroBatch(3), Tensor::Zeros({4})).code(), absl::StatusCode::kAborted);
    EXPECT_EQ(sends.aborts.load(), 1);
    sends.fail_first.Notify();
  }
  EXPECT_EQ(sends.calls.load(), 1);  // micro-batch 1 was dropped, not handed on
}

// At a slow emulated rate one message's link time can be hours: Abort cuts
// that wait short (the message is dropped, not handed on), so the
// destructor, which joins the link's thread, returns at once.
TEST(ShapedTransportTest, Abort_CutsTheEmulatedWaitShort) {
  Handed handed;
  const absl::Time start = absl::Now();
  {
    // 1 byte/s: a 400-byte tensor's emulated transfer takes minutes.
    ShapedTransport sender(std::make_unique<KeepingTransport>(&handed),
                           {1.0, absl::ZeroDuration()});
    ASSERT_TRUE(sender.Send(1, {}, Tensor::Zeros({100})).ok());
    ASSERT_TRUE(sender.AwaitHandoffsWaiting(1, absl::Seconds(30)));  // taken off the queue
    sender.Abort();
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  absl::MutexLock lock(&handed.mu);
  EXPECT_TRUE(handed.wires.empty());
}

// A receive that times out while this worker's own sends to that peer
// still wait on the emulated link says so: the slow side may be this one.
TEST(ShapedTransportTest, RecvTimesOut_SaysWhatThisWorkerStillHoldsForThatPeer) {
  InProcessFabric fabric(3);
  // 1 byte/s: the 400-byte tensor stays on the link for minutes.
  ShapedTransport worker(fabric.Connect(0), {1.0, absl::ZeroDuration()});
  ASSERT_TRUE(worker.Send(1, {}, Tensor::Zeros({100})).ok());
  TensorAddress a;
  a.job_id = "j";
  const absl::Status from_1 = worker.Recv(1, a, absl::Milliseconds(10)).status();
  EXPECT_EQ(from_1.code(), absl::StatusCode::kDeadlineExceeded) << from_1;
  EXPECT_NE(from_1.message().find("this worker's own sends to stage 1 still have 400 bytes "
                                  "waiting on its emulated link"),
            std::string::npos)
      << from_1;
  // Nothing held for stage 2: its timeout is the inner transport's alone.
  const absl::Status from_2 = worker.Recv(2, a, absl::Milliseconds(10)).status();
  EXPECT_EQ(from_2.code(), absl::StatusCode::kDeadlineExceeded) << from_2;
  EXPECT_EQ(from_2.message().find("own sends"), std::string::npos) << from_2;
  worker.Abort();
}

}  // namespace
}  // namespace pipetrain
