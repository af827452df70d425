#include "kernels/compress/linear_codec.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/compress/payload.h"

namespace pipetrain {
namespace {

float MaxAbs(const Tensor& x) {
  float m = 0.0f;
  const float* p = x.data();
  for (int64_t i = 0; i < x.numel(); ++i) m = std::max(m, std::fabs(p[i]));
  return m;
}

class LinearCodec : public Codec {
 public:
  explicit LinearCodec(int bits)
      : bits_(bits), qmax_((int64_t{1} << (bits - 1)) - 1) {}

  std::string name() const override { return absl::StrCat("linear:bits=", bits_); }

  int64_t EncodedBytes(const Shape& shape) const override {
    return HeaderBytes(static_cast<int>(shape.size())) + 1 + 4 +
           PackedBytes(NumElements(shape), bits_);
  }

  absl::StatusOr<std::string> Encode(const Tensor& x, CodecState*) const override {
    RETURN_IF_ERROR(CheckFinite(x, name()));
    // eq. (4). The float32 step is what the receiver sees, so quantize with it.
    const float step = static_cast<float>(double{MaxAbs(x)} / static_cast<double>(qmax_));
    std::string out;
    out.reserve(static_cast<size_t>(EncodedBytes(x.shape())));
    WriteHeader(CodecId::kLinear, x.shape(), &out);
    ByteWriter w(&out);
    w.U8(static_cast<uint8_t>(bits_));
    w.F32(step);
    BitWriter bw(&out);
    const float* p = x.data();
    for (int64_t i = 0; i < x.numel(); ++i) {
      // eq. (5); the clamp only absorbs the float32 rounding of step.
      int64_t q = 0;
      if (step > 0.0f) {
        q = std::llround(static_cast<double>(p[i]) / step);
        q = std::clamp(q, -qmax_, qmax_);
      }
      bw.Put(static_cast<uint32_t>(q + qmax_), bits_);
    }
    bw.Finish();
    return out;
  }

  absl::StatusOr<Tensor> Decode(absl::string_view payload) const override;

 private:
  const int bits_;
  const int64_t qmax_;
};

absl::StatusOr<Tensor> LinearCodec::Decode(absl::string_view payload) const {
  ByteReader r(payload);
  ASSIGN_OR_RETURN(Shape shape, ReadHeader(CodecId::kLinear, &r));
  uint8_t bits = 0;
  float step = 0.0f;
  if (!r.U8(&bits) || !r.F32(&step)) {
    return absl::InvalidArgumentError(absl::StrCat(name(), ": payload truncated in parameters"));
  }
  if (bits != bits_) {
    return absl::InvalidArgumentError(
        absl::StrCat(name(), ": payload has bits=", int{bits}, ", this codec expects ", bits_));
  }
  if (!std::isfinite(step) || step < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat(name(), ": payload step ", step, " is not finite and >= 0"));
  }
  const int64_t n = NumElements(shape);
  if (r.remaining() != PackedBytes(n, bits_)) {
    return absl::InvalidArgumentError(absl::StrCat(name(), ": body has ", r.remaining(),
                                                   " bytes, shape ", ShapeToString(shape),
                                                   " needs ", PackedBytes(n, bits_)));
  }
  absl::string_view body;
  r.Bytes(r.remaining(), &body);
  BitReader br(body);
  Tensor t = Tensor::Zeros(shape);
  float* out = t.data();
  for (int64_t i = 0; i < n; ++i) {
    uint32_t code = 0;
    br.Get(bits_, &code);  // Cannot fail: the body length was checked.
    if (code > static_cast<uint32_t>(2 * qmax_)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name(), ": element ", i, " has out-of-range code ", code));
    }
    const double value = static_cast<double>(static_cast<int64_t>(code) - qmax_) * step;
    if (std::fabs(value) > std::numeric_limits<float>::max()) {  // Only from a corrupt step.
      return absl::InvalidArgumentError(
          absl::StrCat(name(), ": element ", i, " decodes beyond the float32 range"));
    }
    out[i] = static_cast<float>(value);  // eq. (5)
  }
  return t;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> MakeLinearCodec(int bits) {
  if (bits < kLinearMinBits || bits > kLinearMaxBits) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear codec: bits=", bits, " is out of range; use 2..16"));
  }
  return std::unique_ptr<Codec>(new LinearCodec(bits));
}

}  // namespace pipetrain
