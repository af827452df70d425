// 1-D tensor parallelism on the CUDA backend (its all-reduces cross to the
// host, tensor_parallel_comm.h), with and without AccTFM's hybrid
// compression: attn_0 then mlp_0 on 2 ranks, threads each with its own
// CUDA backend on device 0, 2 partitions, streamed across the two units
// and waiting in each (tensor_parallel_chain_testing.h). SKIP without a
// device.
//
// What must hold: the ranks agree bitwise (every sum gives each the same
// bits); streamed and waited agree bitwise in outputs, kept rows, input and
// weight gradients, the LayerNorms' within 1e-5 (the streamed backward adds
// them per partition), as on the CPU (tensor_parallel_compression_test);
// each sample keeps half its tokens; and exact ("none") runs match the CPU
// backend's within 1e-4 of each tensor's scale (fp32 GEMMs in another
// order). Compressed runs are not held to the CPU's: a near tie in the
// attention scores may keep another token there.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/philox.h"
#include "gtest/gtest.h"
#include "kernels/cuda/parity_testing.h"
#include "worker/collectives/tensor_parallel_chain_testing.h"
#include "worker/model/cpu_backend.h"
#include "worker/model/cuda_backend.h"

namespace pipetrain {
namespace {

constexpr uint64_t kSeed = 77;
constexpr int kRanks = 2;

GptConfig Config() { return testing::TensorParallelChainConfig(32); }
TokenBatch Batch() { return testing::TensorParallelChainBatch(); }

Tensor Random(uint64_t stream, float stddev) {
  Tensor t = Tensor::Zeros({4, 16, 32});
  FillNormal(kSeed, stream, 0.0f, stddev, t.data(), t.numel());
  return t;
}

class TensorParallelCudaTest : public testing::CudaTest {};

// The ranks' runs on fresh CUDA backends (one per rank), after checking
// that each rank's comm ended OK and that the ranks agree bitwise.
testing::TensorParallelChainRun OnCuda(const std::string& spec, bool stream, const Tensor& x,
                                       const Tensor& dy) {
  std::vector<std::unique_ptr<Backend>> backends;
  for (int r = 0; r < kRanks; ++r) {
    auto backend = CreateCudaBackend(0, GemmMode::kFp32);
    EXPECT_TRUE(backend.ok()) << backend.status();
    if (!backend.ok()) return {};
    backends.push_back(*std::move(backend));
  }
  const std::vector<testing::TensorParallelChainRun> runs =
      testing::RunTensorParallelChain(Config(), kSeed, kRanks, spec, /*partitions=*/2, stream, x,
                                      dy, Batch(), [&](int r) { return backends[r].get(); });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(runs[r].status.ok()) << "rank " << r << ": " << runs[r].status;
    EXPECT_EQ(runs[r].y.ToVector(), runs[0].y.ToVector()) << "rank " << r << "'s output";
    EXPECT_EQ(runs[r].dx.ToVector(), runs[0].dx.ToVector()) << "rank " << r << "'s dx";
    EXPECT_EQ(runs[r].attn_kept, runs[0].attn_kept) << "rank " << r << "'s attention kept rows";
    EXPECT_EQ(runs[r].mlp_kept, runs[0].mlp_kept) << "rank " << r << "'s MLP kept rows";
  }
  return runs[0];
}

TEST_F(TensorParallelCudaTest, StreamedEqualsWaited_ExactMatchesTheCpu) {
  const Tensor x = Random(1, 1.0f), dy = Random(2, 0.1f);
  for (const std::string spec :
       {"none", "token_topk:keep=0.5", "token_topk:keep=0.5+piecewise:bits=3"}) {
    SCOPED_TRACE(spec);
    const testing::TensorParallelChainRun waited = OnCuda(spec, false, x, dy);
    const testing::TensorParallelChainRun streamed = OnCuda(spec, true, x, dy);
    ASSERT_EQ(waited.y.numel(), x.numel());
    EXPECT_EQ(streamed.y.ToVector(), waited.y.ToVector());
    EXPECT_EQ(streamed.dx.ToVector(), waited.dx.ToVector());
    EXPECT_EQ(streamed.attn_kept, waited.attn_kept);
    EXPECT_EQ(streamed.mlp_kept, waited.mlp_kept);
    for (const auto& [name, grad] : waited.grads) {
      if (name.find("ln_") == std::string::npos) {
        EXPECT_EQ(streamed.grads.at(name).ToVector(), grad.ToVector()) << name;
      } else {
        EXPECT_TRUE(testing::AllClose(name, streamed.grads.at(name).ToVector(), grad.ToVector(),
                                      1e-6f, 1e-5f));
      }
    }
    if (spec == "none") {
      const std::vector<testing::TensorParallelChainRun> cpu =
          testing::RunTensorParallelChain(Config(), kSeed, kRanks, spec, 2, false, x, dy, Batch(),
                                          [](int) { return CpuBackend(); });
      for (const auto& [what, gpu, want] :
           {std::tuple<std::string, const Tensor*, const Tensor*>{"y", &waited.y, &cpu[0].y},
            {"dx", &waited.dx, &cpu[0].dx}}) {
        float scale = 0;
        for (float v : want->ToVector()) scale = std::max(scale, std::fabs(v));
        EXPECT_TRUE(testing::AllClose(what, gpu->ToVector(), want->ToVector(), 1e-4f * scale, 0));
      }
    } else {
      ASSERT_EQ(waited.attn_kept.size(), 64u);
      EXPECT_EQ(std::count(waited.attn_kept.begin(), waited.attn_kept.end(), 1.0f), 32);
      EXPECT_EQ(std::count(waited.mlp_kept.begin(), waited.mlp_kept.end(), 1.0f), 32);
    }
  }
}

}  // namespace
}  // namespace pipetrain
