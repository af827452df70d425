#include "common/grpc_log.h"

#include <google/protobuf/stubs/logging.h>
#include <grpc/support/log.h>
#include <stdlib.h>

#include <string>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

int CountOf(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// A flood from one gRPC call site (as failed TLS handshakes make) is cut
// to the burst; another site still logs; each line is ours (escaped, one
// line, gRPC's file and line), marked as gRPC's.
TEST(GrpcLogTest, RateLimited_BurstPerCallSite) {
  RateLimitGrpcLogs();
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 50; ++i)
    gpr_log("ssl_transport_security.cc", 1501, GPR_LOG_SEVERITY_ERROR,
            "Handshake failed\nhttp request");
  gpr_log("chttp2_server.cc", 7, GPR_LOG_SEVERITY_ERROR, "another site");
  const std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(CountOf(out, "ssl_transport_security.cc:1501] gRPC: Handshake failed"), kGrpcLogBurst)
      << out;
  EXPECT_EQ(CountOf(out, "chttp2_server.cc:7] gRPC: another site"), 1) << out;
  EXPECT_EQ(CountOf(out, "\nhttp request"), 0) << out;  // the line break is escaped
}

// Protobuf's lines too (a stranger's reflection request with a string
// that is not UTF-8 made libprotobuf write an ERROR line each, to stderr).
TEST(GrpcLogTest, ProtobufLines_RateLimitedPerCallSite) {
  RateLimitGrpcLogs();
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 50; ++i) {
    // What GOOGLE_LOG(ERROR) does, at the call site protobuf's parser logs from.
    google::protobuf::internal::LogFinisher() =
        google::protobuf::internal::LogMessage(google::protobuf::LOGLEVEL_ERROR,
                                               "wire_format_lite.cc", 581)
        << "String field 'host' contains invalid UTF-8 data";
  }
  const std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(CountOf(out, "wire_format_lite.cc:581] protobuf: String field 'host' contains invalid"),
            kGrpcLogBurst)
      << out;
}

TEST(GrpcLogTest, Cli_QuietUnlessGrpcVerbosityOrTraceIsSet) {
  unsetenv("GRPC_VERBOSITY");
  unsetenv("GRPC_TRACE");
  QuietGrpcLogsUnlessAskedFor();
  ::testing::internal::CaptureStderr();
  gpr_log("quiet.cc", 1, GPR_LOG_SEVERITY_ERROR, "dropped");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  setenv("GRPC_TRACE", "http", 1);
  QuietGrpcLogsUnlessAskedFor();
  ::testing::internal::CaptureStderr();
  gpr_log("quiet.cc", 2, GPR_LOG_SEVERITY_ERROR, "kept");
  EXPECT_EQ(CountOf(::testing::internal::GetCapturedStderr(), "quiet.cc:2] gRPC: kept"), 1);
  unsetenv("GRPC_TRACE");
}

}  // namespace
}  // namespace pipetrain
