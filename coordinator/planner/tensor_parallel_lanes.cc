#include "coordinator/planner/tensor_parallel_lanes.h"

#include <algorithm>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pipetrain {
namespace {

// Where acctfm.h's chain stands after a unit: its compute end E_cp and the
// end of each of its partitions' all-reduces E_cm[1..K'].
struct ChainState {
  double compute_end = 0;
  std::vector<double> reduce_ends = {0};
};

// Runs `pass` on the chain, its compute times compute_scale, and appends
// its all-reduce intervals [start, end) to *reduces (none when it has no
// all-reduce). A streamed pass takes its partitions' dependencies from the
// unit before by acctfm.h's dep[] rule; any other starts when the chain so
// far has ended (its own K partitions from E_cp = E_cm = that end).
void RunPass(const TensorParallelPass& pass, double compute_scale, bool streamed,
             ChainState* state, std::vector<std::pair<double, double>>* reduces) {
  if (!streamed) {
    const double end = std::max(state->compute_end, state->reduce_ends.back());
    *state = ChainState{end, {end}};
  }
  const int k = std::max(1, pass.partitions);
  const int before = static_cast<int>(state->reduce_ends.size());
  const double a = std::max(0.0, pass.all_reduce_seconds);
  double cp = state->compute_end, cm = state->reduce_ends.back();
  std::vector<double> ends;
  for (int i = 1; i <= k; ++i) {
    const double dep = state->reduce_ends[(i * before + k - 1) / k - 1];
    cp = std::max(dep, cp) + pass.compute_seconds * compute_scale / k;
    const double start = std::max(cp, cm);
    cm = start + a;
    ends.push_back(cm);
    if (a > 0) reduces->emplace_back(start, cm);
  }
  *state = ChainState{cp, std::move(ends)};
}

// The all-reduce intervals of `pass` alone, at speed 1 from 0.
std::vector<std::pair<double, double>> AllReduceIntervals(const TensorParallelPass& pass) {
  ChainState state;
  std::vector<std::pair<double, double>> out;
  RunPass(pass, 1, false, &state, &out);
  return out;
}

// The factor g / s by which the simulator scaled the compute of `passes`
// into an event of `seconds`: it charges each pass its compute (at most
// PassSeconds) times g / s plus the rest of PassSeconds, the waits, as is
// (TensorParallelCostsOf). 1 without compute.
double ComputeScale(const std::vector<const TensorParallelPass*>& passes, double seconds) {
  double compute = 0, waits = 0;
  for (const TensorParallelPass* pass : passes) {
    const double charged = PassSeconds(*pass);
    const double computing = std::min(charged, pass->compute_seconds);
    compute += computing;
    waits += charged - computing;
  }
  return compute > 0 ? std::max(0.0, (seconds - waits) / compute) : 1.0;
}

}  // namespace

double PassSeconds(const TensorParallelPass& pass) {
  if (pass.charged_seconds >= 0) return pass.charged_seconds;
  ChainState state;
  std::vector<std::pair<double, double>> reduces;
  RunPass(pass, 1, false, &state, &reduces);
  return state.reduce_ends.back();
}

TensorParallelLanesDrawn AddTensorParallelLanes(const std::vector<TensorParallelUnitLanes>& lanes,
                                                SimulationResult* result, int64_t max_events) {
  const auto is_pass = [](const TimelineEvent& e) {
    return e.micro_batch >= 0 &&
           (e.kind == TimelineEventKind::kForward || e.kind == TimelineEventKind::kBackward ||
            e.kind == TimelineEventKind::kRecompute);
  };
  // How many all-reduces each micro-batch's passes add, to draw as many
  // whole micro-batches as max_events allows.
  std::vector<int64_t> per_micro_batch;
  for (const TimelineEvent& e : result->events) {
    if (!is_pass(e)) continue;
    if (static_cast<size_t>(e.micro_batch) >= per_micro_batch.size()) {
      per_micro_batch.resize(e.micro_batch + 1, 0);
    }
    const bool backward = e.kind == TimelineEventKind::kBackward;
    for (int u = e.units.begin; u < e.units.end && u < static_cast<int>(lanes.size()); ++u) {
      per_micro_batch[e.micro_batch] +=
          AllReduceIntervals(backward ? lanes[u].backward : lanes[u].forward).size();
    }
  }
  TensorParallelLanesDrawn drawn;
  drawn.micro_batches = static_cast<int>(per_micro_batch.size());
  int64_t events = 0;
  while (drawn.micro_batches_drawn < drawn.micro_batches &&
         events + per_micro_batch[drawn.micro_batches_drawn] <= max_events) {
    events += per_micro_batch[drawn.micro_batches_drawn++];
  }
  std::vector<TimelineEvent> added;
  for (const TimelineEvent& e : result->events) {
    if (!is_pass(e) || e.micro_batch >= drawn.micro_batches_drawn) continue;
    const bool backward = e.kind == TimelineEventKind::kBackward;
    // The passes of the event's units in the order they run.
    std::vector<int> units;
    for (int u = e.units.begin; u < e.units.end && u < static_cast<int>(lanes.size()); ++u) {
      units.push_back(u);
    }
    if (backward) std::reverse(units.begin(), units.end());
    std::vector<const TensorParallelPass*> passes;
    for (int u : units) passes.push_back(backward ? &lanes[u].backward : &lanes[u].forward);
    // One chain through the event's units at the position's speed: its
    // compute scaled as the simulator scaled it, the all-reduces not.
    const double seconds = e.end_seconds - e.start_seconds;
    const double compute_scale = ComputeScale(passes, seconds);
    ChainState state;
    std::vector<std::vector<std::pair<double, double>>> reduces(units.size());
    for (size_t i = 0; i < units.size(); ++i) {
      const bool streamed =
          i > 0 && passes[i - 1]->charged_seconds >= 0 && passes[i]->charged_seconds >= 0;
      RunPass(*passes[i], compute_scale, streamed, &state, &reduces[i]);
    }
    // Where the event is shorter than the chain (the simulation charges
    // less than it: see the header), the drawing shrinks to fit it.
    const double chain = std::max(state.compute_end, state.reduce_ends.back());
    const double fit = chain > seconds && chain > 0 ? seconds / chain : 1.0;
    for (size_t i = 0; i < units.size(); ++i) {
      const int u = units[i];
      for (size_t j = 0; j < reduces[i].size(); ++j) {
        TimelineEvent r;
        r.worker = e.worker;
        r.kind = TimelineEventKind::kTensorParallelAllReduce;
        r.start_seconds = e.start_seconds + reduces[i][j].first * fit;
        r.end_seconds = std::min(e.end_seconds, e.start_seconds + reduces[i][j].second * fit);
        r.micro_batch = e.micro_batch;
        r.units = Range{u, u + 1};
        r.instruction = e.instruction;
        const size_t n = reduces[i].size();
        r.label = absl::StrCat("tensor-parallel all-reduce u", u, " mb", e.micro_batch,
                               backward ? " (backward)" : "", n > 1 ? " part " : "",
                               n > 1 ? absl::StrCat(j + 1, "/", n) : "");
        added.push_back(std::move(r));
      }
    }
  }
  result->events.insert(result->events.end(), added.begin(), added.end());
  std::stable_sort(result->events.begin(), result->events.end(),
                   [](const TimelineEvent& a, const TimelineEvent& b) {
                     return std::tie(a.worker, a.start_seconds, a.instruction) <
                            std::tie(b.worker, b.start_seconds, b.instruction);
                   });
  return drawn;
}

}  // namespace pipetrain
