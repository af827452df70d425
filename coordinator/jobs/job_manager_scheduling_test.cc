// JobManager's queue order (ScheduleQueued): backfill, the aging that
// keeps a stream of small jobs from starving a large one, and what a pass
// reads of the registry. Driven through its API with a fake clock: no
// processes.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
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

class JobManagerSchedulingTest : public ::testing::Test {
 protected:
  JobManagerSchedulingTest()
      : registry_(WorkerRegistry::Options{"", absl::Seconds(1), absl::Seconds(5), &clock_}),
        jobs_(&registry_, &hub_, &clock_,
              JobManagerOptions{.output_dir = TestCaseDir(),
                                .background_runner = background_.Runner()}) {}

  std::string AddWorker(int port) {
    v1::RegisterWorkerRequest request;
    request.set_data_address("127.0.0.1:" + std::to_string(port));
    return registry_.Register(request).value().worker_id();
  }

  // A worker at 127.0.0.1:`port` that computes on a GPU.
  std::string AddGpuWorker(int port) {
    return registry_.Register(GpuWorkerRequest(port)).value().worker_id();
  }

  // Submits a job of `stages` stages (one worker each; a model of 2
  // layers, 6 units) waiting at most `queue_timeout` to be placed, and
  // plans what that placed: its id.
  std::string Submit(int stages, absl::Duration queue_timeout = absl::Hours(1)) {
    v1::JobSpec spec = SmallJobSpec(stages);
    spec.mutable_model()->set_n_layer(2);
    spec.mutable_scheduling()->mutable_queue_timeout()->set_seconds(
        absl::ToInt64Seconds(queue_timeout));
    return SubmitSpec(spec);
  }

  // Submits `spec`, and plans what that placed: the job's id.
  std::string SubmitSpec(const v1::JobSpec& spec) {
    absl::StatusOr<v1::Job> job = jobs_.Submit(spec);
    background_.RunAll();
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id() : "";
  }

  // Cancels job `id`, which frees its workers, and schedules.
  void End(const std::string& id) {
    ASSERT_TRUE(jobs_.Cancel(id).ok());
    jobs_.ScheduleQueued();
    background_.RunAll();
  }

  v1::Job Job(const std::string& id) { return jobs_.Get(id).value(); }

  // `jobs` jobs of `spec` (given checkpoints, so that they recover), each
  // placed on workers of its own (`worker(port)`'s, the port counting up
  // from 7001), and each then losing its first worker, as to a host that
  // went down: RECOVERING. Their survivors are heard from again after the
  // loss when `heard`. Returns each job's id.
  std::vector<std::string> RecoveringJobs(
      int jobs, v1::JobSpec spec, const std::function<v1::RegisterWorkerRequest(int port)>& worker,
      bool heard) {
    registry_.SetLossListener(
        [this](const std::string& w, const std::string& j, const std::string& reason,
               int64_t incarnation) { jobs_.OnWorkerLost(w, j, reason, incarnation); });
    spec.mutable_training()->set_steps(100);
    spec.mutable_checkpoint()->set_interval_steps(5);
    std::vector<std::string> ids;
    std::map<std::string, int64_t> incarnations;
    int port = 7001;
    for (int j = 0; j < jobs; ++j) {
      for (int w = 0; w < JobWorkersOf(spec); ++w) {
        const v1::RegisterWorkerResponse registered = registry_.Register(worker(port++)).value();
        incarnations[registered.worker_id()] = registered.incarnation();
      }
      ids.push_back(SubmitSpec(spec));
      EXPECT_EQ(Job(ids.back()).state(), v1::JOB_STATE_RUNNING) << Job(ids.back()).reason();
    }
    clock_.Advance(absl::Milliseconds(10));
    for (const std::string& id : ids) {
      const std::vector<std::string> workers = WorkersOf(id);
      registry_.MarkLost(workers[0], incarnations[workers[0]], "its host went down");
      EXPECT_EQ(Job(id).state(), v1::JOB_STATE_RECOVERING);
      for (size_t w = 1; heard && w < workers.size(); ++w) {
        v1::HeartbeatRequest beat;
        beat.set_worker_id(workers[w]);
        beat.set_incarnation(incarnations[workers[w]]);
        EXPECT_TRUE(registry_.Heartbeat(beat).ok()) << workers[w];
      }
    }
    return ids;
  }

  // The workers a job of `spec` is placed on: its stages' replicas and
  // tensor ranks.
  static int JobWorkersOf(const v1::JobSpec& spec) {
    return spec.parallelism().stages() * std::max(1, spec.parallelism().data()) *
           std::max(1, spec.parallelism().tensor());
  }

