// The paper's own Bi-Partition algorithm (bipartition.txt, eq. 2-3,
// Alg. 1 and Alg. 2 "BSA"), literally: an interval DP
//   A(i1, j1, i2, j2, w0, m) = min over (s1, s2, m') of
//       max( A(i1, s1, i2, s2, w0, m - m'),
//            cut(s1, s2),
//            A(s1, j1, s2, j2, w0 + m - m', m') )
// over forward range [i1, j1), backward range [i2, j2) and the m workers
// w0 .. w0+m-1 (0-based, half-open; the paper's 1-based inclusive
// F_{i1}..F_{j1} is [i1-1, j1) here, and its split "s1" — the last unit of
// the first part — is the first part's end count s1 here). Workers are
// ordered and may differ in speed and memory, so a sub-problem names the
// workers it gets (w0) and not only how many (the paper's m assumes
// identical workers).
//
// It is far slower than SolveBiPartition: O(L^6 · P^3) with the exhaustive
// s2 loop, O(L^5 log L · P^3) with BSA (the paper's O(L^5 log L · M^2) times
// P for the worker offset w0), and O(L^4 · P^2) memory. It exists as a test
// reference that implements the paper as written, and to be timed.
// Thread-safe; pure.
#ifndef PIPETRAIN_COORDINATOR_PLANNER_BIPARTITION_INTERVAL_H_
#define PIPETRAIN_COORDINATOR_PLANNER_BIPARTITION_INTERVAL_H_

#include "absl/status/statusor.h"
#include "coordinator/planner/bipartition.h"

namespace pipetrain {

// How the backward split s2 is chosen for each (s1, m').
enum class SplitSearch {
  kExhaustive,  // every s2: exact (the test reference)
  kBinary,      // Alg. 2 (BSA): binary search on A(U1) <= A(U2). The paper
                // argues A(U1) grows and A(U2) shrinks with s2; that holds
                // for compute alone, not once cut or memory terms enter, so
                // BSA can miss the optimum (the tests report how often).
};

// Solves `problem` (either objective; for the full objective there is no cut
// term and each worker's value is max(compute, inbound)). The plan's
// bottleneck is the DP's A(0, L, 0, L, 0, P), which equals
// Objective(problem, plan). Errors: as ValidateProblem; INVALID_ARGUMENT when
// the table would exceed 2^25 entries (use SolveBiPartition); RESOURCE_EXHAUSTED
// as SolveBiPartition when no plan fits in memory.
absl::StatusOr<BiPartitionPlan> SolveBiPartitionInterval(const BiPartitionProblem& problem,
                                                         SplitSearch s2_search);

// How many (s1, s2, m') combinations SolveBiPartitionInterval evaluates for
// `units` and `workers` (an upper bound for kBinary): the benchmark's work
// estimate. Requires units >= 1, workers >= 1.
double IntervalDpEvaluations(int units, int workers, SplitSearch s2_search);

}  // namespace pipetrain

#endif  // PIPETRAIN_COORDINATOR_PLANNER_BIPARTITION_INTERVAL_H_
