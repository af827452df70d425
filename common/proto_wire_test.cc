#include "common/proto_wire.h"

#include <string>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(ProtoWire, StringAndVarint_KnownBytes) {
  // Field 1, length-delimited, "ab"; field 2, varint 300 (0xac 0x02).
  EXPECT_EQ(WireString(1, "ab"), std::string("\x0a\x02"
                                             "ab",
                                             4));
  EXPECT_EQ(WireVarint(2, 300), std::string("\x10\xac\x02", 3));
}

TEST(ProtoWire, Parse_RoundTripsNestedAndRepeated) {
  const std::string inner = WireString(1, "x") + WireVarint(2, 7);
  const std::string bytes = WireVarint(1, 14) + WireString(2, "msg") + WireString(3, inner) +
                            WireString(3, "") + WireVarint(1, 3);
  absl::StatusOr<WireFields> fields = ParseWireFields(bytes);
  ASSERT_TRUE(fields.ok()) << fields.status();
  EXPECT_EQ(fields->Varint(1), 3u);  // the last one wins
  EXPECT_EQ(fields->String(2), "msg");
  ASSERT_EQ(fields->Strings(3).size(), 2u);
  absl::StatusOr<WireFields> nested = ParseWireFields(fields->Strings(3)[0]);
  ASSERT_TRUE(nested.ok()) << nested.status();
  EXPECT_EQ(nested->String(1), "x");
  EXPECT_EQ(nested->Varint(2), 7u);
  EXPECT_EQ(fields->Varint(9), 0u);
  EXPECT_EQ(fields->String(9), "");
}

TEST(ProtoWire, Parse_Truncated_InvalidArgument) {
  const std::string bytes = WireString(2, "message");
  EXPECT_EQ(ParseWireFields(bytes.substr(0, bytes.size() - 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseWireFields("\x0f").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain
