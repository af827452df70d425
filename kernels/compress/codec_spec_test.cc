#include "kernels/compress/codec_spec.h"

#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "kernels/compress/payload.h"

namespace pipetrain {
namespace {

TEST(ParseCodecSpec, ValidSpecs_GiveStagesAndParameters) {
  auto stages = ParseCodecSpec("token_topk:keep=0.5+piecewise:bits=4").value();
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(stages[0].name, "token_topk");
  EXPECT_EQ(stages[0].params.at("keep"), 0.5);
  EXPECT_EQ(stages[1].name, "piecewise");
  EXPECT_EQ(stages[1].params.at("bits"), 4);
  EXPECT_EQ(ParseCodecSpec("fp16").value()[0].name, "fp16");
  EXPECT_EQ(ParseCodecSpec("powersgd:rank=4").value()[0].params.at("rank"), 4);
  EXPECT_EQ(ParseCodecSpec("elem_topk:keep=1").value()[0].params.at("keep"), 1);
  // Plain decimals in every form: a leading dot, an exponent.
  EXPECT_EQ(ParseCodecSpec("elem_topk:keep=.5").value()[0].params.at("keep"), 0.5);
  EXPECT_EQ(ParseCodecSpec("elem_topk:keep=1e-2").value()[0].params.at("keep"), 0.01);
  EXPECT_EQ(ParseCodecSpec("linear:bits=4.").value()[0].params.at("bits"), 4);
}

TEST(ParseCodecSpec, BadSpecs_AreInvalidArgumentNamingTheProblem) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "empty codec spec"},
      {"zstd", "unknown codec \"zstd\""},
      // What the client sent comes back escaped: no control byte reaches a
      // terminal or a log from a refused spec.
      {"\x1b[2J", "unknown codec \"\\x1b[2J\""},
      {"fp16:\nbits=3", "fp16: unknown parameter \"\\nbits\""},
      {"linear", "linear: missing parameter bits"},
      {"linear:bits=1", "linear: bits 1 is out of range 2..16"},
      {"piecewise:bits=12", "piecewise: bits 12 is out of range 1..8"},
      {"piecewise:bits=2.5", "piecewise: bits 2.5 is out of range 1..8 (an integer)"},
      {"powersgd:rank=0", "powersgd: rank 0 is out of range 1..1024"},
      {"powersgd:rank=1025", "powersgd: rank 1025 is out of range 1..1024"},
      {"token_topk:keep=0", "token_topk: keep 0 is out of range (0, 1]"},
      {"elem_topk:keep=1.5", "elem_topk: keep 1.5 is out of range (0, 1]"},
      {"fp16:bits=3", "fp16: unknown parameter \"bits\""},
      {"linear:bits", "linear: parameter \"bits\" is not key=number"},
      {"linear:bits= 4", "linear: parameter \"bits= 4\" is not key=number"},
      {"linear:bits=4 ", "linear: parameter \"bits=4 \" is not key=number"},
      {"linear:bits=0x4", "linear: parameter \"bits=0x4\" is not key=number"},
      {"elem_topk:keep=inf", "elem_topk: parameter \"keep=inf\" is not key=number"},
      {"elem_topk:keep=.", "elem_topk: parameter \"keep=.\" is not key=number"},
      {"elem_topk:keep=1e", "elem_topk: parameter \"keep=1e\" is not key=number"},
      {"linear:bits=-4", "linear: bits -4 is out of range 2..16"},
      {"piecewise:bits=3+fp16", "only token_topk may be followed"},
      {"token_topk:keep=0.5+token_topk:keep=0.5", "only token_topk may be followed"},
      {"token_topk:keep=0.5+fp16+bf16", "only token_topk may be followed"},
      {"linear:bits=3,bits=4", "linear: parameter \"bits\" is given twice"},
      {"linear:bits=3" + std::string(250, '0'), "codec spec of 263 bytes; at most 256"},
  };
  for (const auto& [spec, message] : cases) {
    auto parsed = ParseCodecSpec(spec);
    ASSERT_FALSE(parsed.ok()) << spec;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_NE(parsed.status().message().find(message), std::string::npos)
        << spec << ": " << parsed.status().message();
  }
}

}  // namespace
}  // namespace pipetrain

