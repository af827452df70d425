// CachingAllocator against a fake RawAllocator that records every call,
// backs blocks with malloc (so ASan sees misuse) and runs out of memory on
// demand.
#include "kernels/alloc/caching_allocator.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/annotated_mutex.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

constexpr size_t kKiB = 1024;
constexpr size_t kMiB = 1024 * kKiB;

// Allocates with malloc up to `capacity` live bytes; beyond that it returns
// RESOURCE_EXHAUSTED, like cudaMalloc on a full device.
class FakeRawAllocator : public RawAllocator {
 public:
  explicit FakeRawAllocator(size_t capacity = std::numeric_limits<size_t>::max())
      : capacity_(capacity) {}
  ~FakeRawAllocator() override {
    for (const auto& [ptr, bytes] : live_) std::free(ptr);
  }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    AnnotatedMutexLock lock(&mu_);
    allocate_calls_.push_back(bytes);
    if (!next_error_.ok()) return std::exchange(next_error_, absl::OkStatus());
    if (bytes > capacity_ - live_bytes_) {
      return absl::ResourceExhaustedError("fake device full");
    }
    void* ptr = std::malloc(bytes);
    live_.emplace(ptr, bytes);
    live_bytes_ += bytes;
    return ptr;
  }

  void Free(void* ptr) override {
    AnnotatedMutexLock lock(&mu_);
    ++free_calls_;
    auto it = live_.find(ptr);
    ASSERT_NE(it, live_.end()) << "raw Free of an unknown pointer";
    live_bytes_ -= it->second;
    live_.erase(it);
    std::free(ptr);
  }

  // The next Allocate call fails with `status` (and allocates nothing).
  void FailNext(absl::Status status) {
    AnnotatedMutexLock lock(&mu_);
    next_error_ = std::move(status);
  }
  std::vector<size_t> allocate_calls() const {
    AnnotatedMutexLock lock(&mu_);
    return allocate_calls_;
  }
  int free_calls() const {
    AnnotatedMutexLock lock(&mu_);
    return free_calls_;
  }
  size_t live_bytes() const {
    AnnotatedMutexLock lock(&mu_);
    return live_bytes_;
  }

 private:
  const size_t capacity_;
  mutable AnnotatedMutex mu_;
  absl::flat_hash_map<void*, size_t> live_ ABSL_GUARDED_BY(mu_);
  size_t live_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<size_t> allocate_calls_ ABSL_GUARDED_BY(mu_);
  int free_calls_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status next_error_ ABSL_GUARDED_BY(mu_);
};

CachingAllocator::Options TestOptions() {
  CachingAllocator::Options options;
  options.name = "test allocator";
  return options;
}

void* MustAllocate(CachingAllocator& allocator, size_t bytes, StreamId stream) {
  absl::StatusOr<void*> ptr = allocator.Allocate(bytes, stream);
  EXPECT_TRUE(ptr.ok()) << ptr.status();
  return ptr.ok() ? *ptr : nullptr;
}

TEST(CachingAllocatorTest, Allocate_ZeroBytes_NullptrWithoutRawCall) {
  FakeRawAllocator raw;
  CachingAllocator allocator(&raw, TestOptions());
  absl::StatusOr<void*> ptr = allocator.Allocate(0, 1);
  ASSERT_TRUE(ptr.ok()) << ptr.status();
  EXPECT_EQ(*ptr, nullptr);
  allocator.Free(nullptr);
  EXPECT_TRUE(raw.allocate_calls().empty());
  EXPECT_EQ(allocator.GetStats().bytes_in_use, 0u);
}

TEST(CachingAllocatorTest, RoundedSize_SmallAndLarge_DocumentedGranularity) {
  FakeRawAllocator raw;
  CachingAllocator allocator(&raw, TestOptions());
  const std::vector<std::pair<size_t, size_t>> cases = {
      {0, 0},
      {1, 512},
      {512, 512},
      {513, 1024},
      {1 * kMiB, 1 * kMiB},
      {1 * kMiB + 1, 2 * kMiB},
      {3 * kMiB, 4 * kMiB},
      {4 * kMiB, 4 * kMiB},
  };
  for (const auto& [bytes, rounded] : cases) {
    absl::StatusOr<size_t> size = allocator.RoundedSize(bytes);
    ASSERT_TRUE(size.ok()) << size.status();
    EXPECT_EQ(*size, rounded) << "for " << bytes << " bytes";
  }
}

TEST(CachingAllocatorTest, Allocate_SizeOverflowsRounding_InvalidArgument) {
  FakeRawAllocator raw;
  CachingAllocator allocator(&raw, TestOptions());
  absl::StatusOr<void*> ptr = allocator.Allocate(std::numeric_limits<size_t>::max(), 0);
  EXPECT_EQ(ptr.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ptr.status().message().find("test allocator: a request of"), std::string::npos)
      << ptr.status();
  EXPECT_TRUE(raw.allocate_calls().empty());
}

