#include "cli/plan_command.h"

#include <algorithm>
#include <cstdio>
#include <initializer_list>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/acctfm_profile.h"
#include "cli/flag_names.h"
#include "cli/output_paths.h"
#include "cli/tensor_layout_report.h"
#include "common/bounded_file.h"
#include "common/flag_set.h"
#include "common/status_macros.h"
#include "coordinator/planner/acctfm.h"
#include "coordinator/planner/data_parallel_layout.h"
#include "coordinator/planner/job_layout.h"
#include "coordinator/planner/planner.h"
#include "coordinator/planner/profile.h"
#include "coordinator/planner/solve_plan.h"
#include "coordinator/planner/timeline_render.h"
#include "nlohmann/json.hpp"
#include "spec/job_spec.h"

namespace pipetrain {
namespace {

using nlohmann::ordered_json;

struct PlanFlags {
  std::string profile, cluster, solver = "bipartition", objective = "paper", schedule = "1f1b";
  std::string write_profile;
  // Without --profile: an analytic GPT-2 profile (solve_plan.h AnalyticProfile).
  int layers = 0, d_model = 768, heads = 12, vocab = 50257, seq_len = 1024, micro_batch_size = 1;
  double gflops = 100;
  // The workers' attention (worker --attention): flash keeps no T x T
  // probabilities (AnalyticAttention::kCudaFlash).
  std::string attention = "auto";  // the workers' default: T x T kept, as reference
  std::string svg, trace;
  int workers = 0, micro_batches = 4;
  double bandwidth_gbps = 0, latency_us = 0, memory_gib = 0;
  bool json = false;
  // Data parallelism: 1 (none), a replica count D, or kAutoDataParallel.
  int data = 1;
  double distpar_beta = kCalibratedBeta;  // 1 where nothing calibrates it
  // Tensor parallelism: a group of this many devices (0: none). For now
  // only DistPar's layout report of one block (tensor_layout_report.h).
  int tensor = 0;
  // The job's layout search (job_layout.h) with stages of this many tensor
  // ranks, or kTensorParallelAuto: every T as well; 1: not used.
  int tensor_parallel = 1;
};

// A profile within its bounds (kMaxProfileUnits units) or a cluster within
// its own (kMaxStages workers) is far smaller; a larger file is not one, and
// reading /dev/zero must end.
constexpr int64_t kMaxPlanInputBytes = int64_t{16} << 20;

absl::StatusOr<std::string> ReadFile(const std::string& path, const std::string& what) {
  return ReadBoundedFile(path, kMaxPlanInputBytes, absl::StrCat(what, " file"));
}

absl::StatusOr<ClusterSpec> ClusterFrom(const PlanFlags& f) {
  if (!f.cluster.empty()) {
    ASSIGN_OR_RETURN(std::string text, ReadFile(f.cluster, "cluster"));
    absl::StatusOr<ClusterSpec> cluster = ParseClusterJson(text);
    if (!cluster.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(f.cluster, ": ", cluster.status().message()));
    }
    // The file's data-plane cost goes onto its links in the layout planner,
    // stretched where its workers share a host's cores, as jobs plan them.
    return cluster;
  }
  ClusterSpec cluster;
  for (int w = 0; w < f.workers; ++w) {
    cluster.workers.push_back({absl::StrCat("w", w), 1.0, f.memory_gib * (1ull << 30)});
  }
  cluster.bandwidth_bytes_per_second = f.bandwidth_gbps * 1e9 / 8;
  cluster.latency_seconds = f.latency_us * 1e-6;
  return cluster;
}

// [first, last] (inclusive, 0-based) or null for an empty range.
ordered_json RangeJson(const Range& r) {
  if (r.begin == r.end) return nullptr;
  return ordered_json::array({r.begin, r.end - 1});
}

std::string RangeText(const Range& r) {
  return r.begin == r.end ? "-" : absl::StrCat(r.begin, "..", r.end - 1);
}

// What the plan says about data parallelism; printed only when the command
// was asked for it (--data other than 1), so plans without it read as before.
struct DataParallelView {
  bool show = false;
  const DataParallelLayout* layout = nullptr;
  const ClusterSpec* cluster = nullptr;  // all N workers
  int micro_batches = 0;                 // per step, over all replicas
  double distpar_beta = 1;
};

ordered_json LayoutsJson(const DataParallelLayout& layout) {
  ordered_json rows = ordered_json::array();
  for (size_t i = 0; i < layout.candidates.size(); ++i) {
    const LayoutCandidate& c = layout.candidates[i];
    ordered_json row = {{"data", c.data_parallel}, {"stages", c.stages}};
    if (c.status.ok()) {
      row["distpar_computation"] = c.distpar.computation;
      row["distpar_communication"] = c.distpar.communication;
      row["distpar_cost"] = c.distpar.total;
      row["step_seconds"] = c.step_seconds;
      row["max_all_reduce_seconds"] = c.max_all_reduce_seconds;
      row["compute_stretch"] = c.compute_stretch;
    } else {
      row["error"] = c.status.ToString();
    }
    row["chosen"] = static_cast<int>(i) == layout.chosen;
    rows.push_back(std::move(row));
  }
  return rows;
}

// The candidate table of --data auto (and the one row of an explicit D).
void PrintLayouts(const DataParallelView& dp) {
  const DataParallelLayout& layout = *dp.layout;
  std::printf(
      "data-parallel layouts of %zu workers, %d micro-batches per step: D replicas x P stages; "
      "DistPar cost = computation + %g x communication (fp32 elements, distpar.txt 3.4); "
      "STEP_S = simulated step with the all-reduce; chosen (*): the lowest STEP_S, ties to the "
      "smaller D\n",
      dp.cluster->workers.size(), dp.micro_batches, dp.distpar_beta);
  std::printf("%4s %4s %14s %14s %14s %12s %14s %6s\n", "D", "P", "COMPUTATION", "COMMUNICATION",
              "DISTPAR_COST", "STEP_S", "ALL_REDUCE_S", "CHOSEN");
  for (size_t i = 0; i < layout.candidates.size(); ++i) {
    const LayoutCandidate& c = layout.candidates[i];
    if (!c.status.ok()) {
      std::printf("%4d %4d   no plan: %s\n", c.data_parallel, c.stages,
                  c.status.ToString().c_str());
      continue;
    }
    std::printf("%4d %4d %14.6g %14.6g %14.6g %12.6g %14.6g %6s\n", c.data_parallel, c.stages,
                c.distpar.computation, c.distpar.communication, c.distpar.total, c.step_seconds,
                c.max_all_reduce_seconds, static_cast<int>(i) == layout.chosen ? "*" : "");
  }
  // The cluster file's hosts (host, host_cores, compute_threads), as jobs
  // are planned: say where they changed a layout's compute.
  for (const LayoutCandidate& c : layout.candidates) {
    if (c.status.ok() && c.compute_stretch > 1) {
      std::printf("%d x %d: compute x%.2f, its replicas' threads sharing a host's cores\n",
                  c.data_parallel, c.stages, c.compute_stretch);
    }
  }
}

void PrintPlan(const SolvedPlan& plan, const ClusterSpec& cluster, const ModelProfile& profile,
               bool json, const DataParallelView& dp) {
  const int d = plan.data_parallel;
  const int per_replica = d > 0 ? dp.micro_batches / d : 0;
  if (json) {
    ordered_json out;
    if (dp.show) {
      out["data_parallel"] = d;
      out["stages_per_replica"] = plan.forward.size();
      out["micro_batches_per_step"] = dp.micro_batches;
      out["micro_batches_per_replica"] = per_replica;
      out["distpar_beta"] = dp.distpar_beta;
      out["layouts"] = LayoutsJson(*dp.layout);
    }
    out["solver"] = plan.solver;
    out["objective"] = plan.objective;
    out["bottleneck_seconds"] = plan.bottleneck_seconds;
    out["stages"] = ordered_json::array();
    for (size_t w = 0; w < plan.forward.size(); ++w) {
      ordered_json stage = {{"worker", cluster.workers[w].name},
                            {"fwd", RangeJson(plan.forward[w])},
                            {"bwd", RangeJson(plan.backward[w])},
                            {"memory_bytes", plan.memory_bytes[w]}};
      if (dp.show) {
        ordered_json replicas = ordered_json::array();
        for (int i : dp.layout->stage_workers[w]) replicas.push_back(dp.cluster->workers[i].name);
        stage["replica_workers"] = std::move(replicas);
        stage["all_reduce_seconds"] = plan.all_reduce_seconds[w];
      }
      out["stages"].push_back(std::move(stage));
    }
    out["predicted_iteration_seconds"] = plan.simulation.iteration_seconds;
    out["bubble_fraction"] = plan.simulation.bubble_fraction;
    out["solve_seconds"] = plan.solve_seconds;
    if (!plan.candidates.empty()) out["candidates"] = plan.candidates;
    if (!plan.candidates_skipped.empty()) out["candidates_skipped"] = plan.candidates_skipped;
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  if (dp.show) {
    PrintLayouts(dp);
    const size_t stages = plan.forward.size();
    std::string replicas;  // "[w0 w1] [w2 w3]": replica r is workers r*P .. r*P+P-1
    for (size_t w = 0; w < dp.cluster->workers.size(); ++w) {
      absl::StrAppend(&replicas, w % stages == 0 ? (w ? "] [" : "[") : " ",
                      dp.cluster->workers[w].name);
    }
    // A bandwidth of 0 is the cluster format's "unlimited" (docs/formats.md).
    const double rate = dp.cluster->bandwidth_bytes_per_second;
    const std::string link_rate =
        rate > 0 ? absl::StrFormat("%.6g B/s", rate) : std::string("unlimited bandwidth");
    if (d == 1) {  // auto chose no replicas: nothing to all-reduce
      std::printf(
          "data parallel: 1 replica of %zu stages on %zu workers (pipeline only: no gradient "
          "all-reduce); %d micro-batches per step\n",
          stages, dp.cluster->workers.size(), dp.micro_batches);
    } else {
      std::printf(
          "data parallel: %d replicas x %zu stages on %zu workers, replicas %s]; %d "
          "micro-batches per step, %d per replica; before each optimizer step every stage sums "
          "its gradients with the same stage of the %d other replica(s) by a ring all-reduce "
          "over the cluster's link (%s, %.6g s latency; acctfm.txt eq. 3)\n",
          d, stages, dp.cluster->workers.size(), replicas.c_str(), dp.micro_batches, per_replica,
          d - 1, link_rate.c_str(), dp.cluster->latency_seconds);
    }
  }
  std::printf(
      "solver %s (objective %s): bottleneck %.6g s, predicted iteration %.6g s, "
      "bubble %.1f %%, solved in %.3g s\n",
      plan.solver.c_str(), plan.objective.c_str(), plan.bottleneck_seconds,
      plan.simulation.iteration_seconds, 100 * plan.simulation.bubble_fraction, plan.solve_seconds);
  for (const auto& [solver, seconds] : plan.candidates) {
    std::printf("  candidate %-12s predicted %.6g s\n", solver.c_str(), seconds);
  }
  for (const auto& [solver, why] : plan.candidates_skipped) {
    std::printf("  candidate %-12s skipped: %s\n", solver.c_str(), why.c_str());
  }
  // With data parallelism a row is a stage: WORKER lists its replicas'
  // workers and ALL_REDUCE_S its simulated gradient all-reduce per step.
  // As wide as the longest name (a stage's replicas, "w0,w4,w8,w12").
  int name_width = 10;
  for (size_t w = 0; w < plan.forward.size(); ++w) {
    name_width = std::max(name_width, static_cast<int>(cluster.workers[w].name.size()));
  }
  std::printf("%-*s %-12s %-12s %14s %8s%s\n", name_width, "WORKER", "FORWARD", "BACKWARD",
              "MEMORY_BYTES", "BUSY_%", dp.show ? "  ALL_REDUCE_S" : "");
  for (size_t w = 0; w < plan.forward.size(); ++w) {
    const double iteration = plan.simulation.iteration_seconds;
    std::printf("%-*s %-12s %-12s %14.0f %8.1f", name_width, cluster.workers[w].name.c_str(),
                RangeText(plan.forward[w]).c_str(), RangeText(plan.backward[w]).c_str(),
                plan.memory_bytes[w],
                iteration > 0 ? 100 * plan.simulation.busy_seconds[w] / iteration : 0.0);
    if (dp.show) std::printf("  %12.6g", plan.all_reduce_seconds[w]);
    std::printf("\n");
  }
  std::printf("units: ");
  for (size_t u = 0; u < profile.units.size(); ++u) {
    std::printf("%s%zu=%s", u ? " " : "", u, profile.units[u].name.c_str());
  }
  std::printf("\n");
}

// The analytic profile's model (--layers, --d-model, ...), or
// INVALID_ARGUMENT naming what is wrong with it: a flag error (exit 2).
absl::StatusOr<GptConfig> AnalyticModel(const PlanFlags& f) {
  GptConfig config;
  config.n_layer = f.layers;
  config.d_model = f.d_model;
  config.n_head = f.heads;
  config.vocab_size = f.vocab;
  config.max_seq_len = f.seq_len;
  RETURN_IF_ERROR(ValidateGptConfig(config));
  if (f.seq_len < 1 || f.micro_batch_size < 1) {
    return absl::InvalidArgumentError("--seq-len and --micro-batch-size must be >= 1");
  }
  return config;
}

absl::StatusOr<ModelProfile> LoadProfile(const PlanFlags& f) {
  if (f.profile.empty()) {
    ASSIGN_OR_RETURN(const GptConfig config, AnalyticModel(f));
    return AnalyticProfile(
        config, f.seq_len, f.micro_batch_size, f.gflops * 1e9,
        f.attention == "flash" ? AnalyticAttention::kCudaFlash : AnalyticAttention::kCpu);
  }
  ASSIGN_OR_RETURN(std::string text, ReadFile(f.profile, "profile"));
  absl::StatusOr<ModelProfile> profile = ParseProfileJson(text);
  if (!profile.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(f.profile, ": ", profile.status().message()));
  }
  return profile;
}

int RunAccTfm(const PlanFlags& f) {
  auto text = ReadFile(f.profile, "profile");
  if (!text.ok())
    return std::fprintf(stderr, "pipetrain plan: %s\n", text.status().ToString().c_str()), 1;
  absl::StatusOr<AccTfmProblem> problem = ParseAccTfmProfileJson(*text);
  if (!problem.ok()) {
    return std::fprintf(stderr, "pipetrain plan: %s: %s\n", f.profile.c_str(),
                        std::string(problem.status().message()).c_str()),
           1;
  }
  absl::StatusOr<AccTfmSolution> solution = SolveAccTfm(*problem);
  if (!solution.ok()) {
    return std::fprintf(stderr, "pipetrain plan: %s\n", solution.status().ToString().c_str()), 1;
  }
  std::printf("%s\n", AccTfmSolutionJson(*solution, f.json ? 2 : -1).c_str());
  return 0;
}

// The job a `--data auto --tensor-parallel` search plans: the analytic
// model's shape, --micro-batches of --micro-batch-size sequences, the
// solver, objective and schedule, data 0 over the cluster's workers and
// tensor T (0: auto).
v1::JobSpec SearchSpec(const PlanFlags& f, int workers) {
  v1::JobSpec spec;
  spec.set_name("plan");
  v1::ModelSpec* m = spec.mutable_model();
  m->set_n_layer(f.layers);
  m->set_n_head(f.heads);
  m->set_d_model(f.d_model);
  m->set_vocab_size(f.vocab);
  m->set_max_seq_len(f.seq_len);
  v1::TrainingSpec* t = spec.mutable_training();
  t->set_seq_len(f.seq_len);
  t->set_batch_size(int64_t{f.micro_batch_size} * f.micro_batches);
  t->set_micro_batches(f.micro_batches);
  t->set_steps(1);
  v1::ParallelismSpec* p = spec.mutable_parallelism();
  p->set_data(kDataParallelAuto);
  p->set_workers(workers);
  p->set_tensor(f.tensor_parallel);
  p->set_solver(f.solver);
  p->set_objective(f.objective);
  p->set_schedule(f.schedule);
  return spec;
}

// The spec fields SearchSpec sets, by the flags that set them, for the
// spec checks' and the search's messages (NameFlags).
constexpr std::pair<absl::string_view, absl::string_view> kSearchFlagNames[] = {
    {"spec.model.n_layer", "--layers"},
    {"spec.model.n_head", "--heads"},
    {"spec.model.d_model", "--d-model"},
    {"spec.model.vocab_size", "--vocab"},
    {"spec.model.max_seq_len", "--seq-len"},
    {"spec.training.seq_len", "--seq-len"},
    {"spec.training.micro_batches", "--micro-batches"},
    {"spec.training.batch_size", "--micro-batch-size x --micro-batches"},
    {"spec.parallelism.workers", "--workers"},  // or --cluster's count
    {"spec.parallelism.tensor", "--tensor-parallel"},
    {"spec.parallelism.solver", "--solver"},
    {"spec.parallelism.objective", "--objective"},
    {"spec.parallelism.schedule", "--schedule"},
};

// --data auto --tensor-parallel T|auto: the layouts of the cluster's
// workers planned as the coordinator plans a job's (ChooseJobLayout), the
// chosen one and each one's simulated step. False (after saying why on
// stderr) when the spec or the search fails.
bool PrintJobLayoutSearch(const PlanFlags& f, const ModelProfile& profile,
                          const ClusterSpec& cluster, const std::vector<OutputFile>& files) {
  const int workers = static_cast<int>(cluster.workers.size());
  absl::StatusOr<ResolvedJobSpec> automatic = ResolveJobSpec(SearchSpec(f, workers));
  absl::StatusOr<ChosenJobLayout> choice =
      automatic.ok() ? ChooseJobLayout(*automatic, "plan", 1, profile, cluster, "analytic")
                     : absl::StatusOr<ChosenJobLayout>(automatic.status());
  if (!choice.ok()) {
    std::fprintf(stderr, "pipetrain plan: %s\n",
                 NameFlags(choice.status(), kSearchFlagNames).ToString().c_str());
    return false;
  }
  // The files once the search found a layout, before anything is printed:
  // a layout on stdout is then never followed by a failure.
  if (absl::Status written = WriteFilesOrNone(files); !written.ok()) {
    std::fprintf(stderr, "pipetrain plan: %s\n", written.ToString().c_str());
    return false;
  }
  const v1::Plan& plan = choice->compiled.plan;
  if (f.json) {
    ordered_json j;
    // The keys of --data's JSON where they mean the same (docs/formats.md).
    j["data_parallel"] = choice->resolved.data_parallel;
    j["stages_per_replica"] = choice->resolved.stages;
    j["tensor_parallel"] = choice->resolved.tensor_parallel;
    j["predicted_step_seconds"] = plan.predicted_iteration_seconds();
    j["layouts"] = ordered_json::array();
    for (const LayoutTrial& t : choice->trials) {
      ordered_json l;
      l["data"] = t.data_parallel;
      l["stages"] = t.stages;
      l["tensor"] = t.tensor_parallel;
      if (t.status.ok()) {
        l["step_seconds"] = t.predicted_step_seconds;
      } else {
        l["error"] = std::string(t.status.message());
      }
      l["chosen"] = t.data_parallel == choice->resolved.data_parallel &&
                    t.stages == choice->resolved.stages &&
                    t.tensor_parallel == choice->resolved.tensor_parallel;
      j["layouts"].push_back(l);
    }
    j["not_tried"] = choice->tensor_not_tried;
    std::printf("%s\n", j.dump(2).c_str());
    return true;
  }
  std::printf("%s\n", DescribeLayoutChoice(*choice).c_str());
  std::printf(
      "chosen: %d x %d x %d (replicas x stages x tensor ranks), solver %s, predicted "
      "%.4f s per step\n",
      choice->resolved.data_parallel, choice->resolved.stages, choice->resolved.tensor_parallel,
      plan.solver().c_str(), plan.predicted_iteration_seconds());
  return true;
}

FlagSet PlanFlagSet(PlanFlags& f) {
  FlagSet flags(
      "usage: pipetrain plan (--profile P.json | --layers N [--d-model ...]) (--cluster C.json | "
      "--workers N "
      "--bandwidth-gbps X [--latency-us Y] [--memory-gib Z]) [--solver S] [--objective O] "
      "[--micro-batches M] [--schedule 1f1b|gpipe] [--data D|auto [--distpar-beta B]] "
      "[--tensor T] [--tensor-parallel T|auto] [--json] "
      "[--svg FILE] [--trace FILE]");
  flags.String("profile", &f.profile, "model profile JSON (docs/formats.md)");
  flags.Int("layers", &f.layers, "without --profile: plan a GPT-2 of this many layers from FLOPs");
  flags.Int("d-model", &f.d_model, "analytic profile: embedding width");
  flags.Int("heads", &f.heads,
            "analytic profile: attention heads (with --tensor: the heads the attention core keeps "
            "whole)");
  flags.Int("vocab", &f.vocab, "analytic profile: vocabulary size");
  flags.Int("seq-len", &f.seq_len, "analytic profile: tokens per sequence");
  flags.Int("micro-batch-size", &f.micro_batch_size, "analytic profile: sequences per micro-batch");
  flags.Double("gflops", &f.gflops, "analytic profile: the workers' GEMM rate at speed 1");
  flags.String("attention", &f.attention,
               "analytic profile: the workers' --attention, auto | reference | gemm | flash (flash "
               "keeps no T x T probabilities and recomputes the scores in backward)");
  flags.String("write-profile", &f.write_profile, "also write the profile used as JSON");
  flags.String("cluster", &f.cluster, "cluster JSON (docs/formats.md); or --workers etc.");
  flags.Int("workers", &f.workers, "number of identical workers (without --cluster)");
  flags.Double("bandwidth-gbps", &f.bandwidth_gbps, "link bandwidth in Gbit/s; 0: unlimited");
  flags.Double("latency-us", &f.latency_us, "per-message latency in microseconds");
  flags.Double("memory-gib", &f.memory_gib, "memory per worker in GiB; 0: unlimited");
  flags.String("solver", &f.solver, "uniform | pipedream | bipartition | acctfm | auto");
  flags.String("objective", &f.objective, "paper | full (bipartition's objective)");
  flags.Int("micro-batches", &f.micro_batches,
            "micro-batches per iteration (step), over all data-parallel replicas");
  flags.String("schedule", &f.schedule, "1f1b | gpipe");
  flags.CountOrAuto(
      "data", &f.data,
      "data-parallel replicas D (the workers form D replicas of workers/D stages; D "
      "divides the workers and --micro-batches) or auto (every such layout, the fastest "
      "simulated step chosen)");
  flags.Double("distpar-beta", &f.distpar_beta,
               "weight of communication in DistPar's layout cost (distpar.txt 3.4), >= 0");
  flags.DefaultText("distpar-beta",
                    "with --tensor and --bandwidth-gbps, calibrated from --gflops and the "
                    "bandwidth (CalibratedBeta), else 1");
  flags.Int("tensor", &f.tensor,
            "tensor-parallel group T >= 2: print DistPar's layout per linear layer of one block "
            "(the analytic model's --d-model, --seq-len, --micro-batch-size; planner output only)");
  flags.CountOrAuto(
      "tensor-parallel", &f.tensor_parallel,
      "with --data auto and --layers: search the layouts of the workers as a job with "
      "spec.parallelism.tensor T does (each stage on T ranks), or auto as one with tensor 0 "
      "(every T that splits the model as well), and print each layout's simulated step");
  flags.Bool("json", &f.json, "print the plan as JSON");
  flags.String("svg", &f.svg, "write the simulated timeline as SVG to this file");
  flags.String("trace", &f.trace, "write the simulated timeline as Chrome trace JSON");
  return flags;
}

// Each count a plan is sized by, in the job spec's bounds (spec/job_spec.h,
// docs/operations.md "Bounds"): beyond them a plan's memory and time grow without
// end (micro-batches x workers instructions, a T x T attention per layer).
absl::Status CheckPlanBounds(const PlanFlags& f) {
  const struct {
    const char* flag;
    int64_t value, low, high;
  } bounds[] = {
      {"--layers", f.layers, 0, kMaxLayers},  // 0: not given (--profile)
      {"--d-model", f.d_model, 1, kMaxDModel},
      {"--heads", f.heads, 1, kMaxHeads},
      {"--vocab", f.vocab, 1, kMaxVocabSize},
      {"--seq-len", f.seq_len, 1, kMaxTrainingSeqLen},
      {"--micro-batch-size", f.micro_batch_size, 1, kMaxBatchSize},
      {"--micro-batches", f.micro_batches, 1, kMaxMicroBatches},
      {"--workers", f.workers, 0, kMaxStages},  // 0: not given (--cluster)
      // 0: auto (CountOrAuto); a job's spec.parallelism.tensor bound.
      {"--tensor-parallel", f.tensor_parallel, 0, kMaxTensorParallel},
  };
  for (const auto& b : bounds) {
    if (b.value < b.low || b.value > b.high) {
      return absl::InvalidArgumentError(
          absl::StrCat(b.flag, " ", b.value, " is outside [", b.low, ", ", b.high, "]"));
    }
  }
  if (f.tensor_parallel > 1 && f.workers > 0 && f.workers % f.tensor_parallel != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--tensor-parallel ", f.tensor_parallel,
                                                   " must divide --workers ", f.workers,
                                                   " (each stage on T ranks)"));
  }
  // The numbers a --cluster or --profile file may hold (docs/formats.md):
  // beyond them a plan's sums leave a double (1e308 made every cost
  // infinite, or zero), and the failure came from deep in the planner
  // without the flag's name. NaN fails every comparison here.
  const struct {
    const char* flag;
    double value, low, high;
    const char* unit;
  } reals[] = {
      {"--memory-gib", f.memory_gib, 0, 1e18 / (1ull << 30), "GiB (1e18 bytes)"},
      {"--latency-us", f.latency_us, 0, 1e18 * 1e6, "us (1e18 s)"},
      // 0 is unlimited; a link below 1 byte/s is refused as in a file.
      {"--bandwidth-gbps", f.bandwidth_gbps, 0, 1e18 * 8 / 1e9, "Gbit/s (1e18 bytes/s)"},
      // Analytic unit costs, FLOPs / rate, stay within a file's 1e18 s.
      {"--gflops", f.gflops, 1e-9, 1e9, "GFLOP/s"},
  };
  for (const auto& r : reals) {
    if (!(r.value >= r.low && r.value <= r.high)) {
      return absl::InvalidArgumentError(
          absl::StrCat(r.flag, " ", r.value, " is outside [", r.low, ", ", r.high, "] ", r.unit));
    }
  }
  if (f.bandwidth_gbps > 0 && f.bandwidth_gbps * 1e9 / 8 < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--bandwidth-gbps ", f.bandwidth_gbps, " is below 1 byte/s (8e-09); give 0 for unlimited"));
  }
  return absl::OkStatus();
}

