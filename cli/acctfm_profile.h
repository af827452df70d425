// The AccTFM profile file read by `pipetrain plan --solver acctfm`, and the
// JSON the command prints (docs/formats.md):
//
// {"layers": [{"name": "block0", "fwd_seconds": [t1, t2, t4],
//              "bwd_seconds": [t1, t2, t4],
//              "allreduce_seconds": [c1, c2, c4],   // or, with "allreduce":
//              "output_bytes": 6291456}, ...],
//  "allreduce": {"alpha_seconds": 5e-6, "beta_seconds_per_byte": 4e-11,
//                "group_size": 4, "algorithm": "ring" | "recursive_doubling"}}
//
// Seconds are those of ONE micro-partition at sizes 1, 2 and 4 (acctfm.h).
// Errors are INVALID_ARGUMENT naming the field ("layers[2].fwd_seconds: ...").
#ifndef PIPETRAIN_CLI_ACCTFM_PROFILE_H_
#define PIPETRAIN_CLI_ACCTFM_PROFILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "coordinator/planner/acctfm.h"

namespace pipetrain {

absl::StatusOr<AccTfmProblem> ParseAccTfmProfileJson(const std::string& json);

// {"solver": "acctfm", "forward": {"partition_sizes": [...], "seconds": s},
//  "backward": {...}, "uniform": {"1": s, "2": s, "4": s}} where uniform is
// forward + backward seconds with every layer at that size; `indent` < 0
// prints one line.
std::string AccTfmSolutionJson(const AccTfmSolution& solution, int indent);

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_ACCTFM_PROFILE_H_
