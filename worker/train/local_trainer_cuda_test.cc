// The reference trainer on the CUDA backend (the CUDA issue's acceptance:
// "train-local --device cuda matches the CPU backend's losses within 1e-4
// relative for 20 steps (fp32 GEMM mode), and is bitwise deterministic run
// to run"). GPU cases SKIP without a device.
//
// Why 1e-4 can hold: every kernel is within about 1e-5 of its CPU twin in
// fp32 (kernels/cuda/*_test.cc) and the loss is a mean over B*T positions;
// 20 AdamW steps at lr 1e-3 move weights by ~1e-3 each, so the per-step
// kernel differences stay small against the loss's own scale (the check is
// on the loss, not on individual weights, which can drift further).
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/parity_testing.h"
#include "worker/data/synthetic_text.h"
#include "worker/model/cpu_backend.h"
#include "worker/model/cuda_backend.h"
#include "worker/train/adamw_optimizer.h"
#include "worker/train/checkpoint.h"
#include "worker/train/local_trainer.h"

namespace pipetrain {
namespace {

// Empty allocations filled with NaN on CUDA (cuda_backend.h), set before any
// backend is made: an op that leaves part of its output unwritten fails.
const bool kPoisonEmpty = [] {
  setenv("PIPETRAIN_POISON_EMPTY", "1", /*overwrite=*/1);
  return true;
}();

Dataset MakeDataset(int seq_len) {
  std::string text = GenerateEnglishText(7, 200000);
  std::vector<uint16_t> tokens(text.begin(), text.end());
  return Dataset::Create(std::move(tokens), seq_len, 0.1).value();
}

// Shapes off the kernels' block sizes (T = 33, d = 96, 3 heads).
TrainConfig Config(float grad_clip = 0) {
  TrainConfig c;
  c.grad_clip = grad_clip;
  c.model.n_layer = 2;
  c.model.n_head = 3;
  c.model.d_model = 96;
  c.model.max_seq_len = 33;
  c.seq_len = 33;
  c.batch_size = 6;
  c.micro_batches = 2;
  c.adam.lr = 1e-3f;
  c.seed = 21;
  return c;
}

struct TrainRun {
  std::vector<float> losses;
  float val_loss = 0;
};

TrainRun Train(Backend* backend, int steps, float grad_clip = 0) {
  Dataset data = MakeDataset(33);
  auto trainer = LocalTrainer::Create(Config(grad_clip), &data, backend);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  TrainRun run;
  if (!trainer.ok()) return run;
  for (int i = 0; i < steps; ++i) {
    absl::StatusOr<StepResult> r = (*trainer)->Step();
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return run;
    run.losses.push_back(r->loss);
  }
  absl::StatusOr<float> val = (*trainer)->Evaluate();
  EXPECT_TRUE(val.ok()) << val.status();
  run.val_loss = val.value_or(0);
  return run;
}

class LocalTrainerCudaTest : public testing::CudaTest {};

TEST_F(LocalTrainerCudaTest, TwentySteps_Fp32_LossesMatchCpuWithin1e4Relative) {
  auto cuda = CreateCudaBackend(0, GemmMode::kFp32);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  const TrainRun want = Train(CpuBackend(), 20);
  const TrainRun got = Train(cuda->get(), 20);
  ASSERT_EQ(got.losses.size(), 20u);
  for (int i = 0; i < 20; ++i) {
    const float rel = std::fabs(got.losses[i] - want.losses[i]) / std::fabs(want.losses[i]);
    EXPECT_LE(rel, 1e-4f) << "step " << i + 1 << ": cuda " << got.losses[i] << " cpu "
                          << want.losses[i];
  }
  EXPECT_LE(std::fabs(got.val_loss - want.val_loss) / want.val_loss, 1e-4f)
      << "validation: cuda " << got.val_loss << " cpu " << want.val_loss;
}

// Clipping by the global norm on the device (kernels/cuda/multi_tensor.h):
// the norm's sum runs in another order than the CPU's, in double, so the
// losses stay within the same 1e-4. A norm of 0.05 clips every step, as the
// CPU run without clipping shows by differing.
TEST_F(LocalTrainerCudaTest, TwentySteps_Fp32_Clipped_LossesMatchCpuWithin1e4Relative) {
  auto cuda = CreateCudaBackend(0, GemmMode::kFp32);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  constexpr float kClip = 0.05f;
  const TrainRun want = Train(CpuBackend(), 20, kClip);
  const TrainRun unclipped = Train(CpuBackend(), 20);
  const TrainRun got = Train(cuda->get(), 20, kClip);
  ASSERT_EQ(got.losses.size(), 20u);
  ASSERT_EQ(want.losses.size(), 20u);
  EXPECT_NE(want.losses.back(), unclipped.losses.back()) << "the norm never clipped";
  for (int i = 0; i < 20; ++i) {
    const float rel = std::fabs(got.losses[i] - want.losses[i]) / std::fabs(want.losses[i]);
    EXPECT_LE(rel, 1e-4f) << "step " << i + 1 << ": cuda " << got.losses[i] << " cpu "
                          << want.losses[i];
  }
  // Bitwise run to run, as without clipping.
  auto again = CreateCudaBackend(0, GemmMode::kFp32);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(Train(again->get(), 20, kClip).losses, got.losses);
}

// A training step (the GPU issue: "no host synchronisation inside a step")
// is queued whole: forward, backward, the tied gradients' sum and AdamW,
// in bf16 and fp32 modes, without one op that waits for the device
// (downloads, copies from the host, synchronisations); the loss is read
// after. Each op is timed, so every op the step ran is named.
TEST_F(LocalTrainerCudaTest, Step_QueuedWithoutWaitingForTheDevice) {
  for (GemmMode mode : {GemmMode::kBf16, GemmMode::kFp32}) {
    auto cuda = CreateCudaBackend(0, mode);
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    Backend* b = cuda->get();
    const TrainConfig c = Config();
    auto model = GptModel::Create(c.model, c.seed, b);
    ASSERT_TRUE(model.ok()) << model.status();
    AdamWOptimizer opt(c.adam, DecayPolicy::kMatricesOnly, b);
    Dataset data = MakeDataset(33);
    const TokenBatch batch = data.TrainBatch(c.seed, 0, 0, 3);
    b->Synchronize();
    b->TakeOpTimes();
    b->SetOpTiming(true);
    (*model)->ZeroGrads();
    const Tensor loss = (*model)->ForwardBackwardDeferred(batch, 1.0f);
    (*model)->ReduceTiedGradients();
    opt.Step((*model)->parameters());
    b->SetOpTiming(false);
    const OpTimes times = b->TakeOpTimes();
    ASSERT_TRUE(b->status().ok()) << b->status();
    EXPECT_GT(times.count("cross_entropy_forward"), 0u) << GemmModeName(mode);
    EXPECT_GT(times.count("adamw"), 0u) << GemmModeName(mode);
    for (const char* waits : {"download", "copy_from_host", "synchronize"}) {
      EXPECT_EQ(times.count(waits), 0u) << waits << " in a " << GemmModeName(mode) << " step";
    }
    EXPECT_TRUE(loss.on_device());
    EXPECT_TRUE(std::isfinite(LossValue(b, loss))) << GemmModeName(mode);
  }
}

// A checkpoint taken on the GPU and restored into a fresh GPU trainer
// continues exactly: 10 + 10 steps equal 20 straight, bitwise.
TEST_F(LocalTrainerCudaTest, CheckpointResume_TenPlusTen_EqualsTwentyBitwise) {
  auto cuda = CreateCudaBackend(0, GemmMode::kFp32);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  Dataset data = MakeDataset(33);
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/cuda.ckpt";
  auto straight = LocalTrainer::Create(Config(), &data, cuda->get()).value();
  std::vector<float> want;
  for (int i = 0; i < 20; ++i) want.push_back(straight->Step().value().loss);
  auto first = LocalTrainer::Create(Config(), &data, cuda->get()).value();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(first->Step().ok());
  ASSERT_TRUE(SaveCheckpoint(path, *first).ok());
  auto second = LocalTrainer::Create(Config(), &data, cuda->get()).value();
  ASSERT_TRUE(RestoreCheckpoint(path, second.get()).ok());
  for (int i = 10; i < 20; ++i) EXPECT_EQ(second->Step().value().loss, want[i]) << "step " << i + 1;
}

TEST_F(LocalTrainerCudaTest, TwentySteps_TwoRuns_BitwiseEqual) {
  for (GemmMode mode : {GemmMode::kFp32, GemmMode::kTf32}) {
    auto a = CreateCudaBackend(0, mode);
    auto b = CreateCudaBackend(0, mode);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
    const TrainRun first = Train(a->get(), 20);
    const TrainRun second = Train(b->get(), 20);
    EXPECT_EQ(first.losses, second.losses) << GemmModeName(mode);
    EXPECT_EQ(first.val_loss, second.val_loss) << GemmModeName(mode);
  }
}

}  // namespace
}  // namespace pipetrain
