#include "kernels/compress/bit_pack.h"

#include <type_traits>

#include "common/logging.h"

namespace pipetrain {
namespace {

// Eight codes of B bits are 8 * B bits: one uint64 up to B = 8, two words'
// worth (unsigned __int128, GCC and Clang) up to B = 16. Bytes are written
// and read one by one from the accumulator, so the layout is little-endian
// whatever the host's byte order.
template <int B>
using GroupWord = std::conditional_t<(B <= 8), uint64_t, unsigned __int128>;

// Packs `count` (1..8) codes into PackedBytes(count, B) bytes at `out`.
template <int B>
inline void PackGroup(const uint16_t* codes, int count, uint8_t* out) {
  constexpr uint32_t kMask = (1u << B) - 1;
  GroupWord<B> word = 0;
  for (int i = 0; i < count; ++i) word |= GroupWord<B>{codes[i] & kMask} << (i * B);
  const int bytes = (count * B + 7) / 8;
  for (int b = 0; b < bytes; ++b) out[b] = static_cast<uint8_t>(word >> (8 * b));
}

// Unpacks `count` (1..8) codes from PackedBytes(count, B) bytes at `in`.
template <int B>
inline void UnpackGroup(const uint8_t* in, int count, uint16_t* codes) {
  constexpr uint32_t kMask = (1u << B) - 1;
  GroupWord<B> word = 0;
  const int bytes = (count * B + 7) / 8;
  for (int b = 0; b < bytes; ++b) word |= GroupWord<B>{in[b]} << (8 * b);
  for (int i = 0; i < count; ++i) codes[i] = static_cast<uint16_t>((word >> (i * B)) & kMask);
}

template <int B>
void PackFixed(const uint16_t* codes, int64_t n, uint8_t* out) {
  const int64_t whole = n / 8;
  // A full group has a compile-time byte count, so these loops unroll.
  for (int64_t g = 0; g < whole; ++g) PackGroup<B>(codes + 8 * g, 8, out + B * g);
  const int rest = static_cast<int>(n - 8 * whole);
  if (rest > 0) PackGroup<B>(codes + 8 * whole, rest, out + B * whole);
}

template <int B>
void UnpackFixed(const uint8_t* in, int64_t n, uint16_t* codes) {
  const int64_t whole = n / 8;
  for (int64_t g = 0; g < whole; ++g) UnpackGroup<B>(in + B * g, 8, codes + 8 * g);
  const int rest = static_cast<int>(n - 8 * whole);
  if (rest > 0) UnpackGroup<B>(in + B * whole, rest, codes + 8 * whole);
}

// One instantiation per width, so every shift and byte count is a constant.
template <int... Bs>
struct Widths {};

template <int B, int... Bs>
struct Widths<B, Bs...> {
  static void Pack(int bits, const uint16_t* codes, int64_t n, uint8_t* out) {
    if (bits == B) return PackFixed<B>(codes, n, out);
    Widths<Bs...>::Pack(bits, codes, n, out);
  }
  static void Unpack(int bits, const uint8_t* in, int64_t n, uint16_t* codes) {
    if (bits == B) return UnpackFixed<B>(in, n, codes);
    Widths<Bs...>::Unpack(bits, in, n, codes);
  }
};

template <>
struct Widths<> {  // Unreachable: the public functions check the width.
  static void Pack(int, const uint16_t*, int64_t, uint8_t*) {}
  static void Unpack(int, const uint8_t*, int64_t, uint16_t*) {}
};

using AllWidths = Widths<1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16>;

}  // namespace

void PackCodes(const uint16_t* codes, int64_t n, int bits, uint8_t* out) {
  PT_CHECK(bits >= 1 && bits <= kMaxPackedCodeBits) << "PackCodes: bits=" << bits;
  AllWidths::Pack(bits, codes, n, out);
}

void UnpackCodes(const uint8_t* in, int64_t n, int bits, uint16_t* codes) {
  PT_CHECK(bits >= 1 && bits <= kMaxPackedCodeBits) << "UnpackCodes: bits=" << bits;
  AllWidths::Unpack(bits, in, n, codes);
}

}  // namespace pipetrain
