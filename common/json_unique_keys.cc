#include "common/json_unique_keys.h"

#include <set>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace pipetrain {

absl::StatusOr<nlohmann::json> ParseJsonUniqueKeys(const std::string& text) {
  using json = nlohmann::json;
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
