#include "common/json_unique_keys.h"

#include <set>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace pipetrain {
namespace {

// Whether `text` nests arrays and objects deeper than `most` levels. A
// plain scan, brackets in strings skipped: nlohmann::json parses any depth
// without recursion, but copying, comparing or dumping the value recurses
// once per level, and a document of a few hundred kilobytes of "[" (a
// stored job's profile) overflowed the stack there.
bool NestedDeeperThan(const std::string& text, int most) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > most) return true;
    } else if (c == ']' || c == '}') {
      --depth;  // unbalanced ones are the parser's to refuse
    }
  }
  return false;
}

}  // namespace

absl::StatusOr<nlohmann::json> ParseJsonUniqueKeys(const std::string& text) {
  using json = nlohmann::json;
  if (NestedDeeperThan(text, kMaxJsonDepth)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "not valid here: arrays and objects nested deeper than ", kMaxJsonDepth, " levels"));
  }
  // The keys seen so far in each object being parsed, innermost last.
  std::vector<std::set<std::string>> open;
  std::string twice;
  bool found = false;
  const json::parser_callback_t note = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        open.emplace_back();
        break;
      case json::parse_event_t::key: {
        std::string key = parsed.get<std::string>();
        if (!open.empty() && !open.back().insert(key).second && !found) {
          found = true;
          twice = std::move(key);
        }
        break;
      }
      case json::parse_event_t::object_end:
        if (!open.empty()) open.pop_back();
        break;
      default:
        break;
    }
    return true;  // keep everything: the check only looks
  };
  try {
    json parsed = json::parse(text, note);
    if (found) {
      return absl::InvalidArgumentError(
          absl::StrCat("key \"", absl::CHexEscape(absl::string_view(twice).substr(0, 64)),
                       "\" given twice in one object"));
    }
    return parsed;
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not valid JSON: ", e.what()));
  }
}

}  // namespace pipetrain
