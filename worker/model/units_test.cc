// Finite-difference gradient checks of every unit kind, plus the unit
// contracts the pipeline relies on (recompute, deterministic init, names).
#include <algorithm>
#include <cmath>
#include <memory>
#include <set>

#include "common/philox.h"
#include "common/testing/gradient_check.h"
#include "gtest/gtest.h"
#include "worker/model/cpu_backend.h"
#include "worker/model/flash_cpu_testing.h"
#include "worker/model/forwarding_backend.h"
#include "worker/model/gpt_model.h"
#include "worker/model/mlp_unit.h"
#include "worker/model/unit.h"

namespace pipetrain {
namespace {

using ::pipetrain::testing::CheckGradients;
using ::pipetrain::testing::DotLoss;
using ::pipetrain::testing::GradInput;
using ::pipetrain::testing::RandomTensor;

GptConfig TinyConfig() {
  GptConfig c;
  c.vocab_size = 11;
  c.max_seq_len = 6;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 8;
  return c;
}

TokenBatch RandomBatch(const GptConfig& c, int batch, int seq_len, uint64_t seed) {
  TokenBatch b{batch, seq_len, {}, {}};
  for (int i = 0; i < batch * seq_len; ++i) {
    b.inputs.push_back(static_cast<int32_t>(UniformIndex(seed, i, 0, 0, c.vocab_size)));
    b.targets.push_back(static_cast<int32_t>(UniformIndex(seed, i, 1, 0, c.vocab_size)));
  }
  return b;
}

// Parameters at O(1) scale so every nonlinearity (softmax, GELU, LayerNorm)
// is exercised away from its near-linear regime; the 0.02 init would hide
// errors in terms that are multiplied by small weights.
void RandomizeParameters(Unit* unit, uint64_t seed) {
  for (Parameter* p : unit->parameters()) {
    p->value.CopyFrom(RandomTensor(p->value.shape(), seed++, 0.5f));
    if (p->init == ParamInit::kOnes) {
      for (int64_t i = 0; i < p->value.numel(); ++i) p->value[i] += 1.0f;
    }
  }
}

// Tolerances for whole units. A unit chains several ops with O(1) random
// weights, so the loss has more curvature than a single op and the fp32
// central difference is noisier than the op-level default allows. Measured
// on mlp_0's c_fc.weight[2, 7] (gradient -6.28e-3): h = 1e-2 gives -5.70e-3
// (truncation error 5.8e-4), h = 2.5e-3 gives -6.54e-3 (rounding error
// 2.5e-4), h = 5e-3 agrees within 2e-4. So h = 5e-3 and an absolute slack of
// 5e-4, still far below the O(1e-2) error a wrong backward term produces on
// typical gradient elements; rtol stays at 2e-2.
::pipetrain::testing::GradCheckOptions UnitTolerance() {
  ::pipetrain::testing::GradCheckOptions options;
  options.step = 5e-3;
  options.atol = 5e-4;
  return options;
}

// Checks dL/dx and dL/dparams of `unit` for L = <Forward(x), w> (or the
// loss itself for the head).
void CheckUnitGradients(Unit* unit, bool takes_x, bool scalar_output) {
  const GptConfig c = TinyConfig();
  const int B = 2, T = 5;
  const TokenBatch batch = RandomBatch(c, B, T, 17);
  RandomizeParameters(unit, 100);
  Tensor x = RandomTensor({B, T, c.d_model}, 3);
  UnitContext ctx;
  Tensor y = unit->Forward(x, batch, &ctx);
  Tensor w = scalar_output ? Tensor::FromVector({1}, {1.0f}) : RandomTensor(y.shape(), 5);
  unit->ZeroGrads();
  Tensor dx = unit->Backward(w, batch, ctx);
  std::vector<GradInput> inputs;
  if (takes_x) inputs.push_back({"x", &x, dx});
  for (Parameter* p : unit->parameters()) inputs.push_back({p->name, &p->value, p->grad});
  auto loss = [&] {
    UnitContext scratch;
    return DotLoss(unit->Forward(x, batch, &scratch), w);
  };
  absl::Status status = CheckGradients(loss, inputs, UnitTolerance());
  EXPECT_TRUE(status.ok()) << unit->name() << ": " << status;
}

TEST(UnitGradientTest, Embed_MatchesFiniteDifferences) {
  auto unit = MakeUnit(TinyConfig(), 0);
  CheckUnitGradients(unit.get(), /*takes_x=*/false, /*scalar_output=*/false);
}

TEST(UnitGradientTest, Attention_MatchesFiniteDifferences) {
  auto unit = MakeUnit(TinyConfig(), 3);  // attn_1
  ASSERT_EQ(unit->name(), "attn_1");
  CheckUnitGradients(unit.get(), true, false);
}

TEST(UnitGradientTest, Mlp_MatchesFiniteDifferences) {
  auto unit = MakeUnit(TinyConfig(), 2);  // mlp_0
  ASSERT_EQ(unit->name(), "mlp_0");
  CheckUnitGradients(unit.get(), true, false);
}

TEST(UnitGradientTest, Head_MatchesFiniteDifferences) {
  auto unit = MakeUnit(TinyConfig(), NumUnits(TinyConfig()) - 1);
  ASSERT_EQ(unit->name(), "head");
  CheckUnitGradients(unit.get(), true, true);
}

// The CPU backend with the logits' rows padded (Backend::LogitsRowStride)
// as the CUDA backend pads them, and Empty's tensors filled with NaN, so a
// read of the padding would show.
class PaddedLogitsCpu : public ForwardingBackend {
 public:
  PaddedLogitsCpu() : ForwardingBackend(CpuBackend()) {}
  int LogitsRowStride(int vocab) const override { return vocab + 5; }
  Tensor Empty(const Shape& shape) override { return Tensor::Filled(shape, NAN); }
};

// The head with padded logit rows: bitwise the packed head's loss, input
// gradient and parameter gradients, and it keeps [n, vocab + 5] floats.
TEST(UnitTest, Head_PaddedLogitRows_SameLossAndGradientsBitwise) {
  const GptConfig c = TinyConfig();
  const int B = 2, T = 5;
  const TokenBatch batch = RandomBatch(c, B, T, 21);
  const Tensor x = RandomTensor({B, T, c.d_model}, 22);
  const Tensor dloss = Tensor::FromVector({1}, {0.75f});
  PaddedLogitsCpu padded;
  struct Run {
    std::vector<float> loss, dx, grads;
    int64_t kept_logits = 0;
  };
  auto run = [&](Backend* backend) {
    auto head = MakeUnit(c, NumUnits(c) - 1, backend);
    RandomizeParameters(head.get(), 100);
    UnitContext ctx;
    Run r;
    r.loss = head->Forward(x, batch, &ctx).ToVector();
    r.kept_logits = ctx.saved.back().numel();
    head->ZeroGrads();
    r.dx = head->Backward(dloss, batch, ctx).ToVector();
    for (Parameter* p : head->parameters()) {
      const std::vector<float> g = p->grad.ToVector();
      r.grads.insert(r.grads.end(), g.begin(), g.end());
    }
    return r;
  };
  const Run packed = run(CpuBackend());
  const Run wide = run(&padded);
  EXPECT_EQ(packed.kept_logits, int64_t{B} * T * c.vocab_size);
  EXPECT_EQ(wide.kept_logits, int64_t{B} * T * (c.vocab_size + 5));
  ASSERT_TRUE(std::isfinite(wide.loss[0]));
  EXPECT_EQ(wide.loss, packed.loss);
  EXPECT_EQ(wide.dx, packed.dx);
  EXPECT_EQ(wide.grads, packed.grads);
}

// A backend whose loss state is its own (as the CUDA backend's bf16
// gradient is): the state HeadLossForward saves is a tensor of another
// shape, and LmHeadLossBackward must be handed that very tensor.
class OwnLossStateCpu : public ForwardingBackend {
 public:
  OwnLossStateCpu() : ForwardingBackend(CpuBackend()) {}
  Tensor HeadLossForward(Tensor logits, const int32_t* host_targets, int n, int d, int vocab,
                         int ld, Tensor* saved) override {
    Tensor probs;
    Tensor loss = ForwardingBackend::HeadLossForward(std::move(logits), host_targets, n, d, vocab,
                                                     ld, &probs);
    // The probabilities behind a row of 3 marker floats.
    std::vector<float> state = {-1.0f, -2.0f, -3.0f};
    const std::vector<float> p = probs.ToVector();
    state.insert(state.end(), p.begin(), p.end());
    *saved = Tensor::FromVector({static_cast<int64_t>(state.size())}, state);
    saved_data = saved->data();
    return loss;
  }
  void LmHeadLossBackward(const Tensor& saved, const int32_t* host_targets, float dloss,
                          const float* x, const float* wte, int n, int d, int vocab, int ld,
                          float* dx, float* dwte) override {
    handed_its_state = saved.data() == saved_data && saved[0] == -1.0f;
    const Tensor probs = Tensor::FromVector(
        {n, ld}, std::vector<float>(saved.data() + 3, saved.data() + saved.numel()));
    ForwardingBackend::LmHeadLossBackward(probs, host_targets, dloss, x, wte, n, d, vocab, ld, dx,
                                          dwte);
  }
  const float* saved_data = nullptr;
  bool handed_its_state = false;
};

TEST(UnitTest, Head_BackendsOwnLossState_HandedBackUnchanged) {
  const GptConfig c = TinyConfig();
  const TokenBatch batch = RandomBatch(c, 2, 5, 31);
  const Tensor x = RandomTensor({2, 5, c.d_model}, 32);
  const Tensor dloss = Tensor::FromVector({1}, {0.5f});
  auto run = [&](Backend* backend) {
    auto head = MakeUnit(c, NumUnits(c) - 1, backend);
    RandomizeParameters(head.get(), 33);
    UnitContext ctx;
    std::vector<float> out = head->Forward(x, batch, &ctx).ToVector();
    head->ZeroGrads();
    const std::vector<float> dx = head->Backward(dloss, batch, ctx).ToVector();
    out.insert(out.end(), dx.begin(), dx.end());
    for (Parameter* p : head->parameters()) {
      const std::vector<float> g = p->grad.ToVector();
      out.insert(out.end(), g.begin(), g.end());
    }
    return out;
  };
  OwnLossStateCpu own;
  const std::vector<float> got = run(&own);
  EXPECT_TRUE(own.handed_its_state);
  EXPECT_EQ(got, run(CpuBackend()));
}

// ZeroGrads hands the backend all of a unit's gradients in one ZeroAll
// call (a device backend's few launches, not a fill each).
class CountingZeroAll : public ForwardingBackend {
 public:
  CountingZeroAll() : ForwardingBackend(CpuBackend()) {}
  void ZeroAll(const std::vector<Tensor*>& tensors) override {
    ++calls;
    tensors_zeroed += static_cast<int>(tensors.size());
    inner()->ZeroAll(tensors);
  }
  int calls = 0, tensors_zeroed = 0;
};

TEST(UnitTest, ZeroGrads_OneZeroAllCallPerUnit) {
  const GptConfig c = TinyConfig();
  CountingZeroAll backend;
  auto mlp = MakeUnit(c, 2, &backend);  // mlp_0
  RandomizeParameters(mlp.get(), 5);
  for (Parameter* p : mlp->parameters()) p->grad.Fill(3.0f);
  mlp->ZeroGrads();
  EXPECT_EQ(backend.calls, 1);
  EXPECT_EQ(backend.tensors_zeroed, static_cast<int>(mlp->parameters().size()));
  for (Parameter* p : mlp->parameters()) {
    EXPECT_EQ(p->grad.ToVector(), std::vector<float>(p->grad.numel(), 0.0f)) << p->name;
  }
}

TEST(UnitTest, Recompute_RebuildsTheSameContextBitwise) {
  const GptConfig c = TinyConfig();
  const TokenBatch batch = RandomBatch(c, 2, 5, 9);
  for (int i = 0; i < NumUnits(c); ++i) {
    auto unit = MakeUnit(c, i);
    InitializeParameters(unit.get(), 4);
    Tensor x = RandomTensor({2, 5, c.d_model}, 8);
    UnitContext stash, rebuilt;
    unit->Forward(x, batch, &stash);
    unit->Recompute(x, batch, &rebuilt);
    ASSERT_EQ(stash.saved.size(), rebuilt.saved.size()) << unit->name();
    for (size_t s = 0; s < stash.saved.size(); ++s) {
      EXPECT_EQ(stash.saved[s].ToVector(), rebuilt.saved[s].ToVector())
          << unit->name() << " slot " << s;
    }
  }
}

// Causal softmax rows sum to 1, so a sequence's column sums add up to
// heads * T; query 0 sees only token 0, so token 0 gets at least 1 per head.
TEST(UnitTest, TokenImportance_AttentionColumnSumsOthersNone) {
  const GptConfig c = TinyConfig();
  const int B = 2, T = 5;
  const TokenBatch batch = RandomBatch(c, B, T, 9);
  for (int i = 0; i < NumUnits(c); ++i) {
    auto unit = MakeUnit(c, i);
    RandomizeParameters(unit.get(), 3);
    unit->KeepTokenImportance();
    UnitContext ctx;
    unit->Forward(RandomTensor({B, T, c.d_model}, 8), batch, &ctx);
    const std::vector<float> scores = unit->TokenImportance(ctx);
    if (unit->kind() != UnitKind::kAttention) {
      EXPECT_TRUE(scores.empty()) << unit->name();
      continue;
    }
    ASSERT_EQ(scores.size(), static_cast<size_t>(B * T)) << unit->name();
    for (int b = 0; b < B; ++b) {
      double sum = 0;
      for (int t = 0; t < T; ++t) {
        EXPECT_GE(scores[b * T + t], 0.0f);
        sum += scores[b * T + t];
      }
      EXPECT_NEAR(sum, c.n_head * T, 1e-4) << unit->name() << " sequence " << b;
      EXPECT_GE(scores[b * T], c.n_head - 1e-5) << unit->name();
    }
  }
}

// A backend that remembers what its Upload returned, and a two-rank group
// (the other rank adds zeros) that counts the tensors it was given that did
// not come from that backend: a CUDA group downloads them, which a host
// tensor fails with a CHECK (the worker dies).
class UploadRecordingBackend : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  Tensor Upload(const Tensor& host) override {
    Tensor t = ForwardingBackend::Upload(host);
    uploaded.insert(t.data());
    return t;
  }
  std::set<const float*> uploaded;
};

class BackendCheckingComm : public TensorParallelComm {
 public:
  explicit BackendCheckingComm(const UploadRecordingBackend* backend) : backend_(backend) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  void AllReduceSum(Tensor& data) override {
    if (backend_->uploaded.count(data.data()) == 0) ++foreign;
  }
  absl::Status status() const override { return absl::OkStatus(); }
  int foreign = 0;

