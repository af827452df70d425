// PIPETRAIN_LOG_LEVEL's values: the three levels in any case; anything else
// is reported as unknown (and means INFO), where "warning" used to mean INFO
// silently.
#include "common/logging.h"

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

}  // namespace
}  // namespace pipetrain