TEST(CachingAllocatorTest, Allocate_Miss_RawCallWithRoundedSize) {
  FakeRawAllocator raw;
  CachingAllocator allocator(&raw, TestOptions());
  void* ptr = MustAllocate(allocator, 1000, 1);
  EXPECT_NE(ptr, nullptr);
  EXPECT_EQ(raw.allocate_calls(), std::vector<size_t>{1024});
  const CachingAllocator::Stats stats = allocator.GetStats();
  EXPECT_EQ(stats.raw_allocations, 1);
  EXPECT_EQ(stats.cache_hits, 0);
  EXPECT_EQ(stats.bytes_in_use, 1024u);
  allocator.Free(ptr);
}

TEST(CachingAllocatorTest, Allocate_AfterFreeOnSameStream_ReusesBlock) {
  FakeRawAllocator raw;
  CachingAllocator allocator(&raw, TestOptions());
  void* first = MustAllocate(allocator, 1000, 7);
  allocator.Free(first);
  EXPECT_EQ(raw.free_calls(), 0);  // Free keeps the block
  void* second = MustAllocate(allocator, 900, 7);
  EXPECT_EQ(second, first);
  const CachingAllocator::Stats stats = allocator.GetStats();
  EXPECT_EQ(stats.raw_allocations, 1);
  EXPECT_EQ(stats.cache_hits, 1);
  EXPECT_EQ(stats.bytes_cached, 0u);
  allocator.Free(second);
}

TEST(CachingAllocatorTest, Allocate_BlockFreedOnOtherStream_CallsRaw) {
  FakeRawAllocator raw;
  CachingAllocator allocator(&raw, TestOptions());
  void* on_stream_1 = MustAllocate(allocator, 1024, 1);
  allocator.Free(on_stream_1);
  void* on_stream_2 = MustAllocate(allocator, 1024, 2);
  EXPECT_NE(on_stream_2, on_stream_1);
  EXPECT_EQ(raw.allocate_calls().size(), 2u);
  EXPECT_EQ(allocator.GetStats().cache_hits, 0);
  EXPECT_EQ(allocator.GetStats().bytes_cached, 1024u);
  allocator.Free(on_stream_2);
}

TEST(CachingAllocatorTest, Allocate_CachedBlockMoreThanTwiceTheSize_CallsRaw) {
  FakeRawAllocator raw;
  CachingAllocator allocator(&raw, TestOptions());
  void* big = MustAllocate(allocator, 64 * kKiB, 0);
  allocator.Free(big);
  void* small = MustAllocate(allocator, 1 * kKiB, 0);
  EXPECT_NE(small, big);
  EXPECT_EQ(raw.allocate_calls(), (std::vector<size_t>{64 * kKiB, 1 * kKiB}));
  allocator.Free(small);
}

TEST(CachingAllocatorTest, Allocate_CachedBlockExactlyTwiceTheSize_Reused) {
  FakeRawAllocator raw;
  CachingAllocator allocator(&raw, TestOptions());
  void* block = MustAllocate(allocator, 2 * kKiB, 0);
  allocator.Free(block);
  EXPECT_EQ(MustAllocate(allocator, 1 * kKiB, 0), block);
  EXPECT_EQ(allocator.GetStats().bytes_in_use, 2 * kKiB);  // the whole block
  allocator.Free(block);
}

TEST(CachingAllocatorTest, Allocate_SeveralCachedBlocks_SmallestThatFits) {
  FakeRawAllocator raw;
  CachingAllocator allocator(&raw, TestOptions());
  void* b4096 = MustAllocate(allocator, 4096, 0);
  void* b1024 = MustAllocate(allocator, 1024, 0);
  void* b2048 = MustAllocate(allocator, 2048, 0);
  void* b3072 = MustAllocate(allocator, 3072, 0);
  for (void* ptr : {b4096, b1024, b2048, b3072}) allocator.Free(ptr);
  EXPECT_EQ(MustAllocate(allocator, 1500, 0), b2048);  // 1536 rounded: 1024 too small
  EXPECT_EQ(MustAllocate(allocator, 1500, 0), b3072);
  EXPECT_EQ(allocator.GetStats().bytes_cached, 4096u + 1024u);
  allocator.Free(b2048);
  allocator.Free(b3072);
}

