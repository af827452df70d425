// CoordinatorMetrics' token counter over a JobManager whose ended jobs are
// pruned: it forgets pruned jobs, and counts a listed job's steps once.
#include "coordinator/api/coordinator_metrics.h"

#include "common/clock.h"
#include "coordinator/jobs/assignment_hub.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/registry/worker_registry.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

v1::JobSpec TinySpec() {
  v1::JobSpec spec;
  spec.mutable_model()->set_n_layer(1);
  spec.mutable_model()->set_n_head(1);
  spec.mutable_model()->set_d_model(8);
  spec.mutable_training()->set_seq_len(8);
  spec.mutable_training()->set_batch_size(2);
  spec.mutable_training()->set_steps(1);
  spec.mutable_parallelism()->set_stages(1);
  return spec;
}

TEST(CoordinatorMetricsTest, TokenCounter_ForgetsPrunedJobs) {
  FakeClock clock;
  WorkerRegistry workers(WorkerRegistry::Options{.clock = &clock});
  AssignmentHub hub;
  JobManager jobs(&workers, &hub, &clock, JobManagerOptions{.max_ended_jobs = 2});
  CoordinatorMetrics metrics(&workers, &jobs);
  const std::string queued = jobs.Submit(TinySpec()).value().id();  // no workers: stays
  for (int i = 0; i < 6; ++i) {
    const std::string id = jobs.Submit(TinySpec()).value().id();
    ASSERT_TRUE(jobs.Cancel(id).ok());
    jobs.ScheduleQueued();  // prunes ended jobs past the newest 2
    metrics.Refresh();
    EXPECT_LE(metrics.JobsCountedForTesting(), 3u) << "after job " << i;
  }
  EXPECT_EQ(jobs.List().size(), 3u);  // the queued one and two ended
  EXPECT_EQ(metrics.JobsCountedForTesting(), 3u);
  ASSERT_TRUE(jobs.Get(queued).ok());
}

}  // namespace
}  // namespace pipetrain
