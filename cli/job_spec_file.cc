#include "cli/job_spec_file.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/bounded_file.h"
#include "common/json_unique_keys.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "spec/job_spec.h"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/parser.h"
#include "yaml-cpp/yaml.h"

namespace pipetrain {
namespace {

nlohmann::json ScalarToJson(const YAML::Node& node) {
  const std::string& text = node.Scalar();
  if (node.Tag() != "?") return text;  // quoted (tag "!") or explicitly tagged: a string
  if (text == "true" || text == "false") return text == "true";
  if (text == "null" || text == "~" || text.empty()) return nullptr;
  int64_t i = 0;
  if (absl::SimpleAtoi(text, &i)) return i;
  // A seed is a uint64: one above INT64_MAX must not pass through a double
  // (12345678901234567890 would become ...7168).
  uint64_t u = 0;
  if (absl::SimpleAtoi(text, &u)) return u;
  // Only finite numbers: SimpleAtod also reads "inf" and "nan", which JSON
  // cannot hold (they would become null and reset the field to its
  // default); as strings, the spec's checks name them.
  double d = 0;
  if (absl::SimpleAtod(text, &d) && std::isfinite(d)) return d;
  return text;
}

// A job spec is a few dozen nodes, nested three deep. YAML aliases let a
// small file name a node many times (each level of "[*a, *a, ...]"
// multiplies the count) or inside itself ("&a [*a]", endless), so the
// conversion, which copies every use, stops at these limits.
constexpr int64_t kMaxYamlNodes = 100000;
constexpr int kMaxYamlDepth = 64;
// And the text the copies hold (every scalar and key, each time used): a
// node count alone let a 1 MiB anchored string used 1000 times make a
// gigabyte of JSON (bad_alloc, and the CLI ended on std::terminate).
constexpr int64_t kMaxYamlTextBytes = 4 * kMaxJobSpecFileBytes;

// What the conversion may still produce (the limits above).
struct YamlBudget {
  int64_t nodes = kMaxYamlNodes;
  int64_t text_bytes = kMaxYamlTextBytes;
};

// Thrown when the conversion passes a limit or meets a mapping it cannot
// convert faithfully (the message says which); caught in YamlToJson.
struct Refused {
  std::string what;
};

// Takes `text` from the budget's bytes.
void SpendText(const std::string& text, YamlBudget& budget) {
  budget.text_bytes -= static_cast<int64_t>(text.size());
  if (budget.text_bytes < 0) {
    throw Refused{absl::StrCat("more than ", kMaxYamlTextBytes,
                               " bytes of text with aliases expanded; a job spec is far smaller")};
  }
}

nlohmann::json NodeToJson(const YAML::Node& node, int depth, YamlBudget& budget) {
  if (--budget.nodes < 0) {
    throw Refused{absl::StrCat("more than ", kMaxYamlNodes,
                               " nodes with aliases expanded; a job spec is far smaller")};
  }
  if (depth > kMaxYamlDepth) {
    throw Refused{absl::StrCat("nested more than ", kMaxYamlDepth,
                               " levels deep, or an alias used inside its own anchor")};
  }
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      // YAML requires a mapping's keys to be unique, and yaml-cpp does not
      // check: the last of two "steps:" lines would win unseen. A key that
      // is itself a list or mapping names no field.
      nlohmann::json out = nlohmann::json::object();
      for (const auto& kv : node) {
        const int line = kv.first.Mark().line + 1;
        if (!kv.first.IsScalar()) {
          throw Refused{absl::StrCat("line ", line, ": a key must be a name, not a list or map")};
        }
        SpendText(kv.first.Scalar(), budget);
        if (out.contains(kv.first.Scalar())) {
          throw Refused{
              absl::StrCat("line ", line, ": key \"",
                           absl::CHexEscape(absl::string_view(kv.first.Scalar()).substr(0, 64)),
                           "\" given twice in one mapping")};
        }
        out[kv.first.Scalar()] = NodeToJson(kv.second, depth + 1, budget);
      }
      return out;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& item : node) out.push_back(NodeToJson(item, depth + 1, budget));
      return out;
    }
    case YAML::NodeType::Scalar:
      SpendText(node.Scalar(), budget);
      return ScalarToJson(node);
    default: return nullptr;
  }
}

// Listens to a parse for its structure only: counting documents needs no
// nodes built.
class IgnoreEvents : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// Whether `yaml` holds a second document. Parses the first two at most:
// YAML::LoadAll would build every one first (a 4 MiB file of "---" lines
// is a million documents; job_spec_yaml_fuzzer timed out on one).
bool HasSecondDocument(const std::string& yaml) {
  std::istringstream in(yaml);
  YAML::Parser parser(in);
  IgnoreEvents ignore;
  return parser.HandleNextDocument(ignore) && parser.HandleNextDocument(ignore);
}

