#include "worker/model/weights_io.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "gtest/gtest.h"
#include "worker/model/gpt_model.h"

namespace pipetrain {
namespace {

GptConfig SmallConfig() {
  GptConfig c;
  c.vocab_size = 13;
  c.max_seq_len = 7;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 8;
  return c;
}

std::string TempPath(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

void ExpectSameValues(GptModel& a, GptModel& b) {
  ASSERT_EQ(a.parameters().size(), b.parameters().size());
  for (size_t i = 0; i < a.parameters().size(); ++i) {
    EXPECT_EQ(a.parameters()[i]->value.ToVector(), b.parameters()[i]->value.ToVector())
        << a.parameters()[i]->name;
  }
}

TEST(WeightsIoTest, SaveThenLoad_GivesIdenticalTensors) {
  auto source = GptModel::Create(SmallConfig(), 1).value();
  auto target = GptModel::Create(SmallConfig(), 2).value();
  const std::string path = TempPath("roundtrip.safetensors");
  ASSERT_TRUE(SaveWeights(path, source->parameters()).ok());
  ASSERT_TRUE(LoadWeights(path, target->parameters()).ok());
  ExpectSameValues(*source, *target);
  // The tied head copy follows, since it is the same buffer.
  Parameter* head_wte = target->unit(target->num_units() - 1).parameters()[2];
  EXPECT_EQ(head_wte->value.ToVector(), source->FindParameter("wte.weight")->value.ToVector());
}

TEST(WeightsIoTest, Load_HuggingFacePrefixAndExtraBuffers_Accepted) {
  auto source = GptModel::Create(SmallConfig(), 1).value();
  std::vector<NamedTensor> tensors;
  for (const NamedTensor& t : ParameterValues(source->parameters())) {
    tensors.push_back({"transformer." + t.name, t.tensor});
  }
  tensors.push_back({"h.0.attn.bias", Tensor::Zeros({1, 1, 7, 7})});  // HF causal mask
  tensors.push_back({"lm_head.weight", source->FindParameter("wte.weight")->value});
  const std::string path = TempPath("hf.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  auto target = GptModel::Create(SmallConfig(), 2).value();
  ASSERT_TRUE(LoadWeights(path, target->parameters()).ok());
  ExpectSameValues(*source, *target);
}

// A file holding a parameter under both names: which to load is not
// guessed (the plain name won silently), and nothing changes.
TEST(WeightsIoTest, Load_BothNameForms_RefusedChangesNothing) {
  auto source = GptModel::Create(SmallConfig(), 1).value();
  std::vector<NamedTensor> tensors = ParameterValues(source->parameters());
  tensors.push_back({"transformer.ln_f.bias", Tensor::Filled({8}, 7.0f)});
  const std::string path = TempPath("both.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  auto target = GptModel::Create(SmallConfig(), 2).value();
  auto before = GptModel::Create(SmallConfig(), 2).value();
  absl::Status status = LoadWeights(path, target->parameters());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), path +
                                  ": holds both 'ln_f.bias' and 'transformer.ln_f.bias': which "
                                  "one to load is ambiguous; keep one");
  ExpectSameValues(*before, *target);
}

TEST(WeightsIoTest, Load_MissingTensor_NamesItAndChangesNothing) {
  auto source = GptModel::Create(SmallConfig(), 1).value();
  std::vector<NamedTensor> tensors;
  for (const NamedTensor& t : ParameterValues(source->parameters())) {
    if (t.name != "h.1.mlp.c_fc.bias") tensors.push_back(t);
  }
  const std::string path = TempPath("missing.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  auto target = GptModel::Create(SmallConfig(), 2).value();
  auto before = GptModel::Create(SmallConfig(), 2).value();
  absl::Status status = LoadWeights(path, target->parameters());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), path + ": missing tensor 'h.1.mlp.c_fc.bias' (shape [32])");
  ExpectSameValues(*target, *before);  // all or nothing
}

// A diverged run's file: a NaN in a position row no step reads (past
// seq_len) would train with finite losses and end with NaN weights, so it
// is refused at load, naming the tensor and element; nothing is changed.
TEST(WeightsIoTest, Load_NanOrInfinity_NamesTheTensorAndChangesNothing) {
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    auto source = GptModel::Create(SmallConfig(), 1).value();
    Parameter* wpe = nullptr;
    for (Parameter* p : source->parameters()) {
      if (p->name == "wpe.weight") wpe = p;
    }
    ASSERT_NE(wpe, nullptr);
    wpe->value[6 * 8 + 3] = bad;  // the last position's row
    const std::string path = TempPath("diverged.safetensors");
    ASSERT_TRUE(SaveWeights(path, source->parameters()).ok());
    auto target = GptModel::Create(SmallConfig(), 2).value();
    auto before = GptModel::Create(SmallConfig(), 2).value();
    absl::Status status = LoadWeights(path, target->parameters());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message(), path + ": tensor 'wpe.weight' holds " +
                                    (std::isnan(bad) ? "NaN" : "an infinity") +
                                    " at element 51: weights of a diverged run cannot start one");
    ExpectSameValues(*target, *before);
  }
}

