// Which algorithm Collectives::AllReduce runs (collectives.h), as a rule
// the planner can price without the data plane: eq. 3 of AccTFM
// (acctfm.txt) differs by algorithm, and a model that assumed the ring
// for every group charged a small all-reduce of 8 ranks 14 latencies
// where the runtime pays 3.
#ifndef PIPETRAIN_WORKER_COLLECTIVES_ALL_REDUCE_ALGORITHM_H_
#define PIPETRAIN_WORKER_COLLECTIVES_ALL_REDUCE_ALGORITHM_H_

#include <cstdint>

namespace pipetrain {

// CollectiveOptions::small_bytes by default: recursive doubling below
// this many bytes (for a power-of-two group).
inline constexpr int64_t kSmallAllReduceBytes = int64_t{64} << 10;

// Whether Collectives::AllReduce over `members` of a tensor of `bytes` runs
// recursive doubling (log2 n exchanges of the whole tensor) rather than the
// ring: for two members at any size (one exchange), and for a power of two
// below `small_bytes`. AllReduceEncoded does one exchange for two members
// and the ring for more, at any size.
inline bool AllReduceRunsRecursiveDoubling(int members, double bytes,
                                           int64_t small_bytes = kSmallAllReduceBytes) {
  const bool power_of_two = members > 0 && (members & (members - 1)) == 0;
  return members == 2 || (power_of_two && bytes < static_cast<double>(small_bytes));
}

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_COLLECTIVES_ALL_REDUCE_ALGORITHM_H_
