#include "kernels/compress/fp16_codec.h"

#include <cmath>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/compress/payload.h"

namespace pipetrain {
namespace {

// A float's bits and back (__builtin_bit_cast: GCC >= 11, Clang).
inline uint32_t FloatBits(float x) { return __builtin_bit_cast(uint32_t, x); }

inline float FloatFromBits(uint32_t u) { return __builtin_bit_cast(float, u); }

// c ? a : b as bit masks, not a branch: GCC will not if-convert a ternary
// whose arms hold float operations (they might trap), and a loop with a
// branch does not vectorise.
inline uint32_t SelectBits(bool c, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  return (a & mask) | (b & ~mask);
}

// The narrow formats' infinity patterns (sign cleared): a rounded magnitude
// at or above them is not finite.
constexpr uint32_t kFp16InfBits = 0x7c00;
constexpr uint32_t kBf16InfBits = 0x7f80;

// The rounded narrow-format bits of a magnitude, from abs = the float's bits
// with the sign cleared: below the format's infinity pattern exactly when
// the rounded value is finite.
inline uint32_t Fp16MagnitudeBits(uint32_t abs) {
  // Normal results: rebias the exponent (127 -> 15) and round the mantissa
  // from 23 to 10 bits, ties to even: adding 0xfff plus the lowest kept bit
  // carries into the kept bits exactly when the 13 dropped bits exceed half,
  // or equal half with the kept part odd. A carry out of the mantissa bumps
  // the exponent, as it should; past 65504 the exponent reaches 31 (>=
  // 0x7c00), and so does every Inf/NaN pattern.
  const uint32_t normal = (abs - (112u << 23) + 0xfffu + ((abs >> 13) & 1u)) >> 13;
  // Below 2^-14 the result is an fp16 subnormal, a count of 2^-24 units.
  // 0.5f has a float ulp of 2^-24, so adding it makes the FPU round |x| to
  // whole units, to nearest even; the units are then the sum's low mantissa
  // bits. (|x| < 2^-14 keeps the sum below 1, in 0.5f's binade.)
  const float sum = FloatFromBits(abs) + 0.5f;
  const uint32_t subnormal = FloatBits(sum) - FloatBits(0.5f);
  // Both computed, one selected: the bulk loops stay branch-free (and the
  // out-of-range arithmetic of the unselected path is unsigned, so defined).
  return SelectBits(abs < (113u << 23), subnormal, normal);
}

inline uint32_t Bf16MagnitudeBits(uint32_t abs) {
  // Keep the top 16 bits, ties to even (as for fp16's mantissa above);
  // overflow and Inf/NaN give >= 0x7f80.
  return (abs + 0x7fffu + ((abs >> 16) & 1u)) >> 16;
}

// The widening conversions (exact). Internal and inline, unlike the
// exported Fp16ToFloat/Bf16ToFloat: under -fPIC GCC does not inline an
// exported function (it could be interposed), and a call in the decode loop
// keeps it from vectorising.
inline float Fp16Value(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  // Zero or subnormal: mant * 2^-24, exact in float.
  const uint32_t subnormal = FloatBits(static_cast<float>(mant) * 0x1p-24f);
  const uint32_t special = 0x7f800000u | (mant << 13);         // Inf, or NaN keeping the payload
  const uint32_t normal = ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
  // Selected, not branched, so the decode loop vectorises.
  const uint32_t magnitude =
      SelectBits(exp == 0, subnormal, SelectBits(exp == 31, special, normal));
  return FloatFromBits(sign | magnitude);
}

inline float Bf16Value(uint16_t h) { return FloatFromBits(uint32_t{h} << 16); }

// One class for both formats: they differ only in the scalar conversions.
// The conversions are template parameters, not function pointers, so the
// per-element loops inline them (a call per value halves the throughput).
template <uint32_t (*kMagnitudeBits)(uint32_t), uint32_t kInfBits, float (*kFromHalf)(uint16_t)>
class HalfCodec : public Codec {
 public:
  HalfCodec(CodecId id, const char* name) : id_(id), name_(name) {}

  std::string name() const override { return name_; }

  int64_t EncodedBytes(const Shape& shape) const override {
    return HeaderBytes(static_cast<int>(shape.size())) + 2 * NumElements(shape);
  }

