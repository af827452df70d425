#include "kernels/compress/payload.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace pipetrain {
namespace {

constexpr char kMagic[4] = {'P', 'T', 'C', '1'};

constexpr bool kLittleEndianHost = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;

template <typename T>
void PutLittleEndian(std::string* out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

void ByteWriter::U16(uint16_t v) { PutLittleEndian(out_, v); }
void ByteWriter::U32(uint32_t v) { PutLittleEndian(out_, v); }
void ByteWriter::I64(int64_t v) { PutLittleEndian(out_, static_cast<uint64_t>(v)); }
void ByteWriter::F32(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  U32(bits);
}

// Float arrays: one memcpy where the host is little-endian (as the payload),
// byte by byte elsewhere.
void ByteWriter::F32s(const float* values, int64_t n) {
  if (n <= 0) return;  // values may be null (an empty vector's data())
  if constexpr (kLittleEndianHost) {
    out_->append(reinterpret_cast<const char*>(values), static_cast<size_t>(n) * 4);
  } else {
    for (int64_t i = 0; i < n; ++i) F32(values[i]);
  }
}

bool ByteReader::F32s(float* values, int64_t n) {
  absl::string_view b;
  if (n < 0 || !Bytes(4 * n, &b)) return false;
  if (n == 0) return true;  // values may be null; memcpy must not see it
  if constexpr (kLittleEndianHost) {
    std::memcpy(values, b.data(), b.size());
  } else {
    ByteReader each(b);
    for (int64_t i = 0; i < n; ++i) each.F32(&values[i]);
  }
  return true;
}

bool ByteReader::Bytes(int64_t n, absl::string_view* out) {
  if (n < 0 || n > remaining()) return false;
  *out = in_.substr(pos_, static_cast<size_t>(n));
  pos_ += static_cast<size_t>(n);
  return true;
}

bool ByteReader::U8(uint8_t* v) {
  absl::string_view b;
  if (!Bytes(1, &b)) return false;
  *v = static_cast<uint8_t>(b[0]);
  return true;
}

bool ByteReader::U16(uint16_t* v) {
  absl::string_view b;
  if (!Bytes(2, &b)) return false;
  *v = static_cast<uint16_t>(static_cast<uint8_t>(b[0]) | (static_cast<uint8_t>(b[1]) << 8));
  return true;
}

bool ByteReader::U32(uint32_t* v) {
  absl::string_view b;
  if (!Bytes(4, &b)) return false;
  *v = LoadLittleEndian32(reinterpret_cast<const unsigned char*>(b.data()));
  return true;
}

bool ByteReader::I64(int64_t* v) {
  absl::string_view b;
  if (!Bytes(8, &b)) return false;
  uint64_t u = 0;
  for (int i = 7; i >= 0; --i) u = (u << 8) | static_cast<uint8_t>(b[i]);
  *v = static_cast<int64_t>(u);
  return true;
}

bool ByteReader::F32(float* v) {
  uint32_t bits;
  if (!U32(&bits)) return false;
  std::memcpy(v, &bits, sizeof(bits));
  return true;
}

void BitWriter::Finish() {
  if (filled_ > 0) out_->push_back(static_cast<char>(buffer_ & 0xff));
  buffer_ = 0;
  filled_ = 0;
}

void WriteHeader(CodecId id, const Shape& shape, std::string* out) {
  out->append(kMagic, 4);
  ByteWriter w(out);
  w.U8(static_cast<uint8_t>(id));
  w.U8(static_cast<uint8_t>(shape.size()));
  for (int64_t d : shape) w.I64(d);
}

absl::StatusOr<Shape> ReadHeader(CodecId expected, ByteReader* reader) {
  absl::string_view magic;
  if (!reader->Bytes(4, &magic) || magic != absl::string_view(kMagic, 4)) {
    return absl::InvalidArgumentError("not a pipetrain codec payload (bad magic)");
  }
  uint8_t id = 0, rank = 0;
  if (!reader->U8(&id) || !reader->U8(&rank)) {
    return absl::InvalidArgumentError("payload truncated in its header");
  }
  if (id != static_cast<uint8_t>(expected)) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload is for codec ", int{id}, ", not ", static_cast<int>(expected)));
  }
  if (rank > kMaxPayloadRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload rank ", int{rank}, " > ", kMaxPayloadRank));
  }
  Shape shape(rank);
  // Zero dimensions left out: a shape such as [2^62, 4, 0] holds no
  // elements, but NumElements (and any product taken left to right) would
  // overflow int64 before reaching the 0.
  double nonzero_product = 1;
  for (int i = 0; i < rank; ++i) {
    if (!reader->I64(&shape[i])) {
      return absl::InvalidArgumentError("payload truncated in its shape");
    }
    if (shape[i] < 0) return absl::InvalidArgumentError("payload has a negative dimension");
    if (shape[i] > 0) nonzero_product *= static_cast<double>(shape[i]);
  }
  if (nonzero_product >= static_cast<double>(int64_t{1} << 40)) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload shape ", ShapeToString(shape),
                     " is implausibly large (its nonzero dimensions multiply to 2^40 or more)"));
  }
  return shape;
}

