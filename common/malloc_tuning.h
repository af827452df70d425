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
// Cost: memory a worker freed stays in its heap (up to kTrimThresholdBytes
// beyond what it uses), so the resident size reflects its peak use rather
// than its current one. Allocations above 32 MiB still get their own
// mappings (glibc's ceiling for the threshold); the data plane's TensorPool
// (worker/transport/tensor_pool.h) recycles those for received tensors.
#ifndef PIPETRAIN_COMMON_MALLOC_TUNING_H_
#define PIPETRAIN_COMMON_MALLOC_TUNING_H_

#include <cstdint>

namespace pipetrain {

// The settings below; memory above this much free at a heap's top is
// returned to the kernel.
inline constexpr int64_t kTrimThresholdBytes = int64_t{1} << 30;

// Sets glibc's mmap threshold to its maximum (32 MiB) and the trim threshold
// to kTrimThresholdBytes. Call once, early in main, before threads start.
// Returns false if glibc refused a setting (the defaults then stay).
bool TuneMallocForLargeBuffers();

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_MALLOC_TUNING_H_
