// Minimal logging and invariant checks (Debian's Abseil predates absl/log).
//
//   PT_LOG(INFO) << "loaded " << n << " tokens";
//   PT_CHECK(x.numel() == y.numel()) << "shape mismatch";
//
// PT_CHECK is for broken invariants (programming errors): it prints the
// message with file:line and aborts. Untrusted input must return a Status.
// Thread-safe: each message is written with a single write to stderr, on
// one line: a message holding a line break or another character that acts
// on a terminal is written escaped (common/terminal_safe.h).
#ifndef PIPETRAIN_COMMON_LOGGING_H_
#define PIPETRAIN_COMMON_LOGGING_H_

#include <sstream>

namespace pipetrain {

enum class LogSeverity { kInfo, kWarning, kError, kFatal };

// Messages below this severity are dropped. Default kInfo; PIPETRAIN_LOG_LEVEL
// (INFO, WARNING or WARN, ERROR; any case) overrides it at start-up, and any
// other value is reported on stderr once and means INFO.
void SetMinLogSeverity(LogSeverity severity);

// PIPETRAIN_LOG_LEVEL's reading of `value`; `*known` false (and kInfo) for
// a value that names no level.
LogSeverity ParseLogLevel(const char* value, bool* known);

class LogMessage {
 public:
  LogMessage(const char* file, int line, LogSeverity severity);
  ~LogMessage();  // Emits the line; aborts for kFatal.
  std::ostream& stream() { return stream_; }

 private:
  const char* file_;
  int line_;
  LogSeverity severity_;
  std::ostringstream stream_;
};

// Lets PT_CHECK expand to an expression that swallows the stream when true.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace pipetrain

#define PT_LOG_SEVERITY_INFO ::pipetrain::LogSeverity::kInfo
#define PT_LOG_SEVERITY_WARNING ::pipetrain::LogSeverity::kWarning
#define PT_LOG_SEVERITY_ERROR ::pipetrain::LogSeverity::kError
#define PT_LOG_SEVERITY_FATAL ::pipetrain::LogSeverity::kFatal

#define PT_LOG(severity) \
  ::pipetrain::LogMessage(__FILE__, __LINE__, PT_LOG_SEVERITY_##severity).stream()

#define PT_CHECK(cond)                 \
  (cond) ? (void)0                     \
         : ::pipetrain::LogVoidify() & \
               PT_LOG(FATAL) << "Check failed: " #cond " "

#endif  // PIPETRAIN_COMMON_LOGGING_H_
