#include "worker/train/train_config.h"

#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TrainConfig Small() {
  TrainConfig c;
  c.model.vocab_size = 256;
  c.model.max_seq_len = 64;
  c.model.n_layer = 1;
  c.model.n_head = 2;
  c.model.d_model = 16;
  c.seq_len = 64;
  c.batch_size = 4;
  c.micro_batches = 2;
  return c;
}

// Some kernel sizes are int: a micro-batch whose logits or attention
// scores reach 2^31 values was accepted (vocab 65536 x 32768 tokens made
// an 8 GiB tensor of 2^31 values), and a parameter too. A micro-batch of
// one sequence names seq_len: more micro-batches cannot shrink it.
TEST(ValidateTrainConfigTest, TensorsOf2To31ValuesOrMore_InvalidArgumentNamingTheField) {
  TrainConfig c = Small();
  ASSERT_TRUE(ValidateTrainConfig(c).ok());
  c.model.vocab_size = 65536;
  c.model.max_seq_len = c.seq_len = 32768;
  c.batch_size = c.micro_batches = 1;  // 32768 x 65536 logits = 2^31
  absl::Status s = ValidateTrainConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(s.message(), "seq_len: one sequence of 32768 tokens needs a tensor "
                                            "of 2147483648 elements (the logits), above 2^31 - 1"))
      << s;
  // 65535 columns, padded to 65536 on the GPU; scores 32768^2 x 2 heads = 2^31.
  c.model.vocab_size = 65535;
  EXPECT_TRUE(absl::StartsWith(ValidateTrainConfig(c).message(), "seq_len:"));
  c.model.vocab_size = 65536 - 64;  // 2^31 - 2^21 logits
  c.model.n_head = 1;               // 2^30 scores: fits
  EXPECT_TRUE(ValidateTrainConfig(c).ok()) << ValidateTrainConfig(c);
  c = Small();
  c.model.d_model = 16384;  // 4 d^2 = 2^30
  c.model.n_head = 16;
  EXPECT_TRUE(ValidateTrainConfig(c).ok()) << ValidateTrainConfig(c);
}

// 32 heads at an 8K context, one sequence a micro-batch: the layer's
// attention scores are 32 x 8192^2 = 2^31 values, but each of 8 tensor
// ranks holds its 4 heads' (2^28). The bound counted the whole layer's
// whatever the ranks, and named micro_batches, which could not grow.
TEST(ValidateTrainConfigTest, TensorParallel_BoundsOneRanksShare) {
  TrainConfig c;
  c.model.vocab_size = 32000;
  c.model.max_seq_len = c.seq_len = 8192;
  c.model.n_layer = 16;
  c.model.n_head = 32;
  c.model.d_model = 4096;
  c.batch_size = c.micro_batches = 8;
  c.tensor_parallel = 8;
  EXPECT_TRUE(ValidateTrainConfig(c).ok()) << ValidateTrainConfig(c);
  const LargestTensors split = LargestTensorElements(c.model, 1, c.seq_len, 8);
  EXPECT_EQ(split.activation, 268435456.0);  // 4 heads x 8192^2
  EXPECT_STREQ(split.activation_name, "attention scores");
  c.tensor_parallel = 1;
  absl::Status s = ValidateTrainConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(s.message()),
            "seq_len: one sequence of 8192 tokens needs a tensor of 2147483648 elements (the "
            "attention scores), above 2^31 - 1, and a micro-batch is already one sequence; use a "
            "shorter seq_len")
      << s;
  c.micro_batches = 4;  // two sequences: more micro-batches would do
  EXPECT_TRUE(absl::StartsWith(ValidateTrainConfig(c).message(),
                               "micro_batches: a micro-batch of 2 sequences of 8192 tokens needs "
                               "a tensor of 4294967296 elements (the attention scores)"))
      << ValidateTrainConfig(c);
  // The residual stream [tokens, d_model] is whole on every rank.
  const LargestTensors wide = LargestTensorElements(c.model, 64, 512, 32);
  EXPECT_EQ(wide.activation, 64.0 * 512 * 4096);
  EXPECT_STREQ(wide.activation_name, "residual stream");
  EXPECT_FALSE(wide.activation_split);
  c.tensor_parallel = 0;
  EXPECT_TRUE(absl::StartsWith(ValidateTrainConfig(c).message(), "tensor_parallel: must be >= 1"));
}