TEST(CachingAllocatorTest, EmptyCache_CachedAndInUse_ReturnsOnlyCached) {
  FakeRawAllocator raw;
  CachingAllocator allocator(&raw, TestOptions());
  void* kept = MustAllocate(allocator, 512, 0);
  void* freed = MustAllocate(allocator, 4096, 0);
  allocator.Free(freed);
  allocator.EmptyCache();
  EXPECT_EQ(raw.free_calls(), 1);
  EXPECT_EQ(raw.live_bytes(), 512u);
  const CachingAllocator::Stats stats = allocator.GetStats();
  EXPECT_EQ(stats.bytes_cached, 0u);
  EXPECT_EQ(stats.bytes_in_use, 512u);
  EXPECT_EQ(stats.raw_frees, 1);
  allocator.Free(kept);
}

// A destroyed stream's cached blocks go back to the raw allocator; other
// streams' cached blocks and every block in use stay.
TEST(CachingAllocatorTest, ReleaseStream_OnlyThatStreamsCachedBlocks) {
  FakeRawAllocator raw;
  CachingAllocator allocator(&raw, TestOptions());
  void* in_use = MustAllocate(allocator, 512, 1);
  void* a = MustAllocate(allocator, 4096, 1);
  void* b = MustAllocate(allocator, 8192, 1);
  void* other = MustAllocate(allocator, 4096, 2);
  void* before = MustAllocate(allocator, 4096, 0);
  for (void* p : {a, b, other, before}) allocator.Free(p);
  EXPECT_EQ(allocator.ReleaseStream(1), 4096u + 8192u);
  EXPECT_EQ(raw.free_calls(), 2);
  EXPECT_EQ(raw.live_bytes(), 512u + 4096u + 4096u);
  CachingAllocator::Stats stats = allocator.GetStats();
  EXPECT_EQ(stats.bytes_cached, 4096u + 4096u);
  EXPECT_EQ(stats.bytes_in_use, 512u);
  EXPECT_EQ(stats.raw_frees, 2);
  EXPECT_EQ(allocator.ReleaseStream(1), 0u);  // nothing left of it
  EXPECT_EQ(allocator.ReleaseStream(7), 0u);  // never used
  // The other streams' blocks are still cached for them.
  EXPECT_EQ(MustAllocate(allocator, 4096, 2), other);
  EXPECT_EQ(MustAllocate(allocator, 4096, 0), before);
  allocator.Free(in_use);
  allocator.Free(other);
  allocator.Free(before);
}

// A raw allocator whose Free of one block waits until let go (cudaFree
// waiting for a device whose kernels wait on a peer).
class BlockingFreeRawAllocator : public RawAllocator {
 public:
  explicit BlockingFreeRawAllocator(FakeRawAllocator* inner) : inner_(inner) {}
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    absl::StatusOr<void*> ptr = inner_->Allocate(bytes);
    if (absl::IsResourceExhausted(ptr.status())) {
      std::function<void()> on_refusal;
      {
        AnnotatedMutexLock lock(&mu_);
        refused_ = true;
        on_refusal = std::move(on_refusal_);
        on_refusal_ = nullptr;
      }
      if (on_refusal) on_refusal();  // before the refusal is returned
    }
    return ptr;
  }
  // Runs `f` at the next refusal, on the refused caller's thread, before
  // the refusal is returned.
  void OnNextRefusal(std::function<void()> f) {
    AnnotatedMutexLock lock(&mu_);
    on_refusal_ = std::move(f);
  }
  void Free(void* ptr) override {
    {
      AnnotatedMutexLock lock(&mu_);
      if (ptr == blocking_) {
        in_blocked_free_ = true;
        while (!mu_.AwaitWithTimeout(
            [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return let_go_; }, absl::Minutes(1))) {
        }
      }
    }
    inner_->Free(ptr);
  }
  void BlockFreeOf(void* ptr) {
    AnnotatedMutexLock lock(&mu_);
    blocking_ = ptr;
  }
  bool AwaitBlockedFree() {
    AnnotatedMutexLock lock(&mu_);
    return mu_.AwaitWithTimeout([this]()
                                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_blocked_free_; },
                                absl::Seconds(60));
  }
  void LetGo() {
    AnnotatedMutexLock lock(&mu_);
    let_go_ = true;
  }
  // Until an Allocate was refused for want of memory.
  bool AwaitRefusal() {
    AnnotatedMutexLock lock(&mu_);
    return mu_.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return refused_; },
                                absl::Seconds(60));
  }

 private:
  FakeRawAllocator* const inner_;
  AnnotatedMutex mu_;
  void* blocking_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool in_blocked_free_ ABSL_GUARDED_BY(mu_) = false;
  bool let_go_ ABSL_GUARDED_BY(mu_) = false;
  bool refused_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> on_refusal_ ABSL_GUARDED_BY(mu_);
};

