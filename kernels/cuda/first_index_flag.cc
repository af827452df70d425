#include "kernels/cuda/first_index_flag.h"

#include <utility>

#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"

namespace pipetrain {

absl::StatusOr<FirstIndexFlag> FirstIndexFlag::Create(cudaStream_t stream) {
  ASSIGN_OR_RETURN(StreamScratch block, StreamScratch::Create(sizeof(unsigned long long), stream));
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(block.get(), 0xff, sizeof(unsigned long long), stream));
  return FirstIndexFlag(std::move(block), stream);
}

absl::StatusOr<int64_t> FirstIndexFlag::Read() const {
  unsigned long long value = kNone;
  CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&value, block_.get(), sizeof(value), cudaMemcpyDeviceToHost, stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return value == kNone ? int64_t{-1} : static_cast<int64_t>(value);
}

}  // namespace pipetrain
