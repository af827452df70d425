#include "coordinator/planner/bipartition_interval.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pipetrain {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kMaxEntries = int64_t{1} << 25;

// How eq. 3 decomposes the paper objective (max over workers of compute and
// over the cuts i < P-1 of (a(s1) + a(s2)) / bandwidth): every cut between
// two workers is the boundary of exactly one split in the recursion tree
// (the last worker of U1 meets the first of U2), and every worker is one
// leaf (m = 1). So A holds worker terms and the cuts strictly inside its
// worker range; the cut at a split is added when the two halves are joined.
// That cut term needs the last forward and backward unit before the
// boundary, a[s1-1] and a[s2-1] in 0-based units: when U1's forward range is
// empty (s1 == i1) that unit belongs to a worker before U1, which is still
// right, because the paper's cut after worker i is defined by global prefix
// counts (s1 = F_i.end, s2 = B_i.end) whether or not F_i is empty. At s = 0
// nothing precedes the cut and at s = L the last unit's output goes nowhere,
// so those terms are 0 (BiPartitionCosts::PaperCut). A leaf is the worker's
// compute (paper) or max(compute, inbound) (full), +inf over memory or with a
// weight sync over its limit (BiPartitionCosts::SyncsFit): the cut after it
// belongs to its parent.
class IntervalDp {
 public:
  IntervalDp(const BiPartitionProblem& problem, SplitSearch search)
      : costs_(problem),
        search_(search),
        L_(costs_.units()),
        P_(costs_.workers()),
        pairs_((L_ + 1) * (L_ + 2) / 2) {
    base_.assign(P_ + 1, std::vector<int64_t>(P_, -1));
    int64_t size = 0;
    for (int m = 1; m <= P_; ++m) {
      for (int w0 = 0; w0 + m <= P_; ++w0) {
        base_[m][w0] = size;
        size += int64_t{pairs_} * pairs_;
      }
    }
    size_ = size;
  }

  int64_t size() const { return size_; }

  void Run() {
    a_.assign(size_, kInf);
    split_.assign(size_, -1);
    for (int m = 1; m <= P_; ++m) {
      for (int w0 = 0; w0 + m <= P_; ++w0) {
        for (int i1 = 0; i1 <= L_; ++i1) {
          for (int j1 = i1; j1 <= L_; ++j1) {
            for (int i2 = 0; i2 <= L_; ++i2) {
              for (int j2 = i2; j2 <= L_; ++j2) Fill(i1, j1, i2, j2, w0, m);
            }
          }
        }
      }
    }
  }

  double A(int i1, int j1, int i2, int j2, int w0, int m) const {
    return a_[At(i1, j1, i2, j2, w0, m)];
  }

  // Unfolds the recorded splits into per-worker ranges.
  void Collect(int i1, int j1, int i2, int j2, int w0, int m, BiPartitionPlan* plan) const {
    if (m == 1) {
      plan->forward[w0] = {i1, j1};
      plan->backward[w0] = {i2, j2};
      return;
    }
    const int s = split_[At(i1, j1, i2, j2, w0, m)];
    const int m2 = s % P_, s2 = (s / P_) % (L_ + 1), s1 = s / P_ / (L_ + 1);
    Collect(i1, s1, i2, s2, w0, m - m2, plan);
    Collect(s1, j1, s2, j2, w0 + m - m2, m2, plan);
  }

 private:
  static int Pair(int i, int j) { return j * (j + 1) / 2 + i; }
  int64_t At(int i1, int j1, int i2, int j2, int w0, int m) const {
    return base_[m][w0] + int64_t{Pair(i1, j1)} * pairs_ + Pair(i2, j2);
  }

  // Alg. 1 line 1-2 (m = 1) and 3-13 (m > 1) for one U.
  void Fill(int i1, int j1, int i2, int j2, int w0, int m) {
    if ((j1 - i1) + (j2 - i2) < m) return;  // some worker would be idle: illegal
    const int64_t here = At(i1, j1, i2, j2, w0, m);
    if (m == 1) {
      a_[here] = Leaf(w0, {i1, j1}, {i2, j2});
      return;
    }
    for (int s1 = i1; s1 <= j1; ++s1) {
      for (int m2 = 1; m2 < m; ++m2) {
        // s2 keeping both halves legal (enough units for their workers).
        const int lo = std::max(i2, i2 + (m - m2) - (s1 - i1));
        const int hi = std::min(j2, j2 + (j1 - s1) - m2);
        if (lo > hi) continue;
        if (search_ == SplitSearch::kExhaustive) {
          for (int s2 = lo; s2 <= hi; ++s2) Try(i1, j1, i2, j2, w0, m, s1, s2, m2, here);
        } else {
          const int s2 = Bsa(i1, j1, i2, j2, w0, m, s1, m2, lo, hi);
          Try(i1, j1, i2, j2, w0, m, s1, s2, m2, here);
          if (s2 + 1 <= hi) Try(i1, j1, i2, j2, w0, m, s1, s2 + 1, m2, here);
        }
      }
    }
  }

