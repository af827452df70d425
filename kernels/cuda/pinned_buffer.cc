#include "kernels/cuda/pinned_buffer.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_allocator.h"

namespace pipetrain {
namespace {

// Host memory is reused in host order, not stream order (see the header), so
// all pinned buffers share one cache key.
constexpr StreamId kHostStream = 0;

}  // namespace

absl::StatusOr<PinnedBuffer> PinnedBuffer::Create(CachingAllocator* allocator, int64_t n) {
  if (allocator == nullptr) {
    return absl::InvalidArgumentError("PinnedBuffer::Create: allocator is null");
  }
  if (n < 0 || static_cast<uint64_t>(n) > std::numeric_limits<size_t>::max() / sizeof(float)) {
    return absl::InvalidArgumentError(
        absl::StrCat("PinnedBuffer size ", n, " is negative or too large"));
  }
  absl::StatusOr<CachingAllocator::Allocation> block =
      allocator->AllocateOwned(static_cast<size_t>(n) * sizeof(float), kHostStream);
  if (!block.ok()) return block.status();
  return PinnedBuffer(std::move(*block), n);
}

absl::StatusOr<PinnedBuffer> PinnedBuffer::Create(int64_t n) {
  return Create(&PinnedHostCachingAllocator(), n);
}

absl::Status PinnedBuffer::CheckCopy(const char* op, const void* device, int64_t n) const {
  if (n < 0 || n > size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("PinnedBuffer::", op, ": ", n, " elements requested, buffer holds ", size_));
  }
  if (n > 0 && device == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("PinnedBuffer::", op, ": device pointer is null for ", n, " elements"));
  }
  return absl::OkStatus();
}

absl::Status PinnedBuffer::CopyToDeviceAsync(float* device, int64_t n, cudaStream_t stream) const {
  if (absl::Status status = CheckCopy("CopyToDeviceAsync", device, n); !status.ok()) {
    return status;
  }
  if (n == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device, data(), static_cast<size_t>(n) * sizeof(float),
                                       cudaMemcpyHostToDevice, stream));
  return absl::OkStatus();
}

absl::Status PinnedBuffer::CopyFromDeviceAsync(const float* device, int64_t n,
                                               cudaStream_t stream) {
  if (absl::Status status = CheckCopy("CopyFromDeviceAsync", device, n); !status.ok()) {
    return status;
  }
  if (n == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(data(), device, static_cast<size_t>(n) * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream));
  return absl::OkStatus();
}

}  // namespace pipetrain
