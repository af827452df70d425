#include "common/closest_name.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(NameDistance, EditsCountedCaseAndSeparatorsIgnored) {
  EXPECT_EQ(NameDistance("nLayer", "n_layer"), 0);
  EXPECT_EQ(NameDistance("n-layer", "NLAYER"), 0);
  EXPECT_EQ(NameDistance("nLayers", "nLayer"), 1);  // an insertion
  EXPECT_EQ(NameDistance("stps", "steps"), 1);      // a deletion
  EXPECT_EQ(NameDistance("bandwith", "bandwidth"), 1);
  EXPECT_EQ(NameDistance("seqLen", "sepLan"), 2);  // two substitutions
  EXPECT_EQ(NameDistance("", "abc"), 3);
  EXPECT_EQ(NameDistance("kitten", "sitting"), 3);  // the textbook pair
}

TEST(ClosestName, ATypoFindsItsNameAndAStrangerNone) {
  const std::vector<std::string> names = {"nLayer", "nHead", "dModel", "vocabSize"};
  EXPECT_EQ(ClosestName("nLayers", names), "nLayer");
  EXPECT_EQ(ClosestName("n_head", names), "nHead");
  EXPECT_EQ(ClosestName("vocab_sise", names), "vocabSize");
  EXPECT_EQ(ClosestName("bogus", names), "");
  EXPECT_EQ(ClosestName("", names), "");  // 5+ edits from each
  // Short names allow one edit only: "abc" is not a typo of "nHead".
  EXPECT_EQ(ClosestName("abc", {"abd", "nHead"}), "abd");
  EXPECT_EQ(ClosestName("xyz", {"abc"}), "");
}

// Both are cut to 64 bytes: a megabyte of text costs no more than a name.
TEST(NameDistance, LongTextCutTo64Bytes) {
  EXPECT_EQ(NameDistance(std::string(1 << 20, 'a'), std::string(64, 'a')), 0);
}

}  // namespace
}  // namespace pipetrain
