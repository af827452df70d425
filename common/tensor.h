// Tensor: a dense, row-major fp32 array with a shape, on the host unless
// made by OnDevice (a Backend's device memory, worker/model/backend.h).
//
// Copies are shallow: copying a Tensor (or taking a View/Slice) shares the
// underlying storage, like a reference-counted buffer. Use Clone() for a deep
// copy. This is what lets a unit hand its output to the next unit without a
// memcpy and lets tied parameters (the GPT-2 token embedding) be one buffer.
// A const Tensor& promises only that this handle is not re-pointed; data
// reached through another handle to the same storage may still change.
//
// Storage is 64-byte aligned (one AVX-512 vector / cache line).
// Device tensors: data() is a device pointer; the element accessors and the
// host-side methods (Fill, CopyFrom, ToVector, Clone) must not be used on
// them (the latter four check), views (Reshape, Slice) work on both.
// Not thread-safe for concurrent writers; concurrent readers are fine.
#ifndef PIPETRAIN_COMMON_TENSOR_H_
#define PIPETRAIN_COMMON_TENSOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pipetrain {

using Shape = std::vector<int64_t>;

// Number of elements of `shape` (1 for the empty shape, i.e. a scalar).
int64_t NumElements(const Shape& shape);
std::string ShapeToString(const Shape& shape);  // "[2, 3]"

// Uninitialised host memory of `bytes` (at least one byte is allocated for
// 0), aligned to 64 bytes as every Tensor's own storage is; free it with
// std::free. The exact size is allocated, so AddressSanitizer sees an
// overrun by even one element. Aborts when out of memory. For pools that
// hand out Tensor::OnHost storage (worker/transport/tensor_pool.h).
float* AllocateAlignedHost(int64_t bytes);

// Host memory held by tensors: bytes of storage that Tensor's own factories
// (Zeros, Uninitialized, Filled, FromVector, Clone) have allocated and not
// yet freed, and the most there was at once since the last
// ResetHostTensorPeak (or since the process started). Storage passed in by
// OnHost or OnDevice, AllocateAlignedHost's other callers and kernels'
// own scratch (std::vector) are not counted. Process-wide and thread-safe;
// for measuring one piece of work's peak (the unit profiler's
// transient_bytes), where other threads' tensors count too.
struct HostTensorMemory {
  int64_t live_bytes = 0;
  int64_t peak_bytes = 0;
};
HostTensorMemory CurrentHostTensorMemory();
// Sets the peak to the bytes live now.
void ResetHostTensorPeak();

class Tensor;
// The index of the first NaN or infinite element of host tensor `t`, or -1
// when every element is finite (or `t` is empty). Must not be a device tensor.
int64_t FirstNonFinite(const Tensor& t);
// For messages that name the tensor: "" when every element of host tensor
// `t` is finite, else "holds NaN at element i" (or "holds an infinity at
// element i") for the first one that is not.
std::string DescribeFirstNonFinite(const Tensor& t);
// "" when no element of host tensor `t` is below zero, else "holds a
// negative value at element i" for the first one (AdamW's second moments,
// read from a file, must not be: sqrt of one turns the weights to NaN).
std::string DescribeFirstNegative(const Tensor& t);

class Tensor {
 public:
  Tensor() = default;  // Null tensor: numel() == 0, is_null() == true.

  // Zero-initialised tensor of `shape`. All dimensions must be >= 0.
  static Tensor Zeros(const Shape& shape);
  // Contents unspecified, for a caller that writes every element before
  // anything reads one (the data plane's receiver fills it from the
  // network): saves Zeros' pass over memory that is overwritten anyway.
  static Tensor Uninitialized(const Shape& shape);
  // Every element `value` (one pass over fresh memory, as Zeros).
  static Tensor Filled(const Shape& shape, float value);
  // Copies `values`; requires values.size() == NumElements(shape).
  static Tensor FromVector(const Shape& shape, const std::vector<float>& values);

  // A tensor of `shape` over `storage`, memory the caller allocated on a
  // device (the deleter frees it); storage must hold NumElements(shape)
  // floats. Used by device backends only; a backend whose allocation failed
  // passes null storage (its status() says why, backend.h).
  static Tensor OnDevice(const Shape& shape, std::shared_ptr<float> storage);
  // A host tensor of `shape` over `storage`, host memory the caller
  // allocated (e.g. pinned, from a device backend; the deleter frees it);
  // storage must hold NumElements(shape) floats and must not be null.
  static Tensor OnHost(const Shape& shape, std::shared_ptr<float> storage);

  bool is_null() const { return storage_ == nullptr; }
  bool on_device() const { return on_device_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const;  // Negative i counts from the end.
  int64_t numel() const { return numel_; }
  int64_t size_bytes() const { return numel_ * static_cast<int64_t>(sizeof(float)); }

  float* data() { return storage_.get() + offset_; }
  const float* data() const { return storage_.get() + offset_; }
  float& operator[](int64_t i) { return data()[i]; }
  float operator[](int64_t i) const { return data()[i]; }

  // View with a new shape of the same element count (shares storage).
  Tensor Reshape(const Shape& shape) const;
  // View of rows [begin, end) along dimension 0 (shares storage).
  Tensor Slice(int64_t begin, int64_t end) const;
  // Deep copy into fresh storage.
  Tensor Clone() const;

  void Fill(float value);
  // Copies element values from `other`; requires equal numel.
  void CopyFrom(const Tensor& other);
  std::vector<float> ToVector() const;

  // True when no other handle (views included) shares this tensor's
  // storage, so whoever holds this one alone can read or write it.
  bool sole_owner() const { return storage_ != nullptr && storage_.use_count() == 1; }

  bool SharesStorageWith(const Tensor& other) const {
    return storage_ != nullptr && storage_ == other.storage_;
  }

 private:
  std::shared_ptr<float> storage_;
  int64_t offset_ = 0;
  int64_t numel_ = 0;
  Shape shape_;
  bool on_device_ = false;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_TENSOR_H_
