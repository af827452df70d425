#include "common/echo_input.h"

#include <string>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(EchoInputTest, PlainText_AsItIs) {
  EXPECT_EQ(EchoInput("job-e1-7"), "job-e1-7");
  EXPECT_EQ(EchoInput(""), "");
}

TEST(EchoInputTest, ControlsQuotesAndNonAscii_Escaped) {
  EXPECT_EQ(EchoInput("a\x1b[2J\nb"), "a\\x1b[2J\\nb");
  EXPECT_EQ(EchoInput("say \"hi\" \\ 'x'"), "say \\\"hi\\\" \\\\ \\'x\\'");
  EXPECT_EQ(EchoInput("\xc3\xa9"), "\\xc3\\xa9");
}

TEST(EchoInputTest, Long_CutWithAMark) {
  EXPECT_EQ(EchoInput(std::string(100, 'x')), std::string(64, 'x') + "...");
  EXPECT_EQ(EchoInput(std::string(64, 'x')), std::string(64, 'x'));
  EXPECT_EQ(EchoInput("abcdef", 3), "abc...");
  // A character cut in two shows its first byte escaped.
  EXPECT_EQ(EchoInput("a\xc3\xa9", 2), "a\\xc3...");
}

}  // namespace
}  // namespace pipetrain
