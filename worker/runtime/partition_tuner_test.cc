#include "worker/runtime/partition_tuner.h"

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// embed, attn_0, mlp_0, head.
const std::vector<bool> kBlocks = {false, true, true, false};

TEST(PartitionTuner, Candidates_PlanFirstThenUniformWithoutDuplicates) {
  PartitionTuner tuner({{1, 2, 4, 1}, {1, 4, 2, 1}}, kBlocks, 8, 2);
  ASSERT_EQ(tuner.candidates().size(), 4u);
  EXPECT_EQ(tuner.candidates()[0].forward, (std::vector<int>{1, 2, 4, 1}));
  EXPECT_EQ(tuner.candidates()[1].forward, (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(tuner.candidates()[3].backward, (std::vector<int>{1, 4, 4, 1}));
  EXPECT_EQ(tuner.tuning_iterations(), 9);
  // A plan that is uniform 2 already: three candidates.
  PartitionTuner same({{1, 2, 2, 1}, {1, 2, 2, 1}}, kBlocks, 8, 1);
  EXPECT_EQ(same.candidates().size(), 3u);
}

// Counts run cut to a divisor of the micro-batch's samples: on 2 samples
// uniform 4 runs as uniform 2, so it is one candidate (measured once), and
// the plan's 4s are held as the 2s they run as (what the tuner reports is
// what ran: it reported and exported 4 that no unit had run).
TEST(PartitionTuner, Candidates_HeldAsTheyRunOnTheSamples) {
  PartitionTuner two({{1, 4, 2, 1}, {1, 4, 1, 1}}, kBlocks, 2, 1);
  ASSERT_EQ(two.candidates().size(), 3u);
  EXPECT_EQ(two.candidates()[0].forward, (std::vector<int>{1, 2, 2, 1}));
  EXPECT_EQ(two.candidates()[0].backward, (std::vector<int>{1, 2, 1, 1}));
  EXPECT_EQ(two.candidates()[1].forward, (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(two.candidates()[2].forward, (std::vector<int>{1, 2, 2, 1}));
  EXPECT_EQ(two.candidates()[2].backward, (std::vector<int>{1, 2, 2, 1}));
  EXPECT_EQ(two.tuning_iterations(), 4);
  // One sample: every count runs as 1, a single candidate.
  PartitionTuner one({{1, 4, 2, 1}, {1, 4, 1, 1}}, kBlocks, 1, 1);
  ASSERT_EQ(one.candidates().size(), 1u);
  EXPECT_EQ(one.candidates()[0].forward, (std::vector<int>{1, 1, 1, 1}));
  // 6 samples: 4 runs as 2.
  PartitionTuner six({{1, 2, 2, 1}, {1, 2, 2, 1}}, kBlocks, 6, 1);
  EXPECT_EQ(six.candidates().size(), 2u);  // the plan (uniform 2) and uniform 1
}

TEST(PartitionTuner, Schedule_WarmUpThenEachCandidateThenTheFastest) {
  PartitionTuner tuner({{1, 2, 4, 1}, {1, 4, 2, 1}}, kBlocks, 8, 2);
  // Iteration 0 (warm-up) and 1-2 run the plan, 3-4 uniform 1, 5-6
  // uniform 2, 7-8 uniform 4.
  EXPECT_EQ(&tuner.CandidateFor(0), &tuner.candidates()[0]);
  EXPECT_EQ(&tuner.CandidateFor(2), &tuner.candidates()[0]);
  EXPECT_EQ(&tuner.CandidateFor(3), &tuner.candidates()[1]);
  EXPECT_EQ(&tuner.CandidateFor(8), &tuner.candidates()[3]);
  const std::vector<double> seconds = {9, 1.0, 1.1, 0.9, 0.9, 0.7, 0.8, 0.75, 0.7};
  for (int i = 0; i < 9; ++i) {
    EXPECT_EQ(tuner.DecidesAfter(i), i == 8) << i;
    tuner.Record(i, seconds[i]);  // the warm-up's 9 s is not recorded
  }
  EXPECT_NEAR(tuner.totals()[0], 2.1, 1e-12);
  EXPECT_NEAR(tuner.totals()[2], 1.5, 1e-12);
  EXPECT_NEAR(tuner.totals()[3], 1.45, 1e-12);
  // The group's sums decide, not this rank's alone.
  EXPECT_EQ(tuner.Decide({4.0, 3.6, 3.0, 3.1}), 2);
  EXPECT_TRUE(tuner.decided());
  EXPECT_EQ(&tuner.CandidateFor(9), &tuner.candidates()[2]);
  EXPECT_EQ(&tuner.CandidateFor(1000), &tuner.candidates()[2]);
  EXPECT_FALSE(tuner.DecidesAfter(8));
  tuner.Record(9, 100);  // after the decision: ignored
  EXPECT_NEAR(tuner.totals()[2], 1.5, 1e-12);
}

TEST(PartitionTuner, Decide_TiesGoToThePlan) {
  PartitionTuner tuner({{1, 2, 4, 1}, {1, 4, 2, 1}}, kBlocks, 8, 1);
  EXPECT_EQ(tuner.Decide({1.0, 1.0, 2.0, 1.0}), 0);
}

// A resumed stage's checkpointed choice: kept at once, from the first
// iteration, with nothing measured or decided after.
TEST(PartitionTuner, Adopt_KeepsTheChoiceWithoutMeasuring) {
  PartitionTuner tuner({{1, 2, 4, 1}, {1, 4, 2, 1}}, kBlocks, 8, 2);
  EXPECT_TRUE(tuner.Adopt({{1, 2, 2, 1}, {1, 2, 2, 1}}));  // uniform 2, a candidate
  EXPECT_TRUE(tuner.decided());
  EXPECT_EQ(tuner.chosen(), 2);
  for (int64_t i : {0, 1, 5, 100}) {
    EXPECT_EQ(tuner.CandidateFor(i).forward, (std::vector<int>{1, 2, 2, 1}));
    EXPECT_FALSE(tuner.DecidesAfter(i));
    tuner.Record(i, 1.0);
  }
  EXPECT_EQ(tuner.totals(), std::vector<double>(4, 0.0));
  // Counts no candidate has (the plan changed since it was measured): kept too.
  PartitionTuner other({{1, 2, 4, 1}, {1, 4, 2, 1}}, kBlocks, 8, 2);
  EXPECT_TRUE(other.Adopt({{1, 4, 1, 1}, {1, 1, 2, 1}}));
  EXPECT_EQ(other.CandidateFor(0).backward, (std::vector<int>{1, 1, 2, 1}));
  EXPECT_EQ(other.candidates().size(), other.totals().size());
}

// A choice of another size, or with a count the units would cut (4 on 2
// samples runs as 2, so it is not what was measured), is refused and
// changes nothing: the stage measures.
TEST(PartitionTuner, Adopt_RefusesWhatCouldNotHaveRun) {
  PartitionTuner tuner({{1, 2, 2, 1}, {1, 2, 1, 1}}, kBlocks, 2, 1);
  EXPECT_FALSE(tuner.Adopt({{1, 4, 1, 1}, {1, 1, 1, 1}}));
  EXPECT_FALSE(tuner.Adopt({{1, 1, 1}, {1, 1, 1}}));
  EXPECT_FALSE(tuner.Adopt({{1, 1, 1, 1}, {1, 1, 1}}));
  EXPECT_FALSE(tuner.decided());
  EXPECT_EQ(tuner.candidates().size(), 3u);
  EXPECT_EQ(tuner.CandidateFor(2).forward, (std::vector<int>{1, 1, 1, 1}));
}

// Under Bi-Partition a block unit whose forward or backward runs on another
// stage keeps the plan's counts in every candidate (that stage's tuner may
// choose otherwise, and the recompute must rebuild the forward), and a
// recorded choice that changed them is refused.
TEST(PartitionTuner, UnitNotTunable_KeepsThePlansCounts) {
  // attn_0 runs both passes here; mlp_0's forward runs elsewhere.
  const std::vector<bool> tunable = {false, true, false, false};
  PartitionTuner tuner({{1, 2, 4, 1}, {1, 4, 2, 1}}, tunable, 8, 1);
  ASSERT_EQ(tuner.candidates().size(), 4u);
  for (const PartitionCandidate& c : tuner.candidates()) {
    EXPECT_EQ(c.forward[2], 4) << c.ToString();
    EXPECT_EQ(c.backward[2], 2) << c.ToString();
  }
  EXPECT_EQ(tuner.candidates()[1].forward, (std::vector<int>{1, 1, 4, 1}));
  EXPECT_FALSE(tuner.Adopt({{1, 2, 2, 1}, {1, 4, 2, 1}}));
  EXPECT_TRUE(tuner.Adopt({{1, 1, 4, 1}, {1, 1, 2, 1}}));
}

}  // namespace
}  // namespace pipetrain
