// Page tokens of the coordinator's lists (ListJobs, ListWorkers), and where
// the page a token asks for starts.
//
// A list is in a fixed order, and every item has an order key that grows
// along it: a job its create_time (jobs are listed as submitted), a worker
// the number of its id ("w-12": 12). A token is base64url of
// "<list>|<position>|<last id>|<last key>": how many items earlier pages
// returned, and the last of them. The next page starts after that item
// while it is listed; once it is gone (an ended job pruned, a worker
// evicted), after the last item whose key is not above its key, so items
// removed or added meanwhile shift nothing and skip nothing. Tokens of
// three fields (no key; made before the key was added) start at the
// position then.
//
// Tokens are not signed: a hand-made one only picks a place in a list its
// caller may read whole. Bounds: at most kMaxPageTokenBytes, position at
// most 1e9; anything else malformed is INVALID_ARGUMENT naming page_token.
// Thread-safety: pure functions.
#ifndef PIPETRAIN_COORDINATOR_API_PAGE_CURSOR_H_
#define PIPETRAIN_COORDINATOR_API_PAGE_CURSOR_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain {

inline constexpr size_t kMaxPageTokenBytes = 512;

// Where a page starts, as its token says; all empty for the first page.
struct PageCursor {
  size_t position = 0;              // items earlier pages returned
  std::string last_id;              // the last of them
  std::optional<int64_t> last_key;  // its order key (none in old tokens)
};

std::string MakePageToken(absl::string_view list, const PageCursor& cursor);
// An empty token is the first page.
absl::StatusOr<PageCursor> ParsePageToken(absl::string_view list, const std::string& token);

// One listed item as the cursor sees it.
struct PageItem {
  absl::string_view id;
  int64_t key = 0;
};

// The index of `items` (in list order, keys non-decreasing) the page after
// `cursor` starts at; items.size() when none is left.
size_t PageBegin(const std::vector<PageItem>& items, const PageCursor& cursor);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_API_PAGE_CURSOR_H_
