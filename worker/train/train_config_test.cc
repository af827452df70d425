#include "worker/train/train_config.h"

#include <limits>

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

// The kernels index tensors with int: a micro-batch whose logits or
// attention scores reach 2^31 values was accepted (vocab 65536 x 32768
// tokens made an 8 GiB tensor of 2^31 values), and a parameter too.
TEST(ValidateTrainConfigTest, TensorsOf2To31ValuesOrMore_InvalidArgumentNamingTheField) {
  TrainConfig c = Small();
  ASSERT_TRUE(ValidateTrainConfig(c).ok());
  c.model.vocab_size = 65536;
  c.model.max_seq_len = c.seq_len = 32768;
  c.batch_size = c.micro_batches = 1;  // 32768 x 65536 logits = 2^31
  absl::Status s = ValidateTrainConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(s.message(), "micro_batches: a micro-batch of 1 sequences of 32768"))
      << s;
  c.model.vocab_size = 65535;  // 2^31 - 32768 logits; scores 32768^2 x 2 heads = 2^31
  EXPECT_TRUE(absl::StartsWith(ValidateTrainConfig(c).message(), "micro_batches:"));
  c.model.n_head = 1;  // 2^30 scores: fits
  EXPECT_TRUE(ValidateTrainConfig(c).ok()) << ValidateTrainConfig(c);
  c = Small();
  c.model.d_model = 16384;  // 4 d^2 = 2^30
  c.model.n_head = 16;
  EXPECT_TRUE(ValidateTrainConfig(c).ok()) << ValidateTrainConfig(c);
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

}  // namespace
}  // namespace pipetrain
