// JobManager's checkpoints, recovery, step boundaries (joins, drains) and
// durable state, driven through its API with a fake clock: no processes.
// tests:elastic_cluster_test runs the same across real workers.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/data_plane_keys.h"
#include "common/proto_time.h"
#include "common/testing/log_lines.h"
#include "common/testing/test_case_dir.h"
#include "coordinator/jobs/background_queue_testing.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/small_spec_testing.h"
#include "coordinator/planner/profile.h"
#include "coordinator/store/coordinator_state.h"
#include "coordinator/store/memory_backed_store_testing.h"
#include "coordinator/store/memory_store.h"
#include "coordinator/store/store.h"
#include "gtest/gtest.h"
#include "worker/checkpoint/checkpoint_manifest.h"

namespace pipetrain {
namespace {

using ::pipetrain::testing::LinesWith;

// 1 layer: units 0 (embed), 1 (attn), 2 (mlp), 3 (head).
constexpr int kUnits = 4;

v1::JobSpec ElasticSpec(int stages, int interval, int64_t steps = 100) {
  v1::JobSpec spec = SmallJobSpec(stages);
  spec.mutable_training()->set_steps(steps);
  spec.mutable_checkpoint()->set_interval_steps(interval);
  return spec;
}

// ElasticSpec with checkpoints every 5 steps as data 0 (auto) over
// `workers` workers, each stage on `tensor` ranks (0: searched too).
v1::JobSpec AutoLayoutSpec(int workers, int tensor) {
  v1::JobSpec spec = ElasticSpec(0, 5);
  spec.mutable_parallelism()->set_data(0);
  spec.mutable_parallelism()->set_workers(workers);
  spec.mutable_parallelism()->set_tensor(tensor);
  return spec;
}

// A job of one stage on 8 tensor ranks of the 3-D mode: it runs on CPU
// workers only (JobManager::CanRunLocked).
v1::JobSpec CpuOnlySpec() {
  v1::JobSpec spec = SmallJobSpec(1);
  spec.mutable_parallelism()->set_tensor(8);
  spec.mutable_parallelism()->set_tensor_mode("3d");
  spec.mutable_training()->set_batch_size(8);  // p^2 = 4 samples a micro-batch
  return spec;
}

// Each case's own (job ids restart at job-1 in every case).
std::string OutputDir() { return TestCaseDir(); }

// A job's workers, in stage order, as a vector to compare.
std::vector<std::string> WorkerIdsOf(const v1::Job& job) {
  return {job.worker_ids().begin(), job.worker_ids().end()};
}

// A job's workers in id order (which workers, whatever their positions).
std::vector<std::string> SortedWorkerIdsOf(const v1::Job& job) {
  std::vector<std::string> ids = WorkerIdsOf(job);
  std::sort(ids.begin(), ids.end());
  return ids;
}

// A store that shows each commit to `on_commit` (on the committing
// thread) before handing it on: what was on disk when a record was saved.
class ObservingStore : public Store {
 public:
  explicit ObservingStore(Store* inner) : inner_(inner) {}
  absl::Status Commit(const std::vector<StoreWrite>& writes) override {
    if (on_commit) on_commit(writes);
    if (failing.load()) return absl::UnavailableError("the store is unreachable");
    return inner_->Commit(writes);
  }
  absl::StatusOr<std::optional<std::string>> Get(const std::string& key) const override {
    return inner_->Get(key);
  }
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Scan(
      const std::string& prefix) const override {
    return inner_->Scan(prefix);
  }
  std::string Describe() const override { return inner_->Describe(); }

  std::function<void(const std::vector<StoreWrite>&)> on_commit;
  std::atomic<bool> failing{false};  // commits fail (after on_commit) while set

 private:
  Store* inner_;
};

// Workers that hold a third of ElasticSpec(3, ...)'s model each: three
// stages fit (171648 bytes on the busiest, its checkpoint snapshot
// included), two do not (223424).
constexpr int64_t kThirdModelMemory = 200000;

// Workers w1, w2, w3 (ports 7001-7003) of kThirdModelMemory each, running
// `spec` (ElasticSpec(3, 5) or a variant) to its checkpoint at step 5.
struct ThreeThirdsJob {
  std::string id, w1, w2, w3;
};

class JobManagerElasticTest : public ::testing::Test {
 protected:
  JobManagerElasticTest() : registry_(RegistryOptions()) { Reset(/*with_state=*/false); }

  WorkerRegistry::Options RegistryOptions() {
    WorkerRegistry::Options options{"", absl::Seconds(1), absl::Seconds(5), &clock_};
    options.persist = [this](const v1::Worker& worker) {
      return on_persist_ ? on_persist_(worker) : absl::OkStatus();
    };
    return options;
  }

  // `max_ended_jobs` (-1: the default) as JobManagerOptions' own.
  void Reset(bool with_state, int max_ended_jobs = -1, bool with_output_dir = true) {
    jobs_.reset();
    JobManagerOptions options{.output_dir = with_output_dir ? OutputDir() : ""};
    if (max_ended_jobs >= 0) options.max_ended_jobs = max_ended_jobs;
    if (with_state) {
      state_ = std::make_unique<CoordinatorState>(&observing_);
      options.state = state_.get();
    }
    options.background_runner = background_.Runner();
    if (separate_elapsed_clock_) options.elapsed_clock = &elapsed_clock_;
    jobs_ = std::make_unique<JobManager>(&registry_, &hub_, &clock_, options);
    registry_.SetLossListener(
        [this](const std::string& w, const std::string& j, const std::string& reason,
               int64_t incarnation) { jobs_->OnWorkerLost(w, j, reason, incarnation); });
  }

  // A job of two stages (ElasticSpec(2, 5), checkpoints in `dir`, on the
  // two workers registered) run to step 5, checkpointed and cancelled, its
  // end's sweep done; then a stage stopping late (a cancel reaches it tens
  // of ms later) writes part of step 10, whose directory goes to `late`.
  // Returns the job's id.
  std::string CancelledWithALateStep(const std::string& dir, std::string* late) {
    v1::JobSpec spec = ElasticSpec(2, 5);
    spec.mutable_checkpoint()->set_dir(dir);
    const std::string id = Submit(spec).value().id();
    for (int step = 1; step <= 5; ++step) Step(id, step);
    CheckpointAll(id, 5);
    clock_.Advance(absl::Milliseconds(10));
    EXPECT_TRUE(jobs_->Cancel(id).ok());
    jobs_->FlushIo();
    *late = OutputDir() + "/" + dir + "/step-00000010";
    std::filesystem::create_directories(*late);
    std::ofstream(*late + "/unit-0000.safetensors") << "partial";
    return id;
  }

  // Submits `spec` (checkpoints every 5 steps into a directory of its own)
  // and runs `steps` (at least 5) steps of it, the checkpoint of step 5
  // complete but its manifest's write failed (a directory in its place,
  // which even root cannot rename over), then the way cleared: no manifest
  // at `*manifest` (its path). Returns the job's id.
  std::string CompleteWithoutManifest(const v1::JobSpec& spec, int steps, std::string* manifest) {
    const std::string id = Submit(spec).value().id();
    for (int step = 1; step <= steps; ++step) Step(id, step);
    *manifest = absl::StrCat(OutputDir(), "/", spec.checkpoint().dir(), "/step-00000005/",
                             kCheckpointManifestName);
    std::filesystem::create_directories(*manifest + "/in-the-way");
    CheckpointAll(id, 5);
    jobs_->FlushIo();
    EXPECT_EQ(jobs_->Get(id).value().progress().checkpoint_step(), 5);
    EXPECT_TRUE(std::filesystem::is_directory(*manifest));
    std::filesystem::remove_all(*manifest);
    return id;
  }

  // Job A runs to its checkpoint of step 5 in `dir` and is cancelled; then
  // job B goes on from it in the same directory (spec.init.from, the
  // continued run of docs/api.md) and completes step 10, whose manifest's
  // write fails (a directory in its place, as a full disk would), and is
  // cancelled. Both ends' sweeps are done; then the way is cleared (space
  // freed): step 10 has no manifest, its unit files there at the sizes B's
  // reports recorded. Returns step 10's directory.
  std::string TwoEndedJobsInOneDir(const std::string& dir) {
    v1::JobSpec spec = ElasticSpec(2, 5);
    spec.mutable_checkpoint()->set_dir(dir);
    const std::string a = Submit(spec).value().id();
    StepCheckpointingEvery5(a, 5);
    EXPECT_TRUE(jobs_->Cancel(a).ok());
    AwaitEndSweeps();
    WriteUnitFiles(dir + "/step-00000005");
    spec.mutable_init()->set_from(dir + "/step-00000005");
    const std::string b = Submit(spec).value().id();
    const std::string step10 = absl::StrCat(OutputDir(), "/", dir, "/step-00000010");
    std::filesystem::create_directories(
        absl::StrCat(step10, "/", kCheckpointManifestName, "/in-the-way"));
    for (int step = 6; step <= 10; ++step) Step(b, step);
    CheckpointAll(b, 10);
    EXPECT_EQ(jobs_->Get(b).value().progress().checkpoint_step(), 10);
    EXPECT_TRUE(jobs_->Cancel(b).ok());
    AwaitEndSweeps();
    std::filesystem::remove_all(absl::StrCat(step10, "/", kCheckpointManifestName));
    for (int u = 0; u < kUnits; ++u) {  // CheckpointReport's sizes
      std::ofstream(absl::StrFormat("%s/unit-%04d.safetensors", step10, u), std::ios::binary)
          << std::string(100 + u, 'w');
    }
    jobs_->FlushIo();
    return step10;
  }

  // Registers a worker at 127.0.0.1:`port`, limited to `memory_limit`
  // bytes for its stage (0: no limit).
  std::string AddWorker(int port, int64_t memory_limit = 0) {
    v1::RegisterWorkerRequest request;
    request.set_data_address("127.0.0.1:" + std::to_string(port));
    if (memory_limit > 0) request.mutable_device()->set_memory_limit_bytes(memory_limit);
    return Register(request);
  }

  // Registers a GPU worker (DeviceInfo.gpu_model set) at 127.0.0.1:`port`.
  std::string AddGpuWorker(int port) { return Register(GpuWorkerRequest(port)); }

  std::string Register(const v1::RegisterWorkerRequest& request) {
    auto response = registry_.Register(request).value();
    incarnations_[response.worker_id()] = response.incarnation();
    return response.worker_id();
  }

  // Whether every stage of job `id`'s current plan runs its replicas on
  // workers of one kind (GPU or CPU).
  bool EveryStageOfOneKind(const std::string& id) {
    std::map<int, std::set<bool>> kinds;
    const v1::Job job = jobs_->Get(id).value();
    for (const std::string& w : job.worker_ids()) {
      kinds[AssignmentOf(w).stage()].insert(!registry_.Get(w).value().device().gpu_model().empty());
    }
    return std::all_of(kinds.begin(), kinds.end(),
                       [](const auto& k) { return k.second.size() == 1; });
  }

  void Heartbeat(const std::string& worker) {
    v1::HeartbeatRequest beat;
    beat.set_worker_id(worker);
    beat.set_incarnation(incarnations_[worker]);
    ASSERT_TRUE(registry_.Heartbeat(beat).ok()) << worker;
  }

  v1::Assignment AssignmentOf(const std::string& worker) {
    auto a = hub_.Newer(worker, 0);
    return a.has_value() ? a->assignment : v1::Assignment();
  }

  // Every stage of the job's current plan reports step `step` (iteration
  // step - 1); the last stage reports losses. Returns the last response.
  v1::ReportProgressResponse Step(const std::string& id, int64_t step) {
    const v1::Job job = jobs_->Get(id).value();
    v1::ReportProgressResponse last;
    for (int s = 0; s < job.worker_ids_size(); ++s) {
      v1::ReportProgressRequest r;
      r.set_worker_id(job.worker_ids(s));
      r.set_job_id(id);
      r.set_plan_version(job.plan_version());
      r.set_iteration(step - 1);
      if (s == job.worker_ids_size() - 1) {
        r.add_micro_batch_losses(float(step));
        r.add_micro_batch_losses(float(step));
      }
      auto response = jobs_->ReportProgress(r);
      EXPECT_TRUE(response.ok()) << response.status();
      if (response.ok()) last = *response;
    }
    RunPlans();  // a boundary reached
    return last;
  }

  // Every worker of the job reports step `step`, those of each replica's
  // last stage (every tensor rank) with `micro_batches` losses: the
  // coordinator keeps replica 0's rank 0's. For layouts with replicas or
  // tensor ranks, where Step's "the last worker has the losses" is wrong.
  // Returns the step a boundary was asked for after (0: none).
  int64_t StepEveryWorker(const std::string& id, int64_t step, int micro_batches) {
    int64_t stop_after = 0;
    const v1::Job job = jobs_->Get(id).value();
    for (const std::string& worker : job.worker_ids()) {
      const v1::Assignment a = AssignmentOf(worker);
      v1::ReportProgressRequest r;
      r.set_worker_id(worker);
      r.set_job_id(id);
      r.set_plan_version(job.plan_version());
      r.set_iteration(step - 1);
      if (a.stage() == a.num_stages() - 1) {
        for (int m = 0; m < micro_batches; ++m) r.add_micro_batch_losses(float(step));
      }
      auto response = jobs_->ReportProgress(r);
      EXPECT_TRUE(response.ok()) << worker << ": " << response.status();
      if (response.ok()) stop_after = std::max(stop_after, response->stop_after_step());
    }
    RunPlans();
    return stop_after;
  }

  // Stage `s` reports its units of checkpoint `step`.
  // `worker`'s report of its checkpoint of `step` under plan `version`:
  // a file per unit of its current assignment's backward range.
  v1::ReportProgressRequest CheckpointReport(const std::string& id, const std::string& worker,
                                             int64_t version, int64_t step) {
    const v1::Assignment a = AssignmentOf(worker);
    v1::ReportProgressRequest r;
    r.set_worker_id(worker);
    r.set_job_id(id);
    r.set_plan_version(version);
    r.set_iteration(step - 1);
    r.mutable_checkpoint()->set_step(step);
    for (int u = a.backward_units().begin(); u < a.backward_units().end(); ++u) {
      v1::UnitFile* f = r.mutable_checkpoint()->add_units();
      f->set_unit(u);
      f->set_file(absl::StrFormat("unit-%04d.safetensors", u));
      f->set_bytes(100 + u);
      f->set_sha256(std::string(64, 'a' + u));
    }
    return r;
  }

  absl::Status Checkpoint(const std::string& id, int s, int64_t step) {
    const v1::Job job = jobs_->Get(id).value();
    const v1::ReportProgressRequest r =
        CheckpointReport(id, job.worker_ids(s), job.plan_version(), step);
    absl::Status status = jobs_->ReportProgress(r).status();
    RunPlans();  // a boundary's checkpoint complete
    return status;
  }

  // `worker`'s report, under plan 1 at iteration `step` - 1, that its
  // write of step `step`'s checkpoint failed for want of disk.
  static v1::ReportProgressRequest CheckpointFullDisk(const std::string& id,
                                                      const std::string& worker, int64_t step) {
    v1::ReportProgressRequest r;
    r.set_worker_id(worker);
    r.set_job_id(id);
    r.set_plan_version(1);
    r.set_iteration(step - 1);
    r.mutable_checkpoint()->set_step(step);
    r.mutable_checkpoint()->set_error("RESOURCE_EXHAUSTED: No space left on device");
    return r;
  }

  // `worker`'s report, under plan `version`, that a peer of its stage went
  // away (a data-plane failure: the job recovers).
  static v1::ReportProgressRequest PeerFailure(const std::string& id, const std::string& worker,
                                               int64_t version) {
    v1::ReportProgressRequest r;
    r.set_worker_id(worker);
    r.set_job_id(id);
    r.set_plan_version(version);
    r.set_error("UNAVAILABLE: stage 1 went away");
    r.set_peer_failure(true);
    return r;
  }

  // Every writer of checkpoint `step`: the workers of replica 0 at tensor
  // rank 0 (in a plain pipeline, every stage), as the plan assigns them
  // before the first report (a boundary's checkpoint re-plans once
  // complete, and the workers' assignments change).
  void CheckpointAll(const std::string& id, int64_t step) {
    const v1::Job job = jobs_->Get(id).value();
    std::vector<int> writers;
    for (int g = 0; g < job.worker_ids_size(); ++g) {
      const v1::Assignment a = AssignmentOf(job.worker_ids(g));
      if (a.replica() == 0 && a.tensor_rank() == 0) writers.push_back(g);
    }
    for (int g : writers) ASSERT_TRUE(Checkpoint(id, g, step).ok());
  }

  // Steps 1 to `last` of job `id`, every stage checkpointing each step
  // that is a multiple of 5 (ElasticSpec(_, 5)'s interval).
  void StepCheckpointingEvery5(const std::string& id, int64_t last) {
    for (int64_t step = 1; step <= last; ++step) {
      Step(id, step);
      if (step % 5 == 0) CheckpointAll(id, step);
    }
  }

  // A job on two new workers, checkpointed at steps 5 and 10, recovers
  // from 10, and a stage says it cannot load it (checkpoint_unusable)
  // while the state store fails (observing_.failing, left set): step 10 is
  // dropped. `id` is the job's, `manifest` step 10's (there before).
  void DropCheckpoint10WhileSavesFail(std::string* id, std::string* manifest) {
    const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
    *id = Submit(ElasticSpec(2, 5)).value().id();
    StepCheckpointingEvery5(*id, 10);
    ASSERT_TRUE(jobs_->ReportProgress(PeerFailure(*id, w1, 1)).ok());
    HeartbeatAllAndSchedule({w1, w2});
    ASSERT_EQ(AssignmentOf(w1).resume().step(), 10);
    jobs_->FlushIo();
    *manifest = OutputDir() + "/checkpoints/" + *id + "/step-00000010/manifest.json";
    struct stat st;
    ASSERT_EQ(stat(manifest->c_str(), &st), 0);
    observing_.failing = true;
    v1::ReportProgressRequest r = PeerFailure(*id, w1, 2);
    r.set_error("DATA_LOSS: unit-0000.safetensors is truncated");
    r.set_peer_failure(false);
    r.set_checkpoint_unusable(true);
    ASSERT_TRUE(jobs_->ReportProgress(r).ok());
  }

  // Starts `spec` on three new workers of kThirdModelMemory and runs it to
  // its checkpoint at step 5 (see ThreeThirdsJob).
  void StartThreeThirdsJob(const v1::JobSpec& spec, ThreeThirdsJob* run) {
    run->w1 = AddWorker(7001, kThirdModelMemory);
    run->w2 = AddWorker(7002, kThirdModelMemory);
    run->w3 = AddWorker(7003, kThirdModelMemory);
    run->id = Submit(spec).value().id();
    const v1::Job job = jobs_->Get(run->id).value();
    ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
    StepCheckpointingEvery5(run->id, 5);
  }

  // A three-thirds job (StartThreeThirdsJob) loses w2 and w3; they register
  // again one by one. With the first back the job still waits (two workers
  // cannot hold the model); with both it runs on all three from step 5.
  void ExpectReplacementsOneByOneTriedTogether(const v1::JobSpec& spec) {
    ThreeThirdsJob run;
    ASSERT_NO_FATAL_FAILURE(StartThreeThirdsJob(spec, &run));
    registry_.MarkLost(run.w2, incarnations_[run.w2], "killed");
    registry_.MarkLost(run.w3, incarnations_[run.w3], "killed");
    HeartbeatAllAndSchedule({run.w1});
    ASSERT_EQ(jobs_->Get(run.id).value().state(), v1::JOB_STATE_RECOVERING);
    ASSERT_EQ(AddWorker(7002, kThirdModelMemory), run.w2);
    HeartbeatAllAndSchedule({run.w1, run.w2});
    v1::Job job = jobs_->Get(run.id).value();
    ASSERT_EQ(job.state(), v1::JOB_STATE_RECOVERING) << job.reason();
    EXPECT_TRUE(absl::StrContains(job.reason(), "waiting for more READY workers")) << job.reason();
    ASSERT_EQ(AddWorker(7003, kThirdModelMemory), run.w3);
    HeartbeatAllAndSchedule({run.w1, run.w2, run.w3});
    job = jobs_->Get(run.id).value();
    ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
    EXPECT_EQ(job.worker_ids_size(), 3);
    EXPECT_EQ(job.progress().step(), 5);
  }

  // Each unit file CheckpointReport records, in `step_dir` (a path), of
  // the size it records: what the stages would have written there.
  static void WriteReportedUnitFiles(const std::string& step_dir) {
    std::filesystem::create_directories(step_dir);
    for (int u = 0; u < kUnits; ++u) {
      std::ofstream(absl::StrFormat("%s/unit-%04d.safetensors", step_dir, u), std::ios::binary)
          << std::string(100 + u, 'w');
    }
  }

  // The unit files a complete checkpoint's manifest lists, under the output
  // directory's `step_dir`, each of the size it records (the workers would
  // have written them; these tests report checkpoints without them). Dated
  // a second before the manifest, as the workers' files are: an expired
  // checkpoint's removal takes the files no newer than its manifest.
  static void WriteUnitFiles(const std::string& step_dir) {
    const std::string dir = absl::StrCat(OutputDir(), "/", step_dir);
    const std::string manifest_path = dir + "/" + kCheckpointManifestName;
    absl::StatusOr<CheckpointManifest> manifest = ReadCheckpointManifest(manifest_path);
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    struct stat written;
    ASSERT_EQ(stat(manifest_path.c_str(), &written), 0);
    const timespec before =
        absl::ToTimespec(absl::TimeFromTimespec(written.st_mtim) - absl::Seconds(1));
    const timespec times[2] = {before, before};
    for (const v1::UnitFile& f : manifest->units) {
      const std::string path = absl::StrCat(dir, "/", f.file());
      std::ofstream(path, std::ios::binary) << std::string(f.bytes(), 'w');
      ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
    }
  }

  // On a fresh coordinator with a store and workers 7001 and 7002: a job
  // of two stages, 5 steps run and checkpointed, everything saved.
  // Restores the stored jobs twice, each time on a fresh manager counting
  // the jobs that ended: job `id` FAILED both times with a reason holding
  // `reason`. Returns the ends counted over both.
  int EndedOverTwoRestarts(const std::string& id, const std::string& reason) {
    int ended = 0;
    for (int restart = 0; restart < 2; ++restart) {
      Reset(/*with_state=*/true);
      JobEvents events;
      events.ended = [&](v1::JobState) { ++ended; };
      jobs_->SetEvents(events);
      EXPECT_TRUE(jobs_->Restore().ok());
      jobs_->FlushIo();  // the failure saved: shown RUNNING ("ending: ...") until then
      const v1::Job job = jobs_->Get(id).value();
      EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
      EXPECT_TRUE(absl::StrContains(job.reason(), reason)) << job.reason();
    }
    return ended;
  }

  std::string CheckpointedJobInStore() {
    Reset(/*with_state=*/true);
    AddWorker(7001);
    AddWorker(7002);
    const std::string id = Submit(ElasticSpec(2, 5)).value().id();
    for (int step = 1; step <= 5; ++step) Step(id, step);
    CheckpointAll(id, 5);
    jobs_->FlushIo();
    return id;
  }

  // A new coordinator on the same state (saved first): the jobs restored,
  // and `workers` LOST, as a restored registry holds them until they
  // register again.
  void RestartCoordinator(const std::vector<std::string>& workers) {
    jobs_->FlushIo();
    Reset(/*with_state=*/true);
    ASSERT_TRUE(jobs_->Restore().ok());
    for (const std::string& w : workers) {
      registry_.MarkLost(w, incarnations_[w], "coordinator restarted");
    }
  }

  // The survivors answer (heartbeat), then the job is scheduled.
  void HeartbeatAllAndSchedule(const std::vector<std::string>& workers) {
    clock_.Advance(absl::Milliseconds(10));
    for (const std::string& w : workers) Heartbeat(w);
    Schedule();
  }

  // The plans the reports above started, unless a test holds them.
  void RunPlans() {
    if (!hold_plans_) background_.RunAll();
  }
  // Every worker reports idle after the jobs that ended, so both sweeps of
  // their checkpoint directories run (SweepStoppedJobsLocked): the
  // directories are free again.
  void AwaitEndSweeps() {
    clock_.Advance(absl::Milliseconds(10));
    for (const auto& [worker, incarnation] : incarnations_) Heartbeat(worker);
    Schedule();
    jobs_->FlushIo();
  }
  // Places what can be placed, planning included.
  void Schedule() {
    jobs_->ScheduleQueued();
    background_.RunAll();
  }
  // Steps `from` to `boundary` of job `id`, and every writer's checkpoint
  // of `boundary`, which the job re-plans after: the job as it is then.
  // Jobs `a` and `b` run steps 1 to 5 and checkpoint step 5; then the
  // workers `lost` are lost, and `a` (theirs) must be recovering.
  void CheckpointBothThenLose(const std::string& a, const std::string& b,
                              const std::vector<std::string>& lost) {
    for (int step = 1; step <= 5; ++step) {
      Step(a, step);
      Step(b, step);
    }
    CheckpointAll(a, 5);
    CheckpointAll(b, 5);
    for (const std::string& w : lost) registry_.MarkLost(w, incarnations_[w], "killed");
    ASSERT_EQ(jobs_->Get(a).value().state(), v1::JOB_STATE_RECOVERING);
  }
  v1::Job PassBoundary(const std::string& id, int64_t from, int64_t boundary) {
    for (int64_t step = from; step <= boundary; ++step) Step(id, step);
    CheckpointAll(id, boundary);
    return jobs_->Get(id).value();
  }
  // Step 2 of job `id` on every worker, whose reports must ask for a
  // boundary (one micro-batch each), the steps up to it, and its
  // checkpoint.
  void PassBoundaryEveryWorker(const std::string& id) {
    const int64_t boundary = StepEveryWorker(id, 2, 1);
    ASSERT_GT(boundary, 2) << jobs_->Get(id).value().reason();
    for (int64_t step = 3; step <= boundary; ++step) StepEveryWorker(id, step, 1);
    CheckpointAll(id, boundary);
  }
  // A 2-stage job (spec.elastic.max_workers 3) on two new workers that ran
  // step 1, then a spare (port 7003) its step-2 report asks a growth
  // boundary for: `boundary` is that step (0: none asked for).
  struct Growing {
    std::string id, w1, w2, spare;
    int64_t boundary = 0;
  };
  Growing StartGrowing() {
    Growing g;
    g.w1 = AddWorker(7001);
    g.w2 = AddWorker(7002);
    v1::JobSpec spec = ElasticSpec(2, 5);
    spec.mutable_elastic()->set_max_workers(3);
    g.id = Submit(spec).value().id();
    Step(g.id, 1);
    g.spare = AddWorker(7003);
    Schedule();
    g.boundary = Step(g.id, 2).stop_after_step();
    return g;
  }
  // Job `id` (CpuOnlySpec) is QUEUED with `ready` of its 8 CPU workers
  // READY.
  void ExpectWaitingForCpus(const std::string& id, int ready) {
    const v1::Job job = jobs_->Get(id).value();
    EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
    EXPECT_EQ(job.reason(), absl::StrCat("waiting for 8 READY CPU workers (", ready,
                                         " ready; spec.parallelism.tensor_mode 3d runs on the "
                                         "CPU backend only)"));
  }
  // Submits, and plans what that placed: the job as it is then.
  absl::StatusOr<v1::Job> Submit(const v1::JobSpec& spec) {
    absl::StatusOr<v1::Job> job = jobs_->Submit(spec);
    background_.RunAll();
    if (!job.ok()) return job;
    return jobs_->Get(job->id());
  }

  FakeClock clock_;
  // The job manager's elapsed clock when separate_elapsed_clock_ is set
  // before Reset (clock_ is then only the wall clock, which tests step).
  FakeClock elapsed_clock_;
  bool separate_elapsed_clock_ = false;
  // What saving a worker's record does (on the registry's store thread);
  // unset: saved at once.
  std::function<absl::Status(const v1::Worker&)> on_persist_;
  WorkerRegistry registry_;
  AssignmentHub hub_;
  BackgroundQueue background_;  // outlives jobs_
  bool hold_plans_ = false;     // Step and Checkpoint leave the jobs PLANNING
  MemoryStore store_;
  ObservingStore observing_{&store_};
  std::unique_ptr<CoordinatorState> state_;
  std::unique_ptr<JobManager> jobs_;
  std::map<std::string, int64_t> incarnations_;
};

// Two live jobs checkpointing into one directory would overwrite (and
// expire) each other's step directories: the second is refused, naming the
// first, until the first has ended. The default directory is per job.
TEST_F(JobManagerElasticTest, CheckpointDirOfALiveJob_RefusedUntilItEnds) {
  AddWorker(7001);
  AddWorker(7002);
  v1::JobSpec spec = ElasticSpec(1, 5);
  spec.mutable_checkpoint()->set_dir("shared/ck");
  const std::string first = Submit(spec).value().id();
  const absl::StatusOr<v1::Job> second = Submit(spec);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(second.status().message(), "spec.checkpoint.dir: \"shared/ck\" is in use by job " +
                                           first +
                                           " (RUNNING); give this job a directory of its own");
  EXPECT_TRUE(Submit(ElasticSpec(1, 5)).ok());  // checkpoints/<its id>
  ASSERT_TRUE(jobs_->Cancel(first).ok());
  // Ended, its leftovers not yet removed (its workers have not said they
  // stopped): a retry will succeed, so UNAVAILABLE (clients retry it), not
  // a spec error that sends the user to another directory.
  const absl::StatusOr<v1::Job> meanwhile = Submit(spec);
  EXPECT_EQ(meanwhile.status().code(), absl::StatusCode::kUnavailable) << meanwhile.status();
  EXPECT_EQ(meanwhile.status().message(),
            "spec.checkpoint.dir: \"shared/ck\" is in use by job " + first +
                " (CANCELLED: its leftover files are being removed once its workers have "
                "stopped, within a minute; retry then); nothing was submitted");
  AwaitEndSweeps();  // the ended job's leftovers removed: the directory is free
  EXPECT_TRUE(Submit(spec).ok());
}

// A job that ends before it ran (cancelled while queued, or its queue
// timeout) wrote nothing: its directory is free once the first sweep is
// done. It waited for a second sweep after its workers stopped, and with
// no workers that never came: the directory stayed reserved until a
// restart.
TEST_F(JobManagerElasticTest, CheckpointDirOfAJobThatNeverRan_FreeOnceItEnds) {
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_checkpoint()->set_dir("never/ran");
  const std::string queued = Submit(spec).value().id();
  ASSERT_EQ(jobs_->Get(queued).value().state(), v1::JOB_STATE_QUEUED);
  ASSERT_TRUE(jobs_->Cancel(queued).ok());
  jobs_->FlushIo();
  AwaitEndSweeps();
  clock_.Advance(absl::Minutes(5));  // past every wait for stopping workers
  Schedule();
  jobs_->FlushIo();
  const absl::StatusOr<v1::Job> again = Submit(spec);
  EXPECT_TRUE(again.ok()) << again.status();
}

// An ended job's directory may be taken again, but not while it holds a
// complete checkpoint of a step the new job would write: the new job's
// step-N files would replace the old checkpoint's one by one (its manifest
// then naming checksums no file has) and its sweeps would delete it. A job
// that starts from the newest of them writes only later steps: accepted.
TEST_F(JobManagerElasticTest, EndedJobsDirWithLaterCompleteCheckpoints_Refused) {
  AddWorker(7001);
  AddWorker(7002);
  v1::JobSpec a = ElasticSpec(1, 5);
  a.mutable_checkpoint()->set_dir("reuse/a");
  a.mutable_checkpoint()->set_keep(2);
  const std::string first = Submit(a).value().id();
  StepCheckpointingEvery5(first, 10);
  ASSERT_EQ(jobs_->Get(first).value().progress().checkpoint_step(), 10);
  ASSERT_TRUE(jobs_->Cancel(first).ok());
  AwaitEndSweeps();
  WriteUnitFiles("reuse/a/step-00000005");
  WriteUnitFiles("reuse/a/step-00000010");
  absl::Status refused = jobs_->Submit(a).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_EQ(refused.message(),
            "spec.checkpoint.dir: \"reuse/a\" holds the complete checkpoint "
            "\"reuse/a/step-00000005\" of step 5, which this job, starting at step 0, would "
            "overwrite file by file and then delete; start from it (spec.init.from), or give this "
            "job a directory of its own");
  v1::JobSpec from_five = a;
  from_five.mutable_init()->set_from("reuse/a/step-00000005");
  refused = jobs_->Submit(from_five).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "\"reuse/a/step-00000010\" of step 10"))
      << refused;
  v1::JobSpec from_ten = a;
  from_ten.mutable_init()->set_from("reuse/a/step-00000010");
  const absl::StatusOr<v1::Job> continued = jobs_->Submit(from_ten);
  ASSERT_TRUE(continued.ok()) << continued.status();
  EXPECT_EQ(continued->progress().step(), 10);
  // Its summary says the 10 steps are where it started, not what it
  // trained (the token counter and the current job of /metrics read it).
  for (const JobManager::JobSummary& s : jobs_->Summaries()) {
    EXPECT_EQ(s.init_step, s.id == continued->id() ? 10 : 0) << s.id;
    if (s.id == continued->id()) {
      EXPECT_EQ(s.step, 10);
    }
  }
}

// A checkpoint directory's files are replaced by each checkpoint and its
// step directories deleted as they expire: a weights file there (another
// live job's, or the job's own) would be lost, and two directories that
// nest would expire each other's steps. Each is refused, naming the other.
// A live job expires its older checkpoints: a job may not start from one
// of them (it would resume from it after a loss, until it has a checkpoint
// of its own). Once that job has ended, it may; and while it lives, no new
// job may take the directory it started from.
TEST_F(JobManagerElasticTest, InitFromALiveJobsCheckpoint_RefusedUntilItEnds) {
  AddWorker(7001);
  AddWorker(7002);
  v1::JobSpec a = ElasticSpec(1, 7);
  a.mutable_checkpoint()->set_dir("init-from-live/a");
  const std::string first = Submit(a).value().id();
  for (int step = 1; step <= 7; ++step) Step(first, step);
  CheckpointAll(first, 7);
  ASSERT_EQ(jobs_->Get(first).value().progress().checkpoint_step(), 7);
  jobs_->FlushIo();  // its manifest written
  WriteUnitFiles("init-from-live/a/step-00000007");
  v1::JobSpec b = ElasticSpec(1, 7);
  b.mutable_checkpoint()->set_dir("init-from-live/b");
  b.mutable_init()->set_from("init-from-live/a/step-00000007");
  absl::Status refused = jobs_->Submit(b).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(),
                                "spec.init.from: \"init-from-live/a/step-00000007\" "
                                "lies in the checkpoint directory \"init-from-live/a\" "
                                "of job " +
                                    first))
      << refused;

  ASSERT_TRUE(jobs_->Cancel(first).ok());
  jobs_->FlushIo();
  // At once, before its workers have said they stopped: the sweeps remove
  // only steps without a manifest, never the complete one started from.
  const absl::StatusOr<v1::Job> second = Submit(b);
  ASSERT_TRUE(second.ok()) << second.status();
  AwaitEndSweeps();  // the ended job's leftovers removed: its directory is free
  EXPECT_EQ(second->progress().step(), 7);
  v1::JobSpec c = ElasticSpec(1, 7);
  c.mutable_checkpoint()->set_dir("init-from-live/a");
  c.mutable_init()->set_from("init-from-live/a/step-00000007");  // it writes later steps only
  refused = jobs_->Submit(c).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "where job " + second->id())) << refused;
}

// Stages still write a step or two after a cancel (it reaches them tens of
// ms later). Those files come after the end's sweep; a second sweep
// removes them once every worker of the job has reported idle since the
// end, and not before; whatever the file's time says (here the file
// server's clock an hour ahead of the coordinator's: a time filter kept it
// for good).
TEST_F(JobManagerElasticTest, Cancelled_StepsWrittenAfterTheEnd_RemovedOnceTheWorkersStopped) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  std::string late;
  const std::string id = CancelledWithALateStep("late/a", &late);
  const timespec ahead = absl::ToTimespec(absl::Now() + absl::Hours(1));
  const timespec times[2] = {ahead, ahead};
  ASSERT_EQ(utimensat(AT_FDCWD, (late + "/unit-0000.safetensors").c_str(), times, 0), 0);
  const auto exists = [](const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0;
  };
  clock_.Advance(absl::Milliseconds(10));
  Heartbeat(w1);  // w2 has not said it stopped
  Schedule();
  jobs_->FlushIo();
  EXPECT_TRUE(exists(late)) << "removed while a worker may still write there";
  v1::JobSpec reuse = ElasticSpec(1, 5);
  reuse.mutable_checkpoint()->set_dir("late/a");
  EXPECT_EQ(jobs_->Submit(reuse).status().code(), absl::StatusCode::kInvalidArgument)
      << "the directory is the cancelled job's until its sweep is done";
  Heartbeat(w2);
  Schedule();
  jobs_->FlushIo();
  EXPECT_FALSE(exists(late)) << "left behind";
  EXPECT_TRUE(exists(OutputDir() + "/late/a/step-00000005/manifest.json"));
}

// An ended job is not pruned while its checkpoint directory is being swept
// (the second sweep runs only for jobs still there, and the directory is
// the job's until it is done), even when no ended job is to be kept: the
// step its late stage wrote would stay. The first pass after it prunes it.
TEST_F(JobManagerElasticTest, EndedJobBeingSwept_PrunedOnlyOnceTheSweepIsDone) {
  Reset(/*with_state=*/false, /*max_ended_jobs=*/0);
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  std::string late;
  const std::string id = CancelledWithALateStep("pruned/a", &late);
  clock_.Advance(absl::Milliseconds(10));
  Heartbeat(w1);  // w2 has not said it stopped
  Schedule();
  jobs_->FlushIo();
  EXPECT_TRUE(jobs_->Get(id).ok()) << "pruned while its second sweep was pending";
  Heartbeat(w2);
  Schedule();
  jobs_->FlushIo();
  struct stat st;
  EXPECT_NE(stat(late.c_str(), &st), 0) << "left behind";
  Schedule();
  EXPECT_EQ(jobs_->Get(id).status().code(), absl::StatusCode::kNotFound);
}

