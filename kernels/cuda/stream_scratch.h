// StreamScratch: a kernel's temporary device memory for work queued on one
// stream, from a cache (the CUDA issue, scope 3) instead of cudaMalloc and
// cudaFree per call: cudaFree waits for the whole device, so a codec call
// that freed its scratch stalled every stream, the backend's compute too.
//
//   ASSIGN_OR_RETURN(StreamScratch flag, StreamScratch::Create(sizeof(uint64_t), stream));
//   Kernel<<<grid, block, 0, stream>>>(..., flag.as<unsigned long long>());
//   // flag may go now, even with Kernel still queued
//
// The block comes from the current device's scratch cache
// (DeviceScratchCachingAllocator, kernels/cuda/device_allocator.h), keyed
// by `stream`; when the handle dies it goes back to the cache, not to CUDA,
// and the cache hands it only to work queued later on the same stream,
// which runs after every kernel that used it. So a handle may die while
// kernels that use it are still queued. Call Create with the stream's
// device current (as launching on it requires).
//
// Kept free of the allocator's headers: .cu files include it (nvcc).
// Move-only; thread-compatible.
#ifndef PIPETRAIN_KERNELS_CUDA_STREAM_SCRATCH_H_
#define PIPETRAIN_KERNELS_CUDA_STREAM_SCRATCH_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "absl/status/statusor.h"

namespace pipetrain {

class StreamScratch {
 public:
  // At least `bytes` bytes (0: an empty handle, get() == nullptr) for work
  // on `stream`. RESOURCE_EXHAUSTED when the device is full even after the
  // cache was emptied; INTERNAL for other CUDA errors (e.g. no device).
  static absl::StatusOr<StreamScratch> Create(size_t bytes, cudaStream_t stream);

  StreamScratch() = default;
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  StreamScratch(StreamScratch&& other) noexcept
      : cache_(std::exchange(other.cache_, nullptr)), ptr_(std::exchange(other.ptr_, nullptr)) {}
  StreamScratch& operator=(StreamScratch&& other) noexcept {
    if (this != &other) {
      Release();
      cache_ = std::exchange(other.cache_, nullptr);
      ptr_ = std::exchange(other.ptr_, nullptr);
    }
    return *this;
  }
  ~StreamScratch() { Release(); }

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void Release();  // back to the cache it came from

  void* cache_ = nullptr;  // the CachingAllocator, opaque here (see above)
  void* ptr_ = nullptr;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_STREAM_SCRATCH_H_
