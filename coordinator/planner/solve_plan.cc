#include "coordinator/planner/solve_plan.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "coordinator/planner/bipartition.h"
#include "coordinator/planner/unit_costs.h"

namespace pipetrain {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

absl::StatusOr<BiPartitionProblem> MakeProblem(const ModelProfile& profile,
                                               const ClusterSpec& cluster,
                                               const PlanOptions& options) {
  BiPartitionProblem problem = MakeBiPartitionProblem(profile, cluster);
  problem.micro_batches = options.micro_batches;
  if (options.cpu_stepped_weight_copies != 0) {
    for (const WorkerSpec& w : cluster.workers) {
      problem.stepped_weight_copies.push_back(w.gpu ? 0.0 : options.cpu_stepped_weight_copies);
    }
  }
  problem.schedule = options.schedule == Schedule::kGPipe ? BiPartitionSchedule::kGPipe
                                                          : BiPartitionSchedule::kOneFOneB;
  if (options.objective == "paper") {
    problem.objective = BiPartitionObjective::kPaper;
  } else if (options.objective == "full") {
    problem.objective = BiPartitionObjective::kFull;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown objective '", options.objective, "'; use paper or full"));
  }
  if (options.micro_batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro-batches must be >= 1, got ", options.micro_batches));
  }
  if (options.data_parallel < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data parallelism (parallelism.data) must be >= 1 replicas, got ", options.data_parallel));
  }
  RETURN_IF_ERROR(ValidateProblem(problem));
  return problem;
}

// An equal-cut or manual plan: memory-checked, scored with the objective.
absl::StatusOr<BiPartitionPlan> ScoreFixedPlan(const BiPartitionProblem& problem,
                                               const ClusterSpec& cluster,
                                               std::vector<Range> forward,
                                               std::vector<Range> backward) {
  const BiPartitionCosts costs(problem);
  for (size_t w = 0; w < forward.size(); ++w) {
    if (!costs.Fits(static_cast<int>(w), forward[w], backward[w])) {
      return absl::ResourceExhaustedError(
          absl::StrCat("worker ", cluster.workers[w].name, " would need ",
                       BytesAndGiB(costs.Memory(static_cast<int>(w), forward[w], backward[w])),
                       " but has ", BytesAndGiB(cluster.workers[w].memory_bytes)));
    }
  }
  BiPartitionPlan plan{std::move(forward), std::move(backward), 0};
  plan.bottleneck = Objective(problem, plan);
  return plan;
}

absl::StatusOr<BiPartitionPlan> RunSolver(const std::string& solver,
                                          const BiPartitionProblem& problem,
                                          const ModelProfile& profile, const ClusterSpec& cluster,
                                          const PlanOptions& options) {
  const int units = static_cast<int>(profile.units.size());
  const int workers = static_cast<int>(cluster.workers.size());
  if (solver == "bipartition") return SolveBiPartition(problem);
  if (solver == "manual") {
    if (static_cast<int>(options.manual_forward.size()) != workers ||
        static_cast<int>(options.manual_backward.size()) != workers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a manual plan needs one forward and one backward range per worker (", workers, ")"));
    }
    RETURN_IF_ERROR(
        ValidateBiPartitionRanges(options.manual_forward, options.manual_backward, units));
    return ScoreFixedPlan(problem, cluster, options.manual_forward, options.manual_backward);
  }
  std::vector<Range> ranges;
  if (solver == "uniform") {
    ASSIGN_OR_RETURN(ranges, UniformPartition(units, workers));
  } else if (solver == "pipedream") {
    // Equal cuts, speed-aware (partition.h): Bi-Partition's honest baseline.
    std::vector<UnitCost> costs;
    for (const UnitProfile& u : profile.units)
      costs.push_back({u.name, u.fwd_seconds, u.bwd_seconds,
                       u.fwd_comm_seconds + u.bwd_comm_seconds});
    ASSIGN_OR_RETURN(ranges,
                     SpeedAwarePipeDreamPartition(costs, problem.speeds, problem.activation_bytes,
                                                  problem.bandwidth));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown solver '", solver, "'; use uniform, pipedream, bipartition, auto or manual"));
  }
  return ScoreFixedPlan(problem, cluster, ranges, ranges);
}

absl::StatusOr<SolvedPlan> SolveOne(const std::string& solver, const BiPartitionProblem& problem,
                                    const ModelProfile& profile, const ClusterSpec& cluster,
                                    const PlanOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(BiPartitionPlan plan, RunSolver(solver, problem, profile, cluster, options));
  SolvedPlan out;
  out.solve_seconds = SecondsSince(start);
  out.solver = solver;
  out.objective = options.objective;
  out.forward = plan.forward;
  out.backward = plan.backward;
  out.bottleneck_seconds = plan.bottleneck;
  const BiPartitionCosts costs(problem);
  for (size_t w = 0; w < plan.forward.size(); ++w) {
    out.memory_bytes.push_back(
        costs.Memory(static_cast<int>(w), plan.forward[w], plan.backward[w]));
  }
  const int units = static_cast<int>(profile.units.size());
  ASSIGN_OR_RETURN(out.programs,
                   CompileBiPartitionPrograms(plan.forward, plan.backward, units,
                                              options.micro_batches, options.schedule));
  // The replicas' all-reduce crosses the cluster's one link setting
  // (SimulationCostsFromProfile copies it into replica_link).
  SimulationCosts sim_costs =
      SimulationCostsFromProfile(profile, cluster, TiedGradientBytes(profile));
  sim_costs.data_parallel = options.data_parallel;
  if (options.simulate) {
    ASSIGN_OR_RETURN(out.simulation, options.simulate(out.programs));
  } else {
    ASSIGN_OR_RETURN(out.simulation, SimulateIteration(out.programs, sim_costs));
  }
  out.data_parallel = options.data_parallel;
  out.all_reduce_seconds = out.simulation.all_reduce_seconds;
  return out;
}

}  // namespace

