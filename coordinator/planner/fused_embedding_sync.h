// Fused embedding synchronization (Optimus-CC §6): with data parallelism,
// the tied embedding's gradient is reduced in one collective over the
// embed and head owners of every replica, instead of an exchange between
// the two owners (TIED_EMBEDDING_GRAD) followed by each owner's all-reduce
// over the replicas. Per the paper's cost model (ring all-reduce of volume
// V over R ranks costs 2V (R-1)/R), the unfused pair costs
// V + 2V (D-1)/D = V (3D-2)/D (eq. 15) and the fused one V (2D-1)/D
// (eq. 16): the unfused costs 1.43 times the fused at D = 4 (the paper's
// "42.9%"), approaching 1.5 times.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_FUSED_EMBEDDING_SYNC_H_
#define PIPETRAIN_COORDINATOR_PLANNER_FUSED_EMBEDDING_SYNC_H_

#include <vector>

#include "absl/status/status.h"
#include "coordinator/planner/partition.h"
#include "proto/pipetrain/v1/plan.pb.h"

namespace pipetrain {

// Rewrites one replica's programs (compiled by CompileBiPartitionPrograms
// for `backward`, one range per stage): when the embedding's (unit 0) and
// the head's (last unit) backward passes run on different stages, their
// TIED_EMBEDDING_GRAD Send and Recv go and their AddTiedGradient becomes
// fused (plan.proto AddTiedGradient). Returns whether it fused; programs
// of a single owner are left alone. INTERNAL when the programs do not have
// the exchange the compiler emits.
absl::StatusOr<bool> FuseEmbeddingSync(const std::vector<Range>& backward,
                                       std::vector<v1::Program>* programs);

// FuseEmbeddingSync with each stage's backward range read from its
// program (the span of its Backward instructions' units): for programs
// whose ranges the caller no longer has (the solver's candidates, which
// the simulator prices as the workers will run them).
absl::StatusOr<bool> FuseEmbeddingSyncOfPrograms(std::vector<v1::Program>* programs);

// The costs of eq. 15 and 16 for a tied embedding of `bytes` over D
// replicas, in bytes sent per owner (the cost model's volume units).
double UnfusedEmbeddingSyncVolume(double bytes, int replicas);  // eq. 15
double FusedEmbeddingSyncVolume(double bytes, int replicas);    // eq. 16

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_FUSED_EMBEDDING_SYNC_H_