// A field's protobuf JSON name: "batch_size" -> "batchSize" (a name
// already in lowerCamel is its own).
std::string JsonFieldName(const std::string& key) {
  std::string out;
  for (size_t i = 0; i < key.size(); ++i) {
    if (key[i] == '_' && i + 1 < key.size() && key[i + 1] >= 'a' && key[i + 1] <= 'z') {
      out += static_cast<char>(key[++i] - 'a' + 'A');
    } else {
      out += key[i];
    }
  }
  return out;
}

// Protobuf's parser takes a field by either name and keeps the last, so
// "batchSize: 8" and "batch_size: 16" in one mapping are one key given
// twice under two spellings (a job spec has no map fields whose keys are
// data). INVALID_ARGUMENT naming both. Walks with a stack of its own, not
// by recursion: a 4 MiB file of "[" nests 4 million deep.
absl::Status CheckOneNamePerField(const nlohmann::json& root) {
  std::vector<const nlohmann::json*> pending = {&root};
  while (!pending.empty()) {
    const nlohmann::json& value = *pending.back();
    pending.pop_back();
    if (value.is_array()) {
      for (const nlohmann::json& item : value) pending.push_back(&item);
      continue;
    }
    if (!value.is_object()) continue;
    std::map<std::string, std::string> seen;  // JSON name -> the key that gave it
    for (const auto& [key, item] : value.items()) {
      const auto [it, fresh] = seen.emplace(JsonFieldName(key), key);
      if (!fresh) {
        return absl::InvalidArgumentError(
            absl::StrCat("keys \"", absl::CHexEscape(it->second.substr(0, 64)), "\" and \"",
                         absl::CHexEscape(key.substr(0, 64)),
                         "\" name one field (protobuf takes both spellings); give it once"));
      }
      pending.push_back(&item);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> YamlToJson(const std::string& yaml) {
  try {
    YamlBudget budget;
    // YAML::Load reads the first document only: a second ("---") would be
    // dropped unseen.
    if (HasSecondDocument(yaml)) {
      return absl::InvalidArgumentError(
          "YAML: the file holds more than one document (separated by ---); a job spec is one: "
          "submit each job from its own file");
    }
    const nlohmann::json converted = NodeToJson(YAML::Load(yaml), 1, budget);
    if (absl::Status one = CheckOneNamePerField(converted); !one.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("YAML: ", one.message()));
    }
    return converted.dump();
  } catch (const YAML::Exception& e) {  // yaml-cpp reports errors by exception
    return absl::InvalidArgumentError(absl::StrCat("YAML: ", e.what()));
  } catch (const Refused& e) {
    return absl::InvalidArgumentError(absl::StrCat("YAML: ", e.what));
  } catch (const nlohmann::json::exception&) {  // dump(): a string that is not UTF-8
    // The library's own words name a byte index in its output, not the file.
    return absl::InvalidArgumentError(
        "YAML: a string in it is not valid UTF-8; a job spec is UTF-8 text");
  }
}

absl::StatusOr<v1::JobSpec> ReadJobSpecFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string json, ReadBoundedFile(path, kMaxJobSpecFileBytes, "job spec"));
  // A byte-order mark, as some editors save UTF-8, is not part of the text
  // (plan's JSON files take one too).
  if (absl::StartsWith(json, "\xEF\xBB\xBF")) json.erase(0, 3);
  if (!absl::EndsWith(path, ".json")) {
    absl::StatusOr<std::string> converted = YamlToJson(json);
    if (!converted.ok()) {
      return absl::Status(converted.status().code(),
                          absl::StrCat(path, ": ", converted.status().message()));
    }
    json = *std::move(converted);
  } else {
    // Protobuf's JSON parser keeps the last of two equal keys, silently, and
    // takes what JSON is not (single quotes, bare keys, trailing commas), on
    // which no duplicate check could run: a file must be strict JSON with
    // each field once, as YAML's are (REST bodies keep protobuf's rule,
    // docs/api.md).
    absl::StatusOr<nlohmann::json> unique = ParseJsonUniqueKeys(json);
    absl::Status one = unique.ok() ? CheckOneNamePerField(*unique) : unique.status();
    if (!one.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": JSON: ", one.message()));
  }
  absl::StatusOr<v1::JobSpec> spec = JobSpecFromJson(json);
  if (!spec.ok()) {
    return absl::Status(spec.status().code(), absl::StrCat(path, ": ", spec.status().message()));
  }
  return spec;
}

}  // namespace pipetrain
