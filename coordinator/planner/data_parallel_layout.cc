#include "coordinator/planner/data_parallel_layout.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "coordinator/planner/data_plane_cost.h"
#include "coordinator/planner/fused_embedding_sync.h"
#include "coordinator/planner/host_sharing.h"
#include "coordinator/planner/simulator.h"
#include "spec/job_spec.h"

namespace pipetrain {
namespace {

// Every tensor is fp32 (DESIGN.md §3): DistPar counts elements, profiles bytes.
constexpr double kBytesPerElement = 4;

std::string Divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return absl::StrJoin(out, ", ");
}

absl::Status ValidateOptions(const ClusterSpec& cluster, const LayoutOptions& options) {
  const int n = static_cast<int>(cluster.workers.size());
  if (n < 1) return absl::InvalidArgumentError("no workers to lay out");
  if (options.micro_batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.micro_batches must be >= 1, got ", options.micro_batches));
  }
  if (!std::isfinite(options.distpar_beta) || options.distpar_beta < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DistPar's beta must be finite and >= 0, got ", options.distpar_beta));
  }
  const int d = options.data_parallel;
  if (d == kAutoDataParallel) return absl::OkStatus();
  if (d < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallelism.data must be >= 1 replicas (or auto), got ", d));
  }
  if (n % d != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallelism.data = ", d, " does not divide the ", n,
                     " workers: data x stages must equal the worker count; use one of ",
                     Divisors(n), " or auto"));
  }
  if (options.micro_batches % d != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.micro_batches = ", options.micro_batches,
                     " is not divisible by parallelism.data = ", d,
                     ": each replica runs micro_batches / data of a step's micro-batches"));
  }
  return absl::OkStatus();
}

// The layouts "auto" tries, ascending D: D | N, D | m, P <= units (a stage
// per unit at most, the tighter of the solvers' limits), and for "manual"
// exactly as many stages as the caller gave ranges.
std::vector<int> AutoReplicaCounts(int workers, int units, const LayoutOptions& options) {
  std::vector<int> out;
  for (int d : DataParallelDegrees(workers, options.micro_batches, units)) {
    if (options.plan.solver == "manual" &&
        workers / d != static_cast<int>(options.plan.manual_forward.size())) {
      continue;
    }
    out.push_back(d);
  }
  return out;
}

// One layout's plan, candidate row and stage workers.
struct Solved {
  LayoutCandidate candidate;
  SolvedPlan plan;
  ClusterSpec stage_cluster;
};

Solved SolveLayout(const ModelProfile& measured, const ClusterSpec& given, int d,
                   const LayoutOptions& options) {
  Solved out;
  const int n = static_cast<int>(given.workers.size());
  const int p = n / d;
  out.candidate.data_parallel = d;
  out.candidate.stages = p;
  out.candidate.status = CheckReplicaDevices(given, d, p, 1);
  if (!out.candidate.status.ok()) return out;
  // As a job is planned (planner.cc): a stage position's replicas compute
  // in lockstep, stretched where their threads outnumber a host's cores,
  // and so is the data plane's work on the links (host_sharing.h,
  // data_plane_cost.h); nothing changes for workers without a host.
  const ComputeStretch stretch = LockstepComputeStretch(given, d, p, 1);
  ClusterSpec cluster = given;
  AddDataPlaneCost(stretch.factor, &cluster);
  const ModelProfile profile = StretchCompute(measured, stretch.factor);
  out.stage_cluster = ReplicaStageCluster(cluster, d);
  PlanOptions plan_options = options.plan;
  plan_options.micro_batches = options.micro_batches / d;
  plan_options.data_parallel = d;
  // Stage positions on one host also take cores from each other where
  // their compute overlaps: the prediction comes from that simulation, and
  // so does auto's choice among the solvers.
  SimulationCosts costs =
      SimulationCostsFromProfile(profile, out.stage_cluster, TiedGradientBytes(profile));
  costs.data_parallel = d;
  const auto simulate =
      [&](const std::vector<v1::Program>& programs) -> absl::StatusOr<SimulationResult> {
    std::vector<v1::Program> run = programs;
    if (d > 1 && options.fused_embedding_sync) {
      RETURN_IF_ERROR(FuseEmbeddingSyncOfPrograms(&run).status());
    }
    return SimulateWithSharedCores(run, costs, cluster, d, p, 1, stretch.factor, 1, nullptr);
  };
  plan_options.simulate = simulate;  // out.plan.simulation is this one
  absl::StatusOr<SolvedPlan> plan = SolvePlan(profile, out.stage_cluster, plan_options);
  if (!plan.ok()) {
    out.candidate.status = plan.status();
    return out;
  }
  out.plan = *std::move(plan);
  out.candidate.compute_stretch = stretch.factor;
  out.candidate.distpar = DistParLayoutCost(out.plan, profile, options.distpar_beta);
  out.candidate.step_seconds = out.plan.simulation.iteration_seconds;
  for (double s : out.plan.all_reduce_seconds) {
    out.candidate.max_all_reduce_seconds = std::max(out.candidate.max_all_reduce_seconds, s);
  }
  return out;
}