double SolverSteps(const std::string& solver, double stages, double units) {
  double steps = units * stages;                             // uniform, manual
  if (solver != "uniform") steps += stages * units * units;  // pipedream
  if (solver == "bipartition" || solver == "auto") steps += stages * units * units * units;
  return steps;
}

double TiedGradientBytes(const ModelProfile& profile) {
  return profile.units.empty() ? 0.0 : profile.units.back().weight_bytes;
}

absl::StatusOr<SolvedPlan> SolvePlan(const ModelProfile& profile, const ClusterSpec& cluster,
                                     const PlanOptions& options) {
  ASSIGN_OR_RETURN(BiPartitionProblem problem, MakeProblem(profile, cluster, options));
  if (options.solver != "auto") return SolveOne(options.solver, problem, profile, cluster, options);
  absl::StatusOr<SolvedPlan> best = absl::ResourceExhaustedError("no candidate plan");
  std::map<std::string, double> candidates;
  std::map<std::string, std::string> skipped;
  double total_solve = 0;
  // When none applies: Bi-Partition's code (the most general solver, tried
  // last: when it finds no plan, memory is what is short), and every
  // solver's reason, Bi-Partition's first ("even the least overloaded plan
  // needs ...").
  std::vector<std::string> reasons;
  for (const char* solver : {"uniform", "pipedream", "bipartition"}) {
    absl::StatusOr<SolvedPlan> plan = SolveOne(solver, problem, profile, cluster, options);
    if (!plan.ok()) {
      // A baseline may not apply (more workers than units) or not fit.
      if (plan.status().code() == absl::StatusCode::kInvalidArgument ||
          plan.status().code() == absl::StatusCode::kResourceExhausted) {
        skipped[solver] = plan.status().ToString();
        reasons.insert(reasons.begin(), absl::StrCat(solver, ": ", plan.status().message()));
        if (!best.ok()) {
          best = absl::Status(plan.status().code(), absl::StrCat("solver auto found no plan; ",
                                                                 absl::StrJoin(reasons, "; ")));
        }
        continue;
      }
      return plan.status();
    }
    total_solve += plan->solve_seconds;
    candidates[solver] = plan->simulation.iteration_seconds;
    if (!best.ok() || plan->simulation.iteration_seconds < best->simulation.iteration_seconds) {
      best = std::move(plan);
    }
  }
  if (best.ok()) {
    best->candidates = candidates;
    best->candidates_skipped = std::move(skipped);
    best->solve_seconds = total_solve;
  }
  return best;
}