 private:
  const UploadRecordingBackend* backend_;
};

// A tensor-parallel attention's token importance sums its heads' scores
// over the group in a tensor of its backend (it built a host tensor).
TEST(UnitTest, TokenImportance_TensorParallel_SumsATensorOfTheBackend) {
  GptConfig c = TinyConfig();
  c.vocab_size = 12;  // tensor parallelism of 2 needs an even vocabulary
  const int B = 2, T = 5;
  const TokenBatch batch = RandomBatch(c, B, T, 9);
  UploadRecordingBackend backend(CpuBackend());
  BackendCheckingComm comm(&backend);
  auto attn = MakeUnit(c, 1, &backend, &comm);
  RandomizeParameters(attn.get(), 3);
  attn->KeepTokenImportance();
  UnitContext ctx;
  attn->Forward(backend.Upload(RandomTensor({B, T, c.d_model}, 8)), batch, &ctx);
  const int before = comm.foreign;
  const std::vector<float> scores = attn->TokenImportance(ctx);
  EXPECT_EQ(scores.size(), static_cast<size_t>(B * T));
  EXPECT_EQ(comm.foreign, before) << "TokenImportance summed a tensor not of the unit's backend";
}

// attn_0 (parameters at O(1), seed 3) on `backend`: forward, its token
// importance, backward of dy; KeepTokenImportance first with `keep`.
struct AttentionRun {
  std::vector<float> y, dx, grads, scores;
  int64_t saved_floats = 0;  // what the context keeps for the attention
};

AttentionRun RunAttention(const GptConfig& c, Backend* backend, bool keep, const Tensor& x,
                          const Tensor& dy, const TokenBatch& batch) {
  auto unit = MakeUnit(c, 1, backend);  // attn_0
  RandomizeParameters(unit.get(), 3);
  if (keep) unit->KeepTokenImportance();
  UnitContext ctx;
  AttentionRun r;
  r.y = unit->Forward(x, batch, &ctx).ToVector();
  r.saved_floats = ctx.saved[5].numel();  // AttentionUnit's kProbs slot
  r.scores = unit->TokenImportance(ctx);
  unit->ZeroGrads();
  r.dx = unit->Backward(dy, batch, ctx).ToVector();
  for (Parameter* p : unit->parameters()) {
    const std::vector<float> g = p->grad.ToVector();
    r.grads.insert(r.grads.end(), g.begin(), g.end());
  }
  return r;
}

// Without KeepTokenImportance the context need not hold the probabilities
// (a flash-style backend keeps only each row's log-sum-exp), so
// TokenImportance has none; the unit's outputs and gradients are the same
// either way.
TEST(UnitTest, TokenImportance_NoneUnlessKept_SameGradients) {
  const GptConfig c = TinyConfig();
  const int B = 2, T = 5;
  const TokenBatch batch = RandomBatch(c, B, T, 9);
  const Tensor x = RandomTensor({B, T, c.d_model}, 8);
  const Tensor dy = RandomTensor({B, T, c.d_model}, 10);
  const AttentionRun kept = RunAttention(c, CpuBackend(), true, x, dy, batch);
  const AttentionRun plain = RunAttention(c, CpuBackend(), false, x, dy, batch);
  EXPECT_EQ(kept.scores.size(), static_cast<size_t>(B * T));
  EXPECT_TRUE(plain.scores.empty());
  EXPECT_EQ(kept.y, plain.y);
  EXPECT_EQ(kept.dx, plain.dx);
  EXPECT_EQ(kept.grads, plain.grads);
}

// A backend with flash attention's contract (FlashOnCpu: each row's
// log-sum-exp kept, the GPU kernels' CPU twin computing) gives the
// attention units' outputs and gradients within its bf16 rounding, over
// key tiles and a partial one (T = 70), and keeps B * H * T floats; asked
// for token importance it keeps the probabilities and computes exactly as
// the CPU backend.
TEST(UnitTest, FlashStyleBackend_KeepsRowStatisticsAndMatches) {
  GptConfig c;
  c.vocab_size = 11;
  c.max_seq_len = 70;
  c.n_layer = 1;
  c.n_head = 2;
  c.d_model = 32;
  const int B = 2, T = 70;
  const TokenBatch batch = RandomBatch(c, B, T, 9);
  const Tensor x = RandomTensor({B, T, c.d_model}, 8);
  const Tensor dy = RandomTensor({B, T, c.d_model}, 10);
  FlashOnCpu flash;
  const AttentionRun cpu = RunAttention(c, CpuBackend(), false, x, dy, batch);
  const AttentionRun fast = RunAttention(c, &flash, false, x, dy, batch);
  EXPECT_EQ(cpu.saved_floats, int64_t{B} * c.n_head * T * T);
  EXPECT_EQ(fast.saved_floats, int64_t{B} * c.n_head * T);
  // Relative to each tensor's largest value, as cuda_backend_test's bf16
  // cases; a wrong tile, mask or offset is off by far more.
  auto close = [](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    float scale = 0, worst = 0;
    for (float v : want) scale = std::max(scale, std::fabs(v));
    for (size_t i = 0; i < want.size(); ++i) {
      const float diff = std::fabs(got[i] - want[i]);
      // A NaN is infinitely far: std::max would drop it (it compares false).
      worst = std::max(worst, std::isfinite(diff) ? diff : INFINITY);
    }
    EXPECT_LE(worst, 5e-2f * scale) << what;
    EXPECT_GT(worst, 0.0f) << what << ": bitwise equal, so the twin did not run";
  };
  close(fast.y, cpu.y, "y");
  close(fast.dx, cpu.dx, "dx");
  close(fast.grads, cpu.grads, "gradients");
  const AttentionRun kept = RunAttention(c, &flash, true, x, dy, batch);
  EXPECT_EQ(kept.saved_floats, int64_t{B} * c.n_head * T * T);
  EXPECT_EQ(kept.y, cpu.y);
  EXPECT_EQ(kept.dx, cpu.dx);
  EXPECT_EQ(kept.grads, cpu.grads);
}

TEST(UnitTest, InitializeParameters_IsAPureFunctionOfSeedAndName) {
  const GptConfig c = TinyConfig();
  auto a = MakeUnit(c, 1), b = MakeUnit(c, 1), other_seed = MakeUnit(c, 1);
  InitializeParameters(a.get(), 5);
  InitializeParameters(b.get(), 5);
  InitializeParameters(other_seed.get(), 6);
  auto pa = a->parameters(), pb = b->parameters(), po = other_seed->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i]->value.ToVector(), pb[i]->value.ToVector()) << pa[i]->name;
    if (pa[i]->init == ParamInit::kNormal) {
      EXPECT_NE(pa[i]->value.ToVector(), po[i]->value.ToVector()) << pa[i]->name;
    }
  }
  // The head's tied copy of wte initialises exactly like the embedding's, so
  // separate workers holding the two units start in agreement.
  auto embed = MakeUnit(c, 0), head = MakeUnit(c, NumUnits(c) - 1);
  InitializeParameters(embed.get(), 5);
  InitializeParameters(head.get(), 5);
  EXPECT_EQ(embed->parameters()[0]->value.ToVector(), head->parameters()[2]->value.ToVector());
}

