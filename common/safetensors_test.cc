#include "common/safetensors.h"

#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/testing/in_child.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pipetrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

// A fresh, empty directory per test so directory listings are exact.
std::string TestDir() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::path(std::getenv("TEST_TMPDIR")) / absl::StrCat(info->name(), "_dir");
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string LittleEndian64(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

// A safetensors file: length prefix, `header` verbatim, then `data`.
std::string RawFile(const std::string& header, const std::string& data) {
  return LittleEndian64(header.size()) + header + data;
}

std::string U16Bytes(const std::vector<uint16_t>& values) {
  std::string s;
  for (uint16_t v : values) {
    s.push_back(static_cast<char>(v & 0xff));
    s.push_back(static_cast<char>(v >> 8));
  }
  return s;
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

std::vector<uint32_t> BitsOf(const Tensor& t) {
  std::vector<uint32_t> bits;
  for (int64_t i = 0; i < t.numel(); ++i) bits.push_back(Bits(t[i]));
  return bits;
}

// Tensors covering the awkward cases: odd sizes, a scalar, a zero-size tensor
// between two others, and values whose bits must survive (NaN payload, -0,
// a float subnormal).
std::vector<NamedTensor> SampleTensors() {
  std::vector<float> a_values;
  for (int i = 0; i < 6; ++i) a_values.push_back(0.1f * static_cast<float>(i) - 0.25f);
  return {
      {"h.0.attn.c_attn.weight", Tensor::FromVector({2, 3}, a_values)},
      {"scalar", Tensor::FromVector({}, {42.5f})},
      {"empty", Tensor::Zeros({0, 4})},
      {"odd", Tensor::FromVector({5}, {-0.0f, FromBits(0x7fc01234), FromBits(0x00000001),
                                       std::numeric_limits<float>::infinity(), 3.0f})},
  };
}

TEST(SafetensorsTest, WriteThenRead_RoundTrip_BitwiseIdentical) {
  const std::string path = TestDir() + "/model.safetensors";
  const std::vector<NamedTensor> tensors = SampleTensors();
  const SafetensorsMetadata metadata = {{"format", "pt"}, {"step", "7"}};
  ASSERT_TRUE(WriteSafetensors(path, tensors, metadata).ok());

  absl::StatusOr<SafetensorsContents> read = ReadSafetensors(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->metadata, metadata);
  ASSERT_EQ(read->tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    SCOPED_TRACE(tensors[i].name);
    // Written contiguously in order, so ascending offsets is the write order
    // (the zero-size tensor [28, 28) sorts before "odd" [28, 48)).
    EXPECT_EQ(read->tensors[i].name, tensors[i].name);
    const Tensor* found = read->Find(tensors[i].name);
    ASSERT_NE(found, nullptr);
    EXPECT_EQ(found->shape(), tensors[i].tensor.shape());
    EXPECT_EQ(BitsOf(*found), BitsOf(tensors[i].tensor));
  }
  EXPECT_EQ(read->Find("missing"), nullptr);
}

TEST(SafetensorsTest, Read_TensorsComeInAscendingOffsetOrder) {
  const std::string path = TestDir() + "/order.safetensors";
  const std::string header = R"({"z":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("a":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},)"
                             R"("m":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  WriteBytes(path, RawFile(header, std::string(12, '\0')));
  absl::StatusOr<SafetensorsContents> read = ReadSafetensors(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->tensors.size(), 3u);
  EXPECT_EQ(read->tensors[0].name, "z");
  EXPECT_EQ(read->tensors[1].name, "m");
  EXPECT_EQ(read->tensors[2].name, "a");
  EXPECT_TRUE(read->metadata.empty());
}

TEST(SafetensorsTest, Write_FileParsedIndependently_HeaderWellFormedAndDataTiled) {
  const std::string path = TestDir() + "/model.safetensors";
  const std::vector<NamedTensor> tensors = SampleTensors();
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"k", "v"}}).ok());

  const std::string bytes = ReadBytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  ASSERT_LE(8 + n, bytes.size());
  EXPECT_EQ((8 + n) % 8, 0u) << "data buffer must start 8-byte aligned";
  const json header = json::parse(bytes.substr(8, n));
  const std::string data = bytes.substr(8 + n);
  EXPECT_EQ(header["__metadata__"], json({{"k", "v"}}));
  ASSERT_EQ(header.size(), tensors.size() + 1);

  uint64_t expected_begin = 0;  // Tiling: each tensor starts where the last ended.
  for (const NamedTensor& t : tensors) {
    SCOPED_TRACE(t.name);
    const json& entry = header.at(t.name);
    EXPECT_EQ(entry.at("dtype"), "F32");
    EXPECT_EQ(entry.at("shape").get<std::vector<int64_t>>(), t.tensor.shape());
    const uint64_t begin = entry.at("data_offsets")[0].get<uint64_t>();
    const uint64_t end = entry.at("data_offsets")[1].get<uint64_t>();
    EXPECT_EQ(begin, expected_begin);
    EXPECT_EQ(end - begin, static_cast<uint64_t>(t.tensor.size_bytes()));
    ASSERT_LE(end, data.size());
    EXPECT_EQ(std::memcmp(data.data() + begin, t.tensor.data(), end - begin), 0);
    expected_begin = end;
  }
  EXPECT_EQ(expected_begin, data.size()) << "offsets must cover the whole data buffer";
}

TEST(SafetensorsTest, Write_NoMetadata_OmitsMetadataKey) {
  const std::string path = TestDir() + "/plain.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, {{"w", Tensor::FromVector({1}, {1.0f})}}).ok());
  const std::string bytes = ReadBytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_FALSE(json::parse(bytes.substr(8, n)).contains("__metadata__"));
}

TEST(SafetensorsTest, Write_SliceView_WritesOnlyTheView) {
  const std::string path = TestDir() + "/slice.safetensors";
  Tensor full = Tensor::FromVector({3, 2}, {1, 2, 3, 4, 5, 6});
  ASSERT_TRUE(WriteSafetensors(path, {{"rows", full.Slice(1, 3)}}).ok());
  absl::StatusOr<SafetensorsContents> read = ReadSafetensors(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->tensors[0].tensor.shape(), Shape({2, 2}));
  EXPECT_EQ(read->tensors[0].tensor.ToVector(), std::vector<float>({3, 4, 5, 6}));
}