  std::vector<std::string> WorkersOf(const std::string& id) {
    const v1::Job job = Job(id);
    return {job.worker_ids().begin(), job.worker_ids().end()};
  }

  FakeClock clock_;
  WorkerRegistry registry_;
  AssignmentHub hub_;
  BackgroundQueue background_;  // outlives jobs_
  JobManager jobs_;
};

// Backfill before half of the big job's queue timeout, none after: the
// pair S1 frees then is held for B, S3 waits (saying for whom), and B runs
// once S2 frees the rest. Before, S3 took the pair, and so on with every
// small job, until B's queue timeout failed it on a cluster that fits it.
TEST_F(JobManagerSchedulingTest, BigJobPastHalfItsQueueTimeout_LaterJobsDoNotTakeItsWorkers) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string w3 = AddWorker(7003), w4 = AddWorker(7004);
  const std::string s1 = Submit(2);
  ASSERT_EQ(WorkersOf(s1), (std::vector<std::string>{w1, w2}));
  const std::string b = Submit(4, absl::Seconds(600));
  ASSERT_EQ(Job(b).state(), v1::JOB_STATE_QUEUED);
  const std::string s2 = Submit(2);  // backfills: B waited less than half its timeout
  ASSERT_EQ(WorkersOf(s2), (std::vector<std::string>{w3, w4}));
  clock_.Advance(absl::Seconds(301));
  End(s1);
  ASSERT_EQ(Job(b).state(), v1::JOB_STATE_QUEUED);
  const std::string s3 = Submit(2);
  v1::Job waiting = Job(s3);
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_QUEUED) << "took the workers freed for " << b;
  EXPECT_EQ(waiting.reason(),
            "waiting for 2 READY workers (0 ready; 2 more READY but held for job " + b +
                ", queued past half its queue timeout)");
  End(s2);
  const v1::Job big = Job(b);
  ASSERT_EQ(big.state(), v1::JOB_STATE_RUNNING) << big.reason();
  EXPECT_EQ(WorkersOf(b), (std::vector<std::string>{w1, w2, w3, w4}));
  EXPECT_EQ(Job(s3).state(), v1::JOB_STATE_QUEUED);
}

// A job the cluster could never hold (more workers than it has) holds
// nothing, however long it has waited: held, its workers would be no
// one's until its queue timeout failed it.
TEST_F(JobManagerSchedulingTest, JobTheClusterCannotHold_PastHalfItsTimeout_HoldsNothing) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string s1 = Submit(2);
  const std::string b = Submit(3, absl::Seconds(600));
  clock_.Advance(absl::Seconds(301));
  End(s1);
  const std::string s2 = Submit(2);
  const v1::Job later = Job(s2);
  ASSERT_EQ(later.state(), v1::JOB_STATE_RUNNING) << later.reason();
  EXPECT_EQ(WorkersOf(s2), (std::vector<std::string>{w1, w2}));
  EXPECT_EQ(Job(b).state(), v1::JOB_STATE_QUEUED);
}

// The first job the cluster could hold is the one workers are held for:
// an older one it never could (5 workers of 4) does not take its turn.
TEST_F(JobManagerSchedulingTest, OlderJobTheClusterCannotHold_TheNextPastHalfItsTimeoutHolds) {
  AddWorker(7001);
  AddWorker(7002);
  AddWorker(7003);
  AddWorker(7004);
  const std::string s1 = Submit(2), s2 = Submit(2);
  const std::string too_big = Submit(5, absl::Seconds(600));
  const std::string b = Submit(4, absl::Seconds(600));
  clock_.Advance(absl::Seconds(301));
  End(s1);
  const std::string s3 = Submit(2);
  EXPECT_EQ(Job(s3).state(), v1::JOB_STATE_QUEUED) << "took the workers freed for " << b;
  End(s2);
  const v1::Job big = Job(b);
  ASSERT_EQ(big.state(), v1::JOB_STATE_RUNNING) << big.reason();
  EXPECT_EQ(Job(too_big).state(), v1::JOB_STATE_QUEUED);
}