TEST(WeightsIoTest, CheckParametersFinite_NamesTheFirstParameterAndElement) {
  auto model = GptModel::Create(SmallConfig(), 1).value();
  std::vector<Parameter> host = HostParameterCopies(nullptr, model->parameters());
  EXPECT_TRUE(CheckParametersFinite(host).ok());
  host.back().value[2] = std::numeric_limits<float>::infinity();
  absl::Status status = CheckParametersFinite(host);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(), host.back().name + " holds an infinity at element 2");
  host[1].value[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(CheckParametersFinite(host).message(), host[1].name + " holds NaN at element 0");
}

TEST(WeightsIoTest, Load_WrongShape_NamesTensorAndBothShapes) {
  GptConfig wider = SmallConfig();
  wider.max_seq_len = 9;
  auto source = GptModel::Create(wider, 1).value();
  const std::string path = TempPath("shape.safetensors");
  ASSERT_TRUE(SaveWeights(path, source->parameters()).ok());
  auto target = GptModel::Create(SmallConfig(), 2).value();
  absl::Status status = LoadWeights(path, target->parameters());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("tensor 'wpe.weight' has shape [9, 8] but the model "
                                  "expects [7, 8]"),
            std::string::npos)
      << status;
}

// A vocabulary padded for tensor ranks (Megatron's way: 50257 -> 50304)
// takes a file of the unpadded one: its rows first, zeros after; every
// other tensor as it is. Only the token embedding, and only more rows.
TEST(WeightsIoTest, Load_PaddedVocabulary_TakesTheFilesRowsThenZeros) {
  auto source = GptModel::Create(SmallConfig(), 1).value();  // vocab 13
  const std::string path = TempPath("unpadded.safetensors");
  ASSERT_TRUE(SaveWeights(path, source->parameters()).ok());
  GptConfig padded = SmallConfig();
  padded.vocab_size = 16;
  auto target = GptModel::Create(padded, 2).value();
  ASSERT_TRUE(LoadWeights(path, target->parameters()).ok());
  const std::vector<float> file_rows = source->FindParameter("wte.weight")->value.ToVector();
  const std::vector<float> wte = target->FindParameter("wte.weight")->value.ToVector();
  ASSERT_EQ(wte.size(), 16u * 8);
  EXPECT_EQ(std::vector<float>(wte.begin(), wte.begin() + 13 * 8), file_rows);
  EXPECT_EQ(std::vector<float>(wte.begin() + 13 * 8, wte.end()), std::vector<float>(3 * 8, 0.0f));
  for (Parameter* p : target->parameters()) {
    if (p->name == "wte.weight") continue;
    EXPECT_EQ(p->value.ToVector(), source->FindParameter(p->name)->value.ToVector()) << p->name;
  }
  // Fewer rows than the file, another width, or another tensor: refused.
  GptConfig smaller = SmallConfig();
  smaller.vocab_size = 12;
  auto small = GptModel::Create(smaller, 2).value();
  EXPECT_EQ(LoadWeights(path, small->parameters()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckFitsParameter("wte.weight", {16, 8}, {13, 8}).ok());
  EXPECT_TRUE(CheckFitsParameter("wte.weight", {13, 8}, {13, 8}).ok());
  // Padding is fewer rows than the file has, and than Megatron ever adds:
  // a file of none, or of a byte-level vocabulary, would leave most rows
  // zero.
  EXPECT_TRUE(CheckFitsParameter("wte.weight", {50304, 8}, {50257, 8}).ok());
  EXPECT_TRUE(CheckFitsParameter("wte.weight", {57344, 8}, {50257, 8}).ok());  // 64 ranks
  EXPECT_TRUE(CheckFitsParameter("wte.weight", {25, 8}, {13, 8}).ok());
  EXPECT_EQ(CheckFitsParameter("wte.weight", {16, 8}, {0, 8}).message(),
            "tensor 'wte.weight' has shape [0, 8] but the model expects [16, 8]: a padded "
            "vocabulary adds fewer than 8192 rows, and fewer than the file has; is it this "
            "model's tokenizer's?");
  EXPECT_EQ(CheckFitsParameter("wte.weight", {26, 8}, {13, 8}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckFitsParameter("wte.weight", {50304, 8}, {256, 8}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckFitsParameter("wte.weight", {70000, 8}, {60000, 8}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckFitsParameter("wte.weight", {16, 8}, {13, 4}).message(),
            "tensor 'wte.weight' has shape [13, 4] but the model expects [16, 8]");
  // Fewer rows fit only the tied embedding, and only as a matrix.
  EXPECT_EQ(CheckFitsParameter("wpe.weight", {9, 8}, {7, 8}).message(),
            "tensor 'wpe.weight' has shape [7, 8] but the model expects [9, 8]");
  EXPECT_EQ(CheckFitsParameter("wte.weight", {16}, {13}).message(),
            "tensor 'wte.weight' has shape [13] but the model expects [16]");
}

TEST(WeightsIoTest, Load_MissingFile_IsNotFound) {
  auto target = GptModel::Create(SmallConfig(), 2).value();
  absl::Status status = LoadWeights(TempPath("nope.safetensors"), target->parameters());
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(status.message().find("nope.safetensors"), std::string::npos);
}

}  // namespace
}  // namespace pipetrain
