#include "common/terminal_safe.h"

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(TerminalSafeTest, PlainTextAndOtherUnicode_Untouched) {
  for (const char* text : {"", "gpt2-small run 3", "caf\xc3\xa9", "\xe6\x97\xa5\xe6\x9c\xac",
                           "\xe2\x80\x94 dash", "\xf0\x9f\x98\x80"}) {
    EXPECT_EQ(FirstTerminalControl(text), std::nullopt) << text;
    EXPECT_EQ(TerminalSafe(text), text);
  }
}

TEST(TerminalSafeTest, ControlsFoundAndEscaped) {
  struct Case {
    std::string text;
    size_t first;
    std::string safe;
  } cases[] = {
      {"a\x1b[2Jb", 1, "a\\x1b[2Jb"},                     // ESC: clear the screen
      {"\x1b]0;pwned\x07", 0, "\\x1b]0;pwned\\x07"},      // OSC: the window title
      {"run\r\nfake-line", 3, "run\\x0d\\x0afake-line"},  // a forged line
      {"tab\there", 3, "tab\\x09here"},
      {"del\x7f", 3, "del\\x7f"},
      {"c1 \xc2\x9b"
       "31m",
       3, "c1 \\u{009B}31m"},                                  // CSI as a C1 control
      {"file\xe2\x80\xaegpj.exe", 4, "file\\u{202E}gpj.exe"},  // right-to-left override
      {"iso\xe2\x81\xa6x", 3, "iso\\u{2066}x"},
      {"line\xe2\x80\xa8"
       "forged",
       4, "line\\u{2028}forged"},  // a line separator
      {"para\xe2\x80\xa9", 4, "para\\u{2029}"},
      {"rlm\xe2\x80\x8f", 3, "rlm\\u{200F}"},  // bidi marks
      {"lrm\xe2\x80\x8e", 3, "lrm\\u{200E}"},
      {"alm\xd8\x9c", 3, "alm\\u{061C}"},
      {std::string("nul\0x", 5), 3, "nul\\x00x"},
      {"back\\slash\x01", 10, "back\\\\slash\\x01"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(FirstTerminalControl(c.text), c.first) << c.safe;
    EXPECT_EQ(TerminalSafe(c.text), c.safe);
  }
}

// A lead byte at the end, and sequences that only look like the controls.
TEST(TerminalSafeTest, TruncatedOrNearSequences_NotControls) {
  for (const std::string& text :
       {std::string("x\xc2"), std::string("x\xe2\x80"), std::string("\xc2\xa0nbsp"),
        std::string("\xe2\x80\xaf"), std::string("\xd8\x9b"), std::string("x\xd8")}) {
    EXPECT_EQ(FirstTerminalControl(text), std::nullopt);
    EXPECT_EQ(TerminalSafe(text), text);
  }
}

}  // namespace
}  // namespace pipetrain
