#include "coordinator/planner/tensor_partitions.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain {

absl::StatusOr<TensorPartitionPlan> ChooseTensorPartitions(const ModelProfile& profile, int tensor,
                                                           double bandwidth_bytes_per_second,
                                                           double latency_seconds) {
  if (tensor < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("AccTFM partitions need a tensor-parallel group of 2 or more, got ", tensor));
  }
  AccTfmProblem problem;
  AllReduceModel model;
  model.alpha_seconds = latency_seconds;
  model.beta_seconds_per_byte =
      bandwidth_bytes_per_second > 0 ? 1.0 / bandwidth_bytes_per_second : 0.0;
  model.group_size = tensor;
  model.algorithm = AllReduceAlgorithm::kRing;
  problem.allreduce = model;
  std::vector<int> layer_units;  // the profile's index of each layer
  for (size_t u = 0; u < profile.units.size(); ++u) {
    const UnitProfile& unit = profile.units[u];
    if (!absl::StartsWith(unit.name, "attn_") && !absl::StartsWith(unit.name, "mlp_")) continue;
    AccTfmLayer layer;
    for (int k : kAccTfmSizes) {
      layer.fwd_compute_seconds.push_back(unit.fwd_seconds / tensor / k);
      layer.bwd_compute_seconds.push_back(unit.bwd_seconds / tensor / k);
    }
    layer.output_bytes = unit.activation_bytes;
    problem.layers.push_back(std::move(layer));
    layer_units.push_back(static_cast<int>(u));
  }
  if (problem.layers.empty()) {
    return absl::InvalidArgumentError("the profile has no attention or MLP unit to partition");
  }
  TensorPartitionPlan out;
  ASSIGN_OR_RETURN(out.solution, SolveAccTfm(problem));
  out.forward.assign(profile.units.size(), 1);
  out.backward.assign(profile.units.size(), 1);
  for (size_t l = 0; l < layer_units.size(); ++l) {
    out.forward[layer_units[l]] = out.solution.forward.plan.partition_sizes[l];
    out.backward[layer_units[l]] = out.solution.backward.plan.partition_sizes[l];
  }
  return out;
}

}  // namespace pipetrain