TEST(UnitTest, ResidualProjections_UseScaledInitStd) {
  GptConfig c = TinyConfig();
  c.d_model = 64;
  c.n_head = 4;
  auto attn = MakeUnit(c, 1);
  for (Parameter* p : attn->parameters()) {
    if (p->name == "h.0.attn.c_proj.weight") {
      EXPECT_FLOAT_EQ(p->init_std, 0.02f / 2.0f);  // 0.02 / sqrt(2 * 2 layers)
    }
    if (p->name == "h.0.attn.c_attn.weight") {
      EXPECT_FLOAT_EQ(p->init_std, 0.02f);
    }
  }
}

TEST(GptModelTest, Create_UsesHuggingFaceNamesAndShapes) {
  GptConfig c = TinyConfig();
  c.n_layer = 1;
  auto model = GptModel::Create(c, 1).value();
  std::vector<std::pair<std::string, Shape>> got;
  for (Parameter* p : model->parameters()) got.push_back({p->name, p->value.shape()});
  const std::vector<std::pair<std::string, Shape>> want = {
      {"wte.weight", {11, 8}},           {"wpe.weight", {6, 8}},
      {"h.0.ln_1.weight", {8}},          {"h.0.ln_1.bias", {8}},
      {"h.0.attn.c_attn.weight", {8, 24}}, {"h.0.attn.c_attn.bias", {24}},
      {"h.0.attn.c_proj.weight", {8, 8}},  {"h.0.attn.c_proj.bias", {8}},
      {"h.0.ln_2.weight", {8}},          {"h.0.ln_2.bias", {8}},
      {"h.0.mlp.c_fc.weight", {8, 32}},  {"h.0.mlp.c_fc.bias", {32}},
      {"h.0.mlp.c_proj.weight", {32, 8}}, {"h.0.mlp.c_proj.bias", {8}},
      {"ln_f.weight", {8}},              {"ln_f.bias", {8}}};
  EXPECT_EQ(got, want);
  EXPECT_EQ(model->num_parameters(), CountParameters(c));
}