// The job spec and the flags refuse infinite optimizer settings; the one
// validation routine both rely on did not (an infinite lr passed).
TEST(ValidateTrainConfigTest, InfiniteOptimizerSettings_InvalidArgumentNamingTheField) {
  const float inf = std::numeric_limits<float>::infinity();
  const struct {
    const char* field;
    void (*set)(TrainConfig&, float);
  } cases[] = {
      {"lr", [](TrainConfig& c, float v) { c.adam.lr = c.min_lr = v; }},
      {"eps", [](TrainConfig& c, float v) { c.adam.eps = v; }},
      {"weight_decay", [](TrainConfig& c, float v) { c.adam.weight_decay = v; }},
      {"grad_clip", [](TrainConfig& c, float v) { c.grad_clip = v; }},
  };
  for (const auto& k : cases) {
    TrainConfig c = Small();
    k.set(c, inf);
    const absl::Status s = ValidateTrainConfig(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << k.field;
    EXPECT_TRUE(absl::StartsWith(s.message(), absl::StrCat(k.field, ":"))) << s;
  }
}

TEST(CheckWeightsFitMemoryTest, SixteenBytesAParameterAgainstTheLimit) {
  const GptConfig model = Small().model;
  const int64_t need = 16 * CountParameters(model);
  EXPECT_TRUE(CheckWeightsFitMemory(model, need).ok());
  EXPECT_TRUE(CheckWeightsFitMemory(model, 0).ok());  // no limit
  const absl::Status s = CheckWeightsFitMemory(model, need - 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(s.message(), "GiB for weights, gradients and AdamW moments alone"))
      << s;
}

// A model small enough to count by hand: 2 layers, 2 heads, d_model 8, a
// vocabulary of 16, 4 tokens a sequence, micro-batches of 2 sequences.
TrainConfig Tiny() {
  TrainConfig c;
  c.model.vocab_size = 16;
  c.model.max_seq_len = 4;
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.d_model = 8;
  c.seq_len = 4;
  c.batch_size = 4;
  c.micro_batches = 2;
  return c;
}

// Tiny()'s micro-batch, B = 2 sequences of T = 4 tokens (8 tokens), in
// floats, term by term as train_config.h lists them. An attention layer:
// per token its input, LayerNorm output, q, k, v and the heads' output
// (6d = 48) and the LayerNorm's mean and rstd (2), per sequence and head
// the T^2 = 16 probabilities: 8 x 50 + 2 x 2 x 16 = 464. An MLP: input,
// LayerNorm output and both 4d hidden layers (10d = 80) and the
// statistics (2): 8 x 82 = 656. The head: input, LayerNorm output (2d),
// the statistics (2) and the vocabulary's 16 probabilities: 8 x 34 = 272.
// The larger pass's temporaries: the head's logit gradient and two d-wide
// gradients (8 x (16 + 16) = 256), or an attention backward's y, datt,
// dqkv, dln and dx (7d per token) and a [T, T] scratch (8 x 56 + 16 =
// 464). 2 x (464 + 656) + 272 + 464 = 2976 floats.
constexpr double kTinyActivationBytes = 4 * 2976.0;  // 11904
// wte 16 x 8 + wpe 4 x 8, each layer's 12 d^2 + 13 d = 872, ln_f 2d.
constexpr int64_t kTinyParameters = 128 + 32 + 2 * 872 + 16;  // 1920

TEST(BackwardActivationBytesTest, TinyModel_TheDocumentedTermsCountedByHand) {
  const TrainConfig c = Tiny();
  EXPECT_EQ(BackwardActivationBytes(c.model, 2, c.seq_len), kTinyActivationBytes);
  // Twice the sequences: every term but the [T, T] scratch doubles, and
  // the attention backward's temporaries stay the larger.
  EXPECT_EQ(BackwardActivationBytes(c.model, 4, c.seq_len), 2 * kTinyActivationBytes - 4 * 16);
}

// One micro-batch (batch_size / micro_batches sequences) on top of the
// weights' 16 bytes a parameter: accepted at exactly that many bytes,
// refused a byte under, naming both sizes and the fields that shrink it.
TEST(CheckActivationsFitMemoryTest, WeightsPlusOneMicroBatch_JustOverAndJustUnderTheLimit) {
  const TrainConfig c = Tiny();
  ASSERT_EQ(CountParameters(c.model), kTinyParameters);
  const int64_t need = 16 * kTinyParameters + static_cast<int64_t>(kTinyActivationBytes);
  EXPECT_EQ(need, 42624);
  EXPECT_TRUE(CheckActivationsFitMemory(c, need).ok());
  EXPECT_TRUE(CheckActivationsFitMemory(c, 0).ok());  // no limit
  const absl::Status s = CheckActivationsFitMemory(c, need - 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StartsWith(s.message(),
                               "a micro-batch of 2 sequences of 4 tokens keeps 0.00 GiB of "
                               "activations for its backward"))
      << s;
  EXPECT_TRUE(absl::EndsWith(s.message(),
                             "use a smaller batch_size, more micro_batches or a shorter seq_len"))
      << s;
  // The same batch in one micro-batch keeps twice the activations.
  TrainConfig whole = c;
  whole.micro_batches = 1;
  EXPECT_EQ(CheckActivationsFitMemory(whole, need).code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace pipetrain
