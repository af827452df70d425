// Training that has diverged stops instead of running on: once a step's
// loss is NaN or infinite, the weights the next steps would update are
// (almost always) NaN already, and every later step only burns time. The
// reference trainer (`pipetrain train-local`) and the coordinator (for
// jobs) apply the same check to the same step loss, and to a validation
// pass's loss, so a job and train-local stop at the same step.
//
// Thread-safety: a pure function.
#ifndef PIPETRAIN_WORKER_TRAIN_DIVERGENCE_H_
#define PIPETRAIN_WORKER_TRAIN_DIVERGENCE_H_

#include <cstdint>

#include "absl/status/status.h"

namespace pipetrain {

// OK when `loss` (the mean loss of optimizer step `step`, 1-based) is
// finite; otherwise FAILED_PRECONDITION saying which step and value, and
// what usually helps (a lower learning rate, a warm-up, gradient clipping).
absl::Status CheckLossFinite(int64_t step, float loss);

// The same verdict for weights: `found` is the error of a finiteness check
// of the weights after step `step` (weights_io.h CheckParametersFinite).
// OK when `found` is; otherwise FAILED_PRECONDITION with its message. An
// infinite gradient element breaks the weights while its step's loss is
// still finite, so after the last step only the weights can tell: the job
// (and train-local) fails rather than export them.
absl::Status CheckWeightsAfterStep(int64_t step, const absl::Status& found);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRAIN_DIVERGENCE_H_
