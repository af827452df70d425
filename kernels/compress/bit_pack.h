// Bulk bit packing for the quantizing codecs' bodies: the same LSB-first
// layout BitWriter/BitReader (payload.h) produce one value at a time, at a
// fraction of the cost (no per-value loop over bytes, no string growth).
//
// Layout: code i occupies bits [i*bits, (i+1)*bits) of the byte stream, bit
// 0 being the least significant bit of byte 0; the last byte's unused high
// bits are zero. n codes take PackedBytes(n, bits) = ceil(n * bits / 8)
// bytes. Eight codes always fill exactly `bits` whole bytes, so a caller may
// pack or unpack a long stream in chunks whose sizes are multiples of 8,
// each at byte offset start * bits / 8.
//
// Thread-safety: pure functions.
#ifndef PIPETRAIN_KERNELS_COMPRESS_BIT_PACK_H_
#define PIPETRAIN_KERNELS_COMPRESS_BIT_PACK_H_

#include <cstdint>

namespace pipetrain {

inline constexpr int kMaxPackedCodeBits = 16;

// A chunk size for codecs that compute codes into a small buffer and pack
// them chunk by chunk: a multiple of 8 (chunks start on whole bytes) small
// enough for the buffer to stay in L1.
inline constexpr int64_t kPackChunkCodes = 2048;

// Writes codes[0, n) at `bits` (1..16) bits each to exactly
// PackedBytes(n, bits) bytes at `out`. Bits of a code above `bits` are
// ignored. Any other width is a programming error (fatal).
void PackCodes(const uint16_t* codes, int64_t n, int bits, uint8_t* out);

// Reads n codes of `bits` (1..16) bits each from exactly PackedBytes(n, bits)
// bytes at `in` into codes[0, n). Padding bits are not checked.
void UnpackCodes(const uint8_t* in, int64_t n, int bits, uint16_t* codes);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_COMPRESS_BIT_PACK_H_