TEST(GptModelTest, Create_TiesHeadValueToEmbeddingButKeepsGradientsApart) {
  auto model = GptModel::Create(TinyConfig(), 1).value();
  Parameter* embed_wte = model->unit(0).parameters()[0];
  Parameter* head_wte = model->unit(model->num_units() - 1).parameters()[2];
  ASSERT_EQ(head_wte->name, "wte.weight");
  EXPECT_TRUE(embed_wte->value.SharesStorageWith(head_wte->value));
  EXPECT_FALSE(embed_wte->grad.SharesStorageWith(head_wte->grad));
}

TEST(GptModelTest, ReduceTiedGradients_SumsBothPartsAndZeroGradsClearsBoth) {
  auto model = GptModel::Create(TinyConfig(), 1).value();
  Parameter* embed_wte = model->unit(0).parameters()[0];
  Parameter* head_wte = model->unit(model->num_units() - 1).parameters()[2];
  embed_wte->grad.Fill(1.5f);
  head_wte->grad.Fill(0.25f);
  model->ReduceTiedGradients();
  EXPECT_EQ(embed_wte->grad[0], 1.75f);
  model->ZeroGrads();
  EXPECT_EQ(embed_wte->grad[0], 0.0f);
  EXPECT_EQ(head_wte->grad[0], 0.0f);
}

