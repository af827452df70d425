// JobProgressView: turns successive polls of a job (GetJob) into the
// progress lines `submit --follow` and `up` print (cli/progress.h).
//
// A poll sees the job between steps, and the job holds only its latest
// evaluation: each evaluation newer than the last one shown is shown, with
// its own step, on the first poll that sees it (one measured between two
// polls and then replaced by a newer one is not). The ETA's rate counts
// from the first completed step a poll sees: before it the job may still
// be profiling and planning, which no later step repeats. Not thread-safe.
#ifndef PIPETRAIN_CLI_JOB_PROGRESS_H_
#define PIPETRAIN_CLI_JOB_PROGRESS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "cli/progress.h"
#include "proto/pipetrain/v1/job.pb.h"

namespace pipetrain {

class JobProgressView {
 public:
  // The line for the poll of `job` at `now`, or nothing when it has no
  // news (no step completed and no evaluation since the last line). The
  // first poll sets the start: steps up to it (a job resumed from a
  // checkpoint begins at its step) and evaluations at or before it are
  // not news.
  std::optional<ProgressSample> Poll(const v1::Job& job, absl::Time now);

 private:
  int64_t first_step_ = -1;
  int64_t last_step_ = -1;
  int64_t last_val_step_ = 0;
  int64_t rate_step_ = -1;  // the step the ETA's rate counts from
  absl::Time rate_since_;
};

// The lines of news successive polls of a job bring besides its steps,
// terminal-safe: before its first plan, each state and reason while it
// waits (QUEUED, PROFILING, PLANNING), once per change, so that a job that
// cannot be placed does not look hung until its queue timeout; each
// recovery's reason, once; and each plan after the first ("plan 2 on 3
// workers (...), from step 5: <why>"). A re-plan's PLANNING is not
// repeated: its plan line says it. Checkpoint writes that fail
// (progress.checkpoint_failures), when they start failing and when one
// completes again. Not thread-safe.
class JobNewsView {
 public:
  struct News {
    std::vector<std::string> lines;
    bool replanned = false;  // a plan after the first came: its steps time anew
  };
  News Poll(const v1::Job& job);

 private:
  int64_t last_version_ = 0;
  std::string said_waiting_;  // the last state and reason shown before the first plan
  bool said_recovering_ = false;
  int64_t said_checkpoint_failures_ = 0;  // progress.checkpoint_failures last seen
};

}  // namespace pipetrain

#endif  // PIPETRAIN_CLI_JOB_PROGRESS_H_
