// RAII CUDA streams and events, the pieces that let compute overlap sends
// and receives: the data plane copies on its own stream, and an event
// recorded after a producer's work orders a consumer on another stream
// behind it without blocking the host.
//
//   ASSIGN_OR_RETURN(CudaStream compute, CudaStream::Create());
//   ASSIGN_OR_RETURN(CudaStream copy, CudaStream::Create());
//   ASSIGN_OR_RETURN(CudaEvent ready, CudaEvent::Create());
//   ...  // forward kernels on compute.get()
//   RETURN_IF_ERROR(ready.Record(compute.get()));
//   RETURN_IF_ERROR(ready.StreamWait(copy.get()));  // copy waits, host does not
//   ...  // cudaMemcpyAsync(..., copy.get()) of the activations
//
// An empty handle (default-constructed or moved-from) answers every call
// with FAILED_PRECONDITION; its get() is nullptr, which CUDA would read as the
// legacy default stream, so do not pass an empty stream's get() to CUDA.
// Handles are move-only and thread-compatible (CUDA itself allows calls on
// one stream or event from several threads; these wrappers add no state).
// They must be destroyed before the CUDA runtime shuts down (not statics).
#ifndef PIPETRAIN_KERNELS_CUDA_STREAM_H_
#define PIPETRAIN_KERNELS_CUDA_STREAM_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/alloc/caching_allocator.h"

namespace pipetrain {

class CudaStream {
 public:
  // A stream on the current device that does not synchronise with the
  // legacy default stream (cudaStreamNonBlocking). INTERNAL if CUDA fails
  // (e.g. no device).
  static absl::StatusOr<CudaStream> Create();

  CudaStream() = default;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  ~CudaStream();  // waits for the queued work, then cudaStreamDestroy

  bool valid() const { return stream_ != nullptr; }
  cudaStream_t get() const { return stream_; }
  // The CachingAllocator key for blocks used on this stream.
  StreamId id() const { return reinterpret_cast<StreamId>(stream_); }

  // Blocks the host until all work queued on the stream has finished.
  // FAILED_PRECONDITION if empty; INTERNAL if CUDA fails (including a fault
  // of a kernel queued earlier).
  absl::Status Synchronize() const;

 private:
  explicit CudaStream(cudaStream_t stream) : stream_(stream) {}
  void Destroy();

  cudaStream_t stream_ = nullptr;
};

enum class EventTiming { kDisabled, kEnabled };

class CudaEvent {
 public:
  // An event on the current device. Timing is off by default
  // (cudaEventDisableTiming), which makes Record and waits cheaper; enable it
  // only to measure. INTERNAL if CUDA fails.
  static absl::StatusOr<CudaEvent> Create(EventTiming timing = EventTiming::kDisabled);

  CudaEvent() = default;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  CudaEvent(CudaEvent&& other) noexcept;
  CudaEvent& operator=(CudaEvent&& other) noexcept;
  ~CudaEvent();

  bool valid() const { return event_ != nullptr; }
  cudaEvent_t get() const { return event_; }

  // Captures the work queued on `stream` so far (cudaEventRecord); a later
  // Record replaces the capture. `stream` may be 0 (legacy default stream).
  // FAILED_PRECONDITION if empty; INTERNAL if CUDA fails.
  absl::Status Record(cudaStream_t stream);

  // Makes work queued on `stream` from now on wait for the recorded work
  // (cudaStreamWaitEvent), without blocking the host. Waiting on an event
  // never recorded does not wait. Errors as Record.
  absl::Status StreamWait(cudaStream_t stream) const;

  // Blocks the host until the recorded work has finished. Errors as Record.
  absl::Status Synchronize() const;

  // True if the recorded work has finished (or nothing was recorded), false
  // if it is still pending. FAILED_PRECONDITION if empty; INTERNAL if CUDA
  // fails.
  absl::StatusOr<bool> Query() const;

 private:
  explicit CudaEvent(cudaEvent_t event) : event_(event) {}
  void Destroy();

  cudaEvent_t event_ = nullptr;
};

// Makes the work queued on `later` from now on wait for the work queued on
// `earlier` so far (an event recorded there), without blocking the host:
// how NCCL's streams wait for the compute stream's writes. INTERNAL if
// CUDA fails.
absl::Status StreamWaitsFor(cudaStream_t later, cudaStream_t earlier);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_STREAM_H_
