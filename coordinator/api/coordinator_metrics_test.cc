// CoordinatorMetrics' token counter over a JobManager whose ended jobs are
// pruned: it forgets pruned jobs, and counts a listed job's steps once; the
// recovery reasons it serves, its histograms' top buckets and when it began
// serving.
#include "coordinator/api/coordinator_metrics.h"

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
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/jobs/assignment_hub.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/recovery_kind.h"
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

}  // namespace
}  // namespace pipetrain
