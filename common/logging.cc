#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

namespace pipetrain {
namespace {

LogSeverity SeverityFromEnv() {
  const char* env = std::getenv("PIPETRAIN_LOG_LEVEL");
  if (env == nullptr) return LogSeverity::kInfo;
  if (std::strcmp(env, "WARNING") == 0) return LogSeverity::kWarning;
  if (std::strcmp(env, "ERROR") == 0) return LogSeverity::kError;
  return LogSeverity::kInfo;
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
    std::string line = std::string(1, SeverityLetter(severity_)) + " " + stamp +
                       " " + (base ? base + 1 : file_) + ":" +
                       std::to_string(line_) + "] " + stream_.str() + "\n";
    // One write() per message keeps lines from interleaving across threads.
    ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
    (void)ignored;
  }
  if (severity_ == LogSeverity::kFatal) std::abort();
}

}  // namespace pipetrain
