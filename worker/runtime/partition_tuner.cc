#include "worker/runtime/partition_tuner.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "worker/model/partition_count.h"

namespace pipetrain {

std::string PartitionCandidate::ToString() const {
  return absl::StrCat("forward [", absl::StrJoin(forward, ","), "] backward [",
                      absl::StrJoin(backward, ","), "]");
}

PartitionTuner::PartitionTuner(PartitionCandidate planned, const std::vector<bool>& tunable,
                               int samples, int steps_per_candidate)
    : tunable_(tunable), samples_(samples), steps_(steps_per_candidate) {
  PT_CHECK(steps_ >= 1 && samples >= 1 && planned.forward.size() == tunable.size() &&
           planned.backward.size() == tunable.size())
      << "PartitionTuner: bad arguments";
  // As the units run them (Unit::TensorParallelPartitions).
  const auto as_run = [samples](PartitionCandidate c) {
    for (int& k : c.forward) k = PartitionsRun(k, samples);
    for (int& k : c.backward) k = PartitionsRun(k, samples);
    return c;
  };
  candidates_.push_back(as_run(std::move(planned)));
  for (int k : {1, 2, 4}) {
    PartitionCandidate uniform;
    for (size_t u = 0; u < tunable.size(); ++u) {
      uniform.forward.push_back(tunable[u] ? k : candidates_[0].forward[u]);
      uniform.backward.push_back(tunable[u] ? k : candidates_[0].backward[u]);
    }
    uniform = as_run(std::move(uniform));
    bool seen = false;
    for (const PartitionCandidate& c : candidates_) seen = seen || c == uniform;
    if (!seen) candidates_.push_back(std::move(uniform));
  }
  totals_.assign(candidates_.size(), 0.0);
}

int64_t PartitionTuner::tuning_iterations() const {
  return 1 + static_cast<int64_t>(candidates_.size()) * steps_;
}

const PartitionCandidate& PartitionTuner::CandidateFor(int64_t i) const {
  if (decided()) return candidates_[chosen_];
  if (i < 1) return candidates_[0];
  const int64_t c = (i - 1) / steps_;
  return candidates_[c < static_cast<int64_t>(candidates_.size()) ? c : 0];
}

void PartitionTuner::Record(int64_t i, double compute_seconds) {
  if (decided() || i < 1 || i >= tuning_iterations()) return;
  totals_[(i - 1) / steps_] += compute_seconds;
}

bool PartitionTuner::DecidesAfter(int64_t i) const {
  return !decided() && i == tuning_iterations() - 1;
}

int PartitionTuner::Decide(const std::vector<double>& group_totals) {
  PT_CHECK(group_totals.size() == candidates_.size()) << "PartitionTuner::Decide: wrong size";
  int best = 0;
  for (size_t c = 1; c < group_totals.size(); ++c) {
    if (group_totals[c] < group_totals[best]) best = static_cast<int>(c);
  }
  chosen_ = best;
  return best;
}

bool PartitionTuner::Adopt(const PartitionCandidate& choice) {
  if (choice.forward.size() != candidates_[0].forward.size() ||
      choice.backward.size() != candidates_[0].backward.size()) {
    return false;
  }
  for (const std::vector<int>* counts : {&choice.forward, &choice.backward}) {
    for (int k : *counts) {
      if (PartitionsRun(k, samples_) != k) return false;
    }
  }
  for (size_t u = 0; u < tunable_.size(); ++u) {
    if (!tunable_[u] && (choice.forward[u] != candidates_[0].forward[u] ||
                         choice.backward[u] != candidates_[0].backward[u])) {
      return false;
    }
  }
  for (size_t c = 0; c < candidates_.size(); ++c) {
    if (candidates_[c] == choice) {
      chosen_ = static_cast<int>(c);
      return true;
    }
  }
  candidates_.push_back(choice);
  totals_.push_back(0.0);
  chosen_ = static_cast<int>(candidates_.size()) - 1;
  return true;
}

}  // namespace pipetrain