TEST(GptModelTest, Create_InvalidConfig_NamesTheField) {
  GptConfig c = TinyConfig();
  c.n_head = 3;
  auto model = GptModel::Create(c, 1);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.status().message(), "n_head (3) must divide d_model (8)");
  c = TinyConfig();
  c.max_seq_len = 0;
  EXPECT_EQ(GptModel::Create(c, 1).status().message(), "max_seq_len must be >= 1, got 0");
}

// The chain through all units, including the tied embedding whose gradient
// sums contributions from embed and head.
TEST(GptModelTest, ForwardBackward_MatchesFiniteDifferencesEndToEnd) {
  auto model = GptModel::Create(TinyConfig(), 3).value();
  for (int i = 0; i < model->num_units(); ++i) RandomizeParameters(&model->unit(i), 50 + 10 * i);
  const TokenBatch batch = RandomBatch(model->config(), 2, 5, 21);
  model->ZeroGrads();
  const float scale = 0.5f;
  model->ForwardBackward(batch, scale);
  model->ReduceTiedGradients();
  std::vector<GradInput> inputs;
  for (Parameter* p : model->parameters()) inputs.push_back({p->name, &p->value, p->grad});
  auto loss = [&] { return scale * static_cast<double>(model->Loss(batch)); };
  absl::Status status = CheckGradients(loss, inputs, UnitTolerance());
  EXPECT_TRUE(status.ok()) << status;
}

