// SolvePlan: one entry point from (profile, cluster, solver) to a compiled,
// simulated plan — what `pipetrain plan` prints and what a job runs
// (DESIGN.md §5).
//
//   uniform      equal unit counts per worker (forward cut = backward cut)
//   pipedream    min-max of fwd+bwd seconds per worker, equal cuts (DP)
//   bipartition  separate forward and backward cuts (bipartition.h), worker
//                speeds and memory limits honoured, objective paper | full
//   auto         the candidate among the three with the lowest SIMULATED
//                iteration time (options.simulate's, when given; ties:
//                uniform, then pipedream, then bipartition; candidates
//                that do not fit in memory skipped)
//   manual       the caller's forward and backward ranges, as given
//
// Every plan is scored with the bipartition objective (bottleneck_seconds,
// comparable across solvers), compiled by the schedule compiler and run
// through the simulator, whose iteration time is the plan's prediction.
// uniform ignores worker speeds when choosing cuts (the baseline), and
// pipedream weighs each stage's compute by its worker's speed with equal
// forward and backward cuts (SpeedAwarePipeDreamPartition); all are
// simulated with the speeds. Memory per worker follows
// bipartition.h's formula; a uniform, pipedream or manual plan over a
// worker's memory is RESOURCE_EXHAUSTED naming the worker.
//
// Data parallelism (DESIGN.md §12; options.data_parallel = D): the cluster
// is ONE replica's workers, one per stage, and options.micro_batches is the
// count EACH replica runs (a step's global count / D). The solvers and the
// compiled programs are the replica's; the simulation adds, before each
// worker's optimizer step, the ring all-reduce of its gradients with the
// D-1 other replicas' copies of its stage over the cluster's link
// (bandwidth, latency), as simulator.h models it. The caller picks the
// replica's workers (data_parallel_layout.h: per stage, the slowest and
// smallest of the replicas' workers at that position). D = 1: no replicas,
// exactly the plan without data parallelism.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_SOLVE_PLAN_H_
#define PIPETRAIN_COORDINATOR_PLANNER_SOLVE_PLAN_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/planner/partition.h"
#include "coordinator/planner/profile.h"
#include "coordinator/planner/schedule_compiler.h"
#include "coordinator/planner/simulator.h"
#include "proto/pipetrain/v1/plan.pb.h"
#include "worker/model/gpt_config.h"

namespace pipetrain {

struct PlanOptions {
  std::string solver = "bipartition";  // see above
  std::string objective = "paper";     // paper | full
  int micro_batches = 1;               // per replica (with data_parallel > 1)
  Schedule schedule = Schedule::kOneFOneB;
  int data_parallel = 1;  // replicas of the pipeline, >= 1
  // Copies of its stepped weights each CPU worker of `cluster` holds beside
  // them (BiPartitionProblem::stepped_weight_copies), in [0, 1e4]
  // (CpuSteppedWeightCopies: a checkpoint's host snapshot, data-parallel
  // error feedback). A GPU worker's are in host memory, which its
  // memory_bytes (the GPU's) does not hold.
  double cpu_stepped_weight_copies = 0;
  // Solver "manual" only: one range per worker each.
  std::vector<Range> manual_forward, manual_backward;
  // Optional: the caller's own simulation of a plan's programs
  // (planner.cc and data_parallel_layout.cc add the cores that stage
  // positions on one host share, and the links' codecs), which every
  // solver's plan reports instead of the plain one, so that auto ranks its
  // candidates (and fills `candidates`) by what the caller predicts.
  std::function<absl::StatusOr<SimulationResult>(const std::vector<v1::Program>&)> simulate;
};

struct SolvedPlan {
  std::string solver;     // for auto: the winner
  std::string objective;
  std::vector<Range> forward, backward;  // per worker
  std::vector<double> memory_bytes;      // per worker (bipartition.h formula)
  double bottleneck_seconds = 0;         // the objective's value
  double solve_seconds = 0;              // wall time of the solver (all candidates for auto)
  std::vector<v1::Program> programs;     // per worker
  SimulationResult simulation;           // predicted iteration, bubble, timeline
  std::map<std::string, double> candidates;  // auto: solver -> simulated seconds
  // auto: the solvers that gave no candidate -> why (a plan over a worker's
  // memory, more workers than units), so that a reader does not take a
  // missing one for a slower one.
  std::map<std::string, std::string> candidates_skipped;
  int data_parallel = 1;                     // options.data_parallel
  // Per worker: the simulated gradient all-reduce before its optimizer step
  // (simulation.all_reduce_seconds; all 0 when data_parallel == 1).
  std::vector<double> all_reduce_seconds;
};

// INVALID_ARGUMENT for an unknown solver/objective, micro_batches < 1,
// data_parallel < 1, more
// workers than a solver allows (uniform/pipedream: one unit each at least;
// bipartition: 2 x units), bad manual ranges; RESOURCE_EXHAUSTED when no
// plan fits in memory. auto, when no candidate applies: Bi-Partition's code,
// "solver auto found no plan; bipartition: ...; pipedream: ...; uniform:
// ...". Profile and cluster must be valid (profile.h parsers).
absl::StatusOr<SolvedPlan> SolvePlan(const ModelProfile& profile, const ClusterSpec& cluster,
                                     const PlanOptions& options);

// About how many inner steps `solver` takes for `stages` workers and `units`
// units: bipartition's DP about P * U^3 (and auto also runs pipedream and
// uniform), pipedream's P * U^2, uniform's and manual's U per worker. A
// relative measure for the budget below, not a time.
double SolverSteps(const std::string& solver, double stages, double units);

// The coordinator's planning budget in SolverSteps: it plans jobs on one
// thread, a plan at a time, so a plan must take seconds, not hours, or the
// jobs queued behind it wait (planner.h CheckPlanningBudget). Measured on a
// 2-core development VM: bipartition at P * U^3 = 4.7e8 (P 64, U 194)
// solves in 5.6 s (7.3 s with the full objective).
inline constexpr double kMaxSolverSteps = 4e8;

// The TIED_EMBEDDING_GRAD size the simulator charges: the head's weight
// bytes (its copy of wte plus the final LayerNorm, which is within 0.1 %).
double TiedGradientBytes(const ModelProfile& profile);

// A profile computed rather than measured: seconds = AnalyticUnitCosts'
// FLOPs / flops_per_second (> 0), bytes from the model's tensor shapes
// (activation B·T·d floats, the head's a 4-byte loss; stash = the saved
// tensors' analytic size; transient = what a pass allocates beyond them,
// as the CPU backend's units do). For planning before any worker has
// profiled, and for a measured profile's transient_bytes where the
// profiler could not measure them.
// `attention`: how the workers run the attention units (AnalyticAttention).
ModelProfile AnalyticProfile(const GptConfig& config, int seq_len, int micro_batch_size,
                             double flops_per_second,
                             AnalyticAttention attention = AnalyticAttention::kCpu);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_SOLVE_PLAN_H_
