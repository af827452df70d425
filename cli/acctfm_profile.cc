#include "cli/acctfm_profile.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/echo_input.h"
#include "common/json_unique_keys.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace pipetrain {
namespace {

using nlohmann::json;

absl::Status Invalid(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::StatusOr<double> Number(const json& object, const std::string& key, const std::string& field) {
  if (!object.contains(key)) return Invalid(field, "missing");
  const json& v = object.at(key);
  // The file's text, echoed cut and escaped (it is printed on a terminal).
  if (!v.is_number()) {
    return Invalid(field, absl::StrCat("must be a number, got ", EchoInput(v.dump())));
  }
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < 0) return Invalid(field, absl::StrCat("must be >= 0, got ", v.dump()));
  return x;
}

absl::StatusOr<std::vector<double>> Triple(const json& object, const std::string& key,
                                           const std::string& field) {
  const json& v = object.at(key);
  if (!v.is_array() || v.size() != 3) {
    return Invalid(field, "must be an array of 3 numbers (sizes 1, 2, 4)");
  }
  std::vector<double> out;
  for (size_t i = 0; i < 3; ++i) {
    ASSIGN_OR_RETURN(double x, Number(json{{"x", v[i]}}, "x", absl::StrCat(field, "[", i, "]")));
    out.push_back(x);
  }
  return out;
}

absl::Status CheckKeys(const json& object, const std::vector<std::string>& allowed,
                       const std::string& where) {
  for (const auto& item : object.items()) {
    if (std::find(allowed.begin(), allowed.end(), item.key()) == allowed.end()) {
      // Escaped and cut, as profile.cc's OnlyKeys: the key is the file's.
      return Invalid(absl::StrCat(where, EchoInput(item.key())), "unknown field");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<AccTfmLayer> ParseLayer(const json& j, const std::string& field) {
  if (!j.is_object()) return Invalid(field, "must be an object");
  RETURN_IF_ERROR(CheckKeys(
      j, {"name", "fwd_seconds", "bwd_seconds", "allreduce_seconds", "output_bytes"}, field + "."));
  AccTfmLayer layer;
  for (const char* key : {"fwd_seconds", "bwd_seconds"}) {
    if (!j.contains(key)) return Invalid(absl::StrCat(field, ".", key), "missing");
  }
  ASSIGN_OR_RETURN(layer.fwd_compute_seconds, Triple(j, "fwd_seconds", field + ".fwd_seconds"));
  ASSIGN_OR_RETURN(layer.bwd_compute_seconds, Triple(j, "bwd_seconds", field + ".bwd_seconds"));
  if (j.contains("allreduce_seconds")) {
    ASSIGN_OR_RETURN(layer.allreduce_seconds,
                     Triple(j, "allreduce_seconds", field + ".allreduce_seconds"));
  }
  if (j.contains("output_bytes")) {
    ASSIGN_OR_RETURN(layer.output_bytes, Number(j, "output_bytes", field + ".output_bytes"));
  }
  return layer;
}

// allreduce.group_size: the devices of one tensor-parallel group.
constexpr double kMaxGroupSize = 65536;

absl::StatusOr<AllReduceModel> ParseAllReduce(const json& j) {
  if (!j.is_object()) return Invalid("allreduce", "must be an object");
  RETURN_IF_ERROR(CheckKeys(
      j, {"alpha_seconds", "beta_seconds_per_byte", "group_size", "algorithm"}, "allreduce."));
  AllReduceModel model;
  ASSIGN_OR_RETURN(model.alpha_seconds, Number(j, "alpha_seconds", "allreduce.alpha_seconds"));
  ASSIGN_OR_RETURN(model.beta_seconds_per_byte,
                   Number(j, "beta_seconds_per_byte", "allreduce.beta_seconds_per_byte"));
  ASSIGN_OR_RETURN(double n, Number(j, "group_size", "allreduce.group_size"));
  // Bounded before the cast to int (1e12 would wrap to a number never
  // written).
  if (n < 1 || n > kMaxGroupSize || n != std::floor(n)) {
    return Invalid("allreduce.group_size",
                   absl::StrCat("must be an integer in [1, ", kMaxGroupSize, "]"));
  }
  model.group_size = static_cast<int>(n);
  // Checked before reading: json::value would throw on a non-string.
  if (j.contains("algorithm") && !j["algorithm"].is_string()) {
    return Invalid("allreduce.algorithm", "must be \"ring\" or \"recursive_doubling\"");
  }
  const std::string algorithm = j.value("algorithm", std::string("ring"));
  if (algorithm == "ring") {
    model.algorithm = AllReduceAlgorithm::kRing;
  } else if (algorithm == "recursive_doubling") {
    model.algorithm = AllReduceAlgorithm::kRecursiveDoubling;
  } else {
    return Invalid("allreduce.algorithm", "must be \"ring\" or \"recursive_doubling\"");
  }
  return model;
}

json PassJson(const AccTfmPassResult& r) {
  return {{"partition_sizes", r.plan.partition_sizes},
          {"seconds", r.plan.seconds},
          {"algorithm1_seconds", r.algorithm1.seconds},
          {"fell_back_to_uniform", r.used_uniform}};
}

}  // namespace

absl::StatusOr<AccTfmProblem> ParseAccTfmProfileJson(const std::string& text) {
  // A key given twice would otherwise have its last value win unseen.
  ASSIGN_OR_RETURN(json root, ParseJsonUniqueKeys(text));
  if (!root.is_object()) return Invalid("(root)", "must be an object");
  RETURN_IF_ERROR(CheckKeys(root, {"layers", "allreduce"}, ""));
  if (!root.contains("layers") || !root["layers"].is_array() || root["layers"].empty()) {
    return Invalid("layers", "must be a non-empty array");
  }
  AccTfmProblem problem;
  for (size_t i = 0; i < root["layers"].size(); ++i) {
    ASSIGN_OR_RETURN(AccTfmLayer layer, ParseLayer(root["layers"][i], absl::StrCat("layers[", i, "]")));
    problem.layers.push_back(std::move(layer));
  }
  if (root.contains("allreduce")) {
    ASSIGN_OR_RETURN(AllReduceModel model, ParseAllReduce(root["allreduce"]));
    problem.allreduce = model;
  }
  // The eq. 3 model's cost is of output_bytes / K: a layer without it
  // would be planned as all-reducing nothing, and without the model it is
  // read by nothing. Either way the file does not say what its writer meant.
  for (size_t i = 0; i < root["layers"].size(); ++i) {
    const bool has_bytes = root["layers"][i].contains("output_bytes");
    if (problem.allreduce.has_value() && !has_bytes) {
      return Invalid(absl::StrCat("layers[", i, "].output_bytes"),
                     "missing (the \"allreduce\" model costs each layer by it)");
    }
    if (!problem.allreduce.has_value() && has_bytes) {
      return Invalid(absl::StrCat("layers[", i, "].output_bytes"),
                     "given without an \"allreduce\" model, the only thing that reads it (the "
                     "layers' allreduce_seconds are the costs)");
    }
  }
  RETURN_IF_ERROR(ValidateAccTfmProblem(problem));
  return problem;
}

std::string AccTfmSolutionJson(const AccTfmSolution& s, int indent) {
  json out;
  out["solver"] = "acctfm";
  out["forward"] = PassJson(s.forward);
  out["backward"] = PassJson(s.backward);
  json uniform;
  for (size_t i = 0; i < kAccTfmSizes.size(); ++i) {
    uniform[std::to_string(kAccTfmSizes[i])] =
        s.forward.uniform_seconds[i] + s.backward.uniform_seconds[i];
  }
  out["uniform"] = uniform;
  return out.dump(indent);
}

}  // namespace pipetrain
