#include "cli/job_report.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/pass_times.h"
#include "cli/stage_times.h"
#include "common/enum_names.h"
#include "common/job_state.h"
#include "common/terminal_safe.h"
#include "kernels/compress/codec_spec.h"

namespace pipetrain {

void StepTiming::Saw(int64_t step, int64_t steps, absl::Time now) {
  if (step < (steps + 9) / 10) return;
  if (first_step < 0) first_step = step, first_time = now;
  last_step = step, last_time = now;
}

double StepTiming::SecondsPerStep() const {
  if (first_step < 0 || last_step <= first_step) return 0;
  return absl::ToDoubleSeconds(last_time - first_time) / double(last_step - first_step);
}

std::string FormatJobOutcome(const v1::Job& end) {
  const v1::JobState state = end.state();
  const bool ended = IsTerminal(state);
  const int64_t step = end.progress().step();
  std::string out = absl::StrFormat("job %s %s", end.id(), EnumShortName(state));
  if (step == 0) {
    out += ", no step yet";
  } else if (ended) {
    absl::StrAppendFormat(&out, " after %d steps, final loss %.4f", step, end.progress().loss());
  } else {
    absl::StrAppendFormat(&out, " at step %d of %d, loss %.4f", step, end.spec().training().steps(),
                          end.progress().loss());
  }
  // One step's loss is noisy; the mean of the last steps compares runs better.
  const auto& history = end.progress().loss_history();
  const int tail = std::min(history.size(), kLossTailSteps);
  if (tail > 1) {
    double sum = 0;
    for (int i = history.size() - tail; i < history.size(); ++i) sum += history[i];
    absl::StrAppendFormat(&out, " (mean of the last %d steps %.4f)", tail, sum / tail);
  }
  out += "\n";
  if (end.progress().val_step() > 0) {
    absl::StrAppendFormat(&out, "validation loss %.4f after step %d\n", end.progress().val_loss(),
                          end.progress().val_step());
  }
  // Reasons carry workers' error messages: printed inert (terminal_safe.h).
  if (!end.reason().empty()) absl::StrAppend(&out, "reason: ", TerminalSafe(end.reason()), "\n");
  if (!end.weights_path().empty()) absl::StrAppend(&out, "weights: ", end.weights_path(), "\n");
  if (end.progress().checkpoint_failures() > 0) {
    const int64_t complete = end.progress().checkpoint_step();
    absl::StrAppendFormat(&out, "checkpoints: %d writes failed since %s; the last: %s\n",
                          end.progress().checkpoint_failures(),
                          complete > 0 ? absl::StrCat("the complete one of step ", complete)
                                       : std::string("the start (none complete)"),
                          TerminalSafe(end.progress().checkpoint_error()));
  }
  return out;
}

std::string FormatPlanMicroBatches(const v1::Plan& plan) {
  std::string out = absl::StrCat(plan.micro_batches(), " micro-batches");
  if (plan.data_parallel() > 1) {
    absl::StrAppend(&out, " per replica x ", plan.data_parallel(), " replicas");
  }
  if (plan.tensor_parallel() > 1) {
    absl::StrAppend(&out, ", ", plan.tensor_parallel(), " tensor ranks per stage");
  }
  return out;
}

std::string FormatPlanReport(const v1::Job& end, const v1::Plan& plan, const StepTiming& timing) {
  std::string out;
  if (end.plan_history_size() > 0) {
    // An auto layout's choice, the part of the last plan's reason from the
    // layout on: "initial plan; 2 replicas x 3 stages chosen by ...", or
    // after a recovery "worker w-3 ... is gone ...; 1 replica x 3 stages
    // chosen by ...". Other plans' reasons name no choice.
    const std::string& reason = end.plan_history(end.plan_history_size() - 1).reason();
    const size_t chosen = reason.find(" chosen by ");
    if (chosen != std::string::npos) {
      const size_t start = reason.rfind("; ", chosen);
      // A recovery's reason quotes a worker's error: printed inert.
      absl::StrAppend(&out, "layout", end.plan_history_size() > 1 ? " (last plan)" : "", ": ",
                      TerminalSafe(reason.substr(start == std::string::npos ? 0 : start + 2)),
                      "\n");
    }
  }
  const std::string& dp_codec = end.spec().compression().data_parallel().codec();
  if (!dp_codec.empty() && dp_codec != kCodecNone) {
    if (plan.data_parallel() > 1) {
      // Which stages went compressed (the planner's choice unless the spec
      // named them), of the last plan's stages per replica: a recovery may
      // have re-planned on fewer than the spec's (plan.proto: D x P x T
      // entries).
      const std::string codec =
          plan.data_parallel_quantizer().empty()
              ? absl::StrCat("powersgd rank ", plan.data_parallel_powersgd_rank())
              : plan.data_parallel_quantizer();
      const int stages =
          plan.stages_size() / plan.data_parallel() / std::max(1, plan.tensor_parallel());
      if (plan.data_parallel_compressed_stages().empty()) {
        // "on stages [] of 2" read like a formatting slip.
        absl::StrAppend(&out, "data-parallel all-reduce: ", codec, " on no stage of ", stages,
                        " (every stage's all-reduce went raw)\n");
      } else {
        absl::StrAppend(&out, "data-parallel all-reduce: ", codec, " on stages [",
                        absl::StrJoin(plan.data_parallel_compressed_stages(), ","), "] of ", stages,
                        "\n");
      }
    } else {
      out += "data-parallel all-reduce: none (the plan has one replica)\n";
    }
  }
  if (plan.tensor_parallel() > 1) {
    absl::StrAppend(&out, "tensor partitions per unit: forward [",
                    absl::StrJoin(plan.tensor_partitions_forward(), ","), "], backward [",
                    absl::StrJoin(plan.tensor_partitions_backward(), ","), "]\n");
  }
  // The simulator's prediction next to what the steps took (validation
  // passes and checkpoints included when they ran): as the client saw them
  // go by, else as the workers timed them.
  double measured = timing.SecondsPerStep();
  std::string which;
  if (measured > 0) {
    which = absl::StrFormat("steps %d-%d", timing.first_step, timing.last_step);
  } else if ((measured = WorkersStepSeconds(end, plan)) > 0) {
    which = "the slowest worker's mean over this plan's steps";
  }
  if (measured > 0 && plan.predicted_iteration_seconds() > 0) {
    absl::StrAppendFormat(
        &out,
        "step time: measured %.4f s (%s), predicted %.4f s by the plan's simulation "
        "(%+.0f%%; %s)\n",
        measured, which, plan.predicted_iteration_seconds(),
        100 * (plan.predicted_iteration_seconds() / measured - 1),
        TerminalSafe(plan.profile_source()));
  }
  // Where the step went, worker by worker (the whole run's mean), then in
  // the workers' traced step, pass by pass.
  out += FormatStageTimes(end, plan);
  out += FormatPassTimes(plan);
  return out;
}

}  // namespace pipetrain
