#include "coordinator/planner/bipartition.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace pipetrain {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<double> Prefix(const std::vector<double>& v, size_t n) {
  std::vector<double> p(n + 1, 0.0);
  for (size_t i = 0; i < n; ++i) p[i + 1] = p[i] + (v.empty() ? 0.0 : v[i]);
  return p;
}

bool Empty(const Range& r) { return r.begin == r.end; }

// Sum of v over r, from v's prefix sums.
double Sum(const std::vector<double>& prefix, const Range& r) {
  return prefix[r.end] - prefix[r.begin];
}

// Sum over the units of x that are not in y (at most two runs: before and
// after y).
double SumMinus(const std::vector<double>& prefix, const Range& x, const Range& y) {
  if (Empty(x)) return 0.0;
  if (Empty(y)) return Sum(prefix, x);
  double total = 0.0;
  if (y.begin > x.begin) total += Sum(prefix, {x.begin, std::min(x.end, y.begin)});
  if (y.end < x.end) total += Sum(prefix, {std::max(x.begin, y.end), x.end});
  return total;
}

// A forward-only unit's pass peak, per unit: transient + stash bytes.
std::vector<double> ForwardOnlyPeaks(const BiPartitionProblem& p) {
  std::vector<double> peak(p.fwd.size(), 0.0);
  for (size_t u = 0; u < peak.size(); ++u) {
    if (!p.transient_bytes.empty()) peak[u] += p.transient_bytes[u];
    if (!p.stash_bytes.empty()) peak[u] += p.stash_bytes[u];
  }
  return peak;
}

double SumBoth(const std::vector<double>& prefix, const Range& x, const Range& y) {
  const int begin = std::max(x.begin, y.begin), end = std::min(x.end, y.end);
  return begin < end ? Sum(prefix, {begin, end}) : 0.0;
}

