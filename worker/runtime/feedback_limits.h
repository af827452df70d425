// How many replicas' data-parallel error-feedback residuals a checkpoint
// keeps, apart from the runtime so that the planner can count them.
#ifndef PIPETRAIN_WORKER_RUNTIME_FEEDBACK_LIMITS_H_
#define PIPETRAIN_WORKER_RUNTIME_FEEDBACK_LIMITS_H_

namespace pipetrain {

// StageSetup::max_feedback_replicas' default: up to 8 replicas' residuals
// in a checkpoint (8 x the compressed gradients at most), gathered to
// replica 0's writer; past it, their sum (one).
inline constexpr int kMaxFeedbackReplicasKept = 8;

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_RUNTIME_FEEDBACK_LIMITS_H_
