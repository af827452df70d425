#include "coordinator/planner/acctfm.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/philox.h"
#include "common/status_macros.h"

namespace pipetrain {
namespace {

constexpr int kNumSizes = static_cast<int>(kAccTfmSizes.size());
constexpr int kMaxSize = 4;

// One layer's Alg. 1 line 1 costs: T_cp[l][i] and T_cm[l][i].
struct StepCosts {
  std::array<double, kNumSizes> compute{};
  std::array<double, kNumSizes> comm{};
};

// (E_cp, E_cm[1..count]) after a layer: CalParEnd's return value.
struct Frontier {
  double compute_end = 0;
  int count = 1;
  std::array<double, kMaxSize> comm_end{};
  double LastComm() const { return comm_end[count - 1]; }
};

absl::Status CheckCost(double value, const std::string& field) {
  // At most kMaxAccTfmValue, as a model profile's numbers: sums over at
  // most kMaxAccTfmLayers layers, and beta x bytes, then stay finite (a
  // 1.7e308 cost printed the plan's seconds as null).
  if (value >= 0 && value <= kMaxAccTfmValue) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, " is ", value, "; costs and sizes must be finite, >= 0 and at most 1e18"));
}

absl::Status CheckSizeArray(const std::vector<double>& values, const std::string& field) {
  if (values.size() != kAccTfmSizes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " has ", values.size(), " entries; give one per partition size 1, 2, 4"));
  }
  for (size_t i = 0; i < values.size(); ++i) {
    RETURN_IF_ERROR(CheckCost(values[i], absl::StrCat(field, "[", i, "]")));
  }
  return absl::OkStatus();
}

absl::Status ValidateModel(const AllReduceModel& model) {
  RETURN_IF_ERROR(CheckCost(model.alpha_seconds, "allreduce.alpha_seconds"));
  RETURN_IF_ERROR(CheckCost(model.beta_seconds_per_byte, "allreduce.beta_seconds_per_byte"));
  if (model.group_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("allreduce.group_size is ", model.group_size, "; it must be >= 1"));
  }
  return absl::OkStatus();
}

absl::Status ValidateLayer(const AccTfmLayer& layer, size_t l, bool has_model) {
  const std::string name = absl::StrCat("layers[", l, "]");
  RETURN_IF_ERROR(CheckSizeArray(layer.fwd_compute_seconds, name + ".fwd_compute_seconds"));
  RETURN_IF_ERROR(CheckSizeArray(layer.bwd_compute_seconds, name + ".bwd_compute_seconds"));
  RETURN_IF_ERROR(CheckCost(layer.output_bytes, name + ".output_bytes"));
  if (has_model && !layer.allreduce_seconds.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name,
                     ".allreduce_seconds is given but the problem has an all-reduce model (eq. 3); "
                     "give one or the other"));
  }
  if (!has_model && layer.allreduce_seconds.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name,
                     ".allreduce_seconds is empty and the problem has no all-reduce model; give "
                     "3 entries or set allreduce"));
  }
  if (!has_model) {
    RETURN_IF_ERROR(CheckSizeArray(layer.allreduce_seconds, name + ".allreduce_seconds"));
  }
  return absl::OkStatus();
}

// The validated problem as Alg. 1 line 1's cost table, in pass order.
absl::StatusOr<std::vector<StepCosts>> ResolvePass(const AccTfmProblem& problem, AccTfmPass pass) {
  RETURN_IF_ERROR(ValidateAccTfmProblem(problem));
  std::vector<StepCosts> steps;
  for (const AccTfmLayer& layer : problem.layers) {
    StepCosts step;
    const std::vector<double>& compute =
        pass == AccTfmPass::kForward ? layer.fwd_compute_seconds : layer.bwd_compute_seconds;
    for (int i = 0; i < kNumSizes; ++i) {
      step.compute[i] = compute[i];
      if (problem.allreduce.has_value()) {
        ASSIGN_OR_RETURN(step.comm[i], AllReduceSeconds(*problem.allreduce,
                                                        layer.output_bytes / kAccTfmSizes[i]));
      } else {
        step.comm[i] = layer.allreduce_seconds[i];
      }
    }
    steps.push_back(step);
  }
  if (pass == AccTfmPass::kBackward) std::reverse(steps.begin(), steps.end());
  return steps;
}