DataParallelLayout Finish(std::vector<LayoutCandidate> candidates, int chosen, Solved best) {
  DataParallelLayout layout;
  layout.candidates = std::move(candidates);
  layout.chosen = chosen;
  const int d = best.candidate.data_parallel, p = best.candidate.stages;
  for (int s = 0; s < p; ++s) {
    std::vector<int> column;
    for (int r = 0; r < d; ++r) column.push_back(r * p + s);
    layout.stage_workers.push_back(std::move(column));
  }
  layout.stage_cluster = std::move(best.stage_cluster);
  layout.plan = std::move(best.plan);
  return layout;
}

// The error when no layout of "auto" has a plan: the first failure's code,
// every layout's reason.
absl::Status NoLayoutError(const std::vector<LayoutCandidate>& candidates, int workers) {
  std::vector<std::string> reasons;
  for (const LayoutCandidate& c : candidates) {
    reasons.push_back(absl::StrCat(c.data_parallel, " x ", c.stages, ": ", c.status.message()));
  }
  return absl::Status(
      candidates.front().status.code(),
      absl::StrCat("no data-parallel layout of the ", workers,
                   " workers (replicas x stages) has a plan: ", absl::StrJoin(reasons, "; ")));
}

}  // namespace

namespace {

// Folds worker `w` into `into`, which stands for both: the names joined
// by `separator`, the lower speed, the smaller memory (0 = unlimited: any
// limit is smaller).
void MergeIntoSlowest(const WorkerSpec& w, const char* separator, WorkerSpec* into) {
  absl::StrAppend(&into->name, separator, w.name);
  into->speed = std::min(into->speed, w.speed);
  if (w.memory_bytes > 0 && (into->memory_bytes == 0 || w.memory_bytes < into->memory_bytes)) {
    into->memory_bytes = w.memory_bytes;
  }
  // Replicas never mix GPUs and CPUs (CheckReplicaDevices): a merged
  // position is a GPU one when any of its workers is (the cluster files
  // of `pipetrain plan` are checked alike).
  into->gpu = into->gpu || w.gpu;
}

// Two GPU ranks of one tensor group (replica r's stage s): FAILED_PRECONDITION
// when they round differently (WorkerSpec::gpu_arithmetic; empty: not
// known, not compared). CPU ranks never differ: the CPU kernels round alike
// on every CPU (target clones, -ffp-contract=off).
absl::Status CheckRankArithmetic(const WorkerSpec& first, const WorkerSpec& w, int r, int s,
                                 int replicas) {
  if (!first.gpu || first.gpu_arithmetic.empty() || w.gpu_arithmetic.empty() ||
      w.gpu_arithmetic == first.gpu_arithmetic) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the tensor-parallel ranks of stage ", s, replicas > 1 ? absl::StrCat(" replica ", r) : "",
      " would run on GPU worker ", first.name, " (", first.gpu_arithmetic, ") and GPU worker ",
      w.name, " (", w.gpu_arithmetic,
      "): the ranks compute their replicated LayerNorm and bias weights and device codecs each, "
      "which must stay bitwise the same, and another GPU model or --gemm mode rounds them "
      "apart; give each stage's ranks GPUs of one model, all started with the same --gemm"));
}

}  // namespace

