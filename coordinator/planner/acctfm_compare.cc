// Compares AccTFM's Algorithm 1 (acctfm.txt §4.2) with the best uniform
// partition size and with the brute-force optimum (all 3^L assignments) on
// 500 random instances (RandomAccTfmProblem: 1-8 layers, compute-bound,
// comm-bound and mixed regimes), for the forward and the backward pass.
//
//   bazel run //coordinator/planner:acctfm_compare [-- --instances=N --seed=S]
//
// Prints one table per pass and a check footer (OK when Alg. 1 with the
// uniform fallback is never worse than the best uniform size and nothing
// beats brute force); exits 1 on FAILED.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/planner/acctfm.h"

namespace pipetrain {
namespace {

// Relative slack for "optimal": distinct assignments can reach the same end
// time through differently rounded sums.
constexpr double kTolerance = 1e-12;

struct GapStats {
  int count = 0, optimal = 0;
  double sum_gap = 0, max_gap = 0;
  void Add(double seconds, double optimum) {
    // An all-zero instance has optimum 0; any plan then also takes 0.
    const double gap = optimum > 0 ? (seconds - optimum) / optimum : 0.0;
    ++count;
    if (gap <= kTolerance) ++optimal;
    sum_gap += std::max(gap, 0.0);
    max_gap = std::max(max_gap, gap);
  }
  void Print(const char* name) const {
    std::printf("  %-30s %9.1f %12.3f %11.3f\n", name, 100.0 * optimal / count,
                100.0 * sum_gap / count, 100.0 * max_gap);
  }
};

constexpr const char* kRegimes[3] = {"compute-bound", "comm-bound", "mixed"};

struct PassStats {
  GapStats algorithm1, uniform, solver;
  GapStats algorithm1_by_regime[3], uniform_by_regime[3];
  int alg1_lost_to_uniform = 0, alg1_beat_uniform = 0, failures = 0;
};

void AddInstance(const AccTfmPassResult& r, const AccTfmPassPlan& brute, int regime, PassStats& s) {
  const double uniform = *std::min_element(r.uniform_seconds.begin(), r.uniform_seconds.end());
  s.algorithm1.Add(r.algorithm1.seconds, brute.seconds);
  s.algorithm1_by_regime[regime].Add(r.algorithm1.seconds, brute.seconds);
  s.uniform.Add(uniform, brute.seconds);
  s.uniform_by_regime[regime].Add(uniform, brute.seconds);
  s.solver.Add(r.plan.seconds, brute.seconds);
  if (r.used_uniform) ++s.alg1_lost_to_uniform;
  if (r.algorithm1.seconds < uniform * (1 - kTolerance)) ++s.alg1_beat_uniform;
  if (r.plan.seconds > uniform || r.plan.seconds < brute.seconds * (1 - kTolerance)) {
    ++s.failures;
  }
}

void PrintPass(const char* pass, const PassStats& s) {
  std::printf("\n%s pass, %d instances (gap = (seconds - optimum) / optimum)\n", pass,
              s.algorithm1.count);
  std::printf("  %-30s %9s %12s %11s\n", "method", "optimal %", "mean gap %", "max gap %");
  s.algorithm1.Print("Alg. 1 as listed");
  s.uniform.Print("best uniform size");
  s.solver.Print("SolveAccTfm (Alg.1|uniform)");
  for (int regime = 0; regime < 3; ++regime) {
    s.algorithm1_by_regime[regime].Print(absl::StrCat("  Alg. 1, ", kRegimes[regime]).c_str());
    s.uniform_by_regime[regime].Print(absl::StrCat("  uniform, ", kRegimes[regime]).c_str());
  }
  std::printf(
      "  Alg. 1 strictly faster than best uniform: %d; strictly slower (fallback used): %d\n",
      s.alg1_beat_uniform, s.alg1_lost_to_uniform);
}

int ParseFlag(int argc, char** argv, const char* name, int fallback) {
  const size_t len = std::strlen(name);
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], name, len) == 0 && argv[i][len] == '=') {
      return std::atoi(argv[i] + len + 1);
    }
  }
  return fallback;
}

absl::Status AddProblem(const AccTfmProblem& problem, int regime, PassStats& forward,
                        PassStats& backward) {
  ASSIGN_OR_RETURN(const AccTfmSolution solution, SolveAccTfm(problem));
  ASSIGN_OR_RETURN(const AccTfmPassPlan brute_f, BruteForceAccTfm(problem, AccTfmPass::kForward));
  ASSIGN_OR_RETURN(const AccTfmPassPlan brute_b, BruteForceAccTfm(problem, AccTfmPass::kBackward));
  AddInstance(solution.forward, brute_f, regime, forward);
  AddInstance(solution.backward, brute_b, regime, backward);
  return absl::OkStatus();
}

int Run(int argc, char** argv) {
  const int instances = ParseFlag(argc, argv, "--instances", 500);
  const int seed = ParseFlag(argc, argv, "--seed", 1);
  if (instances < 3) {
    std::fprintf(stderr, "--instances=%d: give at least 3 (one per regime)\n", instances);
    return 2;
  }
  PassStats forward, backward;
  for (int index = 0; index < instances; ++index) {
    const absl::Status status =
        AddProblem(RandomAccTfmProblem(seed, index), index % 3, forward, backward);
    if (!status.ok()) {
      std::fprintf(stderr, "instance %d: %s\n", index, status.ToString().c_str());
      return 1;
    }
  }
  std::printf("AccTFM partition sizes {1,2,4}: Alg. 1 vs best uniform vs brute force (3^L)\n");
  std::printf(
      "instances: %d (seed %d), L = 1..8; regimes by index %% 3: compute-bound,\n"
      "comm-bound, mixed; odd indices give all-reduce seconds, even ones use eq. 3\n",
      instances, seed);
  PrintPass("forward", forward);
  PrintPass("backward (layers in reverse)", backward);
  const int failures = forward.failures + backward.failures;
  std::printf(
      "\ncheck: SolveAccTfm never slower than best uniform, never faster than brute "
      "force: %s (%d violations)\n",
      failures == 0 ? "OK" : "FAILED", failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) { return pipetrain::Run(argc, argv); }
