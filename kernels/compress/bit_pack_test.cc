// PackCodes/UnpackCodes against the one-value-at-a-time BitWriter/BitReader
// (payload.h), whose layout the codec payloads document: same bytes, same
// codes, for every width and for counts around the 8-code group boundary.
#include "kernels/compress/bit_pack.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/compress/payload.h"

namespace pipetrain {
namespace {

std::vector<uint16_t> RandomCodes(int64_t n, int bits, std::mt19937* rng) {
  std::vector<uint16_t> codes(static_cast<size_t>(n));
  const uint32_t mask = (1u << bits) - 1;
  for (auto& c : codes) c = static_cast<uint16_t>((*rng)() & mask);
  if (n > 0) codes[0] = static_cast<uint16_t>(mask);  // The all-ones extreme.
  if (n > 2) codes[n - 1] = static_cast<uint16_t>(mask);
  return codes;
}

std::string ReferencePack(const std::vector<uint16_t>& codes, int bits) {
  std::string out;
  BitWriter w(&out);
  for (uint16_t c : codes) w.Put(c, bits);
  w.Finish();
  return out;
}

const std::vector<int64_t>& Counts() {
  static const auto* counts =
      new std::vector<int64_t>{0, 1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1000, 4099};
  return *counts;
}

TEST(BitPack, PackCodes_EveryWidthAndCount_WritesBitWritersBytes) {
  std::mt19937 rng(11);
  for (int bits = 1; bits <= kMaxPackedCodeBits; ++bits) {
    for (int64_t n : Counts()) {
      const std::vector<uint16_t> codes = RandomCodes(n, bits, &rng);
      const std::string want = ReferencePack(codes, bits);
      ASSERT_EQ(static_cast<int64_t>(want.size()), PackedBytes(n, bits));
      // One guard byte past the end: PackCodes must not touch it.
      std::vector<uint8_t> got(want.size() + 1, 0xa5);
      PackCodes(codes.data(), n, bits, got.data());
      ASSERT_EQ(std::string(got.begin(), got.end() - 1), want) << "bits=" << bits << " n=" << n;
      ASSERT_EQ(got.back(), 0xa5) << "wrote past the end, bits=" << bits << " n=" << n;
    }
  }
}

TEST(BitPack, UnpackCodes_EveryWidthAndCount_ReadsBitWritersCodes) {
  std::mt19937 rng(12);
  for (int bits = 1; bits <= kMaxPackedCodeBits; ++bits) {
    for (int64_t n : Counts()) {
      const std::vector<uint16_t> codes = RandomCodes(n, bits, &rng);
      const std::string packed = ReferencePack(codes, bits);
      // Exactly the packed bytes in a buffer of their own, so ASan sees any
      // read past them.
      std::vector<uint8_t> in(packed.begin(), packed.end());
      std::vector<uint16_t> got(static_cast<size_t>(n) + 1, 0xbeef);
      UnpackCodes(in.data(), n, bits, got.data());
      ASSERT_EQ(got.back(), 0xbeef) << "wrote past the end, bits=" << bits << " n=" << n;
      got.pop_back();
      ASSERT_EQ(got, codes) << "bits=" << bits << " n=" << n;
    }
  }
}

TEST(BitPack, PackCodes_HighBitsAboveWidth_AreIgnored) {
  const std::vector<uint16_t> codes = {0xffff, 0x0000, 0xfff0, 0x0003};
  uint8_t out[2] = {0, 0};
  PackCodes(codes.data(), 4, 3, out);  // 12 bits: 111 000 000 011
  EXPECT_EQ(out[0], 0x07);
  EXPECT_EQ(out[1], 0x06);
}

TEST(BitPack, ChunksAtMultiplesOfEight_EqualOneCall) {
  std::mt19937 rng(13);
  for (int bits : {1, 3, 4, 9, 13, 16}) {
    const int64_t n = 1003;
    const std::vector<uint16_t> codes = RandomCodes(n, bits, &rng);
    std::vector<uint8_t> whole(static_cast<size_t>(PackedBytes(n, bits)));
    PackCodes(codes.data(), n, bits, whole.data());
    std::vector<uint8_t> chunked(whole.size(), 0);
    for (int64_t start = 0; start < n; start += 96) {
      const int64_t count = std::min<int64_t>(96, n - start);
      PackCodes(codes.data() + start, count, bits, chunked.data() + start * bits / 8);
    }
    EXPECT_EQ(chunked, whole) << "bits=" << bits;
  }
}

TEST(BitPackDeathTest, WidthOutOfRange_IsFatal) {
  uint16_t code = 0;
  uint8_t byte = 0;
  EXPECT_DEATH(PackCodes(&code, 1, 17, &byte), "bits=17");
  EXPECT_DEATH(UnpackCodes(&byte, 1, 0, &code), "bits=0");
}

}  // namespace
}  // namespace pipetrain
