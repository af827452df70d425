// Checks that cc_proto (tools/proto.bzl) generates usable message and gRPC
// code, including a proto that imports another cc_proto target.
#include "gtest/gtest.h"
#include "tools/testdata/echo.grpc.pb.h"
#include "tools/testdata/echo.pb.h"

namespace pipetrain::tools::testdata {
namespace {

TEST(ProtoMacroTest, GeneratedMessage_RoundTripsThroughWireFormat) {
  EchoRequest request;
  request.set_text("hello");
  request.mutable_payload()->add_values(1.5f);
  std::string wire;
  ASSERT_TRUE(request.SerializeToString(&wire));
  EchoRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire));
  EXPECT_EQ(parsed.text(), "hello");
  EXPECT_EQ(parsed.payload().values(0), 1.5f);
}

TEST(ProtoMacroTest, GeneratedService_HasMethodName) {
  EXPECT_STREQ(Echo::service_full_name(), "pipetrain.tools.testdata.Echo");
}

}  // namespace
}  // namespace pipetrain::tools::testdata
