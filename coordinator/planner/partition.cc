#include "coordinator/planner/partition.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace pipetrain {
namespace {

absl::Status CheckStages(int num_units, int stages) {
  if (stages < 1 || stages > num_units) {
    return absl::InvalidArgumentError(absl::StrCat(
        stages, " stages for ", num_units, " units; need 1 <= stages <= units"));
  }
  return absl::OkStatus();
}

// The ranges of the DP's optimum, from `cut` (cut[k][i]: where the k-th of
// `stages` stages begins when they cover units [0, i)). A cut of -1 means
// no finite bottleneck was found: costs that add up to infinity, which the
// callers' validation should have refused.
absl::StatusOr<std::vector<Range>> Backtrack(const std::vector<std::vector<int>>& cut, int stages,
                                             int n) {
  std::vector<Range> ranges(stages);
  for (int k = stages, end = n; k >= 1; --k) {
    if (cut[k][end] < 0) {
      return absl::InvalidArgumentError(
          "no partition has a finite bottleneck: the units' costs add up to infinity");
    }
    ranges[k - 1] = {cut[k][end], end};
    end = cut[k][end];
  }
  return ranges;
}

}  // namespace

absl::StatusOr<std::vector<Range>> UniformPartition(int num_units, int stages) {
  if (auto s = CheckStages(num_units, stages); !s.ok()) return s;
  std::vector<Range> ranges;
  int begin = 0;
  for (int s = 0; s < stages; ++s) {
    const int size = num_units / stages + (s < num_units % stages ? 1 : 0);
    ranges.push_back({begin, begin + size});
    begin += size;
  }
  return ranges;
}

absl::StatusOr<std::vector<Range>> PipeDreamPartition(const std::vector<UnitCost>& costs,
                                                      int stages) {
  const int n = static_cast<int>(costs.size());
  if (auto s = CheckStages(n, stages); !s.ok()) return s;
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i].total();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[k][i]: minimal bottleneck covering units [0, i) with k stages;
  // cut[k][i]: where the k-th stage begins in that optimum.
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, kInf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, -1));
  best[0][0] = 0.0;
  for (int k = 1; k <= stages; ++k) {
    for (int i = k; i <= n; ++i) {
      for (int j = k - 1; j < i; ++j) {  // last stage covers [j, i)
        const double value = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (value < best[k][i]) {  // strict: the earliest cut wins ties
          best[k][i] = value;
          cut[k][i] = j;
        }
      }
    }
  }
  return Backtrack(cut, stages, n);
}

namespace {

// Prefix sums of the units' compute (total()) and of their comm_seconds.
struct Prefixes {
  std::vector<double> compute, comm;
};

// Stage k covering [j, i): its compute over its speed plus its comm, and
// the transfer at its end cut (none after the last unit).
double StageTerm(const Prefixes& prefix, const std::vector<double>& speeds,
                 const std::vector<double>& activation_bytes, double bandwidth, int k, int j,
                 int i) {
  const int n = static_cast<int>(prefix.compute.size()) - 1;
  double term = (prefix.compute[i] - prefix.compute[j]) / speeds[k] +
                (prefix.comm[i] - prefix.comm[j]);
  if (i < n && bandwidth > 0) term = std::max(term, 2 * activation_bytes[i - 1] / bandwidth);
  return term;
}

Prefixes PrefixTotals(const std::vector<UnitCost>& costs) {
  Prefixes prefix{std::vector<double>(costs.size() + 1, 0.0),
                  std::vector<double>(costs.size() + 1, 0.0)};
  for (size_t i = 0; i < costs.size(); ++i) {
    prefix.compute[i + 1] = prefix.compute[i] + costs[i].total();
    prefix.comm[i + 1] = prefix.comm[i] + costs[i].comm_seconds;
  }
  return prefix;
}

}  // namespace

absl::StatusOr<std::vector<Range>> SpeedAwarePipeDreamPartition(
    const std::vector<UnitCost>& costs, const std::vector<double>& speeds,
    const std::vector<double>& activation_bytes, double bandwidth) {
  const int n = static_cast<int>(costs.size());
  const int stages = static_cast<int>(speeds.size());
  if (auto s = CheckStages(n, stages); !s.ok()) return s;
  if (static_cast<int>(activation_bytes.size()) != n) {
    return absl::InvalidArgumentError("one activation size per unit is needed");
  }
  for (double speed : speeds) {
    if (!(speed > 0)) return absl::InvalidArgumentError("speeds must be > 0");
  }
  const Prefixes prefix = PrefixTotals(costs);
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, kInf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, -1));
  best[0][0] = 0.0;
  for (int k = 1; k <= stages; ++k) {
    for (int i = k; i <= n; ++i) {
      for (int j = k - 1; j < i; ++j) {  // stage k-1 covers [j, i)
        const double value = std::max(
            best[k - 1][j], StageTerm(prefix, speeds, activation_bytes, bandwidth, k - 1, j, i));
        if (value < best[k][i]) {  // strict: the earliest cut wins ties
          best[k][i] = value;
          cut[k][i] = j;
        }
      }
    }
  }
  return Backtrack(cut, stages, n);
}

double SpeedAwareBottleneck(const std::vector<UnitCost>& costs, const std::vector<double>& speeds,
                            const std::vector<double>& activation_bytes, double bandwidth,
                            const std::vector<Range>& ranges) {
  const Prefixes prefix = PrefixTotals(costs);
  double worst = 0.0;
  for (size_t k = 0; k < ranges.size(); ++k) {
    worst = std::max(worst, StageTerm(prefix, speeds, activation_bytes, bandwidth,
                                      static_cast<int>(k), ranges[k].begin, ranges[k].end));
  }
  return worst;
}

double BottleneckCost(const std::vector<UnitCost>& costs, const std::vector<Range>& ranges) {
  double worst = 0.0;
  for (const Range& r : ranges) {
    double sum = 0.0;
    for (int u = r.begin; u < r.end; ++u) sum += costs[u].total();
    worst = std::max(worst, sum);
  }
  return worst;
}

}  // namespace pipetrain
