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

  // One stage of two tensor ranks, a checkpoint every step: its writer
  // (tensor rank 0) holds the stage's weights and both AdamW moments in
  // its host's RAM while one is written, 3 x the stage's weights; rank 1
  // holds none of them. Submitted and planned: the job as it is then.
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
// 23264 a rank): the writer's snapshot needs 3 x 46528 = 139584 bytes of
// the host's RAM. A host of 100000 bytes cannot hold it: with no other
// workers to try, the job FAILS naming the writer (tensor rank 0 of stage
// 0, the plan's first position) and both figures.
TEST_F(JobManagerGpuMemoryTest, TensorJobOnASmallHost_RefusedNamingTheWriter) {
  const std::string a = AddGpuWorker(7001, 100000);
  AddGpuWorker(7002, 100000);
  const v1::Job job = SubmitCheckpointingTensorJob();
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED) << job.reason();
  EXPECT_TRUE(absl::StrContains(
      job.reason(),
      absl::StrCat("GPU worker ", a,
                   " (stage 0) would need 139584 bytes (0.00 GiB) of host RAM for "
                   "6 host copies of the 23264 bytes (0.00 GiB) of weights it steps")))
      << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(),
                                "and the plan's 2 GPU workers sharing host gpu-host's RAM would "
                                "need 139584 bytes (0.00 GiB) in all, but have 100000 bytes"))
      << job.reason();
}

// A host of 150000 bytes holds the writer's 139584 bytes, rank 1 holding
// none: the job is placed. Charged to both ranks against half the host
// each (75000 bytes), it was refused.
TEST_F(JobManagerGpuMemoryTest, TensorJobOnARoomierHost_Placed) {
  const std::string a = AddGpuWorker(7001, 150000);
  const std::string b = AddGpuWorker(7002, 150000);
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
