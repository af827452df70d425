#include "kernels/compress/linear_codec.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/compress/bit_pack.h"
#include "kernels/compress/payload.h"
#include "kernels/compress/rounding.h"

namespace pipetrain {
namespace {

class LinearCodec : public Codec {
 public:
  explicit LinearCodec(int bits) : bits_(bits), qmax_((int64_t{1} << (bits - 1)) - 1) {}

  std::string name() const override { return absl::StrCat("linear:bits=", bits_); }

  int64_t EncodedBytes(const Shape& shape) const override {
    return HeaderBytes(static_cast<int>(shape.size())) + 1 + 4 +
           PackedBytes(NumElements(shape), bits_);
  }

  absl::StatusOr<std::string> Encode(const Tensor& x, CodecState*) const override {
    ASSIGN_OR_RETURN(const float max_abs, FiniteMaxAbs(x.data(), x.numel(), name()));
    // eq. (4). The float32 step is what the receiver sees, so quantize with it.
    const float step = LinearStep(max_abs, bits_);
    std::string out;
    WriteHeader(CodecId::kLinear, x.shape(), &out);
    ByteWriter w(&out);
    w.U8(static_cast<uint8_t>(bits_));
    w.F32(step);
    const size_t body_offset = out.size();
    out.resize(static_cast<size_t>(EncodedBytes(x.shape())));
    auto* body = reinterpret_cast<uint8_t*>(&out[body_offset]);
    const float* p = x.data();
    const int32_t qmax = static_cast<int32_t>(qmax_);
    uint16_t codes[kPackChunkCodes];
    for (int64_t start = 0; start < x.numel(); start += kPackChunkCodes) {
      const int64_t chunk = std::min<int64_t>(kPackChunkCodes, x.numel() - start);
      if (step > 0.0f) {
        for (int64_t i = 0; i < chunk; ++i) {
          // eq. (5), q = round(x / step); the clamp only absorbs the float32
          // rounding of step (clamping the ratio to +-(qmax + 1) first
          // changes no result and keeps the integer rounding in range).
          // min/max, not std::clamp's branches, so the loop vectorises.
          double ratio = static_cast<double>(p[start + i]) / step;
          ratio = std::max(-(qmax + 1.0), std::min(ratio, qmax + 1.0));
          const int32_t q = std::max(-qmax, std::min(RoundHalfAwayFromZero(ratio), qmax));
          codes[i] = static_cast<uint16_t>(q + qmax);
        }
      } else {  // All zeros, or max|x| / qmax rounds to 0 in float32.
        std::fill(codes, codes + chunk, static_cast<uint16_t>(qmax));
      }
      PackCodes(codes, chunk, bits_, body + start * bits_ / 8);
    }
    return out;
  }

  absl::StatusOr<Tensor> Decode(absl::string_view payload) const override;

 private:
  // INVALID_ARGUMENT for the first code of codes[0, chunk) (elements
  // start...) that is out of range or decodes beyond the float32 range; OK
  // if none does.
  absl::Status CheckCodes(const uint16_t* codes, int64_t chunk, int64_t start, float step) const;

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
  const auto* in = reinterpret_cast<const uint8_t*>(body.data());
  Tensor t = Tensor::Zeros(shape);
  float* out = t.data();
  const uint32_t max_code = static_cast<uint32_t>(2 * qmax_);
  const double step_value = step;  // A register copy: ReadF32 took step's address.
  const int32_t qmax = static_cast<int32_t>(qmax_);
  const bool may_leave_float_range =
      static_cast<double>(qmax_) * step_value > std::numeric_limits<float>::max();
  uint16_t codes[kPackChunkCodes];
  for (int64_t start = 0; start < n; start += kPackChunkCodes) {
    const int64_t chunk = std::min<int64_t>(kPackChunkCodes, n - start);
    UnpackCodes(in + start * bits_ / 8, chunk, bits_, codes);  // Length checked above.
    // No checks inside the loop, so it vectorises: the largest code tells
    // whether any is out of range, and only a step with qmax * step beyond
    // the float32 range (a corrupt payload) can decode a valid code beyond it.
    uint32_t largest = 0;
    for (int64_t i = 0; i < chunk; ++i) {
      const uint32_t code = codes[i];
      largest = code > largest ? code : largest;
      // int32, not int64: SSE2 has no vector int64 -> double conversion.
      const double value = static_cast<double>(static_cast<int32_t>(code) - qmax) * step_value;
      out[start + i] = static_cast<float>(value);  // eq. (5)
    }
    if (largest > max_code || may_leave_float_range) {
      RETURN_IF_ERROR(CheckCodes(codes, chunk, start, step));
    }
  }
  return t;
}

absl::Status LinearCodec::CheckCodes(const uint16_t* codes, int64_t chunk, int64_t start,
                                     float step) const {
  for (int64_t i = 0; i < chunk; ++i) {
    if (codes[i] > 2 * qmax_) {
      return absl::InvalidArgumentError(
          absl::StrCat(name(), ": element ", start + i, " has out-of-range code ", codes[i]));
    }
    const double value = static_cast<double>(int64_t{codes[i]} - qmax_) * step;
    if (std::fabs(value) > std::numeric_limits<float>::max()) {  // Only from a corrupt step.
      return absl::InvalidArgumentError(
          absl::StrCat(name(), ": element ", start + i, " decodes beyond the float32 range"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

float LinearStep(float max_abs, int bits) {
  const double qmax = static_cast<double>((int64_t{1} << (bits - 1)) - 1);
  const float step = static_cast<float>(double{max_abs} / qmax);
  // Within float32 unless rounding up pushed qmax x step past FLT_MAX (by
  // less than an ulp of the step): one ulp down keeps |x - q x step| far
  // below step / 2 (qmax ulps of a step, at most 2^15 x 2^-23 of it).
  if (qmax * double{step} <= double{std::numeric_limits<float>::max()}) return step;
  return std::nextafter(step, 0.0f);
}

absl::StatusOr<std::unique_ptr<Codec>> MakeLinearCodec(int bits) {
  if (bits < kLinearMinBits || bits > kLinearMaxBits) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear codec: bits=", bits, " is out of range; use 2..16"));
  }
  return std::unique_ptr<Codec>(new LinearCodec(bits));
}

}  // namespace pipetrain
