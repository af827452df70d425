// Solve time of the Bi-Partition solvers on GPT-like profiles: the fast
// exact solver (both objectives), the plain prefix DP and the paper's
// interval DP (exhaustive s2 and BSA), for units x workers.
//
//   bazel run -c opt //coordinator/planner:bipartition_benchmark [-- --quick] [--fast_only]
//
// Prints one table row per (scenario, units, workers, objective, solver):
// seconds per solve on one core (the median of up to 5 runs, fewer for slow
// cells), the feasibility probes of the fast solver, the optimum, and a
// check column: fast == reference and fast == interval (exhaustive) where
// those ran, and bottleneck == Objective(plan). Cells estimated to take
// longer than kBudgetSeconds print "skipped (estimated N s)". The last line
// is OK or FAILED.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/planner/bipartition.h"
#include "coordinator/planner/bipartition_interval.h"

namespace pipetrain {
namespace {

constexpr double kBudgetSeconds = 30;

// GPT-2 small shapes: d_model 768, 12 heads, vocabulary 50257, 1024 tokens
// per micro-batch, fp32, 200 GFLOP/s per worker at speed 1.
struct Scenario {
  const char* name;
  double bandwidth;  // bytes/s
  bool all_solvers;  // else the fast solver and the reference DP only
};

double Jitter(int unit) {  // +-5%, deterministic: profiles are never exactly even
  return 1.0 + 0.05 * std::sin(1.7 * unit + 0.3);
}

BiPartitionProblem GptProblem(int units, int workers, const Scenario& scenario,
                              BiPartitionObjective objective) {
  const double d = 768, vocab = 50257, tokens = 1024, heads = 12, flops = 200e9, f32 = 4;
  const double attn_fwd = tokens * (8 * d * d + 4 * tokens * d) / flops;
  const double mlp_fwd = tokens * 16 * d * d / flops;
  const double head_fwd = tokens * 2 * d * vocab / flops;
  const double act = tokens * d * f32;
  BiPartitionProblem p;
  auto add = [&](double fwd, double bwd, double activation, double weights, double stash) {
    const double j = Jitter(static_cast<int>(p.fwd.size()));
    p.fwd.push_back(fwd * j);
    p.bwd.push_back(bwd * j);
    p.activation_bytes.push_back(activation);
    p.weight_bytes.push_back(weights);
    p.stash_bytes.push_back(stash);
  };
  // embed: a cheap lookup, but its backward scatters into a 154 MB gradient.
  add(0.001, 0.010, act, (vocab + tokens) * d * f32, tokens * f32);
  for (int block = 0; 2 * block + 2 < units; ++block) {
    add(attn_fwd, 2 * attn_fwd, act, (4 * d * d + 6 * d) * f32,
        6 * act + heads * tokens * tokens * f32);
    if (static_cast<int>(p.fwd.size()) + 1 < units) {
      add(mlp_fwd, 2 * mlp_fwd, act, (8 * d * d + 7 * d) * f32, 9 * act);
    }
  }
  // head: final LayerNorm, the tied LM head and the loss (output: a scalar).
  add(head_fwd, 2 * head_fwd, f32, vocab * d * f32, act + tokens * vocab * f32);
  const double pattern[] = {1.0, 0.8, 1.2, 0.9};
  for (int w = 0; w < workers; ++w) p.speeds.push_back(pattern[w % 4]);
  p.memory_bytes.assign(workers, 32e9);
  p.bandwidth = scenario.bandwidth;
  p.latency_seconds = 5e-5;
  p.micro_batches = 8;
  p.objective = objective;
  return p;
}

struct Timed {
  absl::StatusOr<BiPartitionPlan> plan;
  double seconds = 0;
};

Timed Time(const std::function<absl::StatusOr<BiPartitionPlan>()>& solve) {
  std::vector<double> runs;
  Timed out;
  double total = 0;
  while (runs.size() < 5 && (runs.empty() || total < 1.0)) {
    const auto start = std::chrono::steady_clock::now();
    out.plan = solve();
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    runs.push_back(took.count());
    total += took.count();
  }
  std::sort(runs.begin(), runs.end());
  out.seconds = runs[runs.size() / 2];
  return out;
}

// Work estimates (the inner loop counts) for the slow solvers.
double ReferenceWork(int L, int P) {
  const double states = (L + 1.0) * (L + 2.0) / 2;
  return P * states * states;
}

class Table {
 public:
  void Header() {
    std::printf("# bipartition_benchmark: solve time per call, one core\n");
    std::printf(
        "# profile: GPT-2-small-like units (embed, attn/mlp alternating, head; "
        "d=768, vocab 50257, 1024 tokens/micro-batch, 200 GFLOP/s), jitter +-5%%; "
        "speeds 1.0,0.8,1.2,0.9 repeating; memory 32e9 B/worker; m=8, 1F1B; "
        "latency 5e-5 s; scenario = bandwidth (10gbe 1.25e9, 80mbit 1e7, 8mbit 1e6 B/s)\n");
    std::printf(
        "# solvers: fast = SolveBiPartition, reference = O(P L^4) prefix DP, "
        "interval = paper Alg. 1 (exhaustive s2), interval_bsa = Alg. 1 + Alg. 2\n");
    std::printf(
        "# check: OK when the bottleneck equals the fast solver's and "
        "Objective(plan); bsa may differ (reported 'differs', not a failure)\n");
    std::printf("%-9s %5s %7s %-9s %-12s %12s %6s %14s  %s\n", "#scenario", "units", "workers",
                "objective", "solver", "seconds", "probes", "bottleneck_s", "check");
  }

