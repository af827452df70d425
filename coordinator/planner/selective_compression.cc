#include "coordinator/planner/selective_compression.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "common/status_macros.h"

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

double Elements(const std::vector<int64_t>& shape) {
  double numel = 1;
  for (int64_t d : shape) numel *= static_cast<double>(d);
  return numel;
}
double Elements(const ParameterShape& p) { return Elements(p.shape); }

// What one of `tensor_parallel` 1-D tensor ranks holds of `p`: its
// split_dim cut into equal pieces, as Unit::AddParameter cuts it. Whole
// where T does not divide it (the spec's validation refuses such a T
// before a plan is made; priced whole rather than failing here).
std::vector<int64_t> RankShard(const ParameterShape& p, int tensor_parallel) {
  std::vector<int64_t> shard = p.shape;
  if (p.split_dim < 0 || tensor_parallel <= 1 || p.split_dim >= static_cast<int>(shard.size()) ||
      shard[p.split_dim] % tensor_parallel != 0) {
    return shard;
  }
  shard[p.split_dim] /= tensor_parallel;
  return shard;
}

}  // namespace

std::vector<double> PowerSgdByteFractions(const GptConfig& model,
                                          const std::vector<Range>& backward, int rank,
                                          int tensor_parallel) {
  std::vector<double> out;
  for (const Range& r : backward) {
    double raw = 0, sent = 0;
    for (const ParameterShape& p : StageParameters(model, r)) {
      if (p.name == "wte.weight") continue;  // exact, not in the fraction
      // The runtime decides on the shard's shape (PowerSgdPays): a
      // compressed shard sends r (rows / T + cols) values (or r (rows +
      // cols / T)), more than a T-th of the matrix's r (rows + cols), and a
      // row-split shard of few rows goes whole where the matrix would not.
      const std::vector<int64_t> shard = RankShard(p, tensor_parallel);
      const double numel = Elements(shard);
      raw += numel;
      const bool pays =
          shard.size() == 2 && int64_t{rank} * (shard[0] + shard[1]) < shard[0] * shard[1];
      sent += pays ? double(rank) * static_cast<double>(shard[0] + shard[1]) : numel;
    }
    out.push_back(raw > 0 ? sent / raw : 1.0);
  }
  return out;
}

std::vector<double> QuantizerByteFractions(const GptConfig& model,
                                           const std::vector<Range>& backward, const Codec& codec) {
  std::vector<double> out;
  for (const Range& r : backward) {
    int64_t values = 0;
    for (const ParameterShape& p : StageParameters(model, r)) {
      if (p.name != "wte.weight") values += static_cast<int64_t>(Elements(p));
    }
    // At most 1 (the simulator's bound): a stage of a few values, whose
    // encoding's header outweighs them, is counted as sending them raw, a
    // few dozen bytes under what it sends. Named in the spec, it failed the
    // plan with the simulator's bound for a message.
    out.push_back(values > 0
                      ? std::min(1.0, static_cast<double>(codec.EncodedBytes(Shape{values, 1})) /
                                          (4.0 * static_cast<double>(values)))
                      : 1.0);
  }
  return out;
}

absl::StatusOr<CompressedStages> ChooseCompressedStages(const CompressedStepSimulator& simulate,
                                                        const std::vector<double>& fractions,
                                                        double min_gain) {
  CompressedStages out;
  ASSIGN_OR_RETURN(out.simulation, simulate(out.stages));
  while (true) {
    std::map<int, double> end;
    std::set<int> all_reducing;
    for (const TimelineEvent& e : out.simulation.events) {
      end[e.worker] = std::max(end[e.worker], e.end_seconds);
      if (e.kind == TimelineEventKind::kAllReduce || e.kind == TimelineEventKind::kAllReduceWait ||
          e.kind == TimelineEventKind::kAllReduceBucket) {
        all_reducing.insert(e.worker);
      }
    }
    if (end.empty()) break;
    auto last = end.begin();
    for (auto it = end.begin(); it != end.end(); ++it) {
      if (it->second > last->second) last = it;
    }
    const int w = last->first;
    const double fraction = w < static_cast<int>(fractions.size()) ? fractions[w] : 1.0;
    if (all_reducing.count(w) == 0 || !(fraction < 1) ||
        std::find(out.stages.begin(), out.stages.end(), w) != out.stages.end()) {
      break;  // the step ends with work compression cannot shorten
    }
    std::vector<int> trial = out.stages;
    trial.push_back(w);
    std::sort(trial.begin(), trial.end());
    ASSIGN_OR_RETURN(SimulationResult next, simulate(trial));
    double next_end = 0;
    for (const TimelineEvent& e : next.events) {
      if (e.worker == w) next_end = std::max(next_end, e.end_seconds);
    }
    // Its all-reduce was hidden already, or compressing it buys too
    // little: last->second ends the step, so it is the step's length.
    const double gain = last->second - next_end;
    if (!(gain > 0) || gain < min_gain * last->second) break;
    out.stages = std::move(trial);
    out.simulation = std::move(next);
  }
  return out;
}

}  // namespace pipetrain
