// JobManager's check of the host copies its GPU workers keep
// (CheckGpuHostCopiesOf in job_manager_placement.cc, memory_budget.h
// CheckGpuHostCopies): the wiring from a placed plan to the check, its
// position order, stage mapping and tensor share, and what a refusal does
// to the job. Driven through its API with a fake clock: no processes.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/testing/test_case_dir.h"
#include "coordinator/jobs/assignment_hub.h"
#include "coordinator/jobs/background_queue_testing.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/small_spec_testing.h"
#include "coordinator/registry/worker_registry.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

class JobManagerGpuMemoryTest : public ::testing::Test {
 protected:
  JobManagerGpuMemoryTest()
      : registry_(WorkerRegistry::Options{"", absl::Seconds(1), absl::Seconds(5), &clock_}),
        jobs_(&registry_, &hub_, &clock_,
              JobManagerOptions{.output_dir = TestCaseDir(),
                                .background_runner = background_.Runner()}) {}

  // A worker on GPU port % 8 of host "gpu-host" (80 GiB), whose host has
  // `ram` bytes of RAM and no limit of its own: the host's GPU workers
  // share it.
  std::string AddGpuWorker(int port, int64_t ram) {
    v1::RegisterWorkerRequest request = GpuWorkerRequest(port);
    request.mutable_device()->set_memory_bytes(ram);
    request.mutable_device()->set_gpu_memory_bytes(int64_t{80} << 30);
    return registry_.Register(request).value().worker_id();
  }

  // One stage of two tensor ranks, a checkpoint every step: each rank
  // holds the stage's weights and both AdamW moments in its host's RAM
  // while it resumes (read unsplit, 3 x the stage's weights, and its part
  // of the weights cut from them), and its writer (tensor rank 0) while
  // one is written, beside its final weights. Submitted and planned: the
  // job as it is then.
  v1::Job SubmitCheckpointingTensorJob() {
    v1::JobSpec spec = SmallJobSpec(1);
    spec.mutable_parallelism()->set_tensor(2);
    spec.mutable_checkpoint()->set_interval_steps(1);
    absl::StatusOr<v1::Job> job = jobs_.Submit(spec);
    background_.RunAll();
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? jobs_.Get(job->id()).value() : v1::Job();
  }

  FakeClock clock_;
  WorkerRegistry registry_;
  AssignmentHub hub_;
  BackgroundQueue background_;  // outlives jobs_
  JobManager jobs_;
};

// SmallJobSpec's one stage steps 46528 bytes of weights (its profile's;
// 23264 a rank): each rank needs 7 x 23264 = 162848 bytes of the host's
// RAM (a resume: 2 x 3 shards read and its own part; the writer's snapshot
// and its final weights alike). A host of 100000 bytes cannot hold them:
// with no other workers to try, the job FAILS naming the writer (tensor
// rank 0 of stage 0, the plan's first position) and both figures.
TEST_F(JobManagerGpuMemoryTest, TensorJobOnASmallHost_RefusedNamingTheWriter) {
  const std::string a = AddGpuWorker(7001, 100000);
  AddGpuWorker(7002, 100000);
  const v1::Job job = SubmitCheckpointingTensorJob();
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED) << job.reason();
  EXPECT_TRUE(absl::StrContains(
      job.reason(),
      absl::StrCat("GPU worker ", a,
                   " (stage 0) would need 162848 bytes (0.00 GiB) of host RAM for "
                   "7 host copies of the 23264 bytes (0.00 GiB) of weights it steps")))
      << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(),
                                "and the plan's 2 GPU workers sharing host gpu-host's RAM would "
                                "need 325696 bytes (0.00 GiB) in all, but have 100000 bytes"))
      << job.reason();
}

// A host of 400000 bytes holds both ranks' 162848 bytes: the job is
// placed. 150000 bytes held the writer's snapshot, all that was counted
// before, but not a recovery's, where both ranks read the stage at once.
TEST_F(JobManagerGpuMemoryTest, TensorJobOnARoomierHost_Placed) {
  const std::string a = AddGpuWorker(7001, 400000);
  const std::string b = AddGpuWorker(7002, 400000);
  const v1::Job job = SubmitCheckpointingTensorJob();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  const v1::Plan plan = jobs_.GetPlan(job.id()).value();
  ASSERT_EQ(plan.stages_size(), 2);
  EXPECT_EQ(plan.stages(0).worker_id(), a);
  EXPECT_EQ(plan.stages(1).worker_id(), b);
  ASSERT_TRUE(jobs_.Cancel(job.id()).ok());
}

}  // namespace
}  // namespace pipetrain
