#include "coordinator/jobs/covered_ranges.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(CoveredRangesTest, InOrderChunksMergeIntoOneRun) {
  CoveredRanges r;
  for (int64_t b = 0; b < 100; b += 10) r.Add(b, b + 10);
  EXPECT_EQ(r.covered(), 100);
  EXPECT_EQ(r.runs(), 1);
}

TEST(CoveredRangesTest, DuplicateAndOverlappingChunksCountOnce) {
  CoveredRanges r;
  r.Add(0, 4);
  r.Add(0, 4);
  EXPECT_EQ(r.covered(), 4);
  r.Add(2, 6);
  EXPECT_EQ(r.covered(), 6);
  r.Add(10, 12);  // a gap at [6, 10)
  EXPECT_EQ(r.covered(), 8);
  EXPECT_EQ(r.runs(), 2);
  r.Add(5, 11);  // bridges the gap
  EXPECT_EQ(r.covered(), 12);
  EXPECT_EQ(r.runs(), 1);
  r.Add(3, 3);  // empty
  EXPECT_EQ(r.covered(), 12);
}

// Against a bitmap, on random chunks (fixed seed).
TEST(CoveredRangesTest, Touches_AdjacentOrOverlappingOnly) {
  CoveredRanges r;
  EXPECT_FALSE(r.Touches(0, 4));
  r.Add(10, 20);
  EXPECT_TRUE(r.Touches(5, 10));   // ends where the run begins
  EXPECT_TRUE(r.Touches(20, 25));  // begins where it ends
  EXPECT_TRUE(r.Touches(12, 14));
  EXPECT_FALSE(r.Touches(0, 9));
  EXPECT_FALSE(r.Touches(21, 30));
}

TEST(CoveredRangesTest, RandomChunks_MatchABitmap) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 64);
    std::vector<bool> seen(n, false);
    CoveredRanges r;
    for (int k = 0; k < 12; ++k) {
      const int b = static_cast<int>(rng() % (n + 1));
      const int e = b + static_cast<int>(rng() % (n + 1 - b));
      r.Add(b, e);
      for (int i = b; i < e; ++i) seen[i] = true;
      ASSERT_EQ(r.covered(), std::count(seen.begin(), seen.end(), true))
          << "trial " << trial << " chunk " << k;
    }
  }
}

}  // namespace
}  // namespace pipetrain