TEST(SafetensorsTest, Read_F16_ConvertsKnownBitPatterns) {
  const std::string path = TestDir() + "/half.safetensors";
  // 1.0, -2.0, 65504 (max), 2^-24 (min subnormal), 1023 * 2^-24 (max
  // subnormal), +inf, -inf, -0.0, 2^-14 (min normal).
  const std::vector<uint16_t> halves = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x03ff,
                                        0x7c00, 0xfc00, 0x8000, 0x0400};
  const std::string header = R"({"h":{"dtype":"F16","shape":[3,3],"data_offsets":[0,18]}})";
  WriteBytes(path, RawFile(header, U16Bytes(halves)));
  absl::StatusOr<SafetensorsContents> read = ReadSafetensors(path);
  ASSERT_TRUE(read.ok()) << read.status();
  const Tensor& t = read->tensors[0].tensor;
  ASSERT_EQ(t.shape(), Shape({3, 3}));
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> expected = {
      1.0f, -2.0f, 65504.0f, std::ldexp(1.0f, -24), 1023 * std::ldexp(1.0f, -24),
      inf,  -inf,  -0.0f,    std::ldexp(1.0f, -14)};
  std::vector<uint32_t> expected_bits;
  for (float f : expected) expected_bits.push_back(Bits(f));
  EXPECT_EQ(BitsOf(t), expected_bits);
}

TEST(SafetensorsTest, Read_F16NaN_StaysNaNWithSign) {
  const std::string path = TestDir() + "/nan.safetensors";
  const std::string header = R"({"n":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})";
  WriteBytes(path, RawFile(header, U16Bytes({0x7e00, 0xfc01})));
  absl::StatusOr<SafetensorsContents> read = ReadSafetensors(path);
  ASSERT_TRUE(read.ok()) << read.status();
  const Tensor& t = read->tensors[0].tensor;
  EXPECT_TRUE(std::isnan(t[0]));
  EXPECT_FALSE(std::signbit(t[0]));
  EXPECT_TRUE(std::isnan(t[1]));  // Signalling payload must not become inf.
  EXPECT_TRUE(std::signbit(t[1]));
}

TEST(SafetensorsTest, Read_BF16_ConvertsKnownBitPatterns) {
  const std::string path = TestDir() + "/bf16.safetensors";
  // 1.0, -2.0, 65280 (bf16 nearest below 65504), max finite, float min
  // subnormal 2^-133, +inf.
  const std::vector<uint16_t> values = {0x3f80, 0xc000, 0x477f, 0x7f7f, 0x0001, 0x7f80};
  const std::string header = R"({"b":{"dtype":"BF16","shape":[6],"data_offsets":[0,12]}})";
  WriteBytes(path, RawFile(header, U16Bytes(values)));
  absl::StatusOr<SafetensorsContents> read = ReadSafetensors(path);
  ASSERT_TRUE(read.ok()) << read.status();
  const Tensor& t = read->tensors[0].tensor;
  EXPECT_EQ(t[0], 1.0f);
  EXPECT_EQ(t[1], -2.0f);
  EXPECT_EQ(t[2], 65280.0f);
  EXPECT_EQ(Bits(t[3]), 0x7f7f0000u);
  EXPECT_EQ(t[4], std::ldexp(1.0f, -133));
  EXPECT_EQ(t[5], std::numeric_limits<float>::infinity());
}

TEST(SafetensorsTest, Read_F64AndUnalignedOffsets_Converts) {
  const std::string path = TestDir() + "/mixed.safetensors";
  // A 2-byte F16 tensor first leaves the F64 and F32 tensors unaligned.
  std::string data = U16Bytes({0x3c00});
  const double d[2] = {0.5, -1e10};
  data.append(reinterpret_cast<const char*>(d), sizeof(d));
  const float f = 7.25f;
  data.append(reinterpret_cast<const char*>(&f), sizeof(f));
  const std::string header = R"({"h":{"dtype":"F16","shape":[],"data_offsets":[0,2]},)"
                             R"("d":{"dtype":"F64","shape":[2],"data_offsets":[2,18]},)"
                             R"("f":{"dtype":"F32","shape":[1,1],"data_offsets":[18,22]}})";
  WriteBytes(path, RawFile(header, data));
  absl::StatusOr<SafetensorsContents> read = ReadSafetensors(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->Find("h")->ToVector(), std::vector<float>({1.0f}));
  EXPECT_EQ(read->Find("d")->ToVector(), std::vector<float>({0.5f, -1e10f}));
  EXPECT_EQ(read->Find("f")->ToVector(), std::vector<float>({7.25f}));
}

// ---------------------------------------------------------------------------
// Validation errors.

class SafetensorsValidationTest : public ::testing::Test {
 protected:
  void SetUp() override { path_ = TestDir() + "/bad.safetensors"; }

  // ReadSafetensors' status; ReadSafetensorsShapes, which checks the same
  // header against the file's size, must give the same.
  absl::Status ReadRaw(const std::string& bytes) {
    WriteBytes(path_, bytes);
    const absl::Status full = ReadSafetensors(path_).status();
    EXPECT_EQ(ReadSafetensorsShapes(path_).status(), full);
    return full;
  }
  absl::Status ReadHeader(const std::string& header, size_t data_bytes = 8) {
    return ReadRaw(RawFile(header, std::string(data_bytes, '\0')));
  }
  // An INVALID_ARGUMENT naming the file, the tensor (when given) and `what`.
  void ExpectInvalid(const absl::Status& status, const std::string& tensor,
                     const std::string& what) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(path_));
    if (!tensor.empty()) {
      EXPECT_THAT(std::string(status.message()), HasSubstr("tensor \"" + tensor + "\""));
    }
    EXPECT_THAT(std::string(status.message()), HasSubstr(what));
  }

  std::string path_;
};

TEST_F(SafetensorsValidationTest, Read_FileShorterThan8Bytes_InvalidArgument) {
  ExpectInvalid(ReadRaw("abcde"), "", "shorter than the 8-byte header length");
}

TEST_F(SafetensorsValidationTest, Read_HeaderLengthBeyondFile_InvalidArgument) {
  ExpectInvalid(ReadRaw(LittleEndian64(1000) + "{}"), "",
                "header length 1000 exceeds the file size 10");
}

