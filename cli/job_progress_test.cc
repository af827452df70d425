#include "cli/job_progress.h"

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