ModelProfile AnalyticProfile(const GptConfig& config, int seq_len, int micro_batch_size,
                             double flops_per_second, AnalyticAttention attention) {
  const std::vector<UnitCost> flops = AnalyticUnitCosts(config, seq_len, micro_batch_size);
  const double bt = double(seq_len) * micro_batch_size;
  const double d = config.d_model, v = config.vocab_size;
  ModelProfile profile;
  profile.micro_batch_size = micro_batch_size;
  for (int i = 0; i < NumUnits(config); ++i) {
    UnitProfile u;
    u.name = flops[i].name;
    u.fwd_seconds = flops[i].forward / flops_per_second;
    u.bwd_seconds = flops[i].backward / flops_per_second;
    u.activation_bytes = 4 * bt * d;
    // In floats: stash mirrors each unit's saved tensors; transient what a
    // pass allocates beyond them at its peak (the output, or the head's
    // [B·T, vocab] logit gradient, plus the backward's input gradient and
    // temporaries), as the CPU backend's units allocate them.
    double weights = 0, stash = 0, transient = bt * d;
    switch (UnitKindAt(config, i)) {
      case UnitKind::kEmbed:
        weights = (v + config.max_seq_len) * d;
        break;
      case UnitKind::kAttention: {
        weights = 2 * d + (3 * d * d + 3 * d) + (d * d + d);
        // Per head and row: the softmax's probabilities, or a flash
        // kernel's one statistic (whose backward recomputes QK^T). The
        // CUDA kernel takes heads of at most 128 dims
        // (kernels/cuda/flash_attention.h kFlashAttentionMaxHeadDim); the
        // backend keeps the probabilities of wider ones.
        const bool flash =
            attention == AnalyticAttention::kCudaFlash && config.d_model / config.n_head <= 128;
        const double rows = double(micro_batch_size) * config.n_head * seq_len;
        stash = bt * (6 * d + 2) + (flash ? rows : rows * seq_len);
        if (flash) u.bwd_seconds += 2 * bt * seq_len * d / flops_per_second;
        // y; datt, dqkv, dln, dx; the backward's scratch: the CPU
        // backend's [T, T] scores, the CUDA backend's dS of every head
        // (cuda_backend.cc AttentionBackward), or a flash kernel's row dots.
        const double scratch = attention == AnalyticAttention::kCpu ? double(seq_len) * seq_len
                               : flash                              ? rows
                                                                    : rows * seq_len;
        transient = bt * 7 * d + scratch;
        break;
      }
      case UnitKind::kMlp:
        weights = 2 * d + (4 * d * d + 4 * d) + (4 * d * d + d);
        stash = bt * (10 * d + 2);
        transient = bt * 7 * d;  // y; dact (4d), dln, dx
        break;
      case UnitKind::kHead:
        weights = 2 * d + v * d;
        stash = bt * (2 * d + 2 + v);
        transient = bt * (v + 2 * d);  // the logit gradient and dln, then dx
        u.activation_bytes = 4;
        break;
    }
    u.weight_bytes = 4 * weights;
    u.stash_bytes = 4 * stash;
    u.transient_bytes = 4 * transient;
    profile.units.push_back(u);
  }
  return profile;
}

}  // namespace pipetrain