// Alg. 1 lines 30-36: the all-reduce end each of the k new micro-partitions
// waits for. ceil(i / r) with r = k / len is ceil(i * len / k), exact in ints.
std::array<double, kMaxSize> SplitOrMerge(const Frontier& prev, int k) {
  std::array<double, kMaxSize> deps{};
  for (int i = 1; i <= k; ++i) {
    const int s = (i * prev.count + k - 1) / k;
    deps[i - 1] = prev.comm_end[s - 1];
  }
  return deps;
}

// Alg. 1 lines 19-28.
Frontier CalParEnd(const Frontier& prev, double t_cp, double t_cm, int k) {
  const std::array<double, kMaxSize> deps = SplitOrMerge(prev, k);  // line 21
  double last_cp = prev.compute_end;                                // line 22
  double last_cm = deps[k - 1];                                     // line 23
  Frontier out;
  out.count = k;
  for (int i = 0; i < k; ++i) {                   // line 24
    last_cp = std::max(deps[i], last_cp) + t_cp;  // line 25
    last_cm = std::max(last_cp, last_cm) + t_cm;  // line 26
    out.comm_end[i] = last_cm;                    // line 27
  }
  out.compute_end = last_cp;
  return out;
}

// The candidate order of lines 7-8 and 11: last all-reduce end, then compute end.
bool Earlier(const Frontier& a, const Frontier& b) {
  if (a.LastComm() != b.LastComm()) return a.LastComm() < b.LastComm();
  return a.compute_end < b.compute_end;
}

// End time of size indices `idx` (pass order) under the timeline model.
double EvaluateSteps(const std::vector<StepCosts>& steps, const std::vector<int>& idx) {
  Frontier f;
  for (size_t l = 0; l < steps.size(); ++l) {
    f = CalParEnd(f, steps[l].compute[idx[l]], steps[l].comm[idx[l]], kAccTfmSizes[idx[l]]);
  }
  return f.LastComm();
}

// Pass-order size indices to model-order sizes.
std::vector<int> ToModelSizes(const std::vector<int>& idx, AccTfmPass pass) {
  std::vector<int> sizes;
  for (int i : idx) sizes.push_back(kAccTfmSizes[i]);
  if (pass == AccTfmPass::kBackward) std::reverse(sizes.begin(), sizes.end());
  return sizes;
}

// Alg. 1 lines 2-17 over the cost table; returns size indices (pass order)
// and the chosen chain's end time.
std::pair<std::vector<int>, double> Algorithm1(const std::vector<StepCosts>& steps) {
  const int num_layers = static_cast<int>(steps.size());
  std::array<Frontier, kNumSizes> frontier{};  // lines 3-4: every size starts at 0
  std::vector<std::array<int, kNumSizes>> par(num_layers);
  for (int l = 0; l < num_layers; ++l) {     // line 5
    std::array<Frontier, kNumSizes> next{};  // tE
    for (int i = 0; i < kNumSizes; ++i) {    // line 6
      for (int j = 0; j < kNumSizes; ++j) {  // lines 7-8: min / argmin over j
        const Frontier c =
            CalParEnd(frontier[j], steps[l].compute[i], steps[l].comm[i], kAccTfmSizes[i]);
        if (j == 0 || Earlier(c, next[i])) {
          next[i] = c;
          par[l][i] = j;
        }
      }
    }
    frontier = next;  // lines 9-10, once all sizes of layer l are evaluated
  }
  int p = 0;  // line 11
  for (int i = 1; i < kNumSizes; ++i) {
    if (Earlier(frontier[i], frontier[p])) p = i;
  }
  const double seconds = frontier[p].LastComm();
  std::vector<int> idx(num_layers);
  for (int l = num_layers - 1; l >= 0; --l) {  // lines 12-16
    idx[l] = p;
    p = par[l][p];
  }
  return {idx, seconds};
}