absl::Status CheckList(const std::vector<double>& v, size_t want, bool may_be_empty,
                       const char* name, const char* per) {
  if (v.empty() && may_be_empty) return absl::OkStatus();
  if (v.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat(name, " has ", v.size(), " entries; want ",
                                                   may_be_empty ? "none or " : "", want,
                                                   " (one per ", per, ")"));
  }
  for (size_t i = 0; i < v.size(); ++i) {
    if (!(v[i] >= 0) || !std::isfinite(v[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(per, " ", i, ": ", name, " must be finite and >= 0"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string BytesAndGiB(double bytes) {
  return absl::StrFormat("%.0f bytes (%.2f GiB)", std::ceil(bytes), bytes / (1ull << 30));
}

absl::Status ValidateProblem(const BiPartitionProblem& p) {
  const size_t L = p.fwd.size(), P = p.speeds.size();
  if (L == 0 || P == 0) return absl::InvalidArgumentError("no units or no workers");
  if (p.bwd.size() != L || p.activation_bytes.size() != L) {
    return absl::InvalidArgumentError("fwd, bwd and activation_bytes must have one entry per unit");
  }
  for (size_t u = 0; u < L; ++u) {
    for (double v : {p.fwd[u], p.bwd[u], p.activation_bytes[u]}) {
      if (!(v >= 0) || !std::isfinite(v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("unit ", u, ": costs must be finite and >= 0"));
      }
    }
  }
  for (size_t w = 0; w < P; ++w) {
    if (!(p.speeds[w] > 0) || !std::isfinite(p.speeds[w])) {
      return absl::InvalidArgumentError(absl::StrCat("worker ", w, ": speed must be > 0"));
    }
  }
  if (auto s = CheckList(p.weight_bytes, L, true, "weight_bytes", "unit"); !s.ok()) return s;
  if (auto s = CheckList(p.fwd_comm, L, true, "fwd_comm", "unit"); !s.ok()) return s;
  if (auto s = CheckList(p.bwd_comm, L, true, "bwd_comm", "unit"); !s.ok()) return s;
  if (!(p.tied_weight_bytes >= 0) || !std::isfinite(p.tied_weight_bytes)) {
    return absl::InvalidArgumentError("tied_weight_bytes must be finite and >= 0");
  }
  if (auto s = CheckList(p.stash_bytes, L, true, "stash_bytes", "unit"); !s.ok()) return s;
  if (auto s = CheckList(p.transient_bytes, L, true, "transient_bytes", "unit"); !s.ok()) {
    return s;
  }
  if (auto s = CheckList(p.memory_bytes, P, true, "memory_bytes", "worker"); !s.ok()) return s;
  // Below a byte, every plan's memory ratio is infinite: no plan to name
  // in NoPlanFitsError's message.
  for (size_t w = 0; w < p.memory_bytes.size(); ++w) {
    if (p.memory_bytes[w] > 0 && p.memory_bytes[w] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker ", w, ": memory_bytes must be 0 (unlimited) or at least 1, got ",
                       p.memory_bytes[w]));
    }
  }
  if (!p.stepped_weight_copies.empty() && p.stepped_weight_copies.size() != P) {
    return absl::InvalidArgumentError(absl::StrCat("stepped_weight_copies has ",
                                                   p.stepped_weight_copies.size(), " entries for ",
                                                   P, " workers"));
  }
  for (size_t w = 0; w < p.stepped_weight_copies.size(); ++w) {
    if (!(p.stepped_weight_copies[w] >= 0 && p.stepped_weight_copies[w] <= 1e4)) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker ", w, ": stepped_weight_copies must be in [0, 1e4], got ",
                       p.stepped_weight_copies[w]));
    }
  }
  if (std::isnan(p.bandwidth)) {
    return absl::InvalidArgumentError("bandwidth is NaN; use <= 0 for unlimited");
  }
  if (!(p.max_weight_sync_bytes > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_weight_sync_bytes must be > 0 (+inf: no limit), got ", p.max_weight_sync_bytes));
  }
  if (!(p.latency_seconds >= 0) || !std::isfinite(p.latency_seconds)) {
    return absl::InvalidArgumentError("latency_seconds must be finite and >= 0");
  }
  if (p.micro_batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro_batches must be >= 1, got ", p.micro_batches));
  }
  if (P > 2 * L) {
    return absl::InvalidArgumentError(absl::StrCat(
        P, " workers for ", L, " units: at most 2 * units workers can each get a range"));
  }
  // Finite one by one is not enough: the solvers and the simulator add the
  // costs up, over units and micro-batches (two units of 1e308 seconds
  // made every plan's bottleneck infinite). The factor 4 leaves room for
  // the simulator's sums of passes and transfers.
  double seconds = 0, comm = 0, bytes = 0, slowest = p.speeds[0];
  for (size_t u = 0; u < L; ++u) {
    seconds += p.fwd[u] + p.bwd[u];
    bytes += p.activation_bytes[u];
  }
  for (const std::vector<double>* list : {&p.fwd_comm, &p.bwd_comm}) {
    for (double c : *list) comm += c;
  }
  for (const std::vector<double>* list :
       {&p.weight_bytes, &p.stash_bytes, &p.transient_bytes, &p.memory_bytes}) {
    for (double b : *list) bytes += b;
  }
  for (double speed : p.speeds) slowest = std::min(slowest, speed);
  const double transfers =
      p.bandwidth > 0 ? 2 * bytes / p.bandwidth + 2 * L * p.latency_seconds : 0;
  if (!std::isfinite(4.0 * p.micro_batches * (seconds / slowest + comm + transfers)) ||
      !std::isfinite(4.0 * p.micro_batches * bytes)) {
    return absl::InvalidArgumentError(
        "the units' costs add up past what a plan can be computed with (seconds or bytes over "
        "all units and micro-batches are not finite)");
  }
  return absl::OkStatus();
}

BiPartitionCosts::BiPartitionCosts(const BiPartitionProblem& p)
    : units_(static_cast<int>(p.fwd.size())),
      objective_(p.objective),
      speeds_(p.speeds),
      memory_(p.memory_bytes.empty() ? std::vector<double>(p.speeds.size(), 0.0) : p.memory_bytes),
      stepped_copies_(p.stepped_weight_copies.empty() ? std::vector<double>(p.speeds.size(), 0.0)
                                                      : p.stepped_weight_copies),
      pf_(Prefix(p.fwd, p.fwd.size())),
      pb_(Prefix(p.bwd, p.fwd.size())),
      pw_(Prefix(p.weight_bytes, p.fwd.size())),
      pstash_(Prefix(p.stash_bytes, p.fwd.size())),
      pfc_(Prefix(p.fwd_comm, p.fwd.size())),
      pbc_(Prefix(p.bwd_comm, p.fwd.size())),
      transient_max_(p.transient_bytes.empty() ? std::vector<double>(p.fwd.size(), 0.0)
                                               : p.transient_bytes),
      forward_only_peak_max_(ForwardOnlyPeaks(p)),
      activation_(p.activation_bytes),
      bandwidth_(p.bandwidth),
      latency_(p.latency_seconds),
      micro_batches_(p.micro_batches) {
  const int P = workers();
  for (int i = 0; i < P; ++i) {
    stash_count_.push_back(p.schedule == BiPartitionSchedule::kGPipe
                               ? p.micro_batches
                               : std::min(p.micro_batches, P - i));
  }
  // Weight sync per unit: one message of weight_bytes.
  std::vector<double> sync(units_);
  for (int u = 0; u < units_; ++u) {
    const double w = p.weight_bytes.empty() ? 0.0 : p.weight_bytes[u];
    sync[u] = latency_ + (bandwidth_ > 0 ? w / bandwidth_ : 0.0);
  }
  psync_ = Prefix(sync, units_);
  std::vector<double> oversized(units_, 0.0);
  for (int u = 0; u < units_ && !p.weight_bytes.empty(); ++u) {
    oversized[u] = p.weight_bytes[u] > p.max_weight_sync_bytes ? 1.0 : 0.0;
  }
  poversized_ = Prefix(oversized, units_);
  if (units_ >= 2 && !p.weight_bytes.empty()) {
    tied_ = std::min({p.tied_weight_bytes, p.weight_bytes[0], p.weight_bytes[units_ - 1]});
  }
  for (int u = 0; u < units_; ++u) {
    transfer_.push_back(latency_ + (bandwidth_ > 0 ? activation_[u] / bandwidth_ : 0.0));
  }
}

BiPartitionCosts::RangeMax::RangeMax(std::vector<double> values) {
  const int n = static_cast<int>(values.size());
  levels_.push_back(std::move(values));
  for (int width = 2; width <= n; width *= 2) {
    const std::vector<double>& half = levels_.back();
    std::vector<double> level(n - width + 1);
    for (int u = 0; u + width <= n; ++u) level[u] = std::max(half[u], half[u + width / 2]);
    levels_.push_back(std::move(level));
  }
}

double BiPartitionCosts::RangeMax::Of(const Range& r) const {
  if (r.end <= r.begin) return 0.0;
  int k = 0;
  while ((2 << k) <= r.end - r.begin) ++k;  // the widest level 2^k <= |r|
  return std::max(levels_[k][r.begin], levels_[k][r.end - (1 << k)]);
}

double BiPartitionCosts::RangeMax::OfMinus(const Range& x, const Range& y) const {
  if (Empty(x)) return 0.0;
  if (Empty(y)) return Of(x);
  // Of is 0 for the empty runs: y covering x's start or its end.
  return std::max(Of({x.begin, std::min(x.end, y.begin)}), Of({std::max(x.begin, y.end), x.end}));
}

double BiPartitionCosts::Transfer(int unit) const { return transfer_[unit]; }

double BiPartitionCosts::Compute(int worker, const Range& f, const Range& b) const {
  double work = Sum(pf_, f) + Sum(pb_, b);
  double comm = Sum(pfc_, f) + Sum(pbc_, b);
  if (objective_ == BiPartitionObjective::kFull) {
    work += SumMinus(pf_, b, f);
    comm += SumMinus(pfc_, b, f);  // the recompute's all-reduces
  }
  return work / speeds_[worker] + comm;
}

// Eq. 3's communication term for the cut after `worker`.
double BiPartitionCosts::PaperCut(int worker, const Range& f, const Range& b) const {
  if (worker + 1 >= workers() || bandwidth_ <= 0) return 0.0;
  const int s1 = f.end, s2 = b.end;
  double bytes = 0.0;
  if (s1 > 0 && s1 < units_) bytes += activation_[s1 - 1];
  if (s2 > 0 && s2 < units_) bytes += activation_[s2 - 1];
  return bytes / bandwidth_;
}

double BiPartitionCosts::Inbound(int /*worker*/, const Range& f, const Range& b) const {
  double in = 0.0;
  if (!Empty(f) && f.begin > 0) in += Transfer(f.begin - 1);
  if (!Empty(b) && b.end < units_) in += Transfer(b.end - 1);
  if (!Empty(b) && b.begin > 0 && (Empty(f) || b.begin < f.begin || b.begin > f.end)) {
    in += Transfer(b.begin - 1);
  }
  return in + SumMinus(psync_, f, b) / micro_batches_;
}

double BiPartitionCosts::Memory(int worker, const Range& f, const Range& b) const {
  // B \ F's stash once: the Recompute before each backward rebuilds it for
  // that micro-batch only, and its backward frees it.
  // A run of B \ F right after F recomputes from F's last output, which
  // the worker keeps from each forward pass to its backward pass: n_i of
  // them, one already in the first recomputed unit's stash (its input).
  const bool recomputes_after_f = !Empty(f) && b.begin <= f.end && b.end > f.end;
  const double kept_outputs =
      recomputes_after_f ? (stash_count_[worker] - 1) * activation_[f.end - 1] : 0.0;
  // Both ends of the model on this worker: wte's value once, and its
  // moments once when it steps both (memory_i's tied term).
  double tied = 0;
  if (tied_ > 0) {
    const auto holds = [](const Range& r, int u) { return r.begin <= u && u < r.end; };
    const int last = units_ - 1;
    if ((holds(f, 0) || holds(b, 0)) && (holds(f, last) || holds(b, last))) tied += tied_;
    if (holds(b, 0) && holds(b, last)) tied += 2 * tied_;
  }
  const double forward_only_peak = forward_only_peak_max_.OfMinus(f, b);  // over F \ B
  // The weights it steps, copied c_i times beside (a CPU worker's
  // checkpoint snapshot): the tied wte's twice, since the snapshot copies
  // every unit's parameters, the head's shared wte among them.
  const double stepped_copies = stepped_copies_[worker] * Sum(pw_, b);
  return Sum(pw_, f) + SumMinus(pw_, b, f) + 3 * Sum(pw_, b) + SumMinus(pw_, f, b) +
         stash_count_[worker] * SumBoth(pstash_, f, b) + SumMinus(pstash_, b, f) + kept_outputs +
         std::max({transient_max_.Of(f), transient_max_.Of(b), forward_only_peak}) - tied +
         stepped_copies;
}

bool BiPartitionCosts::Fits(int worker, const Range& f, const Range& b) const {
  return memory_[worker] <= 0 || Memory(worker, f, b) <= memory_[worker];
}

bool BiPartitionCosts::SyncsFit(const Range& f, const Range& b) const {
  return SumMinus(poversized_, f, b) == 0;  // counts: exact
}

double BiPartitionCosts::MemoryRatio(int worker, const Range& f, const Range& b) const {
  return memory_[worker] <= 0 ? 0.0 : Memory(worker, f, b) / memory_[worker];
}

double BiPartitionCosts::WorkerCost(int worker, const Range& f, const Range& b) const {
  if (!Fits(worker, f, b) || !SyncsFit(f, b)) return kInf;
  const double other =
      objective_ == BiPartitionObjective::kPaper ? PaperCut(worker, f, b) : Inbound(worker, f, b);
  return std::max(Compute(worker, f, b), other);
}

namespace {

double PlanCost(const BiPartitionCosts& costs, const BiPartitionPlan& plan) {
  double worst = 0.0;
  for (int i = 0; i < costs.workers(); ++i) {
    worst = std::max(worst, costs.WorkerCost(i, plan.forward[i], plan.backward[i]));
  }
  return worst;
}

double ObjectiveAs(const BiPartitionProblem& problem, const BiPartitionPlan& plan,
                   BiPartitionObjective objective) {
  BiPartitionProblem p = problem;
  p.objective = objective;
  return PlanCost(BiPartitionCosts(p), plan);
}

}  // namespace

double PaperObjective(const BiPartitionProblem& p, const BiPartitionPlan& plan) {
  return ObjectiveAs(p, plan, BiPartitionObjective::kPaper);
}

double FullObjective(const BiPartitionProblem& p, const BiPartitionPlan& plan) {
  return ObjectiveAs(p, plan, BiPartitionObjective::kFull);
}

double Objective(const BiPartitionProblem& p, const BiPartitionPlan& plan) {
  return ObjectiveAs(p, plan, p.objective);
}

absl::StatusOr<BiPartitionPlan> SolveBiPartitionReference(const BiPartitionProblem& p) {
  if (auto s = ValidateProblem(p); !s.ok()) return s;
  const BiPartitionCosts costs(p);
  const int L = costs.units(), P = costs.workers();
  const int S = (L + 1) * (L + 1);
  auto idx = [L](int f, int b) { return f * (L + 1) + b; };
  // best[k][f][b] and the (f, b) it came from, for k = 0..P.
  std::vector<std::vector<double>> best(P + 1, std::vector<double>(S, kInf));
  std::vector<std::vector<int>> from(P + 1, std::vector<int>(S, -1));
  best[0][idx(0, 0)] = 0.0;
  from[0][idx(0, 0)] = 0;
  for (int k = 0; k < P; ++k) {
    for (int f = 0; f <= L; ++f) {
      for (int b = 0; b <= L; ++b) {
        if (from[k][idx(f, b)] < 0) continue;
        const double here = best[k][idx(f, b)];
        for (int f2 = f; f2 <= L; ++f2) {
          for (int b2 = b; b2 <= L; ++b2) {
            if (f2 == f && b2 == b) continue;             // both ranges empty
            if (!costs.Fits(k, {f, f2}, {b, b2})) break;  // memory grows with b2
            // Not monotone: a sync over the limit may fit again at a larger b2.
            if (!costs.SyncsFit({f, f2}, {b, b2})) continue;
            const double cost = std::max(here, costs.WorkerCost(k, {f, f2}, {b, b2}));
            const int to = idx(f2, b2);
            if (from[k + 1][to] < 0 || cost < best[k + 1][to]) {
              best[k + 1][to] = cost;
              from[k + 1][to] = idx(f, b);
            }
          }
        }
      }
    }
  }
  if (from[P][idx(L, L)] < 0) return NoPlanFitsError(p);
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
  const BiPartitionCosts costs(p);
  const int L = costs.units(), P = costs.workers();
  BiPartitionPlan best, current;
  best.bottleneck = kInf;
  current.forward.resize(P);
  current.backward.resize(P);
  // Chooses worker k's forward end, then its backward end, recursively.
  std::function<void(int, int, int)> place = [&](int k, int f, int b) {
    if (k == P) {
      if (f != L || b != L) return;
      current.bottleneck = PlanCost(costs, current);
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

namespace {

// What a threshold search bounds per worker: the objective, or
// memory_i / memory_bytes_i (to explain a problem where nothing fits).
enum class Bound { kObjective, kMemoryRatio };

// How a level picks the source of each target state.
enum class Pick {
  kFirst,  // the first source under the threshold: a feasibility test
  kBest,   // the source minimising the path's largest value: exact min-max
};

// DP over levels for one threshold t. Level k holds the states (f, b) that
// workers 0..k-1 reach (forward passes of [0, f), backward passes of
// [0, b)) with every worker's value <= t, with a parent and the largest
// value on the path (kBest: the smallest such largest value, exactly, for
// every state whose optimum is <= t). Worker k's value from (f, b) to
// (f2, b2) is at least its monotone part M: compute (+inf over memory) for
// the objective, the memory ratio itself otherwise. M shrinks as the source
// nears the target, so sources are tried from the nearest row f = f2 down
// and, within a row, from the largest reachable b down; a row, and every
// row below it, ends once M exceeds t (or, for kBest, the best value found).
class ThresholdSearch {
 public:
  ThresholdSearch(const BiPartitionProblem& problem, const BiPartitionCosts& costs, Bound bound)
      : costs_(costs),
        bound_(bound),
        L_(costs.units()),
        P_(costs.workers()),
        stride_(L_ + 1),
        parent_(P_ + 1, std::vector<int>(stride_ * stride_, -1)),
        value_(P_ + 1, std::vector<double>(stride_ * stride_, 0.0)),
        prev_(P_ + 1, std::vector<int>(stride_ * (L_ + 2), -1)),
        rows_(P_ + 1, Range{0, -1}),
        full_(bound == Bound::kObjective && costs.objective() == BiPartitionObjective::kFull) {
    parent_[0][0] = 0;
    BuildPrev(0);
    keys_.push_back(0.0);
    for (int u = 0; u < L_; ++u) keys_.push_back(costs.Transfer(u));
    if (full_) {
      while ((1 << key_levels_) <= L_ + 1) ++key_levels_;
      min_key_.assign(static_cast<size_t>(L_ + 1) * key_levels_ * (L_ + 1), -1);
      min_key_stamp_.assign(L_ + 1, -1);
      next_.assign(static_cast<size_t>(L_ + 1) * (L_ + 2), L_ + 1);
    }
    work_f_ = Prefix(problem.fwd, L_);
    work_b_ = Prefix(problem.bwd, L_);
    speed_before_.assign(P_ + 1, 0.0);
    speed_after_.assign(P_ + 1, 0.0);
    for (int k = 0; k < P_; ++k) speed_before_[k + 1] = speed_before_[k] + problem.speeds[k];
    for (int k = P_ - 1; k >= 0; --k) speed_after_[k] = speed_after_[k + 1] + problem.speeds[k];
  }

  bool Run(double t, Pick pick) {
    ++probes_;
    for (int k = 0; k < P_; ++k) {
      if (!Level(k, t, pick)) return false;
    }
    return parent_[P_][Index(L_, L_)] >= 0;
  }

  // Valid after Run() returned true.
  double value() const { return value_[P_][Index(L_, L_)]; }
  BiPartitionPlan plan() const {
    BiPartitionPlan plan;
    plan.forward.resize(P_);
    plan.backward.resize(P_);
    for (int k = P_, at = Index(L_, L_); k >= 1; --k) {
      const int prev = parent_[k][at];
      plan.forward[k - 1] = {prev / stride_, at / stride_};
      plan.backward[k - 1] = {prev % stride_, at % stride_};
      at = prev;
    }
    plan.bottleneck = value();
    return plan;
  }
  int probes() const { return probes_; }

 private:
  int Index(int f, int b) const { return f * stride_ + b; }

  // Exact when <= limit; otherwise some value > limit (memory is only
  // looked at when compute is within the limit).
  double Monotone(int k, const Range& f, const Range& b, double limit) const {
    if (bound_ == Bound::kMemoryRatio) return costs_.MemoryRatio(k, f, b);
    const double compute = costs_.Compute(k, f, b);
    if (compute > limit) return compute;
    return costs_.Fits(k, f, b) ? compute : kInf;
  }
  // Whether a monotone part rules the source out (+inf: over memory, even
  // under t = +inf).
  static bool Over(double m, double t) { return m > t || m == kInf; }
  // The worker's value given its monotone part m (== WorkerCost or MemoryRatio;
  // +inf for both when a weight sync is over the limit, which is not monotone:
  // a source ruled out by it does not rule out the next one).
  double Value(int k, const Range& f, const Range& b, double m) const {
    if (!costs_.SyncsFit(f, b)) return kInf;
    if (bound_ == Bound::kMemoryRatio) return m;
    if (costs_.objective() == BiPartitionObjective::kPaper) {
      return std::max(m, costs_.PaperCut(k, f, b));
    }
    return std::max(m, costs_.Inbound(k, f, b));
  }
  // A value every source of the target reaches anyway (the paper's cut
  // after worker k depends on the target alone).
  double Floor(int k, int f2, int b2) const {
    if (bound_ == Bound::kObjective && costs_.objective() == BiPartitionObjective::kPaper) {
      return costs_.PaperCut(k, {f2, f2}, {b2, b2});
    }
    return 0.0;
  }

  // Whether workers 0..k cannot have done the work before (f2, b2), or
  // workers k+1.. cannot do the rest, each with compute <= t: speed-1 work
  // over a range is at most t * speed for each worker (the full objective's
  // compute only adds to it). The margin covers rounding.
  bool OutOfBand(int k, int f2, int b2, double t) const {
    if (bound_ == Bound::kMemoryRatio || t == kInf || k + 1 == P_) return false;
    const double done = work_f_[f2] + work_b_[b2];
    const double rest = (work_f_[L_] - work_f_[f2]) + (work_b_[L_] - work_b_[b2]);
    const double margin = 1 + 1e-9;
    return done > t * speed_before_[k + 1] * margin || rest > t * speed_after_[k + 1] * margin;
  }

  // Fills level k + 1 from level k; false when it is empty. The later
  // workers must each get a non-empty range.
  bool Level(int k, double t, Pick pick) {
    std::vector<int>& parent = parent_[k + 1];
    std::fill(parent.begin(), parent.end(), -1);
    const Range rows = rows_[k];
    if (full_ && pick == Pick::kFirst) StartFullLevel(k);
    bool any = false;
    for (int f2 = rows.begin; f2 <= L_; ++f2) {
      for (int b2 = 0; b2 <= L_; ++b2) {
        if (k + 1 == P_ ? (f2 != L_ || b2 != L_) : (L_ - f2) + (L_ - b2) < P_ - 1 - k) continue;
        if (Floor(k, f2, b2) > t || OutOfBand(k, f2, b2, t)) continue;
        if (pick == Pick::kBest) {
          any |= FindBest(k, f2, b2, t);
        } else if (full_) {
          any |= FindFirstFull(k, f2, b2, t);
        } else {
          any |= FindFirst(k, f2, b2, t);
        }
      }
    }
    BuildPrev(k + 1);
    return any;
  }

  bool FindFirst(int k, int f2, int b2, double t) {
    const Range rows = rows_[k];
    for (int f = std::min(f2, rows.end); f >= rows.begin; --f) {
      if (f < f2 && Over(Monotone(k, {f, f2}, {b2, b2}, t), t)) return false;
      const int* row = &prev_[k][f * (L_ + 2) + 1];  // row[x]: largest reachable b <= x
      for (int b = row[f == f2 ? b2 - 1 : b2]; b >= 0; b = row[b - 1]) {
        const double m = Monotone(k, {f, f2}, {b, b2}, t);
        if (Over(m, t)) break;
        const double v = Value(k, {f, f2}, {b, b2}, m);
        if (!Over(v, t)) {
          Record(k, f, b, f2, b2, std::max(value_[k][Index(f, b)], v));
          return true;
        }
      }
    }
    return false;
  }

  // FindFirst for the full objective, whose inbound term is not monotone in
  // the source: per row f (F = [f, f2)), the reachable b with compute and
  // memory under t form [bmin, b2] (bmin found by a staircase walk: it only
  // grows as f falls). Within it, by where B = [b, b2) starts relative to F,
  // inbound is (BiPartitionCosts::Inbound term by term)
  //   b == b2 (B empty):    fixed
  //   F empty, or b < f:    fixed + Transfer(b - 1) (routed input; 0 at b = 0)
  //   b == f:               fixed
  //   f < b <= f2:          fixed + weight sync of [f, b), growing with b
  //   b > f2:               fixed + Transfer(b - 1) (routed across a gap)
  // so one candidate per case is the best: the reachable b with the least
  // Transfer(b - 1) (a range-minimum query) or the smallest reachable b.
  // The weight sync limit (SyncsFit, over F \ B) follows the same cases: F \ B
  // is fixed within each but f < b <= f2, where it grows with b.
  // Each candidate is then checked with the exact worker value.
  bool FindFirstFull(int k, int f2, int b2, double t) {
    const Range rows = rows_[k];
    int bmin = -1;
    for (int f = std::min(f2, rows.end); f >= rows.begin; --f) {
      // Every source of this row pays the forward input (F non-empty), and
      // those with B non-empty the gradient too: rule rows out on these
      // first. (Skipping rows keeps bmin a lower bound: it only grows.)
      const double input = f < f2 && f > 0 ? costs_.Transfer(f - 1) : 0.0;
      if (input > t) continue;
      const bool b_may_be_nonempty =
          (b2 > 0 && b2 < L_ ? input + costs_.Transfer(b2 - 1) : input) <= t;
      const Range fr{f, f2};
      auto over = [&](int b) { return Over(Monotone(k, fr, {b, b2}, t), t); };
      if (bmin < 0) {  // first row: binary search for the smallest fitting b
        int lo = 0, hi = b2 + 1;
        while (lo < hi) {
          const int mid = (lo + hi) / 2;
          (mid == b2 && f == f2) || !over(mid) ? hi = mid : lo = mid + 1;
        }
        bmin = lo;
      } else {
        while (bmin <= b2 && over(bmin)) ++bmin;
      }
      if (bmin > b2) return false;  // nothing fits here, nor in any lower row
      auto accept = [&](int b) {
        if (b < 0 || b > b2 || b < bmin || parent_[k][Index(f, b)] < 0) return false;
        if (f == f2 && b == b2) return false;  // both ranges empty
        const Range br{b, b2};
        // b >= bmin: memory fits and compute is within t.
        const double v = Value(k, fr, br, costs_.Compute(k, fr, br));
        if (Over(v, t)) return false;
        Record(k, f, b, f2, b2, std::max(value_[k][Index(f, b)], v));
        return true;
      };
      if (accept(b2)) return true;  // B empty
      if (!b_may_be_nonempty) continue;
      if (f == f2) {
        if (accept(MinKey(k, f, bmin, b2 - 1))) return true;
        continue;
      }
      if (accept(MinKey(k, f, bmin, std::min(f - 1, b2 - 1))) || accept(f) ||
          accept(NextReachable(f, std::max(bmin, f + 1), std::min(f2, b2 - 1))) ||
          accept(MinKey(k, f, std::max(bmin, f2 + 1), b2 - 1))) {
        return true;
      }
    }
    return false;
  }

  // The smallest reachable b in [lo, hi] of row f (StartFullLevel's level), or -1.
  int NextReachable(int f, int lo, int hi) const {
    if (lo > hi) return -1;
    const int b = next_[f * (L_ + 2) + lo];
    return b <= hi ? b : -1;
  }

  // The reachable b in [lo, hi] of row f at level k with the least key
  // Transfer(b - 1) (0 for b = 0), or -1; ties: the smallest b.
  int MinKey(int k, int f, int lo, int hi) {
    lo = std::max(lo, 0);
    if (lo > hi) return -1;
    const int* table = MinKeyRow(k, f);
    int level = 0;
    while ((2 << level) <= hi - lo + 1) ++level;
    const int a = table[level * (L_ + 1) + lo];
    const int b = table[level * (L_ + 1) + hi - (1 << level) + 1];
    return Better(b, a) ? b : a;
  }
  // Reachable beats unreachable (-1), then the smaller key, then the smaller b.
  bool Better(int b, int a) const {
    if (b < 0) return false;
    if (a < 0) return true;
    return keys_[b] < keys_[a] || (keys_[b] == keys_[a] && b < a);
  }

  // Row f's sparse table over level k's reachable states, built on first use
  // in a level: entry [j][b] is the best b' in [b, b + 2^j).
  const int* MinKeyRow(int k, int f) {
    const int n = L_ + 1;
    int* table = &min_key_[static_cast<size_t>(f) * key_levels_ * n];
    if (min_key_stamp_[f] == stamp_) return table;
    min_key_stamp_[f] = stamp_;
    for (int b = 0; b <= L_; ++b) table[b] = parent_[k][Index(f, b)] >= 0 ? b : -1;
    for (int j = 1; j < key_levels_; ++j) {
      const int* below = table + (j - 1) * n;
      int* row = table + j * n;
      for (int b = 0; b + (1 << j) <= n; ++b) {
        const int x = below[b], y = below[b + (1 << (j - 1))];
        row[b] = Better(y, x) ? y : x;
      }
    }
    return table;
  }

  // Starts a level for FindFirstFull: next_ over level k, MinKey rows stale.
  void StartFullLevel(int k) {
    ++stamp_;
    for (int f = 0; f <= L_; ++f) {
      int* next = &next_[f * (L_ + 2)];
      next[L_ + 1] = L_ + 1;
      for (int b = L_; b >= 0; --b) next[b] = parent_[k][Index(f, b)] >= 0 ? b : next[b + 1];
    }
  }

  bool FindBest(int k, int f2, int b2, double t) {
    const Range rows = rows_[k];
    const double floor = Floor(k, f2, b2);
    double best = kInf;
    int from = -1;
    for (int f = std::min(f2, rows.end); f >= rows.begin && best > floor; --f) {
      if (f < f2) {
        const double m = Monotone(k, {f, f2}, {b2, b2}, std::min(t, best));
        if (Over(m, t) || m >= best) break;
      }
      // Full objective: inbound includes the forward input (F non-empty)
      // and, when B is non-empty, the gradient; summed in Inbound's order.
      double lower_nonempty_b = 0.0;
      if (full_) {
        const double input = f < f2 && f > 0 ? costs_.Transfer(f - 1) : 0.0;
        if (input >= best) continue;
        lower_nonempty_b = b2 > 0 && b2 < L_ ? input + costs_.Transfer(b2 - 1) : input;
      }
      const int* row = &prev_[k][f * (L_ + 2) + 1];
      for (int b = row[f == f2 ? b2 - 1 : b2]; b >= 0; b = row[b - 1]) {
        if (b < b2 && lower_nonempty_b >= best) break;
        const double m = Monotone(k, {f, f2}, {b, b2}, std::min(t, best));
        if (Over(m, t) || m >= best) break;
        const double v = std::max(value_[k][Index(f, b)], Value(k, {f, f2}, {b, b2}, m));
        if (v <= t && v < best) {
          best = v;
          from = Index(f, b);
          if (best <= floor) break;
        }
      }
    }
    if (from < 0) return false;
    Record(k, from / stride_, from % stride_, f2, b2, best);
    return true;
  }

  void Record(int k, int f, int b, int f2, int b2, double value) {
    parent_[k + 1][Index(f2, b2)] = Index(f, b);
    value_[k + 1][Index(f2, b2)] = value;
  }

  // prev_[k] row f: entry x + 1 is the largest reachable b <= x (-1: none);
  // rows_[k]: the rows holding a reachable state.
  void BuildPrev(int k) {
    Range rows{L_ + 1, -1};
    for (int f = 0; f <= L_; ++f) {
      int* row = &prev_[k][f * (L_ + 2)];
      row[0] = -1;
      for (int b = 0; b <= L_; ++b) row[b + 1] = parent_[k][Index(f, b)] >= 0 ? b : row[b];
      if (row[L_ + 1] >= 0) rows = {std::min(rows.begin, f), f};
    }
    rows_[k] = rows;
  }

  const BiPartitionCosts& costs_;
  const Bound bound_;
  const int L_, P_, stride_;
  std::vector<std::vector<int>> parent_;
  std::vector<std::vector<double>> value_;
  std::vector<std::vector<int>> prev_;
  std::vector<Range> rows_;  // [first, last] row with a reachable state, per level
  const bool full_;          // objective bound of the full objective
  // FindFirstFull's tables for the current source level: next_ (smallest
  // reachable b >= x per row) and MinKeyRow's sparse tables, valid for rows
  // whose stamp is stamp_.
  std::vector<int> min_key_, next_, min_key_stamp_;
  int key_levels_ = 1, stamp_ = 0;
  std::vector<double> keys_;             // keys_[b]: Transfer(b - 1), 0 for b = 0
  std::vector<double> work_f_, work_b_;  // prefix sums of fwd and bwd
  // Summed speeds of workers [0, k) and [k, P).
  std::vector<double> speed_before_, speed_after_;
  int probes_ = 0;
};

// A lower bound on the optimum of the objective search: the busiest worker
// does at least its share of all work, and some worker runs each pass.
double LowerBound(const BiPartitionProblem& p) {
  double work = 0, biggest = 0, speed_sum = 0, fastest = 0;
  for (size_t u = 0; u < p.fwd.size(); ++u) {
    work += p.fwd[u] + p.bwd[u];
    biggest = std::max({biggest, p.fwd[u], p.bwd[u]});
  }
  for (double s : p.speeds) {
    speed_sum += s;
    fastest = std::max(fastest, s);
  }
  // Margin: the bound is computed with other roundings than the objective.
  return std::max(work / speed_sum, biggest / fastest) * (1 - 1e-9);
}

struct SearchResult {
  bool feasible = false;
  BiPartitionPlan plan;
  int probes = 0;
};

// Once the bracket is this narrow, one exact pass is cheaper than halving on.
constexpr double kExactGap = 1.0 / 64;

// The smallest t with a feasible plan. Feasibility passes (kFirst) bisect a
// bracket (lo, hi] around the optimum, hi always the value of a plan found.
// When a pass finds a plan well below its threshold (values are sparse
// there, as when a few transfer times dominate), a pass just below that
// value follows: when it fails, the value is optimal. Once the bracket is
// narrow, one exact min-max pass (kBest) under hi yields the optimum: it
// only explores states and transitions whose values are <= hi.
SearchResult MinimiseThreshold(const BiPartitionProblem& problem, const BiPartitionCosts& costs,
                               Bound bound, double lower) {
  ThresholdSearch search(problem, costs, bound);
  SearchResult result;
  result.feasible = search.Run(kInf, Pick::kFirst);
  if (result.feasible) {
    result.plan = search.plan();
    double lo = lower, hi = search.value();  // the optimum is in (lo, hi]
    bool proven = false, certify = true;
    while (!proven && (certify || hi - lo > kExactGap * hi)) {
      const double t = certify ? std::nextafter(hi, -kInf) : lo + (hi - lo) / 2;
      if (t <= lo) {
        proven = true;  // no double lies between lo and hi
        break;
      }
      const bool feasible = search.Run(t, Pick::kFirst);
      if (feasible) {
        hi = search.value();
        result.plan = search.plan();
      } else {
        lo = t;
      }
      proven = certify && !feasible;
      certify = !certify && feasible && hi <= lo + (t - lo) / 2;
    }
    if (!proven) {
      search.Run(hi, Pick::kBest);  // feasible: hi is some plan's value
      result.plan = search.plan();
    }
  }
  result.probes = search.probes();
  return result;
}

// No plan, whatever the memory, keeps every unit above the weight sync limit
// on one worker: only with more workers than units (else equal cuts do).
absl::Status NoPlanSyncsError(const BiPartitionProblem& p) {
  std::vector<std::string> units;
  for (size_t u = 0; u < p.weight_bytes.size(); ++u) {
    if (p.weight_bytes[u] > p.max_weight_sync_bytes) units.push_back(absl::StrCat(u));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "no plan keeps both passes of every unit whose weights are above the data plane's limit of ",
      BytesAndGiB(p.max_weight_sync_bytes), " per tensor on one worker (units ",
      absl::StrJoin(units, ", "), "): ", p.speeds.size(), " workers for ", p.fwd.size(),
      " units leave some unit's passes on two workers; use at most ", p.fwd.size(), " workers"));
}

}  // namespace

absl::Status NoPlanFitsError(const BiPartitionProblem& p) {
  const BiPartitionCosts costs(p);
  const SearchResult r = MinimiseThreshold(p, costs, Bound::kMemoryRatio, -1.0);
  if (!r.feasible) return NoPlanSyncsError(p);
  int worst = 0;
  for (int i = 0; i < costs.workers(); ++i) {
    const BiPartitionPlan& plan = r.plan;
    if (costs.MemoryRatio(i, plan.forward[i], plan.backward[i]) >
        costs.MemoryRatio(worst, plan.forward[worst], plan.backward[worst])) {
      worst = i;
    }
  }
  const Range& f = r.plan.forward[worst];
  const Range& b = r.plan.backward[worst];
  const std::string worker =
      worst < static_cast<int>(p.worker_names.size()) ? p.worker_names[worst] : absl::StrCat(worst);
  return absl::ResourceExhaustedError(
      absl::StrCat("no plan fits in memory: even the least overloaded plan needs ",
                   BytesAndGiB(costs.Memory(worst, f, b)), " on worker ", worker, " (",
                   absl::StrFormat("%.2f", costs.MemoryRatio(worst, f, b)), "x its memory_bytes ",
                   BytesAndGiB(p.memory_bytes.empty() ? 0.0 : p.memory_bytes[worst]),
                   ", forward units [", f.begin, ", ", f.end, "), backward units [", b.begin, ", ",
                   b.end, ")); give that worker more memory, add workers, or lower micro_batches"));
}

int FirstOversizedWeightSync(const BiPartitionProblem& p, const std::vector<Range>& forward,
                             const std::vector<Range>& backward) {
  int first = -1;
  for (size_t w = 0; w < forward.size() && !p.weight_bytes.empty(); ++w) {
    for (int u = forward[w].begin; u < forward[w].end; ++u) {
      const bool synced = u < backward[w].begin || u >= backward[w].end;
      if (synced && p.weight_bytes[u] > p.max_weight_sync_bytes && (first < 0 || u < first)) {
        first = u;
      }
    }
  }
  return first;
}

absl::StatusOr<BiPartitionPlan> SolveBiPartition(const BiPartitionProblem& p,
                                                 BiPartitionSolveStats* stats) {
  if (auto s = ValidateProblem(p); !s.ok()) return s;
  const BiPartitionCosts costs(p);
  const SearchResult r = MinimiseThreshold(p, costs, Bound::kObjective, LowerBound(p));
  if (stats != nullptr) stats->probes = r.probes;
  if (!r.feasible) return NoPlanFitsError(p);
  return r.plan;
}

}  // namespace pipetrain