// The coordinator checks weight uploads against UnitParameterShapes without
// building units: it must list exactly what each unit holds, in order.
TEST(UnitParameterShapesTest, EveryUnit_MatchesTheUnitsParameters) {
  const GptConfig c = TinyConfig();
  for (int u = 0; u < NumUnits(c); ++u) {
    std::unique_ptr<Unit> unit = MakeUnit(c, u);
    const std::vector<ParameterShape> expected = UnitParameterShapes(c, u);
    const std::vector<Parameter*> params = unit->parameters();
    ASSERT_EQ(params.size(), expected.size()) << UnitName(c, u);
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(params[i]->name, expected[i].name) << UnitName(c, u);
      EXPECT_EQ(params[i]->value.shape(), Shape(expected[i].shape.begin(), expected[i].shape.end()))
          << params[i]->name;
    }
  }
}

// A tensor-parallel group's rank as MakeUnit needs it to build a unit's
// shards; nothing runs, so nothing is summed.
class ShapeOnlyComm : public TensorParallelComm {
 public:
  ShapeOnlyComm(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void AllReduceSum(Tensor&) override {}
  absl::Status status() const override { return absl::OkStatus(); }

 private:
  int rank_, size_;
};

// The planner prices a tensor rank's data-parallel gradients on the shards
// UnitParameterShapes' split_dim gives (selective_compression.h): each
// rank of every unit kind must hold exactly those, and split_dim must name
// a tensor as sharded just when the unit shards it.
TEST(UnitParameterShapesTest, TensorParallel_SplitDimGivesEachRanksShard) {
  GptConfig c = TinyConfig();
  c.vocab_size = 12;  // tensor parallelism of 2 needs an even vocabulary
  const int kRanks = 2;
  for (int rank = 0; rank < kRanks; ++rank) {
    ShapeOnlyComm comm(rank, kRanks);
    for (int u = 0; u < NumUnits(c); ++u) {
      std::unique_ptr<Unit> unit = MakeUnit(c, u, CpuBackend(), &comm);
      const std::vector<ParameterShape> expected = UnitParameterShapes(c, u);
      const std::vector<Parameter*> params = unit->parameters();
      ASSERT_EQ(params.size(), expected.size()) << UnitName(c, u);
      for (size_t i = 0; i < params.size(); ++i) {
        const ParameterShape& e = expected[i];
        Shape shard(e.shape.begin(), e.shape.end());
        if (e.split_dim >= 0) {
          ASSERT_LT(e.split_dim, static_cast<int>(shard.size())) << e.name;
          shard[e.split_dim] /= kRanks;
        }
        EXPECT_EQ(params[i]->name, e.name) << UnitName(c, u);
        EXPECT_EQ(params[i]->value.shape(), shard) << e.name << " on rank " << rank;
        EXPECT_EQ(params[i]->shard.sharded(), e.split_dim >= 0) << e.name;
      }
    }
  }
}

// An MLP unit with its token scores (Unit::RowSquaredNorms) in reach.
class MlpWithScores : public MlpUnit {
 public:
  using MlpUnit::MlpUnit;
  using Unit::RowSquaredNorms;
};

// A finite row whose squared norm (8 x 9e38) is beyond the float range gets
// a finite score above the others', and the float sum of two ranks' such
// scores stays finite: the group refused an infinite one as non-finite
// activations (tensor_parallel_comm.cc). NaN and infinity stay non-finite.
TEST(UnitTest, RowSquaredNorms_BeyondFloatRange_FiniteScoreTheGroupCanSum) {
  ShapeOnlyComm comm(0, 2);
  MlpWithScores mlp(TinyConfig(), 0, CpuBackend(), &comm);
  const int d = TinyConfig().d_model;
  Tensor x = Tensor::Filled({4, d}, 1.0f);
  for (int i = 0; i < d; ++i) x[i] = 3e19f;
  x[2 * d + 1] = NAN;
  x[3 * d + 1] = INFINITY;
  const std::vector<float> scores = mlp.RowSquaredNorms(x);
  ASSERT_EQ(scores.size(), 4u);
  EXPECT_TRUE(std::isfinite(scores[0])) << scores[0];
  EXPECT_TRUE(std::isfinite(scores[0] + scores[0])) << "two ranks' scores summed: " << scores[0];
  EXPECT_GT(scores[0], scores[1]);
  EXPECT_EQ(scores[1], static_cast<float>(d));
  EXPECT_TRUE(std::isnan(scores[2])) << scores[2];
  EXPECT_EQ(scores[3], INFINITY);
}

}  // namespace
}  // namespace pipetrain
