// AdamWOptimizer: one multi-tensor update per step (Backend::AdamWUpdateAll,
// a few launches on a GPU instead of one per tensor), with the decay policy
// per tensor, and the same numbers as kernels/cpu/adamw.h tensor by tensor.
#include "worker/train/adamw_optimizer.h"

#include <memory>
#include <vector>

#include "common/philox.h"
#include "gtest/gtest.h"
#include "kernels/cpu/adamw.h"
#include "worker/model/cpu_backend.h"
#include "worker/model/forwarding_backend.h"
#include "worker/model/gpt_model.h"

namespace pipetrain {
namespace {

// Records each AdamWUpdateAll call's tensors, then computes on the CPU.
class RecordingAdamW : public ForwardingBackend {
 public:
  RecordingAdamW() : ForwardingBackend(CpuBackend()) {}
  void AdamWUpdate(float*, const float*, float*, float*, int64_t, int64_t, const AdamWConfig&,
                   bool) override {
    ++single_calls;
  }
  void AdamWUpdateAll(const std::vector<AdamWTensor>& tensors, int64_t step,
                      const AdamWConfig& config) override {
    calls.push_back(tensors);
    steps.push_back(step);
    inner()->AdamWUpdateAll(tensors, step, config);
  }
  std::vector<std::vector<AdamWTensor>> calls;
  std::vector<int64_t> steps;
  int single_calls = 0;
};

GptConfig TinyConfig() {
  GptConfig c;
  c.vocab_size = 11;
  c.max_seq_len = 6;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 8;
  return c;
}

void FillGradients(GptModel& model, uint64_t seed) {
  int index = 0;
  for (Parameter* p : model.parameters()) {
    FillNormal(seed, index++, 0.0f, 1.0f, p->grad.data(), p->grad.numel());
  }
}

TEST(AdamWOptimizerTest, Step_OneMultiTensorUpdate_SameAsEachTensorAlone) {
  RecordingAdamW backend;
  std::unique_ptr<GptModel> model = GptModel::Create(TinyConfig(), 7, &backend).value();
  std::unique_ptr<GptModel> reference = GptModel::Create(TinyConfig(), 7).value();
  const std::vector<Parameter*> params = model->parameters();
  const std::vector<Parameter*> want = reference->parameters();
  AdamWConfig config;
  config.lr = 1e-2f;
  AdamWOptimizer optimizer(config, DecayPolicy::kMatricesOnly, &backend);
  std::vector<std::vector<float>> m(want.size()), v(want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    m[i].assign(want[i]->value.numel(), 0.0f);
    v[i].assign(want[i]->value.numel(), 0.0f);
  }
  for (int64_t step = 1; step <= 3; ++step) {
    FillGradients(*model, 30 + step);
    FillGradients(*reference, 30 + step);
    optimizer.Step(params);
    for (size_t i = 0; i < want.size(); ++i) {
      AdamWUpdate(want[i]->value.data(), want[i]->grad.data(), m[i].data(), v[i].data(),
                  want[i]->value.numel(), step, config, want[i]->is_matrix);
    }
  }
  ASSERT_EQ(backend.calls.size(), 3u);
  EXPECT_EQ(backend.steps, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(backend.single_calls, 0);
  const std::vector<AdamWTensor>& last = backend.calls.back();
  ASSERT_EQ(last.size(), params.size());
  bool some_decay = false, some_not = false;
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(last[i].param, params[i]->value.data()) << params[i]->name;
    EXPECT_EQ(last[i].grad, params[i]->grad.data()) << params[i]->name;
    EXPECT_EQ(last[i].n, params[i]->value.numel()) << params[i]->name;
    EXPECT_EQ(last[i].apply_decay, params[i]->is_matrix) << params[i]->name;
    some_decay |= last[i].apply_decay;
    some_not |= !last[i].apply_decay;
    EXPECT_EQ(params[i]->value.ToVector(), want[i]->value.ToVector()) << params[i]->name;
  }
  EXPECT_TRUE(some_decay && some_not);
}

}  // namespace
}  // namespace pipetrain