// Caches a 4096-byte block of stream 1 and starts its ReleaseStream on a
// thread, returned once that release waits in its raw free (until
// raw->LetGo()).
std::thread StartBlockedRelease(CachingAllocator& allocator, BlockingFreeRawAllocator& raw) {
  void* released = MustAllocate(allocator, 4096, 1);
  allocator.Free(released);
  raw.BlockFreeOf(released);
  std::thread release([&allocator] { EXPECT_EQ(allocator.ReleaseStream(1), 4096u); });
  EXPECT_TRUE(raw.AwaitBlockedFree());
  return release;
}

// While ReleaseStream's raw free waits, another stream allocates and frees.
TEST(CachingAllocatorTest, ReleaseStream_RawFreeWaits_OtherStreamsStillAllocate) {
  FakeRawAllocator fake;
  BlockingFreeRawAllocator raw(&fake);
  CachingAllocator allocator(&raw, TestOptions());
  std::thread release = StartBlockedRelease(allocator, raw);
  AnnotatedMutex done_mu;
  bool done = false;
  std::thread other([&] {
    void* p = MustAllocate(allocator, 8192, 2);
    allocator.Free(p);
    AnnotatedMutexLock lock(&done_mu);
    done = true;
  });
  bool allocated_meanwhile = false;
  {
    AnnotatedMutexLock lock(&done_mu);
    allocated_meanwhile = done_mu.AwaitWithTimeout(
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(done_mu) { return done; }, absl::Seconds(10));
  }
  raw.LetGo();
  release.join();
  other.join();
  EXPECT_TRUE(allocated_meanwhile) << "stream 2's allocation waited for stream 1's raw free";
  EXPECT_EQ(allocator.GetStats().raw_frees, 1);
  EXPECT_EQ(fake.live_bytes(), 8192u);  // stream 2's block, cached
}

// The memory a ReleaseStream is freeing is about to come back: an
// allocation the raw allocator refuses meanwhile waits for it and gets it,
// rather than an out-of-memory with the memory one free away.
TEST(CachingAllocatorTest, ReleaseStream_AllocationRefusedMeanwhile_WaitsForTheFrees) {
  FakeRawAllocator fake(/*capacity=*/8192);
  BlockingFreeRawAllocator raw(&fake);
  CachingAllocator allocator(&raw, TestOptions());
  std::thread release = StartBlockedRelease(allocator, raw);
  std::thread let_go([&] {
    EXPECT_TRUE(raw.AwaitRefusal());
    raw.LetGo();
  });
  absl::StatusOr<void*> whole = allocator.Allocate(8192, 2);
  let_go.join();
  release.join();
  ASSERT_TRUE(whole.ok()) << whole.status();
  allocator.Free(*whole);
}

TEST(CachingAllocatorTest, Allocate_RawOutOfMemoryWithCachedBlocks_EmptiesCacheAndRetries) {
  FakeRawAllocator raw(/*capacity=*/8 * kKiB);
  CachingAllocator allocator(&raw, TestOptions());
  void* cached = MustAllocate(allocator, 8 * kKiB, /*stream=*/1);
  allocator.Free(cached);
  // Another stream cannot reuse the cached block, and the device is full.
  void* fresh = MustAllocate(allocator, 4 * kKiB, /*stream=*/2);
  EXPECT_NE(fresh, nullptr);
  EXPECT_EQ(raw.allocate_calls(), (std::vector<size_t>{8 * kKiB, 4 * kKiB, 4 * kKiB}));
  EXPECT_EQ(raw.free_calls(), 1);
  const CachingAllocator::Stats stats = allocator.GetStats();
  EXPECT_EQ(stats.oom_retries, 1);
  EXPECT_EQ(stats.raw_allocations, 2);
  EXPECT_EQ(stats.bytes_cached, 0u);
  allocator.Free(fresh);
}