absl::StatusOr<Shape> PeekPayloadShape(absl::string_view payload) {
  // Byte 4 is the codec id; a shorter payload fails ReadHeader's own checks.
  const uint8_t id = payload.size() > 4 ? static_cast<uint8_t>(payload[4]) : 0;
  ByteReader reader(payload);
  return ReadHeader(static_cast<CodecId>(id), &reader);
}

absl::Status NonFiniteError(absl::string_view codec, int64_t index, float value) {
  return absl::InvalidArgumentError(absl::StrCat(codec, ": element ", index, " is ", value,
                                                 "; only finite values can be encoded"));
}

absl::StatusOr<float> FiniteMaxAbs(const float* values, int64_t n, absl::string_view codec) {
  // On |x|'s bit pattern (sign cleared) unsigned order is the order of the
  // magnitudes, and Inf and NaN patterns lie above every finite one: an
  // integer max (which vectorises; a float max over NaN would not see it)
  // finds both the maximum and whether anything is not finite.
  uint32_t max_bits = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &values[i], sizeof(bits));
    bits &= 0x7fffffffu;
    max_bits = bits > max_bits ? bits : max_bits;
  }
  if (max_bits >= 0x7f800000u) {
    absl::Status not_finite = CheckFinite(values, n, codec);
    if (!not_finite.ok()) return not_finite;
  }
  float max_abs;
  std::memcpy(&max_abs, &max_bits, sizeof(max_abs));
  return max_abs;
}

absl::Status CheckFinite(const Tensor& x, absl::string_view codec) {
  return CheckFinite(x.data(), x.numel(), codec);
}

absl::Status CheckFinite(const float* values, int64_t n, absl::string_view codec) {
  // Chunk by chunk, a loop without an exit (it vectorises) asks whether any
  // element is Inf or NaN; only such a chunk is searched element by element
  // for the first one. With the sign cleared, a pattern is Inf or NaN iff
  // it is >= 0x7f800000, i.e. iff adding 0x00800000 sets bit 31 (no
  // overflow: the sum is at most 0x807fffff); OR-ing the sums collects it.
  constexpr int64_t kChunk = 4096;
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t end = std::min(n, begin + kChunk);
    uint32_t any = 0;
    for (int64_t i = begin; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &values[i], sizeof(bits));
      any |= (bits & 0x7fffffffu) + 0x00800000u;
    }
    if ((any & 0x80000000u) == 0) continue;
    for (int64_t i = begin; i < end; ++i) {
      if (!std::isfinite(values[i])) return NonFiniteError(codec, i, values[i]);
    }
  }
  return absl::OkStatus();
}

}  // namespace pipetrain
