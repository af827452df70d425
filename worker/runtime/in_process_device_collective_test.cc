#include "worker/runtime/in_process_device_collective.h"

#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// Runs fn(rank) for every member, each on a thread of its own.
template <typename Fn>
void OnEveryMember(int members, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < members; ++r) threads.emplace_back([&fn, r] { fn(r); });
  for (std::thread& t : threads) t.join();
}

// Values whose sum depends on the order of the additions in float.
float Value(int rank, int i) {
  const float values[] = {1.0f, 1e8f, -1e8f};
  return values[rank % 3] + 0.25f * static_cast<float>(i);
}

// Three members, two tensors in one sum, then a second sum: each member
// gets ((m0 + m1) + m2) of every element, bitwise, in its own tensors.
TEST(InProcessCollectiveHubTest, AllReduceSum_InMemberOrderIntoEveryMembersTensors) {
  constexpr int kMembers = 3;
  InProcessCollectiveHub hub(kMembers);
  std::vector<std::vector<float>> got(kMembers);
  std::vector<absl::Status> statuses(kMembers);
  OnEveryMember(kMembers, [&](int rank) {
    std::unique_ptr<DeviceCollective> c = hub.CollectiveFor(rank);
    Tensor a = Tensor::Zeros({2, 2}), b = Tensor::Zeros({3});
    for (int i = 0; i < 4; ++i) a.data()[i] = Value(rank, i);
    for (int i = 0; i < 3; ++i) b.data()[i] = Value(rank, 4 + i);
    absl::Status s = c->AllReduceSum({&a, &b});
    Tensor again = Tensor::Zeros({1});
    again.data()[0] = static_cast<float>(rank + 1);
    if (s.ok()) s = c->AllReduceSum({&again});
    if (s.ok()) s = c->AwaitSums();
    statuses[rank] = s;
    got[rank] = a.ToVector();
    for (float x : b.ToVector()) got[rank].push_back(x);
    got[rank].push_back(again.data()[0]);
  });
  std::vector<float> want;
  for (int i = 0; i < 7; ++i) want.push_back((Value(0, i) + Value(1, i)) + Value(2, i));
  want.push_back(6.0f);
  for (int r = 0; r < kMembers; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r];
    EXPECT_EQ(got[r], want) << "member " << r;
  }
  // The order matters for these values: the check above is not vacuous.
  EXPECT_NE((Value(0, 0) + Value(1, 0)) + Value(2, 0), Value(0, 0) + (Value(1, 0) + Value(2, 0)));
  EXPECT_EQ(hub.sums(), 2);
  EXPECT_EQ(hub.floats(), 8);
}

// Members that give different element counts all fail, naming both.
TEST(InProcessCollectiveHubTest, AllReduceSum_CountsThatDifferFailEveryMember) {
  InProcessCollectiveHub hub(2);
  std::vector<absl::Status> statuses(2);
  OnEveryMember(2, [&](int rank) {
    Tensor t = Tensor::Zeros({rank == 0 ? 4 : 5});
    statuses[rank] = hub.CollectiveFor(rank)->AllReduceSum({&t});
  });
  for (const absl::Status& s : statuses) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "member 1 5")) << s;
  }
}

TEST(InProcessCollectiveHubTest, AllReduceSum_NullTensorIsInvalidArgument) {
  InProcessCollectiveHub hub(2);
  EXPECT_EQ(hub.CollectiveFor(0)->AllReduceSum({nullptr}).code(),
            absl::StatusCode::kInvalidArgument);
}

// A member that never comes: the others give up after the timeout, naming
// how many are missing.
TEST(InProcessCollectiveHubTest, AllReduceSum_MissingMemberTimesOut) {
  InProcessCollectiveHub hub(3, absl::Milliseconds(50));
  Tensor t = Tensor::Zeros({2});
  const absl::Status s = hub.CollectiveFor(0)->AllReduceSum({&t});
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "2 of 3 members")) << s;
}

// Abort ends a waiting sum and fails later calls.
TEST(InProcessCollectiveHubTest, Abort_EndsWaitingSumAndLaterCalls) {
  InProcessCollectiveHub hub(2);
  std::unique_ptr<DeviceCollective> c0 = hub.CollectiveFor(0), c1 = hub.CollectiveFor(1);
  absl::Status waited;
  std::thread waiter([&] {
    Tensor t = Tensor::Zeros({2});
    waited = c0->AllReduceSum({&t});
  });
  c1->Abort();
  waiter.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kAborted) << waited;
  Tensor t = Tensor::Zeros({2});
  EXPECT_EQ(c1->AllReduceSum({&t}).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(c0->AwaitSums().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(c0->Flush(absl::Seconds(1), nullptr).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(hub.aborted());
}

}  // namespace
}  // namespace pipetrain
