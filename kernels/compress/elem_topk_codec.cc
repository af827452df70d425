#include "kernels/compress/elem_topk_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/compress/payload.h"

namespace pipetrain {
namespace {

constexpr int64_t kMaxIndexedElements = int64_t{1} << 32;

// The k-th largest |p[i]| (1 <= k <= n), exactly. Large inputs first narrow
// the search: the magnitudes of a strided sample give a bound `lower` that,
// with a margin, at least k elements reach; nth_element then runs on those
// candidates only (about 1.1 k of them instead of n). The k-th largest of
// all is among them whenever at least k are (every element at or above it
// is), so the result is exact; with fewer, the full search runs.
float KthLargestMagnitude(const float* p, int64_t n, int64_t k) {
  constexpr int64_t kSample = 16384;
  std::vector<float> candidates;
  if (n >= 8 * kSample && k <= n / 2) {
    const int64_t stride = n / kSample;
    std::vector<float> sample;
    sample.reserve(kSample + 1);
    for (int64_t i = 0; i < n; i += stride) sample.push_back(std::fabs(p[i]));
    const int64_t m = static_cast<int64_t>(sample.size());
    // The sample rank matching k, pushed down by ~4 standard deviations of
    // its binomial spread plus a constant, so the bound rarely misses.
    const double expected = static_cast<double>(k) * m / n;
    const int64_t rank =
        std::min<int64_t>(m - 1, static_cast<int64_t>(expected + 4 * std::sqrt(expected) + 16));
    std::nth_element(sample.begin(), sample.begin() + rank, sample.end(), std::greater<float>());
    const float lower = sample[rank];
    candidates.reserve(static_cast<size_t>(k + k / 4 + 64));
    for (int64_t i = 0; i < n; ++i) {
      const float a = std::fabs(p[i]);
      if (a >= lower) candidates.push_back(a);
    }
    if (static_cast<int64_t>(candidates.size()) < k) candidates.clear();  // Missed: search all.
  }
  if (candidates.empty()) {
    candidates.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) candidates[i] = std::fabs(p[i]);
  }
  std::nth_element(candidates.begin(), candidates.begin() + (k - 1), candidates.end(),
                   std::greater<float>());
  return candidates[k - 1];
}

class ElemTopKCodec : public Codec {
 public:
  explicit ElemTopKCodec(double keep) : keep_(keep) {}

  std::string name() const override { return absl::StrCat("elem_topk:keep=", keep_); }

  absl::StatusOr<std::string> Encode(const Tensor& x, CodecState*) const override {
    RETURN_IF_ERROR(CheckFinite(x, "elem_topk"));
    if (x.numel() > kMaxIndexedElements) {
      return absl::InvalidArgumentError(
          absl::StrCat("elem_topk: tensor ", ShapeToString(x.shape()),
                       " has more than 2^32 elements; uint32 indices cannot address it"));
    }
    const std::vector<uint32_t> kept = SelectTopK(x);
    std::string out;
    WriteHeader(CodecId::kElemTopK, x.shape(), &out);
    ByteWriter w(&out);
    w.I64(static_cast<int64_t>(kept.size()));
    // Entries straight into the sized buffer, little-endian, 8 bytes each.
    const size_t entries_at = out.size();
    out.resize(static_cast<size_t>(EncodedBytes(x.shape())));
    auto* entry = reinterpret_cast<unsigned char*>(&out[entries_at]);
    for (uint32_t i : kept) {
      uint32_t value_bits;
      std::memcpy(&value_bits, &x.data()[i], sizeof(value_bits));
      for (int b = 0; b < 4; ++b) entry[b] = static_cast<unsigned char>(i >> (8 * b));
      for (int b = 0; b < 4; ++b) entry[4 + b] = static_cast<unsigned char>(value_bits >> (8 * b));
      entry += 8;
    }
    return out;
  }

  absl::StatusOr<Tensor> Decode(absl::string_view payload) const override {
    ByteReader r(payload);
    ASSIGN_OR_RETURN(Shape shape, ReadHeader(CodecId::kElemTopK, &r));
    const int64_t numel = NumElements(shape);
    int64_t count = 0;
    if (!r.I64(&count)) return absl::InvalidArgumentError("elem_topk: payload truncated in count");
    if (count != TopKCount(keep_, numel)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "elem_topk: payload holds ", count, " elements, but keep ", keep_, " of ", numel, " is ",
          TopKCount(keep_, numel), "; payload corrupted or codec mismatch"));
    }
    if (r.remaining() != 8 * count) {
      return absl::InvalidArgumentError(
          absl::StrCat("elem_topk: body is ", r.remaining(), " bytes, expected ", 8 * count));
    }
    Tensor out = Tensor::Zeros(shape);
    int64_t previous = -1;
    for (int64_t j = 0; j < count; ++j) {
      uint32_t index = 0;
      float value = 0;
      r.U32(&index);  // Lengths were checked above: these reads succeed.
      r.F32(&value);
      if (int64_t{index} <= previous || int64_t{index} >= numel || !std::isfinite(value)) {
        return absl::InvalidArgumentError(absl::StrCat("elem_topk: entry ", j, " (index ", index,
                                                       ") is out of order, out of range or "
                                                       "not finite; payload corrupted"));
      }
      out[index] = value;
      previous = index;
    }
    return out;
  }

  int64_t EncodedBytes(const Shape& shape) const override {
    return HeaderBytes(static_cast<int>(shape.size())) + 8 +
           8 * TopKCount(keep_, NumElements(shape));
  }

 private:
  // Flat indices of the kept elements, ascending: the k largest |x|, ties
  // broken toward the lower index. Found as the k-th largest magnitude t
  // (KthLargestMagnitude), then one pass in index order
  // keeping every |x| > t and the first k - #{|x| > t} elements equal to t;
  // no sort of indices needed.
  std::vector<uint32_t> SelectTopK(const Tensor& x) const {
    const int64_t n = x.numel();
    const int64_t k = TopKCount(keep_, n);
    std::vector<uint32_t> kept;
    if (k == 0) return kept;
    const float* p = x.data();
    const float threshold = KthLargestMagnitude(p, n, k);
    int64_t above = 0;
    for (int64_t i = 0; i < n; ++i) above += std::fabs(p[i]) > threshold;
    int64_t ties_left = k - above;
    kept.reserve(static_cast<size_t>(k));
    for (int64_t i = 0; i < n; ++i) {
      const float a = std::fabs(p[i]);
      if (a > threshold || (a == threshold && ties_left-- > 0)) {
        kept.push_back(static_cast<uint32_t>(i));
      }
    }
    return kept;
  }

  double keep_;
};

}  // namespace

int64_t TopKCount(double keep, int64_t n) {
  const double exact = keep * static_cast<double>(n);
  const int64_t k = static_cast<int64_t>(std::ceil(exact - 1e-9 * exact));
  return std::clamp<int64_t>(k, 0, n);
}

absl::StatusOr<std::unique_ptr<Codec>> MakeElemTopKCodec(double keep) {
  if (!(keep > 0.0 && keep <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("elem_topk: keep ", keep, " is out of range (0, 1]"));
  }
  return std::unique_ptr<Codec>(new ElemTopKCodec(keep));
}

}  // namespace pipetrain
