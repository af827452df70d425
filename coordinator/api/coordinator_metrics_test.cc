// CoordinatorMetrics' token counter over a JobManager whose ended jobs are
// pruned: it forgets pruned jobs, and counts a listed job's steps once; the
// recovery reasons it serves, its histograms' top buckets, when it began
// serving and how long RUNNING jobs have gone without a step.
#include "coordinator/api/coordinator_metrics.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <future>
#include <iterator>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/jobs/assignment_hub.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/recovery_kind.h"
#include "coordinator/jobs/small_spec_testing.h"
#include "coordinator/registry/worker_registry.h"
#include "coordinator/store/coordinator_state.h"
#include "coordinator/store/memory_backed_store_testing.h"
#include "coordinator/store/memory_store.h"
#include "coordinator/store/store.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

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

// A stored job of TinySpec for 50 steps, at `step` with `loss`, created at
// `created` seconds (Restore orders jobs by it).
store::StoredJob StoredTinyJob(const std::string& id, v1::JobState state, int64_t step,
                               float loss = 0, int64_t created = 100) {
  store::StoredJob stored;
  v1::Job* job = stored.mutable_job();
  job->set_id(id);
  *job->mutable_spec() = TinySpec();
  job->mutable_spec()->mutable_training()->set_steps(50);
  job->set_state(state);
  job->mutable_progress()->set_step(step);
  job->mutable_progress()->set_loss(loss);
  job->mutable_create_time()->set_seconds(created);
  return stored;
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

// The value of the series `name{label="value"}` in `text` (exposition
// format), or -1 when it is absent.
double SeriesValue(const std::string& text, const std::string& series) {
  for (const absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, series + " ")) continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(series.size() + 1), &value)) return value;
  }
  return -1;
}

// The coordinator makes its metrics before JobManager::Restore (which
// reports recoveries to them): the steps of the jobs restored after that
// were counted again as tokens on every restart and leader change, a
// phantom burst on the Throughput panel.
TEST(CoordinatorMetricsTest, TokenCounter_JobsRestoredAfterTheMetrics_NotCountedAgain) {
  FakeClock clock;
  WorkerRegistry workers(WorkerRegistry::Options{.clock = &clock});
  AssignmentHub hub;
  MemoryStore store;
  CoordinatorState state(&store);
  ASSERT_TRUE(state.SaveJob(StoredTinyJob("job-7", v1::JOB_STATE_SUCCEEDED, 40)).ok());
  JobManager jobs(&workers, &hub, &clock, JobManagerOptions{.state = &state});
  CoordinatorMetrics metrics(&workers, &jobs);  // as main.cc orders them
  jobs.SetEvents(metrics.Events());
  ASSERT_TRUE(jobs.Restore().ok());
  ASSERT_EQ(jobs.Get("job-7").value().progress().step(), 40);
  metrics.Refresh();
  const std::string text = prometheus::TextSerializer().Serialize(metrics.registry()->Collect());
  EXPECT_EQ(SeriesValue(text, "pipetrain_job_tokens_total"), 0) << text;
}

// A job begun from a checkpoint shows that checkpoint's step before it
// trains any: it is not /metrics' current job then (its loss gauges would
// read 0), the last job that trained is.
TEST(CoordinatorMetricsTest, CurrentJob_NotOneThatOnlyStartsFromACheckpoint) {
  FakeClock clock;
  WorkerRegistry workers(WorkerRegistry::Options{.clock = &clock});
  AssignmentHub hub;
  MemoryStore store;
  CoordinatorState state(&store);
  ASSERT_TRUE(state.SaveJob(StoredTinyJob("job-7", v1::JOB_STATE_SUCCEEDED, 40, 2.5f)).ok());
  store::StoredJob from_checkpoint = StoredTinyJob("job-8", v1::JOB_STATE_QUEUED, 10, 0, 200);
  from_checkpoint.mutable_job()->mutable_progress()->set_loss_history_start(10);
  from_checkpoint.mutable_init_checkpoint()->set_step(10);
  from_checkpoint.mutable_init_checkpoint()->set_dir("a/step-00000010");
  ASSERT_TRUE(state.SaveJob(from_checkpoint).ok());
  JobManager jobs(&workers, &hub, &clock, JobManagerOptions{.state = &state});
  ASSERT_TRUE(jobs.Restore().ok());
  ASSERT_EQ(jobs.Get("job-8").value().progress().step(), 10);
  CoordinatorMetrics metrics(&workers, &jobs);
  metrics.Refresh();
  const std::string text = prometheus::TextSerializer().Serialize(metrics.registry()->Collect());
  EXPECT_EQ(SeriesValue(text, "pipetrain_job_loss"), 2.5) << text;
}

// The last job that trained is pruned (ended jobs past max_ended_jobs):
// its loss is no current job's any more, so the gauges read 0, not a job
// that `pipetrain jobs` no longer knows (and that a restart would show as
// 0).
TEST(CoordinatorMetricsTest, CurrentJob_PrunedJobsGaugesGoBackToZero) {
  FakeClock clock;
  WorkerRegistry workers(WorkerRegistry::Options{.clock = &clock});
  AssignmentHub hub;
  MemoryStore store;
  CoordinatorState state(&store);
  ASSERT_TRUE(state.SaveJob(StoredTinyJob("job-7", v1::JOB_STATE_SUCCEEDED, 50, 2.5f)).ok());
  JobManagerOptions options;
  options.state = &state;
  options.max_ended_jobs = 1;
  JobManager jobs(&workers, &hub, &clock, options);
  ASSERT_TRUE(jobs.Restore().ok());
  CoordinatorMetrics metrics(&workers, &jobs);
  metrics.Refresh();
  std::string text = prometheus::TextSerializer().Serialize(metrics.registry()->Collect());
  ASSERT_EQ(SeriesValue(text, "pipetrain_job_loss"), 2.5) << text;
  const std::string next = jobs.Submit(TinySpec()).value().id();
  ASSERT_TRUE(jobs.Cancel(next).ok());
  jobs.ScheduleQueued();  // prunes job-7, keeping the newest ended job
  ASSERT_FALSE(jobs.Get("job-7").ok());
  metrics.Refresh();
  text = prometheus::TextSerializer().Serialize(metrics.registry()->Collect());
  EXPECT_EQ(SeriesValue(text, "pipetrain_job_loss"), 0) << text;
  EXPECT_EQ(SeriesValue(text, "pipetrain_plan_version"), 0) << text;
}

// Metrics over an empty registry and job manager, scraped as /metrics is.
class ScrapedMetricsTest : public ::testing::Test {
 protected:
  std::string Scrape() {
    return prometheus::TextSerializer().Serialize(metrics_.registry()->Collect());
  }

  FakeClock clock_;
  WorkerRegistry workers_{WorkerRegistry::Options{.clock = &clock_}};
  AssignmentHub hub_;
  JobManager jobs_{&workers_, &hub_, &clock_, JobManagerOptions{}};
  CoordinatorMetrics metrics_{&workers_, &jobs_};
};

// Every recovery reason the job manager can report exists from the first
// scrape, at zero: a series born at 1 counts as 0 in Prometheus'
// increase(), so a reason missing here hides its first recovery from the
// alert on repeated recoveries.
TEST_F(ScrapedMetricsTest, RecoveryReasons_EveryKindFromTheFirstScrape) {
  const JobEvents events = metrics_.Events();
  const std::string first = Scrape();
  for (const RecoveryKind kind : kAllRecoveryKinds) {
    const std::string series =
        absl::StrCat("pipetrain_job_recoveries_total{reason=\"", RecoveryKindName(kind), "\"}");
    EXPECT_EQ(SeriesValue(first, series), 0) << series;
    events.recovery_started(kind);
    EXPECT_EQ(SeriesValue(Scrape(), series), 1) << series;
  }
  EXPECT_EQ(std::size(kAllRecoveryKinds), 6u);
}