// An aged job whose one stage needs 4 workers of one kind, on a cluster of
// 3 CPUs and 4 GPUs, keeps the READY GPUs (only GPUs can hold it), and
// later small jobs backfill onto the CPUs. It kept the first 4 READY by id
// (the 3 CPUs and a GPU), a small job took a GPU it needed, and so on with
// every GPU freed, until its queue timeout failed it.
TEST_F(JobManagerSchedulingTest, AgedJobNeedingGpusOfOneKind_KeepsTheGpusNotTheFirstById) {
  const std::string c1 = AddWorker(7001), c2 = AddWorker(7002), c3 = AddWorker(7003);
  const std::string g1 = AddGpuWorker(7004), g2 = AddGpuWorker(7005);
  const std::string g3 = AddGpuWorker(7006), g4 = AddGpuWorker(7007);
  const std::string s1 = Submit(4);
  ASSERT_EQ(WorkersOf(s1), (std::vector<std::string>{c1, c2, c3, g1}));
  const std::string s2 = Submit(1);
  ASSERT_EQ(WorkersOf(s2), (std::vector<std::string>{g2}));
  v1::JobSpec replicated = SmallJobSpec(1);
  // 4 replicas of one stage, all of one kind; a micro-batch each.
  replicated.mutable_parallelism()->set_data(4);
  replicated.mutable_training()->set_micro_batches(4);
  replicated.mutable_training()->set_batch_size(8);
  replicated.mutable_scheduling()->mutable_queue_timeout()->set_seconds(600);
  const std::string b = SubmitSpec(replicated);
  ASSERT_EQ(Job(b).state(), v1::JOB_STATE_QUEUED);
  clock_.Advance(absl::Seconds(301));
  End(s1);
  ASSERT_EQ(Job(b).state(), v1::JOB_STATE_QUEUED) << "3 GPUs READY of the 4 it needs";
  const std::string s3 = Submit(1), s4 = Submit(1);
  EXPECT_EQ(WorkersOf(s3), (std::vector<std::string>{c1})) << "took a GPU held for " << b;
  EXPECT_EQ(WorkersOf(s4), (std::vector<std::string>{c2}));
  End(s2);
  const v1::Job big = Job(b);
  ASSERT_EQ(big.state(), v1::JOB_STATE_RUNNING) << big.reason();
  std::vector<std::string> workers = WorkersOf(b);
  std::sort(workers.begin(), workers.end());
  EXPECT_EQ(workers, (std::vector<std::string>{g1, g2, g3, g4}));
}

// Several queued jobs placed in one pass each get workers of their own:
// the spares the pass listed once for every queued job lose those a
// placement took, and the job left waiting counts only the one left.
TEST_F(JobManagerSchedulingTest, SeveralJobsPlacedInOnePass_EachOnWorkersOfItsOwn) {
  const std::string a = Submit(2), b = Submit(2), c = Submit(3);
  ASSERT_EQ(Job(a).state(), v1::JOB_STATE_QUEUED);
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002), w3 = AddWorker(7003);
  const std::string w4 = AddWorker(7004), w5 = AddWorker(7005);
  jobs_.ScheduleQueued();
  background_.RunAll();
  ASSERT_EQ(Job(a).state(), v1::JOB_STATE_RUNNING) << Job(a).reason();
  ASSERT_EQ(Job(b).state(), v1::JOB_STATE_RUNNING) << Job(b).reason();
  EXPECT_EQ(WorkersOf(a), (std::vector<std::string>{w1, w2}));
  EXPECT_EQ(WorkersOf(b), (std::vector<std::string>{w3, w4}));
  const v1::Job waiting = Job(c);
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(waiting.reason(), "waiting for 3 READY workers (1 ready)");
}

// A pass reads each worker's record a few times, however many jobs are
// queued. Every queued job read every READY worker's record again (its
// spares, their drain, the kinds a 3-D tensor job runs on, the count of
// held ones for its reason): with 256 jobs queued on 4,096 workers, both
// within the documented limits, about a million record copies a pass,
// under the jobs lock every running job's progress report waits on.
TEST_F(JobManagerSchedulingTest, ManyQueuedJobs_APassReadsEachWorkerAFewTimes) {
  constexpr int kWorkers = 500, kJobs = 50;
  for (int i = 0; i < kWorkers; ++i) {
    v1::RegisterWorkerRequest request = GpuWorkerRequest(10000 + i);
    request.mutable_device()->set_hostname(absl::StrCat("gpu-host-", i / 8));
    ASSERT_TRUE(registry_.Register(request).ok());
  }
  // CPU only (3-D tensor ranks): none of the GPU workers can take one.
  v1::JobSpec cpu_only = SmallJobSpec(1);
  cpu_only.mutable_parallelism()->set_tensor(8);
  cpu_only.mutable_parallelism()->set_tensor_mode("3d");
  cpu_only.mutable_training()->set_batch_size(8);  // p^2 = 4 samples a micro-batch
  std::vector<std::string> queued;
  for (int i = 0; i < kJobs; ++i) queued.push_back(SubmitSpec(cpu_only));
  const int64_t before = registry_.RecordsReadForTesting();
  jobs_.ScheduleQueued();
  const int64_t read = registry_.RecordsReadForTesting() - before;
  // Listed once for the pass (List and ReadyWorkers): 2 a worker, and room
  // for a few Gets, not for another listing. Before, about 9 a worker for
  // each queued job (450 here); then 5, as the check that no queued job
  // waits for the spares read them all again (ReadyWorkers, a Get for each
  // one's drain and one for its kind), not as the pass had read them.
  EXPECT_LT(read, 3 * kWorkers) << kJobs << " jobs queued";
  for (const std::string& id : queued) {
    const v1::Job job = Job(id);
    EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
    EXPECT_EQ(job.reason(),
              "waiting for 8 READY CPU workers (0 ready; spec.parallelism.tensor_mode 3d runs on "
              "the CPU backend only)");
  }
}