std::string GpuArithmetic(absl::string_view gpu_model, absl::string_view backend) {
  if (gpu_model.empty()) return "";
  const size_t open = backend.find("), ");
  if (open == absl::string_view::npos) return std::string(gpu_model);
  absl::string_view clause = backend.substr(open + 3);
  clause = clause.substr(0, clause.find(", "));
  return clause.empty() ? std::string(gpu_model) : absl::StrCat(gpu_model, ", ", clause);
}

absl::Status CheckReplicaDevices(const ClusterSpec& cluster, int replicas, int stages, int tensor) {
  PT_CHECK(int64_t{replicas} * stages * tensor == static_cast<int64_t>(cluster.workers.size()))
      << replicas << " x " << stages << " x " << tensor << " for " << cluster.workers.size();
  for (int s = 0; s < stages; ++s) {
    for (int t = 0; t < tensor; ++t) {
      const WorkerSpec& first = cluster.workers[static_cast<size_t>(s) * tensor + t];
      for (int r = 1; r < replicas; ++r) {
        const WorkerSpec& w = cluster.workers[(static_cast<size_t>(r) * stages + s) * tensor + t];
        if (w.gpu == first.gpu) continue;
        const WorkerSpec& gpu = first.gpu ? first : w;
        const WorkerSpec& cpu = first.gpu ? w : first;
        return absl::FailedPreconditionError(absl::StrCat(
            "the data-parallel replicas of stage ", s, tensor > 1 ? absl::StrCat(" rank ", t) : "",
            " would run on GPU worker ", gpu.name, " and CPU worker ", cpu.name,
            ": replicas must hold bitwise the same weights after every step, and a GPU rounds "
            "its optimizer step differently from a CPU; give a data-parallel job workers of one "
            "kind, or its replicas' workers the same kind at each stage"));
      }
    }
  }
  // A stage's tensor ranks share its replicated parameters (LayerNorm, the
  // row-parallel biases, wpe; worker/model/tensor_parallel.h), which each
  // rank computes and steps itself: a GPU rank and a CPU rank would round
  // them apart, and their activations with them.
  for (int r = 0; r < replicas; ++r) {
    for (int s = 0; s < stages; ++s) {
      const size_t group = (static_cast<size_t>(r) * stages + s) * tensor;
      const WorkerSpec& first = cluster.workers[group];
      for (int t = 1; t < tensor; ++t) {
        const WorkerSpec& w = cluster.workers[group + t];
        if (w.gpu == first.gpu) {
          RETURN_IF_ERROR(CheckRankArithmetic(first, w, r, s, replicas));
          continue;
        }
        const WorkerSpec& gpu = first.gpu ? first : w;
        const WorkerSpec& cpu = first.gpu ? w : first;
        return absl::FailedPreconditionError(absl::StrCat(
            "the tensor-parallel ranks of stage ", s,
            replicas > 1 ? absl::StrCat(" replica ", r) : "", " would run on GPU worker ", gpu.name,
            " and CPU worker ", cpu.name,
            ": the ranks step their replicated LayerNorm and bias weights each, which must stay "
            "bitwise the same, and a GPU rounds them differently from a CPU; give a "
            "tensor-parallel job workers of one kind, or each stage's ranks the same kind"));
      }
    }
  }
  return absl::OkStatus();
}