// A stranger's first refused call counts in rate(): each gRPC method's
// UNAUTHENTICATED series is there, at zero, before it.
TEST_F(ScrapedMetricsTest, RefusedCalls_EachMethodFromTheFirstScrape) {
  const std::string first = Scrape();
  for (const std::string method : {"RegisterWorker", "SubmitJob", "UploadWeights", "GetPlan"}) {
    const std::string series = absl::StrCat(
        "pipetrain_rpc_refused_total{code=\"UNAUTHENTICATED\",method=\"", method, "\"}");
    EXPECT_EQ(SeriesValue(first, series), 0) << series;
    metrics_.CountRefused(method, absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(SeriesValue(Scrape(), series), 1) << series;
  }
}

// REST refusals count as gRPC's: a 401 (no or a wrong credential) as
// UNAUTHENTICATED, a 403 (a cross-origin or DNS-rebinding request) as
// PERMISSION_DENIED, which operators alert on; other answers not.
TEST_F(ScrapedMetricsTest, RestRefusals_401And403Counted) {
  metrics_.http().AddRoute("POST", "/v1/jobs/{id}:cancel");
  const auto observe = metrics_.HttpObserver();
  observe("POST", "/v1/jobs/{id}:cancel", 403, 0.001);
  observe("POST", "/v1/jobs/{id}:cancel", 401, 0.001);
  observe("POST", "/v1/jobs/{id}:cancel", 404, 0.001);
  const std::string text = Scrape();
  EXPECT_EQ(SeriesValue(text,
                        "pipetrain_rpc_refused_total{code=\"PERMISSION_DENIED\",method=\"POST "
                        "/v1/jobs/{id}:cancel\"}"),
            1);
  EXPECT_EQ(SeriesValue(text,
                        "pipetrain_rpc_refused_total{code=\"UNAUTHENTICATED\",method=\"POST "
                        "/v1/jobs/{id}:cancel\"}"),
            1);
  EXPECT_FALSE(absl::StrContains(text, "code=\"NOT_FOUND\",method=\"POST")) << text;
}

// A checkpoint write of 20 minutes (a large unit file on a slow shared
// volume) and a plan queued 4 minutes behind a final weights file land in
// buckets of their own: the top bucket was 60 s for both, where p95 stops.
TEST_F(ScrapedMetricsTest, Histograms_LongCheckpointWritesAndPlansHaveBuckets) {
  const JobEvents events = metrics_.Events();
  events.checkpoint_written(20 * 60);
  events.planned(4 * 60, 0.5);
  const std::string text = Scrape();
  EXPECT_EQ(SeriesValue(text, "pipetrain_checkpoint_write_seconds_bucket{le=\"600\"}"), 0) << text;
  EXPECT_EQ(SeriesValue(text, "pipetrain_checkpoint_write_seconds_bucket{le=\"1800\"}"), 1) << text;
  EXPECT_EQ(SeriesValue(text, "pipetrain_plan_seconds_bucket{phase=\"queued\",le=\"120\"}"), 0)
      << text;
  EXPECT_EQ(SeriesValue(text, "pipetrain_plan_seconds_bucket{phase=\"queued\",le=\"300\"}"), 1)
      << text;
}

// PipetrainJobFailed reads a failure count as recent while the serving
// coordinator is young: the gauge is there from the first scrape, set to
// when the metrics were made (not a process start: a follower that wins
// the election later makes them then).
TEST(CoordinatorMetricsTest, ServingSince_WhenTheMetricsWereMade) {
  FakeClock clock;
  WorkerRegistry workers(WorkerRegistry::Options{.clock = &clock});
  AssignmentHub hub;
  JobManager jobs(&workers, &hub, &clock, JobManagerOptions{});
  const double before = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  CoordinatorMetrics metrics(&workers, &jobs);
  const double after = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  const std::string text = prometheus::TextSerializer().Serialize(metrics.registry()->Collect());
  const double since = SeriesValue(text, "pipetrain_coordinator_serving_since_timestamp_seconds");
  // The exposition's digits may round it by a little.
  EXPECT_GE(since, before - 1) << text;
  EXPECT_LE(since, after + 1) << text;
}

// The dashboard's $worker lists pipetrain_worker_info's addresses. A worker
// that is LOST or LEFT serves no /metrics there, and workers killed by their
// pods' restarts (LOST, kept by the registry until it is full) grew the list
// with dead addresses; one that registers again is listed again.
TEST(CoordinatorMetricsTest, WorkerInfo_OnlyLiveWorkers) {
  FakeClock clock;
  WorkerRegistry workers(WorkerRegistry::Options{.join_token = "t", .clock = &clock});
  AssignmentHub hub;
  JobManager jobs(&workers, &hub, &clock, JobManagerOptions{});
  CoordinatorMetrics metrics(&workers, &jobs);
  auto registered = [&](int n) {
    v1::RegisterWorkerRequest request;
    request.set_join_token("t");
    request.set_data_address(absl::StrCat("10.0.0.", n, ":7001"));
    request.set_metrics_address(absl::StrCat("10.0.0.", n, ":9100"));
    return workers.Register(request).value();
  };
  auto listed = [&](int n) {
    metrics.Refresh();
    const std::string text = prometheus::TextSerializer().Serialize(metrics.registry()->Collect());
    return SeriesValue(text, absl::StrCat("pipetrain_worker_info{metrics_address=\"10.0.0.", n,
                                          ":9100\"}")) == 1;
  };
  const v1::RegisterWorkerResponse lost = registered(1);
  const v1::RegisterWorkerResponse left = registered(2);
  registered(3);
  EXPECT_TRUE(listed(1) && listed(2) && listed(3));
  workers.MarkLost(lost.worker_id(), lost.incarnation(), "stream closed");
  ASSERT_TRUE(workers.Deregister(left.worker_id(), left.incarnation()).ok());
  EXPECT_FALSE(listed(1));
  EXPECT_FALSE(listed(2));
  EXPECT_TRUE(listed(3));
  registered(1);  // back, a new incarnation
  EXPECT_TRUE(listed(1));
}

// A MemoryStore whose commits fail while `failing` is set (a full disk
// under --state-dir, an etcd refusing writes).
class FailingStore final : public MemoryBackedStore {
 public:
  absl::Status Commit(const std::vector<StoreWrite>& writes) override {
    if (failing.load()) return absl::UnavailableError("database or disk is full");
    return CommitThrough(writes);
  }
  std::string Describe() const override { return "failing"; }
  std::atomic<bool> failing{false};
};

// After one failure of a job's state write: two more once-a-second
// retries fail (the job stays shown as failing, `failing_gauge` 1), then
// one succeeds (0); `failures_counter` counts the 3. Returns the last
// scrape.
std::string RetriesFailThenSucceed(FakeClock& clock, JobManager& jobs, FailingStore& store,
                                   const std::function<std::string()>& scrape,
                                   const std::string& failing_gauge,
                                   const std::string& failures_counter) {
  std::string text;
  for (int retry = 0; retry < 2; ++retry) {  // each second's retry fails too
    clock.Advance(absl::Seconds(2));
    jobs.ScheduleQueued();
    jobs.FlushIo();
    text = scrape();
    EXPECT_EQ(SeriesValue(text, failing_gauge), 1) << text;
  }
  EXPECT_EQ(SeriesValue(text, failures_counter), 3) << text;
  store.failing = false;
  clock.Advance(absl::Seconds(2));
  jobs.ScheduleQueued();
  jobs.FlushIo();
  text = scrape();
  EXPECT_EQ(SeriesValue(text, failing_gauge), 0) << text;
  EXPECT_EQ(SeriesValue(text, failures_counter), 3) << text;
  return text;
}

// Saves that fail show in /metrics: each one counted, and the jobs whose
// latest save failed (which a restart would bring back as last saved)
// while the once-a-second retries fail too, until one succeeds. Both exist
// from the first scrape, at zero.
TEST(CoordinatorMetricsTest, StateSaves_FailuresCountedFailingJobsShown) {
  FakeClock clock;
  WorkerRegistry workers(WorkerRegistry::Options{.clock = &clock});
  AssignmentHub hub;
  FailingStore store;
  CoordinatorState state(&store);
  JobManager jobs(&workers, &hub, &clock, JobManagerOptions{.state = &state});
  CoordinatorMetrics metrics(&workers, &jobs);
  jobs.SetEvents(metrics.Events());
  const auto scrape = [&] {
    metrics.Refresh();
    return prometheus::TextSerializer().Serialize(metrics.registry()->Collect());
  };
  std::string text = scrape();
  EXPECT_EQ(SeriesValue(text, "pipetrain_state_save_failures_total"), 0) << text;
  EXPECT_EQ(SeriesValue(text, "pipetrain_jobs_state_save_failing"), 0) << text;
  const std::string id = jobs.Submit(TinySpec()).value().id();  // no workers: queued
  store.failing = true;
  const absl::Status cancelled = jobs.Cancel(id).status();  // its save fails
  ASSERT_EQ(cancelled.code(), absl::StatusCode::kUnavailable) << cancelled;
  text = scrape();
  EXPECT_EQ(SeriesValue(text, "pipetrain_state_save_failures_total"), 1) << text;
  EXPECT_EQ(SeriesValue(text, "pipetrain_jobs_state_save_failing"), 1) << text;
  text = RetriesFailThenSucceed(clock, jobs, store, scrape, "pipetrain_jobs_state_save_failing",
                                "pipetrain_state_save_failures_total");
  EXPECT_EQ(state.LoadJobs().value()[0].job().state(), v1::JOB_STATE_CANCELLED);
}

// A save that does not return shows as the job I/O queue's age (no save
// has failed, so the failure gauges stay 0), back to 0 once it returns.
TEST(CoordinatorMetricsTest, StuckSave_ShownAsTheIoQueuesAge) {
  FakeClock clock;
  WorkerRegistry workers(WorkerRegistry::Options{.clock = &clock});
  AssignmentHub hub;
  HeldCommitStore store;
  CoordinatorState state(&store);
  JobManager jobs(&workers, &hub, &clock, JobManagerOptions{.state = &state});
  CoordinatorMetrics metrics(&workers, &jobs);
  jobs.SetEvents(metrics.Events());
  const auto scrape = [&] {
    metrics.Refresh();
    return prometheus::TextSerializer().Serialize(metrics.registry()->Collect());
  };
  std::string text = scrape();
  EXPECT_EQ(SeriesValue(text, "pipetrain_jobs_io_queue_age_seconds"), 0) << text;
  const std::string id = jobs.Submit(TinySpec()).value().id();  // no workers: queued
  jobs.FlushIo();
  store.hold = true;
  std::thread cancel([&] { EXPECT_TRUE(jobs.Cancel(id).ok()); });  // its save hangs
  store.entered.get_future().wait();
  clock.Advance(absl::Seconds(150));
  text = scrape();
  EXPECT_EQ(SeriesValue(text, "pipetrain_jobs_io_queue_age_seconds"), 150) << text;
  EXPECT_EQ(SeriesValue(text, "pipetrain_jobs_state_save_failing"), 0) << text;
  store.release.set_value();
  cancel.join();
  jobs.FlushIo();
  text = scrape();
  EXPECT_EQ(SeriesValue(text, "pipetrain_jobs_io_queue_age_seconds"), 0) << text;
}

// Deletes that fail (a pruned job's, which a restart would bring back)
// show too: each counted, retries included, and the jobs whose latest
// delete failed, until one succeeds. Both exist from the first scrape, at
// zero.
TEST(CoordinatorMetricsTest, StateDeletes_FailuresCountedFailingJobsShown) {
  FakeClock clock;
  WorkerRegistry workers(WorkerRegistry::Options{.clock = &clock});
  AssignmentHub hub;
  FailingStore store;
  CoordinatorState state(&store);
  JobManager jobs(&workers, &hub, &clock, JobManagerOptions{.max_ended_jobs = 0, .state = &state});
  CoordinatorMetrics metrics(&workers, &jobs);
  jobs.SetEvents(metrics.Events());
  const auto scrape = [&] {
    metrics.Refresh();
    return prometheus::TextSerializer().Serialize(metrics.registry()->Collect());
  };
  std::string text = scrape();
  EXPECT_EQ(SeriesValue(text, "pipetrain_state_delete_failures_total"), 0) << text;
  EXPECT_EQ(SeriesValue(text, "pipetrain_jobs_state_delete_failing"), 0) << text;
  const std::string id = jobs.Submit(TinySpec()).value().id();  // no workers: queued
  ASSERT_TRUE(jobs.Cancel(id).ok());
  jobs.FlushIo();
  store.failing = true;
  jobs.ScheduleQueued();  // prunes it; its delete fails
  jobs.FlushIo();
  ASSERT_EQ(jobs.Get(id).status().code(), absl::StatusCode::kNotFound);
  text = scrape();
  EXPECT_EQ(SeriesValue(text, "pipetrain_state_delete_failures_total"), 1) << text;
  EXPECT_EQ(SeriesValue(text, "pipetrain_jobs_state_delete_failing"), 1) << text;
  text = RetriesFailThenSucceed(clock, jobs, store, scrape, "pipetrain_jobs_state_delete_failing",
                                "pipetrain_state_delete_failures_total");
  EXPECT_EQ(SeriesValue(text, "pipetrain_state_save_failures_total"), 0) << text;
  EXPECT_TRUE(state.LoadJobs().value().empty());
}

// A job of `stages` stages (the job manager's tests' small model) for 100
// steps, checkpointing every 5: a drain re-plans it at a step boundary.
v1::JobSpec DrainableSpec(int stages) {
  v1::JobSpec spec = SmallJobSpec(stages);
  spec.mutable_training()->set_steps(100);
  spec.mutable_checkpoint()->set_interval_steps(5);
  return spec;
}

// Jobs run on registered workers through the job manager's API, as their
// workers' reports drive them, and planned on its own background thread;
// the clock moves only when a test moves it. Their state is saved to
// `store_`, which fails while store_.failing is set.
class RunningJobMetricsTest : public ::testing::Test {
 protected:
  std::string AddWorker(int port) {
    v1::RegisterWorkerRequest request;
    request.set_data_address(absl::StrCat("127.0.0.1:", port));
    return workers_.Register(request).value().worker_id();
  }

  // Every stage of job `id`'s current plan reports step `step`, the last
  // one with its losses. Returns the step a boundary was asked for after
  // (0: none).
  int64_t Step(const std::string& id, int64_t step) {
    const v1::Job job = jobs_.Get(id).value();
    int64_t stop_after = 0;
    for (int s = 0; s < job.worker_ids_size(); ++s) {
      v1::ReportProgressRequest r;
      r.set_worker_id(job.worker_ids(s));
      r.set_job_id(id);
      r.set_plan_version(job.plan_version());
      r.set_iteration(step - 1);
      if (s == job.worker_ids_size() - 1) {
        r.add_micro_batch_losses(2.0f);
        r.add_micro_batch_losses(2.0f);
      }
      const absl::StatusOr<v1::ReportProgressResponse> response = jobs_.ReportProgress(r);
      EXPECT_TRUE(response.ok()) << response.status();
      if (response.ok()) stop_after = std::max(stop_after, response->stop_after_step());
    }
    return stop_after;
  }

  // Every stage of job `id`'s current plan reports its checkpoint of
  // `step`, a file per unit of its backward range; a boundary's re-plan
  // that completes it is waited for.
  void CheckpointAll(const std::string& id, int64_t step) {
    const v1::Job job = jobs_.Get(id).value();
    for (const std::string& worker : job.worker_ids()) {
      const v1::Assignment a = hub_.Newer(worker, 0).value().assignment;
      v1::ReportProgressRequest r;
      r.set_worker_id(worker);
      r.set_job_id(id);
      r.set_plan_version(job.plan_version());
      r.set_iteration(step - 1);
      r.mutable_checkpoint()->set_step(step);
      for (int u = a.backward_units().begin(); u < a.backward_units().end(); ++u) {
        v1::UnitFile* f = r.mutable_checkpoint()->add_units();
        f->set_unit(u);
        f->set_file(absl::StrFormat("unit-%04d.safetensors", u));
        f->set_bytes(100 + u);
        f->set_sha256(std::string(64, 'a' + u));
      }
      const absl::Status reported = jobs_.ReportProgress(r).status();
      ASSERT_TRUE(reported.ok()) << worker << ": " << reported;
    }
    jobs_.AwaitBackgroundWork();
  }

  double LongestWithoutStep() {
    metrics_.Refresh();
    const std::string text = prometheus::TextSerializer().Serialize(metrics_.registry()->Collect());
    return SeriesValue(text, "pipetrain_job_longest_without_step_seconds");
  }

  FakeClock clock_;
  WorkerRegistry workers_{WorkerRegistry::Options{.clock = &clock_}};
  AssignmentHub hub_;
  FailingStore store_;
  CoordinatorState state_{&store_};
  JobManager jobs_{&workers_, &hub_, &clock_,
                   JobManagerOptions{.output_dir = ::testing::TempDir(), .state = &state_}};
  CoordinatorMetrics metrics_{&workers_, &jobs_};
};

// PipetrainJobStalled reads how long a RUNNING job has gone without a
// step. A drain's boundary keeps the job RUNNING (PLANNING lasts less than
// a scrape) while the boundary's checkpoint is written, the job re-planned
// and the new plan's workers load it: the count starts again with the new
// plan, not from the step before the boundary, which paged during a
// routine drain whose write and load took over 15 minutes together.
TEST_F(RunningJobMetricsTest, LongestWithoutStep_FromTheLastStepOrTheCurrentPlansStart) {
  EXPECT_EQ(LongestWithoutStep(), 0);  // none runs
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002), w3 = AddWorker(7003);
  const std::string id = jobs_.Submit(DrainableSpec(3)).value().id();
  jobs_.AwaitBackgroundWork();
  ASSERT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(LongestWithoutStep(), 0);
  clock_.Advance(absl::Seconds(90));  // its workers load the corpus
  EXPECT_EQ(LongestWithoutStep(), 90);
  for (int step = 1; step <= 3; ++step) {
    clock_.Advance(absl::Seconds(10));
    Step(id, step);
  }
  EXPECT_EQ(LongestWithoutStep(), 0);
  clock_.Advance(absl::Seconds(5));
  EXPECT_EQ(LongestWithoutStep(), 5);
  ASSERT_TRUE(jobs_.Drain(w2).ok());
  const int64_t boundary = Step(id, 4);
  ASSERT_GT(boundary, 4);
  for (int64_t step = 5; step <= boundary; ++step) Step(id, step);
  clock_.Advance(absl::Minutes(6));  // the boundary's checkpoint is written
  EXPECT_EQ(LongestWithoutStep(), 6 * 60);
  CheckpointAll(id, boundary);
  const v1::Job replanned = jobs_.Get(id).value();
  ASSERT_EQ(replanned.state(), v1::JOB_STATE_RUNNING) << replanned.reason();
  ASSERT_EQ(replanned.plan_version(), 2);
  EXPECT_EQ(std::vector<std::string>(replanned.worker_ids().begin(), replanned.worker_ids().end()),
            (std::vector<std::string>{w1, w3}));
  EXPECT_EQ(LongestWithoutStep(), 0);
  // The new plan's workers load the checkpoint: 16 minutes since the last
  // step, 10 since the plan's start.
  clock_.Advance(absl::Minutes(10));
  EXPECT_EQ(LongestWithoutStep(), 10 * 60);
  Step(id, boundary + 1);
  EXPECT_EQ(LongestWithoutStep(), 0);
  clock_.Advance(absl::Minutes(20));
  EXPECT_EQ(LongestWithoutStep(), 20 * 60);
  ASSERT_TRUE(jobs_.Cancel(id).ok());
  EXPECT_EQ(LongestWithoutStep(), 0);  // none runs
}

