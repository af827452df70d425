#include "cli/job_progress.h"

namespace pipetrain {

std::optional<ProgressSample> JobProgressView::Poll(const v1::Job& job, absl::Time now) {
  const int64_t step = job.progress().step(), steps = job.spec().training().steps();
  if (first_step_ < 0) first_step_ = step;
  const int64_t val_step = job.progress().val_step();
  const bool new_val = val_step > last_val_step_ && val_step > first_step_;
  const bool new_step = step != last_step_ && step > first_step_;
  if (!new_step && !new_val) return std::nullopt;
  ProgressSample sample{step,
                        steps,
                        job.progress().loss(),
                        std::nullopt,
                        job.progress().tokens_per_second(),
                        -1,
                        job.progress().recoveries()};
  if (new_val) {
    sample.val_loss = job.progress().val_loss();
    sample.val_step = val_step;
    last_val_step_ = val_step;
  }
  // -1 is shown as "?": one step seen gives no rate yet.
  if (rate_step_ < 0) {
    rate_step_ = step;
    rate_since_ = now;
  } else if (step > rate_step_) {
    sample.eta_seconds = absl::ToDoubleSeconds(now - rate_since_) /
                         static_cast<double>(step - rate_step_) * static_cast<double>(steps - step);
  }
  last_step_ = step;
  return sample;
}

}  // namespace pipetrain