TEST(CachingAllocatorTest, Allocate_OutOfMemoryAfterRetry_ResourceExhausted) {
  FakeRawAllocator raw(/*capacity=*/8 * kKiB);
  CachingAllocator allocator(&raw, TestOptions());
  void* held = MustAllocate(allocator, 6 * kKiB, 0);
  void* cached = MustAllocate(allocator, 1 * kKiB, 0);
  allocator.Free(cached);
  absl::StatusOr<void*> ptr = allocator.Allocate(4 * kKiB, 0);
  EXPECT_EQ(ptr.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(ptr.status().message().find("test allocator: out of memory allocating 4096 bytes "
                                        "(4096 requested) for stream 0 with 6144 bytes in use"),
            std::string::npos)
      << ptr.status();
  EXPECT_NE(ptr.status().message().find("fake device full"), std::string::npos);
  EXPECT_EQ(raw.allocate_calls().size(), 4u);  // two blocks, then a retry
  EXPECT_EQ(allocator.GetStats().oom_retries, 1);
  allocator.Free(held);
}

CachingAllocator::Options PoolOptions(const std::string& name, const std::string& pool) {
  CachingAllocator::Options options;
  options.name = name;
  options.pool = pool;
  return options;
}

// Two caches on one device (one raw allocator's capacity): the second runs
// out while the first holds the memory as free blocks, which it gives back.
TEST(CachingAllocatorTest, Allocate_OutOfMemory_PoolsOtherCacheGivesBlocksBack) {
  FakeRawAllocator raw(/*capacity=*/8 * kKiB);
  CachingAllocator first(&raw, PoolOptions("first", "device 0"));
  CachingAllocator second(&raw, PoolOptions("second", "device 0"));
  first.Free(MustAllocate(first, 8 * kKiB, 1));
  void* ptr = MustAllocate(second, 4 * kKiB, 1);
  EXPECT_NE(ptr, nullptr);
  EXPECT_EQ(raw.allocate_calls(), (std::vector<size_t>{8 * kKiB, 4 * kKiB, 4 * kKiB}));
  EXPECT_EQ(first.GetStats().bytes_cached, 0u);
  EXPECT_EQ(second.GetStats().pool_releases, 1);
  EXPECT_EQ(second.GetStats().oom_retries, 0);  // its own cache was empty
  second.Free(ptr);
}

// Two caches of one pool on an 8 KiB device, `first`'s release of its
// cached 4 KiB block under way and its raw free waiting (StartBlockedRelease)
// until the test lets it go.
struct PoolWithABlockedRelease {
  explicit PoolWithABlockedRelease(const std::string& device)
      : first(&raw, PoolOptions("first", device)),
        second(&raw, PoolOptions("second", device)),
        release(StartBlockedRelease(first, raw)) {}
  ~PoolWithABlockedRelease() {
    if (release.joinable()) {  // the test's wait never came: fail, not hang
      raw.LetGo();
      release.join();
    }
  }
  FakeRawAllocator fake{/*capacity=*/8 * kKiB};
  BlockingFreeRawAllocator raw{&fake};
  CachingAllocator first;
  CachingAllocator second;
  std::thread release;
};

// The memory another cache of the pool is releasing (ReleaseStream, its
// raw free waiting) is the device's, about to come back: an allocation the
// raw allocator refuses meanwhile waits for it rather than failing.
TEST(CachingAllocatorTest, Allocate_OutOfMemory_WaitsForThePoolsOtherCachesRelease) {
  PoolWithABlockedRelease pool("device pool-release");
  std::thread let_go([&] {
    EXPECT_TRUE(pool.raw.AwaitRefusal());
    pool.raw.LetGo();
  });
  absl::StatusOr<void*> whole = pool.second.Allocate(8 * kKiB, 2);
  let_go.join();
  pool.release.join();
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(pool.second.GetStats().oom_retries, 1);
  pool.second.Free(*whole);
}

// While it waits for another cache's release, the waiting cache stays
// usable by other threads (the one whose work a cudaFree waits for may need
// it): its mutex is released for the wait. Held, the other thread here
// blocked for the wait's minute, and the allocation then failed.
TEST(CachingAllocatorTest, Allocate_WaitingForAPoolRelease_TheCacheStaysUsable) {
  PoolWithABlockedRelease pool("device pool-release-usable");
  std::thread other([&] {
    EXPECT_TRUE(pool.raw.AwaitRefusal());
    EXPECT_EQ(pool.second.GetStats().bytes_in_use, 0u);  // takes the cache's mutex
    pool.raw.LetGo();
  });
  absl::StatusOr<void*> whole = pool.second.Allocate(8 * kKiB, 2);
  other.join();
  pool.release.join();
  ASSERT_TRUE(whole.ok()) << whole.status();
  pool.second.Free(*whole);
}

// The other cache's release ends between the refused raw call and the
// wait: nothing is under way any more, but the memory came back since the
// try, so the allocation is tried once more.
TEST(CachingAllocatorTest, Allocate_OutOfMemory_APoolReleaseEndedSinceTheTry_TriedAgain) {
  PoolWithABlockedRelease pool("device pool-release-ended");
  pool.raw.OnNextRefusal([&] {
    pool.raw.LetGo();
    pool.release.join();
  });
  absl::StatusOr<void*> whole = pool.second.Allocate(8 * kKiB, 2);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(pool.second.GetStats().oom_retries, 1);
  pool.second.Free(*whole);
}

TEST(CachingAllocatorTest, Allocate_OutOfMemory_OtherPoolsBlocksStay) {
  FakeRawAllocator raw(/*capacity=*/8 * kKiB);
  CachingAllocator first(&raw, PoolOptions("first", "device 0"));
  CachingAllocator second(&raw, PoolOptions("second", "device 1"));
  CachingAllocator unpooled(&raw, TestOptions());
  first.Free(MustAllocate(first, 8 * kKiB, 1));
  for (CachingAllocator* asking : {&second, &unpooled}) {
    absl::StatusOr<void*> ptr = asking->Allocate(4 * kKiB, 1);
    EXPECT_EQ(ptr.status().code(), absl::StatusCode::kResourceExhausted) << ptr.status();
    EXPECT_EQ(asking->GetStats().pool_releases, 0);
  }
  EXPECT_EQ(first.GetStats().bytes_cached, 8 * kKiB);
}

// A cache that is gone has left its pool: the pool's next walk (an
// out-of-memory in another member) must not touch it (ASan: heap use after
// free if it did).
TEST(CachingAllocatorTest, Destructor_LeavesThePool) {
  FakeRawAllocator raw(/*capacity=*/8 * kKiB);
  CachingAllocator staying(&raw, PoolOptions("staying", "device 7"));
  auto leaving = std::make_unique<CachingAllocator>(&raw, PoolOptions("leaving", "device 7"));
  leaving->Free(MustAllocate(*leaving, 4 * kKiB, 1));
  leaving.reset();  // its cached block went back to the raw allocator
  EXPECT_EQ(raw.live_bytes(), 0u);
  void* held = MustAllocate(staying, 8 * kKiB, 1);
  absl::StatusOr<void*> more = staying.Allocate(1 * kKiB, 1);  // walks the pool
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted) << more.status();
  EXPECT_EQ(staying.GetStats().pool_releases, 0);
  staying.Free(held);
}

