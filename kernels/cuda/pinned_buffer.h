// PinnedBuffer: n floats of pinned (page-locked) host memory, the staging
// area of the gRPC data plane. Copies between pinned memory and the device
// run asynchronously on a stream (DMA), so a tensor's send or receive
// overlaps with kernels on the compute stream; from pageable memory
// cudaMemcpyAsync would stage through a driver buffer and block the host.
//
//   ASSIGN_OR_RETURN(PinnedBuffer staging, PinnedBuffer::Create(n));
//   RETURN_IF_ERROR(staging.CopyFromDeviceAsync(activations, n, copy.get()));
//   RETURN_IF_ERROR(copy.Synchronize());  // before the host reads staging
//   ... send staging.data() over gRPC ...
//
// Memory comes from a CachingAllocator (by default the process-wide
// PinnedHostCachingAllocator()), so buffers of a recurring size cost no
// cudaHostAlloc after the first. Host code reads and writes the buffer
// directly, outside any stream order, so the caching allocator's
// per-stream reuse rule does not protect it: the caller must wait for the
// buffer's last asynchronous copy (stream or event Synchronize) before
// touching the data, and before destroying the buffer (its block may be
// handed out and written at once).
//
// Move-only, thread-compatible. It must not outlive its allocator.
#ifndef PIPETRAIN_KERNELS_CUDA_PINNED_BUFFER_H_
#define PIPETRAIN_KERNELS_CUDA_PINNED_BUFFER_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/alloc/caching_allocator.h"

namespace pipetrain {

class PinnedBuffer {
 public:
  // n uninitialised floats from `allocator`, which must hand out pinned host
  // memory (a CachingAllocator over CudaPinnedRawAllocator) for the copies
  // to be asynchronous. n == 0 gives an empty buffer (data() == nullptr)
  // without allocating. INVALID_ARGUMENT if allocator is null, n < 0 or the
  // byte count overflows; the allocator's errors otherwise
  // (RESOURCE_EXHAUSTED when memory cannot be pinned).
  static absl::StatusOr<PinnedBuffer> Create(CachingAllocator* allocator, int64_t n);
  // As above, from PinnedHostCachingAllocator().
  static absl::StatusOr<PinnedBuffer> Create(int64_t n);

  PinnedBuffer() = default;
  // A moved-from buffer is empty (size() == 0, data() == nullptr).
  PinnedBuffer(PinnedBuffer&& other) noexcept
      : block_(std::move(other.block_)), size_(std::exchange(other.size_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
    block_ = std::move(other.block_);
    size_ = std::exchange(other.size_, 0);
    return *this;
  }

  float* data() { return static_cast<float*>(block_.get()); }
  const float* data() const { return static_cast<const float*>(block_.get()); }
  int64_t size() const { return size_; }
  absl::Span<float> span() { return absl::Span<float>(data(), static_cast<size_t>(size_)); }

  // Queues a copy of the first n floats to device[0, n) on `stream` and
  // returns without waiting. The buffer must not be written, nor destroyed,
  // until the copy has finished. INVALID_ARGUMENT unless 0 <= n <= size()
  // and (n == 0 or device != nullptr); INTERNAL if CUDA fails. n == 0 makes
  // no CUDA call.
  absl::Status CopyToDeviceAsync(float* device, int64_t n, cudaStream_t stream) const;

  // Queues a copy of device[0, n) into the first n floats on `stream`; the
  // data is there once the stream has reached this point (Synchronize).
  // Errors as CopyToDeviceAsync.
  absl::Status CopyFromDeviceAsync(const float* device, int64_t n, cudaStream_t stream);

 private:
  PinnedBuffer(CachingAllocator::Allocation block, int64_t size)
      : block_(std::move(block)), size_(size) {}

  absl::Status CheckCopy(const char* op, const void* device, int64_t n) const;

  CachingAllocator::Allocation block_;
  int64_t size_ = 0;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_PINNED_BUFFER_H_