  double Leaf(int w, const Range& f, const Range& b) const {
    if (!costs_.Fits(w, f, b) || !costs_.SyncsFit(f, b)) return kInf;
    const double compute = costs_.Compute(w, f, b);
    if (costs_.objective() == BiPartitionObjective::kPaper) return compute;
    return std::max(compute, costs_.Inbound(w, f, b));
  }

  // Eq. 3's X for the split (s1, s2, m2), kept when strictly better.
  void Try(int i1, int j1, int i2, int j2, int w0, int m, int s1, int s2, int m2, int64_t here) {
    const double first = A(i1, s1, i2, s2, w0, m - m2);
    const double second = A(s1, j1, s2, j2, w0 + m - m2, m2);
    double x = std::max(first, second);
    if (costs_.objective() == BiPartitionObjective::kPaper) {
      x = std::max(x, costs_.PaperCut(w0 + m - m2 - 1, {s1, s1}, {s2, s2}));
    }
    if (x < a_[here]) {
      a_[here] = x;
      split_[here] = (s1 * (L_ + 1) + s2) * P_ + m2;
    }
  }

  // Alg. 2 over [lo, hi] (the legal s2). The paper's loop sets r = s2 in the
  // else branch with s2 = (l + r + 1) / 2, which never ends once r = l + 1;
  // r = s2 - 1 keeps its invariant (A(U1) <= A(U2) at l) and ends. The
  // result l and l + 1 are then compared by the caller.
  int Bsa(int i1, int j1, int i2, int j2, int w0, int m, int s1, int m2, int lo, int hi) const {
    int l = lo, r = hi;
    while (l < r) {
      const int s2 = (l + r + 1) / 2;
      if (A(i1, s1, i2, s2, w0, m - m2) <= A(s1, j1, s2, j2, w0 + m - m2, m2)) {
        l = s2;
      } else {
        r = s2 - 1;
      }
    }
    return l;
  }

  const BiPartitionCosts costs_;
  const SplitSearch search_;
  const int L_, P_, pairs_;
  std::vector<std::vector<int64_t>> base_;  // [m][w0]: first entry of that table
  int64_t size_ = 0;
  std::vector<double> a_;
  std::vector<int32_t> split_;
};

// sum over 0 <= i <= j <= L of (j - i + 1): the split positions of a range.
double SplitsPerRange(int L) {
  double total = 0;
  for (int len = 0; len <= L; ++len) total += double(L + 1 - len) * (len + 1);
  return total;
}

}  // namespace

absl::StatusOr<BiPartitionPlan> SolveBiPartitionInterval(const BiPartitionProblem& problem,
                                                         SplitSearch s2_search) {
  if (auto s = ValidateProblem(problem); !s.ok()) return s;
  IntervalDp dp(problem, s2_search);
  if (dp.size() > kMaxEntries) {
    return absl::InvalidArgumentError(
        absl::StrCat("the interval DP for ", problem.fwd.size(), " units and ",
                     problem.speeds.size(), " workers needs ", dp.size(), " table entries (limit ",
                     kMaxEntries, "); use SolveBiPartition"));
  }
  dp.Run();
  const int L = static_cast<int>(problem.fwd.size()), P = static_cast<int>(problem.speeds.size());
  const double best = dp.A(0, L, 0, L, 0, P);
  if (best == kInf) return NoPlanFitsError(problem);
  BiPartitionPlan plan;
  plan.forward.resize(P);
  plan.backward.resize(P);
  dp.Collect(0, L, 0, L, 0, P, &plan);
  plan.bottleneck = best;
  return plan;
}

double IntervalDpEvaluations(int units, int workers, SplitSearch s2_search) {
  double worker_splits = 0;  // sum over m and w0 of (m - 1)
  for (int m = 2; m <= workers; ++m) worker_splits += double(workers - m + 1) * (m - 1);
  const double ranges = double(units + 1) * (units + 2) / 2;
  const double forward = SplitsPerRange(units);
  if (s2_search == SplitSearch::kExhaustive) return worker_splits * forward * SplitsPerRange(units);
  int steps = 0;
  while ((1 << steps) < units + 1) ++steps;
  return worker_splits * forward * ranges * (steps + 2);
}

}  // namespace pipetrain
