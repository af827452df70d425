// The CUDA RawAllocators under CachingAllocator (kernels/alloc): device memory
// through cudaMalloc/cudaFree, pinned (page-locked) host memory through
// cudaHostAlloc/cudaFreeHost. Each call is expensive and may synchronise the
// device, which is why they sit under the cache.
//
//   CudaDeviceRawAllocator raw;
//   CachingAllocator device(&raw);
//   ASSIGN_OR_RETURN(void* p, device.Allocate(bytes, StreamIdOf(stream)));
//   ...  // kernels on `stream` use p
//   device.Free(p);  // reused for `stream` only
//
// Out of memory (cudaErrorMemoryAllocation) is RESOURCE_EXHAUSTED, so the
// caching allocator empties its cache and retries; other CUDA failures are
// INTERNAL. Thread-safe: the CUDA runtime serialises these calls itself.
#ifndef PIPETRAIN_KERNELS_CUDA_DEVICE_ALLOCATOR_H_
#define PIPETRAIN_KERNELS_CUDA_DEVICE_ALLOCATOR_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/alloc/caching_allocator.h"

namespace pipetrain {

// The CachingAllocator key of a CUDA stream (the legacy default stream, 0,
// included).
inline StreamId StreamIdOf(cudaStream_t stream) { return reinterpret_cast<StreamId>(stream); }

// The status of an allocation call `call` of `bytes` bytes: OK for
// cudaSuccess; RESOURCE_EXHAUSTED for cudaErrorMemoryAllocation (the message
// names the call and size); INTERNAL for anything else (see CudaStatus). On
// out of memory it also clears the runtime's last error, so the next
// CUDA_CHECK_LAUNCH does not report it.
absl::Status CudaAllocationStatus(cudaError_t error, const char* call, size_t bytes);

// Device memory on the calling thread's current device (cudaSetDevice). A
// block must be freed with the same current device it was allocated on.
class CudaDeviceRawAllocator : public RawAllocator {
 public:
  // INVALID_ARGUMENT for bytes == 0; RESOURCE_EXHAUSTED when the device is
  // full; INTERNAL for other CUDA errors (e.g. no device).
  absl::StatusOr<void*> Allocate(size_t bytes) override;
  // cudaFree; its error is logged, not returned (see DeviceBuffer::Free).
  void Free(void* ptr) override;
};

// Pinned host memory, portable to every device's context
// (cudaHostAllocPortable): asynchronous copies to and from it overlap with
// compute, which pageable memory does not allow.
class CudaPinnedRawAllocator : public RawAllocator {
 public:
  // Errors as CudaDeviceRawAllocator::Allocate (RESOURCE_EXHAUSTED when the
  // host cannot pin that much memory).
  absl::StatusOr<void*> Allocate(size_t bytes) override;
  // cudaFreeHost; its error is logged, not returned.
  void Free(void* ptr) override;
};

// The CachingAllocator pool (Options::pool) of every cache of device memory
// on CUDA device `device`: when one runs out, the others give their free
// blocks back (caching_allocator.h, Out of memory).
std::string CudaDevicePool(int device);

// A process-wide caching allocator of pinned host memory (for PinnedBuffer
// and the data plane), created on first use and never destroyed: static
// destructors may run after the CUDA runtime has shut down. Thread-safe.
CachingAllocator& PinnedHostCachingAllocator();

// The current device's process-wide caching allocator of device memory for
// kernels' scratch (StreamScratch), created on first use and never
// destroyed. One per device: blocks are keyed by stream, and the legacy
// default stream (0) of each device must not share blocks with another's.
// INTERNAL if CUDA cannot say which device is current. Thread-safe.
absl::StatusOr<CachingAllocator*> DeviceScratchCachingAllocator();

// Gives back to CUDA the free blocks that the pinned and every device's
// scratch allocator cache for `stream` (CachingAllocator::ReleaseStream),
// for a stream about to be destroyed, its queued work done (synchronized
// first: a block is free to the cache as soon as its kernel is queued).
// Without it they stay cached under a handle no one asks for again, about
// a gigabyte per profiling backend, until an out-of-memory empties the
// caches mid-step. Nothing for the legacy default stream (nullptr).
// Leaves the current device as it was. Thread-safe.
void ReleaseStreamCaches(cudaStream_t stream);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_DEVICE_ALLOCATOR_H_
