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

// Well-formed UTF-8 stays as it is; every byte outside a well-formed
// sequence is written as \xNN, and what comes out is well-formed.
TEST(ValidUtf8Test, KeepsWellFormedEscapesTheRest) {
  EXPECT_EQ(ValidUtf8(""), "");
  EXPECT_EQ(ValidUtf8("peer \"w-2\" gone"), "peer \"w-2\" gone");
  EXPECT_EQ(ValidUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
            "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(ValidUtf8("x\xffy"), "x\\xffy");  // gRPC decodes %FF to this byte
  EXPECT_EQ(ValidUtf8("\xc3"), "\\xc3");      // cut short
  EXPECT_EQ(ValidUtf8("\xc3z"), "\\xc3z");
  EXPECT_EQ(ValidUtf8("\x80"), "\\x80");           // a lone continuation
  EXPECT_EQ(ValidUtf8("\xc0\xaf"), "\\xc0\\xaf");  // overlong '/'
  EXPECT_EQ(ValidUtf8("\xe0\x80\xaf"), "\\xe0\\x80\\xaf");
  EXPECT_EQ(ValidUtf8("\xed\xa0\x80"), "\\xed\\xa0\\x80");           // a surrogate
  EXPECT_EQ(ValidUtf8("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
  EXPECT_EQ(ValidUtf8("\xf5\x80\x80\x80"), "\\xf5\\x80\\x80\\x80");
  EXPECT_EQ(ValidUtf8(std::string("a\0b", 3)), std::string("a\0b", 3));  // NUL is UTF-8
  // Every two-byte string: the output never holds a byte >= 0x80 that the
  // input did not hold as part of a well-formed pair.
  for (int a = 0; a < 256; ++a) {
    for (int b = 0; b < 256; ++b) {
      const std::string in = {static_cast<char>(a), static_cast<char>(b)};
      const std::string out = ValidUtf8(in);
      const bool pair = a >= 0xC2 && a <= 0xDF && b >= 0x80 && b <= 0xBF;
      if (pair || (a < 0x80 && b < 0x80)) {
        EXPECT_EQ(out, in) << a << " " << b;
      } else {
        EXPECT_NE(out, in) << a << " " << b;
      }
      EXPECT_EQ(ValidUtf8(out), out) << a << " " << b;  // well-formed: unchanged
    }
  }
}

}  // namespace
}  // namespace pipetrain
