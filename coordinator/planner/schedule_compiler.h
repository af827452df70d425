// ScheduleCompiler: turns a plan into one program per worker for one
// iteration (DESIGN.md §5). Every cross-worker need is an explicit Send/Recv.
//
// Worker w runs the forward pass of units F_w and the backward pass of B_w
// (equal-cut plans: F_w == B_w). fo(u) and bo(u) are the forward and
// backward owners of unit u; bo(u) holds u's authoritative weights and
// optimizer state. For micro-batch k:
//   F(k): Recv ACTIVATION(F.begin-1, k) from fo(F.begin-1) (F.begin > 0);
//         Forward(F, k); Send ACTIVATION(F.end-1, k) to fo(F.end) (F.end < L);
//         Send ACTIVATION(u, k) to worker v when v recomputes from the output
//         of u and u's forward ran here (input routing, below)
//   B(k): Recv the routed input, if any; Recompute each run of B \ F (units
//         whose forward ran elsewhere: their saved tensors are rebuilt here
//         from the run's input, which is this worker's own forward output
//         when the run follows F, else received from the forward owner);
//         Recv ACTIVATION_GRAD(B.end, k) from bo(B.end) (B.end < L);
//         Backward(B, k); Send ACTIVATION_GRAD(B.begin, k) to bo(B.begin-1)
// An empty F or B emits nothing for that pass. Order of F and B per schedule
// with m micro-batches (P workers):
//   gpipe  F(0..m-1), then B(0..m-1)
//   1f1b   w = min(P-1-s, m) warm-up forwards, then F(w+i), B(i) pairs for
//          i < m-w, then the cool-down B(m-w..m-1); at most P-s micro-batches
//          are in flight on worker s.
// Backward always visits micro-batches in order 0..m-1, so parameter
// gradients accumulate in the same order as in single-process training.
// After the last backward, bo(embed) and bo(head) exchange their parts of
// the tied wte gradient (Send then Recv; one worker owning both sums
// locally) and AddTiedGradient; then OptimizerStep(B); then weight sync:
// Send UNIT_WEIGHTS(u) to fo(u) for u in B with fo(u) != w, and
// Recv UNIT_WEIGHTS(u) from bo(u) for u in F with bo(u) != w, so every
// forward pass of the next iteration sees the updated weights. Sends never
// block (they are buffered by the receiver's mailbox); the tests run every
// small plan to completion to show these programs cannot deadlock. Every
// Send and Recv is LINK_PATH_WIRE (device_links.h moves some to the device).
#ifndef PIPETRAIN_COORDINATOR_PLANNER_SCHEDULE_COMPILER_H_
#define PIPETRAIN_COORDINATOR_PLANNER_SCHEDULE_COMPILER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/planner/partition.h"
#include "proto/pipetrain/v1/plan.pb.h"

namespace pipetrain {

enum class Schedule { kOneFOneB, kGPipe };

// The wire form of a unit range.
v1::UnitRange ToUnitRange(const Range& range);

// "1f1b" | "gpipe"; INVALID_ARGUMENT otherwise.
absl::StatusOr<Schedule> ParseSchedule(const std::string& name);
std::string ScheduleName(Schedule schedule);

// Equal cuts. INVALID_ARGUMENT unless `ranges` are non-empty, contiguous
// and cover [0, num_units) exactly, and micro_batches >= 1.
absl::StatusOr<std::vector<v1::Program>> CompilePrograms(const std::vector<Range>& ranges,
                                                         int num_units, int micro_batches,
                                                         Schedule schedule);

// INVALID_ARGUMENT unless both sequences have one range per worker, each
// sequence's ranges follow each other from unit 0 to num_units (empty
// ranges allowed) and no worker has both ranges empty.
absl::Status ValidateBiPartitionRanges(const std::vector<Range>& forward,
                                       const std::vector<Range>& backward, int num_units);

// Separate forward and backward cuts (Bi-Partition, bipartition.txt eq. 1).
// INVALID_ARGUMENT as ValidateBiPartitionRanges, and unless micro_batches >= 1.
absl::StatusOr<std::vector<v1::Program>> CompileBiPartitionPrograms(
    const std::vector<Range>& forward, const std::vector<Range>& backward, int num_units,
    int micro_batches, Schedule schedule);

// The forward-only validation program of each worker (Assignment.
// eval_program): per validation micro-batch k, a worker with a non-empty
// forward range receives EVAL_ACTIVATION of unit begin-1 from its forward
// owner (unless it runs embed), runs Forward{validation} of its range and
// sends EVAL_ACTIVATION of unit end-1 to the forward owner of unit end
// (unless it runs head). Workers without forward units get an empty
// program. INVALID_ARGUMENT unless `forward` follows on from unit 0 to
// num_units (empty ranges allowed) and micro_batches >= 1.
absl::StatusOr<std::vector<v1::Program>> CompileEvalPrograms(const std::vector<Range>& forward,
                                                             int num_units, int micro_batches);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_SCHEDULE_COMPILER_H_