  absl::StatusOr<std::string> Encode(const Tensor& x, CodecState*) const override {
    std::string out;
    WriteHeader(id_, x.shape(), &out);
    const size_t header = out.size();
    out.resize(static_cast<size_t>(EncodedBytes(x.shape())));
    // Little-endian by construction, whatever the host's byte order.
    auto* body = reinterpret_cast<unsigned char*>(&out[header]);
    const float* p = x.data();
    // One branch-free pass; the largest rounded magnitude tells whether any
    // element was not finite or overflowed, and only then is the first
    // such element looked for.
    // (n hoisted: the byte stores may alias anything, x's size included.)
    const int64_t n = x.numel();
    uint32_t largest = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t u = FloatBits(p[i]);
      const uint32_t h = kMagnitudeBits(u & 0x7fffffff);
      largest = h > largest ? h : largest;
      const uint32_t v = ((u >> 16) & 0x8000) | (h & 0x7fff);
      body[2 * i] = static_cast<unsigned char>(v & 0xff);
      body[2 * i + 1] = static_cast<unsigned char>(v >> 8);
    }
    if (largest >= kInfBits) return FirstUnencodable(p, n);
    return out;
  }

  absl::StatusOr<Tensor> Decode(absl::string_view payload) const override {
    ASSIGN_OR_RETURN(const HalfPayload read, ReadHalfPayload(name_, id_, payload));
    const int64_t n = NumElements(read.shape);
    const auto* body = reinterpret_cast<const unsigned char*>(read.body.data());
    Tensor t = Tensor::Zeros(read.shape);
    float* q = t.data();
    // Finiteness from the exponent bits (integer ops, so the loop
    // vectorises; std::isfinite here kept it scalar).
    uint32_t exponent_all_ones = 0;
    for (int64_t i = 0; i < n; ++i) {
      q[i] = kFromHalf(static_cast<uint16_t>(body[2 * i] | (body[2 * i + 1] << 8)));
      exponent_all_ones |= (FloatBits(q[i]) & 0x7f800000u) == 0x7f800000u;
    }
    if (exponent_all_ones) {
      for (int64_t i = 0; i < n; ++i) {
        if (!std::isfinite(q[i])) return HalfCorruptError(name_, i);
      }
    }
    return t;
  }

 private:
  // Encode's error: CheckFinite's for the first NaN/Inf, else
  // HalfOverflowError for the first element that rounds to infinity.
  absl::Status FirstUnencodable(const float* p, int64_t n) const {
    RETURN_IF_ERROR(CheckFinite(p, n, name_));
    for (int64_t i = 0; i < n; ++i) {
      if (kMagnitudeBits(FloatBits(p[i]) & 0x7fffffff) >= kInfBits) {
        return HalfOverflowError(name_, i, p[i]);
      }
    }
    return absl::InternalError(absl::StrCat(name_, ": no unencodable element found"));
  }

  const CodecId id_;
  const std::string name_;
};

}  // namespace

absl::Status HalfOverflowError(absl::string_view codec, int64_t index, float value) {
  return absl::InvalidArgumentError(
      absl::StrCat(codec, ": element ", index, " = ", value, " is outside the ", codec,
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
  const uint32_t h = Fp16MagnitudeBits(u & 0x7fffffff);
  if (h >= kFp16InfBits) return false;
  *out = static_cast<uint16_t>(((u >> 16) & 0x8000) | h);
  return true;
}

float Fp16ToFloat(uint16_t h) { return Fp16Value(h); }

bool FloatToBf16(float x, uint16_t* out) {
  const uint32_t u = FloatBits(x);
  const uint32_t h = Bf16MagnitudeBits(u & 0x7fffffff);
  if (h >= kBf16InfBits) return false;
  *out = static_cast<uint16_t>(((u >> 16) & 0x8000) | h);
  return true;
}

float Bf16ToFloat(uint16_t h) { return Bf16Value(h); }

std::unique_ptr<Codec> MakeFp16Codec() {
  return std::make_unique<HalfCodec<&Fp16MagnitudeBits, kFp16InfBits, &Fp16Value>>(CodecId::kFp16,
                                                                                   "fp16");
}

std::unique_ptr<Codec> MakeBf16Codec() {
  return std::make_unique<HalfCodec<&Bf16MagnitudeBits, kBf16InfBits, &Bf16Value>>(CodecId::kBf16,
                                                                                   "bf16");
}

}  // namespace pipetrain
