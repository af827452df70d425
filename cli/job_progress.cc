#include "cli/job_progress.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/enum_names.h"
#include "common/terminal_safe.h"

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

JobNewsView::News JobNewsView::Poll(const v1::Job& job) {
  News news;
  if (last_version_ == 0 &&
      (job.state() == v1::JOB_STATE_QUEUED || job.state() == v1::JOB_STATE_PROFILING ||
       job.state() == v1::JOB_STATE_PLANNING)) {
    std::string line = EnumShortName(job.state());
    if (!job.reason().empty()) absl::StrAppend(&line, ": ", TerminalSafe(job.reason()));
    if (line != said_waiting_) news.lines.push_back(line);
    said_waiting_ = std::move(line);
  }
  if (job.state() == v1::JOB_STATE_RECOVERING && !said_recovering_) {
    news.lines.push_back(TerminalSafe(job.reason()));
    said_recovering_ = true;
  }
  if (job.plan_version() > last_version_ && job.plan_history_size() > 0) {
    const v1::PlanVersion& v = job.plan_history(job.plan_history_size() - 1);
    if (last_version_ > 0) {
      news.lines.push_back(absl::StrFormat("plan %d on %d workers (%s), from step %d: %s",
                                           v.version(), v.worker_ids_size(),
                                           TerminalSafe(absl::StrJoin(v.worker_ids(), ", ")),
                                           v.start_step(), TerminalSafe(v.reason())));
      news.replanned = true;
    }
    last_version_ = job.plan_version();
    said_recovering_ = false;
  }
  // Checkpoint writes failing (a full disk): the job trains on, but a
  // recovery would redo every step since the last complete one. Said when
  // they start, and when a checkpoint completes again.
  const int64_t failures = job.progress().checkpoint_failures();
  if (failures > 0 && said_checkpoint_failures_ == 0) {
    const int64_t complete = job.progress().checkpoint_step();
    news.lines.push_back(absl::StrCat(
        "checkpoint write failed (", TerminalSafe(job.progress().checkpoint_error()),
        "); training goes on, but a recovery would resume from ",
        complete > 0 ? absl::StrCat("the checkpoint of step ", complete) : "the job's start"));
  } else if (failures == 0 && said_checkpoint_failures_ > 0) {
    news.lines.push_back(
        absl::StrCat("checkpoints complete again (step ", job.progress().checkpoint_step(), ")"));
  }
  said_checkpoint_failures_ = failures;
  return news;
}

}  // namespace pipetrain
