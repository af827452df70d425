#include "cli/job_progress.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

v1::Job JobAt(int64_t step, int64_t val_step = 0, float val_loss = 0) {
  v1::Job job;
  job.mutable_spec()->mutable_training()->set_steps(100);
  job.mutable_progress()->set_step(step);
  job.mutable_progress()->set_loss(5.0f);
  if (val_step > 0) {
    job.mutable_progress()->set_val_step(val_step);
    job.mutable_progress()->set_val_loss(val_loss);
  }
  return job;
}

const absl::Time kStart = absl::FromUnixSeconds(1000);

v1::Job JobIn(v1::JobState state, const std::string& reason, int plans = 0) {
  v1::Job job;
  job.set_state(state);
  job.set_reason(reason);
  job.set_plan_version(plans);
  for (int v = 1; v <= plans; ++v) {
    v1::PlanVersion* plan = job.add_plan_history();
    plan->set_version(v);
    plan->set_start_step(5 * (v - 1));
    plan->set_reason(v == 1 ? "initial plan" : "w-2 lost");
    plan->add_worker_ids("w-1");
    if (v > 1) plan->add_worker_ids("w-3");
  }
  return job;
}

using Lines = std::vector<std::string>;

// Before the first plan each state and reason once, as they change; the
// first plan itself is not news (the steps that follow are).
TEST(JobNewsViewTest, BeforeTheFirstPlan_EachWaitingStateOnce) {
  JobNewsView news;
  const v1::Job queued = JobIn(v1::JOB_STATE_QUEUED, "waiting for 2 READY workers (1 ready)");
  EXPECT_EQ(news.Poll(queued).lines, Lines{"QUEUED: waiting for 2 READY workers (1 ready)"});
  EXPECT_TRUE(news.Poll(queued).lines.empty());
  EXPECT_EQ(news.Poll(JobIn(v1::JOB_STATE_PLANNING, "")).lines, Lines{"PLANNING"});
  const JobNewsView::News running = news.Poll(JobIn(v1::JOB_STATE_RUNNING, "", 1));
  EXPECT_TRUE(running.lines.empty());
  EXPECT_FALSE(running.replanned);
}

// After the first plan: a recovery's reason once, no waiting line for the
// re-plan's PLANNING (the plan line says it), then the new plan.
TEST(JobNewsViewTest, AfterTheFirstPlan_RecoveryOnceThenThePlanLineOnly) {
  JobNewsView news;
  news.Poll(JobIn(v1::JOB_STATE_RUNNING, "", 1));
  const v1::Job recovering = JobIn(v1::JOB_STATE_RECOVERING, "w-2 lost: recovering", 1);
  EXPECT_EQ(news.Poll(recovering).lines, Lines{"w-2 lost: recovering"});
  EXPECT_TRUE(news.Poll(recovering).lines.empty());
  EXPECT_TRUE(news.Poll(JobIn(v1::JOB_STATE_PLANNING, "re-planning", 1)).lines.empty());
  const JobNewsView::News replanned = news.Poll(JobIn(v1::JOB_STATE_RUNNING, "", 2));
  EXPECT_EQ(replanned.lines, Lines{"plan 2 on 2 workers (w-1, w-3), from step 5: w-2 lost"});
  EXPECT_TRUE(replanned.replanned);
  // A second recovery is news again.
  EXPECT_EQ(news.Poll(JobIn(v1::JOB_STATE_RECOVERING, "w-3 lost", 2)).lines, Lines{"w-3 lost"});
}

// A reason is the coordinator's text, which a job's fields feed: what acts
// on a terminal is shown escaped.
TEST(JobNewsViewTest, Reasons_TerminalSafe) {
  JobNewsView news;
  EXPECT_EQ(news.Poll(JobIn(v1::JOB_STATE_QUEUED, "held\x1b[2J")).lines,
            Lines{"QUEUED: held\\x1b[2J"});
}

