#include "kernels/alloc/caching_allocator.h"

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace pipetrain {
namespace {

// Rounds bytes up to a multiple of granularity; false if that overflows.
bool RoundUp(size_t bytes, size_t granularity, size_t* rounded) {
  const size_t remainder = bytes % granularity;
  if (remainder == 0) {
    *rounded = bytes;
    return true;
  }
  const size_t pad = granularity - remainder;
  if (bytes > std::numeric_limits<size_t>::max() - pad) return false;
  *rounded = bytes + pad;
  return true;
}

// The largest cached block a request of `size` bytes may take.
size_t MaxFit(size_t size, size_t ratio) {
  if (size > std::numeric_limits<size_t>::max() / ratio) {
    return std::numeric_limits<size_t>::max();
  }
  return size * ratio;
}

// The registry of pools (Options::pool): one Pool per name, leaked on
// purpose (a cache with static lifetime may leave its pool during static
// destruction), each with a mutex of its own so that one GPU's caches
// emptying themselves (cudaFree waits for that GPU) never hold up another
// GPU's. The registry's own mutex is held only to find or make a Pool.
AnnotatedMutex& RegistryMutex() {
  static AnnotatedMutex* const mu = new AnnotatedMutex();
  return *mu;
}

}  // namespace

struct CachingAllocator::Pool {
  AnnotatedMutex mu;
  std::vector<CachingAllocator*> members ABSL_GUARDED_BY(mu);
  // Blocks the members' ReleaseStreams are freeing outside their mutexes,
  // and how many such ReleaseStreams have finished.
  size_t releasing ABSL_GUARDED_BY(mu) = 0;
  uint64_t releases_done ABSL_GUARDED_BY(mu) = 0;
};

CachingAllocator::Pool* CachingAllocator::PoolNamed(const std::string& name) {
  static auto* const pools = new std::map<std::string, Pool*>();
  AnnotatedMutexLock lock(&RegistryMutex());
  Pool*& pool = (*pools)[name];
  if (pool == nullptr) pool = new Pool();
  return pool;
}

CachingAllocator::CachingAllocator(RawAllocator* raw, Options options)
    : raw_(raw), options_(std::move(options)) {
  PT_CHECK(raw_ != nullptr) << options_.name << ": no raw allocator";
  PT_CHECK(options_.small_granularity > 0 && options_.large_granularity > 0)
      << options_.name << ": granularities must be positive";
  PT_CHECK(options_.max_fit_ratio >= 1) << options_.name << ": max_fit_ratio must be >= 1";
  if (!options_.pool.empty()) {
    pool_ = PoolNamed(options_.pool);
    AnnotatedMutexLock lock(&pool_->mu);
    pool_->members.push_back(this);
  }
}

CachingAllocator::~CachingAllocator() {
  if (pool_ != nullptr) {
    AnnotatedMutexLock lock(&pool_->mu);
    pool_->members.erase(std::find(pool_->members.begin(), pool_->members.end(), this));
  }
  AnnotatedMutexLock lock(&mu_);
  PT_CHECK(in_use_.empty()) << options_.name << " destroyed with " << in_use_.size()
                            << " block(s) still in use (" << stats_.bytes_in_use
                            << " bytes): free every allocation before its allocator";
  EmptyCacheLocked();
}

absl::StatusOr<size_t> CachingAllocator::RoundedSize(size_t bytes) const {
  const size_t granularity =
      bytes <= options_.large_threshold ? options_.small_granularity : options_.large_granularity;
  size_t rounded = 0;
  if (!RoundUp(bytes, granularity, &rounded)) {
    return absl::InvalidArgumentError(absl::StrCat(options_.name, ": a request of ", bytes,
                                                   " bytes is too large to round up to ",
                                                   granularity, " bytes"));
  }
  return rounded;
}

absl::StatusOr<void*> CachingAllocator::Allocate(size_t bytes, StreamId stream) {
  if (bytes == 0) return nullptr;
  absl::StatusOr<size_t> size = RoundedSize(bytes);
  if (!size.ok()) return size.status();
  AnnotatedMutexLock lock(&mu_);
  void* ptr = TakeCachedLocked(*size, stream);
  if (ptr == nullptr) {
    absl::StatusOr<void*> fresh = RawAllocateLocked(*size, bytes, stream);
    if (!fresh.ok()) return fresh.status();
    ptr = *fresh;
    MarkInUseLocked(ptr, *size, stream);
  }
  return ptr;
}

void* CachingAllocator::TakeCachedLocked(size_t size, StreamId stream) {
  auto it = free_.lower_bound(FreeKey(stream, size, 0));
  if (it == free_.end() || std::get<0>(*it) != stream ||
      std::get<1>(*it) > MaxFit(size, options_.max_fit_ratio)) {
    return nullptr;
  }
  const size_t block_size = std::get<1>(*it);
  void* ptr = reinterpret_cast<void*>(std::get<2>(*it));
  free_.erase(it);
  stats_.bytes_cached -= block_size;
  ++stats_.cache_hits;
  MarkInUseLocked(ptr, block_size, stream);
  return ptr;
}

absl::StatusOr<void*> CachingAllocator::RawAllocateLocked(size_t size, size_t requested,
                                                          StreamId stream) {
  // Each raw call notes the pool's finished releases first: one that ends
  // after the last call frees memory that call may have lacked
  // (AwaitPoolReleases).
  uint64_t pool_releases_seen = 0;
  const auto raw_allocate = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (pool_ != nullptr) pool_releases_seen = PoolReleasesDone();
    return raw_->Allocate(size);
  };
  absl::StatusOr<void*> ptr = raw_allocate();
  if (!ptr.ok() && absl::IsResourceExhausted(ptr.status()) && !free_.empty()) {
    // Cached blocks of other sizes or streams may be what the raw allocator
    // lacks: give them back and try once more.
    ++stats_.oom_retries;
    EmptyCacheLocked();
    ptr = raw_allocate();
  }
  if (!ptr.ok() && absl::IsResourceExhausted(ptr.status()) && pool_ != nullptr &&
      EmptyOtherCachesOfPool() > 0) {
    ++stats_.pool_releases;
    ptr = raw_allocate();
  }
  // Blocks a ReleaseStream is freeing are memory about to come back.
  if (!ptr.ok() && absl::IsResourceExhausted(ptr.status()) && releasing_ > 0) {
    ++stats_.oom_retries;
    mu_.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return releasing_ == 0; },
                         absl::Minutes(1));
    ptr = raw_allocate();
  }
  // So are those the pool's other caches' ReleaseStreams are freeing (the
  // same device's memory). Waited for with this cache's mutex released, as
  // for its own: the thread whose work a cudaFree waits for may need this
  // cache meanwhile. Not when this cache's own release is still under way
  // (its wait above timed out: what it waits for is stuck).
  if (!ptr.ok() && absl::IsResourceExhausted(ptr.status()) && pool_ != nullptr && releasing_ == 0) {
    mu_.Unlock();
    const bool came_back = AwaitPoolReleases(pool_releases_seen);
    mu_.Lock();
    if (came_back) {
      ++stats_.oom_retries;
      ptr = raw_allocate();
    }
  }
  if (ptr.ok() && *ptr == nullptr) {
    ptr = absl::InternalError("the raw allocator returned nullptr without an error");
  }
  if (ptr.ok()) {
    ++stats_.raw_allocations;
    return ptr;
  }
  if (absl::IsResourceExhausted(ptr.status())) {
    return absl::ResourceExhaustedError(
        absl::StrCat(options_.name, ": out of memory allocating ", size, " bytes (", requested,
                     " requested) for stream ", stream, " with ", stats_.bytes_in_use,
                     " bytes in use and the cache emptied; free tensors or reduce the batch size: ",
                     ptr.status().message()));
  }
  return absl::Status(ptr.status().code(), absl::StrCat(options_.name, ": allocating ", size,
                                                        " bytes failed: ", ptr.status().message()));
}

