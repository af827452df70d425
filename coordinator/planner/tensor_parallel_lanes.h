// The tensor-parallel all-reduces of a simulated iteration, drawn on their
// own lane (issue 22 scope 5): where each unit's all-reduces run while the
// rank computes, AccTFM's overlap made visible.
//
// The simulator charges each unit of a tensor-parallel job what one rank
// spends on it (TensorParallelUnitCosts: its compute plus the all-reduce
// time its partitions do not hide). A pass of a unit on one rank, at speed
// 1, is the timeline of acctfm.h for that unit alone: K partitions of
// compute c / K each, back to back; partition i's all-reduce (a seconds)
// starts when its compute ends and the previous all-reduce is done:
//   cp_i = i c / K,   cm_i = max(cp_i, cm_{i-1}) + a,   cm_0 = 0,
// and the pass ends at cm_K (at c when it has no all-reduce). The
// embedding's forward and the head's passes are one partition whose
// all-reduce follows the compute (the head's forward: its two small
// all-reduces as one). Block units that stream into each other run as one
// chain of such timelines (acctfm.h's dep[] rule; AddTensorParallelLanes).
//
// All functions are pure and thread-safe.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_TENSOR_PARALLEL_LANES_H_
#define PIPETRAIN_COORDINATOR_PLANNER_TENSOR_PARALLEL_LANES_H_

#include <cstdint>
#include <vector>

#include "coordinator/planner/simulator.h"

namespace pipetrain {

// One unit's pass on one rank, one micro-batch, at speed 1.
struct TensorParallelPass {
  double compute_seconds = 0;     // all partitions together
  int partitions = 1;             // >= 1
  double all_reduce_seconds = 0;  // each partition's; 0: no all-reduce
  // >= 0: what the simulator charges instead of the unit-alone timeline's
  // end (a block unit whose partitions stream into its neighbours',
  // tensor_partitions.h); the lane chains such units (below).
  double charged_seconds = -1;
};

struct TensorParallelUnitLanes {
  TensorParallelPass forward, backward;
};

// The pass's end, cm_K above, or charged_seconds when set: what the
// simulator charges for it.
double PassSeconds(const TensorParallelPass& pass);

// The most all-reduce events AddTensorParallelLanes adds by default. A job
// within the planning budget (kMaxStageMicroBatches) may still have units x
// partitions all-reduces in each of its stage-micro-batches: 1.6 million
// events, hundreds of MB of SVG and trace JSON, for 4096 micro-batches of a
// 24-layer model in 4 partitions. As the measured timeline's
// kMaxMeasuredTimelineTimings.
inline constexpr int64_t kMaxTensorParallelLaneEvents = 50000;

// What AddTensorParallelLanes drew: the all-reduces of micro-batches
// [0, micro_batches_drawn) of micro_batches.
struct TensorParallelLanesDrawn {
  int micro_batches_drawn = 0;
  int micro_batches = 0;  // 1 + the largest micro-batch of a pass event
};

// Adds a kTensorParallelAllReduce event for every all-reduce of the units
// of every forward, recompute and backward event of `result` (recompute
// runs the forward's all-reduces again). The event's units run as one
// acctfm.h chain in the event's order (forward: units ascending; backward:
// descending): a unit with charged_seconds set streams its partitions
// from the one before when that has it set too (the dep[] rule, as the
// charges assume), and any other starts when the chain so far has ended.
// The chain runs at the position's speed as the simulator charges it
// (simulator.h: compute / speed + comm): the passes' compute (timed at the
// groups' speed g) is scaled by g / s, recovered from the event's length
// as what remains after the waits (TensorParallelCostsOf's split of
// PassSeconds), and the all-reduces keep their length. At the groups'
// speed, a chain that starts at the first block unit ends with the event.
// Where the event is shorter than the chain, the drawing is scaled down
// to fit it, all-reduces included: a position faster than the groups'
// speed (the planner prices its waits at the slowest position's compute,
// which hides more of them), or a stage that starts inside a run of block
// units (the charges credit its first unit with overlap the runtime waits
// out at the cut). So every all-reduce ends within its event and none
// overlap. lanes[u] describes unit u; units beyond it or without
// all-reduces add nothing (an event's length is assumed to be its units'
// costs). Only the all-reduces of the first micro-batches are added, as
// many whole micro-batches as fit in max_events (none when the first does
// not). Keeps the events sorted by (worker, start, instruction).
TensorParallelLanesDrawn AddTensorParallelLanes(const std::vector<TensorParallelUnitLanes>& lanes,
                                                SimulationResult* result,
                                                int64_t max_events = kMaxTensorParallelLaneEvents);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_TENSOR_PARALLEL_LANES_H_
