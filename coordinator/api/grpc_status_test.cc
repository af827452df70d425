#include "coordinator/api/grpc_status.h"

#include <string>

#include "absl/strings/match.h"
#include "common/rpc_status.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(ToGrpcStatus, ShortMessage_PassedThroughWithItsFieldViolation) {
  const grpc::Status s =
      ToGrpcStatus(absl::InvalidArgumentError("spec.training.steps: 0 is below the minimum of 1"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "spec.training.steps: 0 is below the minimum of 1");
  const DecodedRpcStatus details = DecodeRpcStatus(s.error_details()).value();
  ASSERT_EQ(details.violations.size(), 1u);
  EXPECT_EQ(details.violations[0].field, "spec.training.steps");
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_EQ(ToGrpcStatus(absl::NotFoundError("no job job-1")).error_details(), "");
}

// A message quoting a request (an unknown id of 1 MB) is cut, on a UTF-8
// character, with how much was left out; the details are cut alike.
TEST(ToGrpcStatus, LongMessage_CutAndSaysHowMuchWasLeftOut) {
  const std::string id(1 << 20, 'x');
  grpc::Status s = ToGrpcStatus(absl::NotFoundError("no job " + id));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_LE(s.error_message().size(), kMaxStatusMessageBytes);
  EXPECT_TRUE(absl::StartsWith(s.error_message(), "no job xxx")) << s.error_message();
  const size_t kept = s.error_message().find(" ... [");
  ASSERT_NE(kept, std::string::npos);
  EXPECT_TRUE(absl::EndsWith(s.error_message(),
                             absl::StrCat(" ... [", 7 + id.size() - kept, " more bytes]")));

  std::string accents;
  while (accents.size() < 4000) accents += "\xC3\xA9";  // "é"
  s = ToGrpcStatus(absl::InvalidArgumentError("job_id: " + accents));
  EXPECT_LE(s.error_message().size(), kMaxStatusMessageBytes);
  const size_t cut = s.error_message().find(" ... [");
  ASSERT_NE(cut, std::string::npos);
  EXPECT_EQ((cut - 8) % 2, 0u) << "cut inside a character";
  const DecodedRpcStatus details = DecodeRpcStatus(s.error_details()).value();
  EXPECT_EQ(details.message, s.error_message());
  ASSERT_EQ(details.violations.size(), 1u);
  EXPECT_EQ(details.violations[0].field, "job_id");
  EXPECT_LE(details.violations[0].description.size(), kMaxStatusMessageBytes);
}

// The time left before the caller's deadline, less a fifth of it (at most
// a second) for the answer's way back; none past it; infinite without one.
TEST(CallerWaitBudget, TimeLeftLessTheWayBack) {
  const absl::Time now = absl::FromUnixSeconds(1'800'000'000);
  const auto at = [&](absl::Duration from_now) { return absl::ToChronoTime(now + from_now); };
  EXPECT_EQ(CallerWaitBudget(at(absl::Seconds(3)), now), absl::Milliseconds(2400));
  EXPECT_EQ(CallerWaitBudget(at(absl::Seconds(10)), now), absl::Seconds(9));
  EXPECT_EQ(CallerWaitBudget(at(absl::Seconds(-1)), now), absl::ZeroDuration());
  EXPECT_EQ(CallerWaitBudget(std::chrono::system_clock::time_point::max(), now),
            absl::InfiniteDuration());
}

}  // namespace
}  // namespace pipetrain
