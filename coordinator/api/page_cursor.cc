#include "coordinator/api/page_cursor.h"

#include <algorithm>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pipetrain {

std::string MakePageToken(absl::string_view list, const PageCursor& cursor) {
  std::string text = absl::StrCat(list, "|", cursor.position, "|", cursor.last_id);
  if (cursor.last_key.has_value()) absl::StrAppend(&text, "|", *cursor.last_key);
  return absl::WebSafeBase64Escape(text);
}

absl::StatusOr<PageCursor> ParsePageToken(absl::string_view list, const std::string& token) {
  if (token.empty()) return PageCursor{};
  if (token.size() > kMaxPageTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_token: ", token.size(), " bytes exceeds the limit of ", kMaxPageTokenBytes));
  }
  const absl::Status bad = absl::InvalidArgumentError(absl::StrCat(
      "page_token: not a ", list,
      " page token of this coordinator; pass next_page_token unchanged, or none for the first "
      "page"));
  std::string decoded;
  if (!absl::WebSafeBase64Unescape(token, &decoded)) return bad;
  // Ids hold no '|' (job-<epoch>-<n>, w-<n>), so the key is the 4th field.
  const std::vector<std::string> parts = absl::StrSplit(decoded, '|');
  PageCursor cursor;
  if ((parts.size() != 3 && parts.size() != 4) || parts[0] != list ||
      !absl::SimpleAtoi(parts[1], &cursor.position) || cursor.position > 1000000000 ||
      parts[2].empty()) {
    return bad;
  }
  cursor.last_id = parts[2];
  if (parts.size() == 4) {
    int64_t key = 0;
    if (!absl::SimpleAtoi(parts[3], &key)) return bad;
    cursor.last_key = key;
  }
  return cursor;
}

size_t PageBegin(const std::vector<PageItem>& items, const PageCursor& cursor) {
  if (cursor.last_id.empty()) return std::min(cursor.position, items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].id == cursor.last_id) return i + 1;
  }
  // The last item is gone: after every item whose key is not above its
  // key (those were listed before it, or beside it at the same key).
  if (cursor.last_key.has_value()) {
    const int64_t last = *cursor.last_key;
    return static_cast<size_t>(
        std::find_if(items.begin(), items.end(),
                     [last](const PageItem& item) { return item.key > last; }) -
        items.begin());
  }
  return std::min(cursor.position, items.size());
}

}  // namespace pipetrain
