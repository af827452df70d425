// JobManager's profiling of a job's model (job_manager_profiling.cc): a
// fetch that runs past its deadline on one worker, which may be wedged (a
// hung device keeps heartbeating READY), is tried on another of its kind
// before the model is given up for kProfileTimeoutMemory. Driven through
// its API with a fake clock and a fake fetcher: no processes.
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/testing/test_case_dir.h"
#include "coordinator/jobs/assignment_hub.h"
#include "coordinator/jobs/background_queue_testing.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/small_spec_testing.h"
#include "coordinator/planner/solve_plan.h"
#include "coordinator/registry/worker_registry.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"

namespace pipetrain {
namespace {

// A measured profile of SmallJobSpec's units, as a worker would send it in
// answer to `request`: made-up times, the sizes the model gives
// (CheckWorkerProfile holds it to them).
v1::ModelProfile FakeProfile(const v1::ProfileRequest& request) {
  v1::ModelProfile p;
  p.set_micro_batch_size(request.micro_batch_size());
  p.set_device_kind("cpu:");
  const ModelProfile sizes = AnalyticProfile(ResolveJobSpec(SmallJobSpec(2)).value().train.model,
                                             request.seq_len(), request.micro_batch_size(), 1e9);
  for (const UnitProfile& size : sizes.units) {
    v1::UnitProfile* u = p.add_units();
    u->set_name(size.name);
    u->set_fwd_seconds(0.001);
    u->set_bwd_seconds(0.002);
    u->set_weight_bytes(size.weight_bytes);
    u->set_activation_bytes(size.activation_bytes);
    u->set_stash_bytes(size.stash_bytes);
  }
  return p;
}

constexpr char kWedged[] = "127.0.0.1:7001";

class JobManagerProfilingTest : public ::testing::Test {
 protected:
  JobManagerProfilingTest()
      : registry_(WorkerRegistry::Options{"", absl::Seconds(1), absl::Seconds(5), &clock_}),
        jobs_(&registry_, &hub_, &clock_,
              JobManagerOptions{.output_dir = TestCaseDir(),
                                .background_runner = background_.Runner()}) {
    // The worker at kWedged runs every profile past the deadline (its
    // device hung; it heartbeats on); the others answer.
    jobs_.SetProfileFetcher(
        [this](const std::string& address, const std::string&,
               const v1::ProfileRequest& request) -> absl::StatusOr<v1::ModelProfile> {
          asked_.push_back(address);
          if (address == kWedged) return absl::DeadlineExceededError("Deadline Exceeded");
          return FakeProfile(request);
        });
  }

  std::string AddWorker(int port) {
    v1::RegisterWorkerRequest request;
    request.set_data_address("127.0.0.1:" + std::to_string(port));
    return registry_.Register(request).value().worker_id();
  }

  // Submits a job of `stages` stages (one worker each), and waits for its
  // profiles (a retry starts from the end of the one before) and plan.
  std::string Submit(int stages) {
    absl::StatusOr<v1::Job> job = jobs_.Submit(SmallJobSpec(stages));
    EXPECT_TRUE(job.ok()) << job.status();
    jobs_.AwaitProfiling();
    background_.RunAll();
    return job.ok() ? job->id() : "";
  }

  std::string ProfileSource(const std::string& id) {
    return jobs_.GetPlan(id).value().profile_source();
  }

