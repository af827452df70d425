#include "kernels/compress/payload.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

uint32_t Mask(int bits) { return bits == 32 ? 0xffffffffu : (1u << bits) - 1; }

TEST(BitPacking, RoundTrip_EveryWidth_ReturnsValuesAndPackedSize) {
  std::mt19937 rng(7);
  for (int bits = 1; bits <= 32; ++bits) {
    for (int count : {0, 1, 2, 7, 8, 9, 33, 100}) {
      std::vector<uint32_t> values(count);
      for (auto& v : values) v = rng() & Mask(bits);
      if (count > 0) values[0] = Mask(bits);  // The all-ones extreme.
      std::string out;
      BitWriter w(&out);
      for (uint32_t v : values) w.Put(v, bits);
      w.Finish();
      ASSERT_EQ(static_cast<int64_t>(out.size()), PackedBytes(count, bits))
          << "bits=" << bits << " count=" << count;
      BitReader r(out);
      for (int i = 0; i < count; ++i) {
        uint32_t got = 0;
        ASSERT_TRUE(r.Get(bits, &got)) << "bits=" << bits << " i=" << i;
        ASSERT_EQ(got, values[i]) << "bits=" << bits << " i=" << i;
      }
    }
  }
}

TEST(BitPacking, Put_ValueWiderThanBits_KeepsOnlyLowBits) {
  std::string out;
  BitWriter w(&out);
  w.Put(0xff, 3);
  w.Put(0, 5);
  w.Finish();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(static_cast<uint8_t>(out[0]), 0x07);
}

TEST(BitPacking, Get_TruncatedInput_ReturnsFalseAtTheEnd) {
  for (int bits = 1; bits <= 32; ++bits) {
    const int count = 10;
    std::string out;
    BitWriter w(&out);
    for (int i = 0; i < count; ++i) w.Put(static_cast<uint32_t>(i) & Mask(bits), bits);
    w.Finish();
    for (size_t len = 0; len < out.size(); ++len) {
      BitReader r(absl::string_view(out).substr(0, len));
      const int64_t whole = static_cast<int64_t>(len) * 8 / bits;  // Values that fit.
      uint32_t v = 0;
      for (int64_t i = 0; i < whole; ++i) {
        ASSERT_TRUE(r.Get(bits, &v)) << "bits=" << bits << " len=" << len << " i=" << i;
        ASSERT_EQ(v, static_cast<uint32_t>(i) & Mask(bits));
      }
      EXPECT_FALSE(r.Get(bits, &v)) << "bits=" << bits << " len=" << len;
    }
  }
}

TEST(ByteReader, Reads_PastEnd_ReturnFalse) {
  std::string out;
  ByteWriter w(&out);
  w.U8(0xab);
  w.U16(0x1234);
  w.U32(0xdeadbeef);
  w.I64(-5);
  w.F32(1.5f);
  ByteReader r(out);
  uint8_t a;
  uint16_t b;
  uint32_t c;
  int64_t d;
  float e;
  ASSERT_TRUE(r.U8(&a) && r.U16(&b) && r.U32(&c) && r.I64(&d) && r.F32(&e));
  EXPECT_EQ(a, 0xab);
  EXPECT_EQ(b, 0x1234);
  EXPECT_EQ(c, 0xdeadbeefu);
  EXPECT_EQ(d, -5);
  EXPECT_EQ(e, 1.5f);
  EXPECT_EQ(r.remaining(), 0);
  EXPECT_FALSE(r.U8(&a));
  ByteReader short_reader(absl::string_view(out).substr(0, 2));
  EXPECT_FALSE(short_reader.U32(&c));
}

TEST(Header, RoundTrip_Shape_ReturnsShape) {
  std::string out;
  WriteHeader(CodecId::kLinear, {2, 0, 3}, &out);
  EXPECT_EQ(static_cast<int64_t>(out.size()), HeaderBytes(3));
  ByteReader r(out);
  auto shape = ReadHeader(CodecId::kLinear, &r);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(*shape, (Shape{2, 0, 3}));
  EXPECT_EQ(r.remaining(), 0);
}

TEST(Header, ReadHeader_WrongId_InvalidArgument) {
  std::string out;
  WriteHeader(CodecId::kFp16, {4}, &out);
  ByteReader r(out);
  auto shape = ReadHeader(CodecId::kBf16, &r);
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shape.status().message().find("payload is for codec 1, not 2"), std::string::npos);
}

TEST(Header, ReadHeader_EveryPrefix_InvalidArgument) {
  std::string out;
  WriteHeader(CodecId::kFp16, {4, 5}, &out);
  for (size_t len = 0; len < out.size(); ++len) {
    ByteReader r(absl::string_view(out).substr(0, len));
    EXPECT_EQ(ReadHeader(CodecId::kFp16, &r).status().code(), absl::StatusCode::kInvalidArgument)
        << "len=" << len;
  }
}

// Found by fuzz/codec_fuzzer: [2^62, 4, 0] has no elements, but NumElements
// overflowed int64 on 2^62 * 4 before reaching the 0 (undefined behaviour).
TEST(Header, ReadHeader_HugeDimsBesideAZero_InvalidArgument) {
  std::string out;
  WriteHeader(CodecId::kFp16, {int64_t{1} << 62, 4, 0}, &out);
  ByteReader r(out);
  auto shape = ReadHeader(CodecId::kFp16, &r);
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shape.status().message().find("nonzero dimensions multiply to 2^40 or more"),
            std::string::npos)
      << shape.status();
}

