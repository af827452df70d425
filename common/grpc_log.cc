#include "common/grpc_log.h"

#include <google/protobuf/stubs/logging.h>
#include <grpc/support/log.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "common/annotated_mutex.h"
#include "common/log_rate_limiter.h"
#include "common/logging.h"

namespace pipetrain {
namespace {

// One limiter per gRPC call site (file, line): a flood from one source
// (handshakes) does not hide a rare line from another. gRPC has a few
// hundred log sites, so the map stays small.
LogRateLimiter& LimiterFor(const char* file, int line) {
  // Never destroyed: gRPC may log from its threads while the process exits.
  static AnnotatedMutex* const mu = new AnnotatedMutex();
  static auto* const limiters =
      new std::map<std::pair<std::string, int>, std::unique_ptr<LogRateLimiter>>();
  AnnotatedMutexLock lock(mu);
  std::unique_ptr<LogRateLimiter>& limiter = (*limiters)[{file != nullptr ? file : "", line}];
  if (limiter == nullptr) {
    limiter = std::make_unique<LogRateLimiter>(kGrpcLogBurst, absl::Seconds(kGrpcLogPeriodSeconds));
  }
  return *limiter;
}

void RateLimitedLog(gpr_log_func_args* args) {
  int64_t dropped = 0;
  if (!LimiterFor(args->file, args->line).Allow(&dropped)) return;
  const LogSeverity severity =
      args->severity == GPR_LOG_SEVERITY_ERROR ? LogSeverity::kError : LogSeverity::kInfo;
  LogMessage(args->file != nullptr ? args->file : "grpc", args->line, severity).stream()
      << "gRPC: " << (args->message != nullptr ? args->message : "")
      << LogRateLimiter::Dropped(dropped);
}

// Protobuf's lines (GOOGLE_LOG), as gRPC's: a stranger can cause some at
// will, e.g. an "invalid UTF-8" ERROR (about 250 bytes) for each reflection
// request of three bytes, and protobuf's own handler wrote each to stderr.
// FATAL lines are never dropped (protobuf aborts after them).
void RateLimitedProtobufLog(google::protobuf::LogLevel level, const char* file, int line,
                            const std::string& message) {
  int64_t dropped = 0;
  if (level != google::protobuf::LOGLEVEL_FATAL && !LimiterFor(file, line).Allow(&dropped)) return;
  const LogSeverity severity = level >= google::protobuf::LOGLEVEL_ERROR     ? LogSeverity::kError
                               : level == google::protobuf::LOGLEVEL_WARNING ? LogSeverity::kWarning
                                                                             : LogSeverity::kInfo;
  LogMessage(file != nullptr ? file : "protobuf", line, severity).stream()
      << "protobuf: " << message << LogRateLimiter::Dropped(dropped);
}

void DropLog(gpr_log_func_args*) {}

bool Set(const char* variable) {
  const char* value = std::getenv(variable);
  return value != nullptr && *value != '\0';
}

}  // namespace

// gpr_log prints nothing until the verbosity is read ($GRPC_VERBOSITY,
// default ERROR), which grpc_init does; done here too, so that the
// function set is the one in effect from the first line.
void RateLimitGrpcLogs() {
  gpr_log_verbosity_init();
  gpr_set_log_function(RateLimitedLog);
  google::protobuf::SetLogHandler(RateLimitedProtobufLog);
}

void QuietGrpcLogsUnlessAskedFor() {
  gpr_log_verbosity_init();
  gpr_set_log_function(Set("GRPC_VERBOSITY") || Set("GRPC_TRACE") ? RateLimitedLog : DropLog);
}

}  // namespace pipetrain