uint64_t CachingAllocator::PoolReleasesDone() const {
  AnnotatedMutexLock lock(&pool_->mu);
  return pool_->releases_done;
}

bool CachingAllocator::AwaitPoolReleases(uint64_t releases_seen) const {
  Pool* const pool = pool_;
  AnnotatedMutexLock lock(&pool->mu);
  if (pool->releasing == 0) return pool->releases_done != releases_seen;
  pool->mu.AwaitWithTimeout(
      [pool]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool->mu) { return pool->releasing == 0; },
      absl::Minutes(1));
  return true;
}

size_t CachingAllocator::EmptyOtherCachesOfPool() const {
  size_t released = 0;
  AnnotatedMutexLock lock(&pool_->mu);
  for (CachingAllocator* other : pool_->members) {
    if (other == this || !other->mu_.TryLock()) continue;
    released += other->stats_.bytes_cached;
    other->EmptyCacheLocked();
    other->mu_.Unlock();
  }
  return released;
}

void CachingAllocator::MarkInUseLocked(void* ptr, size_t size, StreamId stream) {
  const bool inserted = in_use_.emplace(ptr, InUse{size, stream}).second;
  PT_CHECK(inserted) << options_.name << ": block " << ptr << " handed out twice";
  stats_.bytes_in_use += size;
  stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
}