TEST_F(SafetensorsValidationTest, Read_HeaderLengthAbsurd_InvalidArgument) {
  ExpectInvalid(ReadRaw(LittleEndian64(uint64_t{1} << 40) + "{}"), "", "16 MiB");
  ExpectInvalid(ReadRaw(LittleEndian64(~uint64_t{0}) + "{}"), "", "16 MiB");
}

TEST_F(SafetensorsValidationTest, Read_HeaderNotJson_InvalidArgument) {
  ExpectInvalid(ReadHeader("{not json"), "", "header is not valid JSON");
  ExpectInvalid(ReadHeader(R"({"a":1} trailing)"), "", "header is not valid JSON");
}

TEST_F(SafetensorsValidationTest, Read_HeaderNotObject_InvalidArgument) {
  ExpectInvalid(ReadHeader("[1, 2]"), "", "header is not a JSON object");
}

TEST_F(SafetensorsValidationTest, Read_EntryNotObject_InvalidArgument) {
  ExpectInvalid(ReadHeader(R"({"w": 3})"), "w", "entry must be an object");
}

TEST_F(SafetensorsValidationTest, Read_EntryMissingField_InvalidArgumentNamingField) {
  ExpectInvalid(ReadHeader(R"({"w":{"shape":[2],"data_offsets":[0,8]}})"), "w",
                "entry has no \"dtype\"");
  ExpectInvalid(ReadHeader(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})"), "w",
                "entry has no \"shape\"");
  ExpectInvalid(ReadHeader(R"({"w":{"dtype":"F32","shape":[2]}})"), "w",
                "entry has no \"data_offsets\"");
}

TEST_F(SafetensorsValidationTest, Read_WrongJsonTypes_InvalidArgument) {
  ExpectInvalid(ReadHeader(R"({"w":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})"), "w",
                "dtype must be a string");
  ExpectInvalid(ReadHeader(R"({"w":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})"), "w",
                "shape must be an array of integers");
  ExpectInvalid(ReadHeader(R"({"w":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})"), "w",
                "shape must be an array of integers");
  ExpectInvalid(ReadHeader(R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})"), "w",
                "shape must be an array of integers");
  ExpectInvalid(ReadHeader(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":{"a":0}}})"), "w",
                "data_offsets must be [begin, end]");
  ExpectInvalid(ReadHeader(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,"8"]}})"), "w",
                "data_offsets must be [begin, end]");
}

TEST_F(SafetensorsValidationTest, Read_UnsupportedDtype_InvalidArgumentNamingDtype) {
  ExpectInvalid(ReadHeader(R"({"ids":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})"), "ids",
                "unsupported dtype \"I32\"");
}

TEST_F(SafetensorsValidationTest, Read_NegativeDimension_InvalidArgument) {
  ExpectInvalid(ReadHeader(R"({"w":{"dtype":"F32","shape":[-2,-1],"data_offsets":[0,8]}})"), "w",
                "negative dimension -2");
}

TEST_F(SafetensorsValidationTest, Read_ShapeOverflowsInt64_InvalidArgument) {
  ExpectInvalid(
      ReadHeader(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})"),
      "w", "multiplied left to right, pass 2^63");
  ExpectInvalid(
      ReadHeader(R"({"w":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,0]}})"),
      "w", "multiplied left to right, pass 2^63");
}

TEST_F(SafetensorsValidationTest, Read_BadDataOffsets_InvalidArgument) {
  ExpectInvalid(ReadHeader(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})"), "w",
                "data_offsets must be [begin, end]");
  ExpectInvalid(ReadHeader(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4,8]}})"), "w",
                "data_offsets must be [begin, end]");
  ExpectInvalid(ReadHeader(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[-4,4]}})"), "w",
                "data_offsets must be [begin, end] of non-negative integers");
}

TEST_F(SafetensorsValidationTest, Read_BeginAfterEnd_InvalidArgument) {
  ExpectInvalid(ReadHeader(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})"), "w",
                "data_offsets [8, 4] has begin > end");
}

TEST_F(SafetensorsValidationTest, Read_EndBeyondDataBuffer_InvalidArgument) {
  ExpectInvalid(ReadHeader(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8), "w",
                "data_offsets end 16 is beyond the data buffer of 8 bytes");
}

TEST_F(SafetensorsValidationTest, Read_ByteCountMismatch_InvalidArgument) {
  ExpectInvalid(ReadHeader(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})"), "w",
                "data_offsets span 8 bytes but shape [3] needs 3 elements of 4 bytes");
  ExpectInvalid(ReadHeader(R"({"w":{"dtype":"F16","shape":[],"data_offsets":[0,3]}})"), "w",
                "data_offsets span 3 bytes");
}

TEST_F(SafetensorsValidationTest, Read_OverlappingRanges_InvalidArgumentNamingBoth) {
  ExpectInvalid(ReadHeader(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                           12),
                "b", "overlap tensor \"a\"");
  ExpectInvalid(ReadHeader(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}})"),
                "b", "overlap tensor \"a\"");
}

TEST_F(SafetensorsValidationTest, Read_ZeroSizeTensorsShareOffsets_Accepted) {
  EXPECT_TRUE(ReadHeader(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("e1":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)"
                         R"("e2":{"dtype":"F32","shape":[3,0],"data_offsets":[8,8]}})")
                  .ok());
}

TEST_F(SafetensorsValidationTest, Read_MetadataNotStringToString_InvalidArgument) {
  ExpectInvalid(ReadHeader(R"({"__metadata__":["x"]})"), "", "__metadata__ must be an object");
  ExpectInvalid(ReadHeader(R"({"__metadata__":{"step":7}})"), "",
                "__metadata__ value for key \"step\" must be a string");
}

TEST(SafetensorsTest, Read_MissingFile_NotFoundNamingPath) {
  const std::string path = TestDir() + "/absent.safetensors";
  absl::StatusOr<SafetensorsContents> read = ReadSafetensors(path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(read.status().message()), HasSubstr(path));
}

// ---------------------------------------------------------------------------
// Write errors and atomicity.

