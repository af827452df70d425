#include "kernels/cuda/stream.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_allocator.h"

namespace pipetrain {
namespace {

absl::Status EmptyHandleError(const char* type, const char* method) {
  return absl::FailedPreconditionError(absl::StrCat(type, "::", method,
                                                    " on an empty handle (default-constructed or "
                                                    "moved-from); create one with ",
                                                    type, "::Create()"));
}

}  // namespace

absl::StatusOr<CudaStream> CudaStream::Create() {
  cudaStream_t stream = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return CudaStream(stream);
}

CudaStream::CudaStream(CudaStream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)) {}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    Destroy();
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

CudaStream::~CudaStream() { Destroy(); }

// The error is dropped: a destructor cannot report it, and a failure here
// (after a device fault) shows at the next checked call.
void CudaStream::Destroy() {
  // Waits for the queued work first: scratch blocks are cached by the
  // stream's handle (stream_scratch.h), and a new stream may get the same
  // handle while this one's kernels still use them. A fault is not
  // reported here; it was or will be by a call on the stream.
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    ReleaseStreamCaches(stream_);  // no later Allocate asks for this handle's blocks
    cudaStreamDestroy(stream_);
  }
  stream_ = nullptr;
}

absl::Status CudaStream::Synchronize() const {
  if (!valid()) return EmptyHandleError("CudaStream", "Synchronize");
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::StatusOr<CudaEvent> CudaEvent::Create(EventTiming timing) {
  const unsigned int flags =
      timing == EventTiming::kEnabled ? cudaEventDefault : cudaEventDisableTiming;
  cudaEvent_t event = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, flags));
  return CudaEvent(event);
}

CudaEvent::CudaEvent(CudaEvent&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  if (this != &other) {
    Destroy();
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

CudaEvent::~CudaEvent() { Destroy(); }

// Error dropped, as for CudaStream::Destroy.
void CudaEvent::Destroy() {
  if (event_ != nullptr) cudaEventDestroy(event_);
  event_ = nullptr;
}

absl::Status CudaEvent::Record(cudaStream_t stream) {
  if (!valid()) return EmptyHandleError("CudaEvent", "Record");
  CUDA_RETURN_IF_ERROR(cudaEventRecord(event_, stream));
  return absl::OkStatus();
}

absl::Status CudaEvent::StreamWait(cudaStream_t stream) const {
  if (!valid()) return EmptyHandleError("CudaEvent", "StreamWait");
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, event_, 0));
  return absl::OkStatus();
}

absl::Status CudaEvent::Synchronize() const {
  if (!valid()) return EmptyHandleError("CudaEvent", "Synchronize");
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_));
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaEvent::Query() const {
  if (!valid()) return EmptyHandleError("CudaEvent", "Query");
  const cudaError_t error = cudaEventQuery(event_);
  if (error == cudaErrorNotReady) {
    cudaGetLastError();  // not an error: pending work must not fail the next check
    return false;
  }
  CUDA_RETURN_IF_ERROR(error);
  return true;
}

absl::Status StreamWaitsFor(cudaStream_t later, cudaStream_t earlier) {
  ASSIGN_OR_RETURN(CudaEvent ready, CudaEvent::Create());
  RETURN_IF_ERROR(ready.Record(earlier));
  return ready.StreamWait(later);
}

}  // namespace pipetrain
