#include "cli/plan_command.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cli/acctfm_profile.h"
#include "common/flag_set.h"
#include "common/status_macros.h"
#include "coordinator/planner/acctfm.h"
#include "coordinator/planner/profile.h"
#include "coordinator/planner/solve_plan.h"
#include "coordinator/planner/timeline_render.h"
#include "nlohmann/json.hpp"

namespace pipetrain {
namespace {

using nlohmann::ordered_json;

struct PlanFlags {
  std::string profile, cluster, solver = "bipartition", objective = "paper", schedule = "1f1b";
  std::string write_profile;
  // Without --profile: an analytic GPT-2 profile (solve_plan.h AnalyticProfile).
  int layers = 0, d_model = 768, heads = 12, vocab = 50257, seq_len = 1024, micro_batch_size = 1;
  double gflops = 100;
  std::string svg, trace;
  int workers = 0, micro_batches = 4;
  double bandwidth_gbps = 0, latency_us = 0, memory_gib = 0;
  bool json = false;
};

absl::StatusOr<std::string> ReadFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", what, " file ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<ClusterSpec> ClusterFrom(const PlanFlags& f) {
  if (!f.cluster.empty()) {
    ASSIGN_OR_RETURN(std::string text, ReadFile(f.cluster, "cluster"));
    absl::StatusOr<ClusterSpec> cluster = ParseClusterJson(text);
    if (!cluster.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(f.cluster, ": ", cluster.status().message()));
    }
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

void PrintPlan(const SolvedPlan& plan, const ClusterSpec& cluster, const ModelProfile& profile,
               bool json) {
  if (json) {
    ordered_json out;
    out["solver"] = plan.solver;
    out["objective"] = plan.objective;
    out["bottleneck_seconds"] = plan.bottleneck_seconds;
    out["stages"] = ordered_json::array();
    for (size_t w = 0; w < plan.forward.size(); ++w) {
      out["stages"].push_back({{"worker", cluster.workers[w].name},
                               {"fwd", RangeJson(plan.forward[w])},
                               {"bwd", RangeJson(plan.backward[w])},
                               {"memory_bytes", plan.memory_bytes[w]}});
    }
    out["predicted_iteration_seconds"] = plan.simulation.iteration_seconds;
    out["bubble_fraction"] = plan.simulation.bubble_fraction;
    out["solve_seconds"] = plan.solve_seconds;
    if (!plan.candidates.empty()) out["candidates"] = plan.candidates;
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  std::printf("solver %s (objective %s): bottleneck %.6g s, predicted iteration %.6g s, "
              "bubble %.1f %%, solved in %.3g s\n",
              plan.solver.c_str(), plan.objective.c_str(), plan.bottleneck_seconds,
              plan.simulation.iteration_seconds, 100 * plan.simulation.bubble_fraction,
              plan.solve_seconds);
  for (const auto& [solver, seconds] : plan.candidates) {
    std::printf("  candidate %-12s predicted %.6g s\n", solver.c_str(), seconds);
  }
  std::printf("%-10s %-12s %-12s %14s %8s\n", "WORKER", "FORWARD", "BACKWARD", "MEMORY_BYTES",
              "BUSY_%");
  for (size_t w = 0; w < plan.forward.size(); ++w) {
    const double iteration = plan.simulation.iteration_seconds;
    std::printf("%-10s %-12s %-12s %14.0f %8.1f\n", cluster.workers[w].name.c_str(),
                RangeText(plan.forward[w]).c_str(), RangeText(plan.backward[w]).c_str(),
                plan.memory_bytes[w],
                iteration > 0 ? 100 * plan.simulation.busy_seconds[w] / iteration : 0.0);
  }
  std::printf("units: ");
  for (size_t u = 0; u < profile.units.size(); ++u) {
    std::printf("%s%zu=%s", u ? " " : "", u, profile.units[u].name.c_str());
  }
  std::printf("\n");
}

absl::StatusOr<ModelProfile> LoadProfile(const PlanFlags& f) {
  if (f.profile.empty()) {
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
    return AnalyticProfile(config, f.seq_len, f.micro_batch_size, f.gflops * 1e9);
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
  if (!text.ok()) return std::fprintf(stderr, "pipetrain plan: %s\n", text.status().ToString().c_str()), 1;
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

}  // namespace

int RunPlan(const std::vector<std::string>& args) {
  PlanFlags f;
  FlagSet flags(
      "usage: pipetrain plan (--profile P.json | --layers N [--d-model ...]) (--cluster C.json | "
      "--workers N "
      "--bandwidth-gbps X [--latency-us Y] [--memory-gib Z]) [--solver S] [--objective O] "
      "[--micro-batches M] [--schedule 1f1b|gpipe] [--json] [--svg FILE] [--trace FILE]");
  flags.String("profile", &f.profile, "model profile JSON (docs/formats.md)");
  flags.Int("layers", &f.layers, "without --profile: plan a GPT-2 of this many layers from FLOPs");
  flags.Int("d-model", &f.d_model, "analytic profile: embedding width");
  flags.Int("heads", &f.heads, "analytic profile: attention heads");
  flags.Int("vocab", &f.vocab, "analytic profile: vocabulary size");
  flags.Int("seq-len", &f.seq_len, "analytic profile: tokens per sequence");
  flags.Int("micro-batch-size", &f.micro_batch_size, "analytic profile: sequences per micro-batch");
  flags.Double("gflops", &f.gflops, "analytic profile: the workers' GEMM rate at speed 1");
  flags.String("write-profile", &f.write_profile, "also write the profile used as JSON");
  flags.String("cluster", &f.cluster, "cluster JSON (docs/formats.md); or --workers etc.");
  flags.Int("workers", &f.workers, "number of identical workers (without --cluster)");
  flags.Double("bandwidth-gbps", &f.bandwidth_gbps, "link bandwidth in Gbit/s; 0: unlimited");
  flags.Double("latency-us", &f.latency_us, "per-message latency in microseconds");
  flags.Double("memory-gib", &f.memory_gib, "memory per worker in GiB; 0: unlimited");
  flags.String("solver", &f.solver, "uniform | pipedream | bipartition | acctfm | auto");
  flags.String("objective", &f.objective, "paper | full (bipartition's objective)");
  flags.Int("micro-batches", &f.micro_batches, "micro-batches per iteration");
  flags.String("schedule", &f.schedule, "1f1b | gpipe");
  flags.Bool("json", &f.json, "print the plan as JSON");
  flags.String("svg", &f.svg, "write the simulated timeline as SVG to this file");
  flags.String("trace", &f.trace, "write the simulated timeline as Chrome trace JSON");
  absl::Status parsed = flags.Parse(args);
  if (flags.help_requested()) return std::printf("%s", flags.Usage().c_str()), 0;
  if (parsed.ok() && f.profile.empty() == (f.layers <= 0)) {
    parsed = absl::InvalidArgumentError("give --profile FILE or --layers N (an analytic GPT-2 profile)");
  }
  if (parsed.ok() && f.profile.empty() && f.solver == "acctfm") {
    parsed = absl::InvalidArgumentError("--solver acctfm needs --profile (its own format)");
  }
  if (parsed.ok() && f.layers > 0 && f.gflops <= 0) {
    parsed = absl::InvalidArgumentError("--gflops must be > 0");
  }
  if (parsed.ok() && f.solver != "acctfm" && f.cluster.empty() == (f.workers <= 0)) {
    parsed = absl::InvalidArgumentError("give either --cluster or --workers N (N >= 1)");
  }
  if (parsed.ok() && (f.bandwidth_gbps < 0 || f.latency_us < 0 || f.memory_gib < 0)) {
    parsed = absl::InvalidArgumentError(
        "--bandwidth-gbps, --latency-us and --memory-gib must be >= 0");
  }
  absl::StatusOr<Schedule> schedule = ParseSchedule(f.schedule);
  if (parsed.ok() && !schedule.ok()) parsed = schedule.status();
  if (!parsed.ok()) {
    std::fprintf(stderr, "pipetrain plan: %s\n\n%s", std::string(parsed.message()).c_str(),
                 flags.Usage().c_str());
    return 2;
  }
  if (f.solver == "acctfm") return RunAccTfm(f);
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "pipetrain plan: %s\n", s.ToString().c_str());
    return 1;
  };
  absl::StatusOr<ModelProfile> profile = LoadProfile(f);
  if (!profile.ok()) return fail(profile.status());
  if (!f.write_profile.empty()) {
    if (auto s = WriteFile(f.write_profile, ProfileToJson(*profile)); !s.ok()) return fail(s);
  }
  absl::StatusOr<ClusterSpec> cluster = ClusterFrom(f);
  if (!cluster.ok()) return fail(cluster.status());
  PlanOptions options;
  options.solver = f.solver;
  options.objective = f.objective;
  options.micro_batches = f.micro_batches;
  options.schedule = *schedule;
  absl::StatusOr<SolvedPlan> plan = SolvePlan(*profile, *cluster, options);
  if (!plan.ok()) return fail(plan.status());
  PrintPlan(*plan, *cluster, *profile, f.json);
  std::vector<std::string> names;
  for (const WorkerSpec& w : cluster->workers) names.push_back(w.name);
  if (!f.svg.empty()) {
    TimelineSvgOptions svg;
    svg.title = absl::StrCat(plan->solver, " plan, ", names.size(), " workers, ", f.micro_batches,
                             " micro-batches, ", f.schedule);
    if (auto s = WriteFile(f.svg, TimelineSvg(plan->simulation, names, svg)); !s.ok()) return fail(s);
  }
  if (!f.trace.empty()) {
    if (auto s = WriteFile(f.trace, ChromeTraceJson(plan->simulation, names)); !s.ok()) return fail(s);
  }
  return 0;
}

}  // namespace pipetrain
