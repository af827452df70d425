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
// The conversions are template parameters, not function pointers, so the
// per-element loops inline them (a call per value halves the throughput).
template <bool (*kToHalf)(float, uint16_t*), float (*kFromHalf)(uint16_t)>
class HalfCodec : public Codec {
 public:
  HalfCodec(CodecId id, const char* name) : id_(id), name_(name) {}

  std::string name() const override { return name_; }

  int64_t EncodedBytes(const Shape& shape) const override {
    return HeaderBytes(static_cast<int>(shape.size())) + 2 * NumElements(shape);
  }

  absl::StatusOr<std::string> Encode(const Tensor& x, CodecState*) const override {
    RETURN_IF_ERROR(CheckFinite(x, name_));
    std::string out;
    WriteHeader(id_, x.shape(), &out);
    const size_t header = out.size();
    out.resize(static_cast<size_t>(EncodedBytes(x.shape())));
    // Little-endian by construction, whatever the host's byte order.
    auto* body = reinterpret_cast<unsigned char*>(&out[header]);
    const float* p = x.data();
    for (int64_t i = 0; i < x.numel(); ++i) {
      uint16_t h;
      if (!kToHalf(p[i], &h)) return HalfOverflowError(name_, i, p[i]);
      body[2 * i] = static_cast<unsigned char>(h & 0xff);
      body[2 * i + 1] = static_cast<unsigned char>(h >> 8);
    }
    return out;
  }

  absl::StatusOr<Tensor> Decode(absl::string_view payload) const override {
    ASSIGN_OR_RETURN(const HalfPayload read, ReadHalfPayload(name_, id_, payload));
    const int64_t n = NumElements(read.shape);
    const auto* body = reinterpret_cast<const unsigned char*>(read.body.data());
    Tensor t = Tensor::Zeros(read.shape);
    float* q = t.data();
    bool finite = true;
    for (int64_t i = 0; i < n; ++i) {
      q[i] = kFromHalf(static_cast<uint16_t>(body[2 * i] | (body[2 * i + 1] << 8)));
      finite &= std::isfinite(q[i]);
    }
    if (!finite) {
      for (int64_t i = 0; i < n; ++i) {
        if (!std::isfinite(q[i])) return HalfCorruptError(name_, i);
      }
    }
    return t;
  }

 private:
  const CodecId id_;
  const std::string name_;
};

}  // namespace

absl::Status HalfOverflowError(absl::string_view codec, int64_t index, float value) {
  return absl::InvalidArgumentError(absl::StrCat(
      codec, ": element ", index, " = ", value, " is outside the ", codec,
      " range and would round to infinity; scale the tensor or use another codec"));
}

absl::StatusOr<HalfPayload> ReadHalfPayload(absl::string_view codec, CodecId id,
                                            absl::string_view payload) {
  ByteReader r(payload);
  HalfPayload out;
  ASSIGN_OR_RETURN(out.shape, ReadHeader(id, &r));
  const int64_t n = NumElements(out.shape);
  if (r.remaining() != 2 * n) {
    return absl::InvalidArgumentError(absl::StrCat(codec, ": body has ", r.remaining(),
                                                   " bytes, shape ", ShapeToString(out.shape),
                                                   " needs ", 2 * n));
  }
  r.Bytes(r.remaining(), &out.body);
  return out;
}

absl::Status HalfCorruptError(absl::string_view codec, int64_t index) {
  return absl::InvalidArgumentError(
      absl::StrCat(codec, ": element ", index, " decodes to a non-finite value; corrupt payload"));
}

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
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float.
    const float magnitude = static_cast<float>(mant) * 0x1p-24f;
    std::memcpy(&u, &magnitude, sizeof(u));
    u |= sign;
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);  // Inf, or NaN keeping the payload
  } else {
    u = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
  }
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
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
  return std::make_unique<HalfCodec<&FloatToFp16, &Fp16ToFloat>>(CodecId::kFp16, "fp16");
}

std::unique_ptr<Codec> MakeBf16Codec() {
  return std::make_unique<HalfCodec<&FloatToBf16, &Bf16ToFloat>>(CodecId::kBf16, "bf16");
}

}  // namespace pipetrain
