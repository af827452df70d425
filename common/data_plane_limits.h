// Limits of the data plane that both sides of a plan must agree on: the
// workers enforce them (worker/transport), the coordinator's planner keeps
// its plans within them (coordinator/planner), so neither depends on the
// other for the number.
#ifndef PIPETRAIN_COMMON_DATA_PLANE_LIMITS_H_
#define PIPETRAIN_COMMON_DATA_PLANE_LIMITS_H_

#include <cstdint>

namespace pipetrain {

// The most bytes one tensor may have on the data plane, decoded (numel x 4
// for fp32): a receiver refuses a larger one at its first frame, before
// allocating it, so a corrupt header cannot make it allocate terabytes
// (FrameAssembler, frame_codec.h). The planner never plans a send above it:
// a unit whose weights (one UNIT_WEIGHTS tensor, all its parameters
// packed) exceed it keeps both its passes on one stage (bipartition.h).
inline constexpr int64_t kMaxDataPlaneTensorBytes = int64_t{4} << 30;

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_DATA_PLANE_LIMITS_H_