std::optional<std::vector<size_t>> ArrangeByDeviceKind(const std::vector<bool>& gpu, int replicas,
                                                       int stages, int tensor) {
  PT_CHECK(replicas >= 1 && stages >= 1 && tensor >= 1)
      << replicas << " x " << stages << " x " << tensor;
  const size_t need = static_cast<size_t>(replicas) * stages * tensor;
  const int64_t per_stage = int64_t{replicas} * tensor;
  if (gpu.size() < need) return std::nullopt;
  const int64_t gpus = std::count(gpu.begin(), gpu.end(), true);
  const int64_t cpus = static_cast<int64_t>(gpu.size()) - gpus;
  // GPU stages k with k stages' workers among the GPUs, the rest among the
  // CPUs.
  const int64_t fewest = std::max<int64_t>(0, stages - cpus / per_stage);
  const int64_t most = std::min<int64_t>(stages, gpus / per_stage);
  if (fewest > most) return std::nullopt;
  const auto stage_of = [&](size_t position) {
    return static_cast<int>((position / static_cast<size_t>(tensor)) % stages);
  };
  // The first `need` candidates' GPUs, in all and by the stage each would
  // take.
  std::vector<int64_t> stage_gpus(stages, 0);
  for (size_t p = 0; p < need; ++p) stage_gpus[stage_of(p)] += gpu[p] ? 1 : 0;
  const int64_t first_gpus = std::accumulate(stage_gpus.begin(), stage_gpus.end(), int64_t{0});
  const int64_t gpu_stages =
      std::clamp<int64_t>((first_gpus + per_stage / 2) / per_stage, fewest, most);
  std::vector<int> by_gpus(stages);
  std::iota(by_gpus.begin(), by_gpus.end(), 0);
  std::stable_sort(by_gpus.begin(), by_gpus.end(),
                   [&](int a, int b) { return stage_gpus[a] > stage_gpus[b]; });
  std::vector<bool> gpu_stage(stages, false);
  for (int64_t i = 0; i < gpu_stages; ++i) gpu_stage[by_gpus[i]] = true;
  // Each kind's candidates, in order of preference, to its positions in
  // order.
  size_t next_gpu = 0, next_cpu = 0;
  const auto next_of = [&](bool want_gpu) {
    size_t& next = want_gpu ? next_gpu : next_cpu;
    while (gpu[next] != want_gpu) ++next;  // the counts above ensure one
    return next++;
  };
  std::vector<size_t> picked;
  picked.reserve(need);
  for (size_t p = 0; p < need; ++p) picked.push_back(next_of(gpu_stage[stage_of(p)]));
  return picked;
}

ClusterSpec ReplicaStageCluster(const ClusterSpec& cluster, int data_parallel) {
  if (data_parallel <= 1) return cluster;
  const int p = static_cast<int>(cluster.workers.size()) / data_parallel;
  ClusterSpec out;
  out.bandwidth_bytes_per_second = cluster.bandwidth_bytes_per_second;
  out.latency_seconds = cluster.latency_seconds;
  for (int s = 0; s < p; ++s) {
    WorkerSpec stage = cluster.workers[s];
    for (int r = 1; r < data_parallel; ++r) {
      MergeIntoSlowest(cluster.workers[r * p + s], ",", &stage);
    }
    out.workers.push_back(std::move(stage));
  }
  return out;
}

ClusterSpec TensorGroupCluster(const ClusterSpec& cluster, int tensor_parallel) {
  if (tensor_parallel <= 1) return cluster;
  ClusterSpec out;
  out.bandwidth_bytes_per_second = cluster.bandwidth_bytes_per_second;
  out.latency_seconds = cluster.latency_seconds;
  for (size_t g = 0; g + tensor_parallel <= cluster.workers.size(); g += tensor_parallel) {
    WorkerSpec group = cluster.workers[g];
    for (int t = 1; t < tensor_parallel; ++t) {
      MergeIntoSlowest(cluster.workers[g + t], "+", &group);
    }
    out.workers.push_back(std::move(group));
  }
  return out;
}

