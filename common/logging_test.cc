// PIPETRAIN_LOG_LEVEL's values: the three levels in any case; anything else
// is reported as unknown (and means INFO), where "warning" used to mean INFO
// silently.
#include "common/logging.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(ParseLogLevelTest, LevelsInAnyCase_OthersUnknown) {
  struct Case {
    const char* value;
    LogSeverity severity;
    bool known;
  };
  for (const Case& c :
       {Case{"INFO", LogSeverity::kInfo, true}, Case{"warning", LogSeverity::kWarning, true},
        Case{"Warn", LogSeverity::kWarning, true}, Case{"ERROR", LogSeverity::kError, true},
        Case{"error", LogSeverity::kError, true}, Case{"debug", LogSeverity::kInfo, false},
        Case{"", LogSeverity::kInfo, false}, Case{"WARNING ", LogSeverity::kInfo, false}}) {
    bool known = !c.known;
    EXPECT_EQ(ParseLogLevel(c.value, &known), c.severity) << c.value;
    EXPECT_EQ(known, c.known) << c.value;
  }
}

// What PT_LOG(WARNING) writes to stderr for `message`.
std::string Logged(const std::string& message) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/stderr.txt";
  const int file = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  const int saved = dup(STDERR_FILENO);
  dup2(file, STDERR_FILENO);
  PT_LOG(WARNING) << message;
  dup2(saved, STDERR_FILENO);
  close(saved);
  close(file);
  std::string out;
  if (FILE* in = std::fopen(path.c_str(), "r")) {
    char buffer[256];
    while (size_t n = std::fread(buffer, 1, sizeof(buffer), in)) out.append(buffer, n);
    std::fclose(in);
  }
  return out;
}

// Log lines quote what others sent: a line break would forge a line and an
// escape sequence act on the reader's terminal. Plain text is unchanged.
TEST(LogMessageTest, ControlCharacters_WrittenInertOnOneLine) {
  const std::string forged = Logged("worker w-2: boom\nI 00:00:00 main.cc:1] all fine\x1b[2J");
  EXPECT_NE(forged.find("] worker w-2: boom\\x0aI 00:00:00 main.cc:1] all fine\\x1b[2J\n"),
            std::string::npos)
      << forged;
  EXPECT_EQ(forged.find('\n'), forged.size() - 1) << forged;  // one line
  const std::string plain = Logged("a path C:\\dir and a tab-free message");
  EXPECT_NE(plain.find("] a path C:\\dir and a tab-free message\n"), std::string::npos) << plain;
}

}  // namespace
}  // namespace pipetrain
