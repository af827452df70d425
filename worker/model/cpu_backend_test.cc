// The CPU backend's own behaviour beyond the ops (which are the kernels/cpu
// functions, tested there): op timing and Empty's NaN in tests.
#include "worker/model/cpu_backend.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// Every `bazel test` runs with PIPETRAIN_POISON_EMPTY=1 (.bazelrc), so
// Empty's tensors are NaN in every CPU test: a unit that reads an element
// no op wrote fails there.
TEST(CpuBackendTest, Empty_NaNUnderBazelTest) {
  ASSERT_TRUE(PoisonEmptyRequested()) << "PIPETRAIN_POISON_EMPTY=1 missing from the test's env";
  const Tensor t = CpuBackend()->Empty({3, 17});
  ASSERT_EQ(t.numel(), 51);
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_TRUE(std::isnan(t.data()[i])) << i;
}

TEST(CpuBackendTest, OpTiming_OffByDefault_OnCountsEachCall) {
  Backend* b = CpuBackend();
  b->TakeOpTimes();
  Tensor x = Tensor::FromVector({3}, {1, 2, 3});
  Tensor y = b->Zeros({3});
  b->GeluForward(x.data(), 3, y.data());
  EXPECT_TRUE(b->TakeOpTimes().empty());  // off: nothing recorded

  b->SetOpTiming(true);
  b->GeluForward(x.data(), 3, y.data());
  b->GeluForward(x.data(), 3, y.data());
  b->AddInPlace(y.data(), x.data(), 3);
  b->SetOpTiming(false);
  const OpTimes times = b->TakeOpTimes();
  ASSERT_EQ(times.size(), 2u);
  EXPECT_EQ(times.at("gelu_forward").calls, 2);
  EXPECT_EQ(times.at("add_in_place").calls, 1);
  EXPECT_GE(times.at("gelu_forward").seconds, 0.0);
  EXPECT_TRUE(b->TakeOpTimes().empty());  // taken: cleared
}

// The CPU backend is shared by every stage thread of a process.
TEST(CpuBackendTest, OpTiming_ManyThreads_CountsEveryCall) {
  Backend* b = CpuBackend();
  b->TakeOpTimes();
  b->SetOpTiming(true);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([b] {
      Tensor x = Tensor::FromVector({2}, {1, 2});
      Tensor y = Tensor::Zeros({2});
      for (int i = 0; i < 100; ++i) b->Add(x.data(), x.data(), 2, y.data());
    });
  }
  for (auto& t : threads) t.join();
  b->SetOpTiming(false);
  EXPECT_EQ(b->TakeOpTimes().at("add").calls, 400);
}

// StartDownload copies at once: a later write to the source does not reach
// the copy, and another thread may wait for it.
TEST(CpuBackendTest, StartDownload_CopiesNow_LaterWritesDoNotReachIt) {
  Tensor t = Tensor::FromVector({2, 2}, {1, 2, 3, 4});
  std::unique_ptr<PendingDownload> pending = CpuBackend()->StartDownload(t);
  t.Fill(9.0f);
  absl::StatusOr<Tensor> copy;
  std::thread waiter([&] { copy = pending->Wait(); });
  waiter.join();
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ(copy->shape(), (Shape{2, 2}));
  EXPECT_EQ(copy->ToVector(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_FALSE(copy->SharesStorageWith(t));
}

// UploadAsync on the CPU is the host tensor itself, as Upload.
TEST(CpuBackendTest, UploadAsync_SharesTheHostTensor) {
  Tensor t = Tensor::FromVector({3}, {1, 2, 3});
  EXPECT_TRUE(CpuBackend()->UploadAsync(t).SharesStorageWith(t));
}

}  // namespace
}  // namespace pipetrain