  void Row(const Scenario& s, int L, int P, const char* objective, const char* solver,
           const Timed& t, int probes, const std::string& check) {
    char value[32];
    if (t.plan.ok()) {
      std::snprintf(value, sizeof(value), "%.9g", t.plan->bottleneck);
    } else {
      std::snprintf(value, sizeof(value), "%s",
                    absl::StatusCodeToString(t.plan.status().code()).c_str());
    }
    std::printf("%-9s %5d %7d %-9s %-12s %12.6f %6d %14s  %s\n", s.name, L, P, objective, solver,
                t.seconds, probes, value, check.c_str());
    std::fflush(stdout);
    if (check == "FAILED") failed_ = true;
  }

  void Skipped(const Scenario& s, int L, int P, const char* objective, const char* solver,
               double estimate) {
    std::printf("%-9s %5d %7d %-9s %-12s skipped (estimated %.0f s)\n", s.name, L, P, objective,
                solver, estimate);
  }

  bool failed() const { return failed_; }

 private:
  bool failed_ = false;
};

// Every generated instance is feasible (32 GB per worker), so a solver
// that fails, even both alike, is a failure.
std::string Check(const BiPartitionProblem& p, const Timed& t, const Timed& fast) {
  if (!t.plan.ok() || !fast.plan.ok()) return "FAILED";
  const bool same =
      t.plan->bottleneck == fast.plan->bottleneck && Objective(p, *t.plan) == t.plan->bottleneck;
  return same ? "OK" : "FAILED";
}

// Seconds per unit of work, from the largest cell of a solver measured so
// far (small cells overstate it: fixed costs dominate).
struct Rate {
  double seconds_per_op = 0, largest_work = 0;
  double Estimate(double work) const { return seconds_per_op * work; }
  void Update(double seconds, double work) {
    if (work < largest_work) return;
    largest_work = work;
    seconds_per_op = seconds / work;
  }
};

void RunCell(const Scenario& s, int L, int P, BiPartitionObjective objective, bool fast_only,
             Table* table, Rate* reference_rate, Rate* interval_rate, Rate* bsa_rate) {
  const char* name = objective == BiPartitionObjective::kPaper ? "paper" : "full";
  const BiPartitionProblem p = GptProblem(L, P, s, objective);
  BiPartitionSolveStats stats;
  const Timed fast = Time([&] { return SolveBiPartition(p, &stats); });
  // Feasible instances only (see Check): an error is a failure, whose
  // status the bottleneck column names.
  const bool fast_ok = fast.plan.ok() && Objective(p, *fast.plan) == fast.plan->bottleneck;
  table->Row(s, L, P, name, "fast", fast, stats.probes, fast_ok ? "OK" : "FAILED");
  if (fast_only) return;

  const double ref_work = ReferenceWork(L, P);
  const double ref_estimate = reference_rate->Estimate(ref_work);
  if (ref_estimate > kBudgetSeconds) {
    table->Skipped(s, L, P, name, "reference", ref_estimate);
  } else {
    const Timed ref = Time([&] { return SolveBiPartitionReference(p); });
    reference_rate->Update(ref.seconds, ref_work);
    table->Row(s, L, P, name, "reference", ref, 0, Check(p, ref, fast));
  }

  if (!s.all_solvers) return;
  for (SplitSearch search : {SplitSearch::kExhaustive, SplitSearch::kBinary}) {
    const bool exhaustive = search == SplitSearch::kExhaustive;
    Rate* rate = exhaustive ? interval_rate : bsa_rate;
    const char* solver = exhaustive ? "interval" : "interval_bsa";
    const double work = IntervalDpEvaluations(L, P, search);
    // x2: larger tables miss the cache more than the cell the rate came from.
    const double estimate = 2 * rate->Estimate(work);
    if (estimate > kBudgetSeconds) {
      table->Skipped(s, L, P, name, solver, estimate);
      continue;
    }
    const Timed t = Time([&] { return SolveBiPartitionInterval(p, search); });
    rate->Update(t.seconds, work);
    if (!t.plan.ok() && t.plan.status().code() == absl::StatusCode::kInvalidArgument) {
      std::printf("%-9s %5d %7d %-9s %-12s skipped (%s)\n", s.name, L, P, name, solver,
                  std::string(t.plan.status().message()).c_str());
      continue;
    }
    std::string check = Check(p, t, fast);
    if (!exhaustive && check == "FAILED") check = "differs";
    table->Row(s, L, P, name, solver, t, 0, check);
  }
}

int Main(int argc, char** argv) {
  bool quick = false, fast_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;  // units <= 32
    } else if (std::strcmp(argv[i], "--fast_only") == 0) {
      fast_only = true;  // only SolveBiPartition
    } else {
      std::fprintf(stderr, "usage: bipartition_benchmark [--quick] [--fast_only]\n");
      return 2;
    }
  }
  // 10 GbE; 80 Mbit/s (transfers ~ compute); 8 Mbit/s (transfers dominate).
  const Scenario scenarios[] = {
      {"10gbe", 1.25e9, true}, {"80mbit", 1e7, false}, {"8mbit", 1e6, false}};
  const int units[] = {8, 16, 32, 64, 98};
  const int workers[] = {2, 4, 8, 16};
  Table table;
  table.Header();
  for (const Scenario& s : scenarios) {
    // Rates start from a measured small cell, so the first estimates are real.
    Rate reference_rate, interval_rate, bsa_rate;
    for (int L : units) {
      if (quick && L > 32) break;
      for (int P : workers) {
        if (P > 2 * L) continue;
        for (BiPartitionObjective objective :
             {BiPartitionObjective::kPaper, BiPartitionObjective::kFull}) {
          RunCell(s, L, P, objective, fast_only, &table, &reference_rate, &interval_rate,
                  &bsa_rate);
        }
      }
    }
  }
  std::printf("%s\n", table.failed() ? "FAILED" : "OK");
  return table.failed() ? 1 : 0;
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) { return pipetrain::Main(argc, argv); }