TEST(SafetensorsTest, Write_BadNames_InvalidArgumentNamingTensor) {
  const std::string path = TestDir() + "/names.safetensors";
  const Tensor t = Tensor::FromVector({1}, {1.0f});
  struct Case {
    std::vector<NamedTensor> tensors;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {{{"w", t}, {"w", t}}, "tensor #1 \"w\": duplicate tensor name"},
      {{{"w", t}, {"", t}}, "tensor #1 \"\" has an empty name"},
      {{{"__metadata__", t}}, "tensor #0 \"__metadata__\": the name __metadata__ is reserved"},
      {{{"null", Tensor()}}, "tensor #0 \"null\" is a null tensor"},
      {{{"bad\xff", t}}, "name is not valid UTF-8"},
  };
  for (const Case& c : cases) {
    absl::Status status = WriteSafetensors(path, c.tensors);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(path));
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.fragment));
  }
  EXPECT_FALSE(fs::exists(path));
}

// The header alone gives every tensor's name and shape, in the order
// ReadSafetensors lists them.
TEST(SafetensorsTest, ReadShapes_NamesAndShapesAsTheWholeRead) {
  const std::string path = TestDir() + "/shapes.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, SampleTensors()).ok());
  const absl::StatusOr<SafetensorsContents> full = ReadSafetensors(path);
  const absl::StatusOr<std::vector<SafetensorsShape>> shapes = ReadSafetensorsShapes(path);
  ASSERT_TRUE(full.ok() && shapes.ok()) << full.status() << shapes.status();
  ASSERT_EQ(shapes->size(), full->tensors.size());
  for (size_t i = 0; i < shapes->size(); ++i) {
    EXPECT_EQ((*shapes)[i].name, full->tensors[i].name);
    EXPECT_EQ((*shapes)[i].shape, full->tensors[i].tensor.shape());
  }
  EXPECT_EQ(ReadSafetensorsShapes(TestDir() + "/none.safetensors").status().code(),
            absl::StatusCode::kNotFound);
}

