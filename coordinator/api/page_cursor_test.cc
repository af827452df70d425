#include "coordinator/api/page_cursor.h"

#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// `ids` are string literals: the items' views must outlive this call.
std::vector<PageItem> Items(const std::vector<absl::string_view>& ids,
                            const std::vector<int64_t>& keys) {
  std::vector<PageItem> items;
  for (size_t i = 0; i < ids.size(); ++i) items.push_back({ids[i], keys[i]});
  return items;
}

TEST(PageCursorTest, Token_RoundTripsPositionIdAndKey) {
  const PageCursor cursor{10, "job-abc-10", int64_t{1764500000123456789}};
  const absl::StatusOr<PageCursor> parsed = ParsePageToken("jobs", MakePageToken("jobs", cursor));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->position, 10u);
  EXPECT_EQ(parsed->last_id, "job-abc-10");
  EXPECT_EQ(parsed->last_key, cursor.last_key);
  EXPECT_FALSE(ParsePageToken("workers", MakePageToken("jobs", cursor)).ok());
}

TEST(PageCursorTest, MalformedTokens_InvalidArgumentNamingPageToken) {
  for (const std::string& text :
       {std::string("jobs|1"), std::string("jobs|x|job-1"), std::string("jobs|1||5"),
        std::string("jobs|1|job-1|key"), std::string("jobs|1|job-1|5|6"),
        std::string("jobs|2000000000|job-1")}) {
    const absl::StatusOr<PageCursor> parsed =
        ParsePageToken("jobs", absl::WebSafeBase64Escape(text));
    ASSERT_FALSE(parsed.ok()) << text;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(parsed.status().message().find("page_token: "), absl::string_view::npos);
  }
  for (const std::string& token :
       {std::string("not base64!"), std::string(kMaxPageTokenBytes + 1, 'A')}) {
    const absl::Status status = ParsePageToken("jobs", token).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("page_token: "), absl::string_view::npos) << status;
  }
}

// The last item listed is still there: the page starts after it, however
// many items before it went.
TEST(PageCursorTest, LastItemListed_StartsAfterIt) {
  const auto items = Items({"c", "d", "e"}, {3, 4, 5});
  EXPECT_EQ(PageBegin(items, PageCursor{4, "d", 4}), 2u);
}

// Items up to and including the last one were removed (the case that
// skipped items when the position was trusted): the page starts at the
// first item with a larger key, not `position` items in.
TEST(PageCursorTest, LastItemAndEarlierRemoved_StartsAtTheNextKey) {
  // Listed were a..j (keys 1..10), the page ended at j; a..j are gone.
  const auto items = Items({"k", "l", "m"}, {11, 12, 13});
  EXPECT_EQ(PageBegin(items, PageCursor{10, "j", 10}), 0u);
  // Only the last one went: the next is still the one after it.
  const auto some = Items({"i", "k", "l"}, {9, 11, 12});
  EXPECT_EQ(PageBegin(some, PageCursor{10, "j", 10}), 1u);
  // Nothing after it: an empty page.
  EXPECT_EQ(PageBegin(Items({"a"}, {1}), PageCursor{10, "j", 10}), 1u);
}

TEST(PageCursorTest, FirstPageAndOldTokens_UseThePosition) {
  const auto items = Items({"a", "b", "c"}, {1, 2, 3});
  EXPECT_EQ(PageBegin(items, PageCursor{}), 0u);
  EXPECT_EQ(PageBegin(items, PageCursor{2, "gone", std::nullopt}), 2u);
  EXPECT_EQ(PageBegin(items, PageCursor{7, "gone", std::nullopt}), 3u);
}

}  // namespace
}  // namespace pipetrain
