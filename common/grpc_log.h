// gRPC's own log lines (gpr_log: failed TLS handshakes, refused
// connections, transport errors) bypass PT_LOG and its escaping, and some
// can be caused at will by anyone who reaches a port: every failed TLS
// handshake wrote a line (about 170 bytes; 10,000 connections in 3 s made
// 1.7 MB) with nothing to bound it.
#ifndef PIPETRAIN_COMMON_GRPC_LOG_H_
#define PIPETRAIN_COMMON_GRPC_LOG_H_

namespace pipetrain {

// For the daemons: gRPC's lines go through PT_LOG (one line, escaped, with
// gRPC's file and line), at most kGrpcLogBurst per gRPC call site every
// kGrpcLogPeriod, the next one counting those left out; protobuf's too
// (GOOGLE_LOG: an "invalid UTF-8" ERROR for each of a stranger's
// reflection requests), but FATAL ones. Call early in main.
void RateLimitGrpcLogs();

// For the CLI, which prints its own error for a failed call: gRPC's lines
// are dropped, unless $GRPC_VERBOSITY or $GRPC_TRACE is set (a user
// debugging gRPC), when they are kept as RateLimitGrpcLogs keeps them.
void QuietGrpcLogsUnlessAskedFor();

inline constexpr int kGrpcLogBurst = 5;
inline constexpr int kGrpcLogPeriodSeconds = 10;

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_GRPC_LOG_H_
