#include "worker/transport/tensor_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(TensorPoolTest, Take_DroppedTensorOfTheSameSize_ReusesItsMemory) {
  auto pool = TensorPool::Create({.min_bytes = kMiB, .max_cached_bytes = 8 * kMiB});
  const float* first = nullptr;
  {
    Tensor t = pool->Take({kMiB / 4});
    EXPECT_EQ(t.shape(), Shape({kMiB / 4}));
    t[0] = 1.5f;
    first = t.data();
  }
  EXPECT_EQ(pool->cached_bytes(), kMiB);
  Tensor again = pool->Take({256, 1024});  // Another shape, the same bytes.
  EXPECT_EQ(again.data(), first);
  EXPECT_EQ(again.shape(), Shape({256, 1024}));
  EXPECT_EQ(pool->cached_bytes(), 0);
  Tensor other = pool->Take({2 * kMiB / 4});  // Nothing of that size cached.
  EXPECT_NE(other.data(), first);
}

TEST(TensorPoolTest, Take_BelowMinBytes_BypassesThePool) {
  auto pool = TensorPool::Create({.min_bytes = kMiB, .max_cached_bytes = 8 * kMiB});
  { Tensor small = pool->Take({1000}); }
  EXPECT_EQ(pool->cached_bytes(), 0);
}

TEST(TensorPoolTest, Give_OverTheBound_FreesTheOldestFirst) {
  auto pool = TensorPool::Create({.min_bytes = kMiB, .max_cached_bytes = 3 * kMiB});
  Tensor a = pool->Take({kMiB / 4});
  Tensor b = pool->Take({2 * kMiB / 4});
  Tensor c = pool->Take({kMiB / 4});
  const float* b_data = b.data();
  const float* c_data = c.data();
  a = Tensor();  // cached: a (1 MiB)
  b = Tensor();  // a + b = 3 MiB: within the bound
  EXPECT_EQ(pool->cached_bytes(), 3 * kMiB);
  c = Tensor();  // 4 MiB: a, the oldest, goes
  EXPECT_EQ(pool->cached_bytes(), 3 * kMiB);
  EXPECT_EQ(pool->Take({2 * kMiB / 4}).data(), b_data);
  EXPECT_EQ(pool->Take({kMiB / 4}).data(), c_data);
}

TEST(TensorPoolTest, TensorsOutliveThePoolHandle_AndMoveBetweenThreads) {
  std::vector<Tensor> tensors;
  {
    auto pool = TensorPool::Create({.min_bytes = kMiB, .max_cached_bytes = 64 * kMiB});
    for (int i = 0; i < 8; ++i) tensors.push_back(pool->Take({kMiB / 4}));
  }
  // Dropped on other threads after the last pool handle is gone: each
  // returns its memory to the pool, which the last one frees.
  std::vector<std::thread> threads;
  std::atomic<int> intact{0};
  for (Tensor& t : tensors) {
    threads.emplace_back([t = std::move(t), &intact]() mutable {
      t.Fill(2.0f);
      if (t.ToVector() == std::vector<float>(kMiB / 4, 2.0f)) ++intact;
      t = Tensor();
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(intact.load(), 8);  // each its own memory, whole
}

}  // namespace
}  // namespace pipetrain
