// The AccTFM profile file's field checks (cli/acctfm_profile.h).
#include "cli/acctfm_profile.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

constexpr char kLayer[] =
    R"({"name": "block0", "fwd_seconds": [1, 0.6, 0.4], "bwd_seconds": [2, 1.2, 0.8],
        "allreduce_seconds": [0.1, 0.1, 0.1]})";

TEST(AccTfmProfileTest, OneLayer_Parses) {
  absl::StatusOr<AccTfmProblem> problem =
      ParseAccTfmProfileJson(absl::StrCat(R"({"layers": [)", kLayer, "]}"));
  ASSERT_TRUE(problem.ok()) << problem.status();
  EXPECT_EQ(problem->layers.size(), 1u);
}

// A shared file's unknown key reaches the terminal through plan's error:
// shown escaped (an escape sequence would act on it) and cut to 64 bytes.
TEST(AccTfmProfileTest, UnknownKey_ShownEscapedAndCut) {
  absl::StatusOr<AccTfmProblem> top = ParseAccTfmProfileJson(
      absl::StrCat(R"({"layers": [)", kLayer, R"(], "\u001b]2;x\u0007": 1})"));
  EXPECT_EQ(top.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(top.status().message(), "\\x1b]2;x\\x07: unknown field");
  const std::string long_key(1000, 'k');
  std::string layer = kLayer;
  layer.insert(1, absl::StrCat("\"", long_key, "\": 1, "));
  absl::StatusOr<AccTfmProblem> in_layer =
      ParseAccTfmProfileJson(absl::StrCat(R"({"layers": [)", layer, "]}"));
  EXPECT_EQ(in_layer.status().message(),
            absl::StrCat("layers[0].", long_key.substr(0, 64), "...: unknown field"));
}

}  // namespace
}  // namespace pipetrain
