// CoveredRanges: which elements of a tensor have arrived, as disjoint
// [begin, end) ranges, so that a chunk sent twice (or two that overlap)
// counts once. A job's final weights are complete only when every element
// of every tensor is covered; a count of values received would take a
// duplicated chunk for a missing one.
//
//   CoveredRanges r;
//   r.Add(0, 4);
//   r.Add(2, 6);       // overlaps: 6 elements covered, not 8
//   r.covered() == 6;
//
// Memory: one map entry per gap-separated run (chunks arriving in order
// merge into one). Not thread-safe.
#ifndef PIPETRAIN_COORDINATOR_JOBS_COVERED_RANGES_H_
#define PIPETRAIN_COORDINATOR_JOBS_COVERED_RANGES_H_

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>

namespace pipetrain {

class CoveredRanges {
 public:
  // Adds [begin, end). Requires 0 <= begin <= end.
  void Add(int64_t begin, int64_t end) {
    if (begin >= end) return;
    // The first range that could touch [begin, end): the last one starting
    // at or before begin, if it reaches begin.
    auto it = ranges_.upper_bound(begin);
    if (it != ranges_.begin() && std::prev(it)->second >= begin) --it;
    // Absorb every range that touches or overlaps.
    while (it != ranges_.end() && it->first <= end) {
      begin = std::min(begin, it->first);
      end = std::max(end, it->second);
      covered_ -= it->second - it->first;
      it = ranges_.erase(it);
    }
    ranges_.emplace(begin, end);
    covered_ += end - begin;
  }
  // Whether [begin, end) touches or overlaps a run (adding it then makes
  // no new run). Requires 0 <= begin <= end.
  bool Touches(int64_t begin, int64_t end) const {
    auto it = ranges_.upper_bound(end);  // the first run starting past end
    return it != ranges_.begin() && std::prev(it)->second >= begin;
  }
  // Elements covered (the union's size).
  int64_t covered() const { return covered_; }
  // Disjoint runs, for tests.
  int runs() const { return static_cast<int>(ranges_.size()); }

 private:
  std::map<int64_t, int64_t> ranges_;  // begin -> end, disjoint, not touching
  int64_t covered_ = 0;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_JOBS_COVERED_RANGES_H_