// A coordinator restarted before an ended job's second sweep had run lost
// it (it is not stored): a step a stage wrote after the end stayed. The
// restored coordinator sweeps again once the workers have stopped.
TEST_F(JobManagerElasticTest, RestartBeforeTheLateSweep_StepsWrittenAfterTheEndStillRemoved) {
  Reset(/*with_state=*/true);
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  std::string late;
  const std::string id = CancelledWithALateStep("late/restart", &late);
  const auto exists = [](const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0;
  };
  Reset(/*with_state=*/true);  // before either worker said it stopped
  ASSERT_TRUE(jobs_->Restore().ok());
  clock_.Advance(absl::Milliseconds(10));
  Schedule();
  jobs_->FlushIo();
  EXPECT_TRUE(exists(late)) << "removed while a worker may still write there";
  v1::JobSpec reuse = ElasticSpec(1, 5);
  reuse.mutable_checkpoint()->set_dir("late/restart");
  EXPECT_EQ(jobs_->Submit(reuse).status().code(), absl::StatusCode::kInvalidArgument)
      << "the directory is the ended job's until its sweep is done";
  Heartbeat(w1);
  Heartbeat(w2);
  Schedule();
  jobs_->FlushIo();
  EXPECT_FALSE(exists(late)) << "left behind";
  EXPECT_TRUE(exists(OutputDir() + "/late/restart/step-00000005/manifest.json"));
  // Free again, for a job that goes on from the complete step it holds
  // (one starting before it would overwrite it).
  WriteUnitFiles("late/restart/step-00000005");
  reuse.mutable_init()->set_from("late/restart/step-00000005");
  const absl::StatusOr<v1::Job> reused = jobs_->Submit(reuse);
  EXPECT_TRUE(reused.ok()) << reused.status();
}

// Two ended jobs of one checkpoint directory, the later one started from
// the earlier one's checkpoint: the directory is the later one's. After a
// restart, its missing manifest was left unwritten (the earlier job
// "overlapped"), and the earlier job's sweep removed its complete step
// (only the earlier job's own were kept).
TEST_F(JobManagerElasticTest, RestartAfterTwoEndedJobsInOneDir_TheLaterJobsManifestWritten) {
  Reset(/*with_state=*/true);
  AddWorker(7001);
  AddWorker(7002);
  const std::string step10 = TwoEndedJobsInOneDir("continued/one");
  Reset(/*with_state=*/true);
  ASSERT_TRUE(jobs_->Restore().ok());
  AwaitEndSweeps();
  EXPECT_TRUE(std::filesystem::is_regular_file(step10 + "/unit-0000.safetensors"));
  EXPECT_TRUE(std::filesystem::is_regular_file(step10 + "/" + kCheckpointManifestName));
  // The sweeps are done (the directory is free), and a run goes on from it.
  v1::JobSpec next = ElasticSpec(2, 5);
  next.mutable_checkpoint()->set_dir("continued/one");
  next.mutable_init()->set_from("continued/one/step-00000010");
  const absl::StatusOr<v1::Job> continued = Submit(next);
  ASSERT_TRUE(continued.ok()) << continued.status();
  EXPECT_EQ(continued->progress().step(), 10);
}

// The same, with a unit file of that step not back at the restart (a
// volume restored by hand): no manifest is written over it, and the earlier
// job's sweep still keeps the step, which the later job holds complete. The
// next coordinator writes its manifest once the file is back.
TEST_F(JobManagerElasticTest, RestartAfterTwoEndedJobsInOneDir_NoManifestYet_StepKept) {
  Reset(/*with_state=*/true);
  AddWorker(7001);
  AddWorker(7002);
  const std::string step10 = TwoEndedJobsInOneDir("continued/two");
  const std::string missing = absl::StrFormat("%s/unit-%04d.safetensors", step10, kUnits - 1);
  const std::string manifest = absl::StrCat(step10, "/", kCheckpointManifestName);
  ASSERT_TRUE(std::filesystem::remove(missing));
  Reset(/*with_state=*/true);
  ASSERT_TRUE(jobs_->Restore().ok());
  AwaitEndSweeps();
  EXPECT_TRUE(std::filesystem::is_regular_file(step10 + "/unit-0000.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(manifest));
  std::ofstream(missing, std::ios::binary) << std::string(100 + kUnits - 1, 'w');
  Reset(/*with_state=*/true);
  ASSERT_TRUE(jobs_->Restore().ok());
  jobs_->FlushIo();
  EXPECT_TRUE(std::filesystem::is_regular_file(manifest));
}

// An ended job whose manifest's write kept failing, its directory taken
// over since by a job started from its checkpoint (init.from, a continued
// run) that completed the same step: the ended job's retry does not rename
// its manifest (its checksums, its job id) over the later job's.
TEST_F(JobManagerElasticTest, EndedJobsManifestRetry_DirTakenOverSince_LaterJobsManifestKept) {
  AddWorker(7001);
  AddWorker(7002);
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_checkpoint()->set_dir("taken-over");
  const std::string a = Submit(spec).value().id();
  const std::string step10 = OutputDir() + "/taken-over/step-00000010";
  const std::string manifest = absl::StrCat(step10, "/", kCheckpointManifestName);
  std::filesystem::create_directories(manifest + "/in-the-way");
  StepCheckpointingEvery5(a, 10);
  jobs_->FlushIo();
  ASSERT_TRUE(std::filesystem::is_directory(manifest));  // a's write failed: retried in 5 s
  ASSERT_TRUE(jobs_->Cancel(a).ok());
  AwaitEndSweeps();
  std::filesystem::remove_all(manifest);  // space freed
  WriteUnitFiles("taken-over/step-00000005");
  spec.mutable_init()->set_from("taken-over/step-00000005");
  const std::string b = Submit(spec).value().id();
  for (int step = 6; step <= 10; ++step) Step(b, step);
  CheckpointAll(b, 10);
  jobs_->FlushIo();
  // b's files, at the sizes a's manifest records too: only the takeover
  // tells them apart.
  WriteReportedUnitFiles(step10);
  ASSERT_EQ(ReadCheckpointManifest(manifest).value().job_id, b);
  clock_.Advance(absl::Seconds(5));
  Schedule();  // a's retry
  jobs_->FlushIo();
  EXPECT_EQ(ReadCheckpointManifest(manifest).value().job_id, b);
  EXPECT_EQ(jobs_->Get(a).value().state(), v1::JOB_STATE_CANCELLED);
}

// init.from through a link to a directory the workers would refuse to
// open files in (a control character in its name): refused at submit, not
// when the job's first stage loads it.
TEST_F(JobManagerElasticTest, InitFromThroughALinkToANameWorkersRefuse_RefusedAtSubmit) {
  AddWorker(7001);
  AddWorker(7002);
  v1::JobSpec a = ElasticSpec(1, 7);
  a.mutable_checkpoint()->set_dir("ctl/a");
  const std::string first = Submit(a).value().id();
  for (int step = 1; step <= 7; ++step) Step(first, step);
  CheckpointAll(first, 7);
  ASSERT_TRUE(jobs_->Cancel(first).ok());
  AwaitEndSweeps();
  WriteUnitFiles("ctl/a/step-00000007");
  std::filesystem::rename(OutputDir() + "/ctl/a", OutputDir() + "/ctl/a\x01z");
  ASSERT_EQ(symlink("a\x01z", (OutputDir() + "/ctl/link").c_str()), 0);
  v1::JobSpec b = ElasticSpec(1, 9);
  b.mutable_init()->set_from("ctl/link/step-00000007");
  const absl::Status refused = jobs_->Submit(b).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(),
                                "resolves to a directory whose files the workers cannot open "
                                "(the resolved path: path has a control character at byte 5"))
      << refused;
  // Renamed, the link leads to a name that passes: accepted.
  std::filesystem::rename(OutputDir() + "/ctl/a\x01z", OutputDir() + "/ctl/b");
  ASSERT_EQ(unlink((OutputDir() + "/ctl/link").c_str()), 0);
  ASSERT_EQ(symlink("b", (OutputDir() + "/ctl/link").c_str()), 0);
  const absl::StatusOr<v1::Job> accepted = jobs_->Submit(b);
  EXPECT_TRUE(accepted.ok()) << accepted.status();
}

// init.from's unit files are checked at submit against the manifest: a
// missing or truncated one is refused naming it, not found when the job
// starts.
TEST_F(JobManagerElasticTest, InitFromADamagedCheckpoint_RefusedAtSubmitNamingTheFile) {
  AddWorker(7001);
  AddWorker(7002);
  v1::JobSpec a = ElasticSpec(1, 7);
  a.mutable_checkpoint()->set_dir("damaged/a");
  const std::string first = Submit(a).value().id();
  for (int step = 1; step <= 7; ++step) Step(first, step);
  CheckpointAll(first, 7);
  ASSERT_TRUE(jobs_->Cancel(first).ok());
  AwaitEndSweeps();
  v1::JobSpec b = ElasticSpec(1, 9);
  b.mutable_init()->set_from("damaged/a/step-00000007");
  absl::Status refused = jobs_->Submit(b).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(),
                                "spec.init.from: damaged/a/step-00000007: its manifest lists "
                                "unit-0000.safetensors, which is missing"))
      << refused;
  WriteUnitFiles("damaged/a/step-00000007");
  const std::string unit1 = OutputDir() + "/damaged/a/step-00000007/unit-0001.safetensors";
  ASSERT_EQ(truncate(unit1.c_str(), 50), 0);
  refused = jobs_->Submit(b).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(),
                                "unit-0001.safetensors is 50 bytes, its manifest records 101"))
      << refused;
  WriteUnitFiles("damaged/a/step-00000007");
  const absl::StatusOr<v1::Job> second = Submit(b);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->progress().step(), 7);
}

TEST_F(JobManagerElasticTest, WeightsInACheckpointDirOrNestedDirs_Refused) {
  AddWorker(7001);
  AddWorker(7002);
  v1::JobSpec spec = ElasticSpec(1, 5);
  spec.mutable_checkpoint()->set_dir("runs/ck");
  const std::string first = Submit(spec).value().id();
  const auto refused = [&](const v1::JobSpec& s) {
    const absl::StatusOr<v1::Job> job = Submit(s);
    EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << job.status();
    return std::string(job.status().message());
  };
  v1::JobSpec into = ElasticSpec(1, 0);
  into.mutable_output()->set_weights_path("runs/ck/step-00000005/unit-0000.safetensors");
  EXPECT_EQ(refused(into),
            "spec.output.weights_path: \"runs/ck/step-00000005/unit-0000.safetensors\" lies in "
            "the checkpoint directory \"runs/ck\" of job " +
                first +
                " (RUNNING), whose checkpoints would replace or delete it; write it "
                "elsewhere");
  v1::JobSpec nested = ElasticSpec(1, 5);
  nested.mutable_checkpoint()->set_dir("runs/ck/inner");
  EXPECT_EQ(refused(nested),
            "spec.checkpoint.dir: \"runs/ck/inner\" overlaps \"runs/ck\", that "
            "of job " +
                first + " (RUNNING); give this job a directory of its own");
  nested.mutable_checkpoint()->set_dir("runs");
  EXPECT_EQ(refused(nested), "spec.checkpoint.dir: \"runs\" overlaps \"runs/ck\", that of job " +
                                 first + " (RUNNING); give this job a directory of its own");
  v1::JobSpec own = ElasticSpec(1, 5);
  own.mutable_checkpoint()->set_dir("mine");
  own.mutable_output()->set_weights_path("mine/w.safetensors");
  EXPECT_EQ(refused(own),
            "spec.output.weights_path: \"mine/w.safetensors\" lies in this job's own checkpoint "
            "directory \"mine\", whose checkpoints would replace or delete it; write it "
            "elsewhere");
  // A live job's weights file, then a checkpoint directory around it.
  v1::JobSpec weights = ElasticSpec(1, 0);
  weights.mutable_output()->set_weights_path("out/w.safetensors");
  const std::string writer = Submit(weights).value().id();
  v1::JobSpec around = ElasticSpec(1, 5);
  around.mutable_checkpoint()->set_dir("out");
  EXPECT_EQ(refused(around),
            "spec.checkpoint.dir: \"out\" holds \"out/w.safetensors\", the "
            "weights file of job " +
                writer + " (RUNNING); give this job a directory of its own");
  // Nor may paths nest with a live job's weights file, or hold a live or own
  // checkpoint directory: one of the two would fail to be written (a file
  // where a directory must go), after a whole run.
  v1::JobSpec under = ElasticSpec(1, 0);
  under.mutable_output()->set_weights_path("out/w.safetensors/x");
  EXPECT_EQ(refused(under),
            "spec.output.weights_path: \"out/w.safetensors/x\" lies under \"out/w.safetensors\", "
            "the output of job " +
                writer + " (RUNNING), which has not ended; give this job a file of its own");
  under.mutable_output()->set_weights_path("out");
  EXPECT_EQ(refused(under),
            "spec.output.weights_path: \"out\" holds \"out/w.safetensors\", the "
            "output of job " +
                writer + " (RUNNING), which has not ended; give this job a file of its own");
  under.mutable_output()->set_weights_path("runs");
  EXPECT_EQ(
      refused(under),
      "spec.output.weights_path: \"runs\" holds the checkpoint directory \"runs/ck\" of job " +
          first + " (RUNNING), whose checkpoints it would stop; write it elsewhere");
  for (const char* in_defaults : {"checkpoints", "checkpoints/w.safetensors"}) {
    under.mutable_output()->set_weights_path(in_defaults);
    EXPECT_TRUE(absl::StrContains(refused(under),
                                  "which holds the checkpoint directories of jobs "
                                  "that name none"))
        << in_defaults;
  }
  v1::JobSpec ck_under = ElasticSpec(1, 5);
  ck_under.mutable_checkpoint()->set_dir("out/w.safetensors/ck");
  EXPECT_EQ(refused(ck_under),
            "spec.checkpoint.dir: \"out/w.safetensors/ck\" lies under \"out/w.safetensors\", the "
            "weights file of job " +
                writer + " (RUNNING); give this job a directory of its own");
  v1::JobSpec own_under = ElasticSpec(1, 5);
  own_under.mutable_checkpoint()->set_dir("mine2/ck");
  own_under.mutable_output()->set_weights_path("mine2");
  EXPECT_EQ(refused(own_under),
            "spec.output.weights_path: \"mine2\" holds this job's own checkpoint directory "
            "\"mine2/ck\", which could then not be made; write it elsewhere");
  // Siblings are fine, and so is everything once the other job has ended.
  // The refusals took no ids (a refused request changes nothing).
  v1::JobSpec sibling = ElasticSpec(1, 0);
  sibling.mutable_output()->set_weights_path("runs/ck2.safetensors");
  const absl::StatusOr<v1::Job> third = Submit(sibling);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(first, "job-1");
  EXPECT_EQ(writer, "job-2");
  EXPECT_EQ(third->id(), "job-3");
  ASSERT_TRUE(jobs_->Cancel(first).ok());
  AwaitEndSweeps();  // the ended job's leftovers removed: the directory is free
  EXPECT_TRUE(Submit(into).ok());
}

// "checkpoints" holds the default directories: as a job's own it would
// overlap every later job that names none, refused for a field it never
// set. It is refused itself; and a default that collides says it was
// the default.
TEST_F(JobManagerElasticTest, CheckpointDir_TheDefaultsRoot_Refused_ACollidingDefaultSaysSo) {
  AddWorker(7001);
  v1::JobSpec root = ElasticSpec(1, 5);
  root.mutable_checkpoint()->set_dir("checkpoints");
  const absl::StatusOr<v1::Job> refused = Submit(root);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_EQ(refused.status().message(),
            "spec.checkpoint.dir: \"checkpoints\" holds the directories of jobs that name none "
            "(checkpoints/<job id>); name one of its own, e.g. checkpoints/my-run");
  v1::JobSpec squatter = ElasticSpec(1, 5);
  squatter.mutable_checkpoint()->set_dir("checkpoints/job-2");  // the next default
  ASSERT_TRUE(Submit(squatter).ok());
  const absl::StatusOr<v1::Job> defaulted = Submit(ElasticSpec(1, 5));
  EXPECT_EQ(defaulted.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(defaulted.status().message(),
                               "spec.checkpoint.dir: \"checkpoints/job-2\" (the default, as the "
                               "spec names none) is in use by job job-1"))
      << defaulted.status();
}

TEST_F(JobManagerElasticTest, Checkpoint_CompleteOnlyOnceEveryUnitIsIn_ManifestWritten) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  EXPECT_EQ(jobs_->Get(id).value().spec().checkpoint().dir(), "checkpoints/" + id);
  for (int step = 1; step <= 5; ++step) Step(id, step);
  ASSERT_TRUE(Checkpoint(id, 0, 5).ok());
  EXPECT_EQ(jobs_->Get(id).value().progress().checkpoint_step(), 0);  // stage 1 missing
  ASSERT_TRUE(Checkpoint(id, 1, 5).ok());
  EXPECT_EQ(jobs_->Get(id).value().progress().checkpoint_step(), 5);
  jobs_->FlushIo();
  struct stat st;
  EXPECT_EQ(
      stat(absl::StrCat(OutputDir(), "/checkpoints/", id, "/step-00000005/manifest.json").c_str(),
           &st),
      0);
}

// A manifest whose write fails (here: a directory in its place, which
// even root cannot rename over) is written again once the way is clear,
// without another checkpoint: without it the checkpoint could not be
// exported or named by init.from.
TEST_F(JobManagerElasticTest, ManifestWriteFails_WrittenAgainLater) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_checkpoint()->set_dir("manifest-retry");  // job ids repeat across tests
  std::string manifest;
  const std::string id = CompleteWithoutManifest(spec, /*steps=*/5, &manifest);
  // A retry writes only over the files the manifest records.
  WriteReportedUnitFiles(OutputDir() + "/manifest-retry/step-00000005");
  HeartbeatAllAndSchedule({w1, w2});  // within 5 s of the failure: not yet
  jobs_->FlushIo();
  EXPECT_FALSE(std::filesystem::exists(manifest));
  clock_.Advance(absl::Seconds(5));
  HeartbeatAllAndSchedule({w1, w2});
  jobs_->FlushIo();
  EXPECT_TRUE(std::filesystem::is_regular_file(manifest));
}

// A coordinator that stopped while a complete checkpoint's manifest waited
// for its retry (in memory only): the next one writes it at its restore.
TEST_F(JobManagerElasticTest, ManifestMissingAtARestart_WrittenByTheNextCoordinator) {
  Reset(/*with_state=*/true);
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_checkpoint()->set_dir("manifest-restart");  // job ids repeat across tests
  std::string manifest;
  const std::string id = CompleteWithoutManifest(spec, /*steps=*/6, &manifest);
  // Not over files other than those recorded (here: none were written).
  RestartCoordinator({w1, w2});
  jobs_->FlushIo();
  EXPECT_FALSE(std::filesystem::exists(manifest));
  // Each unit file there at its recorded size (CheckpointReport's).
  const std::string step_dir = OutputDir() + "/manifest-restart/step-00000005";
  for (int u = 0; u < 32; ++u) {
    std::ofstream(absl::StrFormat("%s/unit-%04d.safetensors", step_dir, u), std::ios::binary)
        << std::string(100 + u, 'w');
  }
  RestartCoordinator({w1, w2});
  jobs_->FlushIo();
  EXPECT_TRUE(std::filesystem::is_regular_file(manifest));
  EXPECT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RECOVERING);
  // A directory removed since (an operator's) is not made again.
  std::filesystem::remove_all(step_dir);
  RestartCoordinator({w1, w2});
  jobs_->FlushIo();
  EXPECT_FALSE(std::filesystem::exists(step_dir));
}

// A coordinator restarting while a job recovers keeps what it recovers
// from in the job's reason (before, "the coordinator restarted" replaced
// it, and a later queue timeout named only that); once, however many
// restarts follow.
TEST_F(JobManagerElasticTest, RestartWhileRecovering_KeepsTheCauseOnce) {
  Reset(/*with_state=*/true);
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  for (int step = 1; step <= 5; ++step) Step(id, step);
  CheckpointAll(id, 5);
  registry_.MarkLost(w2, incarnations_[w2], "its host went down");
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RECOVERING);
  for (int restart = 0; restart < 2; ++restart) {
    RestartCoordinator({w1, w2});
    const v1::Job job = jobs_->Get(id).value();
    ASSERT_EQ(job.state(), v1::JOB_STATE_RECOVERING) << job.reason();
    EXPECT_TRUE(
        absl::StartsWith(job.reason(), "recovering: the coordinator restarted (while recovering: "))
        << job.reason();
    EXPECT_TRUE(absl::StrContains(job.reason(), "its host went down")) << job.reason();
    const std::string restarted = "the coordinator restarted";
    EXPECT_EQ(job.reason().find(restarted, job.reason().find(restarted) + 1), std::string::npos)
        << job.reason();
  }
}

// A step one stage never reported (its write failed) cannot complete once
// a later one has: its directory, with what the other stages wrote, goes.
TEST_F(JobManagerElasticTest, CheckpointThatCannotComplete_ItsDirectoryRemoved) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  for (int step = 1; step <= 5; ++step) Step(id, step);
  const std::string step5 = absl::StrCat(OutputDir(), "/checkpoints/", id, "/step-00000005");
  std::filesystem::create_directories(step5);
  std::ofstream(step5 + "/unit-0000.safetensors") << "stage 0's files";
  ASSERT_TRUE(Checkpoint(id, 0, 5).ok());
  for (int step = 6; step <= 10; ++step) Step(id, step);
  CheckpointAll(id, 10);
  jobs_->FlushIo();
  EXPECT_EQ(jobs_->Get(id).value().progress().checkpoint_step(), 10);
  EXPECT_FALSE(std::filesystem::exists(step5));
  EXPECT_TRUE(std::filesystem::exists(
      absl::StrCat(OutputDir(), "/checkpoints/", id, "/step-00000010/manifest.json")));
}

// A job's end is saved before its incomplete checkpoints' files go (on
// the same queue): a crash during a long removal would otherwise lose the
// end (a SUCCEEDED job came back to train again), and a cancel waited
// for the removal before its state was durable.
TEST_F(JobManagerElasticTest, JobEnded_SavedBeforeItsCheckpointFilesGo) {
  const std::string id = CheckpointedJobInStore();
  for (int step = 6; step <= 10; ++step) Step(id, step);
  const std::string step10 = absl::StrCat(OutputDir(), "/checkpoints/", id, "/step-00000010");
  std::filesystem::create_directories(step10);
  std::ofstream(step10 + "/unit-0000.safetensors") << "stage 0's files";
  ASSERT_TRUE(Checkpoint(id, 0, 10).ok());  // stage 1's never come
  jobs_->FlushIo();
  bool saved = false, files_there_then = false;
  observing_.on_commit = [&](const std::vector<StoreWrite>& writes) {
    for (const StoreWrite& w : writes) {
      if (!saved && w.kind == StoreWrite::Kind::kPut && w.key == "jobs/" + id) {
        saved = true;
        files_there_then = std::filesystem::exists(step10);
      }
    }
  };
  ASSERT_TRUE(jobs_->Cancel(id).ok());
  jobs_->FlushIo();
  observing_.on_commit = nullptr;
  EXPECT_TRUE(saved);
  EXPECT_TRUE(files_there_then) << "the incomplete step was removed before the end was saved";
  EXPECT_FALSE(std::filesystem::exists(step10));
}

// A job that ends while a checkpoint is half written: that step can never
// complete, and its files go with the job; complete checkpoints stay. So
// does a step directory without a manifest that this coordinator never
// heard of (one a killed predecessor was writing or expiring). A file
// written after the end (another job's, once the directory is free) is
// left, and with it the directory; so is what is not a step directory.
TEST_F(JobManagerElasticTest, JobEnded_ItsIncompleteCheckpointsRemoved) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  for (int step = 1; step <= 5; ++step) Step(id, step);
  CheckpointAll(id, 5);
  for (int step = 6; step <= 15; ++step) Step(id, step);
  const std::string dir = absl::StrCat(OutputDir(), "/checkpoints/", id);
  for (const char* step : {"/step-00000010", "/step-00000015"}) {
    std::filesystem::create_directories(dir + step);
    std::ofstream(dir + step + "/unit-0000.safetensors") << "stage 0's files";
  }
  ASSERT_TRUE(Checkpoint(id, 0, 10).ok());
  ASSERT_TRUE(Checkpoint(id, 0, 15).ok());
  // Unknown to this coordinator: an expired step whose removal a killed
  // one began (manifest gone, units left); a directory that is no step's;
  // a link named as a step, to a directory elsewhere.
  std::filesystem::create_directories(dir + "/step-00000000");
  std::ofstream(dir + "/step-00000000/unit-0001.safetensors") << "left by a killed coordinator";
  std::filesystem::create_directories(dir + "/notes");
  std::ofstream(dir + "/notes/unit-0000.safetensors") << "the operator's";
  const std::string elsewhere = OutputDir() + "/elsewhere";
  std::filesystem::create_directories(elsewhere);
  std::ofstream(elsewhere + "/unit-0000.safetensors") << "not the job's";
  std::filesystem::create_directory_symlink(elsewhere, dir + "/step-00000020");
  // A checkpoint the job holds complete whose manifest is gone (its write
  // failed, or a coordinator died before it): its units are not leftovers.
  jobs_->FlushIo();
  std::filesystem::remove(dir + "/step-00000005/manifest.json");
  std::ofstream(dir + "/step-00000005/unit-0000.safetensors") << "a complete checkpoint's";
  // A file that appears after the job's end.
  const std::string later = dir + "/step-00000015/unit-0002.safetensors";
  std::ofstream(later) << "another job's";
  std::filesystem::last_write_time(
      later, std::filesystem::file_time_type::clock::now() + std::chrono::hours(1));
  ASSERT_TRUE(jobs_->Cancel(id).ok());
  jobs_->FlushIo();
  EXPECT_FALSE(std::filesystem::exists(dir + "/step-00000010"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/step-00000015/unit-0000.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/step-00000000"));
  EXPECT_TRUE(std::filesystem::exists(later));
  EXPECT_TRUE(std::filesystem::exists(dir + "/step-00000005/unit-0000.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/notes/unit-0000.safetensors"));
  EXPECT_TRUE(std::filesystem::is_symlink(dir + "/step-00000020"));
  EXPECT_TRUE(std::filesystem::exists(elsewhere + "/unit-0000.safetensors"));
}

// The slowest stage's checkpoint load lands in the plan's history entry,
// whether it comes with the start barrier or (where there is none: one
// worker, device links) with the first iteration's report; a value out of
// bounds is not taken.
TEST_F(JobManagerElasticTest, ResumeLoadSeconds_FromTheBarrierOrTheFirstReport) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  auto report = [&](const std::string& worker, double load, bool ready) {
    v1::ReportProgressRequest r;
    r.set_worker_id(worker);
    r.set_job_id(id);
    r.set_plan_version(jobs_->Get(id).value().plan_version());
    r.set_ready(ready);
    if (!ready) r.set_iteration(0);
    r.set_resume_load_seconds(load);
    EXPECT_TRUE(jobs_->ReportProgress(r).ok());
  };
  auto last_load = [&] {
    const v1::Job job = jobs_->Get(id).value();
    return job.plan_history(job.plan_history_size() - 1).resume_load_seconds();
  };
  report(w1, 0.25, /*ready=*/true);
  report(w2, 0.5, /*ready=*/true);
  EXPECT_EQ(last_load(), 0.5);
  report(w1, 0.75, /*ready=*/false);  // iteration 0's report
  EXPECT_EQ(last_load(), 0.75);
  report(w2, std::numeric_limits<double>::infinity(), /*ready=*/false);
  report(w2, 2e6, /*ready=*/true);
  report(w2, -1, /*ready=*/true);
  EXPECT_EQ(last_load(), 0.75);
}

TEST_F(JobManagerElasticTest, CheckpointReport_ForeignUnitOffIntervalOrBadChecksum_Refused) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  const v1::Assignment a = AssignmentOf(w1);
  v1::ReportProgressRequest r;
  r.set_worker_id(w1);
  r.set_job_id(id);
  r.set_plan_version(1);
  r.set_iteration(4);
  r.mutable_checkpoint()->set_step(5);
  v1::UnitFile* f = r.mutable_checkpoint()->add_units();
  f->set_unit(a.backward_units().end());  // stage 1's
  f->set_file(absl::StrFormat("unit-%04d.safetensors", f->unit()));
  f->set_bytes(10);
  f->set_sha256(std::string(64, 'a'));
  EXPECT_EQ(jobs_->ReportProgress(r).status().code(), absl::StatusCode::kInvalidArgument);
  f->set_unit(0);
  f->set_file("unit-0000.safetensors");
  r.mutable_checkpoint()->set_step(4);  // not a multiple of 5
  EXPECT_EQ(jobs_->ReportProgress(r).status().code(), absl::StatusCode::kInvalidArgument);
  r.mutable_checkpoint()->set_step(5);
  f->set_sha256("not hex");
  EXPECT_EQ(jobs_->ReportProgress(r).status().code(), absl::StatusCode::kInvalidArgument);
  f->set_sha256(std::string(64, 'a'));
  f->set_file("../../etc/passwd");
  EXPECT_EQ(jobs_->ReportProgress(r).status().code(), absl::StatusCode::kInvalidArgument);
  f->set_file("unit-0000.safetensors");
  f->set_bytes(kMaxUnitFileBytes + 1);  // would feed the metrics and manifest
  EXPECT_EQ(jobs_->ReportProgress(r).status().code(), absl::StatusCode::kInvalidArgument);
  f->set_bytes(10);
  for (const double seconds : {4e10, -1.0, std::nan("")}) {
    r.mutable_checkpoint()->set_write_seconds(seconds);
    const absl::Status refused = jobs_->ReportProgress(r).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << seconds;
    EXPECT_TRUE(
        absl::StartsWith(refused.message(), "ReportProgressRequest.checkpoint.write_seconds: "))
        << refused;
  }
  r.mutable_checkpoint()->set_write_seconds(0.5);
  *r.mutable_checkpoint()->add_units() = *f;  // unit 0 twice in one report
  const auto twice = jobs_->ReportProgress(r);
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(twice.status().message(), "unit 0 is listed twice"))
      << twice.status();
  EXPECT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING);
}

// A recovering job has released its workers, so a drain of its survivors
// found no job and skipped the min_workers check: both survivors of a
// 2-worker job were drained, and the job then waited until it FAILED.
TEST_F(JobManagerElasticTest, Drain_SurvivorsOfARecoveringJob_CountedAsWhileItRuns) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  for (int step = 1; step <= 5; ++step) Step(id, step);
  CheckpointAll(id, 5);
  const int64_t version = jobs_->Get(id).value().plan_version();
  ASSERT_TRUE(jobs_->ReportProgress(PeerFailure(id, w2, version)).ok());
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RECOVERING);
  ASSERT_TRUE(jobs_->Drain(w1).ok());
  const absl::Status second = jobs_->Drain(w2).status();
  EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition) << second;
  EXPECT_TRUE(absl::StrContains(second.message(), "fewer than its 1 workers")) << second;
  HeartbeatAllAndSchedule({w1, w2});
  const v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(WorkerIdsOf(job), (std::vector<std::string>{w2}));
}

// Two jobs recovering at once: the earlier re-planned first and took the
// later one's survivors as spares (they were reserved only on the later
// one's turn), which then waited for workers it had held.
TEST_F(JobManagerElasticTest, TwoJobsRecovering_TheFirstDoesNotTakeTheSecondsSurvivors) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string first = Submit(ElasticSpec(2, 5)).value().id();
  const std::string w3 = AddWorker(7003), w4 = AddWorker(7004);
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_elastic()->set_min_workers(2);
  const std::string second = Submit(spec).value().id();
  ASSERT_EQ(jobs_->Get(second).value().worker_ids_size(), 2);
  for (int step = 1; step <= 5; ++step) {
    Step(first, step);
    Step(second, step);
  }
  CheckpointAll(first, 5);
  CheckpointAll(second, 5);
  registry_.MarkLost(w2, incarnations_[w2], "killed");
  const int64_t version = jobs_->Get(second).value().plan_version();
  ASSERT_TRUE(jobs_->ReportProgress(PeerFailure(second, w4, version)).ok());
  ASSERT_EQ(jobs_->Get(first).value().state(), v1::JOB_STATE_RECOVERING);
  ASSERT_EQ(jobs_->Get(second).value().state(), v1::JOB_STATE_RECOVERING);
  HeartbeatAllAndSchedule({w1, w3, w4});
  const v1::Job a = jobs_->Get(first).value();
  const v1::Job b = jobs_->Get(second).value();
  ASSERT_EQ(b.state(), v1::JOB_STATE_RUNNING) << b.reason();
  EXPECT_EQ(WorkerIdsOf(b), (std::vector<std::string>{w3, w4}));
  ASSERT_EQ(a.state(), v1::JOB_STATE_RUNNING) << a.reason();
  EXPECT_EQ(WorkerIdsOf(a), (std::vector<std::string>{w1}));
}

TEST_F(JobManagerElasticTest, WorkerLost_RecoversOnSurvivorsAndSpareFromTheLatestCheckpoint) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  const std::string w3 = AddWorker(7003);  // a spare
  for (int step = 1; step <= 7; ++step) Step(id, step);
  CheckpointAll(id, 5);
  const v1::Assignment first_plan = AssignmentOf(w1);
  registry_.MarkLost(w2, incarnations_[w2], "killed");
  v1::Job job = jobs_->Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(AssignmentOf(w1).action(), v1::Assignment::ACTION_STOP);
  Schedule();  // w1 has not answered yet
  EXPECT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RECOVERING);
  HeartbeatAllAndSchedule({w1, w3});
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(job.plan_version(), 2);
  EXPECT_EQ(WorkerIdsOf(job), (std::vector<std::string>{w1, w3}));
  EXPECT_EQ(job.progress().step(), 5);
  EXPECT_EQ(job.progress().loss_history_size(), 5);
  EXPECT_EQ(job.progress().loss(), 5.0f) << "the loss of a step rolled back";
  EXPECT_EQ(job.progress().steps_redone(), 2);
  EXPECT_EQ(job.progress().recoveries(), 1);
  ASSERT_EQ(job.plan_history_size(), 2);
  EXPECT_EQ(job.plan_history(1).start_step(), 5);
  EXPECT_TRUE(absl::StrContains(job.plan_history(1).reason(), "killed"));
  const v1::Assignment a = AssignmentOf(w3);
  EXPECT_EQ(a.plan_version(), 2);
  EXPECT_EQ(a.start_iteration(), 5);
  ASSERT_TRUE(a.has_resume());
  EXPECT_EQ(a.resume().step(), 5);
  EXPECT_EQ(a.resume().units_size(), kUnits);
  // Each worker has its own data-plane keys for the new plan
  // (data_plane_keys.h): its link key to the other is the one the other
  // derives from its receive key, and nothing is left of the old plan's.
  const v1::Assignment survivor = AssignmentOf(w1);
  ASSERT_EQ(a.data_plane_send_keys_size(), 2);
  ASSERT_EQ(survivor.data_plane_send_keys_size(), 2);
  const std::string data_job = DataPlaneJobId(id, 2);
  for (const auto& [from, to] : {std::pair{&a, &survivor}, std::pair{&survivor, &a}}) {
    EXPECT_EQ(from->data_plane_send_keys(to->stage()),
              DataPlaneLinkKey(to->data_plane_receive_key(), data_job, from->stage()));
  }
  EXPECT_NE(a.data_plane_receive_key(), survivor.data_plane_receive_key());
  EXPECT_EQ(first_plan.plan_version(), 1);
  EXPECT_NE(first_plan.data_plane_receive_key(), survivor.data_plane_receive_key());
  for (const std::string& old_key : first_plan.data_plane_send_keys()) {
    for (const std::string& key : survivor.data_plane_send_keys()) EXPECT_NE(key, old_key);
  }
  // The old plan's reports are stale now.
  v1::ReportProgressRequest old;
  old.set_worker_id(w1);
  old.set_job_id(id);
  old.set_plan_version(1);
  old.set_iteration(7);
  EXPECT_EQ(jobs_->ReportProgress(old).status().code(), absl::StatusCode::kFailedPrecondition);
}

// A job profiled on flash-attention GPUs recovers onto a CPU spare: the
// re-plan sizes the attention stash for the CPU, which keeps the B·H·T²
// probabilities that flash does not. With the first plan's profile as it
// was, the CPU stage's memory was understated (it ran out at run time).
// With a coordinator restart instead of the loss, the kind the profile is
// of comes back with it from the store.
class AnotherAttentionTest : public JobManagerElasticTest,
                             public ::testing::WithParamInterface<bool> {};

TEST_P(AnotherAttentionTest, RecoveryOntoASpareOfAnotherAttention_MemorySizedForIt) {
  const bool restart = GetParam();
  if (restart) Reset(/*with_state=*/true);
  v1::RegisterWorkerRequest flash = GpuWorkerRequest(7001);
  flash.mutable_device()->set_backend(
      "cuda:0 (NVIDIA H100), bf16 GEMMs (aligned-copies), flash attention (mma)");
  const std::string g1 = Register(flash);
  flash.set_data_address("127.0.0.1:7002");
  flash.mutable_device()->set_gpu_index(2);
  const std::string g2 = Register(flash);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  const std::string c3 = AddWorker(7003);  // a CPU spare
  const std::string first = jobs_->GetPlan(id).value().profile_source();
  EXPECT_FALSE(absl::StrContains(first, "attention (analytic)")) << first;
  for (int step = 1; step <= 5; ++step) Step(id, step);
  CheckpointAll(id, 5);
  if (restart) {
    jobs_->FlushIo();
    Reset(/*with_state=*/true);
    ASSERT_TRUE(jobs_->Restore().ok());
  }
  registry_.MarkLost(g2, incarnations_[g2], "killed");
  HeartbeatAllAndSchedule({g1, c3});
  const v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  const std::string source = jobs_->GetPlan(id).value().profile_source();
  if (!restart) {
    EXPECT_EQ(WorkerIdsOf(job), (std::vector<std::string>{g1, c3}));
    EXPECT_TRUE(absl::StrContains(
        source, "; stash and transient memory also sized for CPU attention (analytic)"))
        << source;
  } else {
    // The restored job re-plans on c3 alone (g1 is still held by the first
    // plan in this test's registry, which did not restart): the CPU's
    // sizes replace the profile's, as its kind (flash) came back from the
    // store; not known, both would count ("also sized for").
    EXPECT_EQ(WorkerIdsOf(job), (std::vector<std::string>{c3}));
    EXPECT_TRUE(absl::StrContains(source,
                                  "; stash and transient memory sized for CPU attention "
                                  "(analytic), not the profile's CUDA flash"))
        << source;
  }
}

