// FirstIndexFlag: one device word that kernels lower with atomicMin to the
// smallest index they reject (a non-finite value, an out-of-range code, an
// overflow), read back after the kernels: how the GPU codecs name the first
// bad element as their CPU twins do.
//
//   ASSIGN_OR_RETURN(FirstIndexFlag flag, FirstIndexFlag::Create(stream));
//   Kernel<<<grid, block, 0, stream>>>(..., flag.get());
//   ASSIGN_OR_RETURN(int64_t first_bad, flag.Read());  // -1: none
//
// The word comes from the stream's scratch cache (stream_scratch.h), set to
// kNone on the stream. Included by .cu files. Move-only.
#ifndef PIPETRAIN_KERNELS_CUDA_FIRST_INDEX_FLAG_H_
#define PIPETRAIN_KERNELS_CUDA_FIRST_INDEX_FLAG_H_

#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"
#include "kernels/cuda/stream_scratch.h"

namespace pipetrain {

class FirstIndexFlag {
 public:
  // The flag's value while no kernel has stored an index (device code may
  // start a per-thread minimum from it too).
  static constexpr unsigned long long kNone = ULLONG_MAX;

  // A flag at kNone for work queued on `stream`. The scratch's errors, or
  // INTERNAL if the memset cannot be queued.
  static absl::StatusOr<FirstIndexFlag> Create(cudaStream_t stream);

  unsigned long long* get() const { return block_.as<unsigned long long>(); }

  // Waits for the stream, then the smallest index stored, or -1 for none.
  // INTERNAL on a CUDA failure.
  absl::StatusOr<int64_t> Read() const;

 private:
  FirstIndexFlag(StreamScratch block, cudaStream_t stream)
      : block_(std::move(block)), stream_(stream) {}

  StreamScratch block_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_FIRST_INDEX_FLAG_H_
