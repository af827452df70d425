#include "kernels/compress/fp16_codec.h"

#include <cmath>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/compress/payload.h"

namespace pipetrain {
namespace {

uint32_t FloatBits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

// Shifts `value` right by `shift` (1..31) bits, rounding to nearest even.
uint32_t ShiftRoundEven(uint32_t value, int shift) {
  const uint32_t kept = value >> shift;
  const uint32_t rest = value & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return (rest > half || (rest == half && (kept & 1))) ? kept + 1 : kept;
}

// One class for both formats: they differ only in the scalar conversion.
class HalfCodec : public Codec {
 public:
  using ToHalf = bool (*)(float, uint16_t*);
  using FromHalf = float (*)(uint16_t);

  HalfCodec(CodecId id, const char* name, ToHalf to, FromHalf from)
      : id_(id), name_(name), to_(to), from_(from) {}

  std::string name() const override { return name_; }

  int64_t EncodedBytes(const Shape& shape) const override {
    return HeaderBytes(static_cast<int>(shape.size())) + 2 * NumElements(shape);
  }

  absl::StatusOr<std::string> Encode(const Tensor& x, CodecState*) const override {
    RETURN_IF_ERROR(CheckFinite(x, name_));
    std::string out;
    out.reserve(static_cast<size_t>(EncodedBytes(x.shape())));
    WriteHeader(id_, x.shape(), &out);
    ByteWriter w(&out);
    const float* p = x.data();
    for (int64_t i = 0; i < x.numel(); ++i) {
      uint16_t h;
      if (!to_(p[i], &h)) {
        return absl::InvalidArgumentError(
            absl::StrCat(name_, ": element ", i, " = ", p[i], " is outside the ", name_,
                         " range and would round to infinity; scale the tensor or use another "
                         "codec"));
      }
      w.U16(h);
    }
    return out;
  }

  absl::StatusOr<Tensor> Decode(absl::string_view payload) const override {
    ByteReader r(payload);
    ASSIGN_OR_RETURN(Shape shape, ReadHeader(id_, &r));
    const int64_t n = NumElements(shape);
    if (r.remaining() != 2 * n) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": body has ", r.remaining(),
                                                     " bytes, shape ", ShapeToString(shape),
                                                     " needs ", 2 * n));
    }
    Tensor t = Tensor::Zeros(shape);
    float* q = t.data();
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h = 0;
      r.U16(&h);  // Cannot fail: the length was checked above.
      q[i] = from_(h);
      if (!std::isfinite(q[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat(name_, ": element ", i, " decodes to a non-finite value; corrupt payload"));
      }
    }
    return t;
  }

 private:
  const CodecId id_;
  const std::string name_;
  const ToHalf to_;
  const FromHalf from_;
};

}  // namespace

bool FloatToFp16(float x, uint16_t* out) {
  const uint32_t u = FloatBits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  const uint32_t abs = u & 0x7fffffff;
  if (abs >= 0x7f800000) return false;  // Inf or NaN.
  const int exp = static_cast<int>(abs >> 23);
  uint32_t h;
  if (exp < 113) {
    // Below 2^-14: an fp16 subnormal, units of 2^-24. The float's value is
    // mant * 2^(exp - 150), so the subnormal count is mant >> (126 - exp).
    const int shift = 126 - exp;
    const uint32_t mant = (abs & 0x7fffff) | 0x800000;
    h = (exp == 0 || shift > 24) ? 0 : ShiftRoundEven(mant, shift);
  } else {
    // Normal: rebias the exponent (127 -> 15) and round the mantissa from 23
    // to 10 bits; a carry out of the mantissa correctly bumps the exponent.
    h = ShiftRoundEven(abs - (112u << 23), 13);
  }
  if (h >= 0x7c00) return false;
  *out = static_cast<uint16_t>(sign | h);
  return true;
}

float Fp16ToFloat(uint16_t h) {
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -24);
  if (exp == 31) return mant == 0 ? sign * INFINITY : NAN;
  return sign * std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
}

bool FloatToBf16(float x, uint16_t* out) {
  const uint32_t u = FloatBits(x);
  if ((u & 0x7fffffff) >= 0x7f800000) return false;
  const uint32_t h = ShiftRoundEven(u & 0x7fffffff, 16);
  if (h >= 0x7f80) return false;
  *out = static_cast<uint16_t>(((u >> 16) & 0x8000) | h);
  return true;
}

float Bf16ToFloat(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

std::unique_ptr<Codec> MakeFp16Codec() {
  return std::make_unique<HalfCodec>(CodecId::kFp16, "fp16", &FloatToFp16, &Fp16ToFloat);
}

std::unique_ptr<Codec> MakeBf16Codec() {
  return std::make_unique<HalfCodec>(CodecId::kBf16, "bf16", &FloatToBf16, &Bf16ToFloat);
}

}  // namespace pipetrain
