// ParseCodecSpec (codec_spec.h): the grammar and parameter ranges.
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/echo_input.h"
#include "kernels/compress/codec_spec.h"

namespace pipetrain {
namespace {

struct ParamRule {
  std::string name;
  double min, max;
  bool integer;
  bool required;
};

// The parameters each codec takes.
const std::map<std::string, std::vector<ParamRule>>& Rules() {
  static const auto* rules = new std::map<std::string, std::vector<ParamRule>>{
      {"fp16", {}},
      {"bf16", {}},
      {"linear", {{"bits", 2, 16, true, true}}},
      {"piecewise", {{"bits", 1, 8, true, true}}},
      {"elem_topk", {{"keep", 0, 1, false, true}}},
      {"token_topk", {{"keep", 0, 1, false, true}}},
      {"powersgd", {{"rank", 1, kMaxSpecPowerSgdRank, true, true}}},
  };
  return *rules;
}

// A plain decimal number: an optional '-', digits with at most one '.',
// and an optional exponent. absl::SimpleAtod alone would also take
// surrounding spaces, hex ("0x8") and "inf", and the spec, stored as sent,
// would then not say plainly what was meant.
bool PlainDecimal(const std::string& text, double* value) {
  size_t i = text.empty() || text[0] != '-' ? 0 : 1;
  bool digits = false, dot = false;
  for (; i < text.size() && text[i] != 'e' && text[i] != 'E'; ++i) {
    if (text[i] == '.' && !dot) {
      dot = true;
    } else if (text[i] >= '0' && text[i] <= '9') {
      digits = true;
    } else {
      return false;
    }
  }
  if (!digits) return false;
  if (i < text.size()) {  // the exponent
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    if (i == text.size()) return false;
    for (; i < text.size(); ++i) {
      if (text[i] < '0' || text[i] > '9') return false;
    }
  }
  return absl::SimpleAtod(text, value);
}

absl::StatusOr<CodecStage> ParseStage(const std::string& text) {
  const std::vector<std::string> parts = absl::StrSplit(text, absl::MaxSplits(':', 1));
  CodecStage stage;
  stage.name = parts[0];
  auto rules = Rules().find(stage.name);
  if (rules == Rules().end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown codec \"", EchoInput(stage.name),
                     "\"; known: fp16, bf16, linear, piecewise, elem_topk, token_topk, powersgd"));
  }
  if (parts.size() == 2) {
    for (const std::string& kv : std::vector<std::string>(absl::StrSplit(parts[1], ','))) {
      const std::vector<std::string> pair = absl::StrSplit(kv, absl::MaxSplits('=', 1));
      double value = 0;
      if (pair.size() != 2 || !PlainDecimal(pair[1], &value)) {
        return absl::InvalidArgumentError(
            absl::StrCat(stage.name, ": parameter \"", EchoInput(kv), "\" is not key=number"));
      }
      if (!stage.params.emplace(pair[0], value).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(stage.name, ": parameter \"", EchoInput(pair[0]), "\" is given twice"));
      }
    }
  }
  for (const auto& [key, value] : stage.params) {
    const ParamRule* rule = nullptr;
    for (const ParamRule& r : rules->second) rule = r.name == key ? &r : rule;
    if (rule == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(stage.name, ": unknown parameter \"", EchoInput(key), "\""));
    }
    const bool keep = key == "keep";  // (0, 1]: 0 itself is out
    if (!std::isfinite(value) || value > rule->max || value < rule->min ||
        (keep && value <= 0) || (rule->integer && value != std::floor(value))) {
      return absl::InvalidArgumentError(absl::StrCat(
          stage.name, ": ", key, " ", value, " is out of range ", keep ? "(" : "",
          rule->min, keep ? ", " : "..", rule->max, keep ? "]" : "",
          rule->integer ? " (an integer)" : ""));
    }
  }
  for (const ParamRule& r : rules->second) {
    if (r.required && !stage.params.count(r.name)) {
      return absl::InvalidArgumentError(absl::StrCat(stage.name, ": missing parameter ", r.name));
    }
  }
  return stage;
}

}  // namespace

absl::StatusOr<std::vector<CodecStage>> ParseCodecSpec(const std::string& spec) {
  if (spec.empty()) return absl::InvalidArgumentError("empty codec spec");
  // Bounded before anything quotes it: specs come from job specs and from
  // peers' frames (the longest valid one is some 40 bytes).
  if (spec.size() > kMaxCodecSpecBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec spec of ", spec.size(), " bytes; at most ", kMaxCodecSpecBytes));
  }
  std::vector<CodecStage> stages;
  for (const std::string& text : std::vector<std::string>(absl::StrSplit(spec, '+'))) {
    absl::StatusOr<CodecStage> stage = ParseStage(text);
    if (!stage.ok()) return stage.status();
    stages.push_back(*std::move(stage));
  }
  if (stages.size() > 2 || (stages.size() == 2 && stages[0].name != "token_topk") ||
      (stages.size() == 2 && stages[1].name == "token_topk")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "codec spec \"", spec, "\": only token_topk may be followed by one value codec "
        "(e.g. token_topk:keep=0.5+piecewise:bits=4)"));
  }
  return stages;
}

}  // namespace pipetrain
