#include "worker/model/gpt_config.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace pipetrain {

absl::Status ValidateGptConfig(const GptConfig& c) {
  const std::pair<const char*, int> sizes[] = {{"vocab_size", c.vocab_size},
                                               {"max_seq_len", c.max_seq_len},
                                               {"n_layer", c.n_layer},
                                               {"n_head", c.n_head},
                                               {"d_model", c.d_model}};
  for (const auto& [field, value] : sizes) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat(field, " must be >= 1, got ", value));
    }
  }
  if (c.d_model % c.n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat("n_head (", c.n_head,
                                                   ") must divide d_model (", c.d_model, ")"));
  }
  return absl::OkStatus();
}

int NumUnits(const GptConfig& config) { return 2 * config.n_layer + 2; }

UnitKind UnitKindAt(const GptConfig& config, int index) {
  PT_CHECK(index >= 0 && index < NumUnits(config)) << "unit index " << index;
  if (index == 0) return UnitKind::kEmbed;
  if (index == NumUnits(config) - 1) return UnitKind::kHead;
  return index % 2 == 1 ? UnitKind::kAttention : UnitKind::kMlp;
}

int UnitLayer(const GptConfig& config, int index) {
  UnitKind kind = UnitKindAt(config, index);
  if (kind == UnitKind::kEmbed || kind == UnitKind::kHead) return -1;
  return (index - 1) / 2;
}

std::string UnitName(const GptConfig& config, int index) {
  switch (UnitKindAt(config, index)) {
    case UnitKind::kEmbed: return "embed";
    case UnitKind::kHead: return "head";
    case UnitKind::kAttention: return absl::StrCat("attn_", UnitLayer(config, index));
    case UnitKind::kMlp: return absl::StrCat("mlp_", UnitLayer(config, index));
  }
  return "";
}

int64_t CountParameters(const GptConfig& c) {
  const int64_t d = c.d_model;
  const int64_t embed = int64_t{c.vocab_size} * d + int64_t{c.max_seq_len} * d;
  const int64_t attn = 2 * d + d * 3 * d + 3 * d + d * d + d;
  const int64_t mlp = 2 * d + d * 4 * d + 4 * d + 4 * d * d + d;
  return embed + c.n_layer * (attn + mlp) + 2 * d;  // + ln_f
}

std::vector<ParameterShape> UnitParameterShapes(const GptConfig& c, int index) {
  const int64_t d = c.d_model, vocab = c.vocab_size;
  // split_dim as the units' AddParameter calls split: kRows cuts dimension
  // 0, kColumns the last (1 for a weight, 0 for a bias), kNone none (-1).
  switch (UnitKindAt(c, index)) {
    case UnitKind::kEmbed:
      return {{"wte.weight", {vocab, d}, 0}, {"wpe.weight", {int64_t{c.max_seq_len}, d}}};
    case UnitKind::kAttention: {
      const std::string p = absl::StrCat("h.", UnitLayer(c, index), ".");
      return {{p + "ln_1.weight", {d}},
              {p + "ln_1.bias", {d}},
              {p + "attn.c_attn.weight", {d, 3 * d}, 1},
              {p + "attn.c_attn.bias", {3 * d}, 0},
              {p + "attn.c_proj.weight", {d, d}, 0},
              {p + "attn.c_proj.bias", {d}}};
    }
    case UnitKind::kMlp: {
      const std::string p = absl::StrCat("h.", UnitLayer(c, index), ".");
      return {{p + "ln_2.weight", {d}},
              {p + "ln_2.bias", {d}},
              {p + "mlp.c_fc.weight", {d, 4 * d}, 1},
              {p + "mlp.c_fc.bias", {4 * d}, 0},
              {p + "mlp.c_proj.weight", {4 * d, d}, 0},
              {p + "mlp.c_proj.bias", {d}}};
    }
    case UnitKind::kHead:
      return {{"ln_f.weight", {d}}, {"ln_f.bias", {d}}, {"wte.weight", {vocab, d}, 0}};
  }
  return {};
}

absl::Status CheckFitsParameter(const std::string& name, const std::vector<int64_t>& want,
                                const std::vector<int64_t>& found) {
  if (found == want) return absl::OkStatus();
  const std::string mismatch =
      absl::StrCat("tensor '", name, "' has shape [", absl::StrJoin(found, ", "),
                   "] but the model expects [", absl::StrJoin(want, ", "), "]");
  const bool fewer_rows = name == kTokenEmbeddingName && want.size() == 2 && found.size() == 2 &&
                          found[1] == want[1] && found[0] < want[0];
  if (!fewer_rows) return absl::InvalidArgumentError(mismatch);
  const int64_t padding = want[0] - found[0];
  if (padding < kVocabularyPaddingRowsBelow && padding < found[0]) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(mismatch, ": a padded vocabulary adds fewer than ", kVocabularyPaddingRowsBelow,
                   " rows, and fewer than the file has; is it this model's tokenizer's?"));
}

}  // namespace pipetrain
