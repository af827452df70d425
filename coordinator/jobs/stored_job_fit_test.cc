#include "coordinator/jobs/stored_job_fit.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// A record whose parts are each within their bounds: 10000 losses (from
// step 500), 20 plan versions, 64 stage times.
store::StoredJob LargeRecord() {
  store::StoredJob stored;
  v1::Job* job = stored.mutable_job();
  job->set_id("j-1");
  v1::JobProgress* progress = job->mutable_progress();
  progress->set_loss_history_start(500);
  for (int i = 0; i < 10000; ++i) progress->add_loss_history(static_cast<float>(i));
  for (int v = 1; v <= 20; ++v) {
    v1::PlanVersion* plan = job->add_plan_history();
    plan->set_version(v);
    plan->set_reason(std::string(400, 'r'));
  }
  for (int w = 0; w < 64; ++w) progress->add_stage_times()->set_worker_id("w-" + std::to_string(w));
  return stored;
}

TEST(StoredJobFitTest, FitsAsItIs_Untouched) {
  store::StoredJob stored = LargeRecord();
  const std::string before = stored.SerializeAsString();
  EXPECT_EQ(FitStoredJob(before.size(), &stored), "");
  EXPECT_EQ(stored.SerializeAsString(), before);
  EXPECT_GT(MaxStoredJobBytes(), size_t{1000000});
}

TEST(StoredJobFitTest, OldestLossesFirst_EveryKeptLossKeepsItsStep) {
  store::StoredJob stored = LargeRecord();
  const size_t limit = stored.ByteSizeLong() - 1000;
  const std::string said = FitStoredJob(limit, &stored);
  EXPECT_LE(stored.ByteSizeLong(), limit);
  const v1::JobProgress& progress = stored.job().progress();
  ASSERT_GT(progress.loss_history_size(), 0);
  EXPECT_LT(progress.loss_history_size(), 10000);
  // loss_history[i] is step start + i's loss, as it was (value i - 500's).
  const int64_t dropped = 10000 - progress.loss_history_size();
  EXPECT_EQ(progress.loss_history_start(), 500 + dropped);
  EXPECT_EQ(progress.loss_history(0), static_cast<float>(dropped));
  EXPECT_EQ(progress.loss_history(progress.loss_history_size() - 1), 9999.0f);
  EXPECT_EQ(stored.job().plan_history_size(), 20);  // not needed
  EXPECT_EQ(progress.stage_times_size(), 64);
  EXPECT_NE(said.find("the oldest " + std::to_string(dropped) + " losses"), std::string::npos)
      << said;
}

TEST(StoredJobFitTest, ThenOlderPlanVersions_TheNewestStays_ThenStageTimes) {
  store::StoredJob stored = LargeRecord();
  store::StoredJob without_losses = stored;
  without_losses.mutable_job()->mutable_progress()->clear_loss_history();
  // Room for everything but the losses and about half the plan versions.
  const size_t limit = without_losses.ByteSizeLong() - 10 * 410;
  std::string said = FitStoredJob(limit, &stored);
  EXPECT_LE(stored.ByteSizeLong(), limit);
  EXPECT_EQ(stored.job().progress().loss_history_size(), 0);
  EXPECT_EQ(stored.job().progress().loss_history_start(), 10500);
  ASSERT_GT(stored.job().plan_history_size(), 0);
  EXPECT_LT(stored.job().plan_history_size(), 20);
  EXPECT_EQ(stored.job().plan_history(stored.job().plan_history_size() - 1).version(), 20);
  EXPECT_EQ(stored.job().progress().stage_times_size(), 64);
  EXPECT_NE(said.find("plan versions"), std::string::npos) << said;

  // Smaller still: one plan version, and no stage times.
  stored = LargeRecord();
  said = FitStoredJob(500, &stored);
  EXPECT_LE(stored.ByteSizeLong(), size_t{500});
  ASSERT_EQ(stored.job().plan_history_size(), 1);
  EXPECT_EQ(stored.job().plan_history(0).version(), 20);
  EXPECT_EQ(stored.job().progress().stage_times_size(), 0);
  EXPECT_NE(said.find("the 64 stage times"), std::string::npos) << said;

  // What cannot go stays, over the limit (its save fails naming it).
  stored = LargeRecord();
  stored.mutable_job()->set_reason(std::string(5000, 'x'));
  said = FitStoredJob(1000, &stored);
  EXPECT_GT(stored.ByteSizeLong(), size_t{1000});
  EXPECT_EQ(stored.job().reason().size(), 5000u);
  EXPECT_NE(
      said.find(absl::StrCat("is still ", stored.ByteSizeLong(), ", over 1000: its saves fail")),
      std::string::npos)
      << said;
  // Nothing to shed at all: said as much, not "left out " and nothing.
  store::StoredJob bare;
  bare.mutable_job()->set_reason(std::string(2000, 'x'));
  said = FitStoredJob(1000, &bare);
  EXPECT_TRUE(absl::StartsWith(said, "nothing could be left out, and its record of ")) << said;
}

}  // namespace
}  // namespace pipetrain
