#include "worker/transport/tensor_pool.h"

#include <cstdlib>

#include "common/logging.h"
#include "common/tensor.h"

namespace pipetrain {

std::shared_ptr<TensorPool> TensorPool::Create(Options options) {
  PT_CHECK(options.min_bytes >= 1 && options.max_cached_bytes >= 0);
  return std::shared_ptr<TensorPool>(new TensorPool(options));
}

TensorPool::~TensorPool() {
  for (auto& [bytes, data] : cached_) std::free(data);
}

Tensor TensorPool::Take(const Shape& shape) {
  const int64_t bytes = NumElements(shape) * static_cast<int64_t>(sizeof(float));
  if (bytes < options_.min_bytes) return Tensor::Uninitialized(shape);
  float* data = nullptr;
  {
    AnnotatedMutexLock lock(&mu_);
    for (auto it = cached_.begin(); it != cached_.end(); ++it) {
      if (it->first != bytes) continue;
      data = it->second;
      cached_bytes_ -= bytes;
      cached_.erase(it);
      break;
    }
  }
  if (data == nullptr) data = AllocateAlignedHost(bytes);
  std::shared_ptr<TensorPool> self = shared_from_this();
  return Tensor::OnHost(
      shape, std::shared_ptr<float>(data, [self, bytes](float* p) { self->Give(p, bytes); }));
}

void TensorPool::Give(float* data, int64_t bytes) {
  std::deque<float*> evicted;
  {
    AnnotatedMutexLock lock(&mu_);
    cached_.emplace_back(bytes, data);
    cached_bytes_ += bytes;
    while (cached_bytes_ > options_.max_cached_bytes) {
      evicted.push_back(cached_.front().second);
      cached_bytes_ -= cached_.front().first;
      cached_.pop_front();
    }
  }
  for (float* p : evicted) std::free(p);  // Outside the lock: munmap can take a while.
}

int64_t TensorPool::cached_bytes() const {
  AnnotatedMutexLock lock(&mu_);
  return cached_bytes_;
}

}  // namespace pipetrain
