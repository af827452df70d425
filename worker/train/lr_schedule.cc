#include "worker/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace pipetrain {

float LearningRate(const TrainConfig& config, int64_t step) {
  const double lr = config.adam.lr;
  if (step < config.warmup_steps) {
    return static_cast<float>(lr * double(step + 1) / double(config.warmup_steps));
  }
  if (config.lr_schedule == LrSchedule::kConstant) return config.adam.lr;
  const int64_t span = config.steps - config.warmup_steps;
  // Clamped at the last step so that a step past it (no run takes one: a
  // resume with more --steps lays the curve out again over the new total)
  // stays at the floor rather than climbing back up the cosine.
  const double p =
      span > 0 ? std::min(1.0, double(step - config.warmup_steps) / double(span)) : 1.0;
  const double min_lr = config.min_lr;
  return static_cast<float>(min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * p)));
}

const char* LrScheduleName(LrSchedule schedule) {
  return schedule == LrSchedule::kCosine ? "cosine" : "constant";
}

absl::Status ParseLrSchedule(const std::string& field, const std::string& text, LrSchedule* out) {
  if (text == "constant") {
    *out = LrSchedule::kConstant;
  } else if (text == "cosine") {
    *out = LrSchedule::kCosine;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": \"", text.substr(0, 32), "\" is not constant or cosine"));
  }
  return absl::OkStatus();
}

}  // namespace pipetrain