// Two caches of one pool, each used by two threads, on a device too small
// for all of them: they run out at the same time, empty each other's caches
// and must neither deadlock nor lose track of a block (run under TSan).
// An allocation may still fail (the other cache was busy); none is lost.
TEST(CachingAllocatorTest, PoolOutOfMemory_ConcurrentCaches_NoDeadlockNoLostBlock) {
  FakeRawAllocator raw(/*capacity=*/64 * kKiB);
  CachingAllocator a(&raw, PoolOptions("a", "device 0"));
  CachingAllocator b(&raw, PoolOptions("b", "device 0"));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    CachingAllocator* cache = t % 2 == 0 ? &a : &b;
    threads.emplace_back([cache, t] {
      std::mt19937 rng(99 + t);
      std::uniform_int_distribution<size_t> size_dist(1, 16 * kKiB);
      std::vector<void*> held;
      for (int i = 0; i < 1000; ++i) {
        if (held.size() < 3 && rng() % 2 == 0) {
          absl::StatusOr<void*> ptr = cache->Allocate(size_dist(rng), t);
          if (ptr.ok()) {
            held.push_back(*ptr);
          } else {
            ASSERT_EQ(ptr.status().code(), absl::StatusCode::kResourceExhausted) << ptr.status();
          }
        } else if (!held.empty()) {
          cache->Free(held.back());
          held.pop_back();
        }
      }
      for (void* ptr : held) cache->Free(ptr);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(a.GetStats().bytes_in_use + b.GetStats().bytes_in_use, 0u);
  EXPECT_EQ(a.GetStats().bytes_cached + b.GetStats().bytes_cached, raw.live_bytes());
}

TEST(CachingAllocatorTest, Allocate_OutOfMemoryWithEmptyCache_NoRetry) {
  FakeRawAllocator raw(/*capacity=*/1 * kKiB);
  CachingAllocator allocator(&raw, TestOptions());
  absl::StatusOr<void*> ptr = allocator.Allocate(2 * kKiB, 0);
  EXPECT_EQ(ptr.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(raw.allocate_calls().size(), 1u);
  EXPECT_EQ(allocator.GetStats().oom_retries, 0);
}

TEST(CachingAllocatorTest, Allocate_RawInternalError_PassedOnWithAllocatorName) {
  FakeRawAllocator raw;
  CachingAllocator allocator(&raw, TestOptions());
  void* cached = MustAllocate(allocator, 512, 0);
  allocator.Free(cached);
  raw.FailNext(absl::InternalError("cudaMalloc failed: illegal address"));
  absl::StatusOr<void*> ptr = allocator.Allocate(4096, 0);
  EXPECT_EQ(ptr.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(ptr.status().message(),
            "test allocator: allocating 4096 bytes failed: cudaMalloc failed: illegal address");
  EXPECT_EQ(raw.free_calls(), 0);  // only out-of-memory empties the cache
}

TEST(CachingAllocatorTest, GetStats_AllocateAndFree_TracksPeakInUse) {
  FakeRawAllocator raw;
  CachingAllocator allocator(&raw, TestOptions());
  void* a = MustAllocate(allocator, 1024, 0);
  void* b = MustAllocate(allocator, 2048, 0);
  allocator.Free(a);
  void* c = MustAllocate(allocator, 512, 0);
  const CachingAllocator::Stats stats = allocator.GetStats();
  EXPECT_EQ(c, a);  // the cached 1024-byte block is at most twice 512: it counts whole
  EXPECT_EQ(stats.bytes_in_use, 3072u);
  EXPECT_EQ(stats.peak_bytes_in_use, 3072u);
  EXPECT_EQ(stats.bytes_cached, 0u);
  allocator.Free(b);
  allocator.Free(c);
  EXPECT_EQ(allocator.GetStats().bytes_in_use, 0u);
  EXPECT_EQ(allocator.GetStats().bytes_cached, 3072u);
  EXPECT_EQ(allocator.GetStats().peak_bytes_in_use, 3072u);
}

TEST(CachingAllocatorTest, Destructor_CachedBlocks_ReturnedToRaw) {
  FakeRawAllocator raw;
  {
    CachingAllocator allocator(&raw, TestOptions());
    void* a = MustAllocate(allocator, 1024, 1);
    void* b = MustAllocate(allocator, 3 * kMiB, 2);
    allocator.Free(a);
    allocator.Free(b);
    EXPECT_EQ(raw.live_bytes(), 1024 + 4 * kMiB);
  }
  EXPECT_EQ(raw.live_bytes(), 0u);
  EXPECT_EQ(raw.free_calls(), 2);
}

TEST(CachingAllocatorTest, AllocateOwned_HandleDestroyed_BlockBackInCache) {
  FakeRawAllocator raw;
  CachingAllocator allocator(&raw, TestOptions());
  void* first = nullptr;
  {
    absl::StatusOr<CachingAllocator::Allocation> block = allocator.AllocateOwned(100, 3);
    ASSERT_TRUE(block.ok()) << block.status();
    first = block->get();
    EXPECT_EQ(block->bytes(), 100u);
    EXPECT_EQ(block->stream(), 3u);
    EXPECT_EQ(allocator.GetStats().bytes_in_use, 512u);
  }
  EXPECT_EQ(allocator.GetStats().bytes_cached, 512u);
  absl::StatusOr<CachingAllocator::Allocation> again = allocator.AllocateOwned(200, 3);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->get(), first);
}

TEST(CachingAllocatorTest, AllocationMove_MovedFrom_EmptyAndFreedOnce) {
  FakeRawAllocator raw;
  CachingAllocator allocator(&raw, TestOptions());
  absl::StatusOr<CachingAllocator::Allocation> block = allocator.AllocateOwned(512, 0);
  ASSERT_TRUE(block.ok()) << block.status();
  void* ptr = block->get();
  CachingAllocator::Allocation moved = std::move(*block);
  EXPECT_EQ(block->get(), nullptr);
  EXPECT_EQ(moved.get(), ptr);
  CachingAllocator::Allocation assigned;
  assigned = std::move(moved);
  EXPECT_EQ(assigned.get(), ptr);
  assigned.Reset();
  EXPECT_EQ(assigned.get(), nullptr);
  EXPECT_EQ(allocator.GetStats().bytes_in_use, 0u);
  EXPECT_EQ(allocator.GetStats().bytes_cached, 512u);
}

TEST(CachingAllocatorTest, AllocateOwned_ZeroBytes_EmptyHandle) {
  FakeRawAllocator raw;
  CachingAllocator allocator(&raw, TestOptions());
  absl::StatusOr<CachingAllocator::Allocation> block = allocator.AllocateOwned(0, 0);
  ASSERT_TRUE(block.ok()) << block.status();
  EXPECT_EQ(block->get(), nullptr);
  EXPECT_TRUE(raw.allocate_calls().empty());
}

// Random Allocate/Free/EmptyCache sequences against a naive model: a list
// of free blocks scanned for the best fit. The model predicts which cached
// block each request gets (or that it misses) and every counter.
struct ModelBlock {
  StreamId stream;
  size_t size;
  void* ptr;
};

TEST(CachingAllocatorTest, RandomOperations_MatchNaiveModel) {
  FakeRawAllocator raw;
  CachingAllocator allocator(&raw, TestOptions());
  std::mt19937 rng(42);
  const std::vector<size_t> sizes = {1, 500, 512, 700, 1024, 2000, 4096, 1 * kMiB, 3 * kMiB};
  std::vector<ModelBlock> model_free;
  std::vector<ModelBlock> model_in_use;
  CachingAllocator::Stats expected;
  for (int step = 0; step < 3000; ++step) {
    const int op = rng() % 10;
    if (op < 5) {  // Allocate
      const size_t bytes = sizes[rng() % sizes.size()] + rng() % 3;
      const StreamId stream = rng() % 3;
      const size_t rounded = *allocator.RoundedSize(bytes);
      auto best = model_free.end();
      for (auto it = model_free.begin(); it != model_free.end(); ++it) {
        if (it->stream != stream || it->size < rounded || it->size > 2 * rounded) continue;
        if (best == model_free.end() || it->size < best->size ||
            (it->size == best->size &&
             reinterpret_cast<uintptr_t>(it->ptr) < reinterpret_cast<uintptr_t>(best->ptr))) {
          best = it;
        }
      }
      void* ptr = MustAllocate(allocator, bytes, stream);
      if (best != model_free.end()) {
        ASSERT_EQ(ptr, best->ptr) << "step " << step;
        model_in_use.push_back(*best);
        expected.bytes_cached -= best->size;
        expected.bytes_in_use += best->size;
        ++expected.cache_hits;
        model_free.erase(best);
      } else {
        model_in_use.push_back({stream, rounded, ptr});
        expected.bytes_in_use += rounded;
        ++expected.raw_allocations;
      }
      expected.peak_bytes_in_use = std::max(expected.peak_bytes_in_use, expected.bytes_in_use);
    } else if (op < 9 && !model_in_use.empty()) {  // Free
      const size_t index = rng() % model_in_use.size();
      const ModelBlock block = model_in_use[index];
      model_in_use.erase(model_in_use.begin() + index);
      allocator.Free(block.ptr);
      model_free.push_back(block);
      expected.bytes_in_use -= block.size;
      expected.bytes_cached += block.size;
    } else if (op == 9) {
      allocator.EmptyCache();
      expected.raw_frees += model_free.size();
      expected.bytes_cached = 0;
      model_free.clear();
    }
    const CachingAllocator::Stats stats = allocator.GetStats();
    ASSERT_EQ(stats.bytes_in_use, expected.bytes_in_use) << "step " << step;
    ASSERT_EQ(stats.bytes_cached, expected.bytes_cached) << "step " << step;
    ASSERT_EQ(stats.peak_bytes_in_use, expected.peak_bytes_in_use) << "step " << step;
    ASSERT_EQ(stats.raw_allocations, expected.raw_allocations) << "step " << step;
    ASSERT_EQ(stats.raw_frees, expected.raw_frees) << "step " << step;
    ASSERT_EQ(stats.cache_hits, expected.cache_hits) << "step " << step;
  }
  EXPECT_GT(expected.cache_hits, 100);  // the sequence exercises reuse
  for (const ModelBlock& block : model_in_use) allocator.Free(block.ptr);
}

// Each thread allocates on its own stream and on a shared one, writes its id
// into every block and checks it is still there before freeing: a block
// handed to two holders at once would show another thread's bytes.
TEST(CachingAllocatorTest, AllocateFree_ConcurrentThreads_NoBlockShared) {
  FakeRawAllocator raw;
  CachingAllocator allocator(&raw, TestOptions());
  constexpr int kThreads = 4;
  constexpr int kIterations = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&allocator, t] {
      std::mt19937 rng(1234 + t);
      std::uniform_int_distribution<size_t> size_dist(1, 8 * kKiB);
      std::vector<std::pair<void*, size_t>> held;
      for (int i = 0; i < kIterations; ++i) {
        if (held.size() < 8 && (held.empty() || rng() % 2 == 0)) {
          const size_t bytes = size_dist(rng);
          const StreamId stream = rng() % 2 == 0 ? 100 : t;
          absl::StatusOr<void*> ptr = allocator.Allocate(bytes, stream);
          ASSERT_TRUE(ptr.ok()) << ptr.status();
          std::memset(*ptr, t, bytes);
          held.emplace_back(*ptr, bytes);
        } else {
          const auto [ptr, bytes] = held.back();
          held.pop_back();
          const auto* data = static_cast<const unsigned char*>(ptr);
          ASSERT_EQ(data[0], t);
          ASSERT_EQ(data[bytes - 1], t);
          allocator.Free(ptr);
        }
      }
      for (const auto& [ptr, bytes] : held) allocator.Free(ptr);
    });
  }
  for (std::thread& thread : threads) thread.join();
  const CachingAllocator::Stats stats = allocator.GetStats();
  EXPECT_EQ(stats.bytes_in_use, 0u);
  EXPECT_EQ(stats.bytes_cached, raw.live_bytes());
  EXPECT_GT(stats.cache_hits, 0);
  EXPECT_EQ(static_cast<size_t>(stats.raw_allocations), raw.allocate_calls().size());
}

}  // namespace
}  // namespace pipetrain
