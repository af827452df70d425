// CachingAllocator: keeps freed memory blocks and hands them out again, so
// the expensive underlying call (cudaMalloc, cudaHostAlloc) runs only when no
// cached block fits. Plain C++: the CUDA allocators that plug in as the
// RawAllocator live in kernels/cuda/device_allocator.h.
//
// Size rule (Options): a request of `bytes` is rounded up to a multiple of
// small_granularity (512 B) when bytes <= large_threshold (1 MiB), else to a
// multiple of large_granularity (2 MiB). Rounding makes blocks of nearby
// sizes interchangeable; the large granularity keeps big tensors of slightly
// different shapes on the same blocks.
//
// Reuse rule: Allocate takes the smallest cached free block of the same
// stream whose size S satisfies R <= S <= R * max_fit_ratio (R the rounded
// request, default ratio 2), ties broken by lowest address. A 64 MiB block is
// therefore never spent on a 1 KiB request; at most half of a handed-out
// block lies beyond the rounded request. Rounding adds its own waste on top:
// a request just over large_threshold (1 MiB + 1 B) rounds to 2 MiB and may
// take a cached 4 MiB block, three quarters of it unused (and counted in
// bytes_in_use). Blocks are never split or merged (a simple first version:
// fragmentation is bounded by the ratio, not removed).
//
// Streams: StreamId is an opaque uintptr_t, in practice a cudaStream_t cast.
// Free does not wait for the GPU: kernels queued on stream S may still read or
// write the block. The block is therefore cached under S and reused only for
// S, whose later work runs after those kernels (stream order). Reusing it on
// another stream T would need an event recorded on S after the block's last
// use and a wait for it on T (cudaStreamWaitEvent); this version leaves that
// out. A caller that used a block on a second stream must make the block's
// stream wait for that work (an event) before calling Free.
//
// Out of memory: when the raw allocator returns RESOURCE_EXHAUSTED and the
// cache holds free blocks, Allocate returns all of them to the raw allocator
// (as EmptyCache does) and retries the raw call once. Caches that draw on
// the same memory (several on one GPU: each CUDA backend's, the kernels'
// scratch cache) name the same Options::pool; when the retry fails too,
// Allocate has the pool's other caches return their free blocks and
// retries once more. A cache of the pool that is busy at that moment (its
// mutex held) is skipped rather than waited for, so two caches running out
// at once cannot deadlock; its free blocks stay. Last, blocks that a
// ReleaseStream of this cache or of another of the pool is freeing are
// waited for (see below) and the raw call is tried again.
//
// Thread-safe: one mutex guards all state, and it is held across raw
// allocator calls (the raw allocator must not call back into this object),
// except ReleaseStream's raw frees, and an Allocate refused meanwhile,
// which waits for them (up to a minute) with the mutex released. Refused
// still, it waits (up to a minute, its mutex released) for the raw frees
// of every ReleaseStream of its pool, the device's memory about to come
// back, and retries once if one was under way or ended since its last try;
// not after its own ReleaseStream's wait timed out.
// Each pool has a mutex of its own, taken after a cache's (never before),
// and a cache's destructor leaves its pool before taking its own.
#ifndef PIPETRAIN_KERNELS_ALLOC_CACHING_ALLOCATOR_H_
#define PIPETRAIN_KERNELS_ALLOC_CACHING_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/annotated_mutex.h"

namespace pipetrain {

// The underlying allocator whose calls are expensive (a device or pinned
// host allocation). Implementations must be thread-safe.
class RawAllocator {
 public:
  virtual ~RawAllocator() = default;

  // Returns a block of at least `bytes` > 0 bytes. RESOURCE_EXHAUSTED when out
  // of memory (the caching allocator then empties its cache and retries);
  // any other code for other failures (INTERNAL for CUDA errors).
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;

  // Releases a block that Allocate returned. Cannot fail visibly.
  virtual void Free(void* ptr) = 0;
};

using StreamId = uintptr_t;

class CachingAllocator {
 public:
  struct Options {
    std::string name = "caching allocator";  // names the allocator in errors
    size_t small_granularity = 512;
    size_t large_threshold = size_t{1} << 20;
    size_t large_granularity = size_t{2} << 20;
    size_t max_fit_ratio = 2;
    // Caches drawing on the same memory, e.g. "cuda:0" (see Out of memory
    // above); empty: none.
    std::string pool;
  };

  struct Stats {
    size_t bytes_in_use = 0;       // rounded sizes of blocks handed out
    size_t bytes_cached = 0;       // free blocks held for reuse
    size_t peak_bytes_in_use = 0;  // maximum of bytes_in_use so far
    int64_t raw_allocations = 0;   // successful raw Allocate calls
    int64_t raw_frees = 0;         // raw Free calls
    int64_t cache_hits = 0;        // Allocate calls served from the cache
    // Retries after RESOURCE_EXHAUSTED: the cache emptied, or a wait for a
    // ReleaseStream's frees, this cache's or its pool's (one Allocate may
    // count several).
    int64_t oom_retries = 0;
    int64_t pool_releases = 0;     // retries after the pool's other caches gave blocks back
  };