INSTANTIATE_TEST_SUITE_P(WithAndWithoutARestart, AnotherAttentionTest, ::testing::Bool());

// A survivor that heartbeats but has not said it stopped its part (its
// stop blocked, say in a write to a wedged mount) is waited for, and left
// out after kSurvivorStopWait (10 minutes): planned while stopping, it
// never took its RUN, the others timed out at the start barrier, and each
// recovery took it again until the job failed. Its last word before the
// job let it go was work (the registry marks it stopping) or "idle" (it
// took its RUN within a heartbeat of the failure: its "stopping job" says
// so).
class SurvivorStoppingTest : public JobManagerElasticTest,
                             public ::testing::WithParamInterface<const char*> {};

TEST_P(SurvivorStoppingTest, SurvivorStillStopping_WaitedForThenLeftOut) {
  separate_elapsed_clock_ = true;
  Reset(/*with_state=*/false);
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  const std::string w3 = AddWorker(7003);  // a spare
  for (int step = 1; step <= 5; ++step) Step(id, step);
  CheckpointAll(id, 5);
  const auto heartbeat = [&](const std::string& instruction) {
    v1::HeartbeatRequest beat;
    beat.set_worker_id(w1);
    beat.set_incarnation(incarnations_[w1]);
    beat.set_current_instruction(instruction);
    beat.set_last_job_id(id);
    ASSERT_TRUE(registry_.Heartbeat(beat).ok());
  };
  heartbeat(GetParam());  // its last word when the job lets it go
  registry_.MarkLost(w2, incarnations_[w2], "killed");
  const auto stopping_heartbeat = [&] { heartbeat("stopping job " + id); };
  clock_.Advance(absl::Milliseconds(10));
  stopping_heartbeat();
  HeartbeatAllAndSchedule({w3});
  v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RECOVERING) << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(), w1 + " is still stopping")) << job.reason();

  elapsed_clock_.Advance(absl::Minutes(10));
  stopping_heartbeat();
  HeartbeatAllAndSchedule({w3});
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(WorkerIdsOf(job), (std::vector<std::string>{w3}));
  ASSERT_EQ(job.plan_history_size(), 2);
  EXPECT_TRUE(
      absl::StrContains(job.plan_history(1).reason(), w1 + " (still stopping its part after 10m)"))
      << job.plan_history(1).reason();
  // Still stopping, it is no spare either: the job does not grow into it.
  stopping_heartbeat();
  Schedule();
  EXPECT_EQ(Step(id, 6).stop_after_step(), 0);
}

INSTANTIATE_TEST_SUITE_P(AtWorkOrIdle, SurvivorStoppingTest,
                         ::testing::Values("forward micro-batch 2", "idle"));

// A joiner lost before its stage's first step (killed as it loaded, say)
// and back under the same id is not offered to the job again for a minute
// (doubling with each such loss): taken again at once, it crashed again,
// and the job spent its time recovering for as long as it restarted.
TEST_F(JobManagerElasticTest, JoinerLostBeforeItsFirstStep_NotTakenAgainForAWhile) {
  separate_elapsed_clock_ = true;
  Reset(/*with_state=*/false);
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  const std::string w3 = AddWorker(7003);  // a spare
  for (int step = 1; step <= 5; ++step) Step(id, step);
  CheckpointAll(id, 5);
  registry_.MarkLost(w2, incarnations_[w2], "killed");
  HeartbeatAllAndSchedule({w1, w3});
  v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  ASSERT_EQ(WorkerIdsOf(job), (std::vector<std::string>{w1, w3}));
  // w3 dies loading its stage and its supervisor restarts it.
  registry_.MarkLost(w3, incarnations_[w3], "killed");
  ASSERT_EQ(AddWorker(7003), w3);  // the same id, a new incarnation
  HeartbeatAllAndSchedule({w1, w3});
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(WorkerIdsOf(job), (std::vector<std::string>{w1}));
  EXPECT_EQ(registry_.Get(w3).value().state(), v1::WORKER_STATE_READY);
  // Nor does the job grow into it meanwhile; a minute on, it does.
  EXPECT_EQ(Step(id, 6).stop_after_step(), 0);

  elapsed_clock_.Advance(absl::Minutes(1));
  HeartbeatAllAndSchedule({w1, w3});
  EXPECT_GT(Step(id, 7).stop_after_step(), 7);
}

// A recovery that needs the held-back joiner waits, and says why beside a
// READY worker it does not count.
TEST_F(JobManagerElasticTest, JoinerHeldBack_ARecoveryThatNeedsItSaysWhyItWaits) {
  separate_elapsed_clock_ = true;
  Reset(/*with_state=*/false);
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_elastic()->set_min_workers(2);
  const std::string id = Submit(spec).value().id();
  const std::string w3 = AddWorker(7003);
  for (int step = 1; step <= 5; ++step) Step(id, step);
  CheckpointAll(id, 5);
  registry_.MarkLost(w2, incarnations_[w2], "killed");
  HeartbeatAllAndSchedule({w1, w3});
  ASSERT_EQ(WorkerIdsOf(jobs_->Get(id).value()), (std::vector<std::string>{w1, w3}));
  registry_.MarkLost(w3, incarnations_[w3], "killed");
  ASSERT_EQ(AddWorker(7003), w3);
  HeartbeatAllAndSchedule({w1, w3});
  const v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RECOVERING) << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(),
                                w3 + " not offered for another 1m (lost as it joined, 1 time)"))
      << job.reason();
}

// A worker whose process restarts registers again (same address, a new
// incarnation) before its loss was noticed: the job recovers without the
// old incarnation and takes the new one back, rather than counting the
// worker lost for good and waiting, with no spare, until it fails.
TEST_F(JobManagerElasticTest, WorkerRestartsAndRegistersAgain_TheJobTakesItsNewIncarnation) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  for (int step = 1; step <= 6; ++step) Step(id, step);
  CheckpointAll(id, 5);
  ASSERT_EQ(AddWorker(7002), w2);  // registers again: incarnation 2
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RECOVERING);
  HeartbeatAllAndSchedule({w1, w2});
  const v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(job.plan_version(), 2);
  EXPECT_EQ(WorkerIdsOf(job), (std::vector<std::string>{w1, w2}));
  EXPECT_EQ(job.progress().step(), 5);
}

// With data parallelism a recovery keeps whole replicas: 2 replicas of 2
// stages lose a worker; the 3 left make 2 replicas of 1 stage (the third
// stays spare), resuming from the checkpoint replica 0 wrote.
TEST_F(JobManagerElasticTest, DataParallelWorkerLost_RecoversWithWholeReplicas) {
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_parallelism()->set_data(2);
  std::vector<std::string> w;
  for (int k = 0; k < 4; ++k) w.push_back(AddWorker(7001 + k));
  const std::string id = Submit(spec).value().id();
  ASSERT_EQ(jobs_->Get(id).value().worker_ids_size(), 4);
  for (int step = 1; step <= 5; ++step) {
    for (int g = 0; g < 4; ++g) {
      v1::ReportProgressRequest r;
      r.set_worker_id(w[g]);
      r.set_job_id(id);
      r.set_plan_version(1);
      r.set_iteration(step - 1);
      if (g % 2 == 1) {  // the loss stages: both hold all of the step's losses
        r.add_micro_batch_losses(float(step));
        r.add_micro_batch_losses(float(step));
      }
      ASSERT_TRUE(jobs_->ReportProgress(r).ok());
    }
  }
  ASSERT_TRUE(Checkpoint(id, 0, 5).ok());
  ASSERT_TRUE(Checkpoint(id, 1, 5).ok());
  EXPECT_EQ(jobs_->Get(id).value().progress().checkpoint_step(), 5);
  EXPECT_EQ(Checkpoint(id, 2, 5).code(), absl::StatusCode::kPermissionDenied);
  registry_.MarkLost(w[3], incarnations_[w[3]], "killed");
  HeartbeatAllAndSchedule({w[0], w[1], w[2]});
  const v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(WorkerIdsOf(job), (std::vector<std::string>{w[0], w[1]}));
  const v1::Assignment a = AssignmentOf(w[1]);
  EXPECT_EQ(a.replica(), 1);
  EXPECT_EQ(a.replicas(), 2);
  EXPECT_EQ(a.num_stages(), 1);
  ASSERT_TRUE(a.has_resume());
  EXPECT_EQ(a.resume().step(), 5);
  EXPECT_EQ(AssignmentOf(w[2]).action(), v1::Assignment::ACTION_STOP);
}

// A data-parallel job (2 replicas) on two GPUs grows by a stage with
// spares of both kinds READY, the first two by id a CPU and a GPU: it takes
// the two CPUs, so the new stage's replicas are of one kind. By id it took
// the CPU and the GPU, the boundary's plan was refused (a stage mixing
// them), and both were marked unfit for the job.
TEST_F(JobManagerElasticTest, DataParallelGrowth_SparesOfBothKinds_NewStageOfOneKind) {
  v1::JobSpec spec = ElasticSpec(1, 5);
  spec.mutable_parallelism()->set_data(2);
  spec.mutable_elastic()->set_max_workers(2);
  const std::string g1 = AddGpuWorker(7001), g2 = AddGpuWorker(7002);
  const std::string id = Submit(spec).value().id();
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING);
  StepEveryWorker(id, 1, 1);
  const std::string c3 = AddWorker(7003), g4 = AddGpuWorker(7004), c5 = AddWorker(7005);
  Schedule();
  ASSERT_NO_FATAL_FAILURE(PassBoundaryEveryWorker(id));
  const v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(SortedWorkerIdsOf(job), (std::vector<std::string>{g1, g2, c3, c5}));
  EXPECT_TRUE(EveryStageOfOneKind(id));
  ASSERT_EQ(job.plan_history_size(), 2);
  EXPECT_TRUE(absl::StrContains(job.plan_history(1).reason(), c3 + ", " + c5 + " joined"))
      << job.plan_history(1).reason();
  EXPECT_EQ(registry_.Get(g4).value().state(), v1::WORKER_STATE_READY);
}

// A drain is refused when the spares cannot take the drained worker's
// place: a stage's replicas are of one kind, here a GPU stage and a CPU
// stage, and the only spare is a CPU. Counted, not arranged by kind, the
// drain was accepted (4 left for a minimum of 4), and the boundary's
// re-plan found no arrangement and recovered.
TEST_F(JobManagerElasticTest, Drain_OnlySpareOfAnotherKind_Refused) {
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_parallelism()->set_data(2);
  spec.mutable_elastic()->set_min_workers(2);
  const std::string g1 = AddGpuWorker(7001), g2 = AddGpuWorker(7002);
  AddWorker(7003);
  AddWorker(7004);
  const std::string id = Submit(spec).value().id();
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING)
      << jobs_->Get(id).value().reason();
  ASSERT_TRUE(EveryStageOfOneKind(id));
  AddWorker(7005);  // a CPU spare
  Schedule();
  const absl::Status refused = jobs_->Drain(g1).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "fewer than its 4 workers")) << refused;
  // A GPU spare can take its place.
  AddGpuWorker(7006);
  Schedule();
  EXPECT_TRUE(jobs_->Drain(g1).ok());
}

// The drain of a GPU stage's worker, while another job waits for workers:
// the boundary holds the GPU spare that can take its place, not the CPU
// spare first by id, and re-plans on it. Held by count, the CPU was held,
// the GPU not (no job may grow into it then), and the re-plan found no
// arrangement and recovered.
TEST_F(JobManagerElasticTest, DrainBoundary_WhileAJobWaits_HoldsTheSpareOfTheNeededKind) {
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_parallelism()->set_data(2);
  spec.mutable_elastic()->set_min_workers(2);
  const std::string g1 = AddGpuWorker(7001), g2 = AddGpuWorker(7002);
  const std::string c3 = AddWorker(7003), c4 = AddWorker(7004);
  const std::string id = Submit(spec).value().id();
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(EveryStageOfOneKind(id));
  StepEveryWorker(id, 1, 1);
  v1::JobSpec waiting_spec = ElasticSpec(3, 5);
  waiting_spec.mutable_elastic()->set_min_workers(3);
  const std::string waiting = Submit(waiting_spec).value().id();
  AddWorker(7005);  // a CPU spare, first by id
  const std::string g6 = AddGpuWorker(7006);
  Schedule();
  ASSERT_EQ(jobs_->Get(waiting).value().state(), v1::JOB_STATE_QUEUED);
  ASSERT_TRUE(jobs_->Drain(g1).ok());
  ASSERT_NO_FATAL_FAILURE(PassBoundaryEveryWorker(id));
  const v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  std::vector<std::string> want = {g2, c3, c4, g6};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(SortedWorkerIdsOf(job), want);
  EXPECT_TRUE(EveryStageOfOneKind(id));
}

// A data-parallel job on four GPUs loses one; the spares are a CPU (first
// by id) and a GPU: it recovers on the three GPUs and the spare GPU. In id
// order it took the CPU into a GPU stage, and the plan was refused. The
// same while another job waits for workers: the recovery takes no more
// than it lost, and the bound goes to the arrangement by kind, not to the
// list: cut to 4 first, the CPU spare (its id lower) took the GPU's place
// and the job waited beside an idle GPU.
class DataParallelRecoveryKindTest : public JobManagerElasticTest,
                                     public ::testing::WithParamInterface<bool> {};

TEST_P(DataParallelRecoveryKindTest, SparesOfBothKinds_TakesTheOneOfItsKind) {
  const bool another_job_waits = GetParam();
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_parallelism()->set_data(2);
  std::vector<std::string> g;
  for (int k = 0; k < 4; ++k) g.push_back(AddGpuWorker(7001 + k));
  const std::string id = Submit(spec).value().id();
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING);
  for (int64_t step = 1; step <= 5; ++step) StepEveryWorker(id, step, 1);
  CheckpointAll(id, 5);
  std::string queued;
  if (another_job_waits) {
    v1::JobSpec wide = ElasticSpec(3, 5);
    wide.mutable_elastic()->set_min_workers(3);
    queued = Submit(wide).value().id();
    ASSERT_EQ(jobs_->Get(queued).value().state(), v1::JOB_STATE_QUEUED);
  }
  const std::string c5 = AddWorker(7005), g6 = AddGpuWorker(7006);
  registry_.MarkLost(g[3], incarnations_[g[3]], "killed");
  if (another_job_waits) {
    HeartbeatAllAndSchedule({g[0], g[1], g[2], c5, g6});
  } else {
    HeartbeatAllAndSchedule({g[0], g[1], g[2]});
  }
  const v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(SortedWorkerIdsOf(job), (std::vector<std::string>{g[0], g[1], g[2], g6}));
  EXPECT_EQ(registry_.Get(c5).value().state(), v1::WORKER_STATE_READY);
  if (another_job_waits) {
    EXPECT_EQ(jobs_->Get(queued).value().state(), v1::JOB_STATE_QUEUED);
  }
}

INSTANTIATE_TEST_SUITE_P(AloneOrWhileAJobWaits, DataParallelRecoveryKindTest, ::testing::Bool());

// A recovering data-parallel job whose survivors and spares are enough in
// number but not of one kind per stage waits, saying why, and runs once a
// worker of its kind comes; the spare of the other kind is not held for it
// meanwhile: a job that can run there does (it was held until the
// recovery's queue timeout).
TEST_F(JobManagerElasticTest, DataParallelRecovery_OnlyTheOtherKindSpare_WaitsSayingWhy) {
  v1::JobSpec spec = ElasticSpec(1, 5);
  spec.mutable_parallelism()->set_data(2);
  const std::string g1 = AddGpuWorker(7001), g2 = AddGpuWorker(7002);
  const std::string id = Submit(spec).value().id();
  for (int64_t step = 1; step <= 5; ++step) StepEveryWorker(id, step, 1);
  CheckpointAll(id, 5);
  const std::string c3 = AddWorker(7003);
  registry_.MarkLost(g2, incarnations_[g2], "killed");
  HeartbeatAllAndSchedule({g1});
  v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RECOVERING) << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(),
                                "waiting for 2 READY workers whose kinds (GPU or CPU) give each "
                                "stage's 2 replicas and tensor ranks one kind (2 ready"))
      << job.reason();
  const std::string other = Submit(ElasticSpec(1, 5)).value().id();
  Schedule();
  const v1::Job on_the_cpu = jobs_->Get(other).value();
  ASSERT_EQ(on_the_cpu.state(), v1::JOB_STATE_RUNNING) << on_the_cpu.reason();
  EXPECT_EQ(WorkerIdsOf(on_the_cpu), (std::vector<std::string>{c3}));
  const std::string g4 = AddGpuWorker(7004);
  HeartbeatAllAndSchedule({g1});
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(SortedWorkerIdsOf(job), (std::vector<std::string>{g1, g4}));
}

// An explicit compressed stage that a re-plan onto fewer stages no longer
// has is dropped (job.proto); the plan's reason says so rather than let the
// job train on with less compression than asked without a word.
TEST_F(JobManagerElasticTest, CompressedStageBeyondTheReplan_NamedInThePlansReason) {
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_parallelism()->set_data(2);
  spec.mutable_compression()->mutable_data_parallel()->set_codec("powersgd:rank=2");
  spec.mutable_compression()->mutable_data_parallel()->add_stages(1);
  std::vector<std::string> w;
  for (int k = 0; k < 4; ++k) w.push_back(AddWorker(7001 + k));
  const std::string id = Submit(spec).value().id();
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(AssignmentOf(w[1]).data_parallel_powersgd_rank(), 2);  // stage 1
  for (int64_t s = 1; s <= 5; ++s) StepEveryWorker(id, s, 2);
  ASSERT_TRUE(Checkpoint(id, 0, 5).ok());
  ASSERT_TRUE(Checkpoint(id, 1, 5).ok());
  registry_.MarkLost(w[3], incarnations_[w[3]], "killed");
  HeartbeatAllAndSchedule({w[0], w[1], w[2]});
  const v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(AssignmentOf(w[0]).num_stages(), 1);
  EXPECT_EQ(AssignmentOf(w[0]).data_parallel_powersgd_rank(), 0);
  ASSERT_EQ(job.plan_history_size(), 2);
  EXPECT_TRUE(absl::StrContains(job.plan_history(1).reason(),
                                "spec.compression.dataParallel.stages 1 is beyond this plan's 1 "
                                "stage: compressed now: none"))
      << job.plan_history(1).reason();
  EXPECT_FALSE(absl::StrContains(job.plan_history(0).reason(), "beyond"));
}

// A writer's checkpoint report from the stopped plan (its writer finished
// after the loss) does not complete a checkpoint during the recovery: with
// keep 1 it would expire the one the re-plan resumes from.
TEST_F(JobManagerElasticTest, CheckpointReportWhileRecovering_IgnoredAndTheResumePointKept) {
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_parallelism()->set_data(2);
  spec.mutable_checkpoint()->set_keep(1);
  std::vector<std::string> w;
  for (int k = 0; k < 4; ++k) w.push_back(AddWorker(7001 + k));
  const std::string id = Submit(spec).value().id();
  auto step = [&](int64_t s) { StepEveryWorker(id, s, 2); };
  for (int64_t s = 1; s <= 5; ++s) step(s);
  ASSERT_TRUE(Checkpoint(id, 0, 5).ok());
  ASSERT_TRUE(Checkpoint(id, 1, 5).ok());
  for (int64_t s = 6; s <= 10; ++s) step(s);
  // Plan 1's checkpoint reports of step 10, one per writer (replica 0).
  const std::vector<v1::ReportProgressRequest> late = {CheckpointReport(id, w[0], 1, 10),
                                                       CheckpointReport(id, w[1], 1, 10)};
  registry_.MarkLost(w[3], incarnations_[w[3]], "killed");  // replica 1: no writer
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RECOVERING);
  // Both writers of step 10 finish after the loss: the stopped plan's last
  // words, which would complete checkpoint 10 and expire 5.
  for (const v1::ReportProgressRequest& r : late) EXPECT_TRUE(jobs_->ReportProgress(r).ok());
  EXPECT_EQ(jobs_->Get(id).value().progress().checkpoint_step(), 5);
  HeartbeatAllAndSchedule({w[0], w[1], w[2]});
  const v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(AssignmentOf(w[0]).resume().step(), 5);
  EXPECT_EQ(job.progress().checkpoint_step(), 5);
}

// A stage of the stopped plan uploading its weights while the job
// recovers is refused: the file would be opened (and found incomplete, or
// complete) for a job that is not running.
TEST_F(JobManagerElasticTest, WeightsUploadWhileRecovering_Refused) {
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_output()->set_weights_path("recovering.safetensors");
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(spec).value().id();
  Step(id, 1);
  registry_.MarkLost(w2, incarnations_[w2], "killed");
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RECOVERING);
  v1::WeightsChunk chunk;
  chunk.set_worker_id(w1);
  chunk.set_job_id(id);
  chunk.set_tensor_name("wte.weight");
  EXPECT_EQ(jobs_->AddWeightsChunk(chunk).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(jobs_->FinishWeights(w1, id).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RECOVERING);
}

// A queued job whose queue timeout passed while the coordinator was down
// gets the restart grace for its workers to register again, then fails.
TEST_F(JobManagerElasticTest, RestoredQueuedJob_TimeoutWaitsForTheRestartGrace) {
  Reset(/*with_state=*/true);
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_scheduling()->mutable_queue_timeout()->set_seconds(1);
  const std::string id = Submit(spec).value().id();  // no workers: QUEUED
  jobs_->FlushIo();
  clock_.Advance(absl::Seconds(10));  // down longer than the timeout
  Reset(/*with_state=*/true);
  ASSERT_TRUE(jobs_->Restore().ok());
  Schedule();
  EXPECT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_QUEUED);
  clock_.Advance(absl::Seconds(16));  // past the 15 s grace
  Schedule();
  jobs_->FlushIo();  // the failure saved: shown RUNNING ("ending: ...") until then
  EXPECT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_FAILED);
}

TEST_F(JobManagerElasticTest, CheckpointCompleteButItsLossMissing_ResumesFromTheOneBefore) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  for (int step = 1; step <= 5; ++step) Step(id, step);
  CheckpointAll(id, 5);
  for (int step = 6; step <= 9; ++step) Step(id, step);
  CheckpointAll(id, 10);  // the files of step 10, but its loss never came
  registry_.MarkLost(w2, incarnations_[w2], "killed");
  const std::string w3 = AddWorker(7003);
  HeartbeatAllAndSchedule({w1, w3});
  const v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(job.plan_history(1).start_step(), 5);
  EXPECT_EQ(job.progress().loss_history_size(), 5);
}

// Checkpoint 26 is complete but its loss never came, so a recovery resumes
// from 13 and redoes 14..26: 26 is forgotten (the state and the progress
// say 13), and a step boundary below it (a join at 17) still re-plans.
// Then the redo writes step 26's files again with other bytes (as under
// another layout): it completes anew, and its manifest and the stored
// state carry the redo's checksums, not the old ones.
TEST_F(JobManagerElasticTest, RecoveryBeforeACompleteCheckpoint_ItIsRedoneAnew) {
  Reset(/*with_state=*/true);
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  v1::JobSpec spec = ElasticSpec(2, 13);
  spec.mutable_elastic()->set_max_workers(3);
  const std::string id = Submit(spec).value().id();
  for (int step = 1; step <= 13; ++step) Step(id, step);
  CheckpointAll(id, 13);
  for (int step = 14; step <= 25; ++step) Step(id, step);
  CheckpointAll(id, 26);
  ASSERT_EQ(jobs_->Get(id).value().progress().checkpoint_step(), 26);
  jobs_->FlushIo();
  const std::string step26 = absl::StrCat(OutputDir(), "/checkpoints/", id, "/step-00000026");
  ASSERT_TRUE(std::filesystem::exists(step26 + "/manifest.json"));
  registry_.MarkLost(w2, incarnations_[w2], "killed");
  const std::string w3 = AddWorker(7003);
  HeartbeatAllAndSchedule({w1, w3});
  v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  ASSERT_EQ(job.progress().step(), 13);
  EXPECT_EQ(job.progress().checkpoint_step(), 13);
  jobs_->FlushIo();
  // Its manifest (the old checksums) went with the forgotten checkpoint: no
  // export or init.from takes step 26 while the redo replaces its files.
  EXPECT_FALSE(std::filesystem::exists(step26 + "/manifest.json"));
  EXPECT_TRUE(std::filesystem::exists(
      absl::StrCat(OutputDir(), "/checkpoints/", id, "/step-00000013/manifest.json")));
  std::vector<store::StoredJob> stored = state_->LoadJobs().value();
  ASSERT_EQ(stored.size(), 1u);
  ASSERT_EQ(stored[0].checkpoints_size(), 1);
  EXPECT_EQ(stored[0].checkpoints(0).step(), 13);

  // A join: the boundary falls at 17, below the forgotten 26.
  AddWorker(7004);
  Schedule();
  const int64_t boundary = Step(id, 14).stop_after_step();
  ASSERT_GT(boundary, 14);
  ASSERT_LT(boundary, 26);
  job = PassBoundary(id, 15, boundary);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  ASSERT_EQ(job.worker_ids_size(), 3) << "the boundary re-planned";
  EXPECT_EQ(job.progress().checkpoint_step(), boundary);

  for (int64_t step = boundary + 1; step <= 25; ++step) Step(id, step);
  const std::string redone(64, 'f');
  for (const std::string& w : job.worker_ids()) {
    v1::ReportProgressRequest r = CheckpointReport(id, w, job.plan_version(), 26);
    for (v1::UnitFile& f : *r.mutable_checkpoint()->mutable_units()) f.set_sha256(redone);
    ASSERT_TRUE(jobs_->ReportProgress(r).ok());
  }
  EXPECT_EQ(jobs_->Get(id).value().progress().checkpoint_step(), 26);
  jobs_->FlushIo();
  std::ifstream in(step26 + "/manifest.json");
  const std::string manifest((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  EXPECT_TRUE(absl::StrContains(manifest, redone)) << manifest;
  stored = state_->LoadJobs().value();
  ASSERT_EQ(stored.size(), 1u);
  ASSERT_GT(stored[0].checkpoints_size(), 0);
  const v1::ResumeFrom& newest = stored[0].checkpoints(stored[0].checkpoints_size() - 1);
  EXPECT_EQ(newest.step(), 26);
  ASSERT_GT(newest.units_size(), 0);
  for (const v1::UnitFile& f : newest.units()) EXPECT_EQ(f.sha256(), redone);
}

// The history keeps the last 10000 losses. A recovery to a checkpoint older
// than that (step 500, the history starting at 1100) clears it and records
// the redone steps from the resume point: loss_history_start + size stays
// the step, and each loss sits at its own step.
TEST_F(JobManagerElasticTest, RecoveryBeforeTheKeptHistory_HistoryRestartsAtTheResumePoint) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  v1::JobSpec spec = ElasticSpec(1, 500, 20000);
  spec.mutable_elastic()->set_max_workers(1);
  const std::string id = Submit(spec).value().id();
  for (int64_t step = 1; step <= 500; ++step) Step(id, step);
  CheckpointAll(id, 500);
  for (int64_t step = 501; step <= 11100; ++step) Step(id, step);  // no checkpoint after 500
  v1::JobProgress p = jobs_->Get(id).value().progress();
  ASSERT_EQ(p.loss_history_start(), 1100);
  ASSERT_EQ(p.loss_history_size(), 10000);
  const std::string worker = jobs_->Get(id).value().worker_ids(0);
  const std::string other = worker == w1 ? w2 : w1;
  registry_.MarkLost(worker, incarnations_[worker], "killed");
  HeartbeatAllAndSchedule({other});
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING);
  p = jobs_->Get(id).value().progress();
  EXPECT_EQ(p.step(), 500);
  EXPECT_EQ(p.loss_history_start(), 500);
  EXPECT_EQ(p.loss_history_size(), 0);
  EXPECT_EQ(p.loss(), 0.0f);  // step 500's is not kept
  Step(id, 501);
  Step(id, 502);
  p = jobs_->Get(id).value().progress();
  EXPECT_EQ(p.loss_history_start() + p.loss_history_size(), 502);
  ASSERT_EQ(p.loss_history_size(), 2);
  EXPECT_EQ(p.loss_history(1), 502.0f);  // Step's losses are the step number
}

TEST_F(JobManagerElasticTest, NoCheckpointYet_ResumesFromStepZero) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  Step(id, 1);
  Step(id, 2);
  registry_.MarkLost(w1, incarnations_[w1], "killed");
  HeartbeatAllAndSchedule({w2});
  const v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(job.worker_ids_size(), 1);  // min_workers 1: one stage
  EXPECT_EQ(job.progress().loss_history_size(), 0);
  EXPECT_FALSE(AssignmentOf(w2).has_resume());
  EXPECT_EQ(AssignmentOf(w2).start_iteration(), 0);
}

// A tensor group lost a rank: the survivor is no whole group, so the job
// waits, and its reason counts the survivor as ready (not "0 ready").
TEST_F(JobManagerElasticTest, TensorRankLost_WaitingReasonCountsTheSurvivor) {
  v1::JobSpec spec = ElasticSpec(1, 5);
  spec.mutable_parallelism()->set_tensor(2);
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(spec).value().id();
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING);
  registry_.MarkLost(w2, incarnations_[w2], "killed");
  HeartbeatAllAndSchedule({w1});
  const v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RECOVERING) << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(), "waiting for 2 READY workers (1 ready)"))
      << job.reason();
}

// Two of three workers lost one after the other: the recovery names the
// first, and the second, gone as well, is named with it, both while the job
// waits and in the plan it resumes with (the reason named only the first
// loss, though the worker list showed both LOST).
TEST_F(JobManagerElasticTest, SecondWorkerLostWhileRecovering_ReasonNamesBoth) {
  v1::JobSpec spec = ElasticSpec(3, 5);
  spec.mutable_elastic()->set_min_workers(2);
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002), w3 = AddWorker(7003);
  const std::string id = Submit(spec).value().id();
  StepCheckpointingEvery5(id, 5);
  registry_.MarkLost(w2, incarnations_[w2], "killed");
  registry_.MarkLost(w3, incarnations_[w3], "killed");
  HeartbeatAllAndSchedule({w1});
  v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RECOVERING) << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(), "worker " + w2)) << job.reason();
  EXPECT_TRUE(absl::StrContains(
      job.reason(), "waiting for 2 READY workers (1 ready); " + w3 + " (LOST) is gone too"))
      << job.reason();
  const std::string w4 = AddWorker(7004);
  HeartbeatAllAndSchedule({w1, w4});
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(WorkerIdsOf(job), (std::vector<std::string>{w1, w4}));
  EXPECT_TRUE(absl::StrContains(job.plan_history(1).reason(), w3 + " (LOST) is gone too"))
      << job.plan_history(1).reason();
}

// A drain that would leave a tensor-parallel job fewer than its minimum
// is refused naming the product the minimum is (min_workers 1 x data 1 x
// tensor 2 = 2): the message named data alone, a number the user could
// not reproduce from it.
TEST_F(JobManagerElasticTest, Drain_BelowATensorJobsMinimum_NamesTheTensorFactor) {
  v1::JobSpec spec = ElasticSpec(1, 5);
  spec.mutable_parallelism()->set_tensor(2);
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(spec).value().id();
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING);
  const absl::Status refused = jobs_->Drain(w2).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(),
                                "fewer than its 2 workers (spec.elastic.min_workers x "
                                "spec.parallelism.data x spec.parallelism.tensor)"))
      << refused;
}

TEST_F(JobManagerElasticTest, CheckpointUnusable_DroppedAndTheOneBeforeUsed) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  StepCheckpointingEvery5(id, 10);
  registry_.MarkLost(w2, incarnations_[w2], "killed");
  const std::string w3 = AddWorker(7003);
  HeartbeatAllAndSchedule({w1, w3});
  ASSERT_EQ(AssignmentOf(w3).resume().step(), 10);
  jobs_->FlushIo();
  const std::string dir = OutputDir() + "/checkpoints/" + id;
  struct stat st;
  ASSERT_EQ(stat((dir + "/step-00000010/manifest.json").c_str(), &st), 0);
  v1::ReportProgressRequest r;
  r.set_worker_id(w3);
  r.set_job_id(id);
  r.set_plan_version(2);
  r.set_error("DATA_LOSS: unit-0002.safetensors: SHA-256 differs from the one recorded");
  r.set_checkpoint_unusable(true);
  ASSERT_TRUE(jobs_->ReportProgress(r).ok());
  EXPECT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RECOVERING);
  HeartbeatAllAndSchedule({w1, w3});
  const v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(job.plan_history(2).start_step(), 5);
  EXPECT_TRUE(absl::StrContains(job.plan_history(2).reason(), "could not be loaded"));
  EXPECT_EQ(job.progress().checkpoint_step(), 5);
  // Its manifest is gone, so nothing takes it for the newest complete
  // checkpoint (init.from, checkpoint export): step 5 is.
  jobs_->FlushIo();
  EXPECT_NE(stat((dir + "/step-00000010/manifest.json").c_str(), &st), 0);
  EXPECT_EQ(stat((dir + "/step-00000005/manifest.json").c_str(), &st), 0);
}

// A checkpoint dropped as unusable while the state store fails keeps its
// files until a save that no longer names it succeeds: removed at once, a
// restart from the stored state (which still names it as the newest
// complete checkpoint) resumed from a missing directory, a peer failure
// each time, until the job gave up with older checkpoints intact.
TEST_F(JobManagerElasticTest, CheckpointUnusable_WhileSavesFail_FilesKeptUntilASaveSucceeds) {
  Reset(/*with_state=*/true);
  std::string id, manifest;
  ASSERT_NO_FATAL_FAILURE(DropCheckpoint10WhileSavesFail(&id, &manifest));
  struct stat st;
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RECOVERING);
  jobs_->FlushIo();
  EXPECT_EQ(stat(manifest.c_str(), &st), 0) << "removed although the stored state names it";
  observing_.failing = false;
  clock_.Advance(absl::Seconds(2));  // the failed save's retry is due
  jobs_->ScheduleQueued();
  jobs_->FlushIo();
  EXPECT_NE(stat(manifest.c_str(), &st), 0) << "left after the save that no longer names it";
}

// The same job cancelled before a save succeeds, kept for no ended job
// (max_ended_jobs 0): it is not pruned while the dropped checkpoint waits
// for removal. Pruned, its save found no job, the directory stayed with
// its manifest, and the sweeps keep complete checkpoints: `init.from` or
// `checkpoint export` of the job's directory took the corrupt one.
TEST_F(JobManagerElasticTest, CheckpointUnusable_EndedWhileSavesFail_NotPrunedBeforeTheRemoval) {
  Reset(/*with_state=*/true, /*max_ended_jobs=*/0);
  std::string id, manifest;
  ASSERT_NO_FATAL_FAILURE(DropCheckpoint10WhileSavesFail(&id, &manifest));
  struct stat st;
  // Cancelled in memory; the call says its save failed.
  EXPECT_FALSE(jobs_->Cancel(id).ok());
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_CANCELLED);
  // Past the end's second sweep (a minute after it), with the store still
  // failing: then a pass that prunes ended jobs.
  for (int pass = 0; pass < 3; ++pass) {
    clock_.Advance(absl::Minutes(1));
    Schedule();
    jobs_->FlushIo();
  }
  EXPECT_TRUE(jobs_->Get(id).ok()) << "pruned while its dropped checkpoint waits for removal";
  observing_.failing = false;
  clock_.Advance(absl::Seconds(2));  // the failed saves' retry is due
  jobs_->ScheduleQueued();
  jobs_->FlushIo();
  EXPECT_NE(stat(manifest.c_str(), &st), 0) << "left after the job's last save";
}

// A file server whose clock is 20 minutes behind this host's, while the
// state store fails: a removal of step 10's files runs only once a save
// succeeds, after the redo of step 10 (on a later plan) has written a unit
// there, dated by the server 10 minutes behind this host. Each case checks
// which files the removal takes: this host's clock as their bound took the
// redo's unit (the step then completed with a unit missing).
class ServerClockBehindTest : public JobManagerElasticTest {
 protected:
  // Sets `path`'s modification time to `t`, as the server dates a write.
  static void Date(const std::string& path, absl::Time t) {
    const timespec times[2] = {absl::ToTimespec(t), absl::ToTimespec(t)};
    ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
  }
  std::string Unit(int u) const { return absl::StrFormat("%s/unit-%04d.safetensors", step10_, u); }

