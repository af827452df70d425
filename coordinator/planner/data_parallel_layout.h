// Data-parallel layouts: N workers as D replicas of a P-stage pipeline,
// D x P = N (DESIGN.md §12, the data and pipeline axes; no tensor axis yet).
//
// Replica r runs on workers [r*P, (r+1)*P) of the cluster, in order: worker
// r*P + p is replica r's stage p. Every replica runs the same plan (the
// runtime compiles one replica's programs and runs them D times), so a
// layout is planned on ONE replica's worth of stage workers, built
// conservatively (ReplicaStageCluster): stage p gets the slowest speed and
// the smallest memory among workers p, P+p, ..., (D-1)P+p. SolvePlan then
// runs on those P workers with micro_batches = m / D (each replica's share
// of a step's m micro-batches) and data_parallel = D, so its simulation
// includes every stage's gradient all-reduce across the replicas
// (simulator.h: a ring over the cluster's link, acctfm.txt eq. 3).
//
// Two figures per layout:
//  - the SIMULATED step time (SolvedPlan::simulation.iteration_seconds):
//    what "auto" minimises;
//  - DistPar's cost (distpar.txt §3.4 "Cost design"), printed beside it for
//    comparison: overall = computation + beta * communication. The paper
//    gives it in words, without a numbered equation; implemented literally
//    (DistParLayoutCost below says how each word maps to this system).
//
// Thread-safety: pure functions; call them from any thread.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_DATA_PARALLEL_LAYOUT_H_
#define PIPETRAIN_COORDINATOR_PLANNER_DATA_PARALLEL_LAYOUT_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "coordinator/planner/profile.h"
#include "coordinator/planner/solve_plan.h"

