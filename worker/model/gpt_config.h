// GPT-2 model shape and the unit list that partitions it (DESIGN.md §3).
//
// A model of n_layer blocks has 2 * n_layer + 2 units, in pipeline order:
//   0: embed          token + position embedding
//   1 + 2i: attn_i    LayerNorm -> causal self-attention -> residual
//   2 + 2i: mlp_i     LayerNorm -> MLP (4x, GELU tanh) -> residual
//   2L + 1: head      final LayerNorm -> LM head tied to wte -> mean cross-entropy
// Units are the granularity at which planners cut the model.
#ifndef PIPETRAIN_WORKER_MODEL_GPT_CONFIG_H_
#define PIPETRAIN_WORKER_MODEL_GPT_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace pipetrain {

struct GptConfig {
  int vocab_size = 256;    // byte-level by default
  int max_seq_len = 64;    // rows of the position embedding wpe
  int n_layer = 2;
  int n_head = 4;
  int d_model = 128;
};

// INVALID_ARGUMENT naming the field when a size is < 1 or n_head does not
// divide d_model.
absl::Status ValidateGptConfig(const GptConfig& config);

enum class UnitKind { kEmbed, kAttention, kMlp, kHead };
// Attention and MLP: the units of a transformer block.
inline bool IsBlockUnitKind(UnitKind kind) {
  return kind == UnitKind::kAttention || kind == UnitKind::kMlp;
}

int NumUnits(const GptConfig& config);
// Requires 0 <= index < NumUnits(config).
UnitKind UnitKindAt(const GptConfig& config, int index);
// The block a unit belongs to (-1 for embed and head).
int UnitLayer(const GptConfig& config, int index);
// "embed", "attn_3", "mlp_3", "head".
std::string UnitName(const GptConfig& config, int index);

// Trainable parameters of the whole model (wte counted once).
int64_t CountParameters(const GptConfig& config);

// One parameter of a unit as the units declare it: its Hugging Face GPT-2
// name and shape (Conv1D weights (in, out)), and the dimension that 1-D
// tensor parallelism (tensor_parallel.h) cuts into T equal pieces, one per
// rank: 0 for ParameterShard::Split::kRows, the last for kColumns, -1 for a
// tensor every rank holds whole. A rank's shard is `shape` with
// shape[split_dim] / T (units_test.cc builds the units to check it).
struct ParameterShape {
  std::string name;
  std::vector<int64_t> shape;
  int split_dim = -1;
};
// The parameters unit `index` holds, in the unit's parameters() order,
// without creating it (the coordinator checks uploads against these; the
// planner prices a tensor rank's shards with split_dim). The head lists its
// tied copy of wte.weight. Requires 0 <= index < NumUnits(config).
std::vector<ParameterShape> UnitParameterShapes(const GptConfig& config, int index);

// The token embedding, whose rows a padded vocabulary adds to.
inline constexpr char kTokenEmbeddingName[] = "wte.weight";

// The most rows a padded vocabulary adds to a weights file's token
// embedding, plus one: Megatron pads to a multiple of 128 x the tensor
// ranks, at most 64 ranks (spec/job_spec.h's kMaxTensorParallel) here.
inline constexpr int64_t kVocabularyPaddingRowsBelow = 128 * 64;

// Whether a weights file's tensor of shape `found` can fill parameter
// `name` of shape `want`: OK when the shapes are equal, and for
// kTokenEmbeddingName also when only its rows differ and the model has
// more, by fewer than kVocabularyPaddingRowsBelow and fewer than the file
// has (a vocabulary padded to a multiple of the tensor ranks, as Megatron
// pads it: Hugging Face's 50257 rows into 50304; FitToParameter in
// weights_io.h fills the rest with zeros). Why bounded: a model trained
// from a file of far fewer rows (none, or a byte-level 256 into 50304)
// would start with most tokens' embeddings zero, unseen. Else
// INVALID_ARGUMENT "tensor 'NAME' has shape [..] but the model expects
// [..]", and for rows beyond those bounds why they are too few.
absl::Status CheckFitsParameter(const std::string& name, const std::vector<int64_t>& want,
                                const std::vector<int64_t>& found);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_GPT_CONFIG_H_