  // A job on two new workers, checkpointed at steps 5 and 10 (saved, the
  // manifests written), recovers from 10 (plan 2): the state store fails
  // from that recovery on if `failing_first`. Step 10's unit files and
  // manifest are then dated by the server.
  void ResumedFrom10(bool failing_first) {
    Reset(/*with_state=*/true);
    w1_ = AddWorker(7001);
    w2_ = AddWorker(7002);
    id_ = Submit(ElasticSpec(2, 5)).value().id();
    StepCheckpointingEvery5(id_, 10);
    jobs_->FlushIo();
    observing_.failing = failing_first;
    ASSERT_TRUE(jobs_->ReportProgress(PeerFailure(id_, w1_, 1)).ok());
    HeartbeatAllAndSchedule({w1_, w2_});
    ASSERT_EQ(AssignmentOf(w1_).resume().step(), 10);
    jobs_->FlushIo();
    const std::string relative = "checkpoints/" + id_ + "/step-00000010";
    step10_ = OutputDir() + "/" + relative;
    ASSERT_NO_FATAL_FAILURE(WriteUnitFiles(relative));
    for (int u = 0; u < kUnits; ++u) ASSERT_NO_FATAL_FAILURE(Date(Unit(u), server_));
    ASSERT_NO_FATAL_FAILURE(
        Date(step10_ + "/" + kCheckpointManifestName, server_ + absl::Seconds(1)));
  }
  // w1 cannot load step 10 (plan 2's resume point): it is dropped.
  void Step10Unusable() {
    v1::ReportProgressRequest r = PeerFailure(id_, w1_, 2);
    r.set_error("DATA_LOSS: unit-0000.safetensors is truncated");
    r.set_peer_failure(false);
    r.set_checkpoint_unusable(true);
    ASSERT_TRUE(jobs_->ReportProgress(r).ok());
  }
  // The recovery's plan resumes from 5, and the redo writes step 10's
  // unit 0 anew, dated by the server 10 minutes after step 10's files.
  void ReplanAndRedoUnit0() {
    HeartbeatAllAndSchedule({w1_, w2_});
    ASSERT_EQ(AssignmentOf(w1_).resume().step(), 5);
    std::ofstream(Unit(0)) << "the redo's";
    ASSERT_NO_FATAL_FAILURE(Date(Unit(0), server_ + absl::Minutes(10)));
  }
  // The store answers again: the failed saves' retry succeeds, and the
  // removal of step 10's files runs after it.
  void SavesSucceed() {
    observing_.failing = false;
    clock_.Advance(absl::Seconds(2));
    jobs_->ScheduleQueued();
    jobs_->FlushIo();
  }
  bool Exists(const std::string& path) const { return std::filesystem::exists(path); }

  const absl::Time server_ = absl::Now() - absl::Minutes(20);
  std::string id_, w1_, w2_, step10_;
};

// Dropped as unusable, its files' bound read (DroppedFilesBound, on io_)
// before the re-plan: its manifest and the units the redo did not write
// again go, the redo's unit stays.
TEST_F(ServerClockBehindTest, DroppedBoundReadBeforeTheReplan_OldFilesGoTheRedosUnitStays) {
  ASSERT_NO_FATAL_FAILURE(ResumedFrom10(/*failing_first=*/false));
  observing_.failing = true;
  ASSERT_NO_FATAL_FAILURE(Step10Unusable());
  jobs_->FlushIo();  // the bound read, the save failed
  ASSERT_NO_FATAL_FAILURE(ReplanAndRedoUnit0());
  ASSERT_TRUE(Exists(step10_ + "/" + kCheckpointManifestName));
  SavesSucceed();
  EXPECT_FALSE(Exists(step10_ + "/" + kCheckpointManifestName));
  for (int u = 1; u < kUnits; ++u) EXPECT_FALSE(Exists(Unit(u))) << u;
  EXPECT_TRUE(Exists(Unit(0))) << "the redo's unit, written after the drop, was removed";
}

// The bound's read waits on io_ behind a save (slow to fail) until the
// re-plan has handed out the redo's plan, and the redo has written: the
// files are no bound then, so the unit files stay, with a warning, and the
// manifest goes. Taken then, the bound was the redo's unit's own time, and
// removed it.
TEST_F(ServerClockBehindTest, DroppedBoundReadAfterTheReplan_UnitFilesLeftWithAWarning) {
  ASSERT_NO_FATAL_FAILURE(ResumedFrom10(/*failing_first=*/true));
  absl::Notification saving, release;
  bool held = false;  // on io_ only
  observing_.on_commit = [&](const std::vector<StoreWrite>&) {
    if (std::exchange(held, true)) return;
    saving.Notify();
    release.WaitForNotification();
  };
  clock_.Advance(absl::Seconds(2));
  jobs_->ScheduleQueued();  // the failed save's retry, held on io_
  saving.WaitForNotification();
  // Let go if an assertion ends the case early: io_ drains, and the hook
  // goes before what it refers to.
  absl::Cleanup let_go = [this, &release] {
    if (release.HasBeenNotified()) return;
    release.Notify();
    jobs_->FlushIo();
    observing_.on_commit = nullptr;
  };
  ASSERT_NO_FATAL_FAILURE(Step10Unusable());
  ASSERT_NO_FATAL_FAILURE(ReplanAndRedoUnit0());
  ::testing::internal::CaptureStderr();
  release.Notify();
  jobs_->FlushIo();
  const std::string log = ::testing::internal::GetCapturedStderr();
  observing_.on_commit = nullptr;
  EXPECT_EQ(LinesWith(log, "the unit files of dropped checkpoint checkpoints/" + id_ +
                               "/step-00000010 are left in place: a new plan ran before their "
                               "times were read"),
            1)
      << log;
  SavesSucceed();
  EXPECT_FALSE(Exists(step10_ + "/" + kCheckpointManifestName));
  for (int u = 1; u < kUnits; ++u) EXPECT_TRUE(Exists(Unit(u))) << u;
  EXPECT_TRUE(Exists(Unit(0))) << "the redo's unit, written after the drop, was removed";
}

// Step 10 completes while saves fail (its manifest held, never written
// once forgotten), before its loss came: the recovery resumes from 5 and
// forgets it. With no manifest to date its files by, its unit files stay
// (the redo writes them over; the end sweep takes what is left): the time
// it was forgotten, by this host's clock, took the redo's unit.
TEST_F(ServerClockBehindTest, ForgottenWithoutManifest_TheRedosUnitStays) {
  Reset(/*with_state=*/true);
  w1_ = AddWorker(7001);
  w2_ = AddWorker(7002);
  id_ = Submit(ElasticSpec(2, 5)).value().id();
  StepCheckpointingEvery5(id_, 9);
  jobs_->FlushIo();
  observing_.failing = true;
  CheckpointAll(id_, 10);  // complete, but its loss never came
  ASSERT_EQ(jobs_->Get(id_).value().progress().checkpoint_step(), 10);
  jobs_->FlushIo();
  step10_ = OutputDir() + "/checkpoints/" + id_ + "/step-00000010";
  ASSERT_FALSE(Exists(step10_ + "/" + kCheckpointManifestName)) << "held by the failed save";
  WriteReportedUnitFiles(step10_);
  for (int u = 0; u < kUnits; ++u) ASSERT_NO_FATAL_FAILURE(Date(Unit(u), server_));
  ASSERT_TRUE(jobs_->ReportProgress(PeerFailure(id_, w1_, 1)).ok());
  ASSERT_NO_FATAL_FAILURE(ReplanAndRedoUnit0());
  EXPECT_EQ(jobs_->Get(id_).value().progress().checkpoint_step(), 5);
  SavesSucceed();
  EXPECT_FALSE(Exists(step10_ + "/" + kCheckpointManifestName));
  EXPECT_TRUE(Exists(Unit(0))) << "the redo's unit, written after the recovery, was removed";
}

// The claim is taken only from a stage loading its plan's resume point:
// after it said it was ready, or in a plan that resumes from nothing, it
// fails the job like any other error and every checkpoint stays.
class CheckpointUnusableClaimTest : public JobManagerElasticTest {
 protected:
  void ClaimOutsideLoading(bool resumed) {
    const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
    const std::string id = Submit(ElasticSpec(2, 5)).value().id();
    StepCheckpointingEvery5(id, 10);
    int64_t version = 1;
    if (resumed) {  // a plan that resumes from step 10; w1 is ready in it
      ASSERT_TRUE(jobs_->ReportProgress(PeerFailure(id, w1, 1)).ok());
      HeartbeatAllAndSchedule({w1, w2});
      ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING);
      ASSERT_EQ(AssignmentOf(w1).resume().step(), 10);
      version = 2;
      v1::ReportProgressRequest ready;
      ready.set_worker_id(w1);
      ready.set_job_id(id);
      ready.set_plan_version(version);
      ready.set_ready(true);
      ASSERT_TRUE(jobs_->ReportProgress(ready).ok());
      ready.set_worker_id(w2);
      ASSERT_TRUE(jobs_->ReportProgress(ready).ok());
      Step(id, 11);  // w1 has run an iteration of the plan
    }
    v1::ReportProgressRequest r;
    r.set_worker_id(w1);
    r.set_job_id(id);
    r.set_plan_version(version);
    r.set_error("DATA_LOSS: unit-0000.safetensors is gone");
    r.set_checkpoint_unusable(true);
    ASSERT_TRUE(jobs_->ReportProgress(r).ok());
    const v1::Job job = jobs_->Get(id).value();
    EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
    EXPECT_TRUE(absl::StrContains(job.reason(), "unit-0000.safetensors is gone")) << job.reason();
    EXPECT_EQ(job.progress().checkpoint_step(), 10);
  }
};

TEST_F(CheckpointUnusableClaimTest, InAPlanThatResumesFromNothing) { ClaimOutsideLoading(false); }
TEST_F(CheckpointUnusableClaimTest, AfterTheStageRanAnIteration) { ClaimOutsideLoading(true); }

// A stage of a device or replica group passes the start barrier before it
// loads its checkpoint (the group's join needs every member): its claim,
// after it said it was ready but before any iteration, is taken. It was
// refused as coming after ready, and a job that should have resumed from
// the checkpoint before FAILED.
TEST_F(CheckpointUnusableClaimTest, AfterReadyBeforeAnyIteration_Taken) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  StepCheckpointingEvery5(id, 10);
  ASSERT_TRUE(jobs_->ReportProgress(PeerFailure(id, w1, 1)).ok());
  HeartbeatAllAndSchedule({w1, w2});
  ASSERT_EQ(AssignmentOf(w1).resume().step(), 10);
  v1::ReportProgressRequest ready;
  ready.set_worker_id(w1);
  ready.set_job_id(id);
  ready.set_plan_version(2);
  ready.set_ready(true);
  ASSERT_TRUE(jobs_->ReportProgress(ready).ok());
  v1::ReportProgressRequest r;
  r.set_worker_id(w1);
  r.set_job_id(id);
  r.set_plan_version(2);
  r.set_error("DATA_LOSS: unit-0000.safetensors is truncated");
  r.set_checkpoint_unusable(true);
  ASSERT_TRUE(jobs_->ReportProgress(r).ok());
  v1::Job job = jobs_->Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_RECOVERING) << job.reason();
  EXPECT_EQ(job.progress().checkpoint_step(), 5);
}

// A recovery that drops a checkpoint and then completes the same step
// again has made no progress, so dropping and redoing step 10 (a peer
// failure between) gives up like any other loop of recoveries.
TEST_F(CheckpointUnusableClaimTest, DroppedCheckpointRedone_IsNoProgress) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  StepCheckpointingEvery5(id, 10);
  // Recovery `n` (1-based): a peer failure, or the resume point unusable.
  auto recover = [&](int n, bool unusable) {
    const v1::Job job = jobs_->Get(id).value();
    ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING)
        << "before recovery " << n << ": " << job.reason();
    v1::ReportProgressRequest r = PeerFailure(id, job.worker_ids(0), job.plan_version());
    if (unusable) {
      r.set_error("DATA_LOSS: unit-0000.safetensors is truncated");
      r.set_peer_failure(false);
      r.set_checkpoint_unusable(true);
    }
    ASSERT_TRUE(jobs_->ReportProgress(r).ok());
    HeartbeatAllAndSchedule({w1, w2});
  };
  recover(1, false);  // resumes from 10
  EXPECT_EQ(AssignmentOf(w1).resume().step(), 10);
  recover(2, true);  // drops 10: resumes from 5
  EXPECT_EQ(AssignmentOf(w1).resume().step(), 5);
  for (int step = 6; step <= 10; ++step) Step(id, step);
  CheckpointAll(id, 10);  // 10 again, no further than before
  EXPECT_EQ(jobs_->Get(id).value().progress().checkpoint_step(), 10);
  recover(3, false);  // resumes from the new 10
  EXPECT_EQ(AssignmentOf(w1).resume().step(), 10);
  const v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  v1::ReportProgressRequest r = PeerFailure(id, job.worker_ids(0), job.plan_version());
  ASSERT_TRUE(jobs_->ReportProgress(r).ok());
  const v1::Job failed = jobs_->Get(id).value();
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(failed.reason(), "gave up after 3 recoveries")) << failed.reason();
}

// The furthest checkpoint is stored: after a restart, redoing a dropped
// checkpoint's step is still no progress (restored from the latest
// checkpoint alone, step 10 redone would have reset the count).
TEST_F(JobManagerElasticTest, Restore_DroppedCheckpointRedone_StillNoProgress) {
  Reset(/*with_state=*/true);
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  StepCheckpointingEvery5(id, 10);
  ASSERT_TRUE(jobs_->ReportProgress(PeerFailure(id, w1, 1)).ok());
  HeartbeatAllAndSchedule({w1, w2});
  ASSERT_EQ(AssignmentOf(w1).resume().step(), 10);
  // Loading step 10 fails: it is dropped, and the job resumes from 5.
  v1::ReportProgressRequest r = PeerFailure(id, w1, 2);
  r.set_error("DATA_LOSS: unit-0000.safetensors is truncated");
  r.set_peer_failure(false);
  r.set_checkpoint_unusable(true);
  ASSERT_TRUE(jobs_->ReportProgress(r).ok());
  EXPECT_EQ(jobs_->Get(id).value().progress().checkpoint_step(), 5);
  RestartCoordinator({w1, w2});
  clock_.Advance(absl::Milliseconds(10));
  AddWorker(7001);
  AddWorker(7002);
  Schedule();
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING)
      << jobs_->Get(id).value().reason();
  EXPECT_EQ(AssignmentOf(w1).resume().step(), 5);
  for (int step = 6; step <= 10; ++step) Step(id, step);
  CheckpointAll(id, 10);  // 10 again, no further than before the restart
  jobs_->FlushIo();
  EXPECT_EQ(jobs_->Get(id).value().progress().checkpoint_step(), 10);
  const std::vector<store::StoredJob> stored = state_->LoadJobs().value();
  ASSERT_EQ(stored.size(), 1u);
  EXPECT_EQ(stored[0].furthest_checkpoint_step(), 10);
  EXPECT_GT(stored[0].recoveries_without_progress(), 0);
}

TEST_F(JobManagerElasticTest, ThreeRecoveriesWithoutANewCheckpoint_FailTheJob) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  for (int round = 0; round < 3; ++round) {
    const v1::Job job = jobs_->Get(id).value();
    ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
    ASSERT_TRUE(jobs_->ReportProgress(PeerFailure(id, job.worker_ids(0), job.plan_version())).ok());
    HeartbeatAllAndSchedule({w1, w2});
  }
  const v1::Job job = jobs_->Get(id).value();
  ASSERT_TRUE(jobs_->ReportProgress(PeerFailure(id, job.worker_ids(0), job.plan_version())).ok());
  const v1::Job failed = jobs_->Get(id).value();
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(failed.reason(), "gave up after 3 recoveries")) << failed.reason();
}

// A worker's error may be 16 KiB (ReportProgress's bound), and each
// re-plan's history entry quotes it: the entry keeps its first
// kMaxPlanReasonBytes, so the history (100 entries, in every ListJobs page
// and the job's stored record) cannot grow by 16 KiB a recovery.
TEST_F(JobManagerElasticTest, LongPeerError_PlanHistoryKeepsItsStart) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  for (int step = 1; step <= 5; ++step) Step(id, step);
  CheckpointAll(id, 5);
  v1::ReportProgressRequest r = PeerFailure(id, w1, jobs_->Get(id).value().plan_version());
  const std::string error =
      absl::StrCat("UNAVAILABLE: stage 1 went away ", std::string(16000, 'x'));
  r.set_error(error);
  ASSERT_TRUE(jobs_->ReportProgress(r).ok());
  HeartbeatAllAndSchedule({w1, w2});
  const v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  ASSERT_EQ(job.plan_history_size(), 2);
  const std::string& reason = job.plan_history(1).reason();
  const std::string cut = " ... (cut; the coordinator's log has it whole)";
  EXPECT_EQ(reason.size(), kMaxPlanReasonBytes + cut.size());
  EXPECT_TRUE(
      absl::StartsWith(reason, absl::StrCat("worker ", w1, ": UNAVAILABLE: stage 1 went away xxx")))
      << reason.substr(0, 200);
  EXPECT_TRUE(absl::EndsWith(reason, cut));
}

// The history keeps the newest kMaxPlanHistory entries, fewer when they
// pass kMaxPlanHistoryBytes, and always the newest one.
TEST(TrimPlanHistoryTest, DropsTheOldestByCountAndBytes_KeepsTheNewest) {
  google::protobuf::RepeatedPtrField<v1::PlanVersion> history;
  for (int v = 1; v <= kMaxPlanHistory + 5; ++v) history.Add()->set_version(v);
  TrimPlanHistory(history);
  ASSERT_EQ(history.size(), kMaxPlanHistory);
  EXPECT_EQ(history.Get(0).version(), 6);
  // Entries of 10,000 worker-id bytes each: 13 fit in 128 KiB.
  history.Clear();
  for (int v = 1; v <= 20; ++v) {
    v1::PlanVersion* entry = history.Add();
    entry->set_version(v);
    for (int w = 0; w < 1000; ++w) entry->add_worker_ids(absl::StrFormat("w-%06d", w));
  }
  const int64_t each = static_cast<int64_t>(history.Get(0).ByteSizeLong());
  TrimPlanHistory(history);
  EXPECT_EQ(history.size(), kMaxPlanHistoryBytes / each);
  EXPECT_EQ(history.Get(history.size() - 1).version(), 20);
  int64_t bytes = 0;
  for (const v1::PlanVersion& entry : history) bytes += static_cast<int64_t>(entry.ByteSizeLong());
  EXPECT_LE(bytes, kMaxPlanHistoryBytes);
  // One entry larger than the whole budget stays: it is the current plan's.
  v1::PlanVersion* huge = history.Add();
  huge->set_version(21);
  huge->set_reason(std::string(kMaxPlanHistoryBytes + 1, 'r'));
  TrimPlanHistory(history);
  ASSERT_EQ(history.size(), 1);
  EXPECT_EQ(history.Get(0).version(), 21);
}

TEST_F(JobManagerElasticTest, StageErrorNotFromThePeers_FailsEvenWithCheckpoints) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  v1::ReportProgressRequest r;
  r.set_worker_id(w1);
  r.set_job_id(id);
  r.set_plan_version(1);
  r.set_error("INTERNAL: backward without its forward");
  ASSERT_TRUE(jobs_->ReportProgress(r).ok());
  EXPECT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_FAILED);
}

TEST_F(JobManagerElasticTest, CheckpointWriteFailed_NeverCompletesAndTheJobGoesOn) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  int failed = 0;
  jobs_->SetEvents({.checkpoint_failed = [&failed] { ++failed; }});
  for (int step = 1; step <= 5; ++step) Step(id, step);
  ASSERT_TRUE(Checkpoint(id, 0, 5).ok());
  const v1::ReportProgressRequest r = CheckpointFullDisk(id, w2, 5);
  ASSERT_TRUE(jobs_->ReportProgress(r).ok());
  v1::Job job = jobs_->Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.progress().checkpoint_step(), 0);
  EXPECT_EQ(failed, 1);
  // The job shows it, until a checkpoint completes; so does its summary,
  // which pipetrain_jobs_checkpoint_failing counts.
  EXPECT_EQ(job.progress().checkpoint_failures(), 1);
  const auto summary_failures = [&] {
    for (const JobManager::JobSummary& s : jobs_->Summaries()) {
      if (s.id == id) return s.checkpoint_failures;
    }
    return int64_t{-1};
  };
  EXPECT_EQ(summary_failures(), 1);
  EXPECT_EQ(job.progress().checkpoint_error(),
            "step 5, stage 1: RESOURCE_EXHAUSTED: No space left on device");
  for (int step = 6; step <= 10; ++step) Step(id, step);
  CheckpointAll(id, 10);
  job = jobs_->Get(id).value();
  EXPECT_EQ(job.progress().checkpoint_step(), 10);
  EXPECT_EQ(job.progress().checkpoint_failures(), 0);
  EXPECT_EQ(job.progress().checkpoint_error(), "");
  EXPECT_EQ(summary_failures(), 0);
  // Failures of a step that is no checkpoint step (9) or one complete (10)
  // count for nothing: not shown, no alert.
  for (int step : {9, 10}) {
    ASSERT_TRUE(jobs_->ReportProgress(CheckpointFullDisk(id, w2, step)).ok());
  }
  job = jobs_->Get(id).value();
  EXPECT_EQ(job.progress().checkpoint_failures(), 0);
  EXPECT_EQ(job.progress().checkpoint_error(), "");
  EXPECT_EQ(failed, 1);
  // A stage that reports failures of steps in turn (each passes the repeat
  // check) logs at most 10 of its lines per 10 s (the limit is
  // process-wide: earlier reports may have used some).
  for (int step = 11; step <= 15; ++step) Step(id, step);
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(jobs_->ReportProgress(CheckpointFullDisk(id, w2, 15 - 5 * (i % 2))).ok());
  }
  const std::string logged = ::testing::internal::GetCapturedStderr();
  EXPECT_LE(LinesWith(logged, "could not write its checkpoint"), 10) << logged;
}

// While every checkpoint fails (a full disk), the failed steps' files past
// the catalog's few are removed as more fail: no checkpoint can complete
// to remove them, and they are what fills the disk. The newest few stay
// (a later completion, or the job's end, removes them).
TEST_F(JobManagerElasticTest, CheckpointsFailingOnAFullDisk_OldestFailedStepsRemoved) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  const auto step_dir = [&](int64_t step) {
    return absl::StrCat(OutputDir(), "/checkpoints/", id, absl::StrFormat("/step-%08d", step));
  };
  const int64_t last = 5 * (kMaxPendingCheckpoints + 2);
  for (int64_t step = 5; step <= last; step += 5) {
    std::filesystem::create_directories(step_dir(step));
    std::ofstream(step_dir(step) + "/unit-0000.safetensors") << "half";
  }
  for (int64_t step = 1; step <= last; ++step) {
    Step(id, step);
    if (step % 5 == 0) {
      ASSERT_TRUE(jobs_->ReportProgress(CheckpointFullDisk(id, w1, step)).ok());
      ASSERT_TRUE(jobs_->ReportProgress(CheckpointFullDisk(id, w2, step)).ok());
    }
  }
  jobs_->FlushIo();
  EXPECT_FALSE(std::filesystem::exists(step_dir(5)));
  EXPECT_FALSE(std::filesystem::exists(step_dir(10)));
  for (int64_t step = 15; step <= last; step += 5) {
    EXPECT_TRUE(std::filesystem::exists(step_dir(step))) << step;
  }
  EXPECT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING);
}

// A job whose checkpoints fail does not grow into a spare: the boundary's
// checkpoint would fail as well, and the recovery from it rewind the job to
// its last complete checkpoint (here step 0). Once one completes, it grows.
TEST_F(JobManagerElasticTest, CheckpointsFailing_NoGrowthUntilOneCompletes) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_elastic()->set_max_workers(3);
  const std::string id = Submit(spec).value().id();
  for (int step = 1; step <= 5; ++step) Step(id, step);
  ASSERT_TRUE(Checkpoint(id, 0, 5).ok());
  const v1::ReportProgressRequest r = CheckpointFullDisk(id, w2, 5);
  ASSERT_TRUE(jobs_->ReportProgress(r).ok());
  ASSERT_EQ(jobs_->Get(id).value().progress().checkpoint_failures(), 1);
  AddWorker(7003);  // a spare
  Schedule();
  EXPECT_EQ(Step(id, 6).stop_after_step(), 0) << "a boundary was asked for";
  for (int step = 7; step <= 10; ++step) Step(id, step);
  CheckpointAll(id, 10);
  Schedule();
  EXPECT_GT(Step(id, 11).stop_after_step(), 11);
}

// A stage sends its checkpoint report again when the answer was lost
// (JobRunner::ReportWithRetries): the repeat counts neither as another
// checkpoint written nor as another failure.
TEST_F(JobManagerElasticTest, CheckpointReportRepeated_CountedOnce) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  int written = 0, failed = 0;
  jobs_->SetEvents({.checkpoint_written = [&written](double) { ++written; },
                    .checkpoint_failed = [&failed] { ++failed; }});
  for (int step = 1; step <= 5; ++step) Step(id, step);
  ASSERT_TRUE(Checkpoint(id, 0, 5).ok());
  ASSERT_TRUE(Checkpoint(id, 0, 5).ok());  // pending: stage 1 has not written
  EXPECT_EQ(written, 1);
  const v1::ReportProgressRequest r = CheckpointFullDisk(id, w2, 5);
  ASSERT_TRUE(jobs_->ReportProgress(r).ok());
  ASSERT_TRUE(jobs_->ReportProgress(r).ok());
  EXPECT_EQ(failed, 1);
  EXPECT_EQ(jobs_->Get(id).value().progress().checkpoint_failures(), 1);
  for (int step = 6; step <= 10; ++step) Step(id, step);
  CheckpointAll(id, 10);
  EXPECT_EQ(written, 3);
  ASSERT_TRUE(Checkpoint(id, 1, 10).ok());  // complete already
  EXPECT_EQ(written, 3);
  EXPECT_EQ(jobs_->Get(id).value().progress().checkpoint_step(), 10);
  // The next failure of the same stage, at another step, counts.
  for (int step = 11; step <= 15; ++step) Step(id, step);
  ASSERT_TRUE(jobs_->ReportProgress(CheckpointFullDisk(id, w2, 15)).ok());
  EXPECT_EQ(failed, 2);
  // Another stage's failure of that step counts; the first stage's repeat
  // after it does not (one key for the job took it for a new failure).
  ASSERT_TRUE(jobs_->ReportProgress(CheckpointFullDisk(id, w1, 15)).ok());
  EXPECT_EQ(failed, 3);
  ASSERT_TRUE(jobs_->ReportProgress(CheckpointFullDisk(id, w2, 15)).ok());
  EXPECT_EQ(failed, 3);
  EXPECT_EQ(jobs_->Get(id).value().progress().checkpoint_failures(), 2);
}

// A drain stops every stage after the boundary step's checkpoint. If a
// stage cannot write it, that checkpoint never completes and the stages
// would wait for good: the job recovers from its latest complete
// checkpoint instead, without the drained worker.
TEST_F(JobManagerElasticTest, Drain_BoundaryCheckpointFails_RecoversWithoutTheDrainedWorker) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002), w3 = AddWorker(7003);
  const std::string id = Submit(ElasticSpec(3, 5)).value().id();
  std::vector<std::string> recoveries;
  JobEvents events;
  events.recovery_started = [&](RecoveryKind kind) {
    recoveries.push_back(RecoveryKindName(kind));
  };
  jobs_->SetEvents(events);
  for (int step = 1; step <= 5; ++step) Step(id, step);
  CheckpointAll(id, 5);
  ASSERT_TRUE(jobs_->Drain(w2).ok());
  const int64_t boundary = Step(id, 6).stop_after_step();
  ASSERT_GT(boundary, 6);
  for (int64_t step = 7; step <= boundary; ++step) Step(id, step);
  ASSERT_TRUE(Checkpoint(id, 0, boundary).ok());
  v1::ReportProgressRequest r;
  r.set_worker_id(w3);
  r.set_job_id(id);
  r.set_plan_version(1);
  r.set_iteration(boundary - 1);
  r.mutable_checkpoint()->set_step(boundary);
  // Long, with a two-byte character across the 1024 bytes quoted: the
  // reason must stay UTF-8 (a stored one that is not would not parse).
  std::string error = "RESOURCE_EXHAUSTED: No space left on device; ";
  error.resize(1023, 'x');
  r.mutable_checkpoint()->set_error(error + "\xc3\xa9 (\"caf\xc3\xa9\")");
  ASSERT_TRUE(jobs_->ReportProgress(r).ok());
  v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RECOVERING);
  v1::Job parsed;
  EXPECT_TRUE(parsed.ParseFromString(job.SerializeAsString())) << "reason not UTF-8";
  EXPECT_TRUE(absl::StrContains(
      job.reason(), "the checkpoint of step " + std::to_string(boundary) + " (" + w2 + " drained"))
      << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(), "No space left on device")) << job.reason();
  EXPECT_EQ(recoveries, std::vector<std::string>{"checkpoint_failed"});
  HeartbeatAllAndSchedule({w1, w2, w3});
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(WorkerIdsOf(job), (std::vector<std::string>{w1, w3}));
  EXPECT_EQ(job.progress().step(), 5);
  EXPECT_EQ(job.progress().steps_redone(), boundary - 5);
}

TEST_F(JobManagerElasticTest, NoCheckpoints_WorkerLost_FailsAsBefore) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 0)).value().id();
  registry_.MarkLost(w2, incarnations_[w2], "killed");
  const v1::Job job = jobs_->Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(job.reason(), w2)) << job.reason();
}

TEST_F(JobManagerElasticTest, Drain_StopsAtAStepBoundaryAndReplansWithoutIt_NothingRedone) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002), w3 = AddWorker(7003);
  const std::string id = Submit(ElasticSpec(3, 5)).value().id();
  for (int step = 1; step <= 3; ++step) Step(id, step);
  EXPECT_FALSE(jobs_->IsDrained(registry_.Get(w2).value()));
  const absl::StatusOr<v1::Worker> drained = jobs_->Drain(w2);
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_TRUE(drained->drained());
  for (int again = 0; again < 3; ++again) {  // idempotent
    const absl::StatusOr<v1::Worker> repeated = jobs_->Drain(w2);
    ASSERT_TRUE(repeated.ok()) << repeated.status();
    EXPECT_TRUE(repeated->drained());
  }
  const int64_t boundary = Step(id, 4).stop_after_step();
  ASSERT_GT(boundary, 4);
  const v1::Job job = PassBoundary(id, 5, boundary);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(job.plan_version(), 2);
  EXPECT_EQ(WorkerIdsOf(job), (std::vector<std::string>{w1, w3}));
  EXPECT_EQ(job.progress().steps_redone(), 0);
  EXPECT_EQ(job.progress().recoveries(), 0);
  EXPECT_EQ(job.plan_history(1).start_step(), boundary);
  EXPECT_TRUE(absl::StrContains(job.plan_history(1).reason(), w2 + " drained"));
  EXPECT_FALSE(absl::StrContains(job.plan_history(1).reason(), w2 + " drained; " + w2))
      << job.plan_history(1).reason();
  // Stage times start afresh with the new plan's workers.
  ASSERT_EQ(job.progress().stage_times_size(), 2);
  EXPECT_EQ(job.progress().stage_times(0).worker_id(), w1);
  EXPECT_EQ(job.progress().stage_times(1).worker_id(), w3);
  EXPECT_EQ(job.progress().stage_times(0).steps(), 0);
  EXPECT_EQ(AssignmentOf(w2).action(), v1::Assignment::ACTION_STOP);
  EXPECT_EQ(AssignmentOf(w1).resume().step(), boundary);
  // Drained: no job for it, though READY, and listed as drained.
  EXPECT_EQ(registry_.Get(w2).value().state(), v1::WORKER_STATE_READY);
  EXPECT_TRUE(jobs_->IsDrained(registry_.Get(w2).value()));
  EXPECT_FALSE(jobs_->IsDrained(registry_.Get(w1).value()));
  const std::string next = Submit(ElasticSpec(1, 0)).value().id();
  EXPECT_EQ(jobs_->Get(next).value().state(), v1::JOB_STATE_QUEUED);
}

TEST_F(JobManagerElasticTest, Drain_NoCheckpointsOrTooFewLeft_RefusedNothingChanges) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string plain = Submit(ElasticSpec(2, 0)).value().id();
  EXPECT_EQ(jobs_->Drain(w1).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(jobs_->Cancel(plain).ok());
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_elastic()->set_min_workers(2);
  const std::string id = Submit(spec).value().id();
  const absl::Status refused = jobs_->Drain(w1).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.message(), "min_workers")) << refused;
  EXPECT_EQ(Step(id, 1).stop_after_step(), 0);
  EXPECT_EQ(jobs_->Drain("w-99").status().code(), absl::StatusCode::kNotFound);
}

// Two drains of one job's workers, each allowed alone by min_workers 1: the
// second would leave it none, since the first leaves at the same boundary.
TEST_F(JobManagerElasticTest, Drain_SecondWorkerOfTheJob_CountsTheFirstDrainAsGone) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  ASSERT_TRUE(jobs_->Drain(w1).ok());
  const absl::Status refused = jobs_->Drain(w2).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "fewer than its 1 workers")) << refused;
  EXPECT_FALSE(jobs_->IsDrained(registry_.Get(w2).value()));
  EXPECT_TRUE(jobs_->Drain(w1).ok());  // asking again stays allowed
  AddWorker(7003);
  EXPECT_TRUE(jobs_->Drain(w2).ok()) << "a spare takes its place";
  EXPECT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING);
}

// A recovering job's survivor that died since the recovery began (released,
// so its loss names no job) is no worker a drain may count on: the re-plan
// leaves it out. Before, w4 was counted, the drain of w2 accepted, and the
// job left one short of its minimum.
TEST_F(JobManagerElasticTest, Drain_RecoveringJob_CountsNoSurvivorDeadSince) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002), w3 = AddWorker(7003),
                    w4 = AddWorker(7004);
  v1::JobSpec spec = ElasticSpec(4, 1);
  spec.mutable_elastic()->set_min_workers(2);
  const std::string id = Submit(spec).value().id();
  ASSERT_EQ(jobs_->Get(id).value().worker_ids_size(), 4);
  Step(id, 1);
  CheckpointAll(id, 1);
  registry_.MarkLost(w1, incarnations_[w1], "killed");
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RECOVERING);
  registry_.MarkLost(w4, incarnations_[w4], "killed");
  const absl::Status refused = jobs_->Drain(w2).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "fewer than its 2 workers")) << refused;
  EXPECT_FALSE(jobs_->IsDrained(registry_.Get(w2).value()));
  EXPECT_TRUE(jobs_->Drain(w3).status().code() == absl::StatusCode::kFailedPrecondition);
}

// A drain allowed because a spare can take the worker's place holds that
// spare until the boundary. Before, nothing held it: a drain of the spare
// itself, or a job submitted meanwhile, took it, and the boundary left the
// job RECOVERING "waiting for 2 READY workers" until its queue timeout.
TEST_F(JobManagerElasticTest, Drain_TheSpareItCountedOn_HeldForTheBoundary) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_elastic()->set_min_workers(2);
  spec.mutable_elastic()->set_max_workers(2);  // the spare is no growth
  const std::string id = Submit(spec).value().id();
  Step(id, 1);
  const std::string w3 = AddWorker(7003);
  Schedule();
  ASSERT_TRUE(jobs_->Drain(w1).ok());
  const absl::Status refused = jobs_->Drain(w3).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "fewer than its 2 workers")) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "spare held for the job's re-planning"))
      << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "(" + w1 + " drained)")) << refused;
  EXPECT_FALSE(jobs_->IsDrained(registry_.Get(w3).value()));
  // A job submitted meanwhile waits for another worker, and takes it.
  const std::string later = Submit(ElasticSpec(1, 5)).value().id();
  v1::Job waiting = jobs_->Get(later).value();
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_QUEUED) << waiting.reason();
  EXPECT_TRUE(absl::StrContains(waiting.reason(), "held")) << waiting.reason();
  const std::string w4 = AddWorker(7004);
  Schedule();
  waiting = jobs_->Get(later).value();
  ASSERT_EQ(waiting.state(), v1::JOB_STATE_RUNNING) << waiting.reason();
  EXPECT_EQ(WorkerIdsOf(waiting), std::vector<std::string>{w4});
  // Another spare comes: the held one may go now, the newcomer held instead.
  const std::string w5 = AddWorker(7005);
  ASSERT_TRUE(jobs_->Drain(w3).ok());
  const absl::Status newcomer = jobs_->Drain(w5).status();
  EXPECT_EQ(newcomer.code(), absl::StatusCode::kFailedPrecondition) << newcomer;
  const int64_t boundary = Step(id, 2).stop_after_step();
  ASSERT_GT(boundary, 2);
  const v1::Job job = PassBoundary(id, 3, boundary);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(WorkerIdsOf(job), (std::vector<std::string>{w2, w5}));
  EXPECT_EQ(job.progress().recoveries(), 0);
  const std::string reason = job.plan_history(1).reason();
  EXPECT_TRUE(absl::StrContains(reason, w1 + " drained; " + w5 + " joined; re-planned at step"))
      << reason;
  EXPECT_FALSE(absl::StrContains(reason, "same workers")) << reason;
  // Once the boundary is past, nothing is held: the drained spare's
  // replacement is the job's own worker now, and w3 stays drained.
  EXPECT_TRUE(jobs_->IsDrained(registry_.Get(w3).value()));
}

// A growth boundary's joiner drained before the boundary: the job re-plans
// on its own workers (its stages stopped there already), and the history
// says what happened rather than "w-3 joined".
TEST_F(JobManagerElasticTest, SpareWorker_DrainedBeforeItsBoundary_HistorySaysSo) {
  const auto [id, w1, w2, w3, boundary] = StartGrowing();
  ASSERT_GT(boundary, 2);
  ASSERT_TRUE(jobs_->Drain(w3).ok()) << "a joiner the job does not need may go";
  const v1::Job job = PassBoundary(id, 3, boundary);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(WorkerIdsOf(job), (std::vector<std::string>{w1, w2}));
  const std::string reason = job.plan_history(1).reason();
  EXPECT_TRUE(absl::StrContains(reason, w3 + " joined; " + w3 +
                                            " drained before the boundary; "
                                            "re-planned at step " +
                                            std::to_string(boundary) + " on the same workers"))
      << reason;
}