  class Allocation;

  // `raw` must outlive this object. Options must have nonzero granularities
  // and max_fit_ratio >= 1 (checked: a broken invariant aborts).
  CachingAllocator(RawAllocator* raw, Options options);
  explicit CachingAllocator(RawAllocator* raw) : CachingAllocator(raw, Options()) {}
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Returns every cached block to the raw allocator. Every block handed out
  // must have been freed first (checked: aborts naming the count otherwise).
  ~CachingAllocator();

  // The size Allocate(bytes) reserves (see the size rule above); 0 for 0.
  // INVALID_ARGUMENT if rounding overflows size_t.
  absl::StatusOr<size_t> RoundedSize(size_t bytes) const;

  // A block of at least `bytes` bytes for use on `stream`. bytes == 0 returns
  // nullptr without touching the cache or the raw allocator. Errors:
  // INVALID_ARGUMENT if the rounded size overflows; RESOURCE_EXHAUSTED if the
  // raw allocator is out of memory even after the cache was emptied (the
  // message names the allocator, the sizes and the bytes in use); any other
  // raw allocator error, with the allocator's name prefixed.
  absl::StatusOr<void*> Allocate(size_t bytes, StreamId stream);

  // Returns a block from Allocate to the cache (never to the raw allocator),
  // for reuse on the stream it was allocated for. nullptr is a no-op. A
  // pointer this allocator does not have in use aborts (double free).
  void Free(void* ptr);

  // As Allocate, but the block is freed when the returned handle dies.
  absl::StatusOr<Allocation> AllocateOwned(size_t bytes, StreamId stream);

  // Returns all cached free blocks to the raw allocator; blocks in use stay.
  void EmptyCache();

  // Returns the cached free blocks of `stream` to the raw allocator, for a
  // stream being destroyed once its queued work is done: no later Allocate
  // asks for that stream again, so they would stay cached, unused, until an
  // out-of-memory empties the cache mid-job. Blocks in use stay. Returns
  // the bytes released. The raw frees run outside the allocator's lock
  // (cudaFree may wait for the whole device): other streams allocate and
  // free meanwhile, and one the raw allocator refuses waits for those frees
  // and tries again.
  size_t ReleaseStream(StreamId stream);

  Stats GetStats() const;

 private:
  struct InUse {
    size_t size;
    StreamId stream;
  };
  // Ordered by (stream, size, address): lower_bound finds the best fit.
  using FreeKey = std::tuple<StreamId, size_t, uintptr_t>;

  absl::StatusOr<void*> RawAllocateLocked(size_t size, size_t requested, StreamId stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void* TakeCachedLocked(size_t size, StreamId stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EmptyCacheLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The caches of one Options::pool (caching_allocator.cc).
  struct Pool;
  static Pool* PoolNamed(const std::string& name);
  // Empties the caches of this one's pool other than this one that are not
  // busy; returns the bytes they gave back.
  size_t EmptyOtherCachesOfPool() const;
  // The ReleaseStreams of the pool that have finished freeing blocks so
  // far. Needs pool_.
  uint64_t PoolReleasesDone() const;
  // Waits (up to a minute) until no ReleaseStream of the pool is freeing
  // blocks. True when memory may have come back since PoolReleasesDone()
  // returned `releases_seen` (one was under way, or one finished since);
  // false, at once, otherwise. Needs pool_; called without mu_.
  bool AwaitPoolReleases(uint64_t releases_seen) const ABSL_LOCKS_EXCLUDED(mu_);
  void MarkInUseLocked(void* ptr, size_t size, StreamId stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  RawAllocator* const raw_;
  Pool* pool_ = nullptr;  // null without Options::pool; never freed
  const Options options_;
  mutable AnnotatedMutex mu_;
  std::set<FreeKey> free_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<void*, InUse> in_use_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  // Blocks ReleaseStream took out of the cache and is freeing outside the
  // lock: an allocation the raw allocator refuses meanwhile waits for them.
  size_t releasing_ ABSL_GUARDED_BY(mu_) = 0;
};

// A block from CachingAllocator::AllocateOwned, returned to the cache when
// the handle is destroyed or reset. Move-only; an empty handle (default,
// moved-from, or a zero-byte request) holds nullptr. Thread-compatible; the
// allocator must outlive it.
class CachingAllocator::Allocation {
 public:
  Allocation() = default;
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;
  Allocation(Allocation&& other) noexcept;
  Allocation& operator=(Allocation&& other) noexcept;
  ~Allocation() { Reset(); }

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }  // as requested, before rounding
  StreamId stream() const { return stream_; }

  // Frees the block now (if any); the handle becomes empty.
  void Reset();

 private:
  friend class CachingAllocator;
  Allocation(CachingAllocator* owner, void* ptr, size_t bytes, StreamId stream)
      : owner_(owner), ptr_(ptr), bytes_(bytes), stream_(stream) {}

  CachingAllocator* owner_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  StreamId stream_ = 0;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_ALLOC_CACHING_ALLOCATOR_H_
