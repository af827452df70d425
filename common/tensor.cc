#include "common/tensor.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace pipetrain {
namespace {

constexpr size_t kAlignment = 64;

std::atomic<int64_t> g_live_bytes{0};
std::atomic<int64_t> g_peak_bytes{0};

void RaisePeakTo(int64_t live) {
  int64_t peak = g_peak_bytes.load(std::memory_order_relaxed);
  while (live > peak &&
         !g_peak_bytes.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

// numel floats, uninitialised, counted in CurrentHostTensorMemory until freed.
std::shared_ptr<float> Allocate(int64_t numel) {
  const int64_t bytes = numel * static_cast<int64_t>(sizeof(float));
  float* storage = AllocateAlignedHost(bytes);
  RaisePeakTo(g_live_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes);
  return std::shared_ptr<float>(storage, [bytes](float* q) {
    g_live_bytes.fetch_sub(bytes, std::memory_order_relaxed);
    std::free(q);
  });
}

std::shared_ptr<float> AllocateZeroed(int64_t numel) {
  std::shared_ptr<float> storage = Allocate(numel);
  std::memset(storage.get(), 0, static_cast<size_t>(numel) * sizeof(float));
  return storage;
}

}  // namespace

HostTensorMemory CurrentHostTensorMemory() {
  HostTensorMemory m;
  m.live_bytes = g_live_bytes.load(std::memory_order_relaxed);
  m.peak_bytes = std::max(m.live_bytes, g_peak_bytes.load(std::memory_order_relaxed));
  return m;
}

void ResetHostTensorPeak() { g_peak_bytes.store(g_live_bytes.load(std::memory_order_relaxed)); }

float* AllocateAlignedHost(int64_t bytes) {
  // posix_memalign takes the exact size (aligned_alloc wants a multiple of
  // the alignment), so AddressSanitizer sees an overrun by even one element.
  void* p = nullptr;
  const int error =
      posix_memalign(&p, kAlignment, bytes <= 0 ? size_t{1} : static_cast<size_t>(bytes));
  PT_CHECK(error == 0) << "out of memory allocating " << bytes << " bytes";
  return static_cast<float*>(p);
}

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    PT_CHECK(d >= 0) << "negative dimension in " << ShapeToString(shape);
    n *= d;
  }
  return n;
}

std::string ShapeToString(const Shape& shape) { return "[" + absl::StrJoin(shape, ", ") + "]"; }

Tensor Tensor::Zeros(const Shape& shape) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = NumElements(shape);
  t.storage_ = AllocateZeroed(t.numel_);
  return t;
}

Tensor Tensor::Uninitialized(const Shape& shape) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = NumElements(shape);
  t.storage_ = Allocate(t.numel_);
  return t;
}

Tensor Tensor::Filled(const Shape& shape, float value) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = NumElements(shape);
  t.storage_ = Allocate(t.numel_);
  std::fill_n(t.storage_.get(), t.numel_, value);
  return t;
}

Tensor Tensor::FromVector(const Shape& shape, const std::vector<float>& values) {
  Tensor t = Zeros(shape);
  PT_CHECK(static_cast<int64_t>(values.size()) == t.numel_)
      << values.size() << " values for shape " << ShapeToString(shape);
  if (!values.empty()) std::memcpy(t.data(), values.data(), values.size() * sizeof(float));
  return t;
}

Tensor Tensor::OnDevice(const Shape& shape, std::shared_ptr<float> storage) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = NumElements(shape);
  t.storage_ = std::move(storage);
  t.on_device_ = true;
  return t;
}

Tensor Tensor::OnHost(const Shape& shape, std::shared_ptr<float> storage) {
  PT_CHECK(storage != nullptr) << "Tensor::OnHost over null storage";
  Tensor t;
  t.shape_ = shape;
  t.numel_ = NumElements(shape);
  t.storage_ = std::move(storage);
  return t;
}

int64_t Tensor::dim(int i) const {
  if (i < 0) i += rank();
  PT_CHECK(i >= 0 && i < rank()) << "dim " << i << " of " << ShapeToString(shape_);
  return shape_[i];
}

Tensor Tensor::Reshape(const Shape& shape) const {
  PT_CHECK(NumElements(shape) == numel_)
      << "cannot reshape " << ShapeToString(shape_) << " to " << ShapeToString(shape);
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::Slice(int64_t begin, int64_t end) const {
  PT_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= shape_[0])
      << "slice [" << begin << ", " << end << ") of " << ShapeToString(shape_);
  int64_t row = shape_[0] == 0 ? 0 : numel_ / shape_[0];
  Tensor t = *this;
  t.shape_[0] = end - begin;
  t.offset_ = offset_ + begin * row;
  t.numel_ = (end - begin) * row;
  return t;
}

Tensor Tensor::Clone() const {
  if (is_null()) return Tensor();
  PT_CHECK(!on_device_) << "Clone of a device tensor: use its Backend";
  Tensor t = Uninitialized(shape_);  // every element written next: no zero fill first
  t.CopyFrom(*this);
  return t;
}

void Tensor::Fill(float value) {
  PT_CHECK(!on_device_) << "Fill of a device tensor: use its Backend";
  float* p = data();
  for (int64_t i = 0; i < numel_; ++i) p[i] = value;
}

void Tensor::CopyFrom(const Tensor& other) {
  PT_CHECK(!on_device_ && !other.on_device_) << "host copy of a device tensor: use its Backend";
  PT_CHECK(other.numel_ == numel_)
      << "copy " << ShapeToString(other.shape_) << " into " << ShapeToString(shape_);
  if (numel_ > 0) std::memmove(data(), other.data(), size_bytes());
}

std::vector<float> Tensor::ToVector() const {
  PT_CHECK(!on_device_) << "ToVector of a device tensor: use its Backend";
  return std::vector<float>(data(), data() + numel_);
}

int64_t FirstNonFinite(const Tensor& t) {
  PT_CHECK(!t.on_device()) << "FirstNonFinite reads host tensors";
  const float* data = t.data();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (!std::isfinite(data[i])) return i;
  }
  return -1;
}

std::string DescribeFirstNonFinite(const Tensor& t) {
  const int64_t i = FirstNonFinite(t);
  if (i < 0) return "";
  return absl::StrCat("holds ", std::isnan(t[i]) ? "NaN" : "an infinity", " at element ", i);
}

std::string DescribeFirstNegative(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (t.data()[i] < 0) return absl::StrCat("holds a negative value at element ", i);
  }
  return "";
}

}  // namespace pipetrain
