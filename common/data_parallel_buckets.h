// The size of the buckets the data-parallel gradient all-reduce is cut
// into, shared by the runtime that fills them
// (worker/runtime/stage_runtime.h, StageSetup::data_parallel_bucket_bytes)
// and the simulator that predicts them (coordinator/planner/simulator.h,
// SimulationCosts::all_reduce_bucket_bytes), so that a plan's prediction
// counts the collectives the workers run.
//
// Why 4 MiB: a bucket costs one collective's latency (2(D-1) ring steps),
// so small buckets pay it often; a large one starts late, after the
// backward passes of all its units, and leaves more of the all-reduce to
// the optimizer step. At 1 Gbit/s and 0.5 ms a 4 MiB bucket spends about
// 3 % of its time in latency with two replicas.
#ifndef PIPETRAIN_COMMON_DATA_PARALLEL_BUCKETS_H_
#define PIPETRAIN_COMMON_DATA_PARALLEL_BUCKETS_H_

#include <cstdint>

namespace pipetrain {

inline constexpr int64_t kDataParallelBucketBytes = int64_t{4} << 20;

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_DATA_PARALLEL_BUCKETS_H_
