#include "cli/tensor_layout_report.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/planner/distpar_layout.h"
#include "nlohmann/json.hpp"

namespace pipetrain {
namespace {

using ordered_json = nlohmann::ordered_json;

std::string Joined(const std::vector<MatmulLayout>& layouts) {
  std::vector<std::string> names;
  for (MatmulLayout l : layouts) names.push_back(MatmulLayoutName(l));
  return absl::StrJoin(names, ",");
}

// Fixed schemes to compare against, each the same layout on every layer but
// Megatron's (columns for qkv and fc, rows for the projections).
std::vector<std::pair<std::string, std::vector<MatmulLayout>>> FixedSchemes(int devices) {
  using L = MatmulLayout;
  std::vector<std::pair<std::string, std::vector<MatmulLayout>>> fixed = {
      {"megatron", {L::kColumn, L::kRow, L::kColumn, L::kRow}},
      {"data", {L::kData, L::kData, L::kData, L::kData}},
      {"replicate", {L::kReplicate, L::kReplicate, L::kReplicate, L::kReplicate}},
  };
  if (CubeSide(devices) > 0) fixed.push_back({"cube", {L::kCube, L::kCube, L::kCube, L::kCube}});
  return fixed;
}

}  // namespace

absl::StatusOr<std::string> TensorLayoutReport(const TensorLayoutRequest& request, bool json) {
  if (request.devices < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tensor must be a group of >= 2 devices, got ", request.devices));
  }
  if (request.tokens < 1 || request.d_model < 1) {
    return absl::InvalidArgumentError(
        "--seq-len, --micro-batch-size and --d-model must be >= 1 for --tensor");
  }
  // A job's tensor ranks cut d_model into equal shares: T of them in the
  // 1-D layout, p^2 row blocks in the 3-D cube (T = p^3). A d_model that
  // neither job could run is refused; else the search leaves out the
  // layouts whose splits do not divide (a cube job's d_model need not be
  // a multiple of T).
  const int64_t side = CubeSide(request.devices);
  if (request.d_model % request.devices != 0 &&
      (side == 0 || request.d_model % (side * side) != 0)) {
    const std::string cube = side > 0
                                 ? absl::StrCat(", or for the 3-D cube (", request.devices, " = ",
                                                side, "^3) p^2 = ", side * side, " must")
                                 : "";
    return absl::InvalidArgumentError(absl::StrCat("--tensor ", request.devices,
                                                   " must divide --d-model ", request.d_model,
                                                   " (each device takes an equal share)", cube));
  }
  LayoutProblem problem;
  problem.layers = GptBlockLayers(request.tokens, request.d_model);
  problem.devices = request.devices;
  problem.beta = request.beta;
  problem.samples = request.samples;
  problem.heads = request.heads;
  std::string beta_source;  // how a calibrated beta was derived
  if (!(request.beta >= 0) && request.beta != kCalibratedBeta) {
    return absl::InvalidArgumentError(
        absl::StrCat("--distpar-beta must be >= 0, got ", request.beta));
  }
  if (request.beta == kCalibratedBeta) {
    problem.beta = 1;
    if (request.bandwidth_gbps > 0) {
      absl::StatusOr<double> calibrated =
          CalibratedBeta(problem.layers, request.gflops * 1e9, request.bandwidth_gbps * 1e9 / 8);
      if (!calibrated.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--gflops and --bandwidth-gbps: ", calibrated.status().message()));
      }
      problem.beta = *calibrated;
      beta_source = absl::StrFormat(" (calibrated: %g GFLOP/s, %g Gbit/s)", request.gflops,
                                    request.bandwidth_gbps);
    }
  }
  TensorLayoutRequest used = request;
  used.beta = problem.beta;
  absl::StatusOr<LayoutScheme> best = SolveLayouts(problem);
  if (!best.ok()) return best.status();

  if (json) {
    ordered_json out = {{"devices", request.devices},
                        {"beta", used.beta},
                        {"tokens", request.tokens},
                        {"d_model", request.d_model}};
    ordered_json layers = ordered_json::array();
    for (size_t i = 0; i < problem.layers.size(); ++i) {
      const MatmulLayer& l = problem.layers[i];
      layers.push_back({{"layer", l.name},
                        {"m", l.m},
                        {"k", l.k},
                        {"n", l.n},
                        {"layout", MatmulLayoutName(best->layouts[i])}});
    }
    out["layers"] = layers;
    ordered_json conversions = ordered_json::array();
    for (const Conversion& c : best->conversions) {
      conversions.push_back({{"where", c.where},
                             {"from", SbpName(c.from)},
                             {"to", SbpName(c.to)},
                             {"collective", c.collective},
                             {"elements", c.elements}});
    }
    out["conversions"] = conversions;
    out["computation"] = best->computation;
    out["communication"] = best->communication;
    out["cost"] = best->cost;
    ordered_json fixed = ordered_json::object();
    // A scheme whose splits do not divide has no cost: null.
    for (const auto& [name, layouts] : FixedSchemes(request.devices)) {
      fixed[name] = SchemeFits(problem, layouts)
                        ? ordered_json(EvaluateLayouts(problem, layouts).cost)
                        : ordered_json(nullptr);
    }
    out["fixed_scheme_costs"] = fixed;
    return out.dump(2) + "\n";
  }

  std::string text = absl::StrFormat(
      "# tensor-parallel layouts of one GPT-2 block (DistPar, distpar.txt 3.2-3.4): %d devices, "
      "beta %g%s, %d tokens, d_model %d\n"
      "# planner output only: jobs run Megatron's column-row layout (spec.parallelism.tensor)\n",
      request.devices, used.beta, beta_source, request.tokens, request.d_model);
  absl::StrAppendFormat(&text, "%-22s %-20s %-10s\n", "LAYER", "M x K x N", "LAYOUT");
  for (size_t i = 0; i < problem.layers.size(); ++i) {
    const MatmulLayer& l = problem.layers[i];
    absl::StrAppendFormat(&text, "%-22s %-20s %-10s\n", l.name,
                          absl::StrCat(l.m, "x", l.k, "x", l.n),
                          MatmulLayoutName(best->layouts[i]));
  }
  text += "conversions (elements sent by all devices):\n";
  if (best->conversions.empty()) text += "  none\n";
  for (const Conversion& c : best->conversions) {
    absl::StrAppendFormat(&text, "  %-44s %s -> %s  %-28s %.4g\n", c.where, SbpName(c.from),
                          SbpName(c.to), c.collective, c.elements);
  }
  absl::StrAppendFormat(&text, "cost: computation %.4g + %g x communication %.4g = %.4g\n",
                        best->computation, used.beta, best->communication, best->cost);
  for (const auto& [name, layouts] : FixedSchemes(request.devices)) {
    if (!SchemeFits(problem, layouts)) {
      absl::StrAppendFormat(&text, "  vs %-10s (%s): not possible (a split does not divide)\n",
                            name, Joined(layouts));
      continue;
    }
    const LayoutScheme fixed = EvaluateLayouts(problem, layouts);
    absl::StrAppendFormat(&text, "  vs %-10s (%s): %.4g (%+.1f%%)\n", name, Joined(layouts),
                          fixed.cost, 100.0 * (fixed.cost / best->cost - 1));
  }
  return text;
}

}  // namespace pipetrain
