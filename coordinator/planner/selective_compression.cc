#include "coordinator/planner/selective_compression.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

namespace pipetrain {

namespace {

// The parameters a stage holding units `r` all-reduces, each once (the
// head's copy of the tied wte and embed's are one tensor there).
std::vector<ParameterShape> StageParameters(const GptConfig& model, const Range& r) {
  std::vector<ParameterShape> out;
  std::set<std::string> seen;
  for (int u = r.begin; u < r.end; ++u) {
    for (ParameterShape& p : UnitParameterShapes(model, u)) {
      if (seen.insert(p.name).second) out.push_back(std::move(p));
    }
  }
  return out;
}

double Elements(const ParameterShape& p) {
  double numel = 1;
  for (int64_t d : p.shape) numel *= static_cast<double>(d);
  return numel;
}

}  // namespace

std::vector<double> PowerSgdByteFractions(const GptConfig& model,
                                          const std::vector<Range>& backward, int rank) {
  std::vector<double> out;
  for (const Range& r : backward) {
    double raw = 0, sent = 0;
    for (const ParameterShape& p : StageParameters(model, r)) {
      const double numel = Elements(p);
      raw += numel;
      const bool matrix = p.shape.size() == 2 && p.name != "wte.weight";
      const double factors =
          matrix ? double(rank) * static_cast<double>(p.shape[0] + p.shape[1]) : numel;
      sent += std::min(numel, factors);
    }
    out.push_back(raw > 0 ? sent / raw : 1.0);
  }
  return out;
}

std::vector<double> QuantizerByteFractions(const GptConfig& model,
                                           const std::vector<Range>& backward, const Codec& codec) {
  std::vector<double> out;
  for (const Range& r : backward) {
    int64_t tied = 0, other = 0;
    for (const ParameterShape& p : StageParameters(model, r)) {
      (p.name == "wte.weight" ? tied : other) += static_cast<int64_t>(Elements(p));
    }
    const double raw = 4.0 * static_cast<double>(tied + other);
    const double sent =
        4.0 * static_cast<double>(tied) +
        (other > 0 ? static_cast<double>(codec.EncodedBytes(Shape{other, 1})) : 0.0);
    out.push_back(raw > 0 ? sent / raw : 1.0);
  }
  return out;
}

std::vector<int> ChooseCompressedStages(const SimulationResult& simulation,
                                        const std::vector<double>& fractions) {
  // Each worker's end of the iteration; the all-reduce time it spends at
  // the step (exposed: all of it, or with overlapped buckets the wait for
  // them and what went at the step); and the length of all its
  // all-reduces (buckets included, waits not). A compressed stage
  // all-reduces everything at the step (compressed all-reduces do not
  // overlap: simulator.h), taking `fraction` of the whole, so what follows
  // on the worker (the optimizer step, weight syncs) moves earlier by
  // exposed - fraction * whole: for an overlapped stage that may be
  // nothing, or a loss.
  std::map<int, double> end, all_reduce, whole;
  for (const TimelineEvent& e : simulation.events) {
    end[e.worker] = std::max(end[e.worker], e.end_seconds);
    const double seconds = e.end_seconds - e.start_seconds;
    if (e.kind == TimelineEventKind::kAllReduce || e.kind == TimelineEventKind::kAllReduceWait) {
      all_reduce[e.worker] += seconds;
    }
    if (e.kind == TimelineEventKind::kAllReduce || e.kind == TimelineEventKind::kAllReduceBucket) {
      whole[e.worker] += seconds;
    }
  }
  std::vector<int> chosen;
  while (!end.empty()) {
    auto last = end.begin();
    for (auto it = end.begin(); it != end.end(); ++it) {
      if (it->second > last->second) last = it;
    }
    const int w = last->first;
    if (all_reduce.count(w) == 0 || std::find(chosen.begin(), chosen.end(), w) != chosen.end()) {
      break;  // the step ends with work compression cannot shorten
    }
    const double fraction = w < static_cast<int>(fractions.size()) ? fractions[w] : 1.0;
    const double saved = all_reduce[w] - fraction * whole[w];
    if (!(saved > 0)) break;
    last->second -= saved;
    chosen.push_back(w);
  }
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

}  // namespace pipetrain
