// "Did you mean ...?" for a misspelt name: a flag, a spec field.
#ifndef PIPETRAIN_COMMON_CLOSEST_NAME_H_
#define PIPETRAIN_COMMON_CLOSEST_NAME_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace pipetrain {

// The edit distance (insertions, deletions, substitutions, each 1) between
// `a` and `b`, ignoring ASCII case and '_' / '-' (so n_layer, nLayer and
// n-layer are the same name). Both are cut to 64 bytes first: names are
// short, and a request's text must not cost quadratic time.
int NameDistance(absl::string_view a, absl::string_view b);

// The name in `names` nearest `typed` if it is near enough to be a likely
// typo: at most 1 edit for names up to 4 characters, 2 up to 8, else 3; the
// first of equally near ones. Empty when none is.
std::string ClosestName(absl::string_view typed, const std::vector<std::string>& names);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_CLOSEST_NAME_H_
