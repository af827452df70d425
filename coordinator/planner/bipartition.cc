#include "coordinator/planner/bipartition.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "absl/strings/str_cat.h"

namespace pipetrain {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<double> Prefix(const std::vector<double>& v) {
  std::vector<double> p(v.size() + 1, 0.0);
  for (size_t i = 0; i < v.size(); ++i) p[i + 1] = p[i] + v[i];
  return p;
}

// Eq. 2's compute term for one worker.
double StageCost(const std::vector<double>& pf, const std::vector<double>& pb, const Range& f,
                 const Range& b, double speed) {
  return ((pf[f.end] - pf[f.begin]) + (pb[b.end] - pb[b.begin])) / speed;
}

// Eq. 3's communication term for the cut after a worker whose forward and
// backward prefixes end at s1 and s2 units.
double CutCost(const BiPartitionProblem& p, int s1, int s2) {
  if (p.bandwidth <= 0) return 0.0;
  const int L = static_cast<int>(p.fwd.size());
  double bytes = 0.0;
  if (s1 > 0 && s1 < L) bytes += p.activation_bytes[s1 - 1];
  if (s2 > 0 && s2 < L) bytes += p.activation_bytes[s2 - 1];
  return bytes / p.bandwidth;
}

}  // namespace

absl::Status ValidateProblem(const BiPartitionProblem& p) {
  const size_t L = p.fwd.size();
  if (L == 0 || p.speeds.empty()) return absl::InvalidArgumentError("no units or no workers");
  if (p.bwd.size() != L || p.activation_bytes.size() != L) {
    return absl::InvalidArgumentError("fwd, bwd and activation_bytes must have one entry per unit");
  }
  for (size_t u = 0; u < L; ++u) {
    for (double v : {p.fwd[u], p.bwd[u], p.activation_bytes[u]}) {
      if (!(v >= 0) || !std::isfinite(v)) {
        return absl::InvalidArgumentError(absl::StrCat("unit ", u, ": costs must be finite and >= 0"));
      }
    }
  }
  for (size_t w = 0; w < p.speeds.size(); ++w) {
    if (!(p.speeds[w] > 0) || !std::isfinite(p.speeds[w])) {
      return absl::InvalidArgumentError(absl::StrCat("worker ", w, ": speed must be > 0"));
    }
  }
  return absl::OkStatus();
}

double PaperObjective(const BiPartitionProblem& p, const BiPartitionPlan& plan) {
  const std::vector<double> pf = Prefix(p.fwd), pb = Prefix(p.bwd);
  const int P = static_cast<int>(p.speeds.size());
  double worst = 0.0;
  for (int i = 0; i < P; ++i) {
    worst = std::max(worst, StageCost(pf, pb, plan.forward[i], plan.backward[i], p.speeds[i]));
    if (i + 1 < P) worst = std::max(worst, CutCost(p, plan.forward[i].end, plan.backward[i].end));
  }
  return worst;
}

absl::StatusOr<BiPartitionPlan> SolveBiPartition(const BiPartitionProblem& p) {
  if (auto s = ValidateProblem(p); !s.ok()) return s;
  const int L = static_cast<int>(p.fwd.size()), P = static_cast<int>(p.speeds.size());
  if (P > 2 * L) {
    return absl::InvalidArgumentError(absl::StrCat(
        P, " workers for ", L, " units: at most 2 * units workers can each get a range"));
  }
  const std::vector<double> pf = Prefix(p.fwd), pb = Prefix(p.bwd);
  const int S = (L + 1) * (L + 1);
  auto idx = [L](int f, int b) { return f * (L + 1) + b; };
  // best[k][f][b] and the (f, b) it came from, for k = 0..P.
  std::vector<std::vector<double>> best(P + 1, std::vector<double>(S, kInf));
  std::vector<std::vector<int>> from(P + 1, std::vector<int>(S, -1));
  best[0][idx(0, 0)] = 0.0;
  for (int k = 0; k < P; ++k) {
    for (int f = 0; f <= L; ++f) {
      for (int b = 0; b <= L; ++b) {
        const double here = best[k][idx(f, b)];
        if (here == kInf) continue;
        for (int f2 = f; f2 <= L; ++f2) {
          for (int b2 = b; b2 <= L; ++b2) {
            if (f2 == f && b2 == b) continue;  // both ranges empty
            double cost = std::max(here, StageCost(pf, pb, {f, f2}, {b, b2}, p.speeds[k]));
            if (k + 1 < P) cost = std::max(cost, CutCost(p, f2, b2));
            if (cost < best[k + 1][idx(f2, b2)]) {
              best[k + 1][idx(f2, b2)] = cost;
              from[k + 1][idx(f2, b2)] = idx(f, b);
            }
          }
        }
      }
    }
  }
  BiPartitionPlan plan;
  plan.bottleneck = best[P][idx(L, L)];
  plan.forward.resize(P);
  plan.backward.resize(P);
  for (int k = P, at = idx(L, L); k >= 1; --k) {
    const int prev = from[k][at];
    plan.forward[k - 1] = {prev / (L + 1), at / (L + 1)};
    plan.backward[k - 1] = {prev % (L + 1), at % (L + 1)};
    at = prev;
  }
  return plan;
}

BiPartitionPlan BruteForceBiPartition(const BiPartitionProblem& p) {
  const int L = static_cast<int>(p.fwd.size()), P = static_cast<int>(p.speeds.size());
  BiPartitionPlan best, current;
  best.bottleneck = kInf;
  current.forward.resize(P);
  current.backward.resize(P);
  // Chooses worker k's forward end, then its backward end, recursively.
  std::function<void(int, int, int)> place = [&](int k, int f, int b) {
    if (k == P) {
      if (f != L || b != L) return;
      current.bottleneck = PaperObjective(p, current);
      if (current.bottleneck < best.bottleneck) best = current;
      return;
    }
    for (int f2 = f; f2 <= L; ++f2) {
      for (int b2 = b; b2 <= L; ++b2) {
        if (f2 == f && b2 == b) continue;
        current.forward[k] = {f, f2};
        current.backward[k] = {b, b2};
        place(k + 1, f2, b2);
      }
    }
  };
  place(0, 0, 0);
  return best;
}

}  // namespace pipetrain