// A mode that reads only some flags refuses the others, rather than
// accepting and ignoring them (no file a --svg asked for, a --solver
// never used).
absl::Status RejectIgnored(const FlagSet& flags, const char* mode,
                           std::initializer_list<const char*> ignored) {
  for (const char* name : ignored) {
    if (flags.IsSet(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " has no effect with ", mode, "; leave it out"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckModeFlags(const FlagSet& flags, const PlanFlags& f) {
  if (f.tensor != 0) {
    // --gflops and --bandwidth-gbps calibrate beta together; a beta given
    // leaves nothing to calibrate.
    if (flags.IsSet("distpar-beta") && (flags.IsSet("gflops") || flags.IsSet("bandwidth-gbps"))) {
      return absl::InvalidArgumentError(
          "--distpar-beta sets beta, which --gflops and --bandwidth-gbps would calibrate: give "
          "one or the other");
    }
    if (flags.IsSet("gflops") && !(f.bandwidth_gbps > 0)) {
      return absl::InvalidArgumentError(
          "--gflops has no effect with --tensor without --bandwidth-gbps (together they "
          "calibrate beta); give both, or leave it out");
    }
    return RejectIgnored(flags, "--tensor (one block's layout)",
                         {"profile", "layers", "vocab", "attention", "write-profile", "cluster",
                          "workers", "latency-us", "memory-gib", "solver", "objective",
                          "micro-batches", "schedule", "data", "svg", "trace"});
  }
  if (f.solver == "acctfm") {
    return RejectIgnored(
        flags, "--solver acctfm (its profile holds the problem)",
        {"layers",           "d-model",        "heads",        "vocab",         "seq-len",
         "micro-batch-size", "gflops",         "attention",    "write-profile", "cluster",
         "workers",          "bandwidth-gbps", "latency-us",   "memory-gib",    "objective",
         "micro-batches",    "schedule",       "distpar-beta", "svg",           "trace"});
  }
  if (f.tensor_parallel != 1) {
    // And --cluster's flags below: the search reads the links and memory
    // from the file as every other mode does.
    RETURN_IF_ERROR(RejectIgnored(flags, "--tensor-parallel (a table of layouts)",
                                  {"svg", "trace", "distpar-beta"}));
  }
  if (!f.profile.empty()) {
    // --attention has its own message (below); --layers is checked as the
    // alternative to --profile.
    RETURN_IF_ERROR(
        RejectIgnored(flags, "--profile (its file has the units' measured costs)",
                      {"d-model", "heads", "vocab", "seq-len", "micro-batch-size", "gflops"}));
  }
  if (!f.cluster.empty()) {
    RETURN_IF_ERROR(RejectIgnored(flags, "--cluster (its file has the links and memory)",
                                  {"bandwidth-gbps", "latency-us", "memory-gib"}));
  }
  if (f.data == 1) {  // one pipeline: no layouts to cost
    RETURN_IF_ERROR(RejectIgnored(flags, "--data 1 (the default: DistPar's cost ranks layouts)",
                                  {"distpar-beta"}));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<FlagSet::Info> PlanFlagInfo() {
  PlanFlags f;
  return PlanFlagSet(f).Describe();
}

int RunPlan(const std::vector<std::string>& args) {
  PlanFlags f;
  FlagSet flags = PlanFlagSet(f);
  absl::Status parsed = flags.Parse(args);
  if (flags.help_requested()) return std::printf("%s", flags.Usage().c_str()), 0;
  // Unset, the variable holds kCalibratedBeta: a value given must be a beta.
  if (parsed.ok() && flags.IsSet("distpar-beta") && !(f.distpar_beta >= 0)) {
    parsed = absl::InvalidArgumentError(
        absl::StrCat("--distpar-beta must be >= 0, got ", f.distpar_beta));
  }
  if (parsed.ok() && f.tensor != 0 && f.tensor_parallel != 1) {
    parsed = absl::InvalidArgumentError(
        "--tensor (DistPar's layout of one block) and --tensor-parallel (the layout search of "
        "a job's workers) answer different questions: give one");
  }
  if (parsed.ok() && f.tensor_parallel != 1 &&
      (f.data != kAutoDataParallel || f.layers <= 0 || !f.profile.empty())) {
    parsed = absl::InvalidArgumentError(
        "--tensor-parallel needs --data auto and --layers N (the model's heads, width and "
        "vocabulary decide which T split it; not --profile)");
  }
  if (parsed.ok()) parsed = CheckPlanBounds(f);
  // Names are flag values: a typo is a bad command line (exit 2), not a
  // planning failure.
  if (parsed.ok() && f.solver != "uniform" && f.solver != "pipedream" &&
      f.solver != "bipartition" && f.solver != "acctfm" && f.solver != "auto") {
    parsed = absl::InvalidArgumentError(absl::StrCat(
        "unknown solver '", f.solver, "'; use uniform, pipedream, bipartition, acctfm or auto"));
  }
  if (parsed.ok() && f.objective != "paper" && f.objective != "full") {
    parsed = absl::InvalidArgumentError(
        absl::StrCat("unknown objective '", f.objective, "'; use paper or full"));
  }
  if (parsed.ok()) parsed = CheckModeFlags(flags, f);
  // Output paths that cannot be written fail the command line before any
  // planning (which may take minutes).
  // Nor may an output be an input or another output: the all-or-none
  // write would replace one with the other.
  for (const auto& [flag, path] : {std::pair<const char*, const std::string&>{"--svg", f.svg},
                                   {"--trace", f.trace},
                                   {"--write-profile", f.write_profile}}) {
    if (parsed.ok()) parsed = CheckWritableParent(flag, path, "", OutputWrite::kThroughLinks);
    if (parsed.ok()) {
      parsed = CheckNotAnInput(flag, path, {{"--profile", f.profile}, {"--cluster", f.cluster}});
    }
  }
  if (parsed.ok()) {
    parsed = CheckDistinctOutputs(
        {{"--svg", f.svg}, {"--trace", f.trace}, {"--write-profile", f.write_profile}});
  }
  // What the flags alone show cannot be a layout is the command line's
  // mistake (exit 2); with --cluster the planner counts the file's workers.
  if (parsed.ok() && f.data > 1 && f.micro_batches % f.data != 0) {
    parsed = absl::InvalidArgumentError(
        absl::StrCat("--data ", f.data, " must divide --micro-batches ", f.micro_batches,
                     " (each replica takes an equal share)"));
  }
  if (parsed.ok() && f.data > 1 && f.workers > 0 && f.workers % f.data != 0) {
    parsed = absl::InvalidArgumentError(absl::StrCat("--data ", f.data, " must divide --workers ",
                                                     f.workers, " (replicas of equal stages)"));
  }
  if (parsed.ok() && f.tensor > kMaxTensorParallel) {
    parsed = absl::InvalidArgumentError(
        absl::StrCat("--tensor ", f.tensor, " is over ", kMaxTensorParallel,
                     " devices, the most a job's spec.parallelism.tensor may name"));
  }
  if (parsed.ok() && f.tensor != 0) {  // needs only the block's dimensions
    absl::StatusOr<std::string> report =
        TensorLayoutReport({f.tensor, f.distpar_beta, int64_t{f.micro_batch_size} * f.seq_len,
                            f.d_model, f.gflops, f.bandwidth_gbps, f.micro_batch_size, f.heads},
                           f.json);
    if (!report.ok()) {
      std::fprintf(stderr, "pipetrain plan: %s\n", std::string(report.status().message()).c_str());
      return 2;
    }
    std::printf("%s", report->c_str());
    return 0;
  }
  if (parsed.ok() && f.profile.empty() == (f.layers <= 0)) {
    parsed =
        absl::InvalidArgumentError("give --profile FILE or --layers N (an analytic GPT-2 profile)");
  }
  if (parsed.ok() && f.profile.empty() && f.solver == "acctfm") {
    parsed = absl::InvalidArgumentError("--solver acctfm needs --profile (its own format)");
  }
  if (parsed.ok() && f.layers > 0 && f.gflops <= 0) {
    parsed = absl::InvalidArgumentError("--gflops must be > 0");
  }
  if (parsed.ok() && f.layers > 0) parsed = AnalyticModel(f).status();
  if (parsed.ok() && f.attention != "auto" && f.attention != "reference" && f.attention != "gemm" &&
      f.attention != "flash") {
    parsed = absl::InvalidArgumentError(
        absl::StrCat("--attention \"", f.attention, "\": want auto, reference, gemm or flash"));
  }
  if (parsed.ok() && !f.profile.empty() && f.attention != "auto") {
    parsed = absl::InvalidArgumentError(
        "--attention shapes the analytic profile (--layers); a --profile was measured with its "
        "workers' own");
  }
  if (parsed.ok() && f.solver != "acctfm" && f.cluster.empty() == (f.workers <= 0)) {
    parsed = absl::InvalidArgumentError("give either --cluster or --workers N (N >= 1)");
  }
  absl::StatusOr<Schedule> schedule = ParseSchedule(f.schedule);
  if (parsed.ok() && !schedule.ok()) parsed = schedule.status();
  static_assert(kAutoDataParallel == 0, "--data auto parses as 0 (FlagSet::CountOrAuto)");
  if (parsed.ok() && f.solver == "acctfm" && f.data != 1) {
    parsed = absl::InvalidArgumentError("--data applies to pipeline plans, not --solver acctfm");
  }
  if (!parsed.ok()) {
    // The one line, as the other subcommands print it: the whole help after
    // it scrolled the error out of sight.
    std::fprintf(stderr, "pipetrain plan: %s%s\n", std::string(parsed.message()).c_str(),
                 absl::StrContains(parsed.message(), "--help") ? "" : " (see --help)");
    return 2;
  }
  if (f.solver == "acctfm") return RunAccTfm(f);
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "pipetrain plan: %s\n", s.ToString().c_str());
    // The planner names job-spec fields; say which flags they are here.
    if (absl::StrContains(s.message(), "parallelism.data") ||
        absl::StrContains(s.message(), "training.micro_batches")) {
      std::fprintf(stderr,
                   "  (here parallelism.data is --data and training.micro_batches is "
                   "--micro-batches; the workers are --workers or the --cluster file's entries)\n");
    }
    return 1;
  };
  absl::StatusOr<ModelProfile> profile = LoadProfile(f);
  if (!profile.ok()) return fail(profile.status());
  // Every file is written only once the plan stands, all or none: a failed
  // plan leaves none behind.
  std::vector<OutputFile> files;
  if (!f.write_profile.empty()) files.push_back({f.write_profile, ProfileToJson(*profile)});
  absl::StatusOr<ClusterSpec> cluster = ClusterFrom(f);
  if (!cluster.ok()) return fail(cluster.status());
  if (f.tensor_parallel != 1) return PrintJobLayoutSearch(f, *profile, *cluster, files) ? 0 : 1;
  // Every plan goes through the layout planner: with D = 1 it is SolvePlan
  // on the cluster as given (data_parallel_layout.h).
  LayoutOptions options;
  options.data_parallel = f.data;
  options.micro_batches = f.micro_batches;
  // The data-parallel layout's beta is not calibrated: 1 unless given.
  if (f.distpar_beta == kCalibratedBeta) f.distpar_beta = 1;
  options.distpar_beta = f.distpar_beta;
  options.plan.solver = f.solver;
  options.plan.objective = f.objective;
  options.plan.schedule = *schedule;
  // A plan past the coordinator's budget is the user's to wait for here
  // (Bi-Partition at 1024 workers and 514 units runs for many minutes),
  // but not silently; and a job of that size would be refused. --data
  // auto plans every layout, of which D = 1 costs the most.
  const int workers = static_cast<int>(cluster->workers.size());
  const int stages = f.data > 1 && workers % f.data == 0 ? workers / f.data : workers;
  const double steps = SolverSteps(f.solver, stages, static_cast<double>(profile->units.size()));
  if (steps > kMaxSolverSteps) {
    std::fprintf(stderr,
                 "pipetrain plan: solver %s for %d stages of %zu units is about %.2g solver "
                 "steps, above the %.2g a coordinator plans for a job (it refuses such jobs); "
                 "this may take minutes to hours (Ctrl-C stops it; solver pipedream or uniform "
                 "is fast)\n",
                 f.solver.c_str(), stages, profile->units.size(), steps, kMaxSolverSteps);
  }
  // The other half of the coordinator's budget (CheckPlanningBudget): the
  // programs, the simulation and the drawings grow with stages x
  // micro-batches (514 stages x 4096 took 100 s and 4 GB here).
  const int64_t stage_micro_batches = int64_t{stages} * f.micro_batches;
  if (stage_micro_batches > kMaxStageMicroBatches) {
    std::fprintf(stderr,
                 "pipetrain plan: %d stages x %d micro-batches = %lld, above the %lld a "
                 "coordinator plans for a job (it refuses such jobs); the simulation's time "
                 "and memory grow with it, so this may take minutes and gigabytes (Ctrl-C "
                 "stops it; fewer, larger micro-batches plan faster)\n",
                 stages, f.micro_batches, static_cast<long long>(stage_micro_batches),
                 static_cast<long long>(kMaxStageMicroBatches));
  }
  absl::StatusOr<DataParallelLayout> layout = PlanDataParallel(*profile, *cluster, options);
  if (!layout.ok()) return fail(layout.status());
  const SolvedPlan* plan = &layout->plan;
  const DataParallelView dp{f.data != 1, &*layout, &*cluster, f.micro_batches, f.distpar_beta};
  // The files first: a plan on stdout is then never followed by a failure.
  std::vector<std::string> names;  // one lane per stage (its replicas' workers)
  for (const WorkerSpec& w : layout->stage_cluster.workers) names.push_back(w.name);
  if (!f.svg.empty()) {
    TimelineSvgOptions svg;
    svg.title = absl::StrCat(plan->solver, " plan, ", names.size(), " workers, ", f.micro_batches,
                             " micro-batches, ", f.schedule);
    if (plan->data_parallel > 1) {
      svg.title = absl::StrCat(plan->solver, " plan, ", plan->data_parallel, " replicas x ",
                               names.size(), " stages, ", f.micro_batches / plan->data_parallel,
                               " of ", f.micro_batches, " micro-batches per replica, ", f.schedule);
    }
    files.push_back({f.svg, TimelineSvg(plan->simulation, names, svg)});
  }
  if (!f.trace.empty()) files.push_back({f.trace, ChromeTraceJson(plan->simulation, names)});
  if (auto s = WriteFilesOrNone(files); !s.ok()) return fail(s);
  PrintPlan(*plan, layout->stage_cluster, *profile, f.json, dp);
  return 0;
}

}  // namespace pipetrain