// A pass reads each worker's record a few times, however many jobs are
// recovering: with 10 CPU-only jobs (3-D tensor ranks) each a worker short
// among 500 idle GPUs none of them can run on, they wait pass after pass.
// Each recovering job read every READY worker's record again (a
// ReadyWorkers, its spares' drains and kinds, the held and drained counts
// of its reason), and as much again for every other recovering job
// (whether one waits for the spares): K^2 x workers record copies, under
// the jobs lock, every pass for as long as they waited.
TEST_F(JobManagerSchedulingTest, ManyJobsRecoveringShortOfWorkers_APassReadsEachWorkerAFewTimes) {
  constexpr int kJobs = 10, kRanks = 8, kSpares = 500;
  v1::JobSpec cpu_only = SmallJobSpec(1);
  cpu_only.mutable_parallelism()->set_tensor(kRanks);
  cpu_only.mutable_parallelism()->set_tensor_mode("3d");
  cpu_only.mutable_training()->set_batch_size(8);  // p^2 = 4 samples a micro-batch
  const std::vector<std::string> recovering = RecoveringJobs(
      kJobs, cpu_only,
      [](int port) {
        v1::RegisterWorkerRequest request;
        request.set_data_address("127.0.0.1:" + std::to_string(port));
        return request;
      },
      /*heard=*/true);
  for (int i = 0; i < kSpares; ++i) {
    v1::RegisterWorkerRequest request = GpuWorkerRequest(10000 + i);
    request.mutable_device()->set_hostname(absl::StrCat("gpu-host-", i / 8));
    ASSERT_TRUE(registry_.Register(request).ok());
  }
  jobs_.ScheduleQueued();
  const int64_t before = registry_.RecordsReadForTesting();
  jobs_.ScheduleQueued();
  const int64_t read = registry_.RecordsReadForTesting() - before;
  // Listed once for the pass (List and ReadyWorkers), 2 a worker, and a
  // few Gets of each job's own workers. Before, about 337 a worker here
  // (195,000 in all).
  const int workers = kJobs * kRanks + kSpares;
  EXPECT_LT(read, 3 * workers) << kJobs << " jobs recovering";
  for (const std::string& id : recovering) {
    const v1::Job job = Job(id);
    EXPECT_EQ(job.state(), v1::JOB_STATE_RECOVERING);
    EXPECT_TRUE(absl::EndsWith(job.reason(),
                               "; waiting for 8 READY workers (7 ready; 63 more READY but held for "
                               "another job's profiling, recovery or step boundary)"))
        << job.reason();
  }
}

// The same with 10 GPU jobs each a worker short, whose survivors have not
// been heard from since (their hosts' heartbeats yet to come), beside 500
// idle CPU workers: each read every worker's record again (a ReadyWorkers
// to tell which survivors are still stopping).
TEST_F(JobManagerSchedulingTest, ManyJobsRecoveringUnheard_APassReadsEachWorkerAFewTimes) {
  constexpr int kJobs = 10, kSpares = 500;
  const std::vector<std::string> recovering =
      RecoveringJobs(kJobs, SmallJobSpec(2), GpuWorkerRequest, /*heard=*/false);
  for (int i = 0; i < kSpares; ++i) AddWorker(10000 + i);
  jobs_.ScheduleQueued();
  const int64_t before = registry_.RecordsReadForTesting();
  jobs_.ScheduleQueued();
  const int64_t read = registry_.RecordsReadForTesting() - before;
  const int workers = kJobs * 2 + kSpares;
  EXPECT_LT(read, 3 * workers) << kJobs << " jobs recovering";  // before, about 12 a worker
  for (const std::string& id : recovering) {
    const v1::Job job = Job(id);
    EXPECT_EQ(job.state(), v1::JOB_STATE_RECOVERING);
    EXPECT_TRUE(absl::EndsWith(job.reason(), "; waiting to hear from the other workers"))
        << job.reason();
  }
}

}  // namespace
}  // namespace pipetrain
