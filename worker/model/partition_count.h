// How many AccTFM partitions (acctfm.txt §4.2) a pass over a micro-batch
// really runs: a partition is a run of whole samples, so a count is cut to
// gcd(count, samples), a divisor of the samples. One rule for the units
// that cut (Unit::TensorParallelPartitions) and for the tuner that must
// hold its candidates as they run (worker/runtime/partition_tuner.h).
#ifndef PIPETRAIN_WORKER_MODEL_PARTITION_COUNT_H_
#define PIPETRAIN_WORKER_MODEL_PARTITION_COUNT_H_

#include <algorithm>
#include <numeric>

namespace pipetrain {

// `count` partitions asked (below 1 counts as 1) over `samples` >= 1
// samples: the partitions run.
inline int PartitionsRun(int count, int samples) {
  return std::gcd(std::max(1, count), samples);
}

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_PARTITION_COUNT_H_
