// ScheduleCompiler: turns a partition into one program per stage for one
// iteration (DESIGN.md §5). Every cross-stage need is an explicit Send/Recv.
//
// For stage s of P owning units [b, e), micro-batch k:
//   F(k): Recv ACTIVATION(b-1, k) from s-1 (s > 0); Forward([b,e), k);
//         Send ACTIVATION(e-1, k) to s+1 (s < P-1)
//   B(k): Recv ACTIVATION_GRAD(e, k) from s+1 (s < P-1); Backward([b,e), k);
//         Send ACTIVATION_GRAD(b, k) to s-1 (s > 0)
// Order of F and B per schedule with m micro-batches:
//   gpipe  F(0..m-1), then B(0..m-1)
//   1f1b   w = min(P-1-s, m) warm-up forwards, then F(w+i), B(i) pairs for
//          i < m-w, then the cool-down B(m-w..m-1); at most P-s micro-batches
//          are in flight on stage s.
// Backward always visits micro-batches in order 0..m-1, so parameter
// gradients accumulate in the same order as in single-process training.
// After the last backward the stages holding embed (0) and head (P-1)
// exchange their parts of the tied wte gradient (Send then Recv; with P = 1
// the one stage owns both) and AddTiedGradient; then OptimizerStep over the
// stage's units. Sends never block (they are buffered by the receiver's
// mailbox), so these programs cannot deadlock.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_SCHEDULE_COMPILER_H_
#define PIPETRAIN_COORDINATOR_PLANNER_SCHEDULE_COMPILER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/planner/partition.h"
#include "proto/pipetrain/v1/plan.pb.h"

namespace pipetrain {

enum class Schedule { kOneFOneB, kGPipe };

// "1f1b" | "gpipe"; INVALID_ARGUMENT otherwise.
absl::StatusOr<Schedule> ParseSchedule(const std::string& name);
std::string ScheduleName(Schedule schedule);

// INVALID_ARGUMENT unless `ranges` are non-empty, contiguous and cover
// [0, num_units) exactly, and micro_batches >= 1.
absl::StatusOr<std::vector<v1::Program>> CompilePrograms(const std::vector<Range>& ranges,
                                                         int num_units, int micro_batches,
                                                         Schedule schedule);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_SCHEDULE_COMPILER_H_
