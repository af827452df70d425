// Planner: from a resolved job spec, the chosen workers and a model profile
// to a Plan (forward and backward unit ranges per stage, predicted time,
// timeline) and one compiled program per stage. The solving itself is
// SolvePlan (solve_plan.h); this file maps a job onto it.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_PLANNER_H_
#define PIPETRAIN_COORDINATOR_PLANNER_PLANNER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/planner/profile.h"
#include "coordinator/planner/solve_plan.h"
#include "proto/pipetrain/v1/plan.pb.h"
#include "spec/job_spec.h"

namespace pipetrain {

struct CompiledPlan {
  v1::Plan plan;
  std::vector<v1::Program> programs;  // per stage
  // Per stage, the forward-only validation program (CompileEvalPrograms)
  // when spec.training.eval_interval > 0: ceil(eval_windows / micro-batch
  // size) validation micro-batches; empty otherwise.
  std::vector<v1::Program> eval_programs;
};

// What planning a job will cost, from its spec alone (for the submit-time
// budget below): solver inner steps (bipartition's DP is about P * U^3 for P
// stages and U units; pipedream P * U^2; uniform and manual U), and stages x
// micro-batches (training plus validation), which sizes the programs, the
// simulation and the plan's timeline (~500 bytes of SVG each). P is the
// most stages the job may be planned on: spec.elastic.max_workers when
// above spec.parallelism.stages (growth and recovery plan again, unchecked).
// With spec.parallelism.data 0 (auto): the sum over the layouts of N
// workers for the N in [1, workers] where it is largest (a recovery plans
// on fewer workers, and fewer may have more layouts).
struct PlanningWork {
  double solver_steps = 0;
  int64_t stage_micro_batches = 0;
};
PlanningWork EstimatePlanningWork(const ResolvedJobSpec& resolved);

// The budget: kMaxSolverSteps (solve_plan.h), and stages x micro-batches
// so that a plan (GET /plan) stays well below the gRPC message limit.
inline constexpr int64_t kMaxStageMicroBatches = 16384;

// RESOURCE_EXHAUSTED naming the estimate, the budget and what to lower when
// EstimatePlanningWork(resolved) exceeds it.
absl::Status CheckPlanningBudget(const ResolvedJobSpec& resolved);

// Copies of the weights it steps that each CPU worker of `resolved`'s plan
// holds beside memory_i's terms (bipartition.h c_i): with data-parallel
// compression one residual per gradient; with checkpoints the writer's
// host snapshot while one is written, 3 (weights and both AdamW moments)
// plus, with compression, every replica's residuals (one, their sum, past
// kMaxFeedbackReplicasKept), times the tensor ranks its rank 0 gathers;
// with tensor ranks and spec.output.weights_path, T more for rank 0's
// gather of the final weights; with tensor ranks and spec.init.from, at
// least T (each rank reads its stage's starting weights unsplit); at T > 1
// with checkpoints, the writer's buffer of its own shards' residuals too,
// one per replica's residual kept.
double CpuSteppedWeightCopies(const ResolvedJobSpec& resolved);

// Requires cluster.workers.size() == resolved.stages x
// resolved.data_parallel x resolved.tensor_parallel, replica r's stage s,
// tensor rank t at (r * stages + s) * tensor_parallel + t, named by worker
// id. A stage's tensor ranks are planned as one worker (TensorGroupCluster:
// the slowest) whose units cost what one rank's do (TensorParallelUnitCosts,
// with the job's AccTFM partitions, Alg. 1's when
// resolved.tensor_partitions is 0; both timed with the compute at the
// groups' speed, the slowest position's, and the all-reduces a rank waits
// for kept out of the speed scaling), and the plan's stages list each rank
// with the stage's ranges. With data parallelism the
// replicas share one plan (solved for the slowest speed and least memory at each stage position,
// compiled for each replica's micro_batches / data_parallel micro-batches): `programs` and
// `eval_programs` have one entry per stage of a replica, the plan's stages list every replica's
// workers; `profile` describes the job's model at its micro-batch size (measured or
// AnalyticProfile) and `profile_source` says which. Errors as SolvePlan (INVALID_ARGUMENT,
// RESOURCE_EXHAUSTED when nothing fits); FAILED_PRECONDITION when a stage's replicas or its
// tensor ranks would run on GPU and CPU workers both (CheckReplicaDevices); INVALID_ARGUMENT
// naming spec.parallelism.manual_stages, the unit, its bytes and the limit when a manual plan
// runs the two passes of a unit whose weights exceed the largest tensor a plan may send on
// different stages (its weight sync could not be sent); FAILED_PRECONDITION naming the stage, the
// unit and --mailbox-limit when a stage's output or the gradient at its backward cut (one
// micro-batch's activation_bytes) exceeds it. That largest tensor is the data plane's
// per-tensor limit (common/data_plane_limits.h) or, when smaller, cluster.mailbox_limit_bytes
// (MaxPlannedTensorBytes), which Bi-Partition keeps its weight syncs within too. The
// cluster's links are planned with the data plane's measured cost per message added
// (data_plane_cost.h), stretched where lockstep ranks oversubscribe a host's cores.
absl::StatusOr<CompiledPlan> PlanJob(const ResolvedJobSpec& resolved, const std::string& job_id,
                                     int64_t version, const ModelProfile& profile,
                                     const ClusterSpec& cluster,
                                     const std::string& profile_source);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_PLANNER_H_