  FakeClock clock_;
  WorkerRegistry registry_;
  AssignmentHub hub_;
  BackgroundQueue background_;      // outlives jobs_
  std::vector<std::string> asked_;  // written by the profiler threads, read once they are joined
  JobManager jobs_;
};

// The job's first profiling worker runs past the deadline: another of its
// workers, of the same kind, profiles the model, and the job plans on that
// measured profile. Before, the job planned on the analytic profile.
TEST_F(JobManagerProfilingTest, ProfileTimesOutOnOneWorker_TheJobProfilesOnAnotherOfItsKind) {
  AddWorker(7001);
  const std::string b = AddWorker(7002);
  const std::string id = Submit(2);
  EXPECT_EQ(asked_, (std::vector<std::string>{kWedged, "127.0.0.1:7002"}));
  EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING) << jobs_.Get(id).value().reason();
  EXPECT_TRUE(absl::StartsWith(ProfileSource(id), "measured on cpu: by " + b)) << ProfileSource(id);
}

// A job placed on the wedged worker alone plans on the analytic profile,
// saying why, without waiting for it again; the model is not given up:
// the next job, placed on other workers, profiles it there. Before, every
// job of the model planned on the analytic profile for an hour.
TEST_F(JobManagerProfilingTest, ProfileTimesOutOnOneWorker_ALaterJobProfilesOnAnother) {
  const std::string a = AddWorker(7001);
  const std::string first = Submit(1);
  EXPECT_EQ(asked_, (std::vector<std::string>{kWedged}));
  EXPECT_TRUE(absl::StrContains(ProfileSource(first),
                                "(profiling failed: a profile of this model on " + a +
                                    " ran past the coordinator's deadline (DEADLINE_EXCEEDED: "
                                    "Deadline Exceeded), and no other cpu: worker of this job's "
                                    "may try it)"))
      << ProfileSource(first);
  const std::string b = AddWorker(7002);
  const std::string second = Submit(1);  // on b: a runs the first job
  EXPECT_EQ(asked_, (std::vector<std::string>{kWedged, "127.0.0.1:7002"}));
  EXPECT_EQ(jobs_.Get(second).value().state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(absl::StartsWith(ProfileSource(second), "measured on cpu: by " + b))
      << ProfileSource(second);
}

// A second worker of the kind past the deadline too: the model is given up
// for kProfileTimeoutMemory (later jobs plan on the analytic profile at
// once), as it takes longer to profile there than the coordinator waits.
TEST_F(JobManagerProfilingTest, ProfileTimesOutOnTwoWorkers_LaterJobsDoNotWaitForIt) {
  std::vector<std::string> asked;
  jobs_.SetProfileFetcher([&](const std::string& address, const std::string&,
                              const v1::ProfileRequest&) -> absl::StatusOr<v1::ModelProfile> {
    asked.push_back(address);
    return absl::DeadlineExceededError("Deadline Exceeded");
  });
  AddWorker(7001);
  AddWorker(7002);
  const std::string first = Submit(2);
  EXPECT_EQ(asked, (std::vector<std::string>{kWedged, "127.0.0.1:7002"}));
  EXPECT_TRUE(absl::StrContains(ProfileSource(first), "profiling failed: DEADLINE_EXCEEDED"))
      << ProfileSource(first);
  ASSERT_TRUE(jobs_.Cancel(first).ok());
  clock_.Advance(absl::Minutes(30));
  AddWorker(7003);  // new workers: the clock moved past the others' leases
  AddWorker(7004);
  const std::string second = Submit(2);
  EXPECT_EQ(asked.size(), 2u);
  EXPECT_TRUE(absl::StrContains(ProfileSource(second),
                                "ran past the coordinator's deadline (DEADLINE_EXCEEDED: Deadline "
                                "Exceeded); not tried again for another 30m"))
      << ProfileSource(second);
}

// A deadline past the key's memory (--profile-timeout-seconds above an
// hour): each timeout found the one before forgotten and counted as a
// first, so the job's two workers took turns for ever, every later job
// waiting behind it. The retries count as the job's profile attempts.
TEST_F(JobManagerProfilingTest, EachTimeoutPastTheKeysMemory_RetriesStillEnd) {
  std::vector<std::string> asked;
  jobs_.SetProfileFetcher(
      [&](const std::string& address, const std::string&,
          const v1::ProfileRequest& request) -> absl::StatusOr<v1::ModelProfile> {
        asked.push_back(address);
        // Ends the old endless turns in the test: a profile after the sixth.
        if (asked.size() > 6) return FakeProfile(request);
        clock_.Advance(absl::Minutes(61));  // the deadline, past the memory
        return absl::DeadlineExceededError("Deadline Exceeded");
      });
  AddWorker(7001);
  AddWorker(7002);
  const std::string id = Submit(2);
  for (int pass = 0; pass < 10 && jobs_.Get(id).value().state() != v1::JOB_STATE_RUNNING; ++pass) {
    jobs_.ScheduleQueued();
    jobs_.AwaitProfiling();
    background_.RunAll();
  }
  EXPECT_EQ(asked.size(), 3u);
  EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING) << jobs_.Get(id).value().reason();
  EXPECT_TRUE(absl::StrContains(ProfileSource(id), "profiling failed: DEADLINE_EXCEEDED"))
      << ProfileSource(id);
}

}  // namespace
}  // namespace pipetrain
