// DeviceBuffer<T>: n elements of T in CUDA device memory, freed on destruction.
//
// Each buffer is one cudaMalloc, so this is for tests and setup, not for
// per-step allocations (those go through the caching allocator,
// kernels/alloc/caching_allocator.h over device_allocator.h). Copies are
// synchronous cudaMemcpy calls on the legacy default stream: they wait for
// kernels on blocking streams but NOT for kernels on non-blocking streams
// (CudaStream's, a backend's): synchronise such a stream before copying
// what its kernels write.
//
// Thread-compatible: a buffer may move between threads but must not be used
// from two at once. It must be destroyed before the CUDA context is torn
// down (i.e. not in a static destructor).
#ifndef PIPETRAIN_KERNELS_CUDA_DEVICE_BUFFER_H_
#define PIPETRAIN_KERNELS_CUDA_DEVICE_BUFFER_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"

namespace pipetrain {

template <typename T>
class DeviceBuffer {
  static_assert(std::is_trivially_copyable_v<T>, "device memory holds plain data");

 public:
  // A buffer of n uninitialised elements. n == 0 gives an empty buffer with
  // data() == nullptr. INVALID_ARGUMENT if n < 0 or n * sizeof(T) overflows;
  // INTERNAL if cudaMalloc fails (e.g. out of memory, or no device).
  static absl::StatusOr<DeviceBuffer> Create(int64_t n) {
    if (n < 0 || static_cast<uint64_t>(n) > std::numeric_limits<size_t>::max() / sizeof(T)) {
      return absl::InvalidArgumentError(
          absl::StrCat("DeviceBuffer size ", n, " is negative or too large"));
    }
    DeviceBuffer buffer;
    if (n > 0) {
      void* ptr = nullptr;
      CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, static_cast<size_t>(n) * sizeof(T)));
      buffer.data_ = static_cast<T*>(ptr);
      buffer.size_ = n;
    }
    return buffer;
  }

  // A buffer holding a copy of `host`. Errors as Create and CopyFromHost.
  static absl::StatusOr<DeviceBuffer> FromHost(const std::vector<T>& host) {
    absl::StatusOr<DeviceBuffer> buffer = Create(static_cast<int64_t>(host.size()));
    if (!buffer.ok()) return buffer.status();
    absl::Status copied = buffer->CopyFromHost(host.data(), buffer->size());
    if (!copied.ok()) return copied;
    return buffer;
  }

  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      Free();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { Free(); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  int64_t size() const { return size_; }

  // Copies host[0, n) to the start of the buffer. INVALID_ARGUMENT unless
  // 0 <= n <= size(); INTERNAL if the copy fails.
  absl::Status CopyFromHost(const T* host, int64_t n) {
    if (n < 0 || n > size_) return SizeError("CopyFromHost", n);
    if (n == 0) return absl::OkStatus();
    CUDA_RETURN_IF_ERROR(cudaMemcpy(data_, host, Bytes(n), cudaMemcpyHostToDevice));
    return absl::OkStatus();
  }

  // Copies the first n elements to host[0, n). Errors as CopyFromHost.
  absl::Status CopyToHost(T* host, int64_t n) const {
    if (n < 0 || n > size_) return SizeError("CopyToHost", n);
    if (n == 0) return absl::OkStatus();
    CUDA_RETURN_IF_ERROR(cudaMemcpy(host, data_, Bytes(n), cudaMemcpyDeviceToHost));
    return absl::OkStatus();
  }

  // The whole buffer as a host vector. INTERNAL if the copy fails.
  absl::StatusOr<std::vector<T>> ToHost() const {
    std::vector<T> host(static_cast<size_t>(size_));
    absl::Status copied = CopyToHost(host.data(), size_);
    if (!copied.ok()) return copied;
    return host;
  }

 private:
  static size_t Bytes(int64_t n) { return static_cast<size_t>(n) * sizeof(T); }

  absl::Status SizeError(const char* op, int64_t n) const {
    return absl::InvalidArgumentError(absl::StrCat(
        "DeviceBuffer::", op, ": ", n, " elements requested, buffer holds ", size_));
  }

  // cudaFree's error is dropped: a destructor cannot report it, and a failed
  // free (e.g. after a device fault) is already visible through the next
  // checked call.
  void Free() {
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_DEVICE_BUFFER_H_