void CachingAllocator::Free(void* ptr) {
  if (ptr == nullptr) return;
  AnnotatedMutexLock lock(&mu_);
  auto it = in_use_.find(ptr);
  PT_CHECK(it != in_use_.end()) << options_.name << ": Free(" << ptr
                                << ") of a block not in use (double free, or not from "
                                   "this allocator)";
  const InUse block = it->second;
  in_use_.erase(it);
  stats_.bytes_in_use -= block.size;
  stats_.bytes_cached += block.size;
  free_.emplace(block.stream, block.size, reinterpret_cast<uintptr_t>(ptr));
}

absl::StatusOr<CachingAllocator::Allocation> CachingAllocator::AllocateOwned(size_t bytes,
                                                                             StreamId stream) {
  absl::StatusOr<void*> ptr = Allocate(bytes, stream);
  if (!ptr.ok()) return ptr.status();
  return Allocation(this, *ptr, bytes, stream);
}

void CachingAllocator::EmptyCache() {
  AnnotatedMutexLock lock(&mu_);
  EmptyCacheLocked();
}

size_t CachingAllocator::ReleaseStream(StreamId stream) {
  std::vector<void*> blocks;
  size_t released = 0;
  {
    AnnotatedMutexLock lock(&mu_);
    // The set orders by stream first: its blocks are one run.
    auto it = free_.lower_bound(FreeKey{stream, 0, 0});
    while (it != free_.end() && std::get<0>(*it) == stream) {
      blocks.push_back(reinterpret_cast<void*>(std::get<2>(*it)));
      released += std::get<1>(*it);
      it = free_.erase(it);
    }
    stats_.raw_frees += static_cast<int64_t>(blocks.size());
    stats_.bytes_cached -= released;
    releasing_ += blocks.size();
    if (pool_ != nullptr && !blocks.empty()) {
      AnnotatedMutexLock pool_lock(&pool_->mu);
      pool_->releasing += blocks.size();
    }
  }
  // Outside the lock: cudaFree waits for the whole device, a job's NCCL
  // kernels waiting on a peer included, and that job's thread must still
  // allocate the scratch for the send its peer waits for.
  for (void* block : blocks) raw_->Free(block);
  // The pool's count first, without this cache's mutex: an Allocate of
  // another cache waits for it holding its own, and one of this cache may
  // hold this one (AwaitPoolReleases).
  if (pool_ != nullptr && !blocks.empty()) {
    AnnotatedMutexLock pool_lock(&pool_->mu);
    pool_->releasing -= blocks.size();
    ++pool_->releases_done;
  }
  AnnotatedMutexLock lock(&mu_);
  releasing_ -= blocks.size();
  return released;
}

void CachingAllocator::EmptyCacheLocked() {
  for (const FreeKey& key : free_) {
    raw_->Free(reinterpret_cast<void*>(std::get<2>(key)));
    ++stats_.raw_frees;
  }
  free_.clear();
  stats_.bytes_cached = 0;
}

CachingAllocator::Stats CachingAllocator::GetStats() const {
  AnnotatedMutexLock lock(&mu_);
  return stats_;
}

CachingAllocator::Allocation::Allocation(Allocation&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      ptr_(std::exchange(other.ptr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      stream_(std::exchange(other.stream_, 0)) {}

CachingAllocator::Allocation& CachingAllocator::Allocation::operator=(Allocation&& other) noexcept {
  if (this != &other) {
    Reset();
    owner_ = std::exchange(other.owner_, nullptr);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    stream_ = std::exchange(other.stream_, 0);
  }
  return *this;
}

void CachingAllocator::Allocation::Reset() {
  if (owner_ != nullptr) owner_->Free(ptr_);
  owner_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
  stream_ = 0;
}

}  // namespace pipetrain
