#include "common/logging.h"

#include <strings.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

#include "common/terminal_safe.h"

namespace pipetrain {
namespace {

LogSeverity SeverityFromEnv() {
  const char* env = std::getenv("PIPETRAIN_LOG_LEVEL");
  if (env == nullptr) return LogSeverity::kInfo;
  bool known = false;
  const LogSeverity severity = ParseLogLevel(env, &known);
  if (!known) {
    // Said once, at the first message: "warning" meant INFO, silently.
    const std::string line = std::string("pipetrain: PIPETRAIN_LOG_LEVEL=\"") +
                             std::string(env).substr(0, 32) +
                             "\" is not INFO, WARNING or ERROR; logging from INFO\n";
    (void)!write(STDERR_FILENO, line.data(), line.size());
  }
  return severity;
}

std::atomic<LogSeverity>& MinSeverity() {
  static std::atomic<LogSeverity> min{SeverityFromEnv()};
  return min;
}

char SeverityLetter(LogSeverity s) {
  switch (s) {
    case LogSeverity::kInfo: return 'I';
    case LogSeverity::kWarning: return 'W';
    case LogSeverity::kError: return 'E';
    case LogSeverity::kFatal: return 'F';
  }
  return '?';
}

}  // namespace

LogSeverity ParseLogLevel(const char* value, bool* known) {
  *known = true;
  if (strcasecmp(value, "INFO") == 0) return LogSeverity::kInfo;
  if (strcasecmp(value, "WARNING") == 0 || strcasecmp(value, "WARN") == 0) {
    return LogSeverity::kWarning;
  }
  if (strcasecmp(value, "ERROR") == 0) return LogSeverity::kError;
  *known = false;
  return LogSeverity::kInfo;
}

void SetMinLogSeverity(LogSeverity severity) { MinSeverity().store(severity); }

LogMessage::LogMessage(const char* file, int line, LogSeverity severity)
    : file_(file), line_(line), severity_(severity) {}

LogMessage::~LogMessage() {
  if (severity_ >= MinSeverity().load() || severity_ == LogSeverity::kFatal) {
    std::time_t now = std::time(nullptr);
    std::tm tm_now;
    localtime_r(&now, &tm_now);
    char stamp[32];
    std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &tm_now);
    const char* base = std::strrchr(file_, '/');
    // Messages quote what clients, workers and peers sent (names, errors):
    // a line break in one would forge a log line, an escape sequence act
    // on the terminal of whoever reads the log. Such text is written inert;
    // every other message as it is.
    std::string message = stream_.str();
    if (FirstTerminalControl(message).has_value()) message = TerminalSafe(message);
    std::string line = std::string(1, SeverityLetter(severity_)) + " " + stamp + " " +
                       (base ? base + 1 : file_) + ":" + std::to_string(line_) + "] " + message +
                       "\n";
    // One write() per message keeps lines from interleaving across threads.
    ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
    (void)ignored;
  }
  if (severity_ == LogSeverity::kFatal) std::abort();
}

}  // namespace pipetrain