// Draws uniforms in (0, 1) for RandomAccTfmProblem: the n-th draw of
// instance `index` is Philox of (index, n) under the seed.
class Draws {
 public:
  Draws(uint64_t seed, uint32_t index) : key_(KeyFromSeed(seed)), index_(index) {}
  double Uniform() {
    const PhiloxCounter bits = Philox4x32({index_, next_++, 0xAC7F, 0}, key_);
    return (static_cast<double>(bits[0]) + 0.5) / 4294967296.0;
  }
  double Between(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  double LogBetween(double lo, double hi) { return lo * std::pow(hi / lo, Uniform()); }
  int Pick(int n) { return std::min(n - 1, static_cast<int>(Uniform() * n)); }

 private:
  PhiloxKey key_;
  uint32_t index_;
  uint32_t next_ = 0;
};

AllReduceModel RandomModel(Draws& draw) {
  AllReduceModel model;
  model.algorithm =
      draw.Pick(2) == 0 ? AllReduceAlgorithm::kRing : AllReduceAlgorithm::kRecursiveDoubling;
  model.group_size = std::array<int, 3>{2, 4, 8}[draw.Pick(3)];
  model.alpha_seconds = draw.LogBetween(5e-6, 50e-6);
  model.beta_seconds_per_byte = draw.Pick(2) == 0 ? 1 / 1.25e9 : 1 / 12.5e9;
  return model;
}

// Full-batch all-reduce seconds over forward compute seconds, by regime.
double CommRatio(Draws& draw, uint32_t index) {
  switch (index % 3) {
    case 0:
      return draw.Between(0.1, 0.6);
    case 1:
      return draw.Between(1.5, 4.0);
    default:
      return draw.LogBetween(0.1, 4.0);
  }
}

}  // namespace

absl::StatusOr<AllReduceCoefficients> AllReduceCoefficientsFor(AllReduceAlgorithm algorithm,
                                                               int group_size) {
  if (group_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("allreduce.group_size is ", group_size, "; it must be >= 1"));
  }
  const double n = group_size;
  if (algorithm == AllReduceAlgorithm::kRing) {
    return AllReduceCoefficients{2 * (n - 1), 2 * (n - 1) / n};
  }
  int log2_floor = 0;
  while ((2 << log2_floor) <= group_size) ++log2_floor;
  const bool power_of_two = (group_size & (group_size - 1)) == 0;
  const double steps = log2_floor + (power_of_two ? 0 : 2);
  return AllReduceCoefficients{steps, steps};
}

absl::StatusOr<double> AllReduceSeconds(const AllReduceModel& model, double bytes) {
  RETURN_IF_ERROR(ValidateModel(model));
  RETURN_IF_ERROR(CheckCost(bytes, "all-reduce bytes"));
  ASSIGN_OR_RETURN(AllReduceCoefficients c,
                   AllReduceCoefficientsFor(model.algorithm, model.group_size));
  return model.alpha_seconds * c.c1 + model.beta_seconds_per_byte * c.c2 * bytes;
}

