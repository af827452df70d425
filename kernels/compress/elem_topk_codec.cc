#include "kernels/compress/elem_topk_codec.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/compress/payload.h"

namespace pipetrain {
namespace {

constexpr int64_t kMaxIndexedElements = int64_t{1} << 32;

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
    out.reserve(static_cast<size_t>(EncodedBytes(x.shape())));
    WriteHeader(CodecId::kElemTopK, x.shape(), &out);
    ByteWriter w(&out);
    w.I64(static_cast<int64_t>(kept.size()));
    for (uint32_t i : kept) {
      w.U32(i);
      w.F32(x[i]);
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
      return absl::InvalidArgumentError(
          absl::StrCat("elem_topk: payload holds ", count, " elements, but keep ", keep_, " of ",
                       numel, " is ", TopKCount(keep_, numel), "; payload corrupted or codec mismatch"));
    }
    if (r.remaining() != 8 * count) {
      return absl::InvalidArgumentError(absl::StrCat("elem_topk: body is ", r.remaining(),
                                                     " bytes, expected ", 8 * count));
    }
    Tensor out = Tensor::Zeros(shape);
    int64_t previous = -1;
    for (int64_t j = 0; j < count; ++j) {
      uint32_t index = 0;
      float value = 0;
      r.U32(&index);  // Lengths were checked above: these reads succeed.
      r.F32(&value);
      if (int64_t{index} <= previous || int64_t{index} >= numel || !std::isfinite(value)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "elem_topk: entry ", j, " (index ", index, ") is out of order, out of range or "
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
  // Flat indices of the kept elements, ascending.
  std::vector<uint32_t> SelectTopK(const Tensor& x) const {
    const int64_t k = TopKCount(keep_, x.numel());
    std::vector<uint32_t> order(static_cast<size_t>(x.numel()));
    std::iota(order.begin(), order.end(), 0u);
    const float* p = x.data();
    auto before = [p](uint32_t a, uint32_t b) {
      const float fa = std::fabs(p[a]), fb = std::fabs(p[b]);
      return fa != fb ? fa > fb : a < b;
    };
    std::nth_element(order.begin(), order.begin() + k, order.end(), before);
    order.resize(static_cast<size_t>(k));
    std::sort(order.begin(), order.end());
    return order;
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