// A joiner that fails to set up its stage (here: no --checkpoint-root)
// before its first iteration, not for want of a peer: the job, which ran on
// the others, goes on without it from the boundary, and does not take it
// again until it registers anew. It failed the job before.
TEST_F(JobManagerElasticTest, JoinerFailsBeforeItsFirstIteration_JobGoesOnWithoutIt) {
  const auto [id, w1, w2, w3, boundary] = StartGrowing();
  ASSERT_GT(boundary, 2);
  v1::Job job = PassBoundary(id, 3, boundary);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  ASSERT_EQ(WorkerIdsOf(job), (std::vector<std::string>{w1, w2, w3}));
  v1::ReportProgressRequest failed;
  failed.set_worker_id(w3);
  failed.set_job_id(id);
  failed.set_plan_version(job.plan_version());
  failed.set_error("FAILED_PRECONDITION: this worker has no --checkpoint-root");
  ASSERT_TRUE(jobs_->ReportProgress(failed).ok());
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RECOVERING) << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(),
                                "going on without " + w3 + ", which failed as it joined the job"))
      << job.reason();
  HeartbeatAllAndSchedule({w1, w2, w3});
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(WorkerIdsOf(job), (std::vector<std::string>{w1, w2}));
  EXPECT_EQ(job.progress().step(), boundary);
  // Not offered again: the next steps bring no boundary.
  Schedule();
  EXPECT_EQ(Step(id, boundary + 1).stop_after_step(), 0);
}

// A joiner's error after the start barrier may be the plan's (every member
// of a compressed all-reduce refuses a value alike, and the first report
// decides): it fails the job as before rather than leave a healthy joiner
// out.
TEST_F(JobManagerElasticTest, JoinerFailsAfterTheStartBarrier_JobFails) {
  const auto [id, w1, w2, w3, boundary] = StartGrowing();
  ASSERT_GT(boundary, 2);
  v1::Job job = PassBoundary(id, 3, boundary);
  ASSERT_EQ(WorkerIdsOf(job), (std::vector<std::string>{w1, w2, w3}));
  v1::ReportProgressRequest r;
  r.set_worker_id(w3);
  r.set_job_id(id);
  r.set_plan_version(job.plan_version());
  r.set_ready(true);
  ASSERT_TRUE(jobs_->ReportProgress(r).ok());
  r.set_ready(false);
  r.set_error("INVALID_ARGUMENT: values that are not finite, or that fp16 cannot carry");
  ASSERT_TRUE(jobs_->ReportProgress(r).ok());
  job = jobs_->Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED) << job.reason();
}

// A loss while a drain's boundary is pending: the recovery overtakes the
// boundary and leaves the drained worker out too, and its reason names the
// drain as well as the loss. A drain while it recovers is named as well.
TEST_F(JobManagerElasticTest, Drain_ThenALoss_TheRecoveryNamesBoth) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002), w3 = AddWorker(7003);
  const std::string id = Submit(ElasticSpec(3, 5)).value().id();
  StepCheckpointingEvery5(id, 5);
  ASSERT_TRUE(jobs_->Drain(w2).ok());
  registry_.MarkLost(w3, incarnations_[w3], "killed");
  v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RECOVERING) << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(), w3)) << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(), "overtaking the re-planning due after step"))
      << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(), "(" + w2 + " drained)")) << job.reason();
  const std::string w4 = AddWorker(7004);
  ASSERT_TRUE(jobs_->Drain(w1).ok()) << "w4 can take its place";
  job = jobs_->Get(id).value();
  EXPECT_TRUE(absl::EndsWith(job.reason(), "; " + w1 + " drained")) << job.reason();
  HeartbeatAllAndSchedule({w1, w2, w4});
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(WorkerIdsOf(job), std::vector<std::string>{w4});
  const std::string reason = job.plan_history(job.plan_history_size() - 1).reason();
  EXPECT_TRUE(absl::StrContains(reason, w2 + " drained")) << reason;
  EXPECT_TRUE(absl::StrContains(reason, w1 + " drained")) << reason;
}

// A recovering job that can re-plan only with a spare: draining that spare
// is refused until another worker could take its place. Before, the drain
// went through and the recovery waited "for 2 READY workers" until its
// queue timeout failed the job.
TEST_F(JobManagerElasticTest, Drain_TheSpareARecoveryNeeds_RefusedUntilAnotherComes) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_elastic()->set_min_workers(2);
  spec.mutable_elastic()->set_max_workers(2);
  const std::string id = Submit(spec).value().id();
  StepCheckpointingEvery5(id, 5);
  const std::string w3 = AddWorker(7003);
  registry_.MarkLost(w2, incarnations_[w2], "killed");
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RECOVERING);
  const absl::Status refused = jobs_->Drain(w3).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "would leave job " + id)) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "a spare the recovering job needs")) << refused;
  const std::string w4 = AddWorker(7004);
  ASSERT_TRUE(jobs_->Drain(w3).ok()) << "w4 can take its place";
  HeartbeatAllAndSchedule({w1, w3, w4});
  const v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(WorkerIdsOf(job), (std::vector<std::string>{w1, w4}));
  // A spare no job needs drains as before.
  const std::string w5 = AddWorker(7005);
  EXPECT_TRUE(jobs_->Drain(w5).ok());
}

// A drain is answered once the state store has it (the registry saves it
// with the incarnation it covers). A failed save answers UNAVAILABLE, the
// drain applied all the same; asking again saves it again.
TEST(JobManagerDrainSaveTest, StoreFails_UnavailableThenDrainAgainRecordsIt) {
  FakeClock clock;
  bool failing = true;
  std::vector<v1::Worker> saved;
  WorkerRegistry::Options options{"", absl::Seconds(1), absl::Seconds(5), &clock};
  options.persist = [&](const v1::Worker& w) {
    if (failing && w.drained()) return absl::UnavailableError("database is locked");
    saved.push_back(w);
    return absl::OkStatus();
  };
  WorkerRegistry registry(options);
  AssignmentHub hub;
  JobManager jobs(&registry, &hub, &clock, JobManagerOptions{.output_dir = OutputDir()});
  v1::RegisterWorkerRequest request;
  request.set_data_address("127.0.0.1:7001");
  const std::string w = registry.Register(request).value().worker_id();
  const absl::Status refused = jobs.Drain(w).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "database is locked")) << refused;
  EXPECT_TRUE(jobs.IsDrained(registry.Get(w).value()));  // applied here all the same
  failing = false;
  const absl::StatusOr<v1::Worker> drained = jobs.Drain(w);
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_TRUE(drained->drained());
  ASSERT_FALSE(saved.empty());
  EXPECT_EQ(saved.back().id(), w);
  EXPECT_TRUE(saved.back().drained());
}

// A job waiting beside a drained (still READY) worker says why it is not
// taken; a job cancelled before any plan says it will never have one.
TEST_F(JobManagerElasticTest, Waiting_CountsDrainedWorkersApart_EndedJobHasNoPlan) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  ASSERT_TRUE(jobs_->Drain(w2).ok());
  v1::JobSpec spec = ElasticSpec(2, 5);
  const std::string id = Submit(spec).value().id();
  EXPECT_EQ(jobs_->Get(id).value().reason(),
            "waiting for 2 READY workers (1 ready; 1 more READY but drained, taking no job until "
            "restarted)");
  ASSERT_TRUE(jobs_->Cancel(id).ok());
  const absl::Status no_plan = jobs_->GetPlan(id).status();
  EXPECT_EQ(no_plan.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(no_plan.message(),
            "job " + id + " ended CANCELLED before it was planned: it has no plan");
}

// A LOST or LEFT worker is out of service already: draining it is refused,
// saying so, instead of reporting a drain that does nothing.
TEST_F(JobManagerElasticTest, Drain_LostOrLeftWorker_RefusedSayingSo) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  registry_.MarkLost(w1, incarnations_[w1], "killed");
  absl::Status refused = jobs_->Drain(w1).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.message(), "is LOST")) << refused;
  ASSERT_TRUE(registry_.Deregister(w2, incarnations_[w2]).ok());
  refused = jobs_->Drain(w2).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.message(), "is LEFT")) << refused;
  EXPECT_FALSE(jobs_->IsDrained(registry_.Get(w2).value()));
}

// Across a coordinator restart: a drain whose answer was lost (or was
// UNAVAILABLE, "drain again") but that the store recorded is answered as
// done; and a worker restored LOST, not yet heard from, may be drained: its
// process registering again is drained. Both were refused as LOST ("a new
// incarnation this drain would not cover"), and a worker whose drain was
// not recorded went back into its recovering job at once. One lost in
// this coordinator's own time is still refused.
TEST(DrainAcrossARestartTest, RecordedDrainAnsweredAndRestoredWorkerDrainable) {
  FakeClock clock;
  MemoryStore store;
  CoordinatorState state(&store);
  ASSERT_TRUE(state.Initialize().ok());
  WorkerRegistry::Options options{"", absl::Seconds(1), absl::Seconds(5), &clock};
  options.persist = [&state](const v1::Worker& w) { return state.SaveWorker(w); };
  const auto request = [](int port) {
    v1::RegisterWorkerRequest r;
    r.set_data_address("127.0.0.1:" + std::to_string(port));
    return r;
  };
  {
    WorkerRegistry before(options);
    for (int port : {7001, 7002, 7003}) ASSERT_TRUE(before.Register(request(port)).ok());
    ASSERT_TRUE(before.MarkDrained("w-1", 1).ok());  // its answer lost
  }
  const absl::StatusOr<std::vector<v1::Worker>> saved = state.LoadWorkers();
  ASSERT_TRUE(saved.ok()) << saved.status();
  WorkerRegistry after(options);
  after.Restore(*saved);
  AssignmentHub hub;
  JobManager jobs(&after, &hub, &clock, JobManagerOptions{.output_dir = OutputDir()});
  absl::StatusOr<v1::Worker> drained = jobs.Drain("w-1");
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_TRUE(drained->drained());
  drained = jobs.Drain("w-2");
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_TRUE(drained->drained());
  v1::RegisterWorkerRequest same = request(7002);
  same.set_previous_incarnation(1);
  ASSERT_TRUE(after.Register(same).ok());
  EXPECT_TRUE(after.Get("w-2")->drained());
  EXPECT_TRUE(jobs.IsDrained(after.Get("w-2").value()));
  // w-3 registers as a new process, then is lost here: refused.
  ASSERT_TRUE(after.Register(request(7003)).ok());
  after.MarkLost("w-3", after.Get("w-3")->incarnation(), "killed");
  const absl::Status refused = jobs.Drain("w-3").status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "is LOST")) << refused;
}

// A JOINING worker's registration may yet fail to save, and the process
// then registers again as an incarnation the drain would not cover, while
// the drain had answered OK: refused as retryable until it is READY.
TEST_F(JobManagerElasticTest, Drain_JoiningWorker_RefusedUntilItsRegistrationIsSaved) {
  absl::Notification saving, release;
  on_persist_ = [&](const v1::Worker&) {
    saving.Notify();
    release.WaitForNotification();
    return absl::OkStatus();
  };
  std::string w1;
  std::thread registering([&] { w1 = AddWorker(7001); });
  saving.WaitForNotification();
  ASSERT_EQ(registry_.List().size(), 1u);
  const std::string id = registry_.List()[0].id();
  ASSERT_EQ(registry_.Get(id).value().state(), v1::WORKER_STATE_JOINING);
  const absl::Status refused = jobs_->Drain(id).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "is JOINING")) << refused;
  release.Notify();
  registering.join();
  on_persist_ = nullptr;
  ASSERT_EQ(w1, id);
  EXPECT_FALSE(jobs_->IsDrained(registry_.Get(w1).value()));
  ASSERT_TRUE(jobs_->Drain(w1).ok());
  EXPECT_TRUE(jobs_->IsDrained(registry_.Get(w1).value()));
}

// An auto layout on GPU and CPU workers whose ids interleave the kinds:
// the 2 x 2 layout is planned on them arranged by kind (each stage's
// replicas of one kind), not refused, and the job is placed in that order.
// In id order its stage 0 was w1 (CPU) and w3 (GPU): "no plan". Links of
// 10 ms make the choice clear (one hop each way per micro-batch against
// three): at the default 50 us the two predicted steps tie to 1e-4 s.
TEST_F(JobManagerElasticTest, AutoLayout_KindsInterleaved_ReplicatedLayoutArrangedByKind) {
  auto slow_link = [](v1::RegisterWorkerRequest request) {
    request.mutable_device()->set_link_bandwidth_bytes_per_second(1e10);
    request.mutable_device()->set_link_latency_seconds(0.01);
    return request;
  };
  v1::RegisterWorkerRequest cpu;
  cpu.set_data_address("127.0.0.1:7001");
  Register(slow_link(cpu));
  cpu.set_data_address("127.0.0.1:7002");
  Register(slow_link(cpu));
  Register(slow_link(GpuWorkerRequest(7003)));
  Register(slow_link(GpuWorkerRequest(7004)));
  const std::string id = Submit(AutoLayoutSpec(4, 1)).value().id();
  const v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  ASSERT_EQ(job.plan_history_size(), 1);
  const std::string& reason = job.plan_history(0).reason();
  EXPECT_TRUE(absl::StrContains(reason, "predicted s/step: 1 x 4 0.")) << reason;
  EXPECT_TRUE(absl::StrContains(reason, ", 2 x 2 0.")) << reason;
  EXPECT_FALSE(absl::StrContains(reason, "no plan")) << reason;
  // Chosen: it predicts the shorter step here.
  ASSERT_EQ(job.spec().parallelism().data(), 2) << reason;
  EXPECT_TRUE(EveryStageOfOneKind(id));
}

// Draining an auto layout's worker: allowed while the rest still has a
// layout. With 2 tensor ranks per stage, one worker left has none (refused,
// saying so); searching T, one worker is a layout (1 x 1 x 1).
TEST_F(JobManagerElasticTest, Drain_AutoLayout_AllowedWhileTheRestHasALayout) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string fixed = Submit(AutoLayoutSpec(2, 2)).value().id();
  ASSERT_EQ(jobs_->Get(fixed).value().state(), v1::JOB_STATE_RUNNING);
  const absl::Status refused = jobs_->Drain(w1).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.message(),
                                "fewer than its 2 workers (the fewest with a layout of "
                                "spec.parallelism.workers)"))
      << refused;
  ASSERT_TRUE(jobs_->Cancel(fixed).ok());
  const std::string searched = Submit(AutoLayoutSpec(2, 0)).value().id();
  ASSERT_EQ(jobs_->Get(searched).value().state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(jobs_->Drain(w1).ok());
}

// spec.parallelism.data 0 (auto) on 4 workers with fast links: 4 replicas
// of the whole model. Losing one leaves 3, which no 4-replica layout fits;
// the job chooses again (3 workers and 4 micro-batches: one 3-stage
// pipeline), resumes from its checkpoint, and after a coordinator restart
// still chooses its layout when it re-plans. Its data-parallel codec goes
// with the layouts that have replicas: dropped by the pipeline, back
// (from the stored job) when two replicas are chosen after the restart.
TEST_F(JobManagerElasticTest, AutoLayoutWorkerLost_LayoutChosenAgainForTheWorkersLeft) {
  Reset(/*with_state=*/true);
  v1::JobSpec spec = AutoLayoutSpec(4, 1);
  spec.mutable_training()->set_micro_batches(4);
  spec.mutable_compression()->mutable_data_parallel()->set_codec("bf16");
  std::vector<std::string> w;
  for (int k = 0; k < 4; ++k) {
    v1::RegisterWorkerRequest request;
    request.set_data_address("127.0.0.1:" + std::to_string(7001 + k));
    request.mutable_device()->set_link_bandwidth_bytes_per_second(1e10);
    request.mutable_device()->set_link_latency_seconds(0);
    auto response = registry_.Register(request).value();
    incarnations_[response.worker_id()] = response.incarnation();
    w.push_back(response.worker_id());
  }
  const std::string id = Submit(spec).value().id();
  v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  ASSERT_EQ(job.spec().parallelism().data(), 4) << job.plan_history(0).reason();
  EXPECT_EQ(job.spec().compression().data_parallel().codec(), "bf16");
  EXPECT_EQ(AssignmentOf(w[0]).data_parallel_quantizer(), "bf16");
  // Replica 0's stages write the checkpoints.
  auto step = [&](int64_t s) { StepEveryWorker(id, s, 4); };
  for (int64_t s = 1; s <= 5; ++s) step(s);
  ASSERT_TRUE(Checkpoint(id, 0, 5).ok());
  EXPECT_EQ(jobs_->Get(id).value().progress().checkpoint_step(), 5);

  registry_.MarkLost(w[3], incarnations_[w[3]], "killed");
  HeartbeatAllAndSchedule({w[0], w[1], w[2]});
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(job.worker_ids_size(), 3);
  EXPECT_EQ(job.spec().parallelism().data(), 1);
  EXPECT_EQ(job.spec().parallelism().stages(), 3);
  EXPECT_EQ(job.spec().compression().data_parallel().codec(), "none");  // nothing to all-reduce
  ASSERT_EQ(job.plan_history_size(), 2);
  EXPECT_TRUE(absl::StrContains(job.plan_history(1).reason(),
                                "1 replica x 3 stages chosen by spec.parallelism.data 0 (auto); "
                                "predicted s/step: 1 x 3 "))
      << job.plan_history(1).reason();
  EXPECT_EQ(AssignmentOf(w[2]).num_stages(), 3);
  EXPECT_EQ(AssignmentOf(w[2]).resume().step(), 5);
  step(6);

  // A new coordinator on the same state: the job re-plans as auto again.
  jobs_->FlushIo();
  Reset(/*with_state=*/true);
  ASSERT_TRUE(jobs_->Restore().ok());
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RECOVERING);
  for (int k = 0; k < 3; ++k) registry_.MarkLost(w[k], incarnations_[w[k]], "restarted");
  clock_.Advance(absl::Milliseconds(10));
  for (int k = 0; k < 2; ++k) AddWorker(7001 + k);  // two come back
  clock_.Advance(absl::Minutes(10));                // the third never does
  Schedule();
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(job.worker_ids_size(), 2);
  EXPECT_EQ(job.spec().parallelism().data(), 2);  // fast links: replicas, as at the start
  EXPECT_EQ(job.spec().parallelism().stages(), 1);
  EXPECT_EQ(job.spec().compression().data_parallel().codec(), "bf16");
  EXPECT_TRUE(absl::StrContains(job.plan_history(job.plan_history_size() - 1).reason(),
                                "chosen by spec.parallelism.data 0 (auto); predicted s/step: "
                                "1 x 2 "))
      << job.plan_history(job.plan_history_size() - 1).reason();
}

// An auto layout with 2 tensor ranks per stage on 4 workers: losing one
// leaves 3, of which only 2 make whole stages; the job chooses again among
// the layouts of that one group (1 replica x 1 stage of 2 ranks) and
// resumes from its checkpoint. The fourth worker waits as a spare.
TEST_F(JobManagerElasticTest, AutoLayoutWithTensorRanks_WorkerLost_WholeStagesKept) {
  const v1::JobSpec spec = AutoLayoutSpec(4, 2);
  std::vector<std::string> w;
  for (int k = 0; k < 4; ++k) w.push_back(AddWorker(7001 + k));
  const std::string id = Submit(spec).value().id();
  v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(job.worker_ids_size(), 4);
  EXPECT_EQ(job.spec().parallelism().tensor(), 2);
  EXPECT_EQ(job.spec().parallelism().data() * job.spec().parallelism().stages(), 2);
  EXPECT_TRUE(absl::StrContains(job.plan_history(0).reason(), "of 2 tensor ranks chosen by"))
      << job.plan_history(0).reason();
  // Replica 0's rank 0 writes its stage's checkpoint.
  for (int64_t s = 1; s <= 5; ++s) StepEveryWorker(id, s, 2);
  ASSERT_TRUE(Checkpoint(id, 0, 5).ok());
  ASSERT_EQ(jobs_->Get(id).value().progress().checkpoint_step(), 5);

  registry_.MarkLost(w[3], incarnations_[w[3]], "killed");
  HeartbeatAllAndSchedule({w[0], w[1], w[2]});
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(job.worker_ids_size(), 2);
  EXPECT_EQ(job.spec().parallelism().data(), 1);
  EXPECT_EQ(job.spec().parallelism().stages(), 1);
  EXPECT_EQ(job.spec().parallelism().tensor(), 2);
  for (const std::string& worker : job.worker_ids()) {
    EXPECT_EQ(AssignmentOf(worker).resume().step(), 5) << worker;
  }
}

// Tensor 0 with data 0: every plan searches the tensor ranks too. On 4
// workers the layouts include stages of 2 ranks (2 heads); losing one
// leaves 3 workers, whose only layout is one pipeline of single ranks, so
// the spec's tensor_partitions waits; after a coordinator restart over the
// stored state, the 4 workers back, T is searched again with it.
TEST_F(JobManagerElasticTest, TensorRanksSearched_WorkerLost_AnyCountGoesOnAndTIsSearchedAgain) {
  Reset(/*with_state=*/true);
  v1::JobSpec spec = AutoLayoutSpec(4, 0);
  spec.mutable_parallelism()->set_tensor_partitions(2);
  std::vector<std::string> w;
  for (int k = 0; k < 4; ++k) w.push_back(AddWorker(7001 + k));
  const std::string id = Submit(spec).value().id();
  v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(job.worker_ids_size(), 4);
  auto tensor_fields_follow_t = [](const v1::Job& j) {
    const v1::ParallelismSpec& p = j.spec().parallelism();
    EXPECT_EQ(p.data() * p.stages() * p.tensor(), j.worker_ids_size());
    EXPECT_EQ(p.tensor_partitions(), p.tensor() > 1 ? 2 : 1) << p.tensor();
  };
  tensor_fields_follow_t(job);
  EXPECT_TRUE(absl::StrContains(job.plan_history(0).reason(),
                                "chosen by spec.parallelism.data 0 and tensor 0 (auto); predicted "
                                "s/step (replicas x stages x tensor ranks): 1 x 4 x 1 "))
      << job.plan_history(0).reason();
  EXPECT_TRUE(absl::StrContains(job.plan_history(0).reason(), ", 1 x 2 x 2 "))
      << job.plan_history(0).reason();
  for (int64_t s = 1; s <= 5; ++s) StepEveryWorker(id, s, 2);
  CheckpointAll(id, 5);
  ASSERT_EQ(jobs_->Get(id).value().progress().checkpoint_step(), 5);

  registry_.MarkLost(w[3], incarnations_[w[3]], "killed");
  HeartbeatAllAndSchedule({w[0], w[1], w[2]});
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(job.worker_ids_size(), 3);  // all of them: T 1 takes any count
  EXPECT_EQ(job.spec().parallelism().tensor(), 1);
  EXPECT_EQ(job.spec().parallelism().stages(), 3);
  tensor_fields_follow_t(job);
  EXPECT_TRUE(absl::StrContains(job.plan_history(1).reason(),
                                "1 replica x 3 stages of 1 tensor rank chosen by "
                                "spec.parallelism.data 0 and tensor 0 (auto)"))
      << job.plan_history(1).reason();
  for (const std::string& worker : job.worker_ids()) {
    EXPECT_EQ(AssignmentOf(worker).resume().step(), 5) << worker;
  }
  StepEveryWorker(id, 6, 2);

  jobs_->FlushIo();
  Reset(/*with_state=*/true);
  ASSERT_TRUE(jobs_->Restore().ok());
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RECOVERING);
  for (int k = 0; k < 3; ++k) registry_.MarkLost(w[k], incarnations_[w[k]], "restarted");
  clock_.Advance(absl::Milliseconds(10));
  for (int k = 0; k < 4; ++k) AddWorker(7001 + k);
  Schedule();
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  const std::string last = job.plan_history(job.plan_history_size() - 1).reason();
  EXPECT_TRUE(absl::StrContains(last, "and tensor 0 (auto)")) << last;
  EXPECT_TRUE(absl::StrContains(last, ", 1 x 2 x 2 ")) << last;
  tensor_fields_follow_t(job);
}

TEST_F(JobManagerElasticTest, SpareWorker_JobGrowsAtAStepBoundaryUpToMaxWorkers) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_elastic()->set_max_workers(3);
  const std::string id = Submit(spec).value().id();
  Step(id, 1);
  const std::string w3 = AddWorker(7003), w4 = AddWorker(7004);
  Schedule();
  const int64_t boundary = Step(id, 2).stop_after_step();
  ASSERT_GT(boundary, 2);
  const v1::Job job = PassBoundary(id, 3, boundary);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(job.worker_ids_size(), 3);  // max_workers
  EXPECT_TRUE(absl::StrContains(job.plan_history(1).reason(), w3 + " joined"))
      << job.plan_history(1).reason();
  EXPECT_EQ(job.progress().steps_redone(), 0);
  EXPECT_EQ(registry_.Get(w4).value().state(), v1::WORKER_STATE_READY);
}

// The spare a job asked a boundary for is held for it until the boundary:
// a job submitted meanwhile waits, rather than taking it and leaving the
// boundary to stop every stage for a plan on the same workers (whose
// history would still say the spare joined).
TEST_F(JobManagerElasticTest, SpareWorker_HeldForTheBoundaryThatAsksForIt) {
  const auto [id, w1, w2, w3, boundary] = StartGrowing();
  ASSERT_GT(boundary, 2);
  const std::string later = Submit(ElasticSpec(1, 5)).value().id();
  v1::Job waiting = jobs_->Get(later).value();
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_QUEUED) << waiting.reason();
  EXPECT_TRUE(absl::StrContains(waiting.reason(), "held")) << waiting.reason();
  EXPECT_EQ(registry_.Get(w3).value().state(), v1::WORKER_STATE_READY);
  const v1::Job job = PassBoundary(id, 3, boundary);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(std::vector<std::string>(job.worker_ids().begin(), job.worker_ids().end()),
            (std::vector<std::string>{w1, w2, w3}));
  // Once the boundary took it, a new worker is the waiting job's.
  const std::string w4 = AddWorker(7004);
  Schedule();
  waiting = jobs_->Get(later).value();
  ASSERT_EQ(waiting.state(), v1::JOB_STATE_RUNNING) << waiting.reason();
  EXPECT_EQ(waiting.worker_ids(0), w4);
}

// A recovering job waiting for workers (fewer than its minimum) gets the
// spares that come; running jobs do not grow into them meanwhile. Before,
// the first spare grew a running job, the recovering job still had too
// few when the second came, and its queue timeout failed it.
TEST_F(JobManagerElasticTest, RecoveringJobWaitingForWorkers_RunningJobsDoNotGrowIntoSpares) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002), w3 = AddWorker(7003);
  v1::JobSpec a_spec = ElasticSpec(3, 5);
  a_spec.mutable_elastic()->set_min_workers(3);
  const std::string a = Submit(a_spec).value().id();
  const std::string w4 = AddWorker(7004);
  v1::JobSpec b_spec = ElasticSpec(1, 5);
  b_spec.mutable_elastic()->set_max_workers(2);
  const std::string b = Submit(b_spec).value().id();
  ASSERT_EQ(WorkerIdsOf(jobs_->Get(b).value()), std::vector<std::string>{w4});
  ASSERT_NO_FATAL_FAILURE(CheckpointBothThenLose(a, b, {w2, w3}));
  const std::string s1 = AddWorker(7005);
  HeartbeatAllAndSchedule({w1, w4, s1});
  ASSERT_EQ(jobs_->Get(a).value().state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(Step(b, 6).stop_after_step(), 0) << "b asked to grow into a's spare";
  const std::string s2 = AddWorker(7006);
  HeartbeatAllAndSchedule({w1, w4, s1, s2});
  const v1::Job recovered = jobs_->Get(a).value();
  ASSERT_EQ(recovered.state(), v1::JOB_STATE_RUNNING) << recovered.reason();
  EXPECT_EQ(recovered.worker_ids_size(), 3);
}

// Nor does a running job's drain boundary take the spare a recovering job
// counts on: it keeps its own undrained workers (its minimum is met) and
// leaves the spare, and the recovering job starts once another joins.
TEST_F(JobManagerElasticTest, RecoveringJobWaitingForWorkers_ADrainBoundaryLeavesItsSpares) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002), w3 = AddWorker(7003);
  v1::JobSpec a_spec = ElasticSpec(3, 5);
  a_spec.mutable_elastic()->set_min_workers(3);
  const std::string a = Submit(a_spec).value().id();
  const std::string w4 = AddWorker(7004), w5 = AddWorker(7005);
  v1::JobSpec b_spec = ElasticSpec(2, 5);
  b_spec.mutable_elastic()->set_min_workers(1);
  b_spec.mutable_elastic()->set_max_workers(3);
  const std::string b = Submit(b_spec).value().id();
  ASSERT_EQ(WorkerIdsOf(jobs_->Get(b).value()), (std::vector<std::string>{w4, w5}));
  ASSERT_NO_FATAL_FAILURE(CheckpointBothThenLose(a, b, {w2, w3}));
  const std::string s1 = AddWorker(7006);
  HeartbeatAllAndSchedule({w1, w4, w5, s1});
  ASSERT_EQ(jobs_->Get(a).value().state(), v1::JOB_STATE_RECOVERING);
  ASSERT_TRUE(jobs_->Drain(w5).ok());
  const int64_t boundary = Step(b, 6).stop_after_step();
  ASSERT_GT(boundary, 6);
  const v1::Job replanned = PassBoundary(b, 7, boundary);
  ASSERT_EQ(replanned.state(), v1::JOB_STATE_RUNNING) << replanned.reason();
  EXPECT_EQ(WorkerIdsOf(replanned), std::vector<std::string>{w4}) << "took a's spare";
  const std::string s2 = AddWorker(7007);
  HeartbeatAllAndSchedule({w1, w4, w5, s1, s2});
  const v1::Job recovered = jobs_->Get(a).value();
  ASSERT_EQ(recovered.state(), v1::JOB_STATE_RUNNING) << recovered.reason();
  EXPECT_EQ(recovered.worker_ids_size(), 3);
}

// A drain boundary below the job's minimum takes the spare held for it
// first: another spare freed meanwhile (an earlier registration, so first
// in the list) is left for the jobs that wait, not taken besides it.
TEST_F(JobManagerElasticTest, DrainBoundaryBelowItsMinimum_TakesItsHeldSpareFirst) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  v1::JobSpec j_spec = ElasticSpec(2, 5);
  j_spec.mutable_elastic()->set_min_workers(2);
  j_spec.mutable_elastic()->set_max_workers(3);
  const std::string j = Submit(j_spec).value().id();
  const std::string x = AddWorker(7003);
  v1::JobSpec k_spec = ElasticSpec(1, 5);
  k_spec.mutable_elastic()->set_max_workers(1);
  const std::string k = Submit(k_spec).value().id();
  ASSERT_EQ(WorkerIdsOf(jobs_->Get(k).value()), std::vector<std::string>{x});
  v1::JobSpec r_spec = ElasticSpec(4, 5);  // waits: spares grow no running job
  r_spec.mutable_elastic()->set_min_workers(4);
  const std::string r = Submit(r_spec).value().id();
  const std::string h = AddWorker(7004);
  HeartbeatAllAndSchedule({w1, w2, x, h});
  ASSERT_EQ(jobs_->Get(r).value().state(), v1::JOB_STATE_QUEUED);
  for (int step = 1; step <= 3; ++step) Step(j, step);
  ASSERT_TRUE(jobs_->Drain(w2).ok());  // h is held for j's boundary
  ASSERT_TRUE(jobs_->Cancel(k).ok());  // x is spare, ahead of h in the list
  HeartbeatAllAndSchedule({w1, w2, x, h});
  const int64_t boundary = Step(j, 4).stop_after_step();
  ASSERT_GT(boundary, 4);
  const v1::Job replanned = PassBoundary(j, 5, boundary);
  ASSERT_EQ(replanned.state(), v1::JOB_STATE_RUNNING) << replanned.reason();
  EXPECT_EQ(WorkerIdsOf(replanned), (std::vector<std::string>{w1, h}));
}

// An auto layout over 6 workers on a 4-unit model loses one: 5 workers have
// no layout (5 replicas do not divide 4 micro-batches, 5 stages exceed the
// units), so the job goes on with 4 and the fifth is spare. That spare
// cannot grow the job, so no step boundary is asked for: one would re-plan
// on the same 4 workers and then be asked for again, forever.
TEST_F(JobManagerElasticTest, AutoLayoutSpareThatNoLayoutCanUse_NoBoundaryAskedFor) {
  v1::JobSpec spec = AutoLayoutSpec(6, 1);
  spec.mutable_training()->set_micro_batches(4);
  std::vector<std::string> w;
  for (int k = 0; k < 6; ++k) w.push_back(AddWorker(7001 + k));
  const std::string id = Submit(spec).value().id();
  v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  ASSERT_EQ(job.worker_ids_size(), 6);
  for (int64_t s = 1; s <= 5; ++s) StepEveryWorker(id, s, 4);
  CheckpointAll(id, 5);
  ASSERT_EQ(jobs_->Get(id).value().progress().checkpoint_step(), 5);

  registry_.MarkLost(w[5], incarnations_[w[5]], "killed");
  HeartbeatAllAndSchedule({w[0], w[1], w[2], w[3], w[4]});
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  ASSERT_EQ(job.worker_ids_size(), 4);
  const int64_t version = job.plan_version();
  Schedule();  // the spare is offered to the running job
  v1::ReportProgressRequest r;
  r.set_worker_id(job.worker_ids(0));
  r.set_job_id(id);
  r.set_plan_version(version);
  r.set_iteration(5);
  const absl::StatusOr<v1::ReportProgressResponse> response = jobs_->ReportProgress(r);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->stop_after_step(), 0);
  job = jobs_->Get(id).value();
  EXPECT_EQ(job.plan_version(), version);
  EXPECT_EQ(job.plan_history_size(), 2) << job.plan_history(job.plan_history_size() - 1).reason();
}

// A worker too small for any share of the model joins a running job that
// could grow: the boundary's re-plan with it is refused for memory. The job
// goes on on its own workers, nothing redone, and the small worker is not
// offered to it again; registered anew (with more memory) it is.
TEST_F(JobManagerElasticTest, JoiningWorkerTooSmall_JobGoesOnWithoutItAndIsNotAskedAgain) {
  const std::string w1 = AddWorker(7001);
  v1::JobSpec spec = ElasticSpec(1, 5);
  spec.mutable_elastic()->set_max_workers(2);
  const std::string id = Submit(spec).value().id();
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING);
  Step(id, 1);
  v1::RegisterWorkerRequest small;
  small.set_data_address("127.0.0.1:7002");
  small.mutable_device()->set_memory_limit_bytes(4096);
  const v1::RegisterWorkerResponse joined = registry_.Register(small).value();
  const std::string w2 = joined.worker_id();
  incarnations_[w2] = joined.incarnation();
  Schedule();
  const int64_t boundary = Step(id, 2).stop_after_step();
  ASSERT_GT(boundary, 2);
  v1::Job job = PassBoundary(id, 3, boundary);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(job.worker_ids_size(), 1);
  EXPECT_EQ(job.worker_ids(0), w1);
  const std::string last = job.plan_history(job.plan_history_size() - 1).reason();
  EXPECT_TRUE(absl::StrContains(last, "without the workers refused: the plan with " + w2)) << last;
  EXPECT_EQ(job.progress().steps_redone(), 0);
  EXPECT_EQ(job.progress().recoveries(), 0);
  EXPECT_EQ(registry_.Get(w2).value().state(), v1::WORKER_STATE_READY);

  // Not asked again: the next steps bring no boundary.
  Schedule();
  EXPECT_EQ(Step(id, boundary + 1).stop_after_step(), 0);
  const int64_t version = jobs_->Get(id).value().plan_version();

  // The same worker registered anew with room for its share: it joins.
  v1::RegisterWorkerRequest again;
  again.set_data_address("127.0.0.1:7002");
  again.mutable_device()->set_memory_limit_bytes(int64_t{1} << 32);
  const v1::RegisterWorkerResponse anew = registry_.Register(again).value();
  ASSERT_EQ(anew.worker_id(), w2);
  incarnations_[w2] = anew.incarnation();
  Schedule();
  const int64_t next = Step(id, boundary + 2).stop_after_step();
  ASSERT_GT(next, boundary + 2);
  for (int64_t step = boundary + 3; step <= next; ++step) Step(id, step);
  CheckpointAll(id, next);
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_GT(job.plan_version(), version);
  EXPECT_EQ(job.worker_ids_size(), 2);
}

// A recovery takes a spare too small for any share: its plan is refused for
// memory, and the job recovers on the survivor alone (spec.elastic's
// min_workers is 1) instead of failing.
TEST_F(JobManagerElasticTest, RecoverySpareTooSmall_ReplannedOnTheSurvivors) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  for (int step = 1; step <= 5; ++step) Step(id, step);
  CheckpointAll(id, 5);
  v1::RegisterWorkerRequest small;
  small.set_data_address("127.0.0.1:7003");
  small.mutable_device()->set_memory_limit_bytes(4096);
  const std::string w3 = registry_.Register(small).value().worker_id();
  registry_.MarkLost(w2, incarnations_[w2], "killed");
  HeartbeatAllAndSchedule({w1});
  const v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(WorkerIdsOf(job), std::vector<std::string>{w1});
  EXPECT_EQ(job.progress().step(), 5);
  EXPECT_EQ(job.progress().recoveries(), 1);
  const std::string last = job.plan_history(job.plan_history_size() - 1).reason();
  EXPECT_TRUE(absl::StrContains(last, "the plan with " + w3 + " was refused")) << last;
  EXPECT_EQ(registry_.Get(w3).value().state(), v1::WORKER_STATE_READY);
}

// Workers that hold half of ElasticSpec(2, ...)'s model each but not all
// of it (it needs 330816 bytes on one worker, its checkpoint snapshot
// included; 223424 on the busiest of two).
constexpr int64_t kHalfModelMemory = 260000;