namespace pipetrain {
namespace {

// Every codec the grammar names builds, reports its spec as its name, and
// round-trips a small tensor to its shape.
TEST(MakeCodec, EverySpec_BuildsARoundTrippingCodec) {
  const Tensor x = Tensor::FromVector({2, 3, 4}, {1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12,
                                                  0.5, 0.25, -0.125, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  for (const std::string spec :
       {"fp16", "bf16", "linear:bits=4", "piecewise:bits=3", "elem_topk:keep=0.5",
        "powersgd:rank=2", "token_topk:keep=0.5", "token_topk:keep=0.5+piecewise:bits=4"}) {
    auto codec = MakeCodec(spec);
    ASSERT_TRUE(codec.ok()) << spec << ": " << codec.status();
    EXPECT_EQ((*codec)->name(), spec);
    CodecState state;
    auto payload = (*codec)->Encode(x, &state);
    ASSERT_TRUE(payload.ok()) << spec << ": " << payload.status();
    EXPECT_EQ(static_cast<int64_t>(payload->size()), (*codec)->EncodedBytes(x.shape())) << spec;
    auto y = (*codec)->Decode(*payload);
    ASSERT_TRUE(y.ok()) << spec << ": " << y.status();
    EXPECT_EQ(y->shape(), x.shape()) << spec;
  }
  EXPECT_EQ(MakeCodec("piecewise:bits=9").status().code(), absl::StatusCode::kInvalidArgument);
}

// Found by fuzz/codec_fuzzer and codec_spec_fuzzer: a payload shape whose
// dims overflow int64 before a trailing 0 (2^62 * 4 * 0) passed the header
// check, and decoding computed its element count with signed overflow
// (fp16 and token_topk hit it first). Every codec now rejects it.
TEST(MakeCodec, EveryCodec_DecodeShapeOverflowingBeforeItsZero_InvalidArgument) {
  const std::pair<const char*, CodecId> codecs[] = {
      {"fp16", CodecId::kFp16},
      {"bf16", CodecId::kBf16},
      {"linear:bits=4", CodecId::kLinear},
      {"piecewise:bits=3", CodecId::kPiecewise},
      {"token_topk:keep=0.5+bf16", CodecId::kTokenTopK},
      {"elem_topk:keep=0.5", CodecId::kElemTopK},
      {"powersgd:rank=2", CodecId::kPowerSgd}};
  for (const auto& [spec, id] : codecs) {
    auto codec = MakeCodec(spec);
    ASSERT_TRUE(codec.ok()) << spec << ": " << codec.status();
    std::string payload;
    WriteHeader(id, {int64_t{1} << 62, 4, 0}, &payload);
    payload.append(64, '\0');  // whatever a body would hold
    auto decoded = (*codec)->Decode(payload);
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_NE(decoded.status().message().find("implausibly large"), std::string::npos)
        << spec << ": " << decoded.status();
  }
}

TEST(MakeQuantizer, OneQuantizerOnly) {
  for (const std::string spec : {"fp16", "bf16", "linear:bits=8", "piecewise:bits=3"}) {
    absl::StatusOr<std::unique_ptr<Codec>> codec = MakeQuantizer(spec);
    ASSERT_TRUE(codec.ok()) << spec << ": " << codec.status();
    EXPECT_EQ((*codec)->name(), spec);
  }
  for (const std::string spec : {"powersgd:rank=4", "token_topk:keep=0.5", "elem_topk:keep=0.1",
                                 "token_topk:keep=0.5+piecewise:bits=3"}) {
    absl::StatusOr<std::unique_ptr<Codec>> codec = MakeQuantizer(spec);
    EXPECT_EQ(codec.status().code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_NE(std::string(codec.status().message()).find("is not one quantizer"),
              std::string::npos)
        << codec.status();
  }
  EXPECT_EQ(MakeQuantizer("linear:bits=99").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain
