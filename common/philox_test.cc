#include "common/philox.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// Known-answer vectors for Philox4x32-10 published with the Random123
// library (kat_vectors), so the generator matches other implementations.
TEST(PhiloxTest, Philox4x32_KnownAnswerVectors) {
  EXPECT_EQ(Philox4x32({0, 0, 0, 0}, {0, 0}),
            (PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(Philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
                       {0xffffffff, 0xffffffff}),
            (PhiloxCounter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(Philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
                       {0xa4093822, 0x299f31d0}),
            (PhiloxCounter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(PhiloxTest, FillNormal_SliceEqualsWholeAndMomentsMatch) {
  const int64_t n = 200003;
  std::vector<float> whole(n);
  FillNormal(7, 42, 0.0f, 2.0f, whole.data(), n);
  // Element i depends only on (seed, stream, i): regenerate a prefix.
  std::vector<float> prefix(13);
  FillNormal(7, 42, 0.0f, 2.0f, prefix.data(), 13);
  for (int i = 0; i < 13; ++i) EXPECT_EQ(prefix[i], whole[i]);
  double sum = 0, sum_sq = 0;
  for (float v : whole) {
    sum += v;
    sum_sq += double(v) * v;
  }
  double mean = sum / n, var = sum_sq / n - mean * mean;
  // Standard error of the mean is 2/sqrt(n) ~ 0.0045; of the variance
  // ~ 4*sqrt(2/n) ~ 0.013. Bounds are about 4 standard errors.
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(var, 4.0, 0.06);
}

TEST(PhiloxTest, FillNormal_DifferentStreamsDiffer) {
  std::vector<float> a(8), b(8);
  FillNormal(1, HashName("wte.weight"), 0, 1, a.data(), 8);
  FillNormal(1, HashName("wpe.weight"), 0, 1, b.data(), 8);
  EXPECT_NE(a, b);
}

TEST(PhiloxTest, UniformIndex_InRangeAndRoughlyUniform) {
  std::vector<int> counts(10, 0);
  for (uint32_t i = 0; i < 100000; ++i) {
    uint64_t v = UniformIndex(3, i, 0, 0, 10);
    ASSERT_LT(v, 10u);
    counts[v]++;
  }
  // Expected 10000 each, standard deviation ~95.
  for (int c : counts) EXPECT_NEAR(c, 10000, 500);
}

}  // namespace
}  // namespace pipetrain