// A worker whose job's model does not fit on the others is drained: the
// boundary's re-plan without it is refused for memory. The job recovers
// from the boundary's checkpoint waiting for another worker, without
// planning on the same one again, and goes on once one registers, nothing
// redone.
TEST_F(JobManagerElasticTest, Drain_TheRestCannotHoldTheModel_WaitsForAWorkerNothingRedone) {
  const std::string w1 = AddWorker(7001, kHalfModelMemory), w2 = AddWorker(7002, kHalfModelMemory);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING);
  for (int step = 1; step <= 3; ++step) Step(id, step);
  ASSERT_TRUE(jobs_->Drain(w2).ok());
  const int64_t boundary = Step(id, 4).stop_after_step();
  ASSERT_GT(boundary, 4);
  v1::Job job = PassBoundary(id, 5, boundary);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RECOVERING) << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(), "the plan on " + w1 + " does not fit (worker " + w1 +
                                                  " would need 330816 bytes"))
      << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(), "waiting for more READY workers")) << job.reason();
  // Not planned on w1 alone again, pass after pass.
  int plans = 0;
  JobEvents events;
  events.planned = [&](double, double) { ++plans; };
  jobs_->SetEvents(events);
  for (int pass = 0; pass < 3; ++pass) HeartbeatAllAndSchedule({w1, w2});
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RECOVERING) << job.reason();
  EXPECT_EQ(plans, 0);
  EXPECT_TRUE(absl::StrContains(job.reason(),
                                "waiting for more READY workers (1 ready; 1 more "
                                "READY but drained"))
      << job.reason();
  // A worker joins: the job goes on from the boundary on w1 and it.
  const std::string w3 = AddWorker(7003, kHalfModelMemory);
  HeartbeatAllAndSchedule({w1, w2, w3});
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(WorkerIdsOf(job), (std::vector<std::string>{w1, w3}));
  EXPECT_EQ(job.progress().step(), boundary);
  EXPECT_EQ(job.progress().steps_redone(), 0);
  EXPECT_EQ(AssignmentOf(w1).resume().step(), boundary);
}

// Two of three workers lost, each holding a third of the model: the
// survivor cannot hold it, nor can it with the first replacement (which is
// then not marked unfit: the model needs more workers, not other ones);
// with the second it goes on on all three.
TEST_F(JobManagerElasticTest, TwoWorkersLost_ReplacementsRegisteringOneByOne_TriedTogether) {
  ASSERT_NO_FATAL_FAILURE(ExpectReplacementsOneByOneTriedTogether(ElasticSpec(3, 5)));
}

// As above with elastic.min_workers 2: the survivor alone is below the
// minimum, so a refused plan with the first replacement had no plan on the
// rest to try. The replacement was marked unfit, never offered again, and
// so was the second with the survivor: the job waited out its queue
// timeout with all three READY. Now the refused set is kept together and
// the job waits for another worker, then plans on all three.
TEST_F(JobManagerElasticTest, TwoWorkersLost_BelowMinWorkersWithoutThem_ReplacementsTriedTogether) {
  v1::JobSpec spec = ElasticSpec(3, 5);
  spec.mutable_elastic()->set_min_workers(2);
  ASSERT_NO_FATAL_FAILURE(ExpectReplacementsOneByOneTriedTogether(spec));
}

// As above, but the spare tried first with the survivor is too small for
// any share: kept together with it (the model seemed to need more
// workers), the spare was then tried with the replacement too, refused
// again at the job's max_workers, and both were marked unfit: the
// replacement was never offered again. Refused with a newcomer, the spare
// kept from before is now the one dropped, and the job runs on the others.
TEST_F(JobManagerElasticTest, TooSmallSpareKeptWithTheSurvivor_DroppedOnceANewcomerComes) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002), w3 = AddWorker(7003);
  v1::JobSpec spec = ElasticSpec(3, 5);
  spec.mutable_elastic()->set_min_workers(2);
  const std::string id = Submit(spec).value().id();
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING)
      << jobs_->Get(id).value().reason();
  for (int step = 1; step <= 5; ++step) Step(id, step);
  CheckpointAll(id, 5);
  const std::string tiny = AddWorker(7004, 4096);
  registry_.MarkLost(w2, incarnations_[w2], "killed");
  registry_.MarkLost(w3, incarnations_[w3], "killed");
  HeartbeatAllAndSchedule({w1, tiny});
  v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RECOVERING) << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(), "waiting for more READY workers")) << job.reason();
  ASSERT_EQ(AddWorker(7002), w2);
  HeartbeatAllAndSchedule({w1, w2, tiny});
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(std::vector<std::string>(job.worker_ids().begin(), job.worker_ids().end()),
            (std::vector<std::string>{w1, w2}));
  EXPECT_EQ(job.progress().step(), 5);
}

// The lost workers come back under new ids (new addresses), one by one,
// after a too-small spare with a lower id. The refused spares were retried
// in id order and cut at max_workers, so the tiny one always went in and
// the other replacement out: the job planned [w1, d, tiny], then
// [w1, e, tiny], and so on, every pass, never waiting (so never timing
// out) and never running. The roomiest refused spares are retried first.
TEST_F(JobManagerElasticTest, TooSmallSpareThenTwoNewReplacements_RunsOnTheReplacements) {
  ThreeThirdsJob run;
  ASSERT_NO_FATAL_FAILURE(StartThreeThirdsJob(ElasticSpec(3, 5), &run));
  const std::string tiny = AddWorker(7004, 4096);
  registry_.MarkLost(run.w2, incarnations_[run.w2], "killed");
  registry_.MarkLost(run.w3, incarnations_[run.w3], "killed");
  HeartbeatAllAndSchedule({run.w1, tiny});
  ASSERT_EQ(jobs_->Get(run.id).value().state(), v1::JOB_STATE_RECOVERING);
  const std::string d = AddWorker(7005, kThirdModelMemory);
  HeartbeatAllAndSchedule({run.w1, tiny, d});
  ASSERT_EQ(jobs_->Get(run.id).value().state(), v1::JOB_STATE_RECOVERING);
  const std::string e = AddWorker(7006, kThirdModelMemory);
  for (int pass = 0; pass < 3; ++pass) HeartbeatAllAndSchedule({run.w1, tiny, d, e});
  const v1::Job job = jobs_->Get(run.id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  std::vector<std::string> workers(job.worker_ids().begin(), job.worker_ids().end());
  std::sort(workers.begin(), workers.end());
  std::vector<std::string> want = {run.w1, d, e};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(workers, want);
  EXPECT_EQ(job.progress().step(), 5);
}

// The replacements a recovering job waits for are its own: a job queued
// meanwhile does not take the first to register (the recovering one then
// waited for a third it could never have, until its queue timeout).
TEST_F(JobManagerElasticTest, Recovering_ReplacementsNotTakenByAQueuedJob) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002), w3 = AddWorker(7003);
  v1::JobSpec spec = ElasticSpec(3, 5);
  spec.mutable_elastic()->set_min_workers(3);
  const std::string id = Submit(spec).value().id();
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING);
  for (int step = 1; step <= 5; ++step) Step(id, step);
  CheckpointAll(id, 5);
  const std::string queued = Submit(ElasticSpec(1, 0)).value().id();
  registry_.MarkLost(w2, incarnations_[w2], "killed");
  registry_.MarkLost(w3, incarnations_[w3], "killed");
  HeartbeatAllAndSchedule({w1});
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RECOVERING);
  ASSERT_EQ(AddWorker(7002), w2);
  HeartbeatAllAndSchedule({w1, w2});
  v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RECOVERING) << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(), "waiting for 3 READY workers (2 ready)"))
      << job.reason();
  v1::Job waiting = jobs_->Get(queued).value();
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_QUEUED) << waiting.reason();
  EXPECT_TRUE(absl::StrContains(waiting.reason(), "held for another job")) << waiting.reason();
  ASSERT_EQ(AddWorker(7003), w3);
  HeartbeatAllAndSchedule({w1, w2, w3});
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(job.worker_ids_size(), 3);
  // Spares are anyone's once it runs: the queued job takes the next.
  AddWorker(7004);
  Schedule();
  waiting = jobs_->Get(queued).value();
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_RUNNING) << waiting.reason();
}

// A recovery replaces what it lost but does not grow into spares while
// another job waits for workers (as a running job does not): it took every
// spare up to max_workers, here both that a queued 3-worker job needs.
TEST_F(JobManagerElasticTest, Recovery_WhileAJobIsQueued_TakesOnlyWhatItLost) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  v1::JobSpec a_spec = ElasticSpec(2, 5);
  a_spec.mutable_elastic()->set_max_workers(4);
  const std::string a = Submit(a_spec).value().id();
  ASSERT_EQ(jobs_->Get(a).value().worker_ids_size(), 2);
  for (int step = 1; step <= 5; ++step) Step(a, step);
  CheckpointAll(a, 5);
  v1::JobSpec b_spec = ElasticSpec(3, 5);
  b_spec.mutable_elastic()->set_min_workers(3);
  const std::string b = Submit(b_spec).value().id();
  const std::string s1 = AddWorker(7003), s2 = AddWorker(7004);
  HeartbeatAllAndSchedule({w1, w2, s1, s2});
  ASSERT_EQ(jobs_->Get(b).value().state(), v1::JOB_STATE_QUEUED);
  registry_.MarkLost(w2, incarnations_[w2], "killed");
  HeartbeatAllAndSchedule({w1, s1, s2});
  const v1::Job recovered = jobs_->Get(a).value();
  ASSERT_EQ(recovered.state(), v1::JOB_STATE_RUNNING) << recovered.reason();
  EXPECT_EQ(recovered.worker_ids_size(), 2) << "grew into the queued job's spares";
}

// A queued job that can run on none of the spares does not wait for them:
// a 3-D tensor job (CPU only) queued for CPU workers kept a running GPU
// job from growing into an idle GPU for the queued job's whole timeout.
TEST_F(JobManagerElasticTest, QueuedJobThatCannotRunOnTheSpare_RunningJobGrowsIntoIt) {
  const std::string g1 = AddGpuWorker(7001), g2 = AddGpuWorker(7002);
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_elastic()->set_max_workers(3);
  const std::string id = Submit(spec).value().id();
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING);
  v1::JobSpec cpu_only = SmallJobSpec(1);
  cpu_only.mutable_parallelism()->set_tensor(8);
  cpu_only.mutable_parallelism()->set_tensor_mode("3d");
  cpu_only.mutable_training()->set_batch_size(8);  // p^2 = 4 samples a micro-batch
  const std::string queued = Submit(cpu_only).value().id();
  ASSERT_EQ(jobs_->Get(queued).value().state(), v1::JOB_STATE_QUEUED);
  Step(id, 1);
  const std::string g3 = AddGpuWorker(7003);
  Schedule();
  const int64_t boundary = Step(id, 2).stop_after_step();
  ASSERT_GT(boundary, 2) << "held off the GPU spare by a job that cannot run on it";
  const v1::Job job = PassBoundary(id, 3, boundary);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(SortedWorkerIdsOf(job), (std::vector<std::string>{g1, g2, g3}));
  EXPECT_EQ(jobs_->Get(queued).value().state(), v1::JOB_STATE_QUEUED);
}

// A queued CPU-only job short of CPU workers holds the idle ones it can
// run on, not every spare: a running GPU job grows into the idle GPU
// beside them. Asked whether the queued job could run on any spare, the
// two idle CPUs kept the GPU from it for the queued job's whole timeout.
TEST_F(JobManagerElasticTest, QueuedCpuOnlyJobWithIdleCpus_RunningJobGrowsIntoTheIdleGpu) {
  const std::string g1 = AddGpuWorker(7001), g2 = AddGpuWorker(7002);
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_elastic()->set_max_workers(3);
  const std::string id = Submit(spec).value().id();
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING);
  const std::string queued = Submit(CpuOnlySpec()).value().id();
  ASSERT_EQ(jobs_->Get(queued).value().state(), v1::JOB_STATE_QUEUED);
  Step(id, 1);
  const std::string c3 = AddWorker(7003), c4 = AddWorker(7004), g5 = AddGpuWorker(7005);
  Schedule();
  const int64_t boundary = Step(id, 2).stop_after_step();
  ASSERT_GT(boundary, 2) << "held off the GPU spare by the CPU spares' queued job";
  const v1::Job job = PassBoundary(id, 3, boundary);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(SortedWorkerIdsOf(job), (std::vector<std::string>{g1, g2, g5}));
  ExpectWaitingForCpus(queued, 2);
  EXPECT_EQ(registry_.Get(c3).value().state(), v1::WORKER_STATE_READY);
  EXPECT_EQ(registry_.Get(c4).value().state(), v1::WORKER_STATE_READY);
}

// A drain's boundary past the job's minimum takes a spare no queued job
// can run on: with a CPU-only job queued beside an idle CPU worker, the
// job re-planned one short, off the idle GPU.
TEST_F(JobManagerElasticTest, DrainBoundary_QueuedCpuOnlyJobWithAnIdleCpu_TakesTheIdleGpu) {
  const std::string g1 = AddGpuWorker(7001), g2 = AddGpuWorker(7002), g3 = AddGpuWorker(7003);
  const std::string id = Submit(ElasticSpec(3, 5)).value().id();
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING);
  const std::string queued = Submit(CpuOnlySpec()).value().id();
  const std::string c4 = AddWorker(7004), g5 = AddGpuWorker(7005);
  Schedule();  // at its max_workers (3): no growth
  for (int step = 1; step <= 3; ++step) Step(id, step);
  ASSERT_TRUE(jobs_->Drain(g2).ok());
  const int64_t boundary = Step(id, 4).stop_after_step();
  ASSERT_GT(boundary, 4);
  const v1::Job job = PassBoundary(id, 5, boundary);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(SortedWorkerIdsOf(job), (std::vector<std::string>{g1, g3, g5}));
  ExpectWaitingForCpus(queued, 1);
  EXPECT_EQ(registry_.Get(c4).value().state(), v1::WORKER_STATE_READY);
}

// A recovery while a CPU-only job is queued replaces what it lost and
// grows past its size before the loss onto the GPUs that job cannot run
// on, leaving it the idle CPUs: asked whether the queued job could run on
// any spare, the idle CPUs kept it at its size before the loss.
TEST_F(JobManagerElasticTest, Recovery_WhileACpuOnlyJobIsQueued_GrowsOntoTheSparesItCannotUse) {
  const std::string g1 = AddGpuWorker(7001), g2 = AddGpuWorker(7002);
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_elastic()->set_max_workers(3);
  const std::string id = Submit(spec).value().id();
  for (int step = 1; step <= 5; ++step) Step(id, step);
  CheckpointAll(id, 5);
  const std::string queued = Submit(CpuOnlySpec()).value().id();
  registry_.MarkLost(g2, incarnations_[g2], "killed");
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RECOVERING);
  const std::string g3 = AddGpuWorker(7003), g4 = AddGpuWorker(7004);
  const std::string c5 = AddWorker(7005), c6 = AddWorker(7006);
  HeartbeatAllAndSchedule({g1, g3, g4, c5, c6});
  const v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(SortedWorkerIdsOf(job), (std::vector<std::string>{g1, g3, g4}));
  ExpectWaitingForCpus(queued, 2);
}

// The same with the idle CPUs first by id: the lost worker's place goes to
// a GPU spare, not to a CPU the queued job can run on. Its spares were
// taken in id order: c3 in g2's place, then g5 past its former size, and
// the queued job was left one CPU short though g5 and g6 filled both
// places.
TEST_F(JobManagerElasticTest, Recovery_WhileACpuOnlyJobIsQueued_FillsTheLostPlaceWithAGpu) {
  const std::string g1 = AddGpuWorker(7001), g2 = AddGpuWorker(7002);
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_elastic()->set_max_workers(3);
  const std::string id = Submit(spec).value().id();
  for (int step = 1; step <= 5; ++step) Step(id, step);
  CheckpointAll(id, 5);
  const std::string queued = Submit(CpuOnlySpec()).value().id();
  registry_.MarkLost(g2, incarnations_[g2], "killed");
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RECOVERING);
  const std::string c3 = AddWorker(7003), c4 = AddWorker(7004);
  const std::string g5 = AddGpuWorker(7005), g6 = AddGpuWorker(7006);
  HeartbeatAllAndSchedule({g1, c3, c4, g5, g6});
  const v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(SortedWorkerIdsOf(job), (std::vector<std::string>{g1, g5, g6}));
  ExpectWaitingForCpus(queued, 2);
  EXPECT_EQ(registry_.Get(c3).value().state(), v1::WORKER_STATE_READY);
  EXPECT_EQ(registry_.Get(c4).value().state(), v1::WORKER_STATE_READY);
}

// A drain's boundary below the job's minimum (the spare held for it lost
// since) takes a spare no queued job can run on first: with a CPU-only job
// queued, the idle CPU, first by id, took the place the idle GPU fills.
TEST_F(JobManagerElasticTest, DrainBoundaryBelowItsMinimum_QueuedCpuOnlyJob_TakesTheIdleGpu) {
  const std::string g1 = AddGpuWorker(7001), g2 = AddGpuWorker(7002), g3 = AddGpuWorker(7003);
  v1::JobSpec spec = ElasticSpec(3, 5);
  spec.mutable_elastic()->set_min_workers(3);
  const std::string id = Submit(spec).value().id();
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING);
  const std::string queued = Submit(CpuOnlySpec()).value().id();
  const std::string held = AddGpuWorker(7004);
  for (int step = 1; step <= 3; ++step) Step(id, step);
  ASSERT_TRUE(jobs_->Drain(g2).ok());  // counting on `held`
  registry_.MarkLost(held, incarnations_[held], "killed");
  const std::string c5 = AddWorker(7005), g6 = AddGpuWorker(7006);
  const int64_t boundary = Step(id, 4).stop_after_step();
  ASSERT_GT(boundary, 4);
  const v1::Job job = PassBoundary(id, 5, boundary);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(SortedWorkerIdsOf(job), (std::vector<std::string>{g1, g3, g6}));
  Schedule();  // the queued job counts again
  const v1::Job waiting = jobs_->Get(queued).value();
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(waiting.reason(),
            "waiting for 8 READY CPU workers (1 ready; 1 more READY but drained, taking no job "
            "until restarted; spec.parallelism.tensor_mode 3d runs on the CPU backend only)");
  EXPECT_EQ(registry_.Get(c5).value().state(), v1::WORKER_STATE_READY);
}

// A worker lost from a job whose model the survivor cannot hold: the job
// waits for a worker (a restarted process registering again, here) rather
// than failing at once, and fails after spec.scheduling.queue_timeout
// without one, saying why.
TEST_F(JobManagerElasticTest, WorkerLost_SurvivorCannotHoldTheModel_WaitsForItsRestartOrTimesOut) {
  const std::string w1 = AddWorker(7001, kHalfModelMemory), w2 = AddWorker(7002, kHalfModelMemory);
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_scheduling()->mutable_queue_timeout()->set_seconds(60);
  const std::string id = Submit(spec).value().id();
  for (int step = 1; step <= 5; ++step) Step(id, step);
  CheckpointAll(id, 5);
  registry_.MarkLost(w2, incarnations_[w2], "killed");
  HeartbeatAllAndSchedule({w1});
  v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RECOVERING) << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(), "the plan on " + w1 + " does not fit"))
      << job.reason();
  HeartbeatAllAndSchedule({w1});
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RECOVERING);
  // w2's process restarts: a new incarnation, planned with w1.
  ASSERT_EQ(AddWorker(7002, kHalfModelMemory), w2);
  HeartbeatAllAndSchedule({w1, w2});
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(job.worker_ids_size(), 2);
  EXPECT_EQ(job.progress().step(), 5);

  // Lost again, and nothing joins within the queue timeout: FAILED.
  registry_.MarkLost(w2, incarnations_[w2], "killed");
  HeartbeatAllAndSchedule({w1});
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RECOVERING);
  clock_.Advance(absl::Seconds(61));
  HeartbeatAllAndSchedule({w1});
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_FAILED) << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(),
                                "could not recover within "
                                "spec.scheduling.queue_timeout: the plan on " +
                                    w1 + " does not fit"))
      << job.reason();
}

// Waits are judged on the elapsed clock (monotonic in the coordinator): a
// step of the wall clock forward fails no waiting job, and a step back
// hides no survivor's heartbeat (its time is then before the loss's).
TEST_F(JobManagerElasticTest, WallClockSteps_NeitherFailWaitingJobsNorHideSurvivors) {
  separate_elapsed_clock_ = true;
  Reset(/*with_state=*/false);
  const std::string w1 = AddWorker(7001, kHalfModelMemory), w2 = AddWorker(7002, kHalfModelMemory);
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_scheduling()->mutable_queue_timeout()->set_seconds(60);
  const std::string id = Submit(spec).value().id();
  v1::JobSpec wide = ElasticSpec(3, 5);  // waits: two workers registered
  wide.mutable_scheduling()->mutable_queue_timeout()->set_seconds(60);
  const std::string queued = Submit(wide).value().id();
  for (int step = 1; step <= 5; ++step) Step(id, step);
  CheckpointAll(id, 5);
  registry_.MarkLost(w2, incarnations_[w2], "killed");
  HeartbeatAllAndSchedule({w1});
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RECOVERING);

  clock_.Advance(absl::Hours(2));
  elapsed_clock_.Advance(absl::Seconds(1));
  HeartbeatAllAndSchedule({w1});
  v1::Job job = jobs_->Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_RECOVERING) << job.reason();
  job = jobs_->Get(queued).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED) << job.reason();

  // Back by three hours: w1's heartbeats are dated before the loss now.
  clock_.Advance(absl::Hours(-3));
  ASSERT_EQ(AddWorker(7002, kHalfModelMemory), w2);  // w2 restarted
  HeartbeatAllAndSchedule({w1, w2});
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(job.progress().step(), 5);

  // The queued job's timeout still counts, on the elapsed clock.
  elapsed_clock_.Advance(absl::Seconds(60));
  Schedule();
  job = jobs_->Get(queued).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED) << job.reason();
}

TEST_F(JobManagerElasticTest, Restore_RunningJobResumesOnceItsWorkersRegisterAgain) {
  Reset(/*with_state=*/true);
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  const std::string ended = Submit(ElasticSpec(1, 0)).value().id();
  ASSERT_TRUE(jobs_->Cancel(ended).ok());
  for (int step = 1; step <= 6; ++step) {
    Step(id, step);
    if (step == 5) CheckpointAll(id, 5);
  }
  jobs_->FlushIo();
  // A new coordinator on the same state (the registry as it restores: LOST).
  Reset(/*with_state=*/true);
  ASSERT_TRUE(jobs_->Restore().ok());
  EXPECT_EQ(jobs_->Get(ended).value().state(), v1::JOB_STATE_CANCELLED);
  v1::Job job = jobs_->Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_GE(job.progress().loss_history_size(), 5);
  registry_.MarkLost(w1, incarnations_[w1], "coordinator restarted");
  registry_.MarkLost(w2, incarnations_[w2], "coordinator restarted");
  Schedule();
  EXPECT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RECOVERING);  // within the grace
  clock_.Advance(absl::Milliseconds(10));
  AddWorker(7001);
  AddWorker(7002);  // both back, new incarnations
  Schedule();
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(job.plan_version(), 2);
  EXPECT_EQ(job.progress().step(), 5);
  EXPECT_EQ(AssignmentOf(w1).resume().step(), 5);
}

// A survivor that registers again after a coordinator restart is JOINING
// while its registration is saved: the job waits for it rather than resume
// on the workers already READY (and take it back at a boundary after a
// plan without it, as a job on a slow store did after every restart).
TEST_F(JobManagerElasticTest, Restore_SurvivorWhoseRegistrationIsBeingSaved_WaitedFor) {
  Reset(/*with_state=*/true);
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  StepCheckpointingEvery5(id, 6);
  RestartCoordinator({w1, w2});
  clock_.Advance(absl::Milliseconds(10));
  AddWorker(7001);
  absl::Notification saving, release;
  on_persist_ = [&](const v1::Worker& worker) {
    if (worker.id() == w2) {
      saving.Notify();
      release.WaitForNotification();
    }
    return absl::OkStatus();
  };
  std::thread registering([&] { AddWorker(7002); });
  saving.WaitForNotification();
  ASSERT_EQ(registry_.Get(w2).value().state(), v1::WORKER_STATE_JOINING);
  Schedule();
  v1::Job job = jobs_->Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_TRUE(absl::StrContains(job.reason(), "waiting to hear from the other workers"))
      << job.reason();
  release.Notify();
  registering.join();
  on_persist_ = nullptr;
  Schedule();
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(WorkerIdsOf(job), (std::vector<std::string>{w1, w2}));
  EXPECT_EQ(job.plan_history_size(), 2);
}

// A recovered job, even across a coordinator restart, trains on the tokens
// it began with: its next plan's assignments carry its data digest (each
// stage checks its own before the first step), and a stage of that plan
// that reports other tokens fails it.
TEST_F(JobManagerElasticTest, DataDigest_KeptAcrossARestartAndCheckedByTheNextPlan) {
  Reset(/*with_state=*/true);
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  const std::string digest(64, 'c');
  auto ready = [&](const std::string& worker, const std::string& data) {
    v1::ReportProgressRequest r;
    r.set_worker_id(worker);
    r.set_job_id(id);
    r.set_plan_version(jobs_->Get(id).value().plan_version());
    r.set_ready(true);
    r.set_data_sha256(data);
    ASSERT_TRUE(jobs_->ReportProgress(r).ok());
  };
  ready(w1, digest);
  ready(w2, digest);
  for (int step = 1; step <= 5; ++step) Step(id, step);
  CheckpointAll(id, 5);
  RestartCoordinator({w1, w2});
  EXPECT_EQ(jobs_->Get(id).value().data_sha256(), digest);
  clock_.Advance(absl::Milliseconds(10));
  AddWorker(7001);
  AddWorker(7002);
  Schedule();
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(AssignmentOf(w1).data_sha256(), digest);
  EXPECT_EQ(AssignmentOf(w2).data_sha256(), digest);
  ready(w1, digest);
  EXPECT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING);
  ready(w2, std::string(64, 'd'));
  jobs_->FlushIo();  // the failure saved: shown RUNNING ("ending: ...") until then
  const v1::Job job = jobs_->Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(job.reason(), "read other tokens")) << job.reason();
}

// A restarted coordinator whose ids start again where an earlier one's did
// (no epoch here; in production a clock-made epoch that repeats) gives a
// new job an id no restored job has, rather than replacing that job.
TEST_F(JobManagerElasticTest, Restore_NewJobsIdsSkipTheRestoredOnes) {
  Reset(/*with_state=*/true);
  AddWorker(7001);
  const std::string restored = Submit(ElasticSpec(1, 5)).value().id();
  jobs_->FlushIo();
  Reset(/*with_state=*/true);
  ASSERT_TRUE(jobs_->Restore().ok());
  v1::JobSpec other = ElasticSpec(1, 5);
  other.mutable_checkpoint()->set_dir("other-checkpoints");
  const std::string added = Submit(other).value().id();
  EXPECT_NE(added, restored);
  EXPECT_EQ(jobs_->List().size(), 2u);
  EXPECT_EQ(jobs_->Get(restored).value().spec().checkpoint().dir(),
            "checkpoints/" + restored);  // the restored job, not replaced
}

// The stored job of `id`, edited by `edit` and saved back, as a store
// written by another version (or by hand) could hold it.
void EditStoredJob(CoordinatorState& state, const std::string& id,
                   const std::function<void(store::StoredJob&)>& edit) {
  std::vector<store::StoredJob> stored = state.LoadJobs().value();
  for (store::StoredJob& s : stored) {
    if (s.job().id() != id) continue;
    edit(s);
    ASSERT_TRUE(state.SaveJob(s).ok());
    return;
  }
  FAIL() << "no stored job " << id;
}

// A stored plan whose unit ranges run past the job's model (ElasticSpec's
// one layer: 4 units) would make the owners of the weights CHECK-fail on
// restore, and the coordinator could never start again: the job fails
// instead, saying why, and the others restore.
TEST_F(JobManagerElasticTest, Restore_StoredPlanPastTheModel_JobFailsTheCoordinatorStarts) {
  Reset(/*with_state=*/true);
  AddWorker(7001);
  AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  Step(id, 1);
  jobs_->FlushIo();
  EditStoredJob(*state_, id, [](store::StoredJob& s) {
    s.mutable_plan()->mutable_stages(1)->mutable_backward()->set_end(9);
  });
  Reset(/*with_state=*/true);
  ASSERT_TRUE(jobs_->Restore().ok());
  jobs_->FlushIo();  // the failure saved: shown RUNNING ("ending: ...") until then
  const v1::Job job = jobs_->Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(job.reason(),
                                "the stored plan does not fit the model: stage 1 has units [2, 9) "
                                "of a model of 4"))
      << job.reason();
}

// A spec this version no longer accepts: the job fails, and its plan (here
// of more units than the default model that stands in for the spec's) is
// not read for weight owners.
TEST_F(JobManagerElasticTest, Restore_SpecNoLongerValid_JobFailsItsPlanIsNotRead) {
  Reset(/*with_state=*/true);
  AddWorker(7001);
  AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  jobs_->FlushIo();
  EditStoredJob(*state_, id, [](store::StoredJob& s) {
    s.mutable_job()->mutable_spec()->mutable_model()->set_n_layer(-1);
    s.mutable_plan()->mutable_stages(1)->mutable_backward()->set_end(40);
  });
  // Saved FAILED by the first restart: the second finds it ended, and does
  // not count (nor fail) it again.
  EXPECT_EQ(EndedOverTwoRestarts(id, "the spec is no longer valid"), 1);
}

// A stored profile of more units than the model: a re-plan would split
// the model by it and ask for a unit past the model's end (a CHECK that
// stopped the coordinator as the first worker came back, after every
// restart). The job fails instead, saying why.
TEST_F(JobManagerElasticTest, Restore_StoredProfileNotTheModels_JobFailsBeforeAnyPlan) {
  const std::string id = CheckpointedJobInStore();
  EditStoredJob(*state_, id, [](store::StoredJob& s) {
    ModelProfile profile = ParseProfileJson(s.profile_json()).value();
    ASSERT_EQ(profile.units.size(), 4u);
    for (const char* name : {"extra_0", "extra_1"}) {  // unit names are distinct
      profile.units.push_back(profile.units.back());
      profile.units.back().name = name;
    }
    s.set_profile_json(ProfileToJson(profile));
  });
  Reset(/*with_state=*/true);
  ASSERT_TRUE(jobs_->Restore().ok());
  jobs_->FlushIo();  // the failure saved: shown RUNNING ("ending: ...") until then
  const v1::Job job = jobs_->Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(
      absl::StrContains(job.reason(),
                        "the stored profile does not fit the model: the profile has 6 units, the "
                        "model 4"))
      << job.reason();
  clock_.Advance(absl::Milliseconds(10));
  AddWorker(7001);  // its workers back: nothing to plan
  AddWorker(7002);
  Schedule();
  EXPECT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_FAILED);
}

// The stored profile of job `id` in `state`; fails the test when none.
std::string StoredProfileJson(CoordinatorState& state, const std::string& id) {
  const std::vector<store::StoredJob> stored = state.LoadJobs().value();
  for (const store::StoredJob& s : stored) {
    if (s.job().id() == id) return s.profile_json();
  }
  ADD_FAILURE() << "no stored job " << id;
  return "";
}

// A running job is saved once a second while steps arrive, but its profile
// does not change after the first plan: its JSON (for a 256-layer model
// about 200 KB and 3 ms, under the jobs lock) is built once, when the
// profile is set or restored, and every save stores that same compact text.
TEST_F(JobManagerElasticTest, ProgressSaves_ProfileSerialisedOnceNotAtEverySave) {
  Reset(/*with_state=*/true);
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(jobs_->ProfileJsonsBuiltForTesting(), 1);
  // Saves of the job's record (on io_); shared, as the destructors save too.
  auto saves = std::make_shared<std::atomic<int>>(0);
  observing_.on_commit = [saves, key = "jobs/" + id](const std::vector<StoreWrite>& writes) {
    for (const StoreWrite& w : writes) {
      if (w.kind == StoreWrite::Kind::kPut && w.key == key) ++*saves;
    }
  };
  for (int step = 1; step <= 20; ++step) {
    clock_.Advance(absl::Seconds(1));
    Heartbeat(w1);
    Heartbeat(w2);
    Step(id, step);
    if (step % 5 == 0) CheckpointAll(id, step);
    jobs_->FlushIo();
  }
  EXPECT_GE(saves->load(), 20);
  EXPECT_EQ(jobs_->ProfileJsonsBuiltForTesting(), 1);
  const std::string json = StoredProfileJson(*state_, id);
  ASSERT_FALSE(json.empty());
  EXPECT_EQ(json, ProfileToJson(ParseProfileJson(json).value(), /*indent=*/-1));

  // A restart builds it once from the stored one; the job resumes once its
  // workers register again, and that plan's save stores the same text.
  Reset(/*with_state=*/true);
  ASSERT_TRUE(jobs_->Restore().ok());
  jobs_->FlushIo();
  const int saves_before_resumed = saves->load();
  registry_.MarkLost(w1, incarnations_[w1], "coordinator restarted");
  registry_.MarkLost(w2, incarnations_[w2], "coordinator restarted");
  clock_.Advance(absl::Milliseconds(10));
  AddWorker(7001);
  AddWorker(7002);
  Schedule();
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING);
  jobs_->FlushIo();
  EXPECT_EQ(jobs_->ProfileJsonsBuiltForTesting(), 1);
  EXPECT_GT(saves->load(), saves_before_resumed);
  EXPECT_EQ(StoredProfileJson(*state_, id), json);
}

// An ended job's stored plan whose degrees multiply past an int (65536 x
// 65536 wrapped to 0, and /metrics, which reads the newest job's plan
// without a token, divided by it): the plan is dropped, the job stays
// ended. A running job's counters near INT64_MAX, which later grow: it
// fails.
TEST_F(JobManagerElasticTest, Restore_StoredPlanDegreesOrCountersOutOfRange) {
  Reset(/*with_state=*/true);
  AddWorker(7001);
  AddWorker(7002);
  const std::string ended = Submit(ElasticSpec(2, 5)).value().id();
  Step(ended, 1);
  ASSERT_TRUE(jobs_->Cancel(ended).ok());
  const std::string running = Submit(ElasticSpec(2, 5)).value().id();
  for (int step = 1; step <= 5; ++step) Step(running, step);
  CheckpointAll(running, 5);
  jobs_->FlushIo();
  EditStoredJob(*state_, ended, [](store::StoredJob& s) {
    s.mutable_plan()->set_data_parallel(65536);
    s.mutable_plan()->set_tensor_parallel(65536);
  });
  EditStoredJob(*state_, running, [](store::StoredJob& s) {
    s.mutable_job()->mutable_progress()->set_recoveries(INT32_MAX);
  });
  Reset(/*with_state=*/true);
  ASSERT_TRUE(jobs_->Restore().ok());
  jobs_->FlushIo();  // the failure saved: shown RUNNING ("ending: ...") until then
  EXPECT_EQ(jobs_->Get(ended).value().state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(jobs_->GetPlan(ended).status().code(), absl::StatusCode::kFailedPrecondition);
  const v1::Job job = jobs_->Get(running).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(job.reason(),
                                "the stored progress is out of range: progress.recoveries "
                                "2147483647 outside [0, 1073741824]"))
      << job.reason();
}

// A stored checkpoint naming another job's step directory (a damaged or
// hostile store) is not taken: the job fails saying why, and expiring it
// cannot delete the other job's files.
TEST_F(JobManagerElasticTest, Restore_StoredCheckpointOfAnotherDirectory_JobFails) {
  const std::string id = CheckpointedJobInStore();
  EditStoredJob(*state_, id, [](store::StoredJob& s) {
    s.mutable_checkpoints(0)->set_dir("checkpoints/job-other/step-00000005");
  });
  Reset(/*with_state=*/true);
  ASSERT_TRUE(jobs_->Restore().ok());
  jobs_->FlushIo();  // the failure saved: shown RUNNING ("ending: ...") until then
  const v1::Job job = jobs_->Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(job.reason(),
                                "the stored checkpoints do not fit the job: checkpoint of step 5 "
                                "names directory \"checkpoints/job-other/step-00000005\""))
      << job.reason();
}

// A coordinator stopped between the save that expired a checkpoint and the
// removal of its directory left that directory on disk, named by nothing
// but the stored job's `expiring`: the next coordinator removes it, and
// its next save stops listing it. Not when another job's checkpoint
// directory overlaps (it may have taken over and written the same steps).
TEST_F(JobManagerElasticTest, Restore_ExpiredCheckpointLeftByAStop_RemovedUnlessShared) {
  for (const bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "shared" : "own");
    const std::string id = CheckpointedJobInStore();
    const std::string step_dir =
        jobs_->Get(id).value().spec().checkpoint().dir() + "/step-00000005";
    WriteUnitFiles(step_dir);
    const std::string path = absl::StrCat(OutputDir(), "/", step_dir);
    ASSERT_TRUE(std::filesystem::exists(path));
    // The stored state the stop left: step 5 expired, its removal not done.
    EditStoredJob(*state_, id, [](store::StoredJob& s) {
      *s.add_expiring() = s.checkpoints(0);
      s.clear_checkpoints();
    });
    std::string other;
    if (shared) {
      v1::JobSpec spec = ElasticSpec(2, 5);
      spec.mutable_checkpoint()->set_dir("other-checkpoints");
      other = Submit(spec).value().id();
      jobs_->FlushIo();
      EditStoredJob(*state_, other, [&step_dir](store::StoredJob& s) {
        s.mutable_job()->mutable_spec()->mutable_checkpoint()->set_dir(
            step_dir.substr(0, step_dir.rfind('/')));
      });
    }
    Reset(/*with_state=*/true);
    ASSERT_TRUE(jobs_->Restore().ok());
    jobs_->FlushIo();  // the removal, which then asks for a save
    jobs_->FlushIo();  // that save
    EXPECT_EQ(std::filesystem::exists(path), shared);
    const std::vector<store::StoredJob> stored = state_->LoadJobs().value();
    int found = 0;
    for (const store::StoredJob& s : stored) {
      if (s.job().id() != id) continue;
      ++found;
      EXPECT_EQ(s.expiring_size(), 0);
    }
    EXPECT_EQ(found, 1);
    // Free the directories for the next round.
    for (const v1::Job& job : jobs_->List()) (void)jobs_->Cancel(job.id());
    jobs_->FlushIo();
    std::filesystem::remove_all(
        absl::StrCat(OutputDir(), "/", step_dir.substr(0, step_dir.rfind('/'))));
  }
}