// Only the wanted tensors, bitwise as the whole read gives them, with the
// metadata; a file cut short within a wanted tensor is DATA_LOSS, and one
// cut within the header fails as ReadSafetensors does.
TEST(SafetensorsTest, ReadTensors_WantedOnly_SameBitsAsTheWholeRead) {
  const std::string path = TestDir() + "/some.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, SampleTensors(), {{"format", "pt"}}).ok());
  const SafetensorsContents whole = ReadSafetensors(path).value();
  absl::StatusOr<SafetensorsContents> some = ReadSafetensorsTensors(
      path, [](std::string_view name) { return name == "odd" || name == "scalar"; });
  ASSERT_TRUE(some.ok()) << some.status();
  ASSERT_EQ(some->tensors.size(), 2u);
  EXPECT_EQ(some->metadata, whole.metadata);
  for (const NamedTensor& t : some->tensors) {
    const Tensor* expected = whole.Find(t.name);
    ASSERT_NE(expected, nullptr) << t.name;
    EXPECT_EQ(t.tensor.shape(), expected->shape());
    EXPECT_EQ(
        std::memcmp(t.tensor.data(), expected->data(), static_cast<size_t>(expected->size_bytes())),
        0)
        << t.name;
  }
  EXPECT_TRUE(
      ReadSafetensorsTensors(path, [](std::string_view) { return false; })->tensors.empty());
  // The last tensor cut short ("odd" lies last in the data): the header
  // still says where it ends.
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::string cut = TestDir() + "/cut.safetensors";
  WriteBytes(cut, bytes.substr(0, bytes.size() - 4));
  EXPECT_EQ(ReadSafetensorsTensors(cut, [](std::string_view) { return true; }).status().code(),
            ReadSafetensors(cut).status().code());
  WriteBytes(cut, bytes.substr(0, 12));
  EXPECT_EQ(ReadSafetensorsTensors(cut, [](std::string_view) { return true; }).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// From a descriptor opened beforehand (OpenRealPathNoLinks after a root
// check): what the by-path reads give, read through that descriptor even
// once the name points elsewhere; `path` only names the file in errors.
TEST(SafetensorsTest, ReadFromAnOpenFile_AsByPath_WhateverTheNameBecame) {
  const std::string path = TestDir() + "/opened.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, SampleTensors()).ok());
  const SafetensorsContents whole = ReadSafetensors(path).value();
  ScopedFd for_shapes(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  ScopedFd for_tensors(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_GE(for_shapes.get(), 0);
  ASSERT_GE(for_tensors.get(), 0);
  const std::string other = TestDir() + "/other.safetensors";
  ASSERT_TRUE(WriteSafetensors(other, {{"only", Tensor::Filled({2}, 1.f)}}).ok());
  ASSERT_EQ(rename(other.c_str(), path.c_str()), 0);  // the name now names another file
  const absl::StatusOr<std::vector<SafetensorsShape>> shapes =
      ReadSafetensorsShapesFrom(std::move(for_shapes), path);
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  ASSERT_EQ(shapes->size(), whole.tensors.size());
  const absl::StatusOr<SafetensorsContents> read = ReadSafetensorsTensorsFrom(
      std::move(for_tensors), path, [](std::string_view) { return true; });
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->tensors.size(), whole.tensors.size());
  for (size_t i = 0; i < whole.tensors.size(); ++i) {
    EXPECT_EQ(read->tensors[i].name, whole.tensors[i].name);
    ASSERT_EQ(read->tensors[i].tensor.shape(), whole.tensors[i].tensor.shape());
    EXPECT_EQ(std::memcmp(read->tensors[i].tensor.data(), whole.tensors[i].tensor.data(),
                          static_cast<size_t>(whole.tensors[i].tensor.size_bytes())),
              0)
        << whole.tensors[i].name;  // bitwise: the samples hold a NaN
  }
  // A directory's descriptor is not a file: refused naming `path`.
  ScopedFd dir(open(TestDir().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  const absl::Status not_file = ReadSafetensorsShapesFrom(std::move(dir), path).status();
  EXPECT_FALSE(not_file.ok());
  EXPECT_THAT(std::string(not_file.message()), HasSubstr(path));
}

// The metadata of a file the strict readers refuse (a dtype they do not
// know, a metadata value that is not a string) read leniently: the string
// values, from a descriptor left open at its position. The header's bounds
// and JSON still hold: INVALID_ARGUMENT naming the file otherwise.
TEST(SafetensorsTest, ReadMetadataLeniently_StringValuesOfAFileTheStrictReadRefuses) {
  const std::string path = TestDir() + "/later.safetensors";
  WriteBytes(path, RawFile(R"({"__metadata__":{"format":"x","version":"2","n":[1]},)"
                           R"("count":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}})",
                           "abcd"));
  ASSERT_EQ(ReadSafetensors(path).status().code(), absl::StatusCode::kInvalidArgument);
  ScopedFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_GE(fd.get(), 0);
  ASSERT_EQ(lseek(fd.get(), 3, SEEK_SET), 3);
  const absl::StatusOr<SafetensorsMetadata> meta = ReadSafetensorsMetadataLeniently(fd.get(), path);
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(*meta, (SafetensorsMetadata{{"format", "x"}, {"version", "2"}}));
  EXPECT_EQ(lseek(fd.get(), 0, SEEK_CUR), 3);  // its position untouched, still open

  struct Case {
    std::string bytes;
    std::string what;  // "" for OK with no metadata
  };
  for (const Case& c : {Case{RawFile(R"({"__metadata__":["x"]})", ""), ""},
                        Case{RawFile(R"({"a":1})", ""), ""},
                        Case{"abcde", "shorter than the 8-byte header length"},
                        Case{LittleEndian64(uint64_t{1} << 40) + "{}", "16 MiB"},
                        Case{RawFile("{not json", ""), "header is not valid JSON"},
                        Case{RawFile("[1, 2]", ""), "header is not a JSON object"}}) {
    SCOPED_TRACE(c.bytes);
    WriteBytes(path, c.bytes);
    ScopedFd again(open(path.c_str(), O_RDONLY | O_CLOEXEC));
    ASSERT_GE(again.get(), 0);
    const absl::StatusOr<SafetensorsMetadata> read =
        ReadSafetensorsMetadataLeniently(again.get(), path);
    if (c.what.empty()) {
      ASSERT_TRUE(read.ok()) << read.status();
      EXPECT_TRUE(read->empty());
      continue;
    }
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument) << read.status();
    EXPECT_THAT(std::string(read.status().message()), HasSubstr(path));
    EXPECT_THAT(std::string(read.status().message()), HasSubstr(c.what));
  }
}

// The header read, the file then shrinks before a wanted tensor's bytes
// (another process rewrote it in place): DATA_LOSS saying so, not a tensor
// of whatever the read left in the buffer.
TEST(SafetensorsTest, ReadTensors_FileShrinksWhileRead_DataLoss) {
  const std::string path = TestDir() + "/shrinks.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, SampleTensors()).ok());
  bool cut = false;
  absl::StatusOr<SafetensorsContents> read = ReadSafetensorsTensors(path, [&](std::string_view) {
    if (!cut) cut = truncate(path.c_str(), 12) == 0;  // asked after the header
    return true;
  });
  ASSERT_TRUE(cut);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("shrank while being read"));
}

TEST(SafetensorsTest, Write_Success_LeavesNoTempFile) {
  const std::string dir = TestDir();
  ASSERT_TRUE(WriteSafetensors(dir + "/a.safetensors", SampleTensors()).ok());
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    names.push_back(e.path().filename());
  EXPECT_THAT(names, UnorderedElementsAre("a.safetensors"));
}

// A name of 250 bytes passes CheckConfinedName (255 per component);
// "<name>.tmp.<pid>" was over NAME_MAX, so the job's weights were lost after
// training (ENAMETOOLONG). Both writers, and nothing left behind.
TEST(SafetensorsTest, Write_NameOf250Bytes_WrittenWithNoTempFileLeft) {
  const std::string dir = TestDir();
  const std::string name = std::string(238, 'w') + ".safetensors";
  ASSERT_EQ(name.size(), 250u);
  absl::Status written = WriteSafetensors(dir + "/" + name, SampleTensors());
  ASSERT_TRUE(written.ok()) << written;
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir_fd, 0);
  const std::string at_name = std::string(250, 'a');
  written = WriteSafetensorsAt(dir_fd, at_name, SampleTensors(), {{"k", "v"}}, 0600);
  close(dir_fd);
  ASSERT_TRUE(written.ok()) << written;
  for (const std::string& n : {name, at_name}) {
    absl::StatusOr<SafetensorsContents> read = ReadSafetensors(dir + "/" + n);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->tensors.size(), SampleTensors().size());
  }
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    names.push_back(e.path().filename());
  EXPECT_THAT(names, UnorderedElementsAre(name, at_name));
}

TEST(SafetensorsTest, Write_ExistingFile_ReplacedByCompleteFile) {
  const std::string dir = TestDir();
  const std::string path = dir + "/a.safetensors";
  WriteBytes(path, "old contents");
  ASSERT_TRUE(WriteSafetensors(path, {{"w", Tensor::FromVector({2}, {1.0f, 2.0f})}}).ok());
  absl::StatusOr<SafetensorsContents> read = ReadSafetensors(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->Find("w")->ToVector(), std::vector<float>({1.0f, 2.0f}));
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    names.push_back(e.path().filename());
  EXPECT_THAT(names, UnorderedElementsAre("a.safetensors"));
}

TEST(SafetensorsTest, Write_DirectoryMissing_NotFoundAndNoFile) {
  const std::string dir = TestDir();
  const std::string path = dir + "/no_such_dir/a.safetensors";
  absl::Status status = WriteSafetensors(path, SampleTensors());
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(path));
  EXPECT_THAT(std::string(status.message()), HasSubstr(std::strerror(ENOENT)));
  EXPECT_FALSE(fs::exists(dir + "/no_such_dir"));
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST(SafetensorsTest, Write_RenameFails_ErrorAndTempFileRemoved) {
  const std::string dir = TestDir();
  const std::string path = dir + "/target";
  fs::create_directories(path + "/occupied");  // rename(file, non-empty dir) fails.
  absl::Status status = WriteSafetensors(path, SampleTensors());
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr(path));
  EXPECT_THAT(std::string(status.message()), HasSubstr(std::strerror(EISDIR)));
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    names.push_back(e.path().filename());
  EXPECT_THAT(names, UnorderedElementsAre("target"));
}

