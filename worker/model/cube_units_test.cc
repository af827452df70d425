// CubeBlockUnit's token importance (cube_units.h): the 3-D layout's
// attention, on a 2 x 2 x 2 cube of threads (InProcessCubeFabric), must
// score the tokens as the unsplit AttentionUnit of the same seed does, and
// every rank must hold the same bits, so that token top-k keeps the same
// tokens on all of them. (The layers' numerics against the unsplit units
// are worker/cube/cube_blocks_test's; whole jobs are
// worker/runtime/cube_equivalence_test's.)
#include "worker/model/cube_units.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/cube/cube_testing.h"
#include "worker/model/cpu_backend.h"
#include "worker/model/gpt_model.h"

namespace pipetrain {
namespace {

constexpr uint64_t kSeed = 77;
constexpr int kEdge = 2;  // p; the cube has 8 ranks

// 4 heads (2 per column block), d_model 32 (p^2 divides it), vocabulary
// 64 (p^3 divides it).
GptConfig Config() {
  GptConfig c;
  c.vocab_size = 64;
  c.max_seq_len = 8;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 32;
  return c;
}

TokenBatch Batch(int samples) {
  TokenBatch b;
  b.batch = samples;
  b.seq_len = 8;
  for (int i = 0; i < b.batch * b.seq_len; ++i) {
    b.inputs.push_back((i * 29 + 3) % 64);
    b.targets.push_back((i * 13 + 1) % 64);
  }
  return b;
}

// What every rank of the cube returned from Forward then TokenImportance of
// unit `index`, given the full input x.
std::vector<std::vector<float>> CubeScores(int index, const Tensor& x, const TokenBatch& batch) {
  absl::StatusOr<std::unique_ptr<InProcessCubeFabric>> fabric = InProcessCubeFabric::Create(kEdge);
  EXPECT_TRUE(fabric.ok()) << fabric.status();
  std::vector<std::vector<float>> scores(kEdge * kEdge * kEdge);
  const std::vector<absl::Status> status = (*fabric)->Run([&](InProcessCubeComm& comm) {
    CubeUnitGroup group(&comm);
    CubeBlockUnit unit(Config(), index, CpuBackend(), &group);
    InitializeParameters(&unit, kSeed);
    unit.KeepTokenImportance();
    UnitContext ctx;
    unit.Forward(x, batch, &ctx);
    scores[CubeRankIndex(comm.coord(), kEdge)] = unit.TokenImportance(ctx);
    return group.status();
  });
  for (size_t r = 0; r < status.size(); ++r) EXPECT_TRUE(status[r].ok()) << r << ": " << status[r];
  return scores;
}

// Batches of 4 samples (one sample per row block) and 3 (padded to 4, as
// any batch p^2 does not divide is; jobs score only training micro-batches,
// which p^2 divides, but the unit takes any): the unsplit layer's An within
// float rounding (each rank sums its heads in double, the cube then adds
// p partial sums in float), bitwise the same on every rank.
TEST(CubeBlockUnitTest, AttentionTokenImportance_TheWholeLayersOnEveryRank) {
  for (int samples : {4, 3}) {
    const TokenBatch batch = Batch(samples);
    std::unique_ptr<GptModel> unsplit = GptModel::Create(Config(), kSeed).value();
    UnitContext embed_ctx, attn_ctx;
    const Tensor x = unsplit->unit(0).Forward(Tensor(), batch, &embed_ctx);
    unsplit->unit(1).KeepTokenImportance();
    unsplit->unit(1).Forward(x, batch, &attn_ctx);
    const std::vector<float> want = unsplit->unit(1).TokenImportance(attn_ctx);
    ASSERT_EQ(want.size(), static_cast<size_t>(samples * batch.seq_len));

    const std::vector<std::vector<float>> got = CubeScores(1, x, batch);
    float largest = 0;
    for (float v : want) largest = std::max(largest, std::abs(v));
    ASSERT_GT(largest, 0.0f);
    for (size_t r = 0; r < got.size(); ++r) {
      const std::string what = absl::StrCat(samples, " samples, rank ", r);
      ASSERT_EQ(got[r].size(), want.size()) << what;
      EXPECT_EQ(got[r], got[0]) << what << ": not rank 0's bits";
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_NEAR(got[r][i], want[i], 1e-6 * largest) << what << ", token " << i;
      }
    }
    // Sample b's scores differ from sample b+1's: a misplaced row block
    // would not pass for the right one.
    EXPECT_NE(std::vector<float>(want.begin(), want.begin() + 8),
              std::vector<float>(want.begin() + 8, want.begin() + 16));
  }
}

TEST(CubeBlockUnitTest, MlpTokenImportance_None) {
  const TokenBatch batch = Batch(4);
  std::unique_ptr<GptModel> unsplit = GptModel::Create(Config(), kSeed).value();
  UnitContext embed_ctx;
  const Tensor x = unsplit->unit(0).Forward(Tensor(), batch, &embed_ctx);
  for (const std::vector<float>& scores : CubeScores(2, x, batch)) EXPECT_TRUE(scores.empty());
}

}  // namespace
}  // namespace pipetrain
