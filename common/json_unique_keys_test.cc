#include "common/json_unique_keys.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

TEST(ParseJsonUniqueKeysTest, DistinctKeys_ParsedAsNlohmannDoes) {
  const std::string text = R"({"a": 1, "b": {"a": 2, "c": [{"a": 3}, {"a": 4}]}})";
  absl::StatusOr<nlohmann::json> parsed = ParseJsonUniqueKeys(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, nlohmann::json::parse(text));  // the same key in sibling objects is fine
}

TEST(ParseJsonUniqueKeysTest, KeyTwiceInOneObject_RefusedNamingIt) {
  for (const char* text :
       {R"({"workers": [1], "workers": [2]})", R"({"x": {"y": 1, "workers": 2, "workers": 3}})",
        R"([{"a": 1}, {"workers": 1, "b": 2, "workers": 1}])"}) {
    absl::StatusOr<nlohmann::json> parsed = ParseJsonUniqueKeys(text);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_EQ(parsed.status().message(), "key \"workers\" given twice in one object") << text;
  }
}

TEST(ParseJsonUniqueKeysTest, Malformed_NotValidJson) {
  for (const char* text : {"", "{", R"({"a": 1,})", "nul", "{\"a\" 1}"}) {
    absl::StatusOr<nlohmann::json> parsed = ParseJsonUniqueKeys(text);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_EQ(parsed.status().message().rfind("not valid JSON: ", 0), 0u) << parsed.status();
  }
}

// Copying such a value recursed once per level: 200,000 levels (400 KB)
// overflowed the stack. Brackets inside strings are not nesting.
TEST(ParseJsonUniqueKeysTest, NestedPastTheBound_RefusedBeforeParsing) {
  const auto nested = [](int levels) {
    return std::string(levels, '[') + std::string(levels, ']');
  };
  EXPECT_TRUE(ParseJsonUniqueKeys(nested(kMaxJsonDepth)).ok());
  for (const std::string& text :
       {nested(kMaxJsonDepth + 1), absl::StrCat(R"({"a": )", nested(200000), "}")}) {
    absl::StatusOr<nlohmann::json> parsed = ParseJsonUniqueKeys(text);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(parsed.status().message(),
              "not valid here: arrays and objects nested deeper than 64 levels");
  }
  const std::string in_strings =
      absl::StrCat(R"({"[[[": ")", std::string(100, '['), R"(\"{{{", "b": [)", nested(10), "]}");
  absl::StatusOr<nlohmann::json> parsed = ParseJsonUniqueKeys(in_strings);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, nlohmann::json::parse(in_strings));
}

TEST(ParseJsonUniqueKeysTest, OddKeyInTheMessage_Escaped) {
  absl::StatusOr<nlohmann::json> parsed =
      ParseJsonUniqueKeys("{\"\\u001b[2J\": 1, \"\\u001b[2J\": 2}");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().message(), "key \"\\x1b[2J\" given twice in one object");
}

}  // namespace
}  // namespace pipetrain