// The rename would replace a device, FIFO or socket by a regular file (as
// root, /dev/null itself): refused, the FIFO kept, no temporary left, and
// errors name the path asked for. A link is replaced, its target untouched.
TEST(SafetensorsTest, Write_OverAFifo_RefusedAndKept_LinkReplacedNotItsTarget) {
  const std::string dir = TestDir();
  const std::string fifo = dir + "/pipe";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  absl::Status status = WriteSafetensors(fifo, SampleTensors());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(fifo + " is a device, FIFO or socket"));
  struct stat info;
  ASSERT_EQ(lstat(fifo.c_str(), &info), 0);
  EXPECT_TRUE(S_ISFIFO(info.st_mode));
  const std::string target = dir + "/target.txt", link = dir + "/link.safetensors";
  WriteBytes(target, "untouched");
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  ASSERT_TRUE(WriteSafetensors(link, SampleTensors()).ok());
  ASSERT_EQ(lstat(link.c_str(), &info), 0);
  EXPECT_TRUE(S_ISREG(info.st_mode));
  std::ifstream in(target);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "untouched");
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    names.push_back(e.path().filename());
  EXPECT_THAT(names, UnorderedElementsAre("pipe", "target.txt", "link.safetensors"));
}

std::vector<std::string> NamesIn(const std::string& dir) {
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    names.push_back(e.path().filename());
  }
  return names;
}

std::vector<SafetensorsTensorSpec> SpecsOf(const std::vector<NamedTensor>& tensors) {
  std::vector<SafetensorsTensorSpec> specs;
  for (const NamedTensor& t : tensors) specs.push_back({t.name, t.tensor.shape()});
  return specs;
}

// Values arrive in chunks, out of order: the committed file is the one
// WriteSafetensors would write, byte for byte, and it appears under its
// name only at Commit.
TEST(SafetensorsFileWriterTest, ChunksOutOfOrder_CommittedFileEqualsTheWholeWrite) {
  const std::string dir = TestDir();
  const std::vector<NamedTensor> tensors = SampleTensors();
  ASSERT_TRUE(WriteSafetensors(dir + "/whole.safetensors", tensors).ok());
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir_fd, 0);
  absl::StatusOr<std::unique_ptr<SafetensorsFileWriter>> writer =
      SafetensorsFileWriter::Create(dir_fd, "chunked.safetensors", SpecsOf(tensors), 0600);
  close(dir_fd);  // the writer keeps its own
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (size_t i = tensors.size(); i-- > 0;) {  // last tensor first, each in two pieces
    const Tensor& t = tensors[i].tensor;
    const int64_t half = t.numel() / 2;
    ASSERT_TRUE((*writer)->Write(i, half, t.data() + half, t.numel() - half).ok());
    ASSERT_TRUE((*writer)->Write(i, 0, t.data(), half).ok());
  }
  EXPECT_FALSE(fs::exists(dir + "/chunked.safetensors"));
  ASSERT_TRUE((*writer)->Commit().ok());
  EXPECT_EQ(ReadBytes(dir + "/chunked.safetensors"), ReadBytes(dir + "/whole.safetensors"));
  EXPECT_EQ(fs::status(dir + "/chunked.safetensors").permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  writer->reset();
  EXPECT_THAT(NamesIn(dir), UnorderedElementsAre("whole.safetensors", "chunked.safetensors"));
}

// Metadata goes into the header as WriteSafetensors puts it (the same
// bytes); metadata that is not UTF-8 is refused before anything is made.
TEST(SafetensorsFileWriterTest, Metadata_AsWriteSafetensorsWritesIt_NotUtf8Refused) {
  const std::string dir = TestDir();
  const std::vector<NamedTensor> tensors = SampleTensors();
  ASSERT_TRUE(WriteSafetensors(dir + "/whole.safetensors", tensors, HfWeightsMetadata()).ok());
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir_fd, 0);
  absl::StatusOr<std::unique_ptr<SafetensorsFileWriter>> writer = SafetensorsFileWriter::Create(
      dir_fd, "chunked.safetensors", SpecsOf(tensors), 0600, HfWeightsMetadata());
  const absl::Status refused =
      SafetensorsFileWriter::Create(dir_fd, "bad.safetensors", SpecsOf(tensors), 0600,
                                    {{"format", "\xff"}})
          .status();
  close(dir_fd);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i].tensor;
    ASSERT_TRUE((*writer)->Write(i, 0, t.data(), t.numel()).ok());
  }
  ASSERT_TRUE((*writer)->Commit().ok());
  EXPECT_EQ(ReadBytes(dir + "/chunked.safetensors"), ReadBytes(dir + "/whole.safetensors"));
  EXPECT_EQ(ReadSafetensors(dir + "/chunked.safetensors").value().metadata,
            (SafetensorsMetadata{{"format", "pt"}}));
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  writer->reset();
  EXPECT_THAT(NamesIn(dir), UnorderedElementsAre("whole.safetensors", "chunked.safetensors"));
}

// What FailFallocate's child says where no filter may be installed.
constexpr char kNoSeccomp[] = "no seccomp filter here: ";

// Makes fallocate(2) fail with EOPNOTSUPP in this process for good, as
// NFS before 4.2, EFS, Filestore, CephFS and FUSE answer it; every other
// call goes through (this process's own architecture's numbers: a test
// makes no other). False, errno set, where the kernel or a sandbox refuses.
bool FailFallocate() {
  struct sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_fallocate, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EOPNOTSUPP & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  const struct sock_fprog program = {static_cast<unsigned short>(std::size(filter)), filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
}

// A file system without fallocate (where docs/operations.md puts
// --output-dir: NFS, EFS, Filestore, CephFS) takes the file unreserved.
// glibc's posix_fallocate emulated the call there by reading every block,
// which the writer's descriptor, open for writing only, refused (EBADF):
// every job's final weights failed at the end of its training.
// The header is past a 4 KiB block, as a real model's is (GPT-2's, some
// 14 KB): the emulation reads only the blocks the file holds already.
TEST(SafetensorsFileWriterTest, FileSystemWithoutFallocate_WrittenUnreserved) {
  const std::string dir = TestDir();
  const std::vector<NamedTensor> tensors = SampleTensors();
  const SafetensorsMetadata metadata = {{"format", "pt"}, {"padding", std::string(5000, 'x')}};
  ASSERT_TRUE(WriteSafetensors(dir + "/whole.safetensors", tensors, metadata).ok());
  const std::string said = InChild([&dir, &tensors, &metadata]() -> std::string {
    if (!FailFallocate()) return absl::StrCat(kNoSeccomp, strerror(errno));
    if (fallocate(-1, 0, 0, 1) == 0 || errno != EOPNOTSUPP) return "fallocate is not refused";
    const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    absl::StatusOr<std::unique_ptr<SafetensorsFileWriter>> writer = SafetensorsFileWriter::Create(
        dir_fd, "chunked.safetensors", SpecsOf(tensors), 0600, metadata);
    close(dir_fd);
    if (!writer.ok()) return writer.status().ToString();
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Tensor& t = tensors[i].tensor;
      const absl::Status written = (*writer)->Write(i, 0, t.data(), t.numel());
      if (!written.ok()) return written.ToString();
    }
    return (*writer)->Commit().ToString();
  });
  if (absl::StartsWith(said, kNoSeccomp)) GTEST_SKIP() << said;
  ASSERT_EQ(said, "OK");
  EXPECT_EQ(ReadBytes(dir + "/chunked.safetensors"), ReadBytes(dir + "/whole.safetensors"));
  EXPECT_THAT(NamesIn(dir), UnorderedElementsAre("whole.safetensors", "chunked.safetensors"));
}

TEST(SafetensorsFileWriterTest, OutsideATensorOrAfterCommit_RefusedNothingWritten) {
  const std::string dir = TestDir();
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir_fd, 0);
  auto writer = SafetensorsFileWriter::Create(dir_fd, "w", {{"a", {2, 2}}, {"b", {3}}}, 0600);
  close(dir_fd);
  ASSERT_TRUE(writer.ok()) << writer.status();
  const float values[4] = {1, 2, 3, 4};
  EXPECT_EQ((*writer)->Write(1, 1, values, 3).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*writer)->Write(1, -1, values, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*writer)->Write(1, std::numeric_limits<int64_t>::max() - 1, values, 3).code(),
            absl::StatusCode::kInvalidArgument);  // the sum would wrap
  EXPECT_EQ((*writer)->Write(2, 0, values, 1).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*writer)->Write(0, 0, values, 4).ok());
  ASSERT_TRUE((*writer)->Sync().ok());  // synced, not yet under its name
  EXPECT_FALSE(fs::exists(dir + "/w"));
  ASSERT_TRUE((*writer)->Commit().ok());
  EXPECT_EQ((*writer)->Write(0, 0, values, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*writer)->Sync().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*writer)->Commit().code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<SafetensorsContents> read = ReadSafetensors(dir + "/w");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(BitsOf(*read->Find("a")), BitsOf(Tensor::FromVector({2, 2}, {1, 2, 3, 4})));
  EXPECT_EQ(BitsOf(*read->Find("b")), BitsOf(Tensor::Zeros({3})));  // never written: 0
}

// Uploads of different stages write at once (run under TSan): the file is
// the whole write's.
TEST(SafetensorsFileWriterTest, WritesFromSeveralThreads_FileEqualsTheWholeWrite) {
  const std::string dir = TestDir();
  std::vector<NamedTensor> tensors;
  for (int t = 0; t < 4; ++t) {
    std::vector<float> values(1000);
    for (int i = 0; i < 1000; ++i) values[i] = static_cast<float>(t * 1000 + i);
    tensors.push_back({absl::StrCat("t", t), Tensor::FromVector({10, 100}, values)});
  }
  ASSERT_TRUE(WriteSafetensors(dir + "/whole", tensors).ok());
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir_fd, 0);
  auto writer = SafetensorsFileWriter::Create(dir_fd, "threads", SpecsOf(tensors), 0600);
  close(dir_fd);
  ASSERT_TRUE(writer.ok()) << writer.status();
  std::vector<std::thread> threads;
  for (size_t t = 0; t < tensors.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int64_t at = 0; at < 1000; at += 100) {
        EXPECT_TRUE((*writer)->Write(t, at, tensors[t].tensor.data() + at, 100).ok());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE((*writer)->Commit().ok());
  EXPECT_EQ(ReadBytes(dir + "/threads"), ReadBytes(dir + "/whole"));
}

// A writer given up (the job failed or was cancelled) leaves nothing behind;
// bad names are refused before any file exists.
TEST(SafetensorsFileWriterTest, DestroyedUncommittedOrBadNames_NoFileLeft) {
  const std::string dir = TestDir();
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir_fd, 0);
  {
    auto writer = SafetensorsFileWriter::Create(dir_fd, "w", {{"a", {4}}}, 0600);
    ASSERT_TRUE(writer.ok()) << writer.status();
    EXPECT_EQ(NamesIn(dir).size(), 1u);  // its temporary
  }
  EXPECT_TRUE(fs::is_empty(dir));
  for (const std::vector<SafetensorsTensorSpec>& bad :
       std::vector<std::vector<SafetensorsTensorSpec>>{
           {{"", {1}}}, {{"a", {1}}, {"a", {2}}}, {{"__metadata__", {1}}}, {{"a", {2, -1}}}}) {
    EXPECT_EQ(SafetensorsFileWriter::Create(dir_fd, "w", bad, 0600).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  close(dir_fd);
  EXPECT_TRUE(fs::is_empty(dir));
}

// Temporaries of writers that died ("<name>.tmp.<pid>.<n>", unlocked) go;
// a living writer's (locked), other names, other shapes of name, links and
// directories stay, and the living writer still commits.
TEST(RemoveAbandonedTemporariesTest, RemovesOnlyUnlockedTemporariesOfTheName) {
  const std::string dir = TestDir();
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir_fd, 0);
  auto living = SafetensorsFileWriter::Create(dir_fd, "w.safetensors", {{"a", {2}}}, 0600);
  ASSERT_TRUE(living.ok()) << living.status();
  const std::vector<std::string> living_names = NamesIn(dir);
  ASSERT_EQ(living_names.size(), 1u);
  for (const char* stale : {"w.safetensors.tmp.1.0", "w.safetensors.tmp.77.3"}) {
    WriteBytes(dir + "/" + stale, "half a file");
  }
  for (const char* kept :
       {"w.safetensors", "w.safetensors.tmp.1.x", "w.safetensors.tmp.1", "w.safetensors.tmp..2",
        "w.safetensors.tmp.3.", "other.safetensors.tmp.1.0", "w.safetensors.tmp.1.0.bak"}) {
    WriteBytes(dir + "/" + kept, "not a dead writer's temporary");
  }
  WriteBytes(dir + "/target", "a link's target");
  fs::create_symlink(dir + "/target", dir + "/w.safetensors.tmp.5.5");
  fs::create_directory(dir + "/w.safetensors.tmp.6.6");

  EXPECT_THAT(RemoveAbandonedTemporaries(dir_fd, "w.safetensors"),
              UnorderedElementsAre("w.safetensors.tmp.1.0", "w.safetensors.tmp.77.3"));
  EXPECT_THAT(
      NamesIn(dir),
      UnorderedElementsAre(living_names[0], "w.safetensors", "w.safetensors.tmp.1.x",
                           "w.safetensors.tmp.1", "w.safetensors.tmp..2", "w.safetensors.tmp.3.",
                           "other.safetensors.tmp.1.0", "w.safetensors.tmp.1.0.bak", "target",
                           "w.safetensors.tmp.5.5", "w.safetensors.tmp.6.6"));
  const float values[2] = {1, 2};
  ASSERT_TRUE((*living)->Write(0, 0, values, 2).ok());
  ASSERT_TRUE((*living)->Commit().ok());
  living->reset();
  absl::StatusOr<SafetensorsContents> read = ReadSafetensors(dir + "/w.safetensors");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->Find("a")->ToVector(), std::vector<float>({1, 2}));
  // Committed: its temporary is renamed, so nothing of it is left to remove.
  EXPECT_THAT(RemoveAbandonedTemporaries(dir_fd, "w.safetensors"), ::testing::IsEmpty());
  close(dir_fd);
}