absl::Status ValidateAccTfmProblem(const AccTfmProblem& problem) {
  if (problem.layers.empty()) {
    return absl::InvalidArgumentError("layers is empty; give at least one layer");
  }
  if (problem.layers.size() > static_cast<size_t>(kMaxAccTfmLayers)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layers has ", problem.layers.size(), " entries, over the limit of ", kMaxAccTfmLayers));
  }
  if (problem.allreduce.has_value()) RETURN_IF_ERROR(ValidateModel(*problem.allreduce));
  for (size_t l = 0; l < problem.layers.size(); ++l) {
    RETURN_IF_ERROR(ValidateLayer(problem.layers[l], l, problem.allreduce.has_value()));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> EvaluateSizes(const AccTfmProblem& problem, AccTfmPass pass,
                                     const std::vector<int>& sizes) {
  ASSIGN_OR_RETURN(std::vector<StepCosts> steps, ResolvePass(problem, pass));
  if (sizes.size() != steps.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sizes has ", sizes.size(), " entries for ", steps.size(), " layers"));
  }
  std::vector<int> idx;
  for (size_t l = 0; l < sizes.size(); ++l) {
    const auto it = std::find(kAccTfmSizes.begin(), kAccTfmSizes.end(), sizes[l]);
    if (it == kAccTfmSizes.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sizes[", l, "] is ", sizes[l], "; partition sizes are 1, 2 or 4"));
    }
    idx.push_back(static_cast<int>(it - kAccTfmSizes.begin()));
  }
  if (pass == AccTfmPass::kBackward) std::reverse(idx.begin(), idx.end());
  return EvaluateSteps(steps, idx);
}

absl::StatusOr<AccTfmPassPlan> RunAlgorithm1(const AccTfmProblem& problem, AccTfmPass pass) {
  ASSIGN_OR_RETURN(std::vector<StepCosts> steps, ResolvePass(problem, pass));
  const auto [idx, seconds] = Algorithm1(steps);
  return AccTfmPassPlan{ToModelSizes(idx, pass), seconds};
}

absl::StatusOr<std::array<double, 3>> UniformSizes(const AccTfmProblem& problem, AccTfmPass pass) {
  ASSIGN_OR_RETURN(std::vector<StepCosts> steps, ResolvePass(problem, pass));
  std::array<double, 3> seconds{};
  for (int i = 0; i < kNumSizes; ++i) {
    seconds[i] = EvaluateSteps(steps, std::vector<int>(steps.size(), i));
  }
  return seconds;
}

absl::StatusOr<AccTfmPassPlan> BruteForceAccTfm(const AccTfmProblem& problem, AccTfmPass pass) {
  ASSIGN_OR_RETURN(std::vector<StepCosts> steps, ResolvePass(problem, pass));
  const int num_layers = static_cast<int>(steps.size());
  if (num_layers > kAccTfmMaxBruteForceLayers) {
    return absl::InvalidArgumentError(absl::StrCat(num_layers,
                                                   " layers; brute force takes at most ",
                                                   kAccTfmMaxBruteForceLayers, " (3^L plans)"));
  }
  std::vector<int> code(num_layers, 0), best;  // model order, first layer most significant
  double best_seconds = 0;
  while (true) {
    std::vector<int> idx = code;
    if (pass == AccTfmPass::kBackward) std::reverse(idx.begin(), idx.end());
    const double seconds = EvaluateSteps(steps, idx);
    if (best.empty() || seconds < best_seconds) {
      best = idx;
      best_seconds = seconds;
    }
    int l = num_layers - 1;  // odometer step
    while (l >= 0 && code[l] == kNumSizes - 1) code[l--] = 0;
    if (l < 0) break;
    ++code[l];
  }
  return AccTfmPassPlan{ToModelSizes(best, pass), best_seconds};
}

absl::StatusOr<AccTfmSolution> SolveAccTfm(const AccTfmProblem& problem) {
  AccTfmSolution solution;
  for (AccTfmPass pass : {AccTfmPass::kForward, AccTfmPass::kBackward}) {
    AccTfmPassResult& result = pass == AccTfmPass::kForward ? solution.forward : solution.backward;
    ASSIGN_OR_RETURN(result.algorithm1, RunAlgorithm1(problem, pass));
    ASSIGN_OR_RETURN(result.uniform_seconds, UniformSizes(problem, pass));
    const auto best = std::min_element(result.uniform_seconds.begin(),
                                       result.uniform_seconds.end());  // first on ties
    result.plan = result.algorithm1;
    if (*best < result.algorithm1.seconds) {
      const int size = kAccTfmSizes[best - result.uniform_seconds.begin()];
      result.plan = {std::vector<int>(problem.layers.size(), size), *best};
      result.used_uniform = true;
    }
  }
  return solution;
}

AccTfmProblem RandomAccTfmProblem(uint64_t seed, uint32_t index) {
  Draws draw(seed, index);
  AccTfmProblem problem;
  const bool given_comm = index % 2 == 1;
  if (!given_comm) problem.allreduce = RandomModel(draw);
  const int num_layers = 1 + draw.Pick(kAccTfmMaxBruteForceLayers);
  for (int l = 0; l < num_layers; ++l) {
    AccTfmLayer layer;
    const double fwd = draw.LogBetween(0.5e-3, 20e-3);
    const double bwd = fwd * draw.Between(1.6, 2.4);
    const double overhead = draw.Between(0.0, 0.15);
    const double comm = fwd * CommRatio(draw, index);
    const double latency = comm * draw.Between(0.02, 0.3);
    for (int k : kAccTfmSizes) {
      layer.fwd_compute_seconds.push_back(fwd / k + overhead * fwd);
      layer.bwd_compute_seconds.push_back(bwd / k + overhead * bwd);
      if (given_comm) layer.allreduce_seconds.push_back(comm / k + latency);
    }
    if (!given_comm) {
      // Bytes whose eq. 3 time is `comm` (or, when latency alone exceeds
      // it, a small message: such a layer is latency-bound).
      const AllReduceModel& m = *problem.allreduce;
      const AllReduceCoefficients c = AllReduceCoefficientsFor(m.algorithm, m.group_size).value();
      const double transfer = std::max(comm - m.alpha_seconds * c.c1, 0.05 * comm);
      layer.output_bytes = transfer / (m.beta_seconds_per_byte * c.c2);
    }
    problem.layers.push_back(std::move(layer));
  }
  return problem;
}

}  // namespace pipetrain
