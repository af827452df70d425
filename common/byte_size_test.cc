#include "common/byte_size.h"

#include <gtest/gtest.h>

#include "absl/status/status.h"

namespace pipetrain {
namespace {

TEST(ParseByteSizeTest, SuffixesAndErrors) {
  EXPECT_EQ(ParseByteSize("memory-limit", "1048576").value_or(0), 1048576);
  EXPECT_EQ(ParseByteSize("memory-limit", "512M").value_or(0), int64_t{512} << 20);
  EXPECT_EQ(ParseByteSize("memory-limit", "8g").value_or(0), int64_t{8} << 30);
  EXPECT_EQ(ParseByteSize("memory-limit", "1.5K").value_or(0), 1536);
  for (const char* bad : {"", "G", "-1G", "0", "0.5", "12Q", "2P", "nan"}) {
    absl::Status status = ParseByteSize("memory-limit", bad).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("--memory-limit"), std::string::npos) << bad;
  }
}

}  // namespace
}  // namespace pipetrain
