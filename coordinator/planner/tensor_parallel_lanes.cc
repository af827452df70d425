#include "coordinator/planner/tensor_parallel_lanes.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace pipetrain {
namespace {

// The all-reduce intervals [start, end) of `pass`, at speed 1 from 0.
std::vector<std::pair<double, double>> AllReduceIntervals(const TensorParallelPass& pass) {
  std::vector<std::pair<double, double>> out;
  if (pass.all_reduce_seconds <= 0) return out;
  const int k = std::max(1, pass.partitions);
  double cm = 0;
  for (int i = 1; i <= k; ++i) {
    const double cp = pass.compute_seconds * i / k;
    const double start = std::max(cp, cm);
    cm = start + pass.all_reduce_seconds;
    out.emplace_back(start, cm);
  }
  return out;
}

}  // namespace

double PassSeconds(const TensorParallelPass& pass) {
  if (pass.charged_seconds >= 0) return pass.charged_seconds;
  const std::vector<std::pair<double, double>> reduces = AllReduceIntervals(pass);
  return reduces.empty() ? pass.compute_seconds : reduces.back().second;
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
    double total = 0;
    for (int u : units) total += PassSeconds(backward ? lanes[u].backward : lanes[u].forward);
    if (total <= 0) continue;
    const double scale = (e.end_seconds - e.start_seconds) / total;
    double offset = 0;
    for (int u : units) {
      const TensorParallelPass& pass = backward ? lanes[u].backward : lanes[u].forward;
      const std::vector<std::pair<double, double>> reduces = AllReduceIntervals(pass);
      for (size_t j = 0; j < reduces.size(); ++j) {
        TimelineEvent r;
        r.worker = e.worker;
        r.kind = TimelineEventKind::kTensorParallelAllReduce;
        r.start_seconds = e.start_seconds + (offset + reduces[j].first) * scale;
        r.end_seconds = e.start_seconds + (offset + reduces[j].second) * scale;
        r.micro_batch = e.micro_batch;
        r.units = Range{u, u + 1};
        r.instruction = e.instruction;
        r.label = absl::StrCat("tensor-parallel all-reduce u", u, " mb", e.micro_batch,
                               backward ? " (backward)" : "", reduces.size() > 1 ? " part " : "",
                               reduces.size() > 1 ? absl::StrCat(j + 1, "/", reduces.size()) : "");
        added.push_back(std::move(r));
      }
      offset += PassSeconds(pass);
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