DistParCost DistParLayoutCost(const SolvedPlan& plan, const ModelProfile& profile, double beta) {
  const SimulationCosts costs =
      SimulationCostsFromProfile(profile, ClusterSpec{}, TiedGradientBytes(profile));
  // Input plus output elements of unit u (see the header).
  auto operator_elements = [&costs](int u) {
    const double in = u > 0 ? costs.units[u - 1].activation_bytes : 0;
    return (in + costs.units[u].activation_bytes) / kBytesPerElement;
  };
  auto range_elements = [&](const v1::UnitRange& r) {
    double sum = 0;
    for (int u = r.begin(); u < r.end(); ++u) sum += operator_elements(u);
    return sum;
  };
  const double d = plan.data_parallel;
  DistParCost cost;
  double sent = 0, all_reduced = 0;  // bytes: one replica's sends; sum of stage gradients
  for (const v1::Program& program : plan.programs) {
    double device = 0;
    for (const v1::Instruction& in : program.instructions()) {
      switch (in.op_case()) {
        case v1::Instruction::kForward:
          device += range_elements(in.forward().units());
          break;
        case v1::Instruction::kRecompute:
          device += range_elements(in.recompute().units());
          break;
        case v1::Instruction::kBackward:
          device += range_elements(in.backward().units());
          break;
        case v1::Instruction::kSend:
          sent += TransferBytes(in.send().tensor(), costs);
          break;
        case v1::Instruction::kOptimizerStep: {
          const v1::UnitRange& r = in.optimizer_step().units();
          if (r.begin() < r.end()) all_reduced += AllReduceBytes(Range{r.begin(), r.end()}, costs);
          break;
        }
        default:
          break;
      }
    }
    cost.computation = std::max(cost.computation, device);
  }
  // Every replica sends what one does; a ring all-reduce over D copies moves
  // (D-1)|T| in its reduce-scatter and (D-1)|T| in its all-gather.
  cost.communication = (d * sent + 2 * (d - 1) * all_reduced) / kBytesPerElement;
  cost.total = cost.computation + beta * cost.communication;
  return cost;
}

absl::StatusOr<DataParallelLayout> PlanDataParallel(const ModelProfile& profile,
                                                    const ClusterSpec& cluster,
                                                    const LayoutOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(cluster, options));
  const int n = static_cast<int>(cluster.workers.size());
  if (options.data_parallel != kAutoDataParallel) {
    Solved one = SolveLayout(profile, cluster, options.data_parallel, options);
    RETURN_IF_ERROR(one.candidate.status);
    std::vector<LayoutCandidate> candidates = {one.candidate};
    return Finish(std::move(candidates), 0, std::move(one));
  }
  const int units = static_cast<int>(profile.units.size());
  const std::vector<int> counts = AutoReplicaCounts(n, units, options);
  if (counts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no data-parallel layout of the ", n, " workers: parallelism.data must divide both the ", n,
        " workers and training.micro_batches = ", options.micro_batches,
        ", with at most one stage per unit (", units, " units)",
        options.plan.solver == "manual" ? " and as many stages as manual ranges" : ""));
  }
  std::vector<LayoutCandidate> candidates;
  int chosen = -1;
  Solved best;
  for (int d : counts) {
    Solved s = SolveLayout(profile, cluster, d, options);
    const absl::StatusCode code = s.candidate.status.code();
    if (code != absl::StatusCode::kOk && code != absl::StatusCode::kResourceExhausted &&
        code != absl::StatusCode::kInvalidArgument &&
        code != absl::StatusCode::kFailedPrecondition) {  // replicas mixing GPUs and CPUs
      return s.candidate.status;  // not a property of the layout
    }
    candidates.push_back(s.candidate);
    if (code != absl::StatusCode::kOk) continue;
    // Strictly lower: ties keep the earlier, smaller D.
    if (chosen < 0 || s.candidate.step_seconds < best.candidate.step_seconds) {
      chosen = static_cast<int>(candidates.size()) - 1;
      best = std::move(s);
    }
  }
  if (chosen < 0) return NoLayoutError(candidates, n);
  return Finish(std::move(candidates), chosen, std::move(best));
}

}  // namespace pipetrain
