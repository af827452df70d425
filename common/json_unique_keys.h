// JSON parsing that refuses an object naming a key twice.
//
// nlohmann::json keeps the last of two equal keys without a word, so a
// profile or cluster file with "workers" twice planned on the second list
// only, and the first was silently ignored. The planner's input files (and
// anything else read by hand-written field checks) parse through this
// instead, as job spec files refuse a YAML key given twice.
#ifndef PIPETRAIN_COMMON_JSON_UNIQUE_KEYS_H_
#define PIPETRAIN_COMMON_JSON_UNIQUE_KEYS_H_

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace pipetrain {

// The deepest nesting of arrays and objects ParseJsonUniqueKeys accepts
// (the files it reads nest 5 levels or so): what it returns may be copied,
// compared and dumped, each of which recurses once per level.
inline constexpr int kMaxJsonDepth = 64;

// The document in `text`. INVALID_ARGUMENT "not valid JSON" (with the
// parser's position) when it does not parse, "key \"K\" given twice in one
// object" naming the first such key (escaped, cut to 64 bytes), or "...
// nested deeper than 64 levels" (kMaxJsonDepth) before it is parsed.
absl::StatusOr<nlohmann::json> ParseJsonUniqueKeys(const std::string& text);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_JSON_UNIQUE_KEYS_H_