namespace pipetrain {

// LayoutOptions::data_parallel value that searches every layout.
inline constexpr int kAutoDataParallel = 0;

struct LayoutOptions {
  int data_parallel = 1;    // D >= 1 (spec parallelism.data), or kAutoDataParallel
  int micro_batches = 1;    // m: a step's micro-batches over ALL replicas
                            // (spec training.micro_batches); D must divide it
  double distpar_beta = 1;  // DistPar's beta: weight of communication, >= 0
  // With D > 1, each layout is priced with the tied embedding's sync
  // fused (spec parallelism.fused_embedding_sync, whose default this is):
  // as its workers would run it (planner.cc).
  bool fused_embedding_sync = true;
  // Solver, objective, schedule and manual ranges for every layout. Its
  // micro_batches and data_parallel are ignored: each layout sets m / D and D.
  PlanOptions plan;
};

// DistPar's cost of one layout (distpar.txt §3.4), in fp32 tensor elements
// (bytes / 4; every tensor in this system is fp32, DESIGN.md §3).
struct DistParCost {
  double computation = 0;
  double communication = 0;
  double total = 0;  // computation + beta * communication
};

struct LayoutCandidate {
  int data_parallel = 1;  // D
  int stages = 1;         // P = N / D
  // OK, or why this layout has no plan (SolvePlan's status: typically
  // RESOURCE_EXHAUSTED, a stage over its memory, or FAILED_PRECONDITION,
  // replicas on GPUs and CPUs both; only "auto" lists such layouts, an
  // explicit D returns the error instead).
  absl::Status status;
  DistParCost distpar;                // valid when status is OK
  double step_seconds = 0;            // simulated step (iteration) time; valid when OK
  double max_all_reduce_seconds = 0;  // the slowest stage's all-reduce; valid when OK
  // How much longer a stage's compute takes because its replicas share a
  // host's cores (LockstepComputeStretch; 1 when the cluster names no hosts).
  double compute_stretch = 1;
};

struct DataParallelLayout {
  // Auto: every layout with D | N, D | m and P <= units (and P equal to the
  // manual ranges' count for solver "manual"), ascending D. Explicit D: that
  // one layout.
  std::vector<LayoutCandidate> candidates;
  int chosen = 0;  // index into candidates: the lowest step_seconds; ties: smaller D
  // The chosen layout: stage_workers[p] = the input cluster's indices of
  // stage p's workers (p, P+p, ...), the stage cluster it was planned on
  // (ReplicaStageCluster) and its plan (for P workers; data_parallel = D).
  std::vector<std::vector<int>> stage_workers;
  ClusterSpec stage_cluster;
  SolvedPlan plan;
};

// Workers that name a host and its cores (WorkerSpec::host, host_cores,
// compute_threads) are planned as a job's are (planner.h): each layout's
// lockstep compute stretch on the profile and on the data plane's cost
// (the cluster's data_plane_* folded into its links here, AddDataPlaneCost),
// and its step simulated with the positions sharing cores
// (SimulateWithSharedCores).
//
// Plans `cluster` (N = cluster.workers.size() >= 1 workers) as D replicas of
// N / D stages for one D (options.data_parallel >= 1) or every D
// (kAutoDataParallel), and picks the layout with the lowest simulated step
// time; ties go to the smaller D (fewer replicas: less gradient traffic for
// the same predicted time). Deterministic: the choice depends only on the
// inputs.
// Errors:
//  INVALID_ARGUMENT  options.micro_batches < 1 ("training.micro_batches");
//                    data_parallel < 0, or not dividing N ("parallelism.data
//                    = 3 does not divide the 8 workers"), or not dividing m
//                    ("training.micro_batches = 6 is not divisible by
//                    parallelism.data = 4"); distpar_beta negative or not
//                    finite; auto with no layout at all (no D dividing both N
//                    and m with P <= units); and SolvePlan's INVALID_ARGUMENTs
//                    for an explicit D (e.g. more stages than the solver
//                    allows).
//  RESOURCE_EXHAUSTED an explicit D's plan does not fit in memory.
//  auto and no layout has a plan: the first layout tried's code (e.g.
//                    FAILED_PRECONDITION for D = 1 mixing GPU and CPU
//                    workers, RESOURCE_EXHAUSTED for memory), the message
//                    listing each layout's reason.
//  Other SolvePlan errors pass through unchanged.
absl::StatusOr<DataParallelLayout> PlanDataParallel(const ModelProfile& profile,
                                                    const ClusterSpec& cluster,
                                                    const LayoutOptions& options);

// One replica's stage workers for D replicas of `cluster` (requires
// data_parallel >= 1 dividing cluster.workers.size()): P = N / D entries;
// entry p is named by its workers' names joined with "," ("w0,w4"), has the
// minimum speed and the minimum memory_bytes over workers p, P+p, ...
// (memory 0 means unlimited: it is the minimum only when every one is 0),
// and the cluster's bandwidth and latency. D = 1 returns `cluster` as is.
ClusterSpec ReplicaStageCluster(const ClusterSpec& cluster, int data_parallel);

// OK when every data-parallel group of `cluster` (laid out as `replicas`
// x `stages` x `tensor` workers, tensor rank innermost: the group of stage
// s and rank t is workers (r * stages + s) * tensor + t over r) runs on
// GPUs only or on CPUs only (WorkerSpec::gpu); FAILED_PRECONDITION naming
// the first group that mixes them otherwise; and likewise when a tensor
// group (the `tensor` consecutive ranks of one replica's stage) mixes them,
// checked after the data-parallel groups. Replicas must hold bitwise the
// same weights after every step (the coordinator compares them at the
// end), tensor ranks bitwise the same replicated parameters, and a GPU's
// optimizer step and gradient norm round differently from a CPU's. A
// tensor group of GPUs is also refused (FAILED_PRECONDITION naming two of
// its workers and both WorkerSpec::gpu_arithmetic values) when their
// gpu_arithmetic differ and neither is empty: each rank computes the
// replicated parts itself (LayerNorm, the device codecs' GEMMs), and
// another GPU model or GEMM mode rounds them apart. Data-parallel groups
// need no such rule: their gradients are all-reduced, so every replica
// steps its weights from the same sums with the same elementwise kernels.
// Requires the sizes to multiply to the cluster's size.
absl::Status CheckReplicaDevices(const ClusterSpec& cluster, int replicas, int stages, int tensor);

// A worker's WorkerSpec::gpu_arithmetic from its DeviceInfo's gpu_model
// and backend (Backend::Describe, e.g. "cuda:0 (NVIDIA H100 80GB HBM3),
// tf32 GEMMs, flash attention"): "<gpu_model>, <GEMM clause>" ("NVIDIA
// H100 80GB HBM3, tf32 GEMMs"; a bf16 clause keeps its operands, "bf16
// GEMMs (cublas)"), the clause being the backend's text after "), " up to
// the next ", " (none: the model alone). The attention kernel is left out:
// a tensor group splits attention by heads, and the all-reduce after it
// makes every rank's result the same. Empty when gpu_model is (a CPU
// worker: CPU kernels round alike on every CPU).
std::string GpuArithmetic(absl::string_view gpu_model, absl::string_view backend);

// Picks `replicas` x `stages` x `tensor` of the candidate workers whose
// kinds are `gpu` (true: a GPU worker), listed in the order they are
// preferred, such that CheckReplicaDevices accepts them: the workers of
// each stage (its replicas' ranks) all of one kind. Returns the picked
// candidates' indices in position order ((r * stages + s) * tensor + t),
// or nullopt when the candidates hold no such set. Of the choices, the
// one whose count of GPU stages is nearest the first `need` candidates'
// GPUs (in whole stages); the stages that held the most GPUs among those
// are the GPU ones; each kind's candidates go to its positions in order
// of preference. First `need` candidates that pass already are returned
// as they are. Requires positive sizes.
std::optional<std::vector<size_t>> ArrangeByDeviceKind(const std::vector<bool>& gpu, int replicas,
                                                       int stages, int tensor);

// Tensor parallelism: one entry per group of `tensor_parallel` consecutive
// workers (a stage's tensor ranks), named by their names joined with "+",
// with their minimum speed and memory as ReplicaStageCluster; T = 1 returns
// `cluster` as is. Requires T >= 1 dividing cluster.workers.size().
ClusterSpec TensorGroupCluster(const ClusterSpec& cluster, int tensor_parallel);

// DistPar's cost (distpar.txt §3.4) of `plan` (one replica's programs,
// plan.data_parallel replicas) on `profile`, with the paper's words mapped
// to this system:
//  - "Computational cost ... the sum of the elements of the input and
//    output tensors" of the operators a device runs under the strategy: a
//    unit is an operator; each Forward, Recompute and Backward instruction
//    over units U counts sum_{u in U} (in(u) + out(u)) elements, in(u) =
//    activation_bytes[u-1] / 4 (0 for u = 0: token ids are not a float
//    tensor of the profile), out(u) = activation_bytes[u] / 4 (a backward
//    pass reads the output's gradient and writes the input's: the same
//    sizes). Devices compute concurrently on their local (physical)
//    tensors, so a layout's computational cost is its busiest device's sum
//    over one step (the programs hold m / D micro-batches): a maximum over
//    devices, not a total. `plan --tensor` (distpar_layout.h) sums its
//    computation over all devices instead, so that command's "DistPar
//    cost" and this one (`plan --data auto`) are not comparable.
//  - "Communication cost is defined as the total communications across
//    multiple devices", the conversions' volumes: every Send of one
//    replica's programs (TransferBytes / 4) times D replicas, plus each
//    stage's gradient all-reduce, a PartialReduce -> Broadcast conversion
//    over the D copies of the stage whose volume is (D-1)|T| for its
//    reduce-scatter plus (D-1)|T| for its all-gather (the (n-1)|T| of
//    distpar.txt §5 per collective), |T| = AllReduceBytes / 4.
//  - total = computation + beta * communication ("the ratio of
//    computational cost to communication cost, which is denoted by beta";
//    the paper's experiments use beta in {0.01, 0.1, 1, 10}).
// Requires: `plan` is SolvePlan's result for `profile` (its programs valid).
DistParCost DistParLayoutCost(const SolvedPlan& plan, const ModelProfile& profile, double beta);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_DATA_PARALLEL_LAYOUT_H_