TEST(Header, ReadHeader_ZeroBesideSmallDims_ReturnsShape) {
  std::string out;
  WriteHeader(CodecId::kFp16, {1 << 19, 0, 1 << 20}, &out);
  ByteReader r(out);
  auto shape = ReadHeader(CodecId::kFp16, &r);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(*shape, (Shape{1 << 19, 0, 1 << 20}));
}

TEST(Header, PeekPayloadShape_AnyCodec_ReturnsHeaderShapeOrReadHeadersError) {
  for (CodecId id : {CodecId::kFp16, CodecId::kElemTopK, CodecId::kPowerSgd}) {
    std::string out;
    WriteHeader(id, {3, 0, 5}, &out);
    out += "body";
    auto shape = PeekPayloadShape(out);
    ASSERT_TRUE(shape.ok()) << shape.status();
    EXPECT_EQ(*shape, (Shape{3, 0, 5}));
  }
  EXPECT_EQ(PeekPayloadShape("PTC").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PeekPayloadShape("").status().code(), absl::StatusCode::kInvalidArgument);
  std::string huge;
  WriteHeader(CodecId::kLinear, {int64_t{1} << 40}, &huge);
  EXPECT_EQ(PeekPayloadShape(huge).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ByteWriter, F32s_SameBytesAsF32PerValue_AndReadBack) {
  const std::vector<float> values = {1.5f, -0.0f, 3.4e38f, 1e-45f, -7.25f};
  std::string bulk, each;
  ByteWriter(&bulk).F32s(values.data(), 5);
  ByteWriter one(&each);
  for (float v : values) one.F32(v);
  EXPECT_EQ(bulk, each);
  std::vector<float> back(5, 0.0f);
  ByteReader r(bulk);
  ASSERT_TRUE(r.F32s(back.data(), 5));
  EXPECT_EQ(0, std::memcmp(back.data(), values.data(), 20));
  EXPECT_EQ(r.remaining(), 0);
  std::string none;
  ByteWriter(&none).F32s(nullptr, 0);  // An empty vector's data() may be null.
  EXPECT_TRUE(none.empty());
  ByteReader empty(none);
  EXPECT_TRUE(empty.F32s(nullptr, 0));
  ByteReader short_input(absl::string_view(bulk).substr(0, 19));
  EXPECT_FALSE(short_input.F32s(back.data(), 5));
  EXPECT_EQ(short_input.remaining(), 19);  // Nothing consumed.
}

TEST(FiniteMaxAbs, FiniteValues_EqualsTheFoldOfFabs) {
  std::mt19937 rng(9);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  for (int n : {0, 1, 2, 17, 1000}) {
    std::vector<float> values(n);
    for (auto& v : values) v = gauss(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 60) - 30);
    if (n > 1) values[1] = -3.0e38f;  // The largest magnitude, negative.
    float want = 0.0f;
    for (float v : values) want = std::max(want, std::fabs(v));
    auto got = FiniteMaxAbs(values.data(), n, "test");
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, want) << "n=" << n;
  }
  const std::vector<float> tiny = {-0.0f, 1e-45f, -2e-45f};  // Signed zero, subnormals.
  EXPECT_EQ(*FiniteMaxAbs(tiny.data(), 3, "test"), 2e-45f);
}

TEST(FiniteMaxAbs, NanOrInf_ReturnsCheckFinitesErrorForTheFirst) {
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::infinity()}) {
    std::vector<float> values(100, 1.0f);
    values[37] = bad;
    values[80] = std::numeric_limits<float>::infinity();
    auto got = FiniteMaxAbs(values.data(), 100, "linear:bits=4");
    EXPECT_EQ(got.status(), CheckFinite(values.data(), 100, "linear:bits=4")) << bad;
    EXPECT_NE(got.status().message().find("element 37"), std::string::npos) << got.status();
  }
}

TEST(CheckFinite, NamesTheFirstNonFiniteElement_InAnyChunk) {
  const int64_t n = 3 * 4096 + 5;  // Chunks of 4096 and a short last one.
  std::vector<float> values(n);
  std::mt19937 rng(11);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  for (auto& v : values) v = gauss(rng);
  values[5] = std::numeric_limits<float>::max();  // Finite extremes pass.
  values[6] = -std::numeric_limits<float>::max();
  values[7] = std::numeric_limits<float>::denorm_min();
  EXPECT_TRUE(CheckFinite(values.data(), n, "test").ok());
  EXPECT_TRUE(CheckFinite(nullptr, 0, "test").ok());
  const float negative_nan = -std::numeric_limits<float>::quiet_NaN();
  for (int64_t at : {int64_t{0}, int64_t{4095}, int64_t{4096}, int64_t{8191}, n - 1}) {
    for (float bad : {std::numeric_limits<float>::infinity(), negative_nan}) {
      std::vector<float> with_bad = values;
      with_bad[at] = bad;
      // Later ones: the next element (in the same chunk but at a chunk's
      // end) and the last.
      if (at + 1 < n) with_bad[at + 1] = std::numeric_limits<float>::quiet_NaN();
      if (at + 1 < n) with_bad[n - 1] = std::numeric_limits<float>::infinity();
      const absl::Status status = CheckFinite(with_bad.data(), n, "test");
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << at;
      EXPECT_NE(status.message().find(absl::StrCat("element ", at, " ")), std::string::npos)
          << at << ": " << status;
    }
  }
}

}  // namespace
}  // namespace pipetrain
