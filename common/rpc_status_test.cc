#include "common/rpc_status.h"

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pipetrain {
namespace {

TEST(RpcStatus, FieldViolationsOf_FieldPathMessage_NamesFieldAndLimit) {
  EXPECT_EQ(FieldViolationsOf(absl::InvalidArgumentError(
                "spec.training.steps: 2000000 exceeds the limit of 1000000")),
            (std::vector<FieldViolation>{
                {"spec.training.steps", "2000000 exceeds the limit of 1000000"}}));
  EXPECT_EQ(FieldViolationsOf(absl::OutOfRangeError("page_size: must be in [0, 1000]")).size(), 1u);
}

TEST(RpcStatus, FieldViolationsOf_OtherMessagesAndCodes_None) {
  EXPECT_TRUE(FieldViolationsOf(absl::InvalidArgumentError("no colon here")).empty());
  EXPECT_TRUE(FieldViolationsOf(absl::InvalidArgumentError("two words: not a path")).empty());
  EXPECT_TRUE(FieldViolationsOf(absl::NotFoundError("job: job-9 not found")).empty());
  EXPECT_TRUE(FieldViolationsOf(absl::OkStatus()).empty());
}

TEST(RpcStatus, EncodeDecode_RoundTripsCodeMessageAndViolations) {
  const absl::Status status = absl::InvalidArgumentError("spec.model.layers: 0 is below 1");
  absl::StatusOr<DecodedRpcStatus> decoded = DecodeRpcStatus(EncodeRpcStatus(status));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->code, 3);
  EXPECT_EQ(decoded->message, "spec.model.layers: 0 is below 1");
  EXPECT_EQ(decoded->violations,
            (std::vector<FieldViolation>{{"spec.model.layers", "0 is below 1"}}));
}

TEST(RpcStatus, Encode_WithoutViolations_HasNoDetails) {
  absl::StatusOr<DecodedRpcStatus> decoded =
      DecodeRpcStatus(EncodeRpcStatus(absl::NotFoundError("job job-9 not found")));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->code, 5);
  EXPECT_TRUE(decoded->violations.empty());
}

TEST(RpcStatus, Json_IsGoogleRpcStatusInProto3Json) {
  EXPECT_EQ(nlohmann::json::parse(RpcStatusJson(absl::InvalidArgumentError("page_token: bad"))),
            nlohmann::json::parse(R"({"code": 3, "message": "page_token: bad", "details": [
                {"@type": "type.googleapis.com/google.rpc.BadRequest",
                 "fieldViolations": [{"field": "page_token", "description": "bad"}]}]})"));
  EXPECT_EQ(nlohmann::json::parse(RpcStatusJson(absl::UnavailableError("later \xff"))),
            nlohmann::json::parse(R"({"code": 14, "message": "later \ufffd", "details": []})"));
}

// Only the two codes after which the call may have happened: every other
// failure was surely refused, and OK is not a failure.
// A coordinator that is sure nothing was done says so: the CLI then does
// not tell the user the job may exist.
TEST(RpcStatus, SaysNothingSubmitted_TheCoordinatorsWords) {
  EXPECT_TRUE(SaysNothingSubmitted(absl::UnavailableError(
      "spec.checkpoint.dir: \"x\" is in use by job j (CANCELLED: ...; retry then); nothing was "
      "submitted")));
  EXPECT_FALSE(SaysNothingSubmitted(absl::UnavailableError("failed to connect to all addresses")));
}

TEST(RpcStatus, OutcomeUnknown_OnlyUnavailableAndDeadlineExceeded) {
  for (int code = 0; code <= 16; ++code) {
    const absl::Status status(static_cast<absl::StatusCode>(code), code == 0 ? "" : "failed");
    EXPECT_EQ(OutcomeUnknown(status), code == 14 || code == 4) << status;
  }
}

}  // namespace
}  // namespace pipetrain
