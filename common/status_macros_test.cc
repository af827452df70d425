#include "common/status_macros.h"

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::Status Check(int x, int* out) {
  ASSIGN_OR_RETURN(int h, Half(x));
  ASSIGN_OR_RETURN(*out, Half(h));
  RETURN_IF_ERROR(x > 100 ? absl::OutOfRangeError("big") : absl::OkStatus());
  return absl::OkStatus();
}

TEST(StatusMacrosTest, AssignOrReturn_PropagatesFirstError) {
  int out = 0;
  EXPECT_TRUE(Check(8, &out).ok());
  EXPECT_EQ(out, 2);
  EXPECT_EQ(Check(6, &out), absl::InvalidArgumentError("odd"));
  EXPECT_EQ(Check(104, &out), absl::OutOfRangeError("big"));
}

}  // namespace
}  // namespace pipetrain
