#include "kernels/compress/elem_topk_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/compress/payload.h"

namespace pipetrain {
namespace {

constexpr int64_t kMaxIndexedElements = int64_t{1} << 32;

// The elements that may be among the k largest magnitudes, in ascending
// index order: their flat indices and magnitudes.
struct Candidates {
  std::vector<uint32_t> index;
  std::vector<float> magnitude;
};

// Every element of p[0, n) with |p[i]| >= lower, in index order (n <= 2^32).
// Branch-free (each element is stored, the end advances only on a hit):
// which elements pass is data-dependent, and a branch on it mispredicts.
Candidates MagnitudesAtLeast(const float* p, int64_t n, float lower, int64_t expected) {
  constexpr int64_t kBlock = 4096;
  Candidates c;
  c.index.resize(static_cast<size_t>(std::min(n, expected + kBlock)));
  c.magnitude.resize(c.index.size());
  int64_t end = 0;
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t block = std::min(kBlock, n - begin);
    const auto size = static_cast<int64_t>(c.index.size());
    if (end + block > size) {  // Room for a whole block; growth doubles.
      const auto grown = static_cast<size_t>(std::min(n, std::max(2 * size, end + block)));
      c.index.resize(grown);
      c.magnitude.resize(grown);
    }
    uint32_t* index = c.index.data();
    float* magnitude = c.magnitude.data();
    for (int64_t i = begin; i < begin + block; ++i) {
      const float a = std::fabs(p[i]);
      index[end] = static_cast<uint32_t>(i);
      magnitude[end] = a;
      end += a >= lower;
    }
  }
  c.index.resize(static_cast<size_t>(end));
  c.magnitude.resize(static_cast<size_t>(end));
  return c;
}

// The candidates for the k largest |p[i]| (1 <= k <= n): every element at
// or above the k-th largest magnitude, and at least k. Large inputs narrow
// them down: the magnitudes of a strided sample give a bound `lower` that,
// with a margin, at least k elements reach (k plus the margin's share of n
// instead of n: ~1.1 k for large k); when fewer do, the bound was too high
// and every element is taken.
Candidates TopKCandidates(const float* p, int64_t n, int64_t k) {
  constexpr int64_t kSample = 16384;
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
    // About rank + 1 sample strides' worth of elements reach the bound.
    Candidates c = MagnitudesAtLeast(p, n, sample[rank], (rank + 1) * (n / m + 1));
    if (static_cast<int64_t>(c.index.size()) >= k) return c;
  }
  return MagnitudesAtLeast(p, n, 0.0f, n);  // All of them.
}

// The k-th largest of `magnitudes` (1 <= k <= size) and how many are
// strictly above it. Reorders `magnitudes` (pass a copy or move it in).
struct KthLargest {
  float threshold = 0;
  int64_t above = 0;
};
KthLargest KthLargestOf(std::vector<float> magnitudes, int64_t k) {
  std::nth_element(magnitudes.begin(), magnitudes.begin() + (k - 1), magnitudes.end(),
                   std::greater<float>());
  KthLargest result;
  result.threshold = magnitudes[k - 1];
  // nth_element leaves everything above the k-th in front of it.
  for (int64_t i = 0; i < k - 1; ++i) result.above += magnitudes[i] > result.threshold;
  return result;
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
      StoreLittleEndian32(entry, i);
      StoreLittleEndian32(entry + 4, value_bits);
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
    absl::string_view body;
    if (!r.Bytes(8 * count, &body)) return absl::InternalError("elem_topk: body length check");
    const auto* entry = reinterpret_cast<const unsigned char*>(body.data());
    Tensor out = Tensor::Zeros(shape);
    int64_t previous = -1;
    for (int64_t j = 0; j < count; ++j, entry += 8) {
      const uint32_t index = LoadLittleEndian32(entry);
      const uint32_t value_bits = LoadLittleEndian32(entry + 4);
      float value;
      std::memcpy(&value, &value_bits, sizeof(value));
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
  // among the candidates (TopKCandidates: every element at or above t is
  // one), then one pass over the candidates in index order keeping every
  // |x| > t and the first k - #{|x| > t} equal to t; no sort of indices
  // needed. The pass is branch-free, as MagnitudesAtLeast.
  std::vector<uint32_t> SelectTopK(const Tensor& x) const {
    const int64_t n = x.numel();
    const int64_t k = TopKCount(keep_, n);
    if (k == 0) return {};
    const float* p = x.data();
    Candidates candidates = TopKCandidates(p, n, k);
    const KthLargest kth = KthLargestOf(std::move(candidates.magnitude), k);
    int64_t ties_left = k - kth.above;
    // k + 1: the loop stores every index, one past the last kept included.
    std::vector<uint32_t> kept(static_cast<size_t>(k + 1));
    uint32_t* dst = kept.data();
    int64_t end = 0;
    for (const uint32_t i : candidates.index) {
      const float a = std::fabs(p[i]);
      const bool tie = a == kth.threshold;
      const bool take = (a > kth.threshold) | (tie & (ties_left > 0));
      dst[end] = i;
      end += take;
      ties_left -= tie & take;
    }
    kept.resize(static_cast<size_t>(end));
    return kept;
  }

  double keep_;
};

}  // namespace

int64_t TopKCount(double keep, int64_t n) {
  const double exact = keep * static_cast<double>(n);
  // The slack absorbs binary noise (0.1 * 30 is 3.0000000000000004), and
  // stays below half an element: a relative one alone took whole elements
  // off once keep * n passed 1e9.
  const double slack = std::min(1e-9 * exact, 0.25);
  const int64_t k = static_cast<int64_t>(std::ceil(exact - slack));
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
