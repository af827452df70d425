#include "cli/job_spec_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/jobs/job_spec.h"
#include "nlohmann/json.hpp"
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
  double d = 0;
  if (absl::SimpleAtod(text, &d)) return d;
  return text;
}

nlohmann::json NodeToJson(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      nlohmann::json out = nlohmann::json::object();
      for (const auto& kv : node) out[kv.first.Scalar()] = NodeToJson(kv.second);
      return out;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& item : node) out.push_back(NodeToJson(item));
      return out;
    }
    case YAML::NodeType::Scalar: return ScalarToJson(node);
    default: return nullptr;
  }
}

}  // namespace

absl::StatusOr<std::string> YamlToJson(const std::string& yaml) {
  try {
    return NodeToJson(YAML::Load(yaml)).dump();
  } catch (const YAML::Exception& e) {  // yaml-cpp reports errors by exception
    return absl::InvalidArgumentError(absl::StrCat("YAML: ", e.what()));
  }
}

absl::StatusOr<v1::JobSpec> ReadJobSpecFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read job spec ", path));
  std::stringstream text;
  text << in.rdbuf();
  std::string json = text.str();
  if (!absl::EndsWith(path, ".json")) {
    ASSIGN_OR_RETURN(json, YamlToJson(json));
  }
  absl::StatusOr<v1::JobSpec> spec = JobSpecFromJson(json);
  if (!spec.ok()) {
    return absl::Status(spec.status().code(), absl::StrCat(path, ": ", spec.status().message()));
  }
  return spec;
}

}  // namespace pipetrain
