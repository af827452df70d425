#include "kernels/cuda/device_allocator.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "kernels/cuda/cuda_status.h"

namespace pipetrain {
namespace {

absl::Status ZeroBytesError(const char* allocator) {
  return absl::InvalidArgumentError(
      absl::StrCat(allocator, ": a zero-byte allocation has no block; callers skip it"));
}

}  // namespace

absl::Status CudaAllocationStatus(cudaError_t error, const char* call, size_t bytes) {
  if (error == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // out of memory is not sticky: clear it for later checks
    return absl::ResourceExhaustedError(absl::StrCat(call, " of ", bytes, " bytes: out of memory (",
                                                     cudaGetErrorString(error),
                                                     "); check the memory in use (nvidia-smi)"));
  }
  return CudaStatus(error, call, __FILE__, __LINE__);
}

absl::StatusOr<void*> CudaDeviceRawAllocator::Allocate(size_t bytes) {
  if (bytes == 0) return ZeroBytesError("CudaDeviceRawAllocator");
  void* ptr = nullptr;
  absl::Status status = CudaAllocationStatus(cudaMalloc(&ptr, bytes), "cudaMalloc", bytes);
  if (!status.ok()) return status;
  return ptr;
}

void CudaDeviceRawAllocator::Free(void* ptr) {
  const cudaError_t error = cudaFree(ptr);
  if (error != cudaSuccess) {
    PT_LOG(ERROR) << CudaStatus(error, "cudaFree(ptr)", __FILE__, __LINE__).message();
  }
}

absl::StatusOr<void*> CudaPinnedRawAllocator::Allocate(size_t bytes) {
  if (bytes == 0) return ZeroBytesError("CudaPinnedRawAllocator");
  void* ptr = nullptr;
  absl::Status status = CudaAllocationStatus(cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable),
                                             "cudaHostAlloc", bytes);
  if (!status.ok()) return status;
  return ptr;
}

void CudaPinnedRawAllocator::Free(void* ptr) {
  const cudaError_t error = cudaFreeHost(ptr);
  if (error != cudaSuccess) {
    PT_LOG(ERROR) << CudaStatus(error, "cudaFreeHost(ptr)", __FILE__, __LINE__).message();
  }
}

std::string CudaDevicePool(int device) { return absl::StrCat("cuda:", device); }

CachingAllocator& PinnedHostCachingAllocator() {
  // Leaked on purpose (see the header): never destroyed, so never checked
  // for blocks still in use at exit.
  static CachingAllocator* const allocator = [] {
    CachingAllocator::Options options;
    options.name = "pinned host allocator";
    return new CachingAllocator(new CudaPinnedRawAllocator(), options);
  }();
  return *allocator;
}

namespace {

// The scratch allocators made so far, by device index, and their lock.
// Leaked on purpose, like the pinned allocator.
absl::Mutex scratch_mu(absl::kConstInit);
std::map<int, CachingAllocator*>& ScratchByDevice() ABSL_EXCLUSIVE_LOCKS_REQUIRED(scratch_mu) {
  static auto* const by_device = new std::map<int, CachingAllocator*>();
  return *by_device;
}

}  // namespace

void ReleaseStreamCaches(cudaStream_t stream) {
  if (stream == nullptr) return;  // the legacy default stream is everyone's
  const StreamId id = StreamIdOf(stream);
  PinnedHostCachingAllocator().ReleaseStream(id);
  int current = 0;
  if (cudaGetDevice(&current) != cudaSuccess) return;
  // Each device's: a stream's blocks are on the device that was current
  // when they were taken, which the caller need not know. Released without
  // scratch_mu (the allocators are never destroyed): cudaFree waits for the
  // device, and another thread's first scratch on a device must not wait
  // with it.
  std::map<int, CachingAllocator*> allocators;
  {
    absl::MutexLock lock(&scratch_mu);
    allocators = ScratchByDevice();
  }
  for (const auto& [device, allocator] : allocators) {
    if (cudaSetDevice(device) == cudaSuccess) allocator->ReleaseStream(id);
  }
  cudaSetDevice(current);
}

absl::StatusOr<CachingAllocator*> DeviceScratchCachingAllocator() {
  int device = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  absl::MutexLock lock(&scratch_mu);
  CachingAllocator*& allocator = ScratchByDevice()[device];
  if (allocator == nullptr) {
    CachingAllocator::Options options;
    options.name = absl::StrCat("device ", device, " scratch allocator");
    options.pool = CudaDevicePool(device);
    allocator = new CachingAllocator(new CudaDeviceRawAllocator(), options);
  }
  return allocator;
}

}  // namespace pipetrain
