#include "coordinator/planner/fused_embedding_sync.h"

#include "coordinator/planner/schedule_compiler.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

int CountTied(const v1::Program& p) {
  int n = 0;
  for (const v1::Instruction& in : p.instructions()) {
    n += (in.has_send() && in.send().tensor().kind() == v1::TENSOR_KIND_TIED_EMBEDDING_GRAD) ||
         (in.has_recv() && in.recv().tensor().kind() == v1::TENSOR_KIND_TIED_EMBEDDING_GRAD);
  }
  return n;
}

const v1::Instruction::AddTiedGradient* FindAdd(const v1::Program& p) {
  for (const v1::Instruction& in : p.instructions()) {
    if (in.has_add_tied_gradient()) return &in.add_tied_gradient();
  }
  return nullptr;
}

// Units 0 embed ... 5 head over three stages, and a Bi-Partition plan whose
// head's backward runs on stage 2 while stage 0 owns the embedding's.
TEST(FuseEmbeddingSync, OwnersOnTwoStages_ExchangeGoneAddFused) {
  for (const auto& [forward, backward] :
       std::vector<std::pair<std::vector<Range>, std::vector<Range>>>{
           {{{0, 2}, {2, 4}, {4, 6}}, {{0, 2}, {2, 4}, {4, 6}}},
           {{{0, 2}, {2, 2}, {2, 6}}, {{0, 1}, {1, 4}, {4, 6}}}}) {
    auto programs =
        CompileBiPartitionPrograms(forward, backward, 6, 2, Schedule::kOneFOneB).value();
    const auto before = programs;
    ASSERT_EQ(CountTied(programs[0]), 2);
    ASSERT_TRUE(FuseEmbeddingSync(backward, &programs).value());
    for (int s : {0, 2}) {
      EXPECT_EQ(CountTied(programs[s]), 0) << s;
      EXPECT_EQ(programs[s].instructions_size(), before[s].instructions_size() - 2) << s;
      const auto* add = FindAdd(programs[s]);
      ASSERT_NE(add, nullptr) << s;
      EXPECT_TRUE(add->fused());
      EXPECT_EQ(add->embed_stage(), 0);
      EXPECT_EQ(add->head_stage(), 2);
    }
    EXPECT_EQ(programs[1].SerializeAsString(), before[1].SerializeAsString());
  }
}

// The ranges read from the programs give the rewrite the plan's own,
// stages without a Backward included (Bi-Partition lets a worker have
// none, the last one too): the simulator prices what the workers run.
TEST(FuseEmbeddingSync, OfPrograms_SameAsWithThePlansRanges) {
  for (const auto& [forward, backward] :
       std::vector<std::pair<std::vector<Range>, std::vector<Range>>>{
           {{{0, 2}, {2, 4}, {4, 6}}, {{0, 2}, {2, 4}, {4, 6}}},
           {{{0, 2}, {2, 4}, {4, 6}}, {{0, 2}, {2, 6}, {6, 6}}},
           {{{0, 2}, {2, 4}, {4, 6}}, {{0, 3}, {3, 3}, {3, 6}}},
           {{{0, 2}, {2, 2}, {2, 6}}, {{0, 1}, {1, 4}, {4, 6}}}}) {
    auto programs =
        CompileBiPartitionPrograms(forward, backward, 6, 2, Schedule::kOneFOneB).value();
    auto by_plan = programs;
    ASSERT_TRUE(FuseEmbeddingSync(backward, &by_plan).value());
    absl::StatusOr<bool> fused = FuseEmbeddingSyncOfPrograms(&programs);
    ASSERT_TRUE(fused.ok()) << fused.status();
    EXPECT_TRUE(*fused);
    for (size_t s = 0; s < programs.size(); ++s) {
      EXPECT_EQ(programs[s].SerializeAsString(), by_plan[s].SerializeAsString()) << s;
    }
  }
}

TEST(FuseEmbeddingSync, OneOwner_Unchanged) {
  const std::vector<Range> ranges = {{0, 6}};
  auto programs = CompileBiPartitionPrograms(ranges, ranges, 6, 2, Schedule::kGPipe).value();
  const auto before = programs;
  EXPECT_FALSE(FuseEmbeddingSync(ranges, &programs).value());
  EXPECT_EQ(programs[0].SerializeAsString(), before[0].SerializeAsString());
}

TEST(FuseEmbeddingSync, AlreadyFused_Internal) {
  const std::vector<Range> ranges = {{0, 3}, {3, 6}};
  auto programs = CompileBiPartitionPrograms(ranges, ranges, 6, 2, Schedule::kGPipe).value();
  ASSERT_TRUE(FuseEmbeddingSync(ranges, &programs).value());
  EXPECT_EQ(FuseEmbeddingSync(ranges, &programs).status().code(), absl::StatusCode::kInternal);
}

// Optimus-CC eq. 15 and 16, and the paper's "42.9%" at D = 4: the unfused
// synchronization costs 1.429 times the fused one, tending to 1.5.
TEST(FuseEmbeddingSync, CostModel_Eq15And16) {
  EXPECT_DOUBLE_EQ(UnfusedEmbeddingSyncVolume(1.0, 4), 2.5);
  EXPECT_DOUBLE_EQ(FusedEmbeddingSyncVolume(1.0, 4), 1.75);
  EXPECT_NEAR(UnfusedEmbeddingSyncVolume(1.0, 4) / FusedEmbeddingSyncVolume(1.0, 4) - 1, 0.429,
              5e-4);
  EXPECT_NEAR(UnfusedEmbeddingSyncVolume(1.0, 1000) / FusedEmbeddingSyncVolume(1.0, 1000), 1.5,
              1e-3);
  // D = 1: the exchange alone (V) against a two-rank all-reduce (V).
  EXPECT_DOUBLE_EQ(UnfusedEmbeddingSyncVolume(1.0, 1), FusedEmbeddingSyncVolume(1.0, 1));
}

}  // namespace
}  // namespace pipetrain
