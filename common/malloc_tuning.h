// glibc malloc settings for processes that move large buffers: workers,
// train-local (the `pipetrain` binary) and the compute benchmarks.
//
// By default glibc serves each allocation above a threshold (128 KiB,
// raised dynamically up to 32 MiB) with its own mmap and gives it back with
// munmap, and it trims freed memory at the top of a heap back to the
// kernel. A worker allocates and frees buffers of megabytes all the time:
// gRPC's read buffers for every incoming frame, activations, gradients. Each
// fresh mapping is then faulted in page by page (and zeroed by the kernel)
// on first write: profiles of the data plane on loopback showed a fifth of
// the CPU time in page faults and munmap; train-local spent 16 % of its
// wall time in the kernel for its op outputs (docs/benchmarks.md). Serving
// them from the heap instead and keeping freed memory lets the same pages
// be reused.
//
// Cost: memory a worker freed stays in its heap, so the resident size
// reflects its peak use rather than its current one. Beyond what it uses, at
// most kMaxRetainedFreeHeapBytes (1 GiB + 3 x 64 MiB) stays: the main heap
// returns free memory at its top only above kTrimThresholdBytes, and each
// thread arena (glibc gives each new thread one, up to a limit) keeps its
// first 64 MiB heap for good, since that is below the trim threshold
// (malloc_trim(0) does not shrink it either). Hence the cap of kMallocArenaMax
// arenas: glibc's default limit is 8 per core, which left up to 64 MiB per
// thread resident (770 MiB after 16 threads each freed 48 MiB; 2 MiB with
// glibc's defaults). As with the defaults, free holes between blocks in use
// also stay.
// Allocations above 32 MiB still get their own mappings (glibc's ceiling for
// the threshold); the data plane's TensorPool (worker/transport/tensor_pool.h)
// recycles those for received tensors.
#ifndef PIPETRAIN_COMMON_MALLOC_TUNING_H_
#define PIPETRAIN_COMMON_MALLOC_TUNING_H_

#include <cstdint>

namespace pipetrain {

// The settings below; memory above this much free at the main heap's top is
// returned to the kernel.
inline constexpr int64_t kTrimThresholdBytes = int64_t{1} << 30;

// Arenas, the main one included. Once kMallocArenaMax - 1 thread arenas
// exist, further threads share the arenas, each behind its own lock. Four
// serve the worker's threads that allocate large buffers at once (the job
// thread, the send and tensor-parallel executors, gRPC's receivers): an
// arena's lock is held only for the bookkeeping, well under a microsecond,
// against tens of microseconds to fill a MiB, and blocks up to 1 KiB mostly
// come from each thread's cache without the lock.
inline constexpr int kMallocArenaMax = 4;

// The largest heap of a thread arena (glibc's HEAP_MAX_SIZE on 64-bit).
inline constexpr int64_t kThreadArenaHeapBytes = int64_t{64} << 20;

// Free heap memory a tuned process may keep resident beyond what it uses
// (not counting holes between blocks in use): the main heap's free top below
// the trim threshold plus one heap per thread arena.
inline constexpr int64_t kMaxRetainedFreeHeapBytes =
    kTrimThresholdBytes + (kMallocArenaMax - 1) * kThreadArenaHeapBytes;

// Sets glibc's mmap threshold to its maximum (32 MiB), the trim threshold to
// kTrimThresholdBytes and the number of arenas to kMallocArenaMax. Call once,
// early in main, before threads start: arenas made before stay, and glibc
// fixes its own limit once a process has more than 8. Returns false if glibc
// refused a setting (the defaults then stay for that one).
bool TuneMallocForLargeBuffers();

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_MALLOC_TUNING_H_
