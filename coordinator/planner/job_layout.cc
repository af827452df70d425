#include "coordinator/planner/job_layout.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/planner/data_parallel_layout.h"

namespace pipetrain {
namespace {

// "D x P", or "D x P x T" when T was searched.
std::string TrialName(const LayoutTrial& t, bool searched_tensor) {
  return searched_tensor ? absl::StrCat(t.data_parallel, " x ", t.stages, " x ", t.tensor_parallel)
                         : absl::StrCat(t.data_parallel, " x ", t.stages);
}

// Where `cluster` mixes GPU and CPU workers and the layout has replicas
// or tensor ranks: the order that gives each stage's workers one kind
// (ArrangeByDeviceKind), when it is not the cluster's own. In the
// cluster's order such a layout's plan was refused (CheckReplicaDevices)
// whenever the ids interleaved the kinds, and with no other layout the
// job failed.
std::vector<size_t> OneKindOrder(const ClusterSpec& cluster, const LayoutDegrees& degrees) {
  if (degrees.data_parallel == 1 && degrees.tensor_parallel == 1) return {};
  std::vector<bool> gpu;
  for (const WorkerSpec& w : cluster.workers) gpu.push_back(w.gpu);
  if (std::all_of(gpu.begin(), gpu.end(), [&](bool g) { return g == gpu[0]; })) return {};
  std::optional<std::vector<size_t>> order =
      ArrangeByDeviceKind(gpu, degrees.data_parallel, degrees.stages, degrees.tensor_parallel);
  if (!order.has_value() || order->size() != cluster.workers.size()) return {};
  for (size_t i = 0; i < order->size(); ++i) {
    if ((*order)[i] != i) return *std::move(order);
  }
  return {};
}

}  // namespace

absl::StatusOr<ChosenJobLayout> ChooseJobLayout(const ResolvedJobSpec& auto_spec,
                                                const std::string& job_id, int64_t version,
                                                const ModelProfile& profile,
                                                const ClusterSpec& cluster,
                                                const std::string& profile_source) {
  const int workers = auto_spec.layout_workers;
  if (auto_spec.data_parallel != kDataParallelAuto ||
      static_cast<int>(cluster.workers.size()) != workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("choosing a layout needs a job with spec.parallelism.data 0 and its ", workers,
                     " workers; got data ", auto_spec.data_parallel, " and ",
                     cluster.workers.size(), " workers"));
  }
  const bool searched_tensor = auto_spec.tensor_parallel == kTensorParallelAuto;
  ChosenJobLayout best;
  std::vector<LayoutTrial> trials;
  bool found = false;
  for (const LayoutDegrees& degrees : AutoLayoutDegrees(auto_spec.spec, workers)) {
    LayoutTrial trial;
    trial.data_parallel = degrees.data_parallel;
    trial.stages = degrees.stages;
    trial.tensor_parallel = degrees.tensor_parallel;
    absl::StatusOr<ResolvedJobSpec> layout = ResolveDataParallelLayout(auto_spec, degrees);
    // A layout whose checkpoints could never be read back is not chosen
    // (submit checks an explicit layout the same way).
    if (layout.ok()) {
      const absl::Status files = CheckUnitFileSizes(*layout);
      if (!files.ok()) layout = files;
    }
    std::vector<size_t> order = OneKindOrder(cluster, degrees);
    ClusterSpec arranged;
    if (!order.empty()) {
      arranged = cluster;
      for (size_t i = 0; i < order.size(); ++i) arranged.workers[i] = cluster.workers[order[i]];
    }
    absl::StatusOr<CompiledPlan> compiled =
        layout.ok() ? PlanJob(*layout, job_id, version, profile, order.empty() ? cluster : arranged,
                              profile_source)
                    : absl::StatusOr<CompiledPlan>(layout.status());
    trial.status = compiled.status();
    if (compiled.ok()) {
      trial.predicted_step_seconds = compiled->plan.predicted_iteration_seconds();
      if (!found ||
          trial.predicted_step_seconds < best.compiled.plan.predicted_iteration_seconds()) {
        found = true;
        best.resolved = *std::move(layout);
        best.compiled = *std::move(compiled);
        best.order = std::move(order);
      }
    }
    trials.push_back(std::move(trial));
  }
  if (!found) {
    std::vector<std::string> reasons;
    for (const LayoutTrial& t : trials) {
      reasons.push_back(absl::StrCat(TrialName(t, searched_tensor), ": ", t.status.message()));
    }
    const absl::StatusCode code =
        trials.empty() ? absl::StatusCode::kInvalidArgument : trials[0].status.code();
    return absl::Status(code, absl::StrCat("no layout of ", workers,
                                           " workers has a plan: ", absl::StrJoin(reasons, "; ")));
  }
  best.trials = std::move(trials);
  best.searched_tensor = searched_tensor;
  if (searched_tensor) {
    for (const auto& [t, why] : UnsplitTensorRanks(auto_spec.spec, workers)) {
      best.tensor_not_tried.push_back(absl::StrCat("T ", t, " (", why, ")"));
    }
  }
  return best;
}

std::string DescribeLayoutChoice(const ChosenJobLayout& choice) {
  std::vector<std::string> trials;
  for (const LayoutTrial& t : choice.trials) {
    trials.push_back(absl::StrCat(
        TrialName(t, choice.searched_tensor), " ",
        t.status.ok() ? absl::StrFormat("%.4f", t.predicted_step_seconds)
                      : absl::StrCat("no plan (", absl::StatusCodeToString(t.status.code()), ")")));
  }
  const int tensor = choice.resolved.tensor_parallel;
  const int replicas = choice.resolved.data_parallel;
  std::string ranks;  // the stages' tensor ranks, where there are or T was chosen
  if (tensor > 1) ranks = absl::StrCat(" of ", tensor, " tensor ranks");
  if (tensor == 1 && choice.searched_tensor) ranks = " of 1 tensor rank";
  const char* searched = choice.searched_tensor
                             ? " and tensor 0 (auto); predicted s/step (replicas x stages x "
                               "tensor ranks): "
                             : " (auto); predicted s/step: ";
  return absl::StrCat(
      replicas, replicas == 1 ? " replica" : " replicas", " x ", choice.resolved.stages,
      choice.resolved.stages == 1 ? " stage" : " stages", ranks,
      " chosen by spec.parallelism.data 0", searched, absl::StrJoin(trials, ", "),
      choice.tensor_not_tried.empty()
          ? ""
          : absl::StrCat("; not tried: ", absl::StrJoin(choice.tensor_not_tried, ", ")));
}

}  // namespace pipetrain
