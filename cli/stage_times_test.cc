#include "cli/stage_times.h"

#include <string>

#include "gtest/gtest.h"

namespace pipetrain {
namespace {

// A job on `workers` workers whose worker g reported `steps` steps of
// g + 1 ms compute and 2 ms waiting each, and its plan, which predicted
// 0.5 ms and 1 ms for every worker.
struct JobAndPlan {
  v1::Job job;
  v1::Plan plan;
};
JobAndPlan Make(int workers, int steps, int replicas = 1, int tensor = 1) {
  JobAndPlan out;
  out.plan.set_data_parallel(replicas);
  out.plan.set_tensor_parallel(tensor);
  for (int g = 0; g < workers; ++g) {
    const std::string id = "w-" + std::to_string(g + 1);
    v1::StageTime* t = out.job.mutable_progress()->add_stage_times();
    t->set_worker_id(id);
    t->set_steps(steps);
    t->set_busy_seconds(steps * (g + 1) * 1e-3);
    t->set_idle_seconds(steps * 2e-3);
    v1::PlanStage* s = out.plan.add_stages();
    s->set_worker_id(id);
    s->set_predicted_busy_seconds(0.5e-3);
    s->set_predicted_idle_seconds(1e-3);
  }
  return out;
}

TEST(FormatStageTimes, MeasuredPerStepNextToPredicted) {
  const JobAndPlan j = Make(2, 10);
  EXPECT_EQ(FormatStageTimes(j.job, j.plan),
            "per step, measured [predicted]: busy, waiting (receives, collectives)\n"
            "  w-1    stage 0  1.0 ms [0.5]       2.0 ms [1.0]\n"
            "  w-2    stage 1  2.0 ms [0.5]       2.0 ms [1.0]\n");
}

TEST(FormatStageTimes, ReplicasAndRanksNamed) {
  // 2 replicas x 2 stages x 2 ranks: rank innermost, then stage, replica.
  const JobAndPlan j = Make(8, 1, 2, 2);
  const std::string text = FormatStageTimes(j.job, j.plan);
  EXPECT_NE(text.find("w-1    stage 0, replica 0, rank 0  1.0 ms [0.5]"), std::string::npos)
      << text;
  EXPECT_NE(text.find("w-4    stage 1, replica 0, rank 1  "), std::string::npos) << text;
  EXPECT_NE(text.find("w-7    stage 1, replica 1, rank 0  "), std::string::npos) << text;
}

// A plan whose layout cannot hold its entries (a faulty coordinator's:
// 65536 x 65536 overflowed int to 0, and the CLI died dividing by it) is
// labelled by index.
TEST(PlanEntryLabel, LayoutLargerThanThePlan_ByIndex) {
  JobAndPlan j = Make(2, 1, 65536, 65536);
  EXPECT_EQ(PlanEntryLabel(j.plan, 1), "entry 1");
  j.plan.set_data_parallel(3);
  j.plan.set_tensor_parallel(1);
  EXPECT_EQ(PlanEntryLabel(j.plan, 0), "entry 0");
  j.plan.set_data_parallel(2);
  EXPECT_EQ(PlanEntryLabel(j.plan, 1), "stage 0, replica 1");
}

TEST(FormatStageTimes, NoStepYet_ADash) {
  const JobAndPlan j = Make(1, 0);
  EXPECT_NE(FormatStageTimes(j.job, j.plan).find(" - [0.5]            - [1.0]\n"),
            std::string::npos)
      << FormatStageTimes(j.job, j.plan);
}

TEST(FormatStageTimes, NothingOrAnotherPlan_Empty) {
  EXPECT_EQ(FormatStageTimes(v1::Job(), v1::Plan()), "");
  JobAndPlan j = Make(2, 3);
  j.plan.mutable_stages(1)->set_worker_id("w-9");  // a re-plan since
  EXPECT_EQ(FormatStageTimes(j.job, j.plan), "");
  j.plan.mutable_stages()->RemoveLast();
  EXPECT_EQ(FormatStageTimes(j.job, j.plan), "");
}

TEST(WorkersStepSeconds, TheSlowestWorkersBusyPlusIdlePerStep) {
  JobAndPlan j = Make(3, 4);  // worker g: (g + 1) + 2 ms a step
  EXPECT_DOUBLE_EQ(WorkersStepSeconds(j.job, j.plan), 5e-3);
  j.job.mutable_progress()->mutable_stage_times(2)->set_steps(0);  // no step yet: not counted
  EXPECT_DOUBLE_EQ(WorkersStepSeconds(j.job, j.plan), 4e-3);
  j.plan.mutable_stages(0)->set_worker_id("w-9");  // a re-plan since
  EXPECT_EQ(WorkersStepSeconds(j.job, j.plan), 0);
  EXPECT_EQ(WorkersStepSeconds(v1::Job(), v1::Plan()), 0);
}

TEST(FormatStageTimes, ManyWorkers_Capped) {
  const JobAndPlan j = Make(kMaxStageTimeRows + 3, 1);
  const std::string text = FormatStageTimes(j.job, j.plan);
  EXPECT_NE(text.find("  ... and 3 more\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("w-33 "), std::string::npos);
}

}  // namespace
}  // namespace pipetrain