// An expired checkpoint whose removal fails stays listed in the stored
// job's `expiring`, to be tried again: forgotten, it stayed on disk for
// good, manifest and all. (The failure here: its step directory is a
// symbolic link, which the removal never follows.)
TEST_F(JobManagerElasticTest, Restore_ExpiredCheckpointNotRemovable_StaysListed) {
  const std::string id = CheckpointedJobInStore();
  const std::string step_dir = jobs_->Get(id).value().spec().checkpoint().dir() + "/step-00000005";
  const std::string elsewhere = absl::StrCat(OutputDir(), "/elsewhere");
  std::filesystem::create_directories(elsewhere);
  std::filesystem::remove_all(absl::StrCat(OutputDir(), "/", step_dir));
  std::filesystem::create_directories(
      std::filesystem::path(absl::StrCat(OutputDir(), "/", step_dir)).parent_path());
  std::filesystem::create_directory_symlink(elsewhere, absl::StrCat(OutputDir(), "/", step_dir));
  EditStoredJob(*state_, id, [](store::StoredJob& s) {
    *s.add_expiring() = s.checkpoints(0);
    s.clear_checkpoints();
  });
  Reset(/*with_state=*/true);
  ASSERT_TRUE(jobs_->Restore().ok());
  jobs_->FlushIo();
  jobs_->FlushIo();
  int found = 0;
  const std::vector<store::StoredJob> stored = state_->LoadJobs().value();
  for (const store::StoredJob& s : stored) {
    if (s.job().id() != id) continue;
    ++found;
    ASSERT_EQ(s.expiring_size(), 1);
    EXPECT_EQ(s.expiring(0).dir(), step_dir);
  }
  EXPECT_EQ(found, 1);
  EXPECT_TRUE(std::filesystem::is_symlink(absl::StrCat(OutputDir(), "/", step_dir)));
}

// While the manifest's write keeps failing (a full or read-only volume),
// its retry every 5 s logs the first failure, then one a minute saying how
// many failed, and the write that succeeds says so: a WARNING at each
// retry, for every manifest held, buried the cause.
TEST_F(JobManagerElasticTest, ManifestWriteFailing_WarningOnceAMinuteThenWrittenSaysSo) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_checkpoint()->set_dir("manifest-failing");  // job ids repeat across tests
  const std::string id = Submit(spec).value().id();
  for (int step = 1; step <= 5; ++step) Step(id, step);
  const std::string manifest =
      absl::StrCat(OutputDir(), "/manifest-failing/step-00000005/", kCheckpointManifestName);
  std::filesystem::create_directories(manifest + "/in-the-way");
  WriteReportedUnitFiles(OutputDir() + "/manifest-failing/step-00000005");  // retries check them
  ::testing::internal::CaptureStderr();
  CheckpointAll(id, 5);
  jobs_->FlushIo();
  for (int second = 1; second <= 120; ++second) {  // 24 retries, 5 s apart
    clock_.Advance(absl::Seconds(1) - absl::Milliseconds(10));
    HeartbeatAllAndSchedule({w1, w2});
    jobs_->FlushIo();
  }
  std::filesystem::remove_all(manifest);
  clock_.Advance(absl::Seconds(5) - absl::Milliseconds(10));
  HeartbeatAllAndSchedule({w1, w2});
  jobs_->FlushIo();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(std::filesystem::is_regular_file(manifest));
  EXPECT_EQ(LinesWith(log, "; trying again every 5 s (logged once a minute"), 3) << log;
  EXPECT_EQ(LinesWith(log, "(13 writes of this manifest in a row failed over 1m)"), 1) << log;
  EXPECT_EQ(LinesWith(log, "(25 writes of this manifest in a row failed over 2m)"), 1) << log;
  EXPECT_EQ(LinesWith(log, "job " + id +
                               ": the manifest of checkpoint manifest-failing/step-00000005 is "
                               "written, after 25 failed writes over 2m5s"),
            1)
      << log;
}

// A job whose expired checkpoint cannot be removed: ElasticSpec(2, 5) with
// keep 1 in a directory of its own, on two new workers, checkpointed at
// step 5 (its unit files written too). Then step 5's directory is moved
// away and a link left in its place, which the removal never follows (it
// fails as on a volume's error: ESTALE, EIO), and step 10 completes: step 5
// expires, the save succeeds, and its removal fails.
class ExpiredRemovalTest : public JobManagerElasticTest {
 protected:
  void StartWithStep5Unremovable(const std::string& name, int max_ended_jobs = -1) {
    Reset(/*with_state=*/true, max_ended_jobs);
    AddWorker(7001);
    AddWorker(7002);
    v1::JobSpec spec = ElasticSpec(2, 5);
    spec.mutable_checkpoint()->set_keep(1);
    spec.mutable_checkpoint()->set_dir("checkpoints/" + name);
    id_ = Submit(spec).value().id();
    for (int step = 1; step <= 5; ++step) Step(id_, step);
    CheckpointAll(id_, 5);
    jobs_->FlushIo();
    step5_ = "checkpoints/" + name + "/step-00000005";
    ASSERT_NO_FATAL_FAILURE(WriteUnitFiles(step5_));
    path_ = absl::StrCat(OutputDir(), "/", step5_);
    moved_ = absl::StrCat(OutputDir(), "/moved-", name);
    std::filesystem::rename(path_, moved_);
    std::filesystem::create_directory_symlink(moved_, path_);
    for (int step = 6; step <= 10; ++step) Step(id_, step);
    CheckpointAll(id_, 10);
    jobs_->FlushIo();
    ASSERT_TRUE(std::filesystem::is_symlink(path_));
    ASSERT_EQ(StoredExpiring(), std::vector<std::string>{step5_});
  }
  // The volume works again: step 5's directory is back, manifest and all.
  void VolumeBack() {
    std::filesystem::remove(path_);
    std::filesystem::rename(moved_, path_);
    ASSERT_TRUE(std::filesystem::exists(absl::StrCat(path_, "/", kCheckpointManifestName)));
  }
  bool Step5OnDisk() { return std::filesystem::exists(std::filesystem::symlink_status(path_)); }
  // The directories the job's stored record lists as expiring.
  std::vector<std::string> StoredExpiring() {
    std::vector<std::string> dirs;
    const std::vector<store::StoredJob> stored = state_->LoadJobs().value();
    for (const store::StoredJob& s : stored) {
      if (s.job().id() != id_) continue;
      for (const v1::ResumeFrom& e : s.expiring()) dirs.push_back(e.dir());
    }
    return dirs;
  }
  // A scheduling pass `after` from now, and the file and store work it
  // queued (a removal, then the save that follows it).
  void PassAfter(absl::Duration after) {
    clock_.Advance(after);
    Schedule();
    jobs_->FlushIo();
    jobs_->FlushIo();
  }

  std::string id_, step5_, path_, moved_;
};

// An ended job saves no more, and its failed removal was tried again only
// after a save: its expired checkpoint stayed on disk for good, manifest
// and all (newer than the job's complete ones if dropped or forgotten, what
// `init.from` and `checkpoint export` then take). The scheduling pass tries
// it again on its backoff, ended jobs included, and saves the job without it.
TEST_F(ExpiredRemovalTest, EndedJob_RemovalFailed_RemovedByALaterPassOnceTheVolumeWorks) {
  ASSERT_NO_FATAL_FAILURE(StartWithStep5Unremovable("ended-retry"));
  ASSERT_TRUE(jobs_->Cancel(id_).ok());
  jobs_->FlushIo();
  ASSERT_NO_FATAL_FAILURE(VolumeBack());
  PassAfter(absl::Seconds(30));  // before its backoff (a minute): not tried yet
  EXPECT_TRUE(Step5OnDisk());
  PassAfter(absl::Seconds(31));
  EXPECT_FALSE(Step5OnDisk()) << "left for good";
  EXPECT_TRUE(StoredExpiring().empty());
  EXPECT_EQ(jobs_->Get(id_).value().state(), v1::JOB_STATE_CANCELLED);
}

// A running job saves its progress every second, and each save tried the
// failed removal again (a WARNING each, on the thread every save and
// cancel waits behind). Its saves no longer do; the pass does, after a
// minute.
TEST_F(ExpiredRemovalTest, RunningJob_RemovalFailed_NotTriedAgainAtEachSave) {
  ASSERT_NO_FATAL_FAILURE(StartWithStep5Unremovable("running-retry"));
  ASSERT_NO_FATAL_FAILURE(VolumeBack());
  for (int step = 11; step <= 15; ++step) {
    clock_.Advance(absl::Seconds(2));  // a progress save each
    Step(id_, step);
    jobs_->FlushIo();
  }
  EXPECT_EQ(StoredExpiring(), std::vector<std::string>{step5_});
  EXPECT_TRUE(Step5OnDisk()) << "tried again at a save";
  PassAfter(absl::Seconds(51));
  EXPECT_FALSE(Step5OnDisk());
  EXPECT_TRUE(StoredExpiring().empty());
  EXPECT_EQ(jobs_->Get(id_).value().state(), v1::JOB_STATE_RUNNING);
}

// A lasting failure (a link, files the coordinator may not remove) is
// tried 1, 5, then every 15 minutes apart, not at every pass, and given up
// after 3 tries over an hour with a WARNING naming it. The ended job, held
// (max_ended_jobs 0) while the removal waits, is then pruned.
TEST_F(ExpiredRemovalTest, EndedJob_LastingFailure_TriedOnItsBackoffThenGivenUp) {
  ASSERT_NO_FATAL_FAILURE(StartWithStep5Unremovable("lasting", /*max_ended_jobs=*/0));
  ASSERT_TRUE(jobs_->Cancel(id_).ok());
  jobs_->FlushIo();
  ::testing::internal::CaptureStderr();
  for (int minute = 1; minute <= 65; ++minute) PassAfter(absl::Minutes(1));
  ASSERT_TRUE(jobs_->Get(id_).ok()) << "pruned while its removal was tried";
  PassAfter(absl::Minutes(1));  // 66 minutes after the first failure: given up
  PassAfter(absl::Minutes(1));
  const std::string log = ::testing::internal::GetCapturedStderr();
  const std::string retried = "expired checkpoint " + step5_ + " not removed (tried again in ";
  EXPECT_EQ(LinesWith(log, retried + "5m)"), 1) << log;
  EXPECT_EQ(LinesWith(log, retried + "15m)"), 4) << log;  // at 6, 21, 36 and 51 minutes
  EXPECT_EQ(LinesWith(log, "expired checkpoint " + step5_ +
                               " not removed after 7 tries over "
                               "1h6m; given up (remove it by hand)"),
            1)
      << log;
  EXPECT_EQ(LinesWith(log, "not removed"), 6) << log;
  EXPECT_EQ(LinesWith(log, "pruned with"), 0) << log;
  EXPECT_EQ(jobs_->Get(id_).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(std::filesystem::is_symlink(path_));
}

// A job pruned with expired checkpoints still listed (here: their removal
// fails on a lasting error, and the retention, 24 hours, ends before the
// removal's backoff gives up) takes the list with it: a WARNING names the
// directories left to remove by hand.
TEST_F(ExpiredRemovalTest, PrunedWithExpiredCheckpointsListed_WarningNamesThem) {
  ASSERT_NO_FATAL_FAILURE(StartWithStep5Unremovable("pruned-listed"));
  ASSERT_TRUE(jobs_->Cancel(id_).ok());
  jobs_->FlushIo();
  PassAfter(kLateSweepWait + absl::Seconds(1));  // the end's sweeps are done
  ASSERT_TRUE(jobs_->Get(id_).ok());
  ::testing::internal::CaptureStderr();
  PassAfter(absl::Hours(25));  // past ended_job_retention
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(jobs_->Get(id_).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(LinesWith(log, "job " + id_ + " pruned with 1 expired checkpoint(s) not removed"), 1)
      << log;
  EXPECT_EQ(LinesWith(log,
                      "given up (remove them by hand, under --output-dir): checkpoints/"
                      "pruned-listed/step-00000005"),
            1)
      << log;
}

// keep x units x (file, size, checksum) must fit the job's stored record:
// a spec that would outgrow it is refused at submit, saying how many fit.
TEST_F(JobManagerElasticTest, CheckpointsThatWouldOutgrowTheStoredRecord_Refused) {
  AddWorker(7001);
  v1::JobSpec spec = ElasticSpec(1, 5);
  spec.mutable_model()->set_n_layer(256);
  spec.mutable_checkpoint()->set_keep(40);
  const absl::Status refused = jobs_->Submit(spec).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(),
                                "spec.checkpoint.keep: 40 checkpoints of this "
                                "514-unit model take up to "))
      << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "; keep at most ")) << refused;
  EXPECT_TRUE(jobs_->List().empty());
}

// A job that the restart fails has its checkpoint directory swept as a job
// that ends while the coordinator runs: the step directories without a
// manifest go (here one the killed coordinator was writing), complete
// checkpoints stay. Another job's files are not touched.
TEST_F(JobManagerElasticTest, Restore_JobFailedByTheRestart_ItsIncompleteCheckpointsRemoved) {
  const std::string id = CheckpointedJobInStore();
  // The tests share TEST_TMPDIR and job ids: a step no other test writes.
  const std::string dir = absl::StrCat(OutputDir(), "/checkpoints/", id);
  std::filesystem::remove_all(dir + "/step-00000035");
  std::filesystem::create_directories(dir + "/step-00000035");
  std::ofstream(dir + "/step-00000035/unit-0000.safetensors") << "half a checkpoint";
  EditStoredJob(*state_, id, [](store::StoredJob& s) {
    s.mutable_job()->mutable_progress()->set_recoveries(INT32_MAX);
  });
  Reset(/*with_state=*/true);
  ASSERT_TRUE(jobs_->Restore().ok());
  jobs_->FlushIo();  // the failure saved (shown RUNNING until then), the sweep done
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_FAILED);
  EXPECT_FALSE(std::filesystem::exists(dir + "/step-00000035"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/step-00000005/manifest.json"));
}

// Two jobs restored sharing a checkpoint directory (stored before sharing
// was refused): the first to end leaves the step directories it does not
// know alone, since they may be the other's checkpoint being written; the
// last to end sweeps them.
TEST_F(JobManagerElasticTest, Restore_SharedCheckpointDir_SweptOnlyByTheLastToEnd) {
  Reset(/*with_state=*/true);
  const std::string first = Submit(ElasticSpec(1, 5)).value().id();  // no workers: queued
  v1::JobSpec other_spec = ElasticSpec(1, 5);
  other_spec.mutable_checkpoint()->set_dir("checkpoints/shared-by-two");
  const std::string other = Submit(other_spec).value().id();
  jobs_->FlushIo();
  const std::string first_dir = "checkpoints/" + first;
  EditStoredJob(*state_, other, [&](store::StoredJob& s) {
    s.mutable_job()->mutable_spec()->mutable_checkpoint()->set_dir(first_dir);
  });
  Reset(/*with_state=*/true);
  ASSERT_TRUE(jobs_->Restore().ok());
  ASSERT_EQ(jobs_->Get(other).value().spec().checkpoint().dir(), first_dir);
  // The tests share TEST_TMPDIR and job ids: a step no other test writes.
  const std::string step = absl::StrCat(OutputDir(), "/", first_dir, "/step-00000047");
  std::filesystem::remove_all(step);
  std::filesystem::create_directories(step);
  std::ofstream(step + "/unit-0000.safetensors") << "being written, or left";
  ASSERT_TRUE(jobs_->Cancel(first).ok());
  jobs_->FlushIo();
  EXPECT_TRUE(std::filesystem::exists(step + "/unit-0000.safetensors"));  // the other's, maybe
  ASSERT_TRUE(jobs_->Cancel(other).ok());
  jobs_->FlushIo();
  EXPECT_FALSE(std::filesystem::exists(step));
}

// A job a restart fails after a long outage ends then, not when it was
// last saved: its update_time is the restart's, so it is kept for the
// ended-job retention from there. With the stored time it was pruned by
// the first scheduling pass, and its reason was never seen.
TEST_F(JobManagerElasticTest, Restore_JobFailedAfterALongOutage_KeptForTheRetention) {
  Reset(/*with_state=*/true);
  AddWorker(7001);
  const std::string id = Submit(ElasticSpec(1, 0)).value().id();
  Step(id, 1);
  jobs_->FlushIo();
  Reset(/*with_state=*/true);
  clock_.Advance(absl::Hours(25));  // past the default retention of 24 h
  ASSERT_TRUE(jobs_->Restore().ok());
  Schedule();
  jobs_->FlushIo();  // the failure saved: shown RUNNING ("ending: ...") until then
  const absl::StatusOr<v1::Job> job = jobs_->Get(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(job->reason(), "no checkpoints")) << job->reason();
  EXPECT_EQ(FromProtoTimestamp(job->update_time()), clock_.Now());
}

// A job a restart fails (here: it ran without checkpoints) is saved as
// failed: the next restart restores it FAILED, and does not count its end
// again.
TEST_F(JobManagerElasticTest, Restore_JobFailedByTheRestart_SavedFailedEndedOnce) {
  Reset(/*with_state=*/true);
  AddWorker(7001);
  const std::string id = Submit(ElasticSpec(1, 0)).value().id();
  Step(id, 1);
  jobs_->FlushIo();
  EXPECT_EQ(EndedOverTwoRestarts(id, "no checkpoints"), 1);
}

// Every job a restart fails is counted as ended, once: those failed for
// stored state that no longer fits (here a counter out of range) were not.
TEST_F(JobManagerElasticTest, Restore_JobFailedForItsStoredCounters_EndedOnce) {
  const std::string id = CheckpointedJobInStore();
  EditStoredJob(*state_, id, [](store::StoredJob& s) {
    s.mutable_job()->mutable_progress()->set_steps_redone(-1);
  });
  EXPECT_EQ(EndedOverTwoRestarts(id, "progress.steps_redone -1"), 1);
}

// Restarted without --output-dir, which its checkpoints need (Submit
// refuses such a job): the running job fails at the restart, saying why,
// rather than training to its end and failing there.
TEST_F(JobManagerElasticTest, Restore_WithoutTheOutputDirItsCheckpointsNeed_Fails) {
  const std::string id = CheckpointedJobInStore();
  Reset(/*with_state=*/true, /*max_ended_jobs=*/-1, /*with_output_dir=*/false);
  ASSERT_TRUE(jobs_->Restore().ok());
  jobs_->FlushIo();  // the failure saved: shown RUNNING ("ending: ...") until then
  const v1::Job job = jobs_->Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StartsWith(job.reason(),
                               "after a coordinator restart: spec.checkpoint: this coordinator "
                               "keeps no checkpoints (it was started without --output-dir)"))
      << job.reason();
  jobs_->FlushIo();
}

// A stored state this version does not know (another version's, or none):
// nothing would schedule, fail or prune the job, which held its place in
// the queue's limit. It fails, saved so, ended once.
TEST_F(JobManagerElasticTest, Restore_UnknownStoredState_FailsEndedOnce) {
  for (const int state : {0, 42}) {
    SCOPED_TRACE(state);
    const std::string id = CheckpointedJobInStore();
    EditStoredJob(*state_, id, [state](store::StoredJob& s) {
      s.mutable_job()->set_state(static_cast<v1::JobState>(state));
    });
    EXPECT_EQ(EndedOverTwoRestarts(
                  id, absl::StrCat("the stored state ", state, " is not one this version knows")),
              1);
  }
}

// A stored spec over the planning budget (Submit refuses it; a recovery
// or growth would plan it with no later check): the job fails.
TEST_F(JobManagerElasticTest, Restore_SpecOverThePlanningBudget_JobFails) {
  const std::string id = CheckpointedJobInStore();
  EditStoredJob(*state_, id, [](store::StoredJob& s) {
    v1::JobSpec* spec = s.mutable_job()->mutable_spec();
    spec->mutable_model()->set_n_layer(96);  // 194 units
    spec->mutable_parallelism()->set_solver("bipartition");
    spec->mutable_elastic()->set_max_workers(64);  // 64 * 194^3 steps
  });
  Reset(/*with_state=*/true);
  ASSERT_TRUE(jobs_->Restore().ok());
  jobs_->FlushIo();  // the failure saved: shown RUNNING ("ending: ...") until then
  const v1::Job job = jobs_->Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(job.reason(),
                                "the spec is no longer valid: spec.parallelism: "
                                "solver bipartition for 64 stages"))
      << job.reason();
}

// A restored job waits to be planned again with no assignments: a stage's
// last report of the stopped plan, with a step trace, is taken (and its
// trace dropped, as any while recovering) instead of checked against a
// program the job no longer has.
TEST_F(JobManagerElasticTest, Restore_RecoveringJobTakesATracedReportWithoutPrograms) {
  Reset(/*with_state=*/true);
  const std::string w1 = AddWorker(7001);
  AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  Step(id, 1);
  jobs_->FlushIo();
  Reset(/*with_state=*/true);
  ASSERT_TRUE(jobs_->Restore().ok());
  const v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RECOVERING);
  v1::ReportProgressRequest r;
  r.set_worker_id(w1);
  r.set_job_id(id);
  r.set_plan_version(job.plan_version());
  r.set_iteration(1);
  r.mutable_trace()->set_iteration(1);
  const auto response = jobs_->ReportProgress(r);
  EXPECT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RECOVERING);
}

// A plan's drawings are not stored: about 500 bytes of SVG per stage and
// micro-batch outgrow a record's 1 MiB on large jobs, and every save of such
// a job failed. The plan itself is stored whole.
// A worker lost while a recovering job is re-planned (planning runs off the
// job manager's lock, BackgroundQueue): the job waits again, without it,
// instead of failing when the plan is in; the recovery counts once.
TEST_F(JobManagerElasticTest, WorkerLostWhileReplanning_RecoveryWaitsAgainAndCountsOnce) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  const std::string w3 = AddWorker(7003), w4 = AddWorker(7004);  // spares
  for (int step = 1; step <= 7; ++step) Step(id, step);
  CheckpointAll(id, 5);
  registry_.MarkLost(w2, incarnations_[w2], "killed");
  clock_.Advance(absl::Milliseconds(10));
  Heartbeat(w1);
  jobs_->ScheduleQueued();  // the re-plan starts; its planning waits
  v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_PLANNING) << job.reason();
  EXPECT_EQ(job.reason(), "planning on " + w1 + ", " + w3);
  EXPECT_EQ(registry_.Get(w3).value().state(), v1::WORKER_STATE_ASSIGNED);
  registry_.MarkLost(w3, incarnations_[w3], "preempted");
  job = jobs_->Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_TRUE(absl::StrContains(job.reason(), "a worker was lost while the job was being planned"))
      << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(), "preempted")) << job.reason();
  EXPECT_EQ(registry_.Get(w1).value().state(), v1::WORKER_STATE_READY);
  EXPECT_EQ(background_.RunAll(), 1);  // overtaken: dropped
  EXPECT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RECOVERING);
  EXPECT_FALSE(hub_.Newer(w3, 0).has_value());
  Schedule();
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(WorkerIdsOf(job), (std::vector<std::string>{w1, w4}));
  EXPECT_EQ(job.plan_version(), 2);
  EXPECT_EQ(job.progress().step(), 5);
  EXPECT_EQ(job.progress().loss_history_size(), 5);
  EXPECT_EQ(job.progress().steps_redone(), 2);
  EXPECT_EQ(job.progress().recoveries(), 1);
}

// A worker lost while the job is re-planned at a step boundary: the stages
// stopped after the boundary's complete checkpoint, so the job recovers
// from it, redoing nothing. The worker the new plan left out was stopped
// when planning began (it is free for other jobs from then on).
TEST_F(JobManagerElasticTest, WorkerLostWhileReplanningAtABoundary_RecoversFromTheBoundary) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002), w3 = AddWorker(7003);
  const std::string id = Submit(ElasticSpec(3, 5)).value().id();
  for (int step = 1; step <= 3; ++step) Step(id, step);
  ASSERT_TRUE(jobs_->Drain(w2).ok());
  const int64_t boundary = Step(id, 4).stop_after_step();
  ASSERT_GT(boundary, 4);
  for (int64_t step = 5; step <= boundary; ++step) Step(id, step);
  hold_plans_ = true;
  CheckpointAll(id, boundary);
  v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_PLANNING) << job.reason();
  EXPECT_EQ(AssignmentOf(w2).action(), v1::Assignment::ACTION_STOP);
  EXPECT_EQ(registry_.Get(w2).value().state(), v1::WORKER_STATE_READY);
  // The old plan's stages' last words are taken, and nothing is recorded.
  EXPECT_EQ(Step(id, boundary + 1).stop_after_step(), 0);
  EXPECT_EQ(jobs_->Get(id).value().progress().step(), boundary);
  registry_.MarkLost(w3, incarnations_[w3], "preempted");
  job = jobs_->Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_TRUE(absl::StrContains(job.reason(), "a worker was lost while the job was being planned"))
      << job.reason();
  EXPECT_EQ(background_.RunAll(), 1);  // overtaken: dropped
  hold_plans_ = false;
  HeartbeatAllAndSchedule({w1});
  job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(WorkerIdsOf(job), (std::vector<std::string>{w1}));  // w2 drained, w3 lost
  EXPECT_EQ(job.plan_version(), 2);
  EXPECT_EQ(job.progress().step(), boundary);
  EXPECT_EQ(job.progress().steps_redone(), 0);
  EXPECT_EQ(AssignmentOf(w1).resume().step(), boundary);
}

// Drained while its first plan is made: the job counts the placement's
// workers (it has none of its own yet), starts, and leaves the drained
// worker at its first step boundary.
TEST_F(JobManagerElasticTest, DrainWhilePlanning_TheJobStartsThenLeavesItAtABoundary) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002), w3 = AddWorker(7003);
  const std::string id = jobs_->Submit(ElasticSpec(2, 5)).value().id();
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_PLANNING);
  const absl::StatusOr<v1::Worker> drained = jobs_->Drain(w2);
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_EQ(background_.RunAll(), 1);
  const v1::Job job = jobs_->Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(WorkerIdsOf(job), (std::vector<std::string>{w1, w2}));
  EXPECT_GT(Step(id, 1).stop_after_step(), 1);  // the boundary that takes w2 out
  EXPECT_EQ(registry_.Get(w3).value().state(), v1::WORKER_STATE_READY);
}

// A drain while the job is being planned counts a spare too, which is
// held until the plan is in and its boundary re-plans: a job submitted
// meanwhile, or a drain of that spare, does not take it. Before, the other
// job took it and the boundary left the first waiting for a worker.
TEST_F(JobManagerElasticTest, DrainWhilePlanning_TheSpareItCountedOnIsHeld) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002), w3 = AddWorker(7003);
  v1::JobSpec spec = ElasticSpec(2, 5);
  spec.mutable_elastic()->set_min_workers(2);
  spec.mutable_elastic()->set_max_workers(2);
  const std::string id = jobs_->Submit(spec).value().id();
  ASSERT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_PLANNING);
  ASSERT_TRUE(jobs_->Drain(w2).ok()) << "w3 can take its place";
  const absl::Status refused = jobs_->Drain(w3).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "held for the job, being planned")) << refused;
  const std::string later = jobs_->Submit(ElasticSpec(1, 5)).value().id();
  EXPECT_EQ(jobs_->Get(later).value().state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(background_.RunAll(), 1);  // the first job's plan only
  const int64_t boundary = Step(id, 1).stop_after_step();
  ASSERT_GT(boundary, 1);
  const v1::Job job = PassBoundary(id, 2, boundary);
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(WorkerIdsOf(job), (std::vector<std::string>{w1, w3}));
  EXPECT_EQ(job.progress().recoveries(), 0);
  EXPECT_EQ(jobs_->Get(later).value().state(), v1::JOB_STATE_QUEUED);
}

// A worker lost while the final weights are being uploaded: the job
// recovers (the redone steps end with a fresh upload), and the partial
// file goes at once rather than at the next plan.
TEST_F(JobManagerElasticTest, WorkerLostDuringTheWeightsUpload_PartialFileRemoved) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  v1::JobSpec spec = ElasticSpec(2, 5, /*steps=*/5);
  spec.mutable_output()->set_weights_path("lost-upload.safetensors");
  const std::string id = Submit(spec).value().id();
  for (int step = 1; step <= 5; ++step) Step(id, step);
  v1::WeightsChunk chunk;
  chunk.set_worker_id(w1);  // stage 0: the embeddings
  chunk.set_job_id(id);
  chunk.set_tensor_name("wpe.weight");
  const std::vector<ParameterShape> embeddings =
      UnitParameterShapes(ResolveJobSpec(spec).value().train.model, 0);
  for (int64_t d : embeddings[1].shape) chunk.add_shape(d);
  chunk.add_values(1.0f);
  const absl::Status added = jobs_->AddWeightsChunk(chunk);
  ASSERT_TRUE(added.ok()) << added;
  auto temporaries = [] {
    int found = 0;
    DIR* d = opendir(OutputDir().c_str());
    while (dirent* e = d != nullptr ? readdir(d) : nullptr) {
      found += absl::StartsWith(e->d_name, "lost-upload.safetensors.tmp.") ? 1 : 0;
    }
    if (d != nullptr) closedir(d);
    return found;
  };
  ASSERT_EQ(temporaries(), 1);
  registry_.MarkLost(w2, incarnations_[w2], "killed");
  EXPECT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(temporaries(), 0);
}

