#include "worker/runtime/in_process_device_channel.h"

#include <thread>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

Tensor Filled(const Shape& shape, float value) {
  Tensor t = Tensor::Zeros(shape);
  t.Fill(value);
  return t;
}

// Per (sender, receiver) pair, first in first out; pairs do not interfere.
TEST(InProcessDeviceHubTest, SendRecv_FifoPerPair) {
  InProcessDeviceHub hub(3);
  auto c0 = hub.ChannelFor(0), c1 = hub.ChannelFor(1), c2 = hub.ChannelFor(2);
  ASSERT_TRUE(c0->Send(1, Filled({2, 3}, 1.0f)).ok());
  ASSERT_TRUE(c0->Send(1, Filled({2, 3}, 2.0f)).ok());
  ASSERT_TRUE(c2->Send(1, Filled({4}, 7.0f)).ok());
  EXPECT_EQ(hub.sent(), 3);
  EXPECT_EQ(hub.in_flight(), 3);
  absl::StatusOr<Tensor> from2 = c1->Recv(2, {2, 2});
  ASSERT_TRUE(from2.ok()) << from2.status();
  EXPECT_EQ(from2->shape(), (Shape{2, 2}));  // the receiver names the shape
  EXPECT_EQ(from2->ToVector(), std::vector<float>(4, 7.0f));
  absl::StatusOr<Tensor> first = c1->Recv(0, {6});
  absl::StatusOr<Tensor> second = c1->Recv(0, {6});
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->ToVector(), std::vector<float>(6, 1.0f));
  EXPECT_EQ(second->ToVector(), std::vector<float>(6, 2.0f));
  EXPECT_EQ(hub.in_flight(), 0);
}

// The receiver gets a copy: the sender may overwrite its tensor at once.
TEST(InProcessDeviceHubTest, Send_CopiesTheTensor) {
  InProcessDeviceHub hub(2);
  auto c0 = hub.ChannelFor(0), c1 = hub.ChannelFor(1);
  Tensor t = Filled({3}, 1.0f);
  ASSERT_TRUE(c0->Send(1, t).ok());
  t.Fill(9.0f);
  EXPECT_EQ(c1->Recv(0, {3})->ToVector(), std::vector<float>(3, 1.0f));
}

TEST(InProcessDeviceHubTest, Recv_WaitsForASendFromAnotherThread) {
  InProcessDeviceHub hub(2);
  auto c0 = hub.ChannelFor(0), c1 = hub.ChannelFor(1);
  std::thread sender([&] { ASSERT_TRUE(c0->Send(1, Filled({5}, 3.0f)).ok()); });
  absl::StatusOr<Tensor> got = c1->Recv(0, {5});
  sender.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->ToVector(), std::vector<float>(5, 3.0f));
}

TEST(InProcessDeviceHubTest, Recv_OtherElementCount_InvalidArgumentNamingBoth) {
  InProcessDeviceHub hub(2);
  auto c0 = hub.ChannelFor(0), c1 = hub.ChannelFor(1);
  ASSERT_TRUE(c0->Send(1, Filled({2, 3}, 1.0f)).ok());
  absl::StatusOr<Tensor> got = c1->Recv(0, {7});
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(got.status().message(),
                                "stage 0 sent [2, 3] to stage 1, which "
                                "expected [7]"))
      << got.status();
}

TEST(InProcessDeviceHubTest, Recv_NothingSent_DeadlineExceeded) {
  InProcessDeviceHub hub(2, absl::Milliseconds(20));
  absl::StatusOr<Tensor> got = hub.ChannelFor(1)->Recv(0, {1});
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(got.status().message(), "nothing from stage 0 to stage 1"))
      << got.status();
}

TEST(InProcessDeviceHubTest, BadPeer_InvalidArgument) {
  InProcessDeviceHub hub(2);
  auto c0 = hub.ChannelFor(0);
  EXPECT_EQ(c0->Send(0, Filled({1}, 0.0f)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c0->Send(2, Filled({1}, 0.0f)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c0->Recv(-1, {1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(hub.sent(), 0);
}

TEST(InProcessDeviceHubTest, Abort_WakesAWaitingRecvAndRefusesLaterCalls) {
  InProcessDeviceHub hub(2, absl::Seconds(60));
  auto c0 = hub.ChannelFor(0), c1 = hub.ChannelFor(1);
  absl::StatusOr<Tensor> got;
  std::thread receiver([&] { got = c1->Recv(0, {1}); });
  c0->Abort();  // before or after the receiver waits: it must end either way
  receiver.join();
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(c0->Send(1, Filled({1}, 0.0f)).code(), absl::StatusCode::kAborted);
  c1->Abort();  // idempotent
  EXPECT_EQ(c1->Recv(0, {1}).status().code(), absl::StatusCode::kAborted);
}

// Flush waits for this stage's sends to be taken, not for other stages'.
TEST(InProcessDeviceHubTest, Flush_WaitsUntilThePeerTookEverySend) {
  InProcessDeviceHub hub(3);
  auto c0 = hub.ChannelFor(0), c1 = hub.ChannelFor(1), c2 = hub.ChannelFor(2);
  ASSERT_TRUE(c0->Send(1, Filled({2}, 1.0f)).ok());
  ASSERT_TRUE(c0->Send(1, Filled({2}, 2.0f)).ok());
  ASSERT_TRUE(c2->Send(1, Filled({2}, 3.0f)).ok());  // stage 2's, never taken
  std::thread receiver([&] {
    ASSERT_TRUE(c1->Recv(0, {2}).ok());
    ASSERT_TRUE(c1->Recv(0, {2}).ok());
  });
  const absl::Status flushed = c0->Flush(absl::Seconds(60), nullptr);
  receiver.join();
  EXPECT_TRUE(flushed.ok()) << flushed;
  EXPECT_EQ(hub.in_flight(), 1);
}

TEST(InProcessDeviceHubTest, Flush_SendNeverTaken_DeadlineExceededNamingTheCount) {
  InProcessDeviceHub hub(2);
  auto c0 = hub.ChannelFor(0);
  ASSERT_TRUE(c0->Send(1, Filled({1}, 0.0f)).ok());
  const absl::Status flushed = c0->Flush(absl::Milliseconds(30), nullptr);
  EXPECT_EQ(flushed.code(), absl::StatusCode::kDeadlineExceeded) << flushed;
  EXPECT_TRUE(absl::StrContains(flushed.message(), "1 sent tensor(s) not taken")) << flushed;
}

TEST(InProcessDeviceHubTest, Flush_CancelledOrAborted_EndsTheWait) {
  InProcessDeviceHub hub(2);
  auto c0 = hub.ChannelFor(0);
  ASSERT_TRUE(c0->Send(1, Filled({1}, 0.0f)).ok());
  EXPECT_EQ(c0->Flush(absl::Seconds(60), [] { return true; }).code(), absl::StatusCode::kCancelled);
  std::thread aborter([&] { hub.Abort(); });
  const absl::Status flushed = c0->Flush(absl::Seconds(60), nullptr);
  aborter.join();
  EXPECT_EQ(flushed.code(), absl::StatusCode::kAborted) << flushed;
}

}  // namespace
}  // namespace pipetrain