// A temporary that another process's living writer holds (its flock; no
// name this process knows) stays; once its lock is gone, the writer is
// dead and the file goes. The lock is taken on a descriptor of its own:
// flock belongs to the open file description, so the cleanup's own open
// cannot take it.
TEST(RemoveAbandonedTemporariesTest, LockedByAnotherWriter_KeptUntilUnlocked) {
  const std::string dir = TestDir();
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir_fd, 0);
  const std::string name = "w.safetensors.tmp.99.1";
  WriteBytes(dir + "/" + name, "another process's upload");
  const int held = open((dir + "/" + name).c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(flock(held, LOCK_EX | LOCK_NB), 0);
  EXPECT_THAT(RemoveAbandonedTemporaries(dir_fd, "w.safetensors"), ::testing::IsEmpty());
  EXPECT_THAT(NamesIn(dir), UnorderedElementsAre(name));
  close(held);  // the writer died
  EXPECT_THAT(RemoveAbandonedTemporaries(dir_fd, "w.safetensors"), UnorderedElementsAre(name));
  EXPECT_TRUE(fs::is_empty(dir));
  close(dir_fd);
}

// A temporary of this process's writer that holds no lock (the moment
// between creating and locking it, or NFS, where flock is a per-process
// POSIX lock that another descriptor of this process would take too) is a
// living writer's all the same: left alone, and the writer commits.
TEST(RemoveAbandonedTemporariesTest, ThisProcessWriterWithoutItsLock_Kept) {
  const std::string dir = TestDir();
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir_fd, 0);
  auto living = SafetensorsFileWriter::Create(dir_fd, "w.safetensors", {{"a", {2}}}, 0600);
  ASSERT_TRUE(living.ok()) << living.status();
  const std::vector<std::string> names = NamesIn(dir);
  ASSERT_EQ(names.size(), 1u);
  // The writer's descriptor, found by the file it has open (device and
  // inode: the test directory's path may pass through links), unlocked.
  struct stat file;
  ASSERT_EQ(stat((dir + "/" + names[0]).c_str(), &file), 0);
  int unlocked = 0;
  for (const fs::directory_entry& e : fs::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(e.path().filename().string());
    struct stat open_file;
    if (fstat(fd, &open_file) == 0 && S_ISREG(open_file.st_mode) &&
        open_file.st_dev == file.st_dev && open_file.st_ino == file.st_ino) {
      ASSERT_EQ(flock(fd, LOCK_UN), 0);
      ++unlocked;
    }
  }
  ASSERT_EQ(unlocked, 1);
  EXPECT_THAT(RemoveAbandonedTemporaries(dir_fd, "w.safetensors"), ::testing::IsEmpty());
  EXPECT_THAT(NamesIn(dir), UnorderedElementsAre(names[0]));
  const float values[2] = {1, 2};
  ASSERT_TRUE((*living)->Write(0, 0, values, 2).ok());
  ASSERT_TRUE((*living)->Commit().ok());
  EXPECT_THAT(NamesIn(dir), UnorderedElementsAre("w.safetensors"));
  close(dir_fd);
}

// Temporary names never repeat, also across processes with the same pid
// (a restarted container's is often 1 again; its first name was
// ".tmp.1.0", the dead one's, and the write failed with EEXIST): one
// process's names here, drawn many times, are all distinct and none is
// the counter's first values.
TEST(SafetensorsFileWriterTest, TemporaryNames_NeverTheSmallNumbersADeadTwinUsed) {
  const std::string dir = TestDir();
  for (int n = 0; n < 4; ++n) {
    WriteBytes(absl::StrCat(dir, "/w.tmp.", getpid(), ".", n), "a dead writer's");
  }
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir_fd, 0);
  std::set<std::string> names;
  for (int i = 0; i < 50; ++i) {
    auto writer = SafetensorsFileWriter::Create(dir_fd, "w", {{"a", {1}}}, 0600);
    ASSERT_TRUE(writer.ok()) << writer.status();
    for (const std::string& name : NamesIn(dir)) names.insert(name);
  }
  close(dir_fd);
  // The 4 planted and 50 distinct writers' names; the writers' are gone.
  EXPECT_EQ(names.size(), 54u);
  EXPECT_EQ(NamesIn(dir).size(), 4u);
}

// A FIFO is refused at once by both readers, not read from until a
// writer comes (which would hang a coordinator's Submit or a worker).
TEST(SafetensorsTest, Fifo_RefusedWithoutBlocking) {
  const std::string path = TestDir() + "/fifo.safetensors";
  unlink(path.c_str());
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  EXPECT_EQ(ReadSafetensors(path).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadSafetensorsShapes(path).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain
