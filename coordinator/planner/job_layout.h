// A job with spec.parallelism.data 0 (auto) chooses its layout here, once
// its profile is measured on its workers: every layout of its N workers as
// D replicas of N / (D x T) stages, each stage on T tensor ranks
// (AutoLayoutDegrees: T is the spec's, or every T that splits the model
// with spec.parallelism.tensor 0), is planned exactly as a job that named
// it would be (PlanJob: the solver, the schedule, the links, the workers
// sharing a host's cores, the gradient and tensor-parallel all-reduces),
// and the layout whose simulated step is the shortest is kept (issue 21
// scope 6: "auto picks the layout with the lowest simulated step time";
// DistPar's search over the data, tensor and pipeline axes, distpar.txt
// §3, scored by the simulator rather than its cost function).
// `pipetrain plan --data auto` searches D on a cluster file
// (data_parallel_layout.h) and prints DistPar's cost beside each; a job
// compares the simulated steps only.
//
// Thread-safety: a pure function; call it from any thread.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_JOB_LAYOUT_H_
#define PIPETRAIN_COORDINATOR_PLANNER_JOB_LAYOUT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/planner/planner.h"
#include "coordinator/planner/profile.h"
#include "spec/job_spec.h"

namespace pipetrain {

struct LayoutTrial {
  int data_parallel = 1;    // D
  int stages = 1;           // N / (D x T)
  int tensor_parallel = 1;  // T
  // OK, or why the layout has no plan (PlanJob's error: typically
  // RESOURCE_EXHAUSTED, a stage over its worker's memory).
  absl::Status status;
  double predicted_step_seconds = 0;  // the plan's simulated step; when OK
};

struct ChosenJobLayout {
  ResolvedJobSpec resolved;         // the kept layout's spec (ResolveDataParallelLayout)
  CompiledPlan compiled;            // and its plan (PlanJob)
  std::vector<LayoutTrial> trials;  // every layout planned, ascending T, then D
  bool searched_tensor = false;     // the auto spec had tensor 0: T was chosen too
  // Searching T: the T >= 2 dividing the workers (with tensor_mode 3d, the
  // cubes p^3 among them) that split no layout, each
  // with why ("T 2 (tensor parallelism of 2 does not divide
  // model.vocab_size 50257 ...)"), so a choice of single ranks says why.
  std::vector<std::string> tensor_not_tried;
  // The cluster's workers in the kept plan's position order (indices into
  // cluster.workers), when that differs from the cluster's own: a layout
  // with replicas or tensor ranks is planned on the workers arranged so
  // that each stage's are of one kind (ArrangeByDeviceKind), as a job that
  // named the layout is placed. Empty: the cluster's order.
  std::vector<size_t> order;
};

// Plans every layout of `auto_spec` (data_parallel == kDataParallelAuto,
// layout_workers == cluster.workers.size()), each on the cluster's workers
// arranged by device kind where it mixes GPUs and CPUs (ChosenJobLayout::
// order), and returns the one with the lowest predicted step; ties go to the smaller T, then the
// smaller D (less tensor-parallel, then gradient, traffic for the same predicted time).
// Deterministic: the choice depends only on the inputs. The other arguments are PlanJob's, which
// gives the plan its version and job id. Errors: INVALID_ARGUMENT when auto_spec is not auto or the
// cluster's size is not its workers; when no layout has a plan, the first layout's error code with
// every layout's reason in the message ("no layout of 4 workers has a plan: 1 x 4: ...; 2 x 2:
// ...").
absl::StatusOr<ChosenJobLayout> ChooseJobLayout(const ResolvedJobSpec& auto_spec,
                                                const std::string& job_id, int64_t version,
                                                const ModelProfile& profile,
                                                const ClusterSpec& cluster,
                                                const std::string& profile_source);

// One line for the plan history and the log, e.g. "2 replicas x 2 stages
// chosen by spec.parallelism.data 0 (auto); predicted s/step: 1 x 4 0.2100,
// 2 x 2 0.1530, 4 x 1 no plan (RESOURCE_EXHAUSTED)" ("2 replicas x 2
// stages of 2 tensor ranks chosen ..." with T > 1; the trials are D x P).
// When T was searched (tensor 0), the trials are D x P x T and the line
// ends "... chosen by spec.parallelism.data 0 and tensor 0 (auto);
// predicted s/step (replicas x stages x tensor ranks): 1 x 4 x 1 0.2100,
// ...", then "; not tried: T 2 (why), ..." for tensor_not_tried.
std::string DescribeLayoutChoice(const ChosenJobLayout& choice);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_JOB_LAYOUT_H_
