// The common payload layout of every codec and the byte/bit packers codecs
// build their bodies with.
//
// Header (little-endian):
//   bytes 0-3   magic "PTC1"
//   byte  4     codec id (CodecId)
//   byte  5     rank r (0..8)
//   bytes 6..   r dims, int64 each
//   then the codec's own fields and body (see each codec's header).
// kHeaderBytes(r) = 6 + 8 r.
//
// ByteReader never reads past its end: every read returns false (and the
// callers return INVALID_ARGUMENT) when the payload is too short.
#ifndef PIPETRAIN_KERNELS_COMPRESS_PAYLOAD_H_
#define PIPETRAIN_KERNELS_COMPRESS_PAYLOAD_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tensor.h"

namespace pipetrain {

enum class CodecId : uint8_t {
  kFp16 = 1,
  kBf16 = 2,
  kLinear = 3,
  kPiecewise = 4,
  kTokenTopK = 5,
  kElemTopK = 6,
  kPowerSgd = 7,
};

inline constexpr int kMaxPayloadRank = 8;
inline int64_t HeaderBytes(int rank) { return 6 + 8 * int64_t{rank}; }

// 4 bytes at `p` read as, or written from, a little-endian uint32: for
// loops over a body already sized and checked (compilers fuse the byte
// operations into one load or store on little-endian hosts).
inline uint32_t LoadLittleEndian32(const unsigned char* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
inline void StoreLittleEndian32(unsigned char* p, uint32_t v) {
  for (int b = 0; b < 4; ++b) p[b] = static_cast<unsigned char>(v >> (8 * b));
}

// Appends little-endian values to a string.
class ByteWriter {
 public:
  explicit ByteWriter(std::string* out) : out_(out) {}
  void U8(uint8_t v) { out_->push_back(static_cast<char>(v)); }
  void U16(uint16_t v);
  void U32(uint32_t v);
  void I64(int64_t v);
  void F32(float v);
  // n floats as F32 writes them (4 bytes each, little-endian), in one go.
  void F32s(const float* values, int64_t n);
  void Bytes(const std::string& bytes) { out_->append(bytes); }

 private:
  std::string* out_;
};

// Reads little-endian values; each read returns false past the end.
class ByteReader {
 public:
  explicit ByteReader(absl::string_view in) : in_(in) {}
  bool U8(uint8_t* v);
  bool U16(uint16_t* v);
  bool U32(uint32_t* v);
  bool I64(int64_t* v);
  bool F32(float* v);
  // n floats as F32 reads them, in one go (false, reading nothing, if
  // fewer than 4n bytes remain).
  bool F32s(float* values, int64_t n);
  // The next `n` bytes as a view (false if fewer remain).
  bool Bytes(int64_t n, absl::string_view* out);
  int64_t remaining() const { return static_cast<int64_t>(in_.size() - pos_); }

 private:
  absl::string_view in_;
  size_t pos_ = 0;
};

// Packs unsigned values of `bits` (1..32) bits each, LSB first, into bytes;
// Finish pads the last byte with zeros. n values take ceil(n * bits / 8) bytes.
class BitWriter {
 public:
  explicit BitWriter(std::string* out) : out_(out) {}
  // Inline: called once per value (token top-k's mask; the quantizers'
  // bodies use bit_pack.h).
  void Put(uint32_t value, int bits) {
    const uint64_t mask = bits == 32 ? 0xffffffffull : ((1ull << bits) - 1);
    buffer_ |= (uint64_t{value} & mask) << filled_;
    filled_ += bits;
    while (filled_ >= 8) {
      out_->push_back(static_cast<char>(buffer_ & 0xff));
      buffer_ >>= 8;
      filled_ -= 8;
    }
  }
  void Finish();

 private:
  std::string* out_;
  uint64_t buffer_ = 0;
  int filled_ = 0;
};

// Reads what BitWriter wrote from a byte range (never past its end; Get
// returns false when fewer than `bits` bits remain).
class BitReader {
 public:
  explicit BitReader(absl::string_view in) : in_(in) {}
  // Inline: called once per value.
  bool Get(int bits, uint32_t* value) {
    while (filled_ < bits) {
      if (pos_ >= in_.size()) return false;
      buffer_ |= uint64_t{static_cast<uint8_t>(in_[pos_++])} << filled_;
      filled_ += 8;
    }
    const uint64_t mask = bits == 32 ? 0xffffffffull : ((1ull << bits) - 1);
    *value = static_cast<uint32_t>(buffer_ & mask);
    buffer_ >>= bits;
    filled_ -= bits;
    return true;
  }

 private:
  absl::string_view in_;
  size_t pos_ = 0;
  uint64_t buffer_ = 0;
  int filled_ = 0;
};

inline int64_t PackedBytes(int64_t count, int bits) { return (count * bits + 7) / 8; }

// Writes magic, id and shape.
void WriteHeader(CodecId id, const Shape& shape, std::string* out);

// Checks magic and id (INVALID_ARGUMENT naming what is wrong, e.g. "payload
// is for codec 3, not 4"), reads the shape (rank <= 8, dims >= 0, the
// product of the nonzero dims < 2^40, so numel < 2^40 and no product of
// dims overflows) and leaves `reader` after the header.
absl::StatusOr<Shape> ReadHeader(CodecId expected, ByteReader* reader);

// The shape a payload's header announces, with ReadHeader's checks, for
// whichever codec the header names; the body is not read. Decode allocates
// a tensor of that shape (up to 2^40 elements) however small the payload
// (a sparse or low-rank one), so a receiver that must bound its memory
// compares this with the shape it expects before decoding
// (DecodeWireTensorWith in worker/transport, token_topk for its inner
// payload). INVALID_ARGUMENT as ReadHeader.
absl::StatusOr<Shape> PeekPayloadShape(absl::string_view payload);

// INVALID_ARGUMENT naming the first non-finite element, else OK.
absl::Status CheckFinite(const Tensor& x, absl::string_view codec);
absl::Status CheckFinite(const float* values, int64_t n, absl::string_view codec);

// max |x_i| over values[0, n) (0 for n == 0), or CheckFinite's error when
// an element is NaN or infinite: one pass over the data instead of two.
absl::StatusOr<float> FiniteMaxAbs(const float* values, int64_t n, absl::string_view codec);

// CheckFinite's error for element `index` holding `value`, e.g.
// "piecewise:bits=3: element 7 is nan; only finite values can be encoded";
// the GPU codecs report with it too.
absl::Status NonFiniteError(absl::string_view codec, int64_t index, float value);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_COMPRESS_PAYLOAD_H_