// Checkpoint writes failing (a full disk) are news once, with the error
// and where a recovery would resume; a checkpoint complete again too.
TEST(JobNewsViewTest, CheckpointsFailing_SaidOnceThenWhenOneCompletes) {
  JobNewsView news;
  v1::Job job = JobIn(v1::JOB_STATE_RUNNING, "", 1);
  job.mutable_progress()->set_checkpoint_step(40);
  EXPECT_TRUE(news.Poll(job).lines.empty());
  job.mutable_progress()->set_checkpoint_failures(1);
  job.mutable_progress()->set_checkpoint_error("step 50, stage 1: No space left on device\x1b[2J");
  EXPECT_EQ(news.Poll(job).lines,
            Lines{"checkpoint write failed (step 50, stage 1: No space left on device\\x1b[2J); "
                  "training goes on, but a recovery would resume from the checkpoint of step 40"});
  job.mutable_progress()->set_checkpoint_failures(2);
  EXPECT_TRUE(news.Poll(job).lines.empty());
  job.mutable_progress()->set_checkpoint_failures(0);
  job.mutable_progress()->set_checkpoint_step(70);
  EXPECT_EQ(news.Poll(job).lines, Lines{"checkpoints complete again (step 70)"});
  EXPECT_TRUE(news.Poll(job).lines.empty());
}

TEST(JobProgressViewTest, FirstPoll_IsTheStartAndNoNews) {
  JobProgressView view;
  EXPECT_FALSE(view.Poll(JobAt(0), kStart).has_value());
  EXPECT_FALSE(view.Poll(JobAt(0), kStart + absl::Seconds(1)).has_value());
}

// A poll lands between steps: an evaluation of step 10 seen at step 13 is
// shown then, naming its step, and once only.
TEST(JobProgressViewTest, EvaluationSeenLate_ShownOnceWithItsStep) {
  JobProgressView view;
  view.Poll(JobAt(0), kStart);
  std::optional<ProgressSample> s = view.Poll(JobAt(13, 10, 4.5f), kStart + absl::Seconds(1));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->step, 13);
  ASSERT_TRUE(s->val_loss.has_value());
  EXPECT_EQ(*s->val_loss, 4.5f);
  EXPECT_EQ(s->val_step, 10);
  EXPECT_NE(RenderProgress(*s, 0).find("val 4.5000 (step 10)"), std::string::npos)
      << RenderProgress(*s, 0);
  s = view.Poll(JobAt(16, 10, 4.5f), kStart + absl::Seconds(2));
  ASSERT_TRUE(s.has_value());
  EXPECT_FALSE(s->val_loss.has_value());
  // The next evaluation, seen on a poll whose step has not moved.
  s = view.Poll(JobAt(16, 15, 4.0f), kStart + absl::Seconds(3));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->val_step, 15);
  EXPECT_FALSE(view.Poll(JobAt(16, 15, 4.0f), kStart + absl::Seconds(4)).has_value());
}

// An evaluation from before the first poll (a resumed job's) is not news.
TEST(JobProgressViewTest, EvaluationBeforeTheFirstPoll_NotShown) {
  JobProgressView view;
  view.Poll(JobAt(40, 40, 3.0f), kStart);
  std::optional<ProgressSample> s = view.Poll(JobAt(41, 40, 3.0f), kStart + absl::Seconds(1));
  ASSERT_TRUE(s.has_value());
  EXPECT_FALSE(s->val_loss.has_value());
}

// The time before the first step (profiling, planning: 60 s here) is not
// in the ETA: unknown at the first step seen, then the steps' own rate.
TEST(JobProgressViewTest, Eta_CountsFromTheFirstStepSeen) {
  JobProgressView view;
  view.Poll(JobAt(0), kStart);
  std::optional<ProgressSample> s = view.Poll(JobAt(1), kStart + absl::Seconds(60));
  ASSERT_TRUE(s.has_value());
  EXPECT_LT(s->eta_seconds, 0);
  s = view.Poll(JobAt(11), kStart + absl::Seconds(65));  // 0.5 s a step
  ASSERT_TRUE(s.has_value());
  EXPECT_DOUBLE_EQ(s->eta_seconds, 0.5 * 89);
}

}  // namespace
}  // namespace pipetrain
