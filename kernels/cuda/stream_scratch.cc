#include "kernels/cuda/stream_scratch.h"

#include "common/status_macros.h"
#include "kernels/cuda/device_allocator.h"

namespace pipetrain {

absl::StatusOr<StreamScratch> StreamScratch::Create(size_t bytes, cudaStream_t stream) {
  StreamScratch scratch;
  if (bytes == 0) return scratch;
  ASSIGN_OR_RETURN(CachingAllocator * cache, DeviceScratchCachingAllocator());
  ASSIGN_OR_RETURN(scratch.ptr_, cache->Allocate(bytes, StreamIdOf(stream)));
  scratch.cache_ = cache;
  return scratch;
}

void StreamScratch::Release() {
  if (ptr_ != nullptr) static_cast<CachingAllocator*>(cache_)->Free(ptr_);
  ptr_ = nullptr;
  cache_ = nullptr;
}

}  // namespace pipetrain
