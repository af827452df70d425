// TensorPool: recycles the host memory of large received tensors.
//
// A worker receives tensors of the same few sizes every step. glibc serves
// allocations above 32 MiB (its largest mmap threshold, whatever the
// settings) with a fresh mmap and returns them with munmap, so each such
// tensor costs a page fault per 4 KiB on its first write: for a 64 MiB
// activation that is 16384 faults, about as long as receiving it over
// loopback (docs/benchmarks.md, "Activation streaming"). Smaller ones fare
// better but the heap's top is trimmed back to the kernel now and then.
// Tensors taken from the pool give their memory back to it when their last
// handle goes, and the next tensor of that byte size reuses it, pages
// already mapped.
//
// Bounds: at most Options::max_cached_bytes sit unused in the pool (the
// oldest are freed first); tensors below Options::min_bytes bypass it. The
// pool lives until the last tensor taken from it is gone.
//
// Thread-safe: tensors may be taken and dropped on any thread.
#ifndef PIPETRAIN_WORKER_TRANSPORT_TENSOR_POOL_H_
#define PIPETRAIN_WORKER_TRANSPORT_TENSOR_POOL_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "common/annotated_mutex.h"
#include "common/tensor.h"

namespace pipetrain {

class TensorPool : public std::enable_shared_from_this<TensorPool> {
 public:
  struct Options {
    int64_t min_bytes = int64_t{1} << 20;
    int64_t max_cached_bytes = int64_t{256} << 20;
  };
  static std::shared_ptr<TensorPool> Create(Options options);
  static std::shared_ptr<TensorPool> Create() { return Create(Options()); }
  ~TensorPool();  // Frees what is cached.

  // A host tensor of `shape` whose contents are unspecified (as
  // Tensor::Uninitialized). Requires dimensions >= 0.
  Tensor Take(const Shape& shape);

  // Bytes cached, not in use (for tests and metrics).
  int64_t cached_bytes() const;

 private:
  explicit TensorPool(Options options) : options_(options) {}
  void Give(float* data, int64_t bytes);

  const Options options_;
  mutable AnnotatedMutex mu_;
  std::deque<std::pair<int64_t, float*>> cached_ ABSL_GUARDED_BY(mu_);  // Oldest first.
  int64_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRANSPORT_TENSOR_POOL_H_
