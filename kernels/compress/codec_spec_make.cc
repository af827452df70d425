// MakeCodec (codec_spec.h): from a parsed spec to the codec objects.
#include "absl/strings/str_cat.h"
#include "common/echo_input.h"
#include "common/status_macros.h"
#include "kernels/compress/codec_spec.h"
#include "kernels/compress/elem_topk_codec.h"
#include "kernels/compress/fp16_codec.h"
#include "kernels/compress/linear_codec.h"
#include "kernels/compress/piecewise_codec.h"
#include "kernels/compress/powersgd_codec.h"
#include "kernels/compress/token_topk_codec.h"

namespace pipetrain {
namespace {

absl::StatusOr<std::unique_ptr<Codec>> MakeStage(const CodecStage& s,
                                                 std::unique_ptr<Codec> inner) {
  auto param = [&](const char* key) { return s.params.at(key); };
  if (s.name == "fp16") return MakeFp16Codec();
  if (s.name == "bf16") return MakeBf16Codec();
  if (s.name == "linear") return MakeLinearCodec(static_cast<int>(param("bits")));
  if (s.name == "piecewise") return MakePiecewiseCodec(static_cast<int>(param("bits")));
  if (s.name == "elem_topk") return MakeElemTopKCodec(param("keep"));
  if (s.name == "powersgd") return MakePowerSgdCodec(static_cast<int>(param("rank")));
  if (s.name == "token_topk") {
    ASSIGN_OR_RETURN(std::unique_ptr<TokenTopKCodec> codec,
                     MakeTokenTopKCodec(param("keep"), std::move(inner)));
    return std::unique_ptr<Codec>(std::move(codec));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown codec \"", EchoInput(s.name), "\""));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(const std::string& spec) {
  ASSIGN_OR_RETURN(std::vector<CodecStage> stages, ParseCodecSpec(spec));
  std::unique_ptr<Codec> inner;
  if (stages.size() == 2) {
    ASSIGN_OR_RETURN(inner, MakeStage(stages[1], nullptr));
  }
  return MakeStage(stages[0], std::move(inner));
}

absl::StatusOr<std::unique_ptr<Codec>> MakeQuantizer(const std::string& spec) {
  ASSIGN_OR_RETURN(std::vector<CodecStage> stages, ParseCodecSpec(spec));
  const std::string& kind = stages[0].name;
  if (stages.size() != 1 ||
      (kind != "fp16" && kind != "bf16" && kind != "linear" && kind != "piecewise")) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", spec.substr(0, 64),
                     "\" is not one quantizer (fp16, bf16, linear:bits=N, piecewise:bits=N)"));
  }
  return MakeStage(stages[0], nullptr);
}

}  // namespace pipetrain
