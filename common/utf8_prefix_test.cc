#include "common/utf8_prefix.h"

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(Utf8PrefixTest, FitsWhole_ElseCutBeforeTheSplitCharacter) {
  EXPECT_EQ(Utf8Prefix("abc", 3), "abc");
  EXPECT_EQ(Utf8Prefix("abc", 2), "ab");
  // "a" then U+00E9 (2 bytes) then U+20AC (3 bytes).
  const absl::string_view text = "a\xc3\xa9\xe2\x82\xac";
  EXPECT_EQ(Utf8Prefix(text, 1), "a");
  EXPECT_EQ(Utf8Prefix(text, 2), "a");  // inside U+00E9
  EXPECT_EQ(Utf8Prefix(text, 3), "a\xc3\xa9");
  EXPECT_EQ(Utf8Prefix(text, 4), "a\xc3\xa9");  // inside U+20AC
  EXPECT_EQ(Utf8Prefix(text, 5), "a\xc3\xa9");
  EXPECT_EQ(Utf8Prefix(text, 6), text);
  EXPECT_EQ(Utf8Prefix(text, 0), "");
}

}  // namespace
}  // namespace pipetrain
