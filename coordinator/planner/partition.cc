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
  std::vector<Range> ranges(stages);
  for (int k = stages, end = n; k >= 1; --k) {
    ranges[k - 1] = {cut[k][end], end};
    end = cut[k][end];
  }
  return ranges;
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