// Over all RUNNING jobs, the longest: one job stepping does not hide
// another that stopped (PipetrainJobStalled counted steps over all jobs).
TEST_F(RunningJobMetricsTest, LongestWithoutStep_AStalledJobBesideOneThatSteps) {
  AddWorker(7001);
  AddWorker(7002);
  const std::string stalled = jobs_.Submit(DrainableSpec(1)).value().id();
  const std::string stepping = jobs_.Submit(DrainableSpec(1)).value().id();
  jobs_.AwaitBackgroundWork();
  ASSERT_EQ(jobs_.Get(stalled).value().state(), v1::JOB_STATE_RUNNING);
  ASSERT_EQ(jobs_.Get(stepping).value().state(), v1::JOB_STATE_RUNNING);
  Step(stalled, 1);
  for (int step = 1; step <= 20; ++step) {
    clock_.Advance(absl::Minutes(1));
    Step(stepping, step);
  }
  EXPECT_EQ(LongestWithoutStep(), 20 * 60);
}

// A job whose failure waits to be saved is shown RUNNING ("ending: ..."),
// but no step is to come: it is not counted (the state store's alerts
// fire for it), and a cancel or resubmit would not help.
TEST_F(RunningJobMetricsTest, LongestWithoutStep_AnEndWaitingToBeSavedNotCounted) {
  AddWorker(7001);
  v1::JobSpec spec = DrainableSpec(1);
  spec.clear_checkpoint();  // a worker's error fails it
  const std::string id = jobs_.Submit(spec).value().id();
  jobs_.AwaitBackgroundWork();
  const v1::Job job = jobs_.Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  Step(id, 1);
  clock_.Advance(absl::Minutes(1));
  EXPECT_EQ(LongestWithoutStep(), 60);
  store_.failing = true;
  v1::ReportProgressRequest error;
  error.set_worker_id(job.worker_ids(0));
  error.set_job_id(id);
  error.set_plan_version(job.plan_version());
  error.set_error("INTERNAL: stage 0 ran out of memory");
  ASSERT_TRUE(jobs_.ReportProgress(error).ok());
  jobs_.FlushIo();
  clock_.Advance(absl::Minutes(20));
  const v1::Job ending = jobs_.Get(id).value();
  ASSERT_EQ(ending.state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(absl::StartsWith(ending.reason(), "ending:")) << ending.reason();
  EXPECT_EQ(LongestWithoutStep(), 0);
}

}  // namespace
}  // namespace pipetrain