// A coordinator that died during an upload left its temporary. After the
// restart, a job without checkpoints fails (it cannot resume) and the
// temporary goes with it, as when a job fails while a coordinator runs; a
// job with checkpoints resumes, which counts as a recovery of its own kind.
TEST_F(JobManagerElasticTest, Restore_JobFailedByTheRestart_DeadUploadRemovedResumedOneCounted) {
  Reset(/*with_state=*/true);
  AddWorker(7001);
  AddWorker(7002);
  AddWorker(7003);
  v1::JobSpec uncheckpointed = ElasticSpec(1, 0);
  uncheckpointed.mutable_output()->set_weights_path("restart-upload.safetensors");
  const std::string failed = Submit(uncheckpointed).value().id();
  const std::string resumed = Submit(ElasticSpec(2, 5)).value().id();
  for (int step = 1; step <= 5; ++step) {
    Step(failed, step);
    Step(resumed, step);
  }
  CheckpointAll(resumed, 5);
  jobs_->FlushIo();
  const std::string stale = OutputDir() + "/restart-upload.safetensors.tmp.1.0";
  std::ofstream(stale) << "half a file";
  Reset(/*with_state=*/true);
  std::vector<std::string> recoveries;
  JobEvents events;
  events.recovery_started = [&](RecoveryKind kind) {
    recoveries.push_back(RecoveryKindName(kind));
  };
  jobs_->SetEvents(events);
  ASSERT_TRUE(jobs_->Restore().ok());
  jobs_->FlushIo();  // the failure saved (shown RUNNING until then), the temporary removed
  EXPECT_EQ(jobs_->Get(failed).value().state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(access(stale.c_str(), F_OK), -1) << stale << " left behind";
  EXPECT_EQ(jobs_->Get(resumed).value().state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(recoveries, std::vector<std::string>{"coordinator_restart"});
}

// A job stored while its first plan was being made (never planned) waits
// again after a restart; it did not run, so it is not "restarted while it
// ran".
TEST_F(JobManagerElasticTest, Restore_StoredWhileFirstPlanned_QueuedAgain) {
  Reset(/*with_state=*/true);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();  // no workers: QUEUED
  jobs_->FlushIo();
  EditStoredJob(*state_, id,
                [](store::StoredJob& s) { s.mutable_job()->set_state(v1::JOB_STATE_PLANNING); });
  Reset(/*with_state=*/true);
  ASSERT_TRUE(jobs_->Restore().ok());
  EXPECT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_QUEUED);
  AddWorker(7001);
  AddWorker(7002);
  Schedule();
  EXPECT_EQ(jobs_->Get(id).value().state(), v1::JOB_STATE_RUNNING);
}

TEST_F(JobManagerElasticTest, StoredPlan_KeepsTheStagesNotTheDrawings) {
  Reset(/*with_state=*/true);
  AddWorker(7001);
  AddWorker(7002);
  const std::string id = Submit(ElasticSpec(2, 5)).value().id();
  jobs_->FlushIo();
  const v1::Plan shown = jobs_->GetPlan(id).value();
  EXPECT_FALSE(shown.timeline_svg().empty());
  EXPECT_FALSE(shown.chrome_trace_json().empty());
  bool found = false;
  const std::vector<store::StoredJob> stored = state_->LoadJobs().value();
  for (const store::StoredJob& s : stored) {
    if (s.job().id() != id) continue;
    found = true;
    EXPECT_EQ(s.plan().stages_size(), 2);
    EXPECT_EQ(s.plan().version(), shown.version());
    EXPECT_TRUE(s.plan().timeline_svg().empty());
    EXPECT_TRUE(s.plan().chrome_trace_json().empty());
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace pipetrain

namespace pipetrain {
namespace {

// A store whose commits fail while `failing` is set (a busy SQLite, a
// full disk, an unreachable etcd), and wait while held (a slow disk),
// counting the commits waiting, until released.
class FlakyStore final : public MemoryBackedStore {
 public:
  absl::Status Commit(const std::vector<StoreWrite>& writes) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (hold_) {
        ++waiting_;
        changed_.notify_all();
        changed_.wait(lock, [this] { return !hold_; });
        --waiting_;
      }
    }
    if (failing.load()) return absl::UnavailableError("the store is unreachable");
    const bool puts = std::any_of(writes.begin(), writes.end(), [](const StoreWrite& w) {
      return w.kind == StoreWrite::Kind::kPut;
    });
    if (!puts && deletes_fail.load()) return absl::UnavailableError("the store is unreachable");
    if (puts && puts_unconfirmed.load()) {
      // Applied, but the answer is lost (an etcd deadline, a leader change).
      if (absl::Status applied = CommitThrough(writes); !applied.ok()) return applied;
      return absl::UnavailableError("etcd Txn: DEADLINE_EXCEEDED");
    }
    ++commits;
    return CommitThrough(writes);
  }
  std::string Describe() const override { return "flaky"; }
  void Hold() {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = true;
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = false;
    changed_.notify_all();
  }
  bool AwaitWaiting(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, std::chrono::seconds(60), [&] { return waiting_ == n; });
  }
  std::atomic<bool> failing{false};
  std::atomic<bool> puts_unconfirmed{false};  // commits with a put applied, then UNAVAILABLE
  std::atomic<bool> deletes_fail{false};      // commits of deletes only fail
  std::atomic<int> commits{0};                // that succeeded

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  bool hold_ = false;
  int waiting_ = 0;
};

// `r` says the checkpoint of step `step` is written: 4 unit files of 100
// bytes each.
void AddFourUnitCheckpoint(v1::ReportProgressRequest& r, int64_t step) {
  r.mutable_checkpoint()->set_step(step);
  for (int u = 0; u < 4; ++u) {
    v1::UnitFile* f = r.mutable_checkpoint()->add_units();
    f->set_unit(u);
    f->set_file(absl::StrFormat("unit-%04d.safetensors", u));
    f->set_bytes(100);
    f->set_sha256(std::string(64, 'a'));
  }
}

// The unit files AddFourUnitCheckpoint reports, in `step_dir` (the stage
// would have written them there): a manifest held by a failed save is
// written, after a later save, only over them.
void WriteFourUnitFiles(const std::string& step_dir) {
  std::filesystem::create_directories(step_dir);
  for (int u = 0; u < 4; ++u) {
    std::ofstream(absl::StrFormat("%s/unit-%04d.safetensors", step_dir, u), std::ios::binary)
        << std::string(100, 'w');
  }
}

// Checkpoint 17 expires (keep 1) while the save that drops it fails; then
// the store is back and either the retry alone saves the job
// (`retry_only`) or a later checkpoint does. `redo`: before that, a stage
// writes step 17 again (redone after the later checkpoints were dropped)
// into its directory, and reports it (kReported: the directory stays) or
// not yet (kUnreported: the redo's file stays, the old manifest goes).
enum class Redo { kNone, kReported, kUnreported };
void ExpireWhileSavesFail(bool retry_only, Redo redo = Redo::kNone) {
  const bool redone = redo != Redo::kNone;
  FakeClock clock;
  WorkerRegistry registry(WorkerRegistry::Options{"", absl::Seconds(1), absl::Seconds(5), &clock});
  AssignmentHub hub;
  FlakyStore store;
  CoordinatorState state(&store);
  BackgroundQueue background;
  JobManager jobs(
      &registry, &hub, &clock,
      JobManagerOptions{
          .output_dir = OutputDir(), .state = &state, .background_runner = background.Runner()});
  v1::RegisterWorkerRequest join;
  join.set_data_address("127.0.0.1:7001");
  const std::string w = registry.Register(join).value().worker_id();
  v1::JobSpec spec = ElasticSpec(1, 17, 100);
  spec.mutable_checkpoint()->set_keep(1);
  // Each variant its own directory: the test binary's output directory,
  // and the job id, are the same for all.
  const std::string dir = absl::StrCat("checkpoints/expire-", retry_only, static_cast<int>(redo));
  spec.mutable_checkpoint()->set_dir(dir);
  const std::string id = jobs.Submit(spec).value().id();
  background.RunAll();
  ASSERT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  const int64_t version = jobs.Get(id).value().plan_version();
  auto report = [&](int64_t step, bool checkpoint) {
    v1::ReportProgressRequest r;
    r.set_worker_id(w);
    r.set_job_id(id);
    r.set_plan_version(version);
    r.set_iteration(step - 1);
    if (checkpoint) {
      AddFourUnitCheckpoint(r, step);
    } else {
      r.add_micro_batch_losses(1.0f);
      r.add_micro_batch_losses(1.0f);
    }
    ASSERT_TRUE(jobs.ReportProgress(r).ok()) << step;
  };
  const auto manifest = [&](int64_t step) {
    struct stat st;
    return stat(absl::StrFormat("%s/%s/step-%08d/manifest.json", OutputDir(), dir, step).c_str(),
                &st) == 0;
  };
  for (int64_t step = 1; step <= 17; ++step) report(step, false);
  report(17, true);
  jobs.FlushIo();
  ASSERT_TRUE(manifest(17));
  store.failing = true;
  for (int64_t step = 18; step <= 34; ++step) report(step, false);
  WriteFourUnitFiles(absl::StrFormat("%s/%s/step-%08d", OutputDir(), dir, 34));
  report(34, true);  // expires 17; its save fails
  jobs.FlushIo();
  EXPECT_TRUE(manifest(17)) << "removed although the stored state may still name it";
  // Nor does 34 look complete to tools before the state names it.
  EXPECT_FALSE(manifest(34)) << "written although the state naming it was not saved";
  // The redo's unit file, modified after the expired checkpoint's manifest
  // but, by a file server's clock 100 s behind this host's, before the
  // expiry as this host dates it: the manifest's time tells them apart.
  const std::string redone_file =
      absl::StrFormat("%s/%s/step-%08d/unit-0000.safetensors", OutputDir(), dir, 17);
  if (redone) {
    std::ofstream(redone_file) << "redone";
    const auto set_time = [](const std::string& path, absl::Duration ago) {
      const timespec t = absl::ToTimespec(absl::Now() - ago);
      const timespec times[2] = {t, t};
      return utimensat(AT_FDCWD, path.c_str(), times, 0);
    };
    ASSERT_EQ(set_time(absl::StrFormat("%s/%s/step-%08d/manifest.json", OutputDir(), dir, 17),
                       absl::Seconds(100)),
              0);
    ASSERT_EQ(set_time(redone_file, absl::Seconds(50)), 0);
  }
  if (redo == Redo::kReported) {
    v1::ReportProgressRequest r;
    r.set_worker_id(w);
    r.set_job_id(id);
    r.set_plan_version(version);
    r.set_iteration(16);
    r.mutable_checkpoint()->set_step(17);
    v1::UnitFile* f = r.mutable_checkpoint()->add_units();
    f->set_unit(0);
    f->set_file("unit-0000.safetensors");
    f->set_bytes(100);
    f->set_sha256(std::string(64, 'b'));
    ASSERT_TRUE(jobs.ReportProgress(r).ok());
  }
  store.failing = false;
  if (retry_only) {
    // No later checkpoint: the once-a-second retry's save alone lets 17 go.
    clock.Advance(absl::Seconds(2));
    jobs.ScheduleQueued();
    jobs.FlushIo();
    struct stat st;
    if (redone) {
      // Reported or not, the redo is not complete: the old manifest (its
      // checksums no longer the files') goes, the redo's file stays.
      EXPECT_FALSE(manifest(17)) << "the expired checkpoint's manifest left behind";
      EXPECT_EQ(stat(redone_file.c_str(), &st), 0) << "the redo's file removed";
      return;
    }
    EXPECT_FALSE(manifest(17)) << "left behind after the retried save";
    EXPECT_TRUE(manifest(34));
    return;
  }
  for (int64_t step = 35; step <= 51; ++step) report(step, false);
  report(51, true);  // expires 34; this save succeeds
  jobs.FlushIo();
  EXPECT_FALSE(manifest(17)) << "left behind";
  EXPECT_FALSE(manifest(34));
  EXPECT_TRUE(manifest(51));
}

// A job manager's collaborators around a store that fails or waits on
// demand (FlakyStore), on a fake clock.
class JobManagerStoreTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  WorkerRegistry registry_{WorkerRegistry::Options{.clock = &clock_}};
  AssignmentHub hub_;
  FlakyStore store_;
  CoordinatorState state_{&store_};
  // Options saving to state_.
  JobManagerOptions StoreOptions() {
    return JobManagerOptions{.output_dir = OutputDir(), .state = &state_};
  }
  // The scheduling pass of the next second (when the store retries are
  // due), and the store work it queued.
  void RetryPass(JobManager& jobs) {
    clock_.Advance(absl::Seconds(2));
    jobs.ScheduleQueued();
    jobs.FlushIo();
  }
  // Two minutes of once-a-second retry passes while one job's deletes fail:
  // it stays counted among those whose delete failed.
  void TwoMinutesOfFailingDeletes(JobManager& jobs) {
    for (int pass = 0; pass < 120; ++pass) {
      clock_.Advance(absl::Seconds(1));
      jobs.ScheduleQueued();
      jobs.FlushIo();
      ASSERT_EQ(jobs.JobsWithFailedDelete(), 1) << pass;
    }
  }
  // Worker `w` reports step `step` of job `id` (plan `version`): its
  // losses, then, with `checkpoint`, its checkpoint of 4 unit files.
  static void ReportStep(JobManager& jobs, const std::string& w, const std::string& id,
                         int64_t version, int64_t step, bool checkpoint) {
    v1::ReportProgressRequest r;
    r.set_worker_id(w);
    r.set_job_id(id);
    r.set_plan_version(version);
    r.set_iteration(step - 1);
    r.add_micro_batch_losses(1.0f);
    r.add_micro_batch_losses(1.0f);
    ASSERT_TRUE(jobs.ReportProgress(r).ok()) << step;
    if (!checkpoint) return;
    r.clear_micro_batch_losses();
    AddFourUnitCheckpoint(r, step);
    ASSERT_TRUE(jobs.ReportProgress(r).ok()) << step;
  }
};

// A checkpoint expired while the save that drops it failed keeps its
// directory then (the stored state may still name it), and loses it once a
// later save succeeds, a later checkpoint's or the retry of the failed one:
// it is not left behind for good.
TEST_F(JobManagerStoreTest, ExpiredWhileTheSaveFailed_RemovedAfterALaterSave) {
  ExpireWhileSavesFail(/*retry_only=*/false);
}
TEST_F(JobManagerStoreTest, ExpiredWhileTheSaveFailed_RemovedAfterTheRetriedSave) {
  ExpireWhileSavesFail(/*retry_only=*/true);
}
// While saves fail, the manifests held for the next save that succeeds are
// those of checkpoints still kept (`keep`), not one per checkpoint of the
// whole outage; the save that succeeds writes the one kept.
TEST_F(JobManagerStoreTest, SavesFailing_HeldManifestsBoundedByKeep) {
  BackgroundQueue background;
  JobManager jobs(
      &registry_, &hub_, &clock_,
      JobManagerOptions{
          .output_dir = OutputDir(), .state = &state_, .background_runner = background.Runner()});
  v1::RegisterWorkerRequest join;
  join.set_data_address("127.0.0.1:7001");
  const std::string w = registry_.Register(join).value().worker_id();
  v1::JobSpec spec = ElasticSpec(1, 5, 100);
  spec.mutable_checkpoint()->set_keep(1);
  spec.mutable_checkpoint()->set_dir("checkpoints/held-bounded");
  const std::string id = jobs.Submit(spec).value().id();
  background.RunAll();
  ASSERT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  const int64_t version = jobs.Get(id).value().plan_version();
  store_.failing = true;
  for (int64_t step = 1; step <= 50; ++step) {
    ASSERT_NO_FATAL_FAILURE(ReportStep(jobs, w, id, version, step, step % 5 == 0));
    if (step % 5 == 0) jobs.FlushIo();
  }
  EXPECT_EQ(jobs.HeldManifestsForTesting(id), 1u) << "one per failed save kept";
  const auto manifest = [&](int64_t step) {
    struct stat st;
    return stat(absl::StrFormat("%s/checkpoints/held-bounded/step-%08d/manifest.json", OutputDir(),
                                step)
                    .c_str(),
                &st) == 0;
  };
  EXPECT_FALSE(manifest(50)) << "written although the state naming it was not saved";
  WriteFourUnitFiles(absl::StrCat(OutputDir(), "/checkpoints/held-bounded/step-00000050"));
  store_.failing = false;
  RetryPass(jobs);
  EXPECT_EQ(jobs.HeldManifestsForTesting(id), 0u);
  EXPECT_TRUE(manifest(50));
  EXPECT_FALSE(manifest(45));
}

// An ended job whose complete checkpoint's manifest waits for a good save
// is not pruned (even past max_ended_jobs 0): pruned, the manifest was
// never written, and the checkpoint could be neither resumed nor exported.
// Once the store is back, the save writes it, and the job goes.
TEST_F(JobManagerStoreTest, SavesFailing_EndedJobWithHeldManifestNotPruned) {
  BackgroundQueue background;
  JobManager jobs(&registry_, &hub_, &clock_,
                  JobManagerOptions{.output_dir = OutputDir(),
                                    .max_ended_jobs = 0,
                                    .state = &state_,
                                    .background_runner = background.Runner()});
  v1::RegisterWorkerRequest join;
  join.set_data_address("127.0.0.1:7001");
  const std::string w = registry_.Register(join).value().worker_id();
  v1::JobSpec spec = ElasticSpec(1, 5, 100);
  spec.mutable_checkpoint()->set_dir("checkpoints/held-pruned");
  const std::string id = jobs.Submit(spec).value().id();
  background.RunAll();
  ASSERT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  const int64_t version = jobs.Get(id).value().plan_version();
  store_.failing = true;
  for (int64_t step = 1; step <= 5; ++step) {
    ASSERT_NO_FATAL_FAILURE(ReportStep(jobs, w, id, version, step, step == 5));
  }
  jobs.FlushIo();
  ASSERT_EQ(jobs.HeldManifestsForTesting(id), 1u);
  (void)jobs.Cancel(id);  // ended here; its save fails (retried)
  ASSERT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_CANCELLED);
  // Past the late sweep's wait: the sweeps end, which alone no longer
  // holds the job.
  clock_.Advance(kLateSweepWait + absl::Seconds(1));
  for (int pass = 0; pass < 3; ++pass) {
    jobs.ScheduleQueued();
    jobs.FlushIo();
  }
  ASSERT_TRUE(jobs.Get(id).ok()) << "pruned with its manifest unwritten";
  const std::string manifest =
      absl::StrCat(OutputDir(), "/checkpoints/held-pruned/step-00000005/manifest.json");
  EXPECT_FALSE(std::filesystem::exists(manifest));
  WriteFourUnitFiles(absl::StrCat(OutputDir(), "/checkpoints/held-pruned/step-00000005"));
  store_.failing = false;
  RetryPass(jobs);
  EXPECT_TRUE(std::filesystem::exists(manifest));
  RetryPass(jobs);
  EXPECT_EQ(jobs.Get(id).status().code(), absl::StatusCode::kNotFound);
}

// The step written again meanwhile (redone after the later checkpoints
// were dropped) and reported, not yet complete: the redo's files stay, the
// old manifest goes (kept, it named checksums the files no longer have,
// and export and init.from took it for the newest checkpoint).
TEST_F(JobManagerStoreTest, ExpiredWhileTheSaveFailed_StepRedone_OldManifestGoesRedoKept) {
  ExpireWhileSavesFail(/*retry_only=*/true, Redo::kReported);
}
// Nor do the files a redo wrote before it reported them go (its stage
// writes, then reports).
TEST_F(JobManagerStoreTest, ExpiredWhileTheSaveFailed_StepRedoneNotYetReported_FilesKept) {
  ExpireWhileSavesFail(/*retry_only=*/true, Redo::kUnreported);
}

// A submit whose commit was applied although it answered an error (an etcd
// deadline, a leader change) is deleted again, so that "nothing was
// submitted" holds after a restart too; when even that fails, the caller is
// told the job may come back, and under which id, and the coordinator keeps
// deleting it (below).
TEST_F(JobManagerStoreTest, SubmitCommitUnconfirmed_DeletedAgainOrSaysItMayComeBack) {
  JobManager jobs(&registry_, &hub_, &clock_, StoreOptions());
  store_.puts_unconfirmed = true;
  const absl::Status first = jobs.Submit(ElasticSpec(1, 0, 5)).status();
  EXPECT_EQ(first.code(), absl::StatusCode::kUnavailable) << first;
  EXPECT_TRUE(absl::StrContains(first.message(), "nothing was submitted")) << first;
  EXPECT_TRUE(state_.LoadJobs().value().empty());
  store_.deletes_fail = true;
  const absl::Status second = jobs.Submit(ElasticSpec(1, 0, 5)).status();
  EXPECT_EQ(second.code(), absl::StatusCode::kUnavailable) << second;
  const std::vector<store::StoredJob> ghosts = state_.LoadJobs().value();
  ASSERT_EQ(ghosts.size(), 1u);
  EXPECT_TRUE(absl::StrContains(second.message(), "may come back as " + ghosts[0].job().id() +
                                                      " after a coordinator restart or failover"))
      << second;
  EXPECT_TRUE(jobs.List().empty());
}

// A submit left unsettled (its commit unconfirmed, and the delete that
// would make sure of it failing) holds its weights path and request_id
// until a delete commits, which the scheduling pass retries: a retry of
// the request meanwhile is UNAVAILABLE, not a second job that could meet
// the first after a restart. Once settled, the retry submits it anew.
TEST_F(JobManagerStoreTest, SubmitUnsettled_HoldsPathAndRequestUntilTheDeleteCommits) {
  JobManager jobs(&registry_, &hub_, &clock_, StoreOptions());
  v1::JobSpec spec = ElasticSpec(1, 0, 5);
  spec.mutable_output()->set_weights_path("unsettled.safetensors");
  store_.puts_unconfirmed = true;
  store_.deletes_fail = true;
  const absl::Status first = jobs.Submit(spec, "req-1").status();
  ASSERT_EQ(first.code(), absl::StatusCode::kUnavailable) << first;
  EXPECT_TRUE(absl::StrContains(first.message(), "keeps deleting it")) << first;
  store_.puts_unconfirmed = false;
  ASSERT_EQ(state_.LoadJobs().value().size(), 1u);
  const std::string ghost = state_.LoadJobs().value()[0].job().id();
  // Still failing: every second's retry leaves it claimed.
  for (int pass = 0; pass < 2; ++pass) {
    RetryPass(jobs);
    const absl::Status retry = jobs.Submit(spec, "req-1").status();
    EXPECT_EQ(retry.code(), absl::StatusCode::kUnavailable) << retry;
    EXPECT_TRUE(absl::StrContains(retry.message(), "whether the state store holds job " + ghost))
        << retry;
    // Passes by itself (the delete commits): a retry succeeds, so the
    // client's retry is asked for.
    const absl::Status other = jobs.Submit(spec, "req-2").status();
    EXPECT_EQ(other.code(), absl::StatusCode::kUnavailable) << other;
    EXPECT_TRUE(absl::StrContains(other.message(), "is the output of job " + ghost +
                                                       " (its submit failed unconfirmed; the "
                                                       "coordinator is deleting it"))
        << other;
    EXPECT_TRUE(jobs.List().empty());
    EXPECT_EQ(state_.LoadJobs().value().size(), 1u);
  }
  store_.deletes_fail = false;
  RetryPass(jobs);
  EXPECT_TRUE(state_.LoadJobs().value().empty());
  const absl::StatusOr<v1::Job> again = jobs.Submit(spec, "req-1");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(again->id(), ghost);
  EXPECT_EQ(again->request_id(), "req-1");
  const std::vector<v1::Job> listed = jobs.List();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].id(), again->id());
}

// A pruned job whose store delete failed is deleted again once a second
// until that commits: else a restarted coordinator would bring it back.
TEST_F(JobManagerStoreTest, PrunedJobDeleteFailed_DeletedAgain_NotBroughtBackByARestart) {
  JobManagerOptions options = StoreOptions();
  options.max_ended_jobs = 0;
  JobManager jobs(&registry_, &hub_, &clock_, options);
  const std::string id = jobs.Submit(ElasticSpec(1, 0, 5)).value().id();
  store_.deletes_fail = true;
  ASSERT_TRUE(jobs.Cancel(id).ok());
  jobs.FlushIo();         // its checkpoint directory swept
  jobs.ScheduleQueued();  // prunes it
  jobs.FlushIo();
  EXPECT_EQ(jobs.Get(id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(state_.LoadJobs().value().size(), 1u);
  RetryPass(jobs);  // tried again; fails again
  EXPECT_EQ(state_.LoadJobs().value().size(), 1u);
  store_.deletes_fail = false;
  RetryPass(jobs);
  EXPECT_TRUE(state_.LoadJobs().value().empty());
  JobManager restarted(&registry_, &hub_, &clock_, options);
  ASSERT_TRUE(restarted.Restore().ok());
  EXPECT_TRUE(restarted.List().empty());
}

// A stop (SIGTERM: the job manager destroyed) right after a save failed,
// before the retry a second later: the job manager tries the save, and a
// pruned job's deletion, once more as it goes, so the next start (or the
// next leader) does not restore the cancelled job QUEUED again, nor the
// pruned one at all.
TEST_F(JobManagerStoreTest, StoppedWithASaveAndADeleteFailed_BothTriedAgainAsItStops) {
  JobManagerOptions options = StoreOptions();
  // Every saved end is pruned; an unsaved one (the second cancel) is not.
  options.max_ended_jobs = 0;
  std::string cancelled, pruned;
  {
    JobManager jobs(&registry_, &hub_, &clock_, options);
    pruned = jobs.Submit(ElasticSpec(1, 0, 5)).value().id();
    cancelled = jobs.Submit(ElasticSpec(1, 0, 5)).value().id();
    ASSERT_TRUE(jobs.Cancel(pruned).ok());
    clock_.Advance(absl::Seconds(1));
    store_.failing = true;
    EXPECT_EQ(jobs.Cancel(cancelled).status().code(), absl::StatusCode::kUnavailable);
    // Prunes the first (its delete fails) and retries the save (failing
    // again): both are next due a second later, which never comes.
    jobs.ScheduleQueued();
    jobs.FlushIo();
    ASSERT_EQ(jobs.Get(pruned).status().code(), absl::StatusCode::kNotFound);
    ASSERT_TRUE(jobs.Get(cancelled).ok());  // its cancel unsaved: kept
    store_.failing = false;
  }
  const std::vector<store::StoredJob> jobs = state_.LoadJobs().value();
  std::map<std::string, v1::JobState> stored;
  for (const store::StoredJob& s : jobs) stored[s.job().id()] = s.job().state();
  EXPECT_EQ(stored, (std::map<std::string, v1::JobState>{{cancelled, v1::JOB_STATE_CANCELLED}}));
}

// Submit saves the job off the job lock: while its commit waits (a slow
// disk, etcd), the other calls go on; the job is not listed yet, but its
// weights path is taken. A failed save leaves nothing: not listed, the
// path free again once the store is back (the delete that makes sure it
// has no such job failed too, so the path is held until that commits).
TEST_F(JobManagerStoreTest, SubmitSavesOffTheLock_PathClaimedMeanwhile_NothingLeftIfItFails) {
  JobManager jobs(&registry_, &hub_, &clock_, StoreOptions());
  v1::JobSpec spec = ElasticSpec(1, 0, 5);
  spec.mutable_output()->set_weights_path("held.safetensors");
  for (const bool fails : {false, true}) {
    store_.failing = fails;
    store_.Hold();
    absl::StatusOr<v1::Job> submitted;
    std::thread submitting([&] { submitted = jobs.Submit(spec); });
    ASSERT_TRUE(store_.AwaitWaiting(1));
    const size_t listed = jobs.List().size();  // would wait for the commit under the lock
    EXPECT_EQ(listed, fails ? 1u : 0u);        // the first job, once saved; not this one
    const absl::Status second = jobs.Submit(spec).status();
    EXPECT_EQ(second.code(), absl::StatusCode::kInvalidArgument) << second;
    EXPECT_TRUE(absl::StrContains(second.message(), "is the output of job")) << second;
    store_.Release();
    submitting.join();
    if (!fails) {
      ASSERT_TRUE(submitted.ok()) << submitted.status();
      EXPECT_EQ(jobs.List().size(), 1u);
      ASSERT_TRUE(jobs.Cancel(submitted->id()).ok());  // frees the path for the second round
      continue;
    }
    EXPECT_EQ(submitted.status().code(), absl::StatusCode::kUnavailable) << submitted.status();
    EXPECT_EQ(jobs.List().size(), 1u);  // only the cancelled first job
    store_.failing = false;
    EXPECT_EQ(jobs.Submit(spec).status().code(), absl::StatusCode::kUnavailable);  // unsettled
    jobs.ScheduleQueued();  // deletes it for sure
    jobs.FlushIo();
    EXPECT_TRUE(jobs.Submit(spec).ok());  // the path is free again
  }
}

// A Submit repeating a request_id creates nothing: while the first one's
// save waits it is UNAVAILABLE (retry), after it the first job comes back,
// and after a save that failed the request is free again (once the store
// surely dropped it). A retry whose answer was lost and that came back
// after a restart is found too.
TEST_F(JobManagerStoreTest, SubmitRequestIdRepeated_OneJobWhateverTheTiming) {
  JobManager jobs(&registry_, &hub_, &clock_, StoreOptions());
  v1::JobSpec spec = ElasticSpec(1, 0, 5);
  spec.mutable_output()->set_weights_path("request.safetensors");
  store_.failing = true;
  EXPECT_EQ(jobs.Submit(spec, "req-1").status().code(), absl::StatusCode::kUnavailable);
  store_.failing = false;
  jobs.ScheduleQueued();  // deletes it for sure
  jobs.FlushIo();
  store_.Hold();
  absl::StatusOr<v1::Job> submitted;
  std::thread submitting([&] { submitted = jobs.Submit(spec, "req-1"); });
  ASSERT_TRUE(store_.AwaitWaiting(1));
  const absl::Status meanwhile = jobs.Submit(spec, "req-1").status();
  EXPECT_EQ(meanwhile.code(), absl::StatusCode::kUnavailable) << meanwhile;
  EXPECT_TRUE(absl::StrContains(meanwhile.message(), "is being saved; retry")) << meanwhile;
  store_.Release();
  submitting.join();
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  EXPECT_EQ(submitted->request_id(), "req-1");
  // Its weights path is taken, by itself: a retry still answers with it.
  absl::StatusOr<v1::Job> again = jobs.Submit(spec, "req-1");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->id(), submitted->id());
  EXPECT_EQ(jobs.List().size(), 1u);
  EXPECT_EQ(jobs.Submit(spec).status().code(), absl::StatusCode::kInvalidArgument);
  // The unconfirmed commit of another request, after which the coordinator
  // restarts: the job came back, and its retry finds it.
  v1::JobSpec other = ElasticSpec(1, 0, 5);
  store_.puts_unconfirmed = true;
  store_.deletes_fail = true;
  EXPECT_EQ(jobs.Submit(other, "req-2").status().code(), absl::StatusCode::kUnavailable);
  store_.puts_unconfirmed = false;
  store_.deletes_fail = false;
  JobManager restarted(&registry_, &hub_, &clock_, StoreOptions());
  ASSERT_TRUE(restarted.Restore().ok());
  ASSERT_EQ(restarted.List().size(), 2u);
  for (const char* id : {"req-1", "req-2"}) {
    absl::StatusOr<v1::Job> retried =
        restarted.Submit(id == std::string("req-1") ? spec : other, id);
    ASSERT_TRUE(retried.ok()) << retried.status();
    EXPECT_EQ(retried->request_id(), id);
  }
  EXPECT_EQ(restarted.List().size(), 2u);
  // Another spec under a used request_id is refused, after the restart too.
  const absl::Status reused = restarted.Submit(other, "req-1").status();
  EXPECT_EQ(reused.code(), absl::StatusCode::kAlreadyExists) << reused;
  EXPECT_TRUE(absl::StrContains(reused.message(),
                                "was submitted as job " + submitted->id() + " with another spec"))
      << reused;
}

// A cancel whose save failed says so (UNAVAILABLE: a coordinator that
// stops now restores the job), is saved again once the store is back (a
// restarted coordinator restores it CANCELLED, not QUEUED to run again),
// and a second cancel then answers as a first one.
// Saves slower than the job's changes do not queue a snapshot each: while
// one save waits on the store, the next 50 progress saves of the job
// become one, which stores the job as it is when it runs.
TEST_F(JobManagerStoreTest, SavesWhileOneWaits_BecomeOneOfTheNewestState) {
  v1::RegisterWorkerRequest worker;
  worker.set_data_address("127.0.0.1:9001");
  const std::string w1 = registry_.Register(worker).value().worker_id();
  JobManager jobs(&registry_, &hub_, &clock_, StoreOptions());
  const std::string id = jobs.Submit(ElasticSpec(1, 0, 100)).value().id();
  jobs.AwaitBackgroundWork();
  ASSERT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  jobs.FlushIo();
  auto report = [&](int64_t iteration) {
    clock_.Advance(absl::Seconds(1));  // progress is saved at most once a second
    v1::ReportProgressRequest r;
    r.set_worker_id(w1);
    r.set_job_id(id);
    r.set_plan_version(1);
    r.set_iteration(iteration);
    r.add_micro_batch_losses(1.0f);
    ASSERT_TRUE(jobs.ReportProgress(r).ok());
  };
  store_.Hold();
  report(0);
  ASSERT_TRUE(store_.AwaitWaiting(1));  // that save waits on the store
  const int before = store_.commits.load();
  for (int64_t it = 1; it <= 50; ++it) report(it);
  store_.Release();
  jobs.FlushIo();
  EXPECT_EQ(store_.commits.load() - before, 2);  // the held one, and one for the 50
  JobManager restored(&registry_, &hub_, &clock_, StoreOptions());
  ASSERT_TRUE(restored.Restore().ok());
  EXPECT_EQ(restored.Get(id).value().progress().step(), 51);
}

// A cancel whose save waits behind a stalled store answers UNAVAILABLE
// after options.cancel_save_wait rather than holding its caller (and the
// gRPC thread submits and drains share) until the store moves; the save
// goes through once it does, and asked again the cancel is confirmed.
TEST_F(JobManagerStoreTest, CancelSaveStalled_UnavailableAfterTheWaitThenRecorded) {
  JobManagerOptions options = StoreOptions();
  options.cancel_save_wait = absl::Milliseconds(50);
  JobManager jobs(&registry_, &hub_, &clock_, options);
  const std::string id = jobs.Submit(ElasticSpec(1, 5)).value().id();
  jobs.FlushIo();
  store_.Hold();
  const absl::StatusOr<v1::Job> waiting = jobs.Cancel(id);
  EXPECT_EQ(waiting.status().code(), absl::StatusCode::kUnavailable) << waiting.status();
  EXPECT_TRUE(absl::StrContains(waiting.status().message(),
                                "its save still waits behind the coordinator's other file and "
                                "store work after 50ms"))
      << waiting.status();
  EXPECT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_CANCELLED);
  store_.Release();
  jobs.FlushIo();
  JobManager restored(&registry_, &hub_, &clock_, StoreOptions());
  ASSERT_TRUE(restored.Restore().ok());
  EXPECT_EQ(restored.Get(id).value().state(), v1::JOB_STATE_CANCELLED);
  ASSERT_EQ(jobs.Cancel(id).value().state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(jobs.Cancel(id).value().state(), v1::JOB_STATE_CANCELLED);  // a repeat
}

// A caller's deadline under options.cancel_save_wait cuts the wait short:
// the answer is UNAVAILABLE within it (before, the wait ran past the
// deadline), and asked again once the save went through, the cancel is
// confirmed.
TEST_F(JobManagerStoreTest, CancelSaveStalled_AnsweredWithinTheCallersDeadline) {
  JobManagerOptions options = StoreOptions();
  options.cancel_save_wait = absl::Hours(1);
  JobManager jobs(&registry_, &hub_, &clock_, options);
  const std::string id = jobs.Submit(ElasticSpec(1, 5)).value().id();
  jobs.FlushIo();
  store_.Hold();
  const absl::StatusOr<v1::Job> waiting = jobs.Cancel(id, absl::Milliseconds(50));
  EXPECT_EQ(waiting.status().code(), absl::StatusCode::kUnavailable) << waiting.status();
  EXPECT_TRUE(absl::StrContains(waiting.status().message(), "after 50ms (the call's deadline)"))
      << waiting.status();
  store_.Release();
  jobs.FlushIo();
  ASSERT_EQ(jobs.Cancel(id, absl::Milliseconds(50)).value().state(), v1::JOB_STATE_CANCELLED);
}

// A repeat while the first cancel's save is still in flight is not told
// the cancel is recorded: it saves again and waits as the first does (two
// callers at once, e.g. a REST cancel beside a gRPC one). Before, it was
// answered OK at once, and a save that then failed (or a coordinator that
// died) brought the job back after the caller was told it was cancelled.
TEST_F(JobManagerStoreTest, CancelRepeatedWhileTheFirstSaveIsInFlight_WaitsForTheSaveToo) {
  JobManagerOptions options = StoreOptions();
  options.cancel_save_wait = absl::Hours(1);
  JobManager jobs(&registry_, &hub_, &clock_, options);
  const std::string id = jobs.Submit(ElasticSpec(1, 5)).value().id();
  jobs.FlushIo();
  store_.Hold();
  absl::StatusOr<v1::Job> first;
  std::thread canceller([&] { first = jobs.Cancel(id); });
  // The first cancel ended the job, and its save waits on the store (not
  // ASSERT: the thread must be joined whatever happens).
  EXPECT_TRUE(store_.AwaitWaiting(1));
  EXPECT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_CANCELLED);
  const absl::StatusOr<v1::Job> repeat = jobs.Cancel(id, absl::Milliseconds(50));
  EXPECT_EQ(repeat.status().code(), absl::StatusCode::kUnavailable) << repeat.status();
  store_.Release();
  canceller.join();
  ASSERT_TRUE(first.ok()) << first.status();
  jobs.FlushIo();
  EXPECT_EQ(jobs.Cancel(id).value().state(), v1::JOB_STATE_CANCELLED);  // recorded now
}

TEST_F(JobManagerStoreTest, CancelSaveFailed_SavedAgainOnceTheStoreIsBack) {
  auto restored_state = [&](const std::string& id) {
    JobManager fresh(&registry_, &hub_, &clock_, StoreOptions());
    EXPECT_TRUE(fresh.Restore().ok());
    return fresh.Get(id).value().state();
  };
  std::string id, id2;
  {
    JobManager jobs(&registry_, &hub_, &clock_, StoreOptions());
    id = jobs.Submit(ElasticSpec(1, 5)).value().id();
    store_.failing = true;
    const absl::StatusOr<v1::Job> unsaved = jobs.Cancel(id);
    EXPECT_EQ(unsaved.status().code(), absl::StatusCode::kUnavailable) << unsaved.status();
    EXPECT_TRUE(absl::StrContains(unsaved.status().message(), "did not record it"))
        << unsaved.status();
    EXPECT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_CANCELLED);  // here, yes
    EXPECT_EQ(restored_state(id), v1::JOB_STATE_QUEUED);               // the store's word
    // Asked again while the store still fails: the same answer; once it
    // is back, the cancel is saved and answered; then it is an ended job.
    EXPECT_EQ(jobs.Cancel(id).status().code(), absl::StatusCode::kUnavailable);
    store_.failing = false;
    ASSERT_EQ(jobs.Cancel(id).value().state(), v1::JOB_STATE_CANCELLED);
    EXPECT_EQ(restored_state(id), v1::JOB_STATE_CANCELLED);
    EXPECT_EQ(jobs.Cancel(id).value().state(), v1::JOB_STATE_CANCELLED);  // a repeat

    // Not asked again: the coordinator saves it again by itself.
    id2 = jobs.Submit(ElasticSpec(1, 5)).value().id();
    store_.failing = true;
    EXPECT_EQ(jobs.Cancel(id2).status().code(), absl::StatusCode::kUnavailable);
    store_.failing = false;
    clock_.Advance(absl::Seconds(1));
    jobs.ScheduleQueued();  // tries the save again
    jobs.FlushIo();
    EXPECT_EQ(restored_state(id2), v1::JOB_STATE_CANCELLED);
    // Recorded by the retry before the user asked again: still answered as
    // a first cancel (what the UNAVAILABLE said to do), then as a repeat.
    EXPECT_EQ(jobs.Cancel(id2).value().state(), v1::JOB_STATE_CANCELLED);
    EXPECT_EQ(jobs.Cancel(id2).value().state(), v1::JOB_STATE_CANCELLED);  // a repeat
  }
  EXPECT_EQ(restored_state(id2), v1::JOB_STATE_CANCELLED);
}

// While the store fails, a job's save is tried again every second (and a
// running job saves its progress every second too): an ERROR line each
// buried the first, and its cause, under thousands an hour per job. The
// first failure is logged, then one a minute saying how many failed, and
// the save that succeeds says so. JobsWithFailedSave (the metrics' gauge)
// counts the job throughout, retries included, until then.
TEST_F(JobManagerStoreTest, SavesFailing_ErrorLoggedOnceAMinuteJobCountedUntilASaveSucceeds) {
  JobManager jobs(&registry_, &hub_, &clock_, StoreOptions());
  const std::string id = jobs.Submit(ElasticSpec(1, 5)).value().id();  // no workers: queued
  EXPECT_EQ(jobs.JobsWithFailedSave(), 0);
  store_.failing = true;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(jobs.Cancel(id).status().code(), absl::StatusCode::kUnavailable);
  for (int pass = 0; pass < 20; ++pass) {  // 40 s of retries
    RetryPass(jobs);
    EXPECT_EQ(jobs.JobsWithFailedSave(), 1) << pass;
  }
  const std::string quiet = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(LinesWith(quiet, "could not save its state"), 1) << quiet;
  ::testing::internal::CaptureStderr();
  for (int pass = 0; pass < 11; ++pass) RetryPass(jobs);  // past the minute
  store_.failing = false;
  RetryPass(jobs);
  const std::string later = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(LinesWith(later, "job " + id +
                                 ": could not save its state (31 saves in a row failed "
                                 "over 1m): UNAVAILABLE: the store is unreachable"),
            1)
      << later;
  EXPECT_EQ(LinesWith(later, "could not save its state"), 1) << later;
  EXPECT_EQ(LinesWith(later, "job " + id + ": its state is saved again, after 32 failed saves"), 1)
      << later;
  EXPECT_EQ(jobs.JobsWithFailedSave(), 0);
}

// A pruned job's delete is tried again every second while the store fails:
// a WARNING each, for every pruned job, buried the cause. The first
// failure is logged, then one a minute saying how many failed, and the
// delete that succeeds says so. JobsWithFailedDelete (the metrics' gauge)
// counts the job until then.
TEST_F(JobManagerStoreTest, PrunedJobDeleteFailing_WarningOnceAMinuteJobCountedUntilDeleted) {
  JobManagerOptions options = StoreOptions();
  options.max_ended_jobs = 0;
  JobManager jobs(&registry_, &hub_, &clock_, options);
  const std::string id = jobs.Submit(ElasticSpec(1, 0, 5)).value().id();
  store_.deletes_fail = true;
  ASSERT_TRUE(jobs.Cancel(id).ok());
  jobs.FlushIo();
  ::testing::internal::CaptureStderr();
  jobs.ScheduleQueued();  // prunes it; its delete fails
  jobs.FlushIo();
  ASSERT_EQ(jobs.Get(id).status().code(), absl::StatusCode::kNotFound);
  TwoMinutesOfFailingDeletes(jobs);
  store_.deletes_fail = false;
  RetryPass(jobs);
  const std::string log = ::testing::internal::GetCapturedStderr();
  const std::string failed = "job " + id + ": pruned, but its stored state could not be deleted";
  EXPECT_EQ(LinesWith(log, failed + ": UNAVAILABLE: the store is unreachable; deleting it again "
                                    "every second (logged once a minute"),
            1)
      << log;
  EXPECT_EQ(LinesWith(log, failed + " (61 deletes in a row failed over 1m): UNAVAILABLE"), 1)
      << log;
  EXPECT_EQ(LinesWith(log, failed + " (121 deletes in a row failed over 2m): UNAVAILABLE"), 1)
      << log;
  EXPECT_EQ(LinesWith(log, "could not be deleted"), 3) << log;
  EXPECT_EQ(
      LinesWith(log,
                "job " + id + ": its stored state is deleted (after 121 failed deletes over 2m2s)"),
      1)
      << log;
  EXPECT_EQ(jobs.JobsWithFailedDelete(), 0);
  EXPECT_TRUE(state_.LoadJobs().value().empty());
}

// Likewise a submit left unsettled (its commit unconfirmed, and the delete
// that would make sure of it failing): its first failed delete is logged,
// then the retries once a minute, and the delete that settles it says so.
TEST_F(JobManagerStoreTest, SubmitUnsettledDeleteFailing_WarningOnceAMinuteJobCountedUntilSettled) {
  JobManager jobs(&registry_, &hub_, &clock_, StoreOptions());
  store_.puts_unconfirmed = true;
  store_.deletes_fail = true;
  ::testing::internal::CaptureStderr();
  ASSERT_EQ(jobs.Submit(ElasticSpec(1, 0, 5)).status().code(), absl::StatusCode::kUnavailable);
  store_.puts_unconfirmed = false;
  const std::string ghost = state_.LoadJobs().value().at(0).job().id();
  EXPECT_EQ(jobs.JobsWithFailedDelete(), 1);
  TwoMinutesOfFailingDeletes(jobs);
  store_.deletes_fail = false;
  RetryPass(jobs);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(LinesWith(log, "job " + ghost +
                               ": its submit failed (UNAVAILABLE: etcd Txn: DEADLINE_EXCEEDED), "
                               "and the state store may hold it after all: deleting it failed "
                               "(UNAVAILABLE: the store is unreachable)"),
            1)
      << log;
  const std::string still = "job " + ghost +
                            ": still cannot make sure the state store dropped it after its "
                            "submit failed";
  EXPECT_EQ(LinesWith(log, still + " (61 deletes in a row failed over 1m): UNAVAILABLE"), 1) << log;
  EXPECT_EQ(LinesWith(log, still + " (121 deletes in a row failed over 2m): UNAVAILABLE"), 1)
      << log;
  EXPECT_EQ(LinesWith(log, "still cannot make sure"), 2) << log;
  EXPECT_EQ(LinesWith(log, "job " + ghost +
                               ": the state store dropped it after its submit failed (after 121 "
                               "failed deletes over 2m2s); its paths are free"),
            1)
      << log;
  EXPECT_EQ(jobs.JobsWithFailedDelete(), 0);
  EXPECT_TRUE(state_.LoadJobs().value().empty());
}

}  // namespace
}  // namespace pipetrain
