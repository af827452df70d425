// The learning rate of each optimizer step (TrainConfig.lr_schedule), the
// same function for train-local and every pipeline stage, so that they stay
// equal.
//
//   warm-up   step < warmup_steps:  lr * (step + 1) / warmup_steps
//   constant  afterwards:           lr
//   cosine    afterwards:           min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2,
//             p = (step - warmup_steps) / (steps - warmup_steps), from 0 at the
//             first step after warm-up towards 1 at the last (and held at
//             1, min_lr, for any step past `steps`)
//
// `step` is the number of updates already applied (0 for the first).
// Computed in double and rounded once to float.
#ifndef PIPETRAIN_WORKER_TRAIN_LR_SCHEDULE_H_
#define PIPETRAIN_WORKER_TRAIN_LR_SCHEDULE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "worker/train/train_config.h"

namespace pipetrain {

float LearningRate(const TrainConfig& config, int64_t step);

// "constant" | "cosine"; INVALID_ARGUMENT naming `field` otherwise.
absl::Status ParseLrSchedule(const std::string& field, const std::string& text, LrSchedule* out);
// The name ParseLrSchedule takes for `schedule`.
const char* LrScheduleName(LrSchedule schedule);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRAIN_LR_SCHEDULE_H_
