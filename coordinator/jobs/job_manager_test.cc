#include "coordinator/jobs/job_manager.h"

#include <dirent.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "common/data_plane_keys.h"
#include "common/device_kind.h"
#include "common/link_model.h"
#include "common/proto_time.h"
#include "common/testing/file_access_override.h"
#include "common/testing/log_lines.h"
#include "common/testing/sanitized_build.h"
#include "common/testing/test_case_dir.h"
#include "coordinator/jobs/background_queue_testing.h"
#include "coordinator/jobs/profile_cache.h"
#include "coordinator/jobs/small_spec_testing.h"
#include "coordinator/planner/measured_timeline.h"
#include "coordinator/planner/solve_plan.h"
#include "coordinator/planner/timeline_render.h"
#include "coordinator/store/coordinator_state.h"
#include "coordinator/store/memory_backed_store_testing.h"
#include "coordinator/store/memory_store.h"
#include "coordinator/store/store.h"
#include "google/protobuf/unknown_field_set.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace pipetrain {
namespace {

v1::JobSpec SmallSpec(int stages) { return SmallJobSpec(stages); }

// The test's output directory (the coordinator's --output-dir).
// Each case's own (job ids restart at job-1 in every case).
std::string OutputDir() { return TestCaseDir(); }

// One chunk carrying a whole tensor of the model, values 0, 1, 2, ...
v1::WeightsChunk WholeTensor(const std::string& worker, const std::string& job,
                             const ParameterShape& p) {
  v1::WeightsChunk chunk;
  chunk.set_worker_id(worker);
  chunk.set_job_id(job);
  chunk.set_tensor_name(p.name);
  int64_t n = 1;
  for (int64_t d : p.shape) {
    chunk.add_shape(d);
    n *= d;
  }
  for (int64_t i = 0; i < n; ++i) chunk.add_values(static_cast<float>(i));
  return chunk;
}

// Defined with the profiling tests below.
v1::ModelProfile FakeProfile(const v1::ProfileRequest& request = {});

// Every weight of `spec`'s model, zeros, as a weights file holds them (a
// tied tensor once).
std::vector<NamedTensor> ZeroWeightsOf(const v1::JobSpec& spec) {
  const GptConfig model = ResolveJobSpec(spec).value().train.model;
  std::vector<NamedTensor> tensors;
  std::set<std::string> names;  // a tied tensor is in two units, once in the file
  for (int u = 0; u < NumUnits(model); ++u) {
    for (const ParameterShape& p : UnitParameterShapes(model, u)) {
      if (!names.insert(p.name).second) continue;
      tensors.push_back({p.name, Tensor::Zeros(Shape(p.shape.begin(), p.shape.end()))});
    }
  }
  return tensors;
}

class JobManagerTest : public ::testing::Test {
 protected:
  JobManagerTest()
      : registry_(WorkerRegistry::Options{"", absl::Seconds(1), absl::Seconds(5), &clock_}),
        jobs_(&registry_, &hub_, &clock_,
              JobManagerOptions{.output_dir = OutputDir(),
                                .background_runner = background_.Runner(),
                                .before_weights_synced = [this] { ++weights_synced_; }}) {
    registry_.SetLossListener(
        [this](const std::string& w, const std::string& j, const std::string& reason,
               int64_t incarnation) { jobs_.OnWorkerLost(w, j, reason, incarnation); });
  }

  std::string AddWorker(int port) {
    v1::RegisterWorkerRequest request;
    request.set_data_address("127.0.0.1:" + std::to_string(port));
    return registry_.Register(request).value().worker_id();
  }

  // A CPU worker on `host` whose memory is bounded by the host's `ram`
  // only (no limit of its own), as `pipetrain up` starts them.
  std::string AddCpuWorker(int port, const std::string& host, int64_t ram) {
    v1::RegisterWorkerRequest request;
    request.set_data_address("127.0.0.1:" + std::to_string(port));
    request.mutable_device()->set_hostname(host);
    request.mutable_device()->set_memory_bytes(ram);
    request.mutable_device()->set_memory_limit_bytes(ram);
    return registry_.Register(request).value().worker_id();
  }

  // A worker on `host` computing on GPU `gpu`, with NCCL id `nccl_id`.
  std::string AddGpuWorker(int port, const std::string& host, int gpu, const std::string& nccl_id) {
    v1::RegisterWorkerRequest request;
    request.set_data_address("127.0.0.1:" + std::to_string(port));
    request.mutable_device()->set_hostname(host);
    request.mutable_device()->set_gpu_index(gpu);
    request.mutable_device()->set_nccl_unique_id(nccl_id);
    return registry_.Register(request).value().worker_id();
  }

  // A worker that computes on a GPU (DeviceInfo.gpu_model set).
  std::string AddGpuModelWorker(int port) {
    return registry_.Register(GpuWorkerRequest(port)).value().worker_id();
  }

  // Answers every profile request with FakeProfile(), counting them in
  // `*calls` (which must outlive the manager's use), for tests of whether
  // a job was profiled.
  void AnswerProfilesCounting(int* calls) {
    jobs_.SetProfileFetcher([calls](const std::string&, const std::string&,
                                    const v1::ProfileRequest&) -> absl::StatusOr<v1::ModelProfile> {
      ++*calls;
      return FakeProfile();
    });
  }

  v1::Assignment AssignmentOf(const std::string& worker) {
    auto a = hub_.Newer(worker, 0);
    EXPECT_TRUE(a.has_value()) << worker;
    return a.has_value() ? a->assignment : v1::Assignment();
  }

  // `worker`'s report of `iteration` of `job`'s first plan.
  static v1::ReportProgressRequest IterationReport(const std::string& worker,
                                                   const std::string& job, int64_t iteration,
                                                   const std::vector<float>& losses,
                                                   bool finished = false) {
    v1::ReportProgressRequest r;
    r.set_worker_id(worker);
    r.set_job_id(job);
    r.set_plan_version(1);
    r.set_iteration(iteration);
    for (float l : losses) r.add_micro_batch_losses(l);
    r.set_finished(finished);
    return r;
  }
  // A traced step `iteration` of a program of `instructions`: each
  // instruction in turn, 1 ms each.
  static void FillTrace(int64_t iteration, int instructions, v1::StepTrace* trace) {
    trace->set_iteration(iteration);
    trace->set_seconds(0.001 * instructions);
    for (int i = 0; i < instructions; ++i) {
      v1::InstructionTiming* t = trace->add_instructions();
      t->set_instruction(i);
      t->set_start_seconds(0.001 * i);
      t->set_end_seconds(0.001 * (i + 1));
    }
  }
  // A start-barrier report of `worker` for plan 1 of `job`.
  static v1::ReportProgressRequest ReadyReport(const std::string& worker, const std::string& job) {
    v1::ReportProgressRequest r;
    r.set_job_id(job);
    r.set_plan_version(1);
    r.set_ready(true);
    r.set_worker_id(worker);
    return r;
  }

  void Report(const std::string& worker, const std::string& job, int64_t iteration,
              std::vector<float> losses, bool finished) {
    ASSERT_TRUE(
        jobs_.ReportProgress(IterationReport(worker, job, iteration, losses, finished)).ok());
    background_.RunAll();
  }

  // `worker`, running the whole of a one-stage job, uploads every tensor
  // of `model` whole.
  void UploadEveryTensor(const std::string& worker, const std::string& job,
                         const GptConfig& model) {
    for (int u = 0; u < NumUnits(model); ++u) {
      for (const ParameterShape& p : UnitParameterShapes(model, u)) {
        ASSERT_TRUE(jobs_.AddWeightsChunk(WholeTensor(worker, job, p)).ok()) << p.name;
      }
    }
  }

  // A one-stage job's whole upload by `worker`: every tensor, the last
  // step's report (iteration 2, losses), and the end of the upload.
  void FinishUpload(const std::string& worker, const std::string& job, const GptConfig& model) {
    ASSERT_NO_FATAL_FAILURE(UploadEveryTensor(worker, job, model));
    Report(worker, job, 2, {1.0f, 1.0f}, true);
    ASSERT_TRUE(jobs_.FinishWeights(worker, job).ok());
  }

  // Answers every profile request with FakeProfile() once `release` is
  // notified: the job profiled meanwhile stays PROFILING.
  void HoldProfilesUntil(absl::Notification* release) {
    jobs_.SetProfileFetcher(
        [release](const std::string&, const std::string&,
                  const v1::ProfileRequest&) -> absl::StatusOr<v1::ModelProfile> {
          release->WaitForNotification();
          return FakeProfile();
        });
  }

  // Places what can be placed, planning included.
  void Schedule() {
    jobs_.ScheduleQueued();
    background_.RunAll();
  }
  // Submits, and plans what that placed: the job as it is then.
  absl::StatusOr<v1::Job> Submit(const v1::JobSpec& spec) {
    absl::StatusOr<v1::Job> job = jobs_.Submit(spec);
    background_.RunAll();
    if (!job.ok()) return job;
    return jobs_.Get(job->id());
  }
  // A two-stage "auto" job on workers 7001 and 7002 whose profiling fails
  // with `error`, submitted and planned: its id.
  std::string SubmitWithFailingProfiler(const absl::Status& error) {
    jobs_.SetProfileFetcher(
        [error](const std::string&, const std::string&,
                const v1::ProfileRequest&) -> absl::StatusOr<v1::ModelProfile> { return error; });
    AddWorker(7001);
    AddWorker(7002);
    v1::JobSpec spec = SmallSpec(2);
    spec.mutable_parallelism()->set_solver("auto");
    const std::string id = Submit(spec).value().id();
    jobs_.AwaitProfiling();
    background_.RunAll();
    return id;
  }

  FakeClock clock_;
  WorkerRegistry registry_;
  AssignmentHub hub_;
  BackgroundQueue background_;
  int weights_synced_ = 0;  // finished jobs' weights files synced
  JobManager jobs_;
};

// A worker the registry evicts (its address unseen for long; it comes back
// under another id) leaves no assignment in the hub: the next Submit's
// pruning drops it, so the hub does not grow with every address a worker
// ever had.
TEST(JobManagerPruneTest, EvictedWorker_ItsAssignmentIsDropped) {
  FakeClock clock;
  WorkerRegistry::Options options{"", absl::Seconds(1), absl::Seconds(5), &clock};
  options.max_workers = 2;
  WorkerRegistry registry(options);
  AssignmentHub hub;
  JobManager jobs(&registry, &hub, &clock, JobManagerOptions{.output_dir = OutputDir()});
  auto add = [&](int port) {
    v1::RegisterWorkerRequest request;
    request.set_data_address("127.0.0.1:" + std::to_string(port));
    return registry.Register(request).value();
  };
  const v1::RegisterWorkerResponse first = add(7001);
  add(7002);
  const std::string id = jobs.Submit(SmallSpec(1)).value().id();
  jobs.AwaitBackgroundWork();  // the default runner: the manager's planning thread
  ASSERT_TRUE(hub.Newer(first.worker_id(), 0).has_value());
  ASSERT_TRUE(jobs.Cancel(id).ok());
  registry.MarkLost(first.worker_id(), first.incarnation(), "pod deleted");
  clock.Advance(absl::Seconds(1));
  add(7003);  // the registry is full: the lost worker's entry goes
  ASSERT_EQ(registry.Get(first.worker_id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(hub.Newer(first.worker_id(), 0).has_value());  // until the next prune
  ASSERT_TRUE(jobs.Submit(SmallSpec(1)).ok());
  EXPECT_FALSE(hub.Newer(first.worker_id(), 0).has_value());
}

// Creation times strictly increase, though the clock steps back: list
// pages resume after the last job's creation time, and a later job dated
// before an earlier one could be skipped. The list follows them.
TEST_F(JobManagerTest, Submit_ClockStepsBack_CreationTimesStillIncrease) {
  const std::string a = Submit(SmallSpec(1)).value().id();
  clock_.Set(clock_.Now() - absl::Seconds(30));
  const std::string b = Submit(SmallSpec(1)).value().id();
  const std::string c = Submit(SmallSpec(1)).value().id();
  const auto created = [this](const std::string& id) {
    return absl::ToUnixNanos(FromProtoTimestamp(jobs_.Get(id).value().create_time()));
  };
  EXPECT_LT(created(a), created(b));
  EXPECT_LT(created(b), created(c));
  std::vector<std::string> listed;
  for (const JobManager::JobSummary& job : jobs_.Summaries()) listed.push_back(job.id);
  EXPECT_EQ(listed, (std::vector<std::string>{a, b, c}));
}

// The job after `last` in `jobs`' list (the first for ""), and whether
// another follows it: a page of one, resumed as a page token resumes
// (page_cursor.h: after the last job its page returned).
std::pair<std::string, bool> PageOfOneAfter(const JobManager& jobs, const std::string& last) {
  const std::vector<JobManager::JobSummary> listed = jobs.Summaries();
  size_t next = 0;
  if (!last.empty()) {
    while (next < listed.size() && listed[next].id != last) ++next;
    ++next;
  }
  if (next >= listed.size()) return {"", false};
  return {listed[next].id, next + 1 < listed.size()};
}

// Submits save in parallel (REST's handler threads): c and d, saved while
// the older b's save is held, are listed only after b. Listed at once, a
// client paging meanwhile got a page ending at c with a token, and the
// next page resumed after c, past b (listed before c once saved).
TEST_F(JobManagerTest, Submit_SavedBeforeAnOlderSubmit_ListedAfterItSoPagesSkipNone) {
  HeldCommitStore store;
  CoordinatorState state(&store);
  // The newer submits settled: waiting to be listed, or listed and returned
  // (a std::mutex: TSan sees its hand-offs, not absl::Notification's).
  std::mutex mu;
  std::condition_variable changed;
  std::set<std::string> settled;
  const auto settle = [&](const std::string& id) {
    std::lock_guard<std::mutex> lock(mu);
    settled.insert(id);
    changed.notify_all();
  };
  JobManagerOptions options{
      .id_epoch = "e9", .state = &state, .background_runner = background_.Runner()};
  options.before_submit_waits = settle;
  JobManager jobs(&registry_, &hub_, &clock_, options);
  const std::string a1 = jobs.Submit(SmallSpec(1)).value().id();
  const std::string a2 = jobs.Submit(SmallSpec(1)).value().id();
  jobs.FlushIo();
  store.hold = true;
  std::string b, c, d;
  std::thread older([&jobs, &b] { b = jobs.Submit(SmallSpec(1)).value().id(); });
  store.entered.get_future().wait();  // b created, its save held
  // Submits on a thread of its own, and returns once that submit settled.
  const auto submit_newer = [&](std::string* id) {
    std::unique_lock<std::mutex> lock(mu);
    const size_t before = settled.size();
    std::thread submit([&jobs, &settle, id] {
      const absl::StatusOr<v1::Job> job = jobs.Submit(SmallSpec(1));
      EXPECT_TRUE(job.ok()) << job.status();
      *id = job.ok() ? job->id() : "failed";
      settle(*id);
    });
    changed.wait(lock, [&] { return settled.size() > before; });
    return submit;
  };
  std::thread newer_c = submit_newer(&c);
  std::thread newer_d = submit_newer(&d);
  std::vector<std::string> listed_meanwhile;
  for (const JobManager::JobSummary& job : jobs.Summaries()) listed_meanwhile.push_back(job.id);
  EXPECT_EQ(listed_meanwhile, (std::vector<std::string>{a1, a2}));
  // A client pages through the list meanwhile, up to its last job but one
  // (a token remains), then follows the tokens once b's save is in.
  std::vector<std::string> seen;
  std::string last;
  bool more = true;
  for (size_t i = 0; i + 1 < listed_meanwhile.size(); ++i) {
    std::tie(last, more) = PageOfOneAfter(jobs, last);
    seen.push_back(last);
  }
  store.release.set_value();
  older.join();
  newer_c.join();
  newer_d.join();
  for (int pages = 0; more && pages < 10; ++pages) {
    std::tie(last, more) = PageOfOneAfter(jobs, last);
    seen.push_back(last);
  }
  EXPECT_EQ(seen, (std::vector<std::string>{a1, a2, b, c, d}));
}

TEST_F(JobManagerTest, Submit_InvalidSpec_IsInvalidArgumentNamingTheField) {
  v1::JobSpec spec = SmallSpec(2);
  spec.mutable_model()->set_n_head(3);
  auto job = Submit(spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(job.status().message().substr(0, 16), "spec.model.n_hea");
  EXPECT_TRUE(jobs_.List().empty());
}

// The data-plane keys of one plan's assignments (all its workers, any
// order) fit together: the worker at data-plane index a (replica, stage,
// tensor rank innermost, as the worker computes it from its assignment)
// proves its streams to index b with the link key b derives from its own
// receive key (common/data_plane_keys.h), and every index occurs once.
void ExpectDataPlaneKeysFit(const std::vector<v1::Assignment>& assignments,
                            const std::string& data_job) {
  std::map<int, const v1::Assignment*> by_index;
  for (const v1::Assignment& a : assignments) {
    const int index =
        (a.replica() * a.num_stages() + a.stage()) * std::max(1, a.tensor_parallel()) +
        a.tensor_rank();
    EXPECT_TRUE(by_index.emplace(index, &a).second) << "index " << index << " twice";
  }
  const int n = static_cast<int>(assignments.size());
  ASSERT_EQ(by_index.size(), assignments.size());
  ASSERT_EQ(by_index.rbegin()->first, n - 1);
  for (const auto& [a, from] : by_index) {
    ASSERT_EQ(from->data_plane_send_keys_size(), n);
    EXPECT_EQ(from->data_plane_receive_key().size(), kDataPlaneKeyBytes);
    for (const auto& [b, to] : by_index) {
      EXPECT_EQ(from->data_plane_send_keys(b),
                DataPlaneLinkKey(to->data_plane_receive_key(), data_job, a))
          << a << " -> " << b;
      if (a != b) {
        EXPECT_NE(from->data_plane_receive_key(), to->data_plane_receive_key());
      }
    }
  }
}

// READY workers of both kinds: a data-parallel job is placed on a set
// whose every stage is of one kind (its planning refuses replicas that mix
// GPUs and CPUs); the first two in id order, a GPU and a CPU, failed it.
// While no such set is READY it waits, saying so.
TEST_F(JobManagerTest, DataParallel_MixedKindsReady_PlacedOnOneKindPerStage) {
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_parallelism()->set_data(2);
  const std::string gpu1 = AddGpuModelWorker(7001);
  const std::string cpu1 = AddWorker(7002);
  const std::string id = Submit(spec).value().id();
  EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(jobs_.Get(id).value().reason(),
            "waiting for 2 READY workers whose kinds (GPU or CPU) give each stage's 2 replicas "
            "and tensor ranks one kind (2 READY, in counts that do not)");
  const std::string gpu2 = AddGpuModelWorker(7003);
  Schedule();
  const v1::Job job = jobs_.Get(id).value();
  ASSERT_NE(job.state(), v1::JOB_STATE_FAILED) << job.reason();
  EXPECT_EQ(std::vector<std::string>(job.worker_ids().begin(), job.worker_ids().end()),
            (std::vector<std::string>{gpu1, gpu2}));
}

// spec.parallelism.data 2 x 2 stages: four workers, replica r's stage s on
// worker r * 2 + s, every assignment naming all four data-plane peers and
// its replica's program of one micro-batch (2 / 2).
TEST_F(JobManagerTest, DataParallel_PlacesReplicasOfTheSamePlan) {
  v1::JobSpec spec = SmallSpec(2);
  spec.mutable_parallelism()->set_data(2);
  const std::string id = Submit(spec).value().id();
  EXPECT_EQ(jobs_.Get(id).value().reason(), "waiting for 4 READY workers (0 ready)");
  std::vector<std::string> w;
  for (int k = 0; k < 4; ++k) w.push_back(AddWorker(7001 + k));
  Schedule();
  const v1::Job job = jobs_.Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(std::vector<std::string>(job.worker_ids().begin(), job.worker_ids().end()), w);
  const v1::Plan plan = jobs_.GetPlan(id).value();
  EXPECT_EQ(plan.data_parallel(), 2);
  EXPECT_EQ(plan.micro_batches(), 1);
  ASSERT_EQ(plan.stages_size(), 4);
  for (int g = 0; g < 4; ++g) {
    SCOPED_TRACE(g);
    const v1::Assignment a = AssignmentOf(w[g]);
    EXPECT_EQ(a.stage(), g % 2);
    EXPECT_EQ(a.num_stages(), 2);
    EXPECT_EQ(a.replica(), g / 2);
    EXPECT_EQ(a.replicas(), 2);
    ASSERT_EQ(a.peer_addresses_size(), 4);
    EXPECT_EQ(a.peer_addresses(3), "127.0.0.1:7004");
    EXPECT_EQ(std::vector<int>(a.optimizer_stages().begin(), a.optimizer_stages().end()),
              (std::vector<int>{0, 1}));
    const v1::Assignment twin = AssignmentOf(w[g % 2]);  // replica 0's copy
    EXPECT_EQ(a.program().SerializeAsString(), twin.program().SerializeAsString());
    EXPECT_EQ(a.forward_units().SerializeAsString(), twin.forward_units().SerializeAsString());
    EXPECT_EQ(plan.stages(g).worker_id(), w[g]);
  }
  std::vector<v1::Assignment> assignments;
  for (const std::string& worker : w) assignments.push_back(AssignmentOf(worker));
  ExpectDataPlaneKeysFit(assignments, DataPlaneJobId(id, job.plan_version()));
  int forwards = 0;  // one micro-batch per replica
  const v1::Assignment first = AssignmentOf(w[0]);
  for (const v1::Instruction& in : first.program().instructions()) {
    forwards += in.has_forward();
  }
  EXPECT_EQ(forwards, 1);
}

// spec.parallelism.data 0 (auto) over 4 workers: the layout is chosen when
// the job is placed, from every layout's simulated step (1 MB/s links make
// all-reducing the model far costlier than the pipeline's activations, so
// one 4-stage pipeline wins); the job's spec then names it, and the plan
// history says what each layout predicted.
TEST_F(JobManagerTest, DataParallelAuto_LayoutChosenWhenPlacedThenAsIfNamed) {
  v1::JobSpec spec = SmallSpec(0);
  spec.mutable_training()->set_micro_batches(4);
  spec.mutable_parallelism()->set_data(0);
  spec.mutable_parallelism()->set_workers(4);
  const std::string id = Submit(spec).value().id();
  v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(job.reason(), "waiting for 4 READY workers (0 ready)");
  EXPECT_EQ(job.spec().parallelism().data(), 0);
  EXPECT_EQ(job.spec().parallelism().workers(), 4);
  std::vector<std::string> w;
  for (int k = 0; k < 4; ++k) {
    v1::RegisterWorkerRequest request;
    request.set_data_address("127.0.0.1:" + std::to_string(7801 + k));
    request.mutable_device()->set_link_bandwidth_bytes_per_second(1e6);
    request.mutable_device()->set_link_latency_seconds(1e-4);
    w.push_back(registry_.Register(request).value().worker_id());
  }
  Schedule();
  job = jobs_.Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(job.spec().parallelism().data(), 1);
  EXPECT_EQ(job.spec().parallelism().stages(), 4);
  EXPECT_FALSE(job.spec().parallelism().has_workers());
  EXPECT_EQ(job.spec().elastic().max_workers(), 4);
  const v1::Plan plan = jobs_.GetPlan(id).value();
  EXPECT_EQ(plan.data_parallel(), 1);
  EXPECT_EQ(plan.stages_size(), 4);
  EXPECT_EQ(plan.version(), 1);
  ASSERT_EQ(job.plan_history_size(), 1);
  const std::string& reason = job.plan_history(0).reason();
  EXPECT_TRUE(absl::StartsWith(reason,
                               "initial plan; 1 replica x 4 stages chosen by "
                               "spec.parallelism.data 0 (auto); predicted s/step: 1 x 4 "))
      << reason;
  EXPECT_TRUE(absl::StrContains(reason, ", 2 x 2 ")) << reason;
  EXPECT_TRUE(absl::StrContains(reason, ", 4 x 1 ")) << reason;
  for (int g = 0; g < 4; ++g) {
    const v1::Assignment a = AssignmentOf(w[g]);
    EXPECT_EQ(a.replicas(), 1);
    EXPECT_EQ(a.num_stages(), 4);
    EXPECT_EQ(a.stage(), g);
    EXPECT_EQ(a.spec().parallelism().data(), 1);
  }
}

// Selective stage compression: the named stage's workers, in every
// replica, get the PowerSGD rank; the others all-reduce exactly. Auto
// picks from the simulation and says which in the plan.
TEST_F(JobManagerTest, DataParallel_CompressedStagesGetTheirRank) {
  std::vector<std::string> w;
  for (int k = 0; k < 4; ++k) w.push_back(AddWorker(7201 + k));
  for (const bool automatic : {false, true}) {
    SCOPED_TRACE(automatic);
    v1::JobSpec spec = SmallSpec(2);
    spec.mutable_parallelism()->set_data(2);
    spec.mutable_compression()->mutable_data_parallel()->set_codec("powersgd:rank=3");
    if (!automatic) spec.mutable_compression()->mutable_data_parallel()->add_stages(1);
    const std::string id = Submit(spec).value().id();
    Schedule();
    const v1::Job job = jobs_.Get(id).value();
    ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
    const v1::Plan plan = jobs_.GetPlan(id).value();
    EXPECT_EQ(plan.data_parallel_powersgd_rank(), 3);
    const std::vector<int> chosen(plan.data_parallel_compressed_stages().begin(),
                                  plan.data_parallel_compressed_stages().end());
    if (!automatic) {
      EXPECT_EQ(chosen, std::vector<int>{1});
    }
    for (int g = 0; g < 4; ++g) {
      const bool compressed = std::find(chosen.begin(), chosen.end(), g % 2) != chosen.end();
      EXPECT_EQ(AssignmentOf(job.worker_ids(g)).data_parallel_powersgd_rank(), compressed ? 3 : 0)
          << g;
    }
    ASSERT_TRUE(jobs_.Cancel(id).ok());
  }
}

// Workers that emulate their links (--emulate-link) are planned with the
// slowest of them; one without emulation means the coordinator's
// --network, or the assumed network.
TEST_F(JobManagerTest, EmulatedLinks_PlannedWithTheSlowest) {
  auto add = [this](int port, double bandwidth, double latency) {
    v1::RegisterWorkerRequest request;
    request.set_data_address("127.0.0.1:" + std::to_string(port));
    request.mutable_device()->set_link_bandwidth_bytes_per_second(bandwidth);
    request.mutable_device()->set_link_latency_seconds(latency);
    return registry_.Register(request).value().worker_id();
  };
  add(7301, 1.25e8, 0.0005);
  add(7302, 1.25e9, 0.0001);
  const std::string id = Submit(SmallSpec(2)).value().id();
  Schedule();
  EXPECT_TRUE(absl::StrContains(jobs_.GetPlan(id).value().profile_source(),
                                "links modelled at 0.125 GB/s and 500 us latency"))
      << jobs_.GetPlan(id).value().profile_source();
  ASSERT_TRUE(jobs_.Cancel(id).ok());
  add(7303, 0, 0);  // a real network
  v1::JobSpec three = SmallSpec(3);
  const std::string id3 = Submit(three).value().id();
  Schedule();
  EXPECT_TRUE(
      absl::StrContains(jobs_.GetPlan(id3).value().profile_source(), "links modelled at 1.25 GB/s"))
      << jobs_.GetPlan(id3).value().profile_source();
}

// /metrics reads Summaries: every job in submission order with its state,
// progress and tokens per step, and nothing else copied.
TEST_F(JobManagerTest, Summaries_EveryJobInOrderWithWhatMetricsRead) {
  AddWorker(7601);
  const std::string first = Submit(SmallSpec(1)).value().id();
  const std::string second = Submit(SmallSpec(1)).value().id();
  Schedule();
  const std::vector<JobManager::JobSummary> summaries = jobs_.Summaries();
  ASSERT_EQ(summaries.size(), 2u);
  EXPECT_EQ(summaries[0].id, first);
  EXPECT_EQ(summaries[1].id, second);
  const v1::Job job = jobs_.Get(first).value();
  EXPECT_EQ(summaries[0].state, job.state());
  EXPECT_EQ(summaries[0].step, job.progress().step());
  EXPECT_EQ(summaries[0].tokens_per_step,
            double(job.spec().training().batch_size()) * job.spec().training().seq_len());
  EXPECT_GT(summaries[0].tokens_per_step, 0);
  EXPECT_EQ(summaries[1].state, jobs_.Get(second).value().state());
}

// Without emulated links, jobs are planned over the coordinator's --network
// (options.network) when given, and the plan says where its links came
// from; emulating workers are still planned over their own links.
TEST(JobManagerNetworkTest, DeclaredNetwork_PlannedOverAndNamed) {
  auto plan_on = [](std::optional<LinkModel> network, double emulated_bandwidth,
                    bool one_unemulated = false) {
    FakeClock clock;
    WorkerRegistry registry(
        WorkerRegistry::Options{"", absl::Seconds(1), absl::Seconds(5), &clock});
    AssignmentHub hub;
    JobManager jobs(&registry, &hub, &clock, JobManagerOptions{.network = network});
    for (int port : {7501, 7502}) {
      v1::RegisterWorkerRequest request;
      request.set_data_address("127.0.0.1:" + std::to_string(port));
      if (emulated_bandwidth > 0 && !(one_unemulated && port == 7502)) {
        request.mutable_device()->set_link_bandwidth_bytes_per_second(emulated_bandwidth);
        request.mutable_device()->set_link_latency_seconds(0.0001);
      }
      EXPECT_TRUE(registry.Register(request).ok());
    }
    const std::string id = jobs.Submit(SmallSpec(2)).value().id();
    jobs.AwaitBackgroundWork();
    const v1::Plan plan = jobs.GetPlan(id).value();
    EXPECT_TRUE(jobs.Cancel(id).ok());
    return plan;
  };
  const v1::Plan assumed = plan_on(std::nullopt, 0);
  EXPECT_TRUE(absl::StrContains(assumed.profile_source(),
                                "links modelled at 1.25 GB/s and 50 us latency (assumed, not "
                                "measured: the coordinator's --network sets it)"))
      << assumed.profile_source();
  const LinkModel slow{1.25e6, absl::Milliseconds(2)};  // 10 Mbit/s
  const v1::Plan declared = plan_on(slow, 0);
  EXPECT_TRUE(absl::StrContains(declared.profile_source(),
                                "links modelled at 0.00125 GB/s and 2000 us latency (the "
                                "coordinator's --network)"))
      << declared.profile_source();
  // Activations cross the slow link: the predicted step is longer.
  EXPECT_GT(declared.predicted_iteration_seconds(), assumed.predicted_iteration_seconds());
  const v1::Plan emulated = plan_on(slow, 1.25e9);
  EXPECT_TRUE(absl::StrContains(emulated.profile_source(),
                                "links modelled at 1.25 GB/s and 100 us latency (as the workers "
                                "emulate them)"))
      << emulated.profile_source();
  // One worker on the real network: the declared network, not the others'.
  const v1::Plan mixed = plan_on(slow, 1.25e9, /*one_unemulated=*/true);
  EXPECT_TRUE(absl::StrContains(mixed.profile_source(),
                                "links modelled at 0.00125 GB/s and 2000 us latency (the "
                                "coordinator's --network)"))
      << mixed.profile_source();
}

// Workers report their data plane's cost per message; the plan adds each
// host's best, then the slowest host's, to its links and predicts a longer
// step than with free messages.
TEST_F(JobManagerTest, DataPlaneCost_HostsBestThenSlowestHostAddedToTheLinks) {
  auto add = [this](int port, const std::string& host, double overhead, double rate) {
    v1::RegisterWorkerRequest request;
    request.set_data_address("127.0.0.1:" + std::to_string(port));
    request.mutable_device()->set_hostname(host);
    request.mutable_device()->set_link_bandwidth_bytes_per_second(1.25e8);
    request.mutable_device()->set_link_latency_seconds(0.0005);
    request.mutable_device()->set_data_plane_overhead_seconds(overhead);
    request.mutable_device()->set_data_plane_bytes_per_second(rate);
    return registry_.Register(request).value().worker_id();
  };
  // Not measured: none modelled.
  const std::vector<std::string> unmeasured = {add(7401, "a", 0, 0), add(7402, "a", 0, 0),
                                               add(7406, "b", 0, 0)};
  const std::string free_id = Submit(SmallSpec(3)).value().id();
  Schedule();
  const v1::Plan free_plan = jobs_.GetPlan(free_id).value();
  EXPECT_FALSE(absl::StrContains(free_plan.profile_source(), "data plane"))
      << free_plan.profile_source();
  ASSERT_TRUE(jobs_.Cancel(free_id).ok());
  for (const std::string& w : unmeasured) ASSERT_TRUE(registry_.Deregister(w, 1).ok());
  // Host a: 0.2 ms / 1 GB/s and 0.1 ms / 0.5 GB/s -> 0.1 ms / 1 GB/s.
  // Host b: 0.15 ms / 2 GB/s. The slowest: 0.15 ms and 1 GB/s.
  add(7403, "a", 2e-4, 1e9);
  add(7404, "a", 1e-4, 5e8);
  add(7405, "b", 1.5e-4, 2e9);
  const std::string id = Submit(SmallSpec(3)).value().id();
  Schedule();
  const v1::Plan plan = jobs_.GetPlan(id).value();
  EXPECT_TRUE(absl::StrContains(plan.profile_source(), "data plane 0.15 ms + 1 GB/s per message"))
      << plan.profile_source();
  EXPECT_TRUE(absl::StrContains(plan.profile_source(), "links modelled at 0.125 GB/s"))
      << plan.profile_source();
  EXPECT_GT(plan.predicted_iteration_seconds(), free_plan.predicted_iteration_seconds());
  ASSERT_TRUE(jobs_.Cancel(id).ok());
}

// Workers report their --mailbox-limit; the plan keeps every tensor within
// the smallest (MaxPlannedTensorBytes). SmallSpec(2)'s stage output is one
// micro-batch of 2 x 8 x 16 floats, 1024 bytes: a 1000-byte mailbox
// anywhere in the job refuses it, and the job fails naming the flag.
TEST_F(JobManagerTest, MailboxLimit_SmallestOfTheJobsWorkersBoundsThePlansTensors) {
  auto add = [this](int port, int64_t mailbox_limit) {
    v1::RegisterWorkerRequest request;
    request.set_data_address("127.0.0.1:" + std::to_string(port));
    request.mutable_device()->set_mailbox_limit_bytes(mailbox_limit);
    const std::string id = registry_.Register(request).value().worker_id();
    EXPECT_EQ(registry_.Get(id).value().device().mailbox_limit_bytes(), mailbox_limit);
    return id;
  };
  // Room for the 1024-byte stage output and the tied embedding's gradient
  // (vocab x dModel floats), which the two stages exchange each step.
  const std::vector<std::string> fits = {add(7401, int64_t{1} << 20), add(7402, 0)};
  const std::string planned = Submit(SmallSpec(2)).value().id();
  Schedule();
  EXPECT_EQ(jobs_.Get(planned).value().state(), v1::JOB_STATE_RUNNING)
      << jobs_.Get(planned).value().reason();
  ASSERT_TRUE(jobs_.Cancel(planned).ok());
  for (const std::string& w : fits) ASSERT_TRUE(registry_.Deregister(w, 1).ok());
  add(7403, int64_t{1} << 20);
  add(7404, 1000);
  const std::string refused = Submit(SmallSpec(2)).value().id();
  Schedule();
  const v1::Job job = jobs_.Get(refused).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(job.reason(), "as one tensor of 1024 bytes (0.00 GiB) per "
                                              "micro-batch, above the smallest --mailbox-limit "
                                              "among the job's workers, 1000 bytes"))
      << job.reason();
}

// Replica 0 speaks for all: other replicas' losses are not recorded, they
// may not checkpoint, and the job succeeds only when every replica's
// weight digest equals replica 0's.
TEST_F(JobManagerTest, DataParallel_ReplicaZeroReportsAndDivergedReplicasFailTheJob) {
  const std::string w0 = AddWorker(7100), w1 = AddWorker(7101);
  for (const bool diverge : {false, true}) {
    SCOPED_TRACE(diverge);
    v1::JobSpec spec = SmallSpec(1);
    spec.mutable_parallelism()->set_data(2);
    const std::string id = Submit(spec).value().id();
    Schedule();
    const v1::Job running = jobs_.Get(id).value();
    ASSERT_EQ(running.state(), v1::JOB_STATE_RUNNING);
    ASSERT_EQ(std::vector<std::string>(running.worker_ids().begin(), running.worker_ids().end()),
              (std::vector<std::string>{w0, w1}));
    v1::ReportProgressRequest checkpoint;
    checkpoint.set_worker_id(w1);
    checkpoint.set_job_id(id);
    checkpoint.set_plan_version(1);
    checkpoint.mutable_checkpoint()->set_step(1);
    EXPECT_EQ(jobs_.ReportProgress(checkpoint).status().code(),
              absl::StatusCode::kPermissionDenied);
    for (int64_t it = 0; it < 3; ++it) {
      const bool last = it == 2;
      for (const std::string& w : {w0, w1}) {
        v1::ReportProgressRequest r;
        r.set_worker_id(w);
        r.set_job_id(id);
        r.set_plan_version(1);
        r.set_iteration(it);
        // Both loss stages hold every replica's losses; replica 1's say 9.
        r.add_micro_batch_losses(w == w0 ? 1.0f : 9.0f);
        r.add_micro_batch_losses(w == w0 ? 2.0f : 9.0f);
        r.set_finished(last);
        if (last) {
          // Only a SHA-256 in hex: a digest is quoted, cut, in the reason
          // (11 bytes and a two-byte character would be cut inside it).
          r.set_weights_digest(std::string(11, 'b') + "\xc3\xa9");
          EXPECT_EQ(jobs_.ReportProgress(r).status().code(), absl::StatusCode::kInvalidArgument);
          r.set_weights_digest(diverge && w == w1 ? std::string(64, 'b') : std::string(64, 'a'));
        }
        ASSERT_TRUE(jobs_.ReportProgress(r).ok());
      }
    }
    const v1::Job job = jobs_.Get(id).value();
    EXPECT_EQ(std::vector<float>(job.progress().loss_history().begin(),
                                 job.progress().loss_history().end()),
              (std::vector<float>{1.5f, 1.5f, 1.5f}));
    if (diverge) {
      EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
      v1::Job parsed;
      EXPECT_TRUE(parsed.ParseFromString(job.SerializeAsString())) << "reason not UTF-8";
      EXPECT_TRUE(absl::StrContains(job.reason(),
                                    "data-parallel replicas diverged: stage 0 of "
                                    "replica 1"))
          << job.reason();
    } else {
      EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
    }
  }
}

// Tensor parallelism: rank 0 of a stage writes its checkpoint files and
// reports them; another rank's report (the same units) could replace rank
// 0's checksums with ones no file has, or push its pending steps out.
TEST_F(JobManagerTest, TensorParallel_OnlyRankZeroReportsCheckpoints) {
  AddWorker(7110), AddWorker(7111);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_parallelism()->set_tensor(2);
  const std::string id = Submit(spec).value().id();
  Schedule();
  ASSERT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  const v1::Plan plan = jobs_.GetPlan(id).value();
  ASSERT_EQ(plan.stages_size(), 2);  // stage 0's tensor ranks 0 and 1
  v1::ReportProgressRequest checkpoint;
  checkpoint.set_worker_id(plan.stages(1).worker_id());
  checkpoint.set_job_id(id);
  checkpoint.set_plan_version(plan.version());
  checkpoint.mutable_checkpoint()->set_step(1);
  const absl::Status refused = jobs_.ReportProgress(checkpoint).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "tensor rank 1")) << refused;
  ASSERT_TRUE(jobs_.Cancel(id).ok());
}

// A job grows only at a checkpoint: elastic.max_workers above the stages
// without checkpoints would be ignored, and is refused naming both fields;
// the default (the stages) passes, and so does growth with checkpoints.
TEST_F(JobManagerTest, Submit_GrowthWithoutCheckpoints_Refused) {
  v1::JobSpec spec = SmallSpec(2);
  spec.mutable_elastic()->set_max_workers(3);
  const absl::Status refused = Submit(spec).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_TRUE(absl::StartsWith(refused.message(), "spec.elastic.max_workers: 3 is above "))
      << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "spec.checkpoint.interval_steps")) << refused;
  spec.mutable_elastic()->set_max_workers(2);
  EXPECT_TRUE(Submit(spec).ok());
  spec.mutable_elastic()->set_max_workers(3);
  spec.mutable_checkpoint()->set_interval_steps(5);
  EXPECT_TRUE(Submit(spec).ok());
}

// training.min_lr floors the cosine schedule; with the constant one it
// would be ignored, and is refused.
TEST_F(JobManagerTest, Submit_MinLrWithTheConstantSchedule_Refused) {
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_training()->set_lr(1e-3f);
  spec.mutable_training()->set_min_lr(1e-4f);
  const absl::Status refused = Submit(spec).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "spec.training.min_lr")) << refused;
  spec.mutable_training()->set_lr_schedule("cosine");
  const absl::StatusOr<v1::Job> job = Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(jobs_.Cancel(job->id()).ok());
}

TEST_F(JobManagerTest, Submit_WaitsForWorkersThenRunsWithCompiledPrograms) {
  const std::string w1 = AddWorker(7001);
  v1::Job job = Submit(SmallSpec(2)).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(job.reason(), "waiting for 2 READY workers (1 ready)");
  EXPECT_EQ(jobs_.GetPlan(job.id()).status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string w2 = AddWorker(7002);
  Schedule();
  job = jobs_.Get(job.id()).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(std::vector<std::string>(job.worker_ids().begin(), job.worker_ids().end()),
            (std::vector<std::string>{w1, w2}));
  v1::Plan plan = jobs_.GetPlan(job.id()).value();
  ASSERT_EQ(plan.stages_size(), 2);
  EXPECT_EQ(plan.stages(0).forward().end(), plan.stages(1).forward().begin());
  const v1::Assignment a2 = AssignmentOf(w2);
  EXPECT_EQ(a2.action(), v1::Assignment::ACTION_RUN);
  EXPECT_EQ(a2.stage(), 1);
  EXPECT_EQ(a2.peer_addresses(0), "127.0.0.1:7001");
  EXPECT_GT(a2.program().instructions_size(), 0);
  EXPECT_EQ(registry_.Get(w1).value().state(), v1::WORKER_STATE_ASSIGNED);
}

// "finished" comes with the job's last step: earlier, a faulty worker's
// report would have ended a 3-step job as SUCCEEDED after one step. It is
// refused, nothing of it applied.
TEST_F(JobManagerTest, Progress_FinishedBeforeTheLastStep_InvalidArgument) {
  const std::string w1 = AddWorker(7001);
  const std::string id = Submit(SmallSpec(1)).value().id();
  const absl::StatusOr<v1::ReportProgressResponse> early =
      jobs_.ReportProgress(IterationReport(w1, id, 0, {2.0f, 2.0f}, /*finished=*/true));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kInvalidArgument) << early.status();
  EXPECT_NE(early.status().message().find(
                "finished: at iteration 0; a stage finishes with the job's last, 2"),
            std::string::npos)
      << early.status();
  background_.RunAll();
  const v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.progress().step(), 0);
  Report(w1, id, 0, {2.0f, 2.0f}, false);
  Report(w1, id, 1, {2.0f, 2.0f}, false);
  Report(w1, id, 2, {1.0f, 1.0f}, true);
  EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_SUCCEEDED);
}

// The first step of a plan includes the workers' start (the corpus read,
// peers connected): tokens per second come from the steps after it.
TEST_F(JobManagerTest, Progress_FirstStepOfAPlan_NotThroughput) {
  const std::string w1 = AddWorker(7001);
  const std::string id = Submit(SmallSpec(1)).value().id();
  clock_.Advance(absl::Seconds(30));  // starting up
  Report(w1, id, 0, {2.0f, 2.0f}, false);
  EXPECT_EQ(jobs_.Get(id).value().progress().tokens_per_second(), 0);
  clock_.Advance(absl::Seconds(2));
  Report(w1, id, 1, {2.0f, 2.0f}, false);
  EXPECT_EQ(jobs_.Get(id).value().progress().tokens_per_second(), 4 * 8 / 2.0);
  // The last step's report waits for the final weights' upload: the job
  // keeps the throughput of the steps before it.
  clock_.Advance(absl::Seconds(60));
  Report(w1, id, 2, {1.0f, 1.0f}, true);
  const v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(job.progress().tokens_per_second(), 4 * 8 / 2.0);
}

TEST_F(JobManagerTest, Progress_AggregatesLossesAndFinishesTheJob) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(SmallSpec(2)).value().id();
  Report(w1, id, 0, {}, false);
  Report(w2, id, 0, {2.0f, 3.0f}, false);
  clock_.Advance(absl::Seconds(2));
  Report(w2, id, 1, {1.0f, 2.0f}, false);
  v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(job.progress().step(), 2);
  EXPECT_EQ(job.progress().loss(), 1.5f);
  EXPECT_EQ(job.progress().loss_history_size(), 2);
  EXPECT_EQ(job.progress().tokens_per_second(), 4 * 8 / 2.0);
  Report(w1, id, 2, {}, true);
  EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING);  // w2 not finished yet
  Report(w2, id, 2, {1.0f, 1.0f}, true);
  EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(registry_.Get(w1).value().state(), v1::WORKER_STATE_READY);
  EXPECT_EQ(AssignmentOf(w1).action(), v1::Assignment::ACTION_STOP);
}

// A worker whose stage finished every step (and uploads nothing) is lost
// while the last stage still works on its last step: a worker stopped as
// its job ends. The job does not need it, so it neither fails (it has no
// checkpoints) nor recovers, and succeeds when the last stage finishes.
TEST_F(JobManagerTest, WorkerLostAfterItsStageFinished_JobStillSucceeds) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(SmallSpec(2)).value().id();
  Report(w1, id, 0, {}, false);
  Report(w2, id, 0, {2.0f, 3.0f}, false);
  Report(w1, id, 1, {}, false);
  Report(w2, id, 1, {1.0f, 2.0f}, false);
  Report(w1, id, 2, {}, true);
  registry_.MarkLost(w1, registry_.Get(w1).value().incarnation(), "scaled away");
  v1::Job job = jobs_.Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  // It is told to stop: its RUN, kept in the hub, would otherwise be what
  // its next incarnation (a restarted process) takes up and runs again.
  EXPECT_EQ(AssignmentOf(w1).action(), v1::Assignment::ACTION_STOP);
  EXPECT_EQ(AddWorker(7001), w1);  // registered again, under its id
  EXPECT_EQ(AssignmentOf(w1).action(), v1::Assignment::ACTION_STOP);
  Report(w2, id, 2, {1.0f, 1.0f}, true);
  job = jobs_.Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  EXPECT_EQ(job.progress().step(), 3);
}

// Losses come only from the stage that computes them: a report of the
// first stage carrying a loss (or a validation loss) is refused whole, and
// the job's loss stays the loss stage's.
TEST_F(JobManagerTest, Progress_LossFromAStageWithoutTheHead_Refused) {
  AddWorker(7001);
  AddWorker(7002);
  const std::string id = Submit(SmallSpec(2)).value().id();
  const v1::Job planned = jobs_.Get(id).value();
  const std::string first = planned.worker_ids(0), last = planned.worker_ids(1);
  Report(last, id, 0, {2.0f, 2.0f}, false);
  absl::Status refused = jobs_.ReportProgress(IterationReport(first, id, 0, {5.0f, 5.0f})).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message(),
            absl::StrCat("ReportProgressRequest.micro_batch_losses: ", first,
                         "'s stage 0 does not run the model's last unit, so it computes no loss"));
  v1::ReportProgressRequest validation = IterationReport(first, id, 0, {});
  validation.set_val_loss(0.5f);
  EXPECT_EQ(jobs_.ReportProgress(validation).status().code(), absl::StatusCode::kInvalidArgument);
  const v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(job.progress().loss(), 2.0f);
  EXPECT_EQ(job.progress().val_step(), 0);
  EXPECT_EQ(job.progress().stage_times(0).steps(), 0);  // nothing of it applied
  Report(first, id, 0, {}, false);                      // its honest report still counts
  EXPECT_EQ(jobs_.Get(id).value().progress().stage_times(0).steps(), 1);
}

// A report that comes again (a worker's retry after a lost answer) is
// answered but counted once: its loss and times are not added twice.
TEST_F(JobManagerTest, Progress_RepeatedReport_CountedOnce) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(SmallSpec(2)).value().id();
  const v1::Job planned = jobs_.Get(id).value();
  const std::string last = planned.worker_ids(1);  // the stage that computes the loss
  v1::ReportProgressRequest r = IterationReport(last, id, 0, {2.0f});
  r.set_busy_seconds(0.5);
  JobManager::ProgressCounted counted;
  ASSERT_TRUE(jobs_.ReportProgress(r, &counted).ok());
  EXPECT_TRUE(counted.stage_time && counted.step);      // what the metrics count
  ASSERT_TRUE(jobs_.ReportProgress(r, &counted).ok());  // again
  EXPECT_FALSE(counted.stage_time || counted.step);
  const v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(job.progress().loss_history_size(), 1);
  EXPECT_EQ(job.progress().stage_times(1).steps(), 1);
  EXPECT_DOUBLE_EQ(job.progress().stage_times(1).busy_seconds(), 0.5);
  r.set_iteration(1);
  ASSERT_TRUE(jobs_.ReportProgress(r).ok());
  EXPECT_EQ(jobs_.Get(id).value().progress().loss_history_size(), 2);
  // A worker that repeats its report in a loop gets at most 10 log lines
  // per 10 s (the limit is process-wide: earlier repeats may have used it).
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(jobs_.ReportProgress(r).ok());
  const std::string logged = ::testing::internal::GetCapturedStderr();
  EXPECT_LE(::pipetrain::testing::LinesWith(logged, "came again"), 10) << logged;
  EXPECT_EQ(jobs_.Get(id).value().progress().loss_history_size(), 2);
  (void)w1;
  (void)w2;
}

// Each worker's reported compute and receive-wait time adds up per worker
// of the current plan (Job.progress.stage_times, in stage order), next to
// the plan's predicted time of its stage; values out of bounds are refused.
TEST_F(JobManagerTest, Progress_StageTimesSumEachWorkersReports) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(SmallSpec(2)).value().id();
  v1::Job job = jobs_.Get(id).value();
  ASSERT_EQ(job.progress().stage_times_size(), 2);
  EXPECT_EQ(job.progress().stage_times(0).worker_id(), job.worker_ids(0));
  EXPECT_EQ(job.progress().stage_times(1).worker_id(), job.worker_ids(1));
  EXPECT_EQ(job.progress().stage_times(0).steps(), 0);
  v1::ReportProgressRequest r;
  r.set_job_id(id);
  r.set_plan_version(1);
  for (int64_t step = 0; step < 3; ++step) {
    for (const std::string& w : {w1, w2}) {
      r.set_worker_id(w);
      r.set_iteration(step);
      r.set_busy_seconds(w == job.worker_ids(0) ? 0.25 : 0.5);
      r.set_idle_seconds(0.125);
      ASSERT_TRUE(jobs_.ReportProgress(r).ok());
    }
  }
  job = jobs_.Get(id).value();
  EXPECT_EQ(job.progress().stage_times(0).steps(), 3);
  EXPECT_DOUBLE_EQ(job.progress().stage_times(0).busy_seconds(), 0.75);
  EXPECT_DOUBLE_EQ(job.progress().stage_times(1).busy_seconds(), 1.5);
  EXPECT_DOUBLE_EQ(job.progress().stage_times(1).idle_seconds(), 0.375);
  // The plan predicts each stage's share of its simulated step.
  const v1::Plan plan = jobs_.GetPlan(id).value();
  ASSERT_EQ(plan.stages_size(), 2);
  for (const v1::PlanStage& s : plan.stages()) {
    EXPECT_GT(s.predicted_busy_seconds(), 0);
    EXPECT_GE(s.predicted_idle_seconds(), 0);
    EXPECT_LE(s.predicted_busy_seconds() + s.predicted_idle_seconds(),
              plan.predicted_iteration_seconds() * (1 + 1e-12));
  }
  // Bounds (coordinator.proto): finite, 0 to 1e6 seconds.
  for (double bad : {-1.0, 2e6, std::nan("")}) {
    r.set_busy_seconds(bad);
    absl::StatusOr<v1::ReportProgressResponse> refused = jobs_.ReportProgress(r);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(refused.status().message(), "busy_seconds")) << refused.status();
    r.set_busy_seconds(0);
    r.set_idle_seconds(bad);
    EXPECT_EQ(jobs_.ReportProgress(r).status().code(), absl::StatusCode::kInvalidArgument) << bad;
    r.set_idle_seconds(0);
    r.set_eval_seconds(bad);
    refused = jobs_.ReportProgress(r);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(refused.status().message(), "eval_seconds")) << refused.status();
    r.set_eval_seconds(0);
  }
  EXPECT_EQ(jobs_.Get(id).value().progress().stage_times(1).steps(), 3);
}

// Traced steps (ReportProgressRequest.trace): the plan shows the measured
// timeline once every worker sent the same step, keeps it while the next
// traced step is being collected, refuses a trace that does not fit the
// worker's program, and a new plan starts afresh.
TEST_F(JobManagerTest, Progress_TracesOfEveryWorker_BecomeTheMeasuredTimeline) {
  AddWorker(7001), AddWorker(7002);
  v1::JobSpec spec = SmallSpec(2);
  spec.mutable_training()->set_steps(300);
  const std::string id = Submit(spec).value().id();
  const v1::Job job = jobs_.Get(id).value();
  auto report = [&](int stage, int64_t iteration, int32_t nanos) {
    const std::string& w = job.worker_ids(stage);
    v1::ReportProgressRequest r;
    r.set_worker_id(w);
    r.set_job_id(id);
    r.set_plan_version(1);
    r.set_iteration(iteration);
    v1::StepTrace* trace = r.mutable_trace();
    FillTrace(iteration, AssignmentOf(w).program().instructions_size(), trace);
    trace->mutable_start_time()->set_seconds(1800000000);
    trace->mutable_start_time()->set_nanos(nanos);
    return r;
  };
  ASSERT_TRUE(jobs_.ReportProgress(report(0, 10, 0)).ok());
  EXPECT_TRUE(jobs_.GetPlan(id).value().measured_timeline_svg().empty());  // one of two
  // Fields the coordinator does not know (a newer worker's, or padding up to
  // the 4 MiB request) are not kept with the trace.
  v1::ReportProgressRequest padded = report(1, 10, 2000000);
  const size_t known = padded.trace().ByteSizeLong();
  padded.mutable_trace()
      ->GetReflection()
      ->MutableUnknownFields(padded.mutable_trace())
      ->AddLengthDelimited(999, std::string(1 << 20, 'u'));
  const size_t before = jobs_.TracedBytesForTesting(id);
  ASSERT_TRUE(jobs_.ReportProgress(padded).ok());
  EXPECT_EQ(jobs_.TracedBytesForTesting(id), before + known);  // complete: moved to `traced`
  v1::Plan plan = jobs_.GetPlan(id).value();
  EXPECT_EQ(plan.measured_step(), 10);
  EXPECT_TRUE(absl::StrContains(plan.measured_timeline_svg(), "measured step 11"));
  EXPECT_TRUE(absl::StrContains(plan.measured_timeline_svg(), job.worker_ids(1)));
  EXPECT_TRUE(absl::StrContains(plan.measured_chrome_trace_json(), "traceEvents"));
  // The next traced step, half reported, leaves step 11's in place; an
  // older one arriving late changes nothing.
  ASSERT_TRUE(jobs_.ReportProgress(report(1, 110, 0)).ok());
  ASSERT_TRUE(jobs_.ReportProgress(report(0, 10, 0)).ok());
  EXPECT_EQ(jobs_.GetPlan(id).value().measured_step(), 10);
  ASSERT_TRUE(jobs_.ReportProgress(report(0, 110, 0)).ok());
  EXPECT_EQ(jobs_.GetPlan(id).value().measured_step(), 110);

  // A trace that does not fit: INVALID_ARGUMENT naming the field.
  v1::ReportProgressRequest bad = report(0, 210, 0);
  bad.mutable_trace()->mutable_instructions(0)->set_instruction(
      AssignmentOf(job.worker_ids(0)).program().instructions_size());
  absl::StatusOr<v1::ReportProgressResponse> refused = jobs_.ReportProgress(bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(refused.status().message(),
                                "ReportProgressRequest.trace.instructions[0].instruction"))
      << refused.status();
  bad = report(0, 210, 0);
  bad.mutable_trace()->set_iteration(209);
  EXPECT_TRUE(absl::StrContains(jobs_.ReportProgress(bad).status().message(),
                                "ReportProgressRequest.trace.iteration"));
}

// The measured timeline's SVG drawn straight from the first `lanes`
// workers' programs and traces of `reports` (in stage order) of a job of
// reports.size() workers, as GetPlan drew it when the coordinator kept
// every worker's trace: what it must still draw.
std::string MeasuredSvgOfLeadingLanes(const std::string& job_id,
                                      const std::vector<v1::ReportProgressRequest>& reports,
                                      const std::vector<v1::Program>& programs, int lanes) {
  std::vector<const v1::Program*> drawn_programs;
  std::vector<const v1::StepTrace*> drawn_traces;
  std::vector<std::string> names;
  for (int w = 0; w < lanes; ++w) {
    drawn_programs.push_back(&programs[w]);
    drawn_traces.push_back(&reports[w].trace());
    names.push_back(reports[w].worker_id());
  }
  absl::StatusOr<SimulationResult> measured = MeasuredTimeline(drawn_programs, drawn_traces);
  EXPECT_TRUE(measured.ok()) << measured.status();
  if (!measured.ok()) return "";
  TimelineSvgOptions svg;
  svg.title = absl::StrCat("job ", job_id, ": measured step ", reports[0].iteration() + 1,
                           " (workers' clocks)");
  if (lanes < static_cast<int>(reports.size())) {
    absl::StrAppend(&svg.title, ", its first ", lanes, " of ", reports.size(), " workers");
  }
  svg.span_name = "first start to last end";
  return TimelineSvg(*measured, names, svg);
}

// A traced step of a job whose programs are within
// kMaxMeasuredTimelineTimings: every lane drawn, exactly as from all the
// workers' traces, and the traces held once (moved to the step shown).
TEST_F(JobManagerTest, Progress_TracedStepWithinTheDrawnLimit_EveryLaneDrawnAsBefore) {
  AddWorker(7001), AddWorker(7002), AddWorker(7003);
  v1::JobSpec spec = SmallSpec(3);
  spec.mutable_training()->set_steps(20);
  const std::string id = Submit(spec).value().id();
  const v1::Job job = jobs_.Get(id).value();
  std::vector<v1::ReportProgressRequest> reports;
  std::vector<v1::Program> programs;
  size_t bytes = 0;
  for (int stage = 0; stage < 3; ++stage) {
    const std::string& w = job.worker_ids(stage);
    programs.push_back(AssignmentOf(w).program());
    v1::ReportProgressRequest r = IterationReport(w, id, 10, {});
    FillTrace(10, programs.back().instructions_size(), r.mutable_trace());
    r.mutable_trace()->mutable_start_time()->set_seconds(1800000000);
    r.mutable_trace()->mutable_start_time()->set_nanos(1000000 * (3 - stage));
    bytes += r.trace().ByteSizeLong();
    reports.push_back(r);
  }
  for (int stage : {2, 0, 1}) ASSERT_TRUE(jobs_.ReportProgress(reports[stage]).ok()) << stage;
  EXPECT_EQ(jobs_.TracedBytesForTesting(id), bytes);
  const v1::Plan plan = jobs_.GetPlan(id).value();
  EXPECT_EQ(plan.measured_step(), 10);
  EXPECT_EQ(plan.measured_timeline_svg(), MeasuredSvgOfLeadingLanes(id, reports, programs, 3));
  EXPECT_FALSE(absl::StrContains(plan.measured_timeline_svg(), "its first"));
}

// A job whose workers' programs hold more timings than a measured timeline
// draws (kMaxMeasuredTimelineTimings): only the drawn lanes' traces are
// kept, however the workers' reports interleave, and the drawing is the
// same as from every worker's trace. Every worker of a large job sent
// about 450 MB a traced step, held twice.
TEST_F(JobManagerTest, Progress_TracesOverTheDrawnLimit_OnlyTheDrawnLanesKept) {
  for (int port = 7001; port <= 7004; ++port) AddWorker(port);
  v1::JobSpec spec = SmallSpec(4);
  spec.mutable_training()->set_batch_size(4096);
  spec.mutable_training()->set_micro_batches(4096);  // 4 x 4096: the planning budget
  spec.mutable_training()->set_steps(20);
  const std::string id = Submit(spec).value().id();
  const v1::Job job = jobs_.Get(id).value();
  ASSERT_EQ(job.worker_ids_size(), 4);
  std::vector<v1::ReportProgressRequest> reports;
  std::vector<v1::Program> programs;
  std::vector<int> timings;
  int64_t total = 0;
  size_t timing_bytes = 0;  // the most a trace's timings serialize to, each
  for (int stage = 0; stage < 4; ++stage) {
    const std::string& w = job.worker_ids(stage);
    programs.push_back(AssignmentOf(w).program());
    timings.push_back(programs.back().instructions_size());
    total += timings.back();
    v1::ReportProgressRequest r = IterationReport(w, id, 10, {});
    FillTrace(10, timings.back(), r.mutable_trace());
    r.mutable_trace()->mutable_start_time()->set_seconds(1800000000);
    timing_bytes = std::max(timing_bytes, (r.trace().ByteSizeLong() + timings.back() - 1) /
                                              static_cast<size_t>(timings.back()));
    reports.push_back(std::move(r));
  }
  ASSERT_GT(total, kMaxMeasuredTimelineTimings);
  const int lanes = LeadingLanesWithin(timings, kMaxMeasuredTimelineTimings);
  ASSERT_LT(lanes, 4);
  size_t drawn_bytes = 0;
  for (int stage = 0; stage < lanes; ++stage) drawn_bytes += reports[stage].trace().ByteSizeLong();
  const size_t bound = 2 * kMaxMeasuredTimelineTimings * timing_bytes;
  // The last stage first: a lane not drawn is counted, not kept.
  for (int stage = 3; stage >= 0; --stage) {
    ASSERT_TRUE(jobs_.ReportProgress(reports[stage]).ok()) << stage;
    EXPECT_LE(jobs_.TracedBytesForTesting(id), bound) << "after stage " << stage;
  }
  EXPECT_EQ(jobs_.TracedBytesForTesting(id), drawn_bytes);  // once: moved to `traced`
  const v1::Plan plan = jobs_.GetPlan(id, JobManager::PlanParts::kMeasuredTimelineSvg).value();
  EXPECT_EQ(plan.measured_step(), 10);
  EXPECT_TRUE(absl::StrContains(plan.measured_timeline_svg(),
                                absl::StrCat("its first ", lanes, " of 4 workers")));
  EXPECT_EQ(plan.measured_timeline_svg(), MeasuredSvgOfLeadingLanes(id, reports, programs, lanes));
}

// A step whose mean loss is NaN ends the job FAILED, saying which step
// (worker/train/divergence.h, as train-local stops), and frees its workers.
TEST_F(JobManagerTest, Progress_NanLoss_FailsTheJobNamingTheStep) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(SmallSpec(2)).value().id();
  Report(w2, id, 0, {2.0f, 3.0f}, false);
  EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  Report(w2, id, 1, {1.0f, std::numeric_limits<float>::quiet_NaN()}, false);
  const v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(job.reason(), "training diverged: the loss of step 2 is nan"))
      << job.reason();
  // No NaN reaches Job.progress (JSON would carry the string "NaN"): it
  // shows the last finite step.
  EXPECT_EQ(job.progress().loss(), 2.5f);
  EXPECT_EQ(job.progress().step(), 1);
  EXPECT_EQ(registry_.Get(w1).value().state(), v1::WORKER_STATE_READY);
  EXPECT_EQ(AssignmentOf(w1).action(), v1::Assignment::ACTION_STOP);
}

// A NaN validation loss is divergence too: the job fails naming it, and
// no NaN reaches Job.progress.
TEST_F(JobManagerTest, Progress_NanValidationLoss_FailsTheJob) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(SmallSpec(2)).value().id();
  const std::string last = jobs_.Get(id).value().worker_ids(1);
  v1::ReportProgressRequest r = IterationReport(last, id, 0, {2.0f});
  r.set_val_loss(std::numeric_limits<float>::quiet_NaN());
  ASSERT_TRUE(jobs_.ReportProgress(r).ok());
  const v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(job.reason(), "the validation loss: training diverged"))
      << job.reason();
  EXPECT_FALSE(std::isnan(job.progress().val_loss()));
  (void)w1;
  (void)w2;
}

// Two workers reporting the same host's RAM share it (memory_budget.h):
// a plan that fits each stage into the whole RAM, but not into half of it,
// is refused naming the memory, rather than started to run out of it; the
// same two workers on hosts of their own get the plan (the next test).
TEST_F(JobManagerTest, WorkersSharingAHostsRam_PlannedWithTheirShare) {
  constexpr int64_t kRam = 150000;  // a stage of SmallSpec(2) needs about 108 kB
  AddCpuWorker(7001, "vm", kRam);
  AddCpuWorker(7002, "vm", kRam);
  const std::string shared = Submit(SmallSpec(2)).value().id();
  const v1::Job refused = jobs_.Get(shared).value();
  EXPECT_EQ(refused.state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(refused.reason(),
                                "but has 75000 bytes (0.00 GiB) (memory per worker: "
                                "host vm's RAM shared by 2 workers)"))
      << refused.reason();
  // Whole bytes, never "1.07520e+05".
  EXPECT_TRUE(absl::StrContains(refused.reason(), "would need 107520 bytes (0.00 GiB)"))
      << refused.reason();
}

// The first workers by id share a host's RAM and cannot hold the plan,
// but another READY worker has a host of its own: the job is placed again
// on the workers with the most memory, and runs there.
TEST_F(JobManagerTest, RefusedForMemory_PlacedAgainOnTheRoomiestReadyWorkers) {
  constexpr int64_t kRam = 150000;  // as above
  const std::string a = AddCpuWorker(7001, "vm", kRam);
  const std::string b = AddCpuWorker(7002, "vm", kRam);
  const std::string c = AddCpuWorker(7003, "c", kRam);
  const std::string id = Submit(SmallSpec(2)).value().id();
  const v1::Job waiting = jobs_.Get(id).value();
  ASSERT_EQ(waiting.state(), v1::JOB_STATE_QUEUED) << waiting.reason();
  EXPECT_TRUE(absl::StrContains(waiting.reason(),
                                absl::StrCat("the plan on ", a, ", ", b, " did not fit (")))
      << waiting.reason();
  EXPECT_TRUE(absl::StrContains(waiting.reason(), "with the most memory")) << waiting.reason();
  EXPECT_EQ(registry_.Get(b).value().state(), v1::WORKER_STATE_READY);
  Schedule();
  const v1::Job placed = jobs_.Get(id).value();
  ASSERT_EQ(placed.state(), v1::JOB_STATE_RUNNING) << placed.reason();
  EXPECT_EQ(std::vector<std::string>(placed.worker_ids().begin(), placed.worker_ids().end()),
            (std::vector<std::string>{a, c}));
}

// Tried once more on the roomiest workers, a plan that fits nowhere FAILS,
// saying where it was tried.
TEST_F(JobManagerTest, RefusedForMemoryOnTheRoomiestWorkersToo_Fails) {
  AddCpuWorker(7001, "vm", 150000);
  AddCpuWorker(7002, "vm", 150000);
  AddCpuWorker(7003, "c", 90000);  // less than a stage's 107520 bytes
  const std::string id = Submit(SmallSpec(2)).value().id();
  ASSERT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_QUEUED);
  Schedule();
  const v1::Job failed = jobs_.Get(id).value();
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StartsWith(failed.reason(), "on the READY workers with the most memory: "))
      << failed.reason();
  EXPECT_TRUE(absl::StrContains(failed.reason(), "but has 90000 bytes")) << failed.reason();
}

TEST_F(JobManagerTest, WorkersOnHostsOfTheirOwn_KeepTheirWholeRam) {
  constexpr int64_t kRam = 150000;  // as above
  const std::string a = AddCpuWorker(7001, "a", kRam);
  const std::string b = AddCpuWorker(7002, "b", kRam);
  const std::string apart = Submit(SmallSpec(2)).value().id();
  EXPECT_EQ(jobs_.Get(apart).value().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(AssignmentOf(a).host_memory_budget_bytes(), kRam);
  EXPECT_EQ(AssignmentOf(b).host_memory_budget_bytes(), kRam);
}

// Each worker learns the share of its host's RAM the plan gave it: it holds
// its corpus to a third of that (JobRunner), not of the whole RAM.
TEST_F(JobManagerTest, WorkersSharingAHostsRam_EachAssignedItsShare) {
  constexpr int64_t kRam = 1000000;
  const std::string a = AddCpuWorker(7001, "vm", kRam);
  const std::string b = AddCpuWorker(7002, "vm", kRam);
  const std::string id = Submit(SmallSpec(2)).value().id();
  ASSERT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(AssignmentOf(a).host_memory_budget_bytes(), kRam / 2);
  EXPECT_EQ(AssignmentOf(b).host_memory_budget_bytes(), kRam / 2);
}

// So does a GPU worker: its corpus lives in the host's RAM, not its GPU's
// memory, and it was sent no share (each held its corpus to a third of the
// whole RAM).
TEST_F(JobManagerTest, GpuWorkersSharingAHostsRam_EachAssignedItsShare) {
  constexpr int64_t kRam = 1000000;
  std::vector<std::string> w;
  for (int g = 0; g < 2; ++g) {
    v1::RegisterWorkerRequest request = GpuWorkerRequest(7001 + g);
    request.mutable_device()->set_memory_bytes(kRam);
    request.mutable_device()->set_gpu_memory_bytes(int64_t{80} << 30);
    w.push_back(registry_.Register(request).value().worker_id());
  }
  const std::string id = Submit(SmallSpec(2)).value().id();
  ASSERT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING) << jobs_.Get(id).value().reason();
  EXPECT_EQ(AssignmentOf(w[0]).host_memory_budget_bytes(), kRam / 2);
  EXPECT_EQ(AssignmentOf(w[1]).host_memory_budget_bytes(), kRam / 2);
}

TEST_F(JobManagerTest, EvalInterval_AssignmentsCarryEvalProgramsAndValLossIsReported) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  v1::JobSpec spec = SmallSpec(2);
  spec.mutable_training()->set_eval_interval(2);
  spec.mutable_training()->set_eval_windows(3);  // micro-batches of 2: two of them
  const std::string id = Submit(spec).value().id();
  const v1::Assignment a1 = AssignmentOf(w1), a2 = AssignmentOf(w2);
  // Stage 0 sends, stage 1 receives, each validation micro-batch.
  int sends = 0, recvs = 0;
  for (const auto& in : a1.eval_program().instructions()) sends += in.has_send();
  for (const auto& in : a2.eval_program().instructions()) recvs += in.has_recv();
  EXPECT_EQ(sends, 2);
  EXPECT_EQ(recvs, 2);
  Report(w2, id, 0, {2.0f}, false);  // the plan's first step: its start, not throughput
  v1::ReportProgressRequest r;
  r.set_worker_id(w2);
  r.set_job_id(id);
  r.set_plan_version(1);
  r.set_iteration(1);
  r.add_micro_batch_losses(2.0f);
  r.set_val_loss(2.25f);
  r.set_eval_seconds(1.0);
  clock_.Advance(absl::Seconds(3));  // 2 s of training, 1 s of validation
  ASSERT_TRUE(jobs_.ReportProgress(r).ok());
  const v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(job.progress().tokens_per_second(), 4 * 8 / 2.0);
  EXPECT_EQ(job.progress().val_loss(), 2.25f);
  EXPECT_EQ(job.progress().val_step(), 2);
}

TEST_F(JobManagerTest, NoEvalInterval_NoEvalPrograms) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  Submit(SmallSpec(2)).value();
  EXPECT_EQ(AssignmentOf(w1).eval_program().instructions_size(), 0);
  EXPECT_EQ(AssignmentOf(w2).eval_program().instructions_size(), 0);
}

TEST_F(JobManagerTest, WorkerLost_FailsJobNamingTheWorkerAndFreesTheOthers) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(SmallSpec(2)).value().id();
  v1::HeartbeatRequest beat;
  beat.set_worker_id(w1);
  beat.set_incarnation(1);
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(registry_.Heartbeat(beat).ok());  // w1 stays alive, w2 goes silent
  clock_.Advance(absl::Seconds(3));
  EXPECT_EQ(registry_.CheckLeases(), 1);
  v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(job.reason().find(w2), std::string::npos) << job.reason();
  EXPECT_EQ(registry_.Get(w1).value().state(), v1::WORKER_STATE_READY);
  EXPECT_EQ(AssignmentOf(w1).action(), v1::Assignment::ACTION_STOP);
}

TEST_F(JobManagerTest, ReadyBarrier_OpensWhenEveryStageIsReady) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(SmallSpec(2)).value().id();
  v1::ReportProgressRequest r = ReadyReport(w2, id);
  EXPECT_FALSE(jobs_.ReportProgress(r).value().all_ready());
  EXPECT_FALSE(jobs_.ReportProgress(r).value().all_ready());  // asking again changes nothing
  r.set_worker_id(w1);
  EXPECT_TRUE(jobs_.ReportProgress(r).value().all_ready());
  EXPECT_EQ(jobs_.Get(id).value().progress().step(), 0);  // a ready report is no iteration
}

// A stage's start-barrier wait runs from its own arrival, so the first to
// give up is the first that came, a healthy one, and its error could not
// name the peer it waited for: the job's reason blamed it alone. The
// coordinator knows which stages never reported ready, and names them.
TEST_F(JobManagerTest, StageFailsAtTheStartBarrier_ReasonNamesTheStagesNotReady) {
  for (int k = 0; k < 3; ++k) AddWorker(7001 + k);
  const std::string id = Submit(SmallSpec(3)).value().id();
  const v1::Job placed = jobs_.Get(id).value();
  ASSERT_EQ(placed.worker_ids_size(), 3) << placed.reason();
  const std::string w0 = placed.worker_ids(0), w1 = placed.worker_ids(1), w2 = placed.worker_ids(2);
  EXPECT_FALSE(jobs_.ReportProgress(ReadyReport(w0, id)).value().all_ready());
  EXPECT_FALSE(jobs_.ReportProgress(ReadyReport(w1, id)).value().all_ready());
  v1::ReportProgressRequest r = ReadyReport(w0, id);
  r.set_ready(false);
  r.set_error("DEADLINE_EXCEEDED: the other stages of job " + id + " were not ready within 10m0s");
  r.set_peer_failure(true);
  ASSERT_TRUE(jobs_.ReportProgress(r).ok());
  const v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);  // no checkpoints: no recovery
  EXPECT_EQ(job.reason(), "worker " + w0 + ": " + r.error() + " [stages: 0=" + w0 + ", 1=" + w1 +
                              ", 2=" + w2 + "]; not at the start barrier: 2=" + w2 +
                              " (check their logs first)");
}

// A job of many stages names the first 8 not ready, then how many more: the
// reason stays bounded however many stages kept the one that failed waiting.
TEST_F(JobManagerTest, StageFailsAtTheStartBarrier_AtMost8NotReadyNamed) {
  v1::JobSpec spec = SmallSpec(11);
  spec.mutable_model()->set_n_layer(10);
  for (int k = 0; k < 11; ++k) AddWorker(7001 + k);
  const std::string id = Submit(spec).value().id();
  const v1::Job placed = jobs_.Get(id).value();
  ASSERT_EQ(placed.worker_ids_size(), 11) << placed.reason();
  EXPECT_FALSE(jobs_.ReportProgress(ReadyReport(placed.worker_ids(0), id)).value().all_ready());
  v1::ReportProgressRequest r = ReadyReport(placed.worker_ids(0), id);
  r.set_ready(false);
  r.set_error("DEADLINE_EXCEEDED: the other stages were not ready");
  ASSERT_TRUE(jobs_.ReportProgress(r).ok());
  std::string named;
  for (int s = 1; s <= 8; ++s) {
    absl::StrAppend(&named, s > 1 ? ", " : "", s, "=", placed.worker_ids(s));
  }
  const std::string reason = jobs_.Get(id).value().reason();
  EXPECT_TRUE(absl::EndsWith(
      reason, "]; not at the start barrier: " + named + " and 2 more (check their logs first)"))
      << reason;
}

// Workers that read different tokens at spec.data.path (another copy on
// another host) trained silently on different data; the first digest a job
// hears is its own, and a stage with another fails it at the barrier.
TEST_F(JobManagerTest, ReadyBarrier_FirstDataDigestIsTheJobs_AnotherFailsIt) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(SmallSpec(2)).value().id();
  EXPECT_EQ(jobs_.Get(id).value().data_sha256(), "");
  EXPECT_EQ(AssignmentOf(w1).data_sha256(), "");
  const std::string a(64, 'a'), b = std::string(63, 'a') + "b";
  v1::ReportProgressRequest r = ReadyReport(w1, id);
  r.set_data_sha256(a);
  EXPECT_FALSE(jobs_.ReportProgress(r).value().all_ready());
  EXPECT_EQ(jobs_.Get(id).value().data_sha256(), a);
  EXPECT_FALSE(jobs_.ReportProgress(r).value().all_ready());  // the same again: fine
  r.set_worker_id(w2);
  r.set_data_sha256(b);
  EXPECT_FALSE(jobs_.ReportProgress(r).value().all_ready());
  const v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.data_sha256(), a);
  EXPECT_TRUE(absl::StrContains(job.reason(), "worker " + w2 + " read other tokens"))
      << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(), b)) << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(), a)) << job.reason();
  EXPECT_EQ(AssignmentOf(w1).action(), v1::Assignment::ACTION_STOP);
}

TEST_F(JobManagerTest, DataDigestNotLowercaseHexOf64_InvalidArgument) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(SmallSpec(2)).value().id();
  v1::ReportProgressRequest r = ReadyReport(w1, id);
  for (const std::string& bad : {std::string(63, 'a'), std::string(65, 'a'), std::string(64, 'A'),
                                 std::string(63, 'a') + "g", std::string(64, '\0')}) {
    r.set_data_sha256(bad);
    const absl::Status refused = jobs_.ReportProgress(r).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << absl::CEscape(bad);
    EXPECT_TRUE(absl::StrContains(refused.message(), "ReportProgressRequest.data_sha256"));
  }
  EXPECT_EQ(jobs_.Get(id).value().data_sha256(), "");
  EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  r.set_data_sha256("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");
  EXPECT_TRUE(jobs_.ReportProgress(r).ok());
}

// A cancel of a cancelled job is a repeat (a retry whose first answer was
// lost): answered with the job, as the first was; before, FAILED_PRECONDITION
// "already ended" told the caller its own cancel had failed.
TEST_F(JobManagerTest, Cancel_EndsOnceThenRepeatsAnswerTheCancelledJob) {
  AddWorker(7001);
  const std::string id = Submit(SmallSpec(1)).value().id();
  EXPECT_EQ(jobs_.Cancel(id).value().state(), v1::JOB_STATE_CANCELLED);
  const absl::StatusOr<v1::Job> repeat = jobs_.Cancel(id);
  ASSERT_TRUE(repeat.ok()) << repeat.status();
  EXPECT_EQ(repeat->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(repeat->id(), id);
  EXPECT_EQ(jobs_.Cancel("job-99").status().code(), absl::StatusCode::kNotFound);
}

// The ids a user names are bounded before any lookup, and a NOT_FOUND quotes
// an unknown id escaped: a request cannot grow the answer or the log line, or
// put control bytes in either.
TEST_F(JobManagerTest, IdArguments_BoundedAndQuotedEscaped) {
  AddWorker(7001);
  const std::string id = Submit(SmallSpec(1)).value().id();
  const std::string longest(kMaxIdBytes, 'j');
  const std::string too_long(kMaxIdBytes + 1, 'j');
  for (const std::string& bad : {std::string(), too_long}) {
    for (const absl::Status& refused :
         {jobs_.Get(bad).status(), jobs_.GetPlan(bad).status(), jobs_.Cancel(bad).status()}) {
      EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
      EXPECT_TRUE(absl::StrContains(refused.message(), "job id")) << refused;
      EXPECT_LT(refused.message().size(), 200u) << refused;
    }
    const absl::Status drain = jobs_.Drain(bad).status();
    EXPECT_EQ(drain.code(), absl::StatusCode::kInvalidArgument) << drain;
    EXPECT_TRUE(absl::StrContains(drain.message(), "worker id")) << drain;
  }
  EXPECT_EQ(jobs_.Get(longest).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(jobs_.Drain(longest).status().code(), absl::StatusCode::kNotFound);
  const absl::Status unknown = jobs_.Get("job-1\n\x1b[2J").status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(unknown.message(), "no job job-1\\n\\x1b[2J");
  const absl::Status unknown_worker = jobs_.Drain("w-9\n").status();
  EXPECT_EQ(unknown_worker.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(unknown_worker.message(), "w-9\\n")) << unknown_worker;
  EXPECT_TRUE(jobs_.Get(id).ok());
}

// Cancel answers with the basic view: a long job's loss history (up to a
// few hundred KB) is GetJob's full view's, which keeps it.
TEST_F(JobManagerTest, Cancel_AnswersTheBasicView_HistoryKept) {
  const std::string w1 = AddWorker(7001);
  const std::string id = Submit(SmallSpec(1)).value().id();
  Report(w1, id, 0, {2.0f, 3.0f}, false);
  Report(w1, id, 1, {1.0f, 2.0f}, false);
  ASSERT_EQ(jobs_.Get(id).value().progress().loss_history_size(), 2);
  const v1::Job cancelled = jobs_.Cancel(id).value();
  EXPECT_EQ(cancelled.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(cancelled.progress().step(), 2);
  EXPECT_EQ(cancelled.progress().loss_history_size(), 0);
  EXPECT_EQ(jobs_.Get(id).value().progress().loss_history_size(), 2);
}

TEST_F(JobManagerTest, WorkerError_FailsTheJobWithItsMessage) {
  const std::string w1 = AddWorker(7001);
  const std::string id = Submit(SmallSpec(1)).value().id();
  v1::ReportProgressRequest r;
  r.set_worker_id(w1);
  r.set_job_id(id);
  r.set_plan_version(1);
  r.set_error("recv timed out");
  ASSERT_TRUE(jobs_.ReportProgress(r).ok());
  EXPECT_EQ(jobs_.Get(id).value().reason(),
            "worker " + w1 + ": recv timed out [stages: 0=" + w1 + "]");
}

TEST_F(JobManagerTest, ReportProgress_StaleOrForeign_IsRejected) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string id = Submit(SmallSpec(1)).value().id();
  v1::ReportProgressRequest r;
  r.set_worker_id(w1);
  r.set_job_id(id);
  r.set_plan_version(7);
  EXPECT_EQ(jobs_.ReportProgress(r).status().code(), absl::StatusCode::kFailedPrecondition);
  r.set_plan_version(1);
  r.set_worker_id(w2);  // not part of the one-stage job
  EXPECT_EQ(jobs_.ReportProgress(r).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(jobs_.ReportProgress(r).status().message(),
            "worker " + w2 + " is not part of job " + id);
  r.set_job_id("job-42");
  EXPECT_EQ(jobs_.ReportProgress(r).status().code(), absl::StatusCode::kNotFound);
}

// 3-D tensor parallelism has no CUDA path (its stages refuse it): the job
// was placed on GPU workers and failed once they started. It now waits for
// CPU workers, saying why, and is placed on them alone.
TEST_F(JobManagerTest, ThreeDTensorJob_WaitsForCpuWorkers_PlacedOnThemAlone) {
  for (int k = 0; k < 8; ++k) AddGpuModelWorker(7100 + k);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_parallelism()->set_tensor(8);
  spec.mutable_parallelism()->set_tensor_mode("3d");
  spec.mutable_training()->set_batch_size(8);  // p^2 = 4 samples a micro-batch
  const std::string id = Submit(spec).value().id();
  v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(job.reason(),
            "waiting for 8 READY CPU workers (0 ready; spec.parallelism.tensor_mode 3d runs on "
            "the CPU backend only)");
  std::set<std::string> cpus;
  for (int k = 0; k < 8; ++k) cpus.insert(AddWorker(7200 + k));
  jobs_.ScheduleQueued();
  background_.RunAll();  // the plan
  job = jobs_.Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  ASSERT_EQ(job.worker_ids_size(), 8);
  for (const std::string& w : job.worker_ids()) EXPECT_EQ(cpus.count(w), 1u) << w;
  std::vector<v1::Assignment> assignments;
  for (const std::string& w : job.worker_ids()) assignments.push_back(AssignmentOf(w));
  EXPECT_EQ(assignments.back().tensor_rank(), 7);
  ExpectDataPlaneKeysFit(assignments, DataPlaneJobId(id, job.plan_version()));
}

// Names in a directory (the coordinator's output), for what the weights
// upload leaves there.
std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

TEST_F(JobManagerTest, Weights_UploadedByAllStages_AreWrittenAsSafetensors) {
  const std::string w1 = AddWorker(7001);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_output()->set_weights_path("out/final.safetensors");
  const std::string id = Submit(spec).value().id();
  const GptConfig model = ResolveJobSpec(spec).value().train.model;
  // The one stage owns every unit: upload each of their tensors whole.
  ASSERT_NO_FATAL_FAILURE(UploadEveryTensor(w1, id, model));
  v1::WeightsChunk past = WholeTensor(w1, id, UnitParameterShapes(model, 0)[1]);  // wpe
  past.set_offset(1);  // one value beyond the end
  EXPECT_EQ(jobs_.AddWeightsChunk(past).code(), absl::StatusCode::kInvalidArgument);
  // An offset whose sum with the chunk's length overflows (it would wrap
  // below the tensor's start): refused, nothing written.
  v1::WeightsChunk wrapping = past;
  wrapping.clear_values();
  for (int i = 0; i < 3; ++i) wrapping.add_values(-1.0f);
  wrapping.set_offset(std::numeric_limits<int64_t>::max() - 1);
  EXPECT_EQ(jobs_.AddWeightsChunk(wrapping).code(), absl::StatusCode::kInvalidArgument);
  // A NaN at such an offset: its message added the index to the offset (an
  // overflow, before the offset was checked); it names both instead.
  v1::WeightsChunk not_finite = wrapping;
  not_finite.set_offset(std::numeric_limits<int64_t>::max());
  not_finite.set_values(1, std::numeric_limits<float>::quiet_NaN());
  const absl::Status refused = jobs_.AddWeightsChunk(not_finite);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      absl::StrContains(refused.message(), "at index 1 of the chunk at offset 9223372036854775807"))
      << refused;
  Report(w1, id, 2, {1.0f, 1.0f}, true);
  EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING);  // weights still missing
  ASSERT_TRUE(jobs_.FinishWeights(w1, id).ok());
  // The file is written off the job manager's lock (here when the test
  // runs it); the job says so meanwhile, and a loss no longer matters.
  v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.reason(), "every stage finished; writing the weights to out/final.safetensors");
  registry_.MarkLost(w1, registry_.Get(w1).value().incarnation(), "pod deleted");
  EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(jobs_.FinishWeights(w1, id).ok());  // sent again: written once
  // A chunk sent now is refused: it opened a second file (the whole model's
  // size reserved beside the one being synced).
  const absl::Status late =
      jobs_.AddWeightsChunk(WholeTensor(w1, id, UnitParameterShapes(model, 0)[1]));
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_EQ(FilesIn(OutputDir() + "/out").size(), 1u);  // the one being synced
  EXPECT_EQ(background_.RunAll(), 1);
  job = jobs_.Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  const std::string path = OutputDir() + "/out/final.safetensors";
  EXPECT_EQ(job.weights_path(), path);
  struct stat info;
  ASSERT_EQ(stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600);  // the job's output is its owner's only
  auto file = ReadSafetensors(path).value();
  EXPECT_EQ(file.metadata, (SafetensorsMetadata{{"format", "pt"}}));  // as the Hub's
  const Tensor* wpe = file.Find("wpe.weight");
  ASSERT_NE(wpe, nullptr);
  EXPECT_EQ((*wpe)[wpe->numel() - 1], float(wpe->numel() - 1));
  int64_t total = 0;
  for (const NamedTensor& t : file.tensors) total += t.tensor.numel();
  EXPECT_EQ(total, CountParameters(model));
}

// The final weights go to a temporary file as they arrive (the coordinator
// holds none of them), which appears under its name only once complete.
TEST_F(JobManagerTest, Weights_WrittenAsTheyArrive_UnderTheirNameOnlyAtTheEnd) {
  const std::string w1 = AddWorker(7001);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_output()->set_weights_path("streamed/final.safetensors");
  const std::string id = Submit(spec).value().id();
  const GptConfig model = ResolveJobSpec(spec).value().train.model;
  ASSERT_TRUE(jobs_.AddWeightsChunk(WholeTensor(w1, id, UnitParameterShapes(model, 0)[0])).ok());
  const std::string dir = OutputDir() + "/streamed";
  std::vector<std::string> files = FilesIn(dir);
  ASSERT_EQ(files.size(), 1u);
  EXPECT_TRUE(absl::StartsWith(files[0], "final.safetensors.tmp.")) << files[0];
  ASSERT_NO_FATAL_FAILURE(FinishUpload(w1, id, model));
  EXPECT_EQ(background_.RunAll(), 1);
  ASSERT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(weights_synced_, 1);
  EXPECT_EQ(FilesIn(dir), std::vector<std::string>{"final.safetensors"});
}

// A coordinator that died during an upload left its temporary (with the
// whole file's space reserved). The next upload of that name removes it, and
// so does the end of a job that never gets to upload.
TEST_F(JobManagerTest, Weights_DeadCoordinatorsTemporary_RemovedByTheNextUploadOrTheJobsEnd) {
  const std::string dir = OutputDir() + "/crashed";
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  const std::string stale = "final.safetensors.tmp.1.0";  // pid 1: a container's coordinator
  std::ofstream(dir + "/" + stale) << "half a file";
  std::ofstream(dir + "/other.safetensors.tmp.1.0") << "another name's";
  const std::string w1 = AddWorker(7001);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_output()->set_weights_path("crashed/final.safetensors");
  const std::string cancelled = Submit(spec).value().id();
  ASSERT_EQ(FilesIn(dir),
            (std::vector<std::string>{"final.safetensors.tmp.1.0", "other.safetensors.tmp.1.0"}));
  ASSERT_TRUE(jobs_.Cancel(cancelled).ok());
  jobs_.FlushIo();  // removed on the io queue
  EXPECT_EQ(FilesIn(dir), std::vector<std::string>{"other.safetensors.tmp.1.0"});

  std::ofstream(dir + "/" + stale) << "half a file";
  const std::string id = Submit(spec).value().id();
  const GptConfig model = ResolveJobSpec(spec).value().train.model;
  ASSERT_TRUE(jobs_.AddWeightsChunk(WholeTensor(w1, id, UnitParameterShapes(model, 0)[0])).ok());
  std::vector<std::string> files = FilesIn(dir);
  ASSERT_EQ(files.size(), 2u);  // this upload's temporary, and the other name's
  EXPECT_TRUE(absl::StartsWith(files[0], "final.safetensors.tmp.")) << files[0];
  EXPECT_NE(files[0], stale);
  ASSERT_NO_FATAL_FAILURE(FinishUpload(w1, id, model));
  EXPECT_EQ(background_.RunAll(), 1);
  ASSERT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(FilesIn(dir),
            (std::vector<std::string>{"final.safetensors", "other.safetensors.tmp.1.0"}));
}

// Two live jobs writing one weights file: the last to finish replaced the
// other's weights, and both reported the file as theirs. The second is
// refused, naming the first, until the first has ended.
TEST_F(JobManagerTest, Weights_PathOfAJobThatHasNotEnded_RefusedUntilItEnds) {
  AddWorker(7001);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_output()->set_weights_path("shared/final.safetensors");
  const std::string first = Submit(spec).value().id();
  const absl::StatusOr<v1::Job> second = Submit(spec);  // queued behind it, or not at all
  EXPECT_EQ(second.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(second.status().message(),
            "spec.output.weights_path: \"shared/final.safetensors\" is the output of job " + first +
                " (RUNNING), which has not ended; give this job a file of its own");
  v1::JobSpec other = spec;
  other.mutable_output()->set_weights_path("shared/other.safetensors");
  EXPECT_TRUE(Submit(other).ok());
  ASSERT_TRUE(jobs_.Cancel(first).ok());
  EXPECT_TRUE(Submit(spec).ok());
}

// Cancelled while its finished weights wait for the sync thread (behind
// another job's sync): the file is not synced (that fsync of gigabytes
// held up every other job's commit), and its temporary, which the io
// queue's cleanup leaves to its writer, is gone once the task has run.
TEST_F(JobManagerTest, Weights_CancelledBeforeTheSync_NotSyncedTemporaryRemoved) {
  const std::string w1 = AddWorker(7001);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_output()->set_weights_path("unsynced/final.safetensors");
  const std::string id = Submit(spec).value().id();
  const GptConfig model = ResolveJobSpec(spec).value().train.model;
  ASSERT_NO_FATAL_FAILURE(FinishUpload(w1, id, model));  // the sync queued
  ASSERT_TRUE(jobs_.Cancel(id).ok());
  jobs_.FlushIo();
  const std::string dir = OutputDir() + "/unsynced";
  ASSERT_EQ(FilesIn(dir).size(), 1u);  // the temporary, held by the queued task
  EXPECT_EQ(background_.RunAll(), 1);
  EXPECT_EQ(weights_synced_, 0);
  EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(FilesIn(dir), std::vector<std::string>{});
}

// Cancelled while its finished weights are being written (synced off the
// lock): the cancel holds. The file already under the name stays as it was
// (before, the rename was done anyway and replaced it), and nothing else is
// left.
TEST_F(JobManagerTest, Weights_CancelledWhileTheFileIsWritten_NothingRenamedIn) {
  const std::string w1 = AddWorker(7001);
  const std::string dir = OutputDir() + "/kept";
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  std::ofstream(dir + "/final.safetensors") << "an earlier run's weights";
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_output()->set_weights_path("kept/final.safetensors");
  const std::string id = Submit(spec).value().id();
  const GptConfig model = ResolveJobSpec(spec).value().train.model;
  ASSERT_NO_FATAL_FAILURE(FinishUpload(w1, id, model));
  ASSERT_EQ(jobs_.Get(id).value().reason(),
            "every stage finished; writing the weights to kept/final.safetensors");
  ASSERT_TRUE(jobs_.Cancel(id).ok());
  EXPECT_EQ(background_.RunAll(), 1);
  const v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(job.weights_path(), "");
  EXPECT_EQ(FilesIn(dir), std::vector<std::string>{"final.safetensors"});
  std::ifstream kept(dir + "/final.safetensors");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(kept), {}), "an earlier run's weights");
}

// init.from a weights file that lacks a tensor, or has one of another
// shape: refused at submit, the message naming the tensor and both shapes.
TEST_F(JobManagerTest, InitFrom_WeightsMissingOrMisshapen_RefusedNamingTheTensor) {
  v1::JobSpec spec = SmallSpec(1);
  const GptConfig model = ResolveJobSpec(spec).value().train.model;
  const ParameterShape first = UnitParameterShapes(model, 0)[0];
  const std::string wanted = ShapeToString(Shape(first.shape.begin(), first.shape.end()));
  ASSERT_TRUE(
      WriteSafetensors(OutputDir() + "/other.safetensors", {{"unrelated", Tensor::Zeros({2})}})
          .ok());
  ASSERT_TRUE(
      WriteSafetensors(OutputDir() + "/small.safetensors", {{first.name, Tensor::Zeros({1, 1})}})
          .ok());
  spec.mutable_init()->set_from("other.safetensors");
  EXPECT_EQ(Submit(spec).status().message(), "spec.init.from: other.safetensors has no tensor " +
                                                 first.name + " (this model's is " + wanted + ")");
  spec.mutable_init()->set_from("small.safetensors");
  EXPECT_EQ(Submit(spec).status().message(),
            "spec.init.from: small.safetensors has " + first.name +
                " of shape [1, 1], which does not fit this model's " + wanted);
  // Both name forms of one tensor: the workers would refuse it, so Submit
  // does.
  const Shape shape(first.shape.begin(), first.shape.end());
  ASSERT_TRUE(WriteSafetensors(OutputDir() + "/both.safetensors",
                               {{first.name, Tensor::Zeros(shape)},
                                {"transformer." + first.name, Tensor::Zeros(shape)}})
                  .ok());
  spec.mutable_init()->set_from("both.safetensors");
  EXPECT_EQ(Submit(spec).status().message(), "spec.init.from: both.safetensors holds both '" +
                                                 first.name + "' and 'transformer." + first.name +
                                                 "': which one to load is ambiguous; keep one");
}

// A live job reloads the weights it started from at each recovery before
// its first checkpoint: another job may not write its final weights there,
// nor start from a file a live job replaces when it ends (by its resolved
// name: through a link too). Both are free once the other job has ended.
TEST_F(JobManagerTest, InitFromWeights_AndALiveJobsWeightsPath_RefusedEitherWay) {
  const std::vector<NamedTensor> tensors = ZeroWeightsOf(SmallSpec(1));
  for (const char* dir : {"/start", "/next"})
    ASSERT_EQ(mkdir((OutputDir() + dir).c_str(), 0700), 0);
  for (const char* file : {"/start/w.safetensors", "/next/w.safetensors"}) {
    const absl::Status written = WriteSafetensors(OutputDir() + file, tensors);
    ASSERT_TRUE(written.ok()) << written;
  }
  ASSERT_EQ(symlink("next/w.safetensors", (OutputDir() + "/next-link.safetensors").c_str()), 0);

  v1::JobSpec starts = SmallSpec(1);
  starts.mutable_init()->set_from("start/w.safetensors");
  const std::string starter = Submit(starts).value().id();
  v1::JobSpec replaces = SmallSpec(1);
  replaces.mutable_output()->set_weights_path("start/w.safetensors");
  EXPECT_EQ(Submit(replaces).status().message(),
            "spec.output.weights_path: \"start/w.safetensors\" is \"start/w.safetensors\", where "
            "job " +
                starter +
                " (QUEUED) started from (spec.init.from) and restarts from until its first "
                "checkpoint; write it elsewhere");

  v1::JobSpec writes = SmallSpec(1);
  writes.mutable_output()->set_weights_path("next/w.safetensors");
  const std::string writer = Submit(writes).value().id();
  for (const char* from : {"next/w.safetensors", "next-link.safetensors"}) {
    v1::JobSpec reads = SmallSpec(1);
    reads.mutable_init()->set_from(from);
    EXPECT_EQ(Submit(reads).status().message(),
              absl::StrCat("spec.init.from: \"", from,
                           "\" is \"next/w.safetensors\", the weights file of job ", writer,
                           " (QUEUED), which replaces it when it ends; start from it once that "
                           "job has ended, or from a copy"));
  }

  ASSERT_TRUE(jobs_.Cancel(starter).ok());
  ASSERT_TRUE(jobs_.Cancel(writer).ok());
  EXPECT_TRUE(Submit(replaces).ok());
  v1::JobSpec reads = SmallSpec(1);
  reads.mutable_init()->set_from("next-link.safetensors");
  EXPECT_TRUE(Submit(reads).ok());
}

// A FIFO where init.from expects a checkpoint's manifest or a weights file
// is refused at once: opening it for reading blocked Submit (and with it
// the coordinator's lock) until some writer came.
TEST_F(JobManagerTest, InitFrom_Fifo_RefusedWithoutBlocking) {
  v1::JobSpec spec = SmallSpec(1);
  const std::string step_dir = OutputDir() + "/fifo-ck/step-00000002";
  ASSERT_EQ(system(("mkdir -p " + step_dir).c_str()), 0);
  ASSERT_EQ(mkfifo((step_dir + "/manifest.json").c_str(), 0600), 0);
  ASSERT_EQ(mkfifo((OutputDir() + "/fifo.safetensors").c_str(), 0600), 0);
  for (const char* from : {"fifo-ck/step-00000002", "fifo.safetensors"}) {
    spec.mutable_init()->set_from(from);
    const absl::Status refused = Submit(spec).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << from << ": " << refused;
  }
}

// A link under the output directory to a name that is not UTF-8: the
// resolved path would be saved with the job (a proto3 string), and a stored
// job that is not UTF-8 does not parse back at the next start.
TEST_F(JobManagerTest, InitFrom_ResolvesToAPathNotUtf8_RefusedBeforeItIsSaved) {
  v1::JobSpec spec = SmallSpec(1);
  ASSERT_EQ(system(("mkdir -p '" + OutputDir() + "/latin1-\xe9/step-00000002'").c_str()), 0);
  ASSERT_EQ(symlink("latin1-\xe9", (OutputDir() + "/runs").c_str()), 0);
  spec.mutable_init()->set_from("runs/step-00000002");
  const absl::Status refused = Submit(spec).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_TRUE(
      absl::StrContains(refused.message(), "latin1-\\xe9/step-00000002, a path that is not UTF-8"))
      << refused;
  EXPECT_TRUE(jobs_.List().empty());
}

// A link codec that would send more than the link's fp32 bytes is refused
// at submit (CheckLinkCodecsSmaller), not by ResolveJobSpec, which a
// restart also runs on the jobs it restores.
TEST_F(JobManagerTest, LinkCodecLargerThanTheTensor_RefusedAtSubmit) {
  v1::JobSpec spec = SmallSpec(2);  // links [2, 8, 16]: 1024 bytes
  spec.mutable_compression()->set_forward("powersgd:rank=12");
  const absl::Status refused = Submit(spec).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "more than its 1024 bytes in fp32")) << refused;
  EXPECT_TRUE(jobs_.List().empty());
  spec.mutable_compression()->set_forward("powersgd:rank=4");
  EXPECT_TRUE(Submit(spec).ok());
}

// A checkpoint directory named without an interval would be a promise
// the job does not keep (no checkpoint, and a lost worker fails it): refused
// at submit. A job's spec as Get shows it (keep filled in, no directory)
// is accepted again as it is.
TEST_F(JobManagerTest, CheckpointDir_WithoutAnInterval_Refused) {
  v1::JobSpec spec = SmallSpec(1);
  ASSERT_EQ(spec.checkpoint().interval_steps(), 0);
  spec.mutable_checkpoint()->set_dir("runs/ck");
  const absl::Status refused = Submit(spec).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_EQ(refused.message(),
            "spec.checkpoint.dir: given, but spec.checkpoint.interval_steps is 0, so no "
            "checkpoint would be taken; set interval_steps (1 to 1000000) or leave dir out");
  EXPECT_TRUE(jobs_.List().empty());
  spec.mutable_checkpoint()->clear_dir();
  const v1::Job job = Submit(spec).value();
  ASSERT_TRUE(job.spec().checkpoint().has_keep());
  const absl::StatusOr<v1::Job> again = Submit(job.spec());
  EXPECT_TRUE(again.ok()) << again.status();
}

// The output directory's own name need not be UTF-8 (the operator chose
// it): only the part under it is saved with the job and sent to workers,
// and that part is checked (above).
TEST_F(JobManagerTest, InitFrom_OutputDirNameNotUtf8_Accepted) {
  const std::string root = OutputDir() + "/root-\xe9";
  ASSERT_EQ(mkdir(root.c_str(), 0700), 0);
  v1::JobSpec spec = SmallSpec(1);
  const absl::Status written = WriteSafetensors(root + "/w.safetensors", ZeroWeightsOf(spec));
  ASSERT_TRUE(written.ok()) << written;
  JobManager jobs(&registry_, &hub_, &clock_,
                  JobManagerOptions{.output_dir = root, .background_runner = background_.Runner()});
  spec.mutable_init()->set_from("w.safetensors");
  const absl::StatusOr<v1::Job> job = jobs.Submit(spec);
  background_.RunAll();
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(jobs.Get(job->id()).value().state(), v1::JOB_STATE_QUEUED);
}

// A directory on the way that the coordinator may not enter (EACCES) is
// the operator's to fix: FAILED_PRECONDITION saying so, as for a spec's
// other paths, not INVALID_ARGUMENT "not a checkpoint directory or weights
// file", which sent the user to look for another path.
TEST_F(JobManagerTest, InitFrom_DirectoryClosedToTheCoordinator_FailedPreconditionForTheOperator) {
  v1::JobSpec spec = SmallSpec(1);
  const std::string closed = OutputDir() + "/closed";
  ASSERT_EQ(mkdir(closed.c_str(), 0700), 0);
  const absl::Status written = WriteSafetensors(closed + "/w.safetensors", ZeroWeightsOf(spec));
  ASSERT_TRUE(written.ok()) << written;
  ASSERT_EQ(chmod(closed.c_str(), 0), 0);
  spec.mutable_init()->set_from("closed/w.safetensors");
  absl::Status refused;
  {
    const WithoutFileAccessOverride unprivileged;
    ASSERT_TRUE(unprivileged.ok());
    refused = Submit(spec).status();
  }
  ASSERT_EQ(chmod(closed.c_str(), 0700), 0);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_EQ(refused.message(),
            "spec.init.from: cannot resolve closed/w.safetensors: Permission denied (the "
            "coordinator may not enter it: ask the operator)");
  EXPECT_TRUE(jobs_.List().empty());
  EXPECT_TRUE(Submit(spec).ok());
}

// The check that spec.checkpoint.dir holds no complete checkpoint of a
// later step fails closed: a step directory there that it cannot look into
// may hold one, which the job would overwrite and then delete. The job was
// accepted, as if the directory held none.
TEST_F(JobManagerTest, CheckpointDir_StepDirectoryClosedToTheCoordinator_RefusedNotOverwritten) {
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_checkpoint()->set_interval_steps(1);
  spec.mutable_checkpoint()->set_dir("reuse/ck");
  const std::string step = OutputDir() + "/reuse/ck/step-00000001";
  std::filesystem::create_directories(step);
  std::ofstream(step + "/manifest.json") << "{}";
  ASSERT_EQ(chmod(step.c_str(), 0), 0);
  absl::Status refused;
  {
    const WithoutFileAccessOverride unprivileged;
    ASSERT_TRUE(unprivileged.ok());
    refused = Submit(spec).status();
  }
  ASSERT_EQ(chmod(step.c_str(), 0700), 0);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_EQ(refused.message(),
            "spec.checkpoint.dir: cannot tell whether \"reuse/ck\" holds a complete checkpoint "
            "this job would overwrite: cannot open reuse/ck/step-00000001: Permission denied (the "
            "coordinator may not enter it: ask the operator)");
  EXPECT_TRUE(jobs_.List().empty());
  EXPECT_TRUE(absl::StrContains(Submit(spec).status().message(),
                                "holds the complete checkpoint \"reuse/ck/step-00000001\""));
}

// Out of file descriptors (EMFILE) at submit is a passing shortage of the
// coordinator's, found before anything is kept: UNAVAILABLE saying nothing
// was submitted, which the CLI retries. It was INVALID_ARGUMENT on
// spec.init.from (a user sent to fix a path that was fine), and, for
// output.weights_path, an UNAVAILABLE after which the CLI said the job may
// have been created. Each in a child whose descriptor limit is its lowest
// free descriptor, so that its next open fails.
using JobManagerDeathTest = JobManagerTest;
TEST_F(JobManagerDeathTest, Submit_OutOfDescriptors_UnavailableNothingSubmitted) {
  if (kSanitizedBuild) GTEST_SKIP() << kNoDescriptorsUnderSanitizers;
  const v1::JobSpec spec = SmallSpec(1);
  const absl::Status written =
      WriteSafetensors(OutputDir() + "/w.safetensors", ZeroWeightsOf(spec));
  ASSERT_TRUE(written.ok()) << written;
  std::filesystem::create_directories(OutputDir() + "/ck/step-00000002");
  std::ofstream(OutputDir() + "/ck/step-00000002/manifest.json") << "{}";
  // Prints what Submit answers, for the expectations to match.
  const auto submit_out_of_descriptors = [this](const v1::JobSpec& s) {
    const int lowest_free = dup(0);
    close(lowest_free);
    const struct rlimit limit = {static_cast<rlim_t>(lowest_free),
                                 static_cast<rlim_t>(lowest_free)};
    if (lowest_free < 0 || setrlimit(RLIMIT_NOFILE, &limit) != 0) _exit(2);
    fprintf(stderr, "[%s]\n", jobs_.Submit(s).status().ToString().c_str());
    _exit(0);
  };
  v1::JobSpec weights = spec;
  weights.mutable_init()->set_from("w.safetensors");
  EXPECT_EXIT(submit_out_of_descriptors(weights), ::testing::ExitedWithCode(0),
              "\\[UNAVAILABLE: spec\\.init\\.from: cannot open /: Too many open files; nothing was "
              "submitted\\]");
  v1::JobSpec checkpoint = spec;
  checkpoint.mutable_init()->set_from("ck/step-00000002");
  EXPECT_EXIT(submit_out_of_descriptors(checkpoint), ::testing::ExitedWithCode(0),
              "\\[UNAVAILABLE: spec\\.init\\.from: cannot open /.*/ck/step-00000002/"
              "manifest\\.json: Too many open files; nothing was submitted\\]");
  v1::JobSpec output = spec;
  output.mutable_output()->set_weights_path("out/final.safetensors");
  EXPECT_EXIT(submit_out_of_descriptors(output), ::testing::ExitedWithCode(0),
              "\\[UNAVAILABLE: cannot open the coordinator's --output-dir /.*: Too many open "
              "files; nothing was submitted\\]");
}

// A chunk that cannot be written (past the file size limit here, EFBIG, as
// a full disk's ENOSPC or an NFS quota's EDQUOT) fails the job naming
// spec.output.weights_path and the coordinator's --output-dir: "cannot
// write final.safetensors" alone did not say which volume to look at. In a
// child whose files may not grow once the weights file is created.
TEST_F(JobManagerDeathTest, Weights_ChunkNotWritten_FailsNamingTheOutputDir) {
  const std::string w1 = AddWorker(7001);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_output()->set_weights_path("full/final.safetensors");
  const std::string id = Submit(spec).value().id();
  ASSERT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  const std::vector<ParameterShape> unit0 =
      UnitParameterShapes(ResolveJobSpec(spec).value().train.model, 0);
  ASSERT_GE(unit0.size(), 2u);
  // Prints what the second chunk is answered, and the job's state and reason
  // (the limit lifted first: the death test's stderr is a file too).
  const auto upload_past_the_limit = [&] {
    if (!jobs_.AddWeightsChunk(WholeTensor(w1, id, unit0[0])).ok()) _exit(2);  // created
    struct rlimit saved;
    if (signal(SIGXFSZ, SIG_IGN) == SIG_ERR || getrlimit(RLIMIT_FSIZE, &saved) != 0) _exit(2);
    const struct rlimit limit = {0, saved.rlim_max};
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(2);
    const absl::Status failed = jobs_.AddWeightsChunk(WholeTensor(w1, id, unit0[1]));
    if (setrlimit(RLIMIT_FSIZE, &saved) != 0) _exit(2);
    const v1::Job job = jobs_.Get(id).value();
    fprintf(stderr, "[%s] [%s: %s]\n", failed.ToString().c_str(),
            v1::JobState_Name(job.state()).c_str(), job.reason().c_str());
    _exit(0);
  };
  EXPECT_EXIT(upload_past_the_limit(), ::testing::ExitedWithCode(0),
              "\\[OUT_OF_RANGE: spec\\.output\\.weights_path full/final\\.safetensors under the "
              "coordinator's --output-dir /.*: cannot write final\\.safetensors: File too "
              "large\\] \\[JOB_STATE_FAILED: cannot write the final weights: "
              "spec\\.output\\.weights_path full/final\\.safetensors under the coordinator's "
              "--output-dir /.*: cannot write final\\.safetensors: File too large\\]");
}

// Out of descriptors when a job's first chunk creates its weights file: a
// job that had trained to its last step FAILED, every step lost, and the
// worker, answered RESOURCE_EXHAUSTED, did not retry. The chunk is refused
// UNAVAILABLE (the worker sends the upload again), the job goes on, and the
// upload sent again completes it. In a child whose descriptor limit is,
// for that first chunk only, its lowest free descriptor.
TEST_F(JobManagerDeathTest, Weights_OutOfDescriptorsCreatingTheFile_UnavailableJobGoesOn) {
  if (kSanitizedBuild) GTEST_SKIP() << kNoDescriptorsUnderSanitizers;
  const std::string w1 = AddWorker(7001);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_output()->set_weights_path("short/final.safetensors");
  const std::string id = Submit(spec).value().id();
  ASSERT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  const GptConfig model = ResolveJobSpec(spec).value().train.model;
  // Prints what the first chunk is answered, the job's state then, whether
  // every chunk sent again was taken, and the job's state at the end.
  const auto upload_short_of_descriptors = [&] {
    struct rlimit saved;
    const int lowest_free = dup(0);
    close(lowest_free);
    if (lowest_free < 0 || getrlimit(RLIMIT_NOFILE, &saved) != 0) _exit(2);
    const struct rlimit limit = {static_cast<rlim_t>(lowest_free), saved.rlim_max};
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) _exit(2);
    const absl::Status first =
        jobs_.AddWeightsChunk(WholeTensor(w1, id, UnitParameterShapes(model, 0)[0]));
    if (setrlimit(RLIMIT_NOFILE, &saved) != 0) _exit(2);
    fprintf(stderr, "[%s] [%s]\n", first.ToString().c_str(),
            v1::JobState_Name(jobs_.Get(id).value().state()).c_str());
    absl::Status again;
    for (int u = 0; u < NumUnits(model); ++u) {
      for (const ParameterShape& p : UnitParameterShapes(model, u)) {
        if (again.ok()) again = jobs_.AddWeightsChunk(WholeTensor(w1, id, p));
      }
    }
    if (again.ok()) {
      again = jobs_.ReportProgress(IterationReport(w1, id, 2, {1.0f, 1.0f}, true)).status();
    }
    background_.RunAll();
    if (again.ok()) again = jobs_.FinishWeights(w1, id);
    background_.RunAll();  // the file's sync
    const v1::Job job = jobs_.Get(id).value();
    fprintf(stderr, "[again %s] [%s %s]\n", again.ToString().c_str(),
            v1::JobState_Name(job.state()).c_str(), job.weights_path().c_str());
    _exit(0);
  };
  EXPECT_EXIT(upload_short_of_descriptors(), ::testing::ExitedWithCode(0),
              "\\[UNAVAILABLE: job " + id +
                  ": cannot create the final weights file for now \\(cannot open the "
                  "coordinator's --output-dir /.*: Too many open files\\); upload the weights "
                  "again\\] \\[JOB_STATE_RUNNING\\].*"
                  "\\[again OK\\] \\[JOB_STATE_SUCCEEDED /.*/short/final\\.safetensors\\]");
}

// Completeness is by the elements covered, not by values counted: a chunk
// sent twice does not stand in for a missing one (the file would hold
// zeros there).
TEST_F(JobManagerTest, Weights_DuplicateChunkInsteadOfAMissingOne_IncompleteUploadFails) {
  const std::string w1 = AddWorker(7001);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_output()->set_weights_path("dup.safetensors");
  const std::string id = Submit(spec).value().id();
  const GptConfig model = ResolveJobSpec(spec).value().train.model;
  for (int u = 0; u < NumUnits(model); ++u) {
    for (const ParameterShape& p : UnitParameterShapes(model, u)) {
      if (p.name != "wpe.weight") {
        ASSERT_TRUE(jobs_.AddWeightsChunk(WholeTensor(w1, id, p)).ok()) << p.name;
        continue;
      }
      v1::WeightsChunk whole = WholeTensor(w1, id, p);
      v1::WeightsChunk first_half = whole;
      first_half.mutable_values()->Truncate(whole.values_size() / 2);
      ASSERT_TRUE(jobs_.AddWeightsChunk(first_half).ok());
      ASSERT_TRUE(jobs_.AddWeightsChunk(first_half).ok());  // again; the second half never
    }
  }
  Report(w1, id, 2, {1.0f, 1.0f}, true);
  ASSERT_TRUE(jobs_.FinishWeights(w1, id).ok());
  const v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StartsWith(job.reason(), "incomplete upload of wpe.weight: ")) << job.reason();
  for (const std::string& f : FilesIn(OutputDir())) {
    EXPECT_FALSE(absl::StartsWith(f, "dup.safetensors")) << f << " left behind";
  }
}

// A tensor's chunks scattered with gaps each keep a covered range: past
// kMaxWeightsRuns separate ones, a chunk that would add another is refused;
// one that fills a gap (or extends a range) is still taken.
TEST_F(JobManagerTest, Weights_ChunksScatteredOverTooManyRanges_Refused) {
  const std::string w1 = AddWorker(7001);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_output()->set_weights_path("scattered.safetensors");
  const std::string id = Submit(spec).value().id();
  const GptConfig model = ResolveJobSpec(spec).value().train.model;
  const ParameterShape wte = UnitParameterShapes(model, 0)[0];
  ASSERT_EQ(wte.name, "wte.weight");
  ASSERT_GT(NumElements(Shape(wte.shape.begin(), wte.shape.end())), 2 * (kMaxWeightsRuns + 1));
  v1::WeightsChunk one = WholeTensor(w1, id, wte);
  one.mutable_values()->Truncate(1);
  for (int k = 0; k < kMaxWeightsRuns; ++k) {
    one.set_offset(2 * k);  // a gap after each
    ASSERT_TRUE(jobs_.AddWeightsChunk(one).ok()) << k;
  }
  one.set_offset(2 * kMaxWeightsRuns);
  const absl::Status refused = jobs_.AddWeightsChunk(one);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "send a tensor's chunks in order")) << refused;
  one.set_offset(1);  // fills the first gap
  EXPECT_TRUE(jobs_.AddWeightsChunk(one).ok());
}

// Scattered over many tensors, each below kMaxWeightsRuns, a worker's
// chunks kept ranges for the whole model (about 2M, 140 MB, for a large
// one): the job's, summed over its tensors, are bounded at one a tensor and
// kMaxWeightsRuns more. Here over two tensors: the chunk that would add
// one more is refused; one that fills a gap is still taken.
TEST_F(JobManagerTest, Weights_ChunksScatteredOverTensorsPastTheJobsBound_Refused) {
  const std::string w1 = AddWorker(7001);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_output()->set_weights_path("scattered.safetensors");
  const std::string id = Submit(spec).value().id();
  const GptConfig model = ResolveJobSpec(spec).value().train.model;
  const int tensors = static_cast<int>(ZeroWeightsOf(spec).size());
  const ParameterShape wte = UnitParameterShapes(model, 0)[0];
  ASSERT_EQ(wte.name, "wte.weight");
  ParameterShape largest;  // of the others
  int64_t largest_numel = 0;
  for (int u = 0; u < NumUnits(model); ++u) {
    for (const ParameterShape& p : UnitParameterShapes(model, u)) {
      const int64_t numel = NumElements(Shape(p.shape.begin(), p.shape.end()));
      if (p.name == wte.name || numel <= largest_numel) continue;
      largest = p;
      largest_numel = numel;
    }
  }
  ASSERT_GT(NumElements(Shape(wte.shape.begin(), wte.shape.end())), 2 * kMaxWeightsRuns);
  ASSERT_GT(largest_numel, 2 * (tensors + 1));
  // kMaxWeightsRuns ranges of wte, the most one tensor may have, and one a
  // tensor of the other: the job's bound, each tensor well within its own.
  v1::WeightsChunk one = WholeTensor(w1, id, wte);
  one.mutable_values()->Truncate(1);
  for (int k = 0; k < kMaxWeightsRuns; ++k) {
    one.set_offset(2 * k);  // a gap after each
    ASSERT_TRUE(jobs_.AddWeightsChunk(one).ok()) << k;
  }
  v1::WeightsChunk other = WholeTensor(w1, id, largest);
  other.mutable_values()->Truncate(1);
  for (int k = 0; k < tensors; ++k) {
    other.set_offset(2 * k);
    ASSERT_TRUE(jobs_.AddWeightsChunk(other).ok()) << largest.name << " " << k;
  }
  other.set_offset(2 * tensors);
  const absl::Status refused = jobs_.AddWeightsChunk(other);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_EQ(refused.message(),
            absl::StrCat("chunks of job ", id, "'s weights arrive scattered over more than ",
                         tensors + kMaxWeightsRuns, " separate ranges (one a tensor and ",
                         kMaxWeightsRuns, " more); send each tensor's chunks in order"));
  other.set_offset(1);  // fills the first gap
  EXPECT_TRUE(jobs_.AddWeightsChunk(other).ok());
  EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING);
}

// Cancelled while its weights arrive: the temporary file goes with it.
TEST_F(JobManagerTest, Weights_CancelledDuringTheUpload_TemporaryFileRemoved) {
  const std::string w1 = AddWorker(7001);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_output()->set_weights_path("cancelled/final.safetensors");
  const std::string id = Submit(spec).value().id();
  const GptConfig model = ResolveJobSpec(spec).value().train.model;
  ASSERT_TRUE(jobs_.AddWeightsChunk(WholeTensor(w1, id, UnitParameterShapes(model, 0)[0])).ok());
  ASSERT_EQ(FilesIn(OutputDir() + "/cancelled").size(), 1u);
  ASSERT_TRUE(jobs_.Cancel(id).ok());
  EXPECT_TRUE(FilesIn(OutputDir() + "/cancelled").empty());
}

// The stall gauge (JobSummary::without_step) counts the final weights'
// upload as progress: a large model's could outlast the alert's 15 minutes
// after the last step, and the runbook's cancel would drop the file.
TEST_F(JobManagerTest, Weights_UploadChunk_CountsAsProgressForTheStallGauge) {
  const std::string w1 = AddWorker(7001);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_output()->set_weights_path("stalled/final.safetensors");
  const std::string id = Submit(spec).value().id();
  const GptConfig model = ResolveJobSpec(spec).value().train.model;
  clock_.Advance(absl::Minutes(20));
  ASSERT_EQ(jobs_.Summaries().at(0).without_step, absl::Minutes(20));
  ASSERT_TRUE(jobs_.AddWeightsChunk(WholeTensor(w1, id, UnitParameterShapes(model, 0)[0])).ok());
  EXPECT_EQ(jobs_.Summaries().at(0).without_step, absl::ZeroDuration());
}

TEST_F(JobManagerTest, Weights_UnknownForeignOrMisshapenChunk_RefusedBeforeAllocating) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  v1::JobSpec spec = SmallSpec(2);  // uniform: stage 0 holds embed and attn_0
  spec.mutable_output()->set_weights_path("w.safetensors");
  const std::string id = Submit(spec).value().id();
  ASSERT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  const GptConfig model = ResolveJobSpec(spec).value().train.model;
  v1::WeightsChunk absurd = WholeTensor(w1, id, {"wpe.weight", {1}});
  absurd.clear_shape();
  absurd.add_shape(int64_t{1} << 20);
  absurd.add_shape(int64_t{1} << 20);
  absl::Status status = jobs_.AddWeightsChunk(absurd);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "UploadWeights: wpe.weight has shape [8, 16] in this model; the chunk says "
            "[1048576, 1048576]");
  status = jobs_.AddWeightsChunk(WholeTensor(w1, id, {"all", {4}}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "UploadWeights: job " + id + " has no tensor \"all\"");
  // mlp_0 is stage 1's.
  status = jobs_.AddWeightsChunk(WholeTensor(w1, id, UnitParameterShapes(model, 2)[0]));
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(status.message(),
            "UploadWeights: h.0.ln_2.weight belongs to stage 1, not to " + w1 + "'s stage 0");
  // The tied wte.weight is the embedding's stage's to send: the head's
  // stage holds a copy, and two uploads wrote the file chunk by chunk,
  // whichever came last.
  EXPECT_TRUE(jobs_.AddWeightsChunk(WholeTensor(w1, id, UnitParameterShapes(model, 0)[0])).ok());
  status = jobs_.AddWeightsChunk(WholeTensor(w2, id, UnitParameterShapes(model, 3)[2]));
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(status.message(),
            "UploadWeights: wte.weight belongs to stage 0, not to " + w2 + "'s stage 1");
  EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING);
}

// (device, wire) counts of a program's sends and receives; EXPECTs that
// only raw activations and their gradients are on the device.
std::pair<int, int> DeviceAndWire(const v1::Program& program) {
  int device = 0, wire = 0;
  for (const v1::Instruction& in : program.instructions()) {
    if (!in.has_send() && !in.has_recv()) continue;
    const v1::TensorKey& t = in.has_send() ? in.send().tensor() : in.recv().tensor();
    if ((in.has_send() ? in.send().path() : in.recv().path()) == v1::LINK_PATH_DEVICE) {
      EXPECT_TRUE(t.kind() == v1::TENSOR_KIND_ACTIVATION ||
                  t.kind() == v1::TENSOR_KIND_ACTIVATION_GRAD);
      ++device;
    } else {
      ++wire;
    }
  }
  return {device, wire};
}

std::vector<int> GroupStages(const v1::Assignment& a) {
  return std::vector<int>(a.device_group().stages().begin(), a.device_group().stages().end());
}

TEST_F(JobManagerTest, ThreeGpusOnOneHost_AssignmentsCarryTheGroupAndDevicePaths) {
  const std::vector<std::string> workers = {AddGpuWorker(7001, "gpu-host", 0, "id-1"),
                                            AddGpuWorker(7002, "gpu-host", 1, "id-2"),
                                            AddGpuWorker(7003, "gpu-host", 2, "id-3")};
  v1::JobSpec spec = SmallSpec(3);
  spec.mutable_training()->set_eval_interval(2);
  spec.mutable_training()->set_eval_windows(3);
  const std::string id = Submit(spec).value().id();
  ASSERT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  // Stages 0 and 2 hold the tied embedding: its gradient goes by wire.
  const std::vector<std::pair<int, int>> expected = {{4, 2}, {8, 0}, {4, 2}};
  for (int s = 0; s < 3; ++s) {
    const v1::Assignment a = AssignmentOf(workers[s]);
    EXPECT_EQ(GroupStages(a), (std::vector<int>{0, 1, 2})) << "stage " << s;
    EXPECT_EQ(a.device_group().nccl_unique_id(), "id-1") << "stage " << s;
    // 2 micro-batches: per neighbour an activation and a gradient each.
    EXPECT_EQ(DeviceAndWire(a.program()), expected[s]) << "stage " << s;
    // Evaluation stays on the wire.
    EXPECT_GT(a.eval_program().instructions_size(), 0);
    EXPECT_EQ(DeviceAndWire(a.eval_program()).first, 0) << "stage " << s;
  }
  // Stage 0's id is used up; the others' are still there for later groups.
  EXPECT_EQ(registry_.NcclUniqueId(workers[0]).value(), "");
  EXPECT_EQ(registry_.NcclUniqueId(workers[1]).value(), "id-2");
  EXPECT_EQ(registry_.NcclUniqueId(workers[2]).value(), "id-3");
}

TEST_F(JobManagerTest, ConsumedNcclId_NextJobHasNoGroupUntilAHeartbeatBringsAFreshOne) {
  const std::string w1 = AddGpuWorker(7001, "gpu-host", 0, "id-1");
  const std::string w2 = AddGpuWorker(7002, "gpu-host", 1, "id-2");
  std::string id = Submit(SmallSpec(2)).value().id();
  EXPECT_EQ(AssignmentOf(w2).device_group().nccl_unique_id(), "id-1");
  ASSERT_TRUE(jobs_.Cancel(id).ok());

  id = Submit(SmallSpec(2)).value().id();
  ASSERT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  for (const std::string& w : {w1, w2}) {
    const v1::Assignment a = AssignmentOf(w);
    EXPECT_EQ(a.job_id(), id);
    EXPECT_FALSE(a.has_device_group()) << w;
    EXPECT_EQ(DeviceAndWire(a.program()).first, 0) << w;
  }
  ASSERT_TRUE(jobs_.Cancel(id).ok());

  v1::HeartbeatRequest beat;
  beat.set_worker_id(w1);
  beat.set_incarnation(1);
  beat.set_nccl_unique_id("id-1b");
  ASSERT_TRUE(registry_.Heartbeat(beat).ok());
  id = Submit(SmallSpec(2)).value().id();
  for (const std::string& w : {w1, w2}) {
    const v1::Assignment a = AssignmentOf(w);
    EXPECT_EQ(a.job_id(), id);
    EXPECT_EQ(GroupStages(a), (std::vector<int>{0, 1})) << w;
    EXPECT_EQ(a.device_group().nccl_unique_id(), "id-1b") << w;
    EXPECT_EQ(DeviceAndWire(a.program()).first, 4) << w;
  }
  EXPECT_EQ(registry_.NcclUniqueId(w2).value(), "id-2");
}

// Data parallelism on four GPUs of one host: each replica's two stages
// form a device group (their activations GPU to GPU; members numbered by
// worker), and each exact stage's two replicas a replica device group;
// the four groups carry four different ids (replica 1's device group takes
// its second member's, so stage 0's replica group can take worker 2's),
// all used up. A compressed stage's replicas keep the gRPC collectives.
TEST_F(JobManagerTest, DataParallelOnOneHost_DeviceAndReplicaGroupsWithDistinctIds) {
  std::vector<std::string> w;
  for (int k = 0; k < 4; ++k) {
    w.push_back(AddGpuWorker(7301 + k, "gpu-host", k, absl::StrCat("id-", k)));
  }
  v1::JobSpec spec = SmallSpec(2);
  spec.mutable_parallelism()->set_data(2);
  std::string id = Submit(spec).value().id();
  ASSERT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  const std::vector<std::string> device_ids = {"id-0", "id-0", "id-3", "id-3"};
  const std::vector<std::string> replica_ids = {"id-2", "id-1", "id-2", "id-1"};
  for (int g = 0; g < 4; ++g) {
    SCOPED_TRACE(g);
    const v1::Assignment a = AssignmentOf(w[g]);  // replica g / 2's stage g % 2
    const int first = g / 2 * 2;                  // the replica's first worker
    EXPECT_EQ(GroupStages(a), (std::vector<int>{first, first + 1}));
    EXPECT_EQ(a.device_group().nccl_unique_id(), device_ids[g]);
    // 2 micro-batches over 2 replicas: one each, an activation and a
    // gradient, each sent by one side and received by the other.
    EXPECT_EQ(DeviceAndWire(a.program()).first, 2);
    ASSERT_TRUE(a.has_replica_device_group());
    EXPECT_EQ(a.replica_device_group().nccl_unique_id(), replica_ids[g]);
    EXPECT_EQ(std::vector<int>(a.replica_device_group().replicas().begin(),
                               a.replica_device_group().replicas().end()),
              (std::vector<int>{0, 1}));
  }
  for (int g = 0; g < 4; ++g) EXPECT_EQ(registry_.NcclUniqueId(w[g]).value(), "") << g;
  ASSERT_TRUE(jobs_.Cancel(id).ok());

  // Fresh ids; stage 1 compressed.
  for (int g = 0; g < 4; ++g) {
    v1::HeartbeatRequest beat;
    beat.set_worker_id(w[g]);
    beat.set_incarnation(1);
    beat.set_nccl_unique_id(absl::StrCat("id-", g, "b"));
    ASSERT_TRUE(registry_.Heartbeat(beat).ok());
  }
  spec.mutable_compression()->mutable_data_parallel()->set_codec("powersgd:rank=3");
  spec.mutable_compression()->mutable_data_parallel()->add_stages(1);
  id = Submit(spec).value().id();
  ASSERT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  const v1::Job job = jobs_.Get(id).value();
  for (int g = 0; g < 4; ++g) {
    SCOPED_TRACE(g);
    const v1::Assignment a = AssignmentOf(job.worker_ids(g));
    EXPECT_EQ(a.has_replica_device_group(), a.stage() == 0);
    EXPECT_EQ(a.data_parallel_powersgd_rank(), a.stage() == 1 ? 3 : 0);
  }
}

TEST_F(JobManagerTest, WorkersWithoutNcclIds_NoGroupAndEveryTransferOnTheWire) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  Submit(SmallSpec(2)).value();
  for (const std::string& w : {w1, w2}) {
    const v1::Assignment a = AssignmentOf(w);
    EXPECT_FALSE(a.has_device_group()) << w;
    EXPECT_FALSE(a.has_replica_device_group()) << w;
    const auto [device, wire] = DeviceAndWire(a.program());
    EXPECT_EQ(device, 0) << w;
    EXPECT_GT(wire, 0) << w;
  }
}

// A measured profile of SmallSpec's 4 units, as a worker would send it in
// answer to `request` (its partitions timed too): made-up times, the
// sizes the model gives (CheckWorkerProfile holds it to them).
v1::ModelProfile FakeProfile(const v1::ProfileRequest& request) {
  v1::ModelProfile p;
  p.set_micro_batch_size(2);
  p.set_device_kind("cpu:");
  const ModelProfile sizes =
      AnalyticProfile(ResolveJobSpec(SmallSpec(2)).value().train.model, 8, 2, 1e9);
  for (const UnitProfile& size : sizes.units) {
    v1::UnitProfile* u = p.add_units();
    u->set_name(size.name);
    u->set_fwd_seconds(0.001);
    u->set_bwd_seconds(0.002);
    u->set_weight_bytes(size.weight_bytes);
    u->set_activation_bytes(size.activation_bytes);
    u->set_stash_bytes(size.stash_bytes);
    for (int k : request.partitions()) {
      v1::PartitionTiming* t = u->add_partitions();
      t->set_count(k);
      t->set_fwd_seconds(0.001 / k);
      t->set_bwd_seconds(0.002 / k);
    }
  }
  return p;
}

// A measured profile is stored (on io_, off the job lock), and a restarted
// coordinator plans the model with it without profiling it again.
TEST_F(JobManagerTest, MeasuredProfile_StoredAndTakenBackAfterARestart) {
  MemoryStore store;
  CoordinatorState state(&store);
  int calls = 0;
  const auto fetch = [&calls](
                         const std::string&, const std::string&,
                         const v1::ProfileRequest& request) -> absl::StatusOr<v1::ModelProfile> {
    ++calls;
    return FakeProfile(request);
  };
  v1::JobSpec spec = SmallSpec(2);
  spec.mutable_parallelism()->set_solver("bipartition");
  AddWorker(7001);
  AddWorker(7002);
  std::string first_source;
  {
    JobManager first(&registry_, &hub_, &clock_,
                     JobManagerOptions{.state = &state, .background_runner = background_.Runner()});
    first.SetProfileFetcher(fetch);
    const std::string id = first.Submit(spec).value().id();
    first.AwaitProfiling();
    background_.RunAll();
    first.FlushIo();
    EXPECT_EQ(calls, 1);
    EXPECT_EQ(state.LoadProfiles().value().size(), 1u);
    first_source = first.GetPlan(id).value().profile_source();
    ASSERT_TRUE(first.Cancel(id).ok());
    first.FlushIo();
  }
  JobManager restarted(
      &registry_, &hub_, &clock_,
      JobManagerOptions{.state = &state, .background_runner = background_.Runner()});
  restarted.SetProfileFetcher(fetch);
  ASSERT_TRUE(restarted.Restore().ok());
  spec.set_name("again");
  const std::string id = restarted.Submit(spec).value().id();
  restarted.AwaitProfiling();
  background_.RunAll();
  EXPECT_EQ(calls, 1);  // not profiled again
  EXPECT_EQ(restarted.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(absl::StartsWith(first_source, "measured on cpu: by w-1;")) << first_source;
  const std::string source = restarted.GetPlan(id).value().profile_source();
  EXPECT_TRUE(absl::StartsWith(source, "measured on cpu: for an earlier job (cached)")) << source;
}

// A restarted coordinator with a full profile cache evicts the least
// recently saved profile first, as it would have before the restart.
// Restored in key order, the first profile measured after it evicted the
// alphabetically first key ("a", saved last here) instead.
TEST_F(JobManagerTest, RestoredFullProfileCache_NewProfileEvictsTheLeastRecentlySaved) {
  MemoryStore store;
  CoordinatorState state(&store);
  for (size_t i = 0; i + 1 < kMaxCachedProfiles; ++i) {
    ASSERT_TRUE(state.SaveProfile(absl::StrCat("b-", 100 + i), v1::ModelProfile()).ok());
  }
  ASSERT_TRUE(state.SaveProfile("a", v1::ModelProfile()).ok());
  JobManager restarted(
      &registry_, &hub_, &clock_,
      JobManagerOptions{.state = &state, .background_runner = background_.Runner()});
  ASSERT_TRUE(restarted.Restore().ok());
  ASSERT_EQ(restarted.profiles().size(), static_cast<int>(kMaxCachedProfiles));
  restarted.SetProfileFetcher(
      [](const std::string&, const std::string&,
         const v1::ProfileRequest& request) -> absl::StatusOr<v1::ModelProfile> {
        return FakeProfile(request);
      });
  AddWorker(7001);
  AddWorker(7002);
  v1::JobSpec spec = SmallSpec(2);
  spec.mutable_parallelism()->set_solver("bipartition");
  ASSERT_TRUE(restarted.Submit(spec).ok());
  restarted.AwaitProfiling();
  background_.RunAll();
  restarted.FlushIo();

  const std::map<std::string, v1::ModelProfile> stored = state.LoadProfiles().value();
  EXPECT_EQ(stored.size(), kMaxCachedProfiles);
  EXPECT_EQ(stored.count("a"), 1u);
  EXPECT_EQ(stored.count("b-100"), 0u);  // saved first
  EXPECT_EQ(stored.count("b-101"), 1u);
  EXPECT_EQ(restarted.profiles().size(), static_cast<int>(kMaxCachedProfiles));
  EXPECT_TRUE(restarted.profiles().Get("a").has_value());
  EXPECT_FALSE(restarted.profiles().Get("b-100").has_value());
}

TEST_F(JobManagerTest, BiPartitionJob_ProfilesOnceThenPlansWithTheCachedProfile) {
  int calls = 0;
  std::string asked;
  absl::Notification release;
  jobs_.SetProfileFetcher(
      [&](const std::string& address, const std::string& session,
          const v1::ProfileRequest& request) -> absl::StatusOr<v1::ModelProfile> {
        ++calls;
        asked = absl::StrCat(
            address, " T", request.seq_len(), " B", request.micro_batch_size(),
            session == registry_.SessionToken("w-1").value_or("?") ? " session" : " no session");
        release.WaitForNotification();
        return FakeProfile();
      });
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  v1::JobSpec spec = SmallSpec(2);
  spec.mutable_parallelism()->set_solver("bipartition");
  const std::string id = Submit(spec).value().id();
  v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_PROFILING);
  EXPECT_EQ(job.reason(), "profiling the model on " + w1);
  EXPECT_EQ(registry_.Get(w1).value().state(),
            v1::WORKER_STATE_READY);  // not taken while profiling
  release.Notify();
  jobs_.AwaitProfiling();
  background_.RunAll();
  EXPECT_EQ(asked, "127.0.0.1:7001 T8 B2 session");
  job = jobs_.Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  const v1::Plan plan = jobs_.GetPlan(id).value();
  EXPECT_EQ(plan.solver(), "bipartition");
  EXPECT_TRUE(absl::StartsWith(plan.profile_source(), "measured on cpu: by " + w1 + ";"))
      << plan.profile_source();
  EXPECT_GT(plan.predicted_iteration_seconds(), 0);
  EXPECT_EQ(jobs_.profiles().size(), 1);
  // The same model again: the cache answers, no second profile.
  ASSERT_TRUE(jobs_.Cancel(id).ok());
  const std::string second = Submit(spec).value().id();
  EXPECT_EQ(jobs_.Get(second).value().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(absl::StartsWith(jobs_.GetPlan(second).value().profile_source(),
                               "measured on cpu: for an earlier job (cached);"))
      << jobs_.GetPlan(second).value().profile_source();
}

// A model whose weights, gradients and AdamW moments alone exceed what its
// workers have together was profiled all the same: each unit ran on one
// worker, and units this large killed workers (out of memory) before the
// plan was refused. It is now planned on the analytic profile, and refused.
TEST_F(JobManagerTest, WeightsAloneExceedTheWorkersMemory_RefusedWithoutProfiling) {
  int calls = 0;
  AnswerProfilesCounting(&calls);
  AddCpuWorker(7001, "a", 4'000'000);
  AddCpuWorker(7002, "b", 4'000'000);
  v1::JobSpec spec = SmallSpec(2);
  spec.mutable_model()->set_d_model(256);  // 2 layers of 12 x 256^2 fp32: 6.3 MB, x4 > 8 MB
  spec.mutable_model()->set_n_head(4);
  const std::string id = Submit(spec).value().id();
  jobs_.AwaitProfiling();
  background_.RunAll();
  const v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(job.reason(), "would need")) << job.reason();
}

// The profiler runs each unit whole on the job's first worker: a head
// whose weights, moments, stash and logit gradient exceed that worker was
// profiled all the same (and the kernel killed the worker). The job is
// planned on the analytic profile instead, and runs: the head fits the
// roomier second worker, where the plan puts it.
TEST_F(JobManagerTest, LargestUnitsPassExceedsTheProfilingWorker_PlannedWithoutProfiling) {
  int calls = 0;
  AnswerProfilesCounting(&calls);
  const std::string small = AddCpuWorker(7001, "a", 20'000'000);
  AddCpuWorker(7002, "b", 100'000'000);
  v1::JobSpec spec = SmallSpec(2);
  // The head: 65536 x 16 fp32 weights (4.2 MB) x 4, probabilities and logit
  // gradient of 16 positions (4.2 MB each), its loss and the loss's
  // gradient (4 bytes each): 25 MB in one pass.
  spec.mutable_model()->set_vocab_size(65536);
  const std::string id = Submit(spec).value().id();
  jobs_.AwaitProfiling();
  background_.RunAll();
  const v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  const std::string source = jobs_.GetPlan(id).value().profile_source();
  EXPECT_TRUE(absl::StrContains(
      source, absl::StrCat("not profiled: profiling its largest unit (head: 25170568 bytes (0.02 "
                           "GiB) for one micro-batch) would exceed the memory of ",
                           small, ", which would profile it (20000000 bytes (0.02 GiB))")))
      << source;
}

// As above with a second worker that reports no memory (unlimited): that
// waives the plan-wide bounds, not the profiling worker's own.
TEST_F(JobManagerTest, LargestUnitsPassExceedsTheProfilingWorker_AnotherUnlimited_NotProfiled) {
  int calls = 0;
  AnswerProfilesCounting(&calls);
  const std::string small = AddCpuWorker(7001, "a", 20'000'000);
  AddCpuWorker(7002, "b", 0);
  v1::JobSpec spec = SmallSpec(2);
  spec.mutable_model()->set_vocab_size(65536);
  const std::string id = Submit(spec).value().id();
  jobs_.AwaitProfiling();
  background_.RunAll();
  EXPECT_EQ(calls, 0);
  const std::string source = jobs_.GetPlan(id).value().profile_source();
  EXPECT_TRUE(absl::StrContains(source, absl::StrCat("would exceed the memory of ", small)))
      << source;
}

// The worker profiling a job is drained (SIGTERM drains a worker, and its
// profile is cut short as it stops): the failure says nothing about the
// model, so another worker profiles it and the job plans on that measured
// profile, not on the analytic estimate.
TEST_F(JobManagerTest, ProfilingWorkerLeaves_AnotherProfilesTheModel) {
  std::vector<std::string> asked;
  absl::Notification release;
  jobs_.SetProfileFetcher(
      [&](const std::string& address, const std::string&,
          const v1::ProfileRequest& request) -> absl::StatusOr<v1::ModelProfile> {
        asked.push_back(address);
        if (asked.size() > 1) return FakeProfile();
        release.WaitForNotification();
        return absl::UnavailableError("the worker is shutting down");
      });
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002), w3 = AddWorker(7003);
  v1::JobSpec spec = SmallSpec(2);
  spec.mutable_parallelism()->set_solver("bipartition");
  spec.mutable_checkpoint()->set_interval_steps(5);
  const std::string id = Submit(spec).value().id();
  ASSERT_EQ(jobs_.Get(id).value().reason(), "profiling the model on " + w1);
  ASSERT_TRUE(jobs_.Drain(w1).ok());
  release.Notify();
  jobs_.AwaitProfiling();
  background_.RunAll();
  jobs_.AwaitProfiling();
  background_.RunAll();
  EXPECT_EQ(asked, (std::vector<std::string>{"127.0.0.1:7001", "127.0.0.1:7002"}));
  EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING) << jobs_.Get(id).value().reason();
  const v1::Plan plan = jobs_.GetPlan(id).value();
  EXPECT_TRUE(absl::StartsWith(plan.profile_source(), "measured on cpu: by " + w2))
      << plan.profile_source();
}

// The worker profiling a job restarts in place (same address: same id, a
// new incarnation) and its call fails: READY again by the time the answer
// is taken, it is still the one that left, and another profiles the model
// (before, the job planned on the analytic profile, saying profiling
// failed).
TEST_F(JobManagerTest, ProfilingWorkerRestarts_AnotherProfilesTheModel) {
  std::vector<std::string> asked;
  absl::Notification release;
  jobs_.SetProfileFetcher([&](const std::string& address, const std::string&,
                              const v1::ProfileRequest&) -> absl::StatusOr<v1::ModelProfile> {
    asked.push_back(address);
    if (asked.size() > 1) return FakeProfile();
    release.WaitForNotification();
    return absl::UnavailableError("Connection reset by peer");
  });
  const std::string w1 = AddWorker(7001);
  AddWorker(7002);
  AddWorker(7003);
  v1::JobSpec spec = SmallSpec(2);
  spec.mutable_parallelism()->set_solver("bipartition");
  const std::string id = Submit(spec).value().id();
  ASSERT_EQ(jobs_.Get(id).value().reason(), "profiling the model on " + w1);
  ASSERT_EQ(AddWorker(7001), w1);  // the restarted process
  ASSERT_EQ(registry_.Get(w1).value().state(), v1::WORKER_STATE_READY);
  release.Notify();
  jobs_.AwaitProfiling();
  background_.RunAll();
  jobs_.AwaitProfiling();
  background_.RunAll();
  EXPECT_EQ(asked.size(), 2u);
  EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING) << jobs_.Get(id).value().reason();
  EXPECT_TRUE(absl::StartsWith(jobs_.GetPlan(id).value().profile_source(), "measured on cpu: by "))
      << jobs_.GetPlan(id).value().profile_source();
}

// The worker profiling a job is lost (its host vanished: no connection
// reset reaches the coordinator, and the call would wait out its deadline,
// minutes, with every later job): the next scheduling pass cancels its call,
// and another worker profiles the model. A cancel that comes before the call
// is in flight misses it: each pass cancels again while the worker is lost.
TEST_F(JobManagerTest, ProfilingWorkerLost_ItsCallCancelled_AnotherProfiles) {
  std::vector<std::string> asked, cancelled;
  absl::Notification cancel;
  jobs_.SetProfileFetcher(
      [&](const std::string& address, const std::string&,
          const v1::ProfileRequest&) -> absl::StatusOr<v1::ModelProfile> {
        asked.push_back(address);
        if (asked.size() > 1) return FakeProfile();
        // Bounded: with one cancel only, the test fails rather than hangs.
        cancel.WaitForNotificationWithTimeout(absl::Seconds(60));
        return absl::CancelledError("cancelled");
      },
      nullptr,
      [&](const std::string& address) {
        cancelled.push_back(address);
        if (cancelled.size() == 2) cancel.Notify();  // the first missed the call
      });
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002), w3 = AddWorker(7003);
  v1::JobSpec spec = SmallSpec(2);
  spec.mutable_parallelism()->set_solver("bipartition");
  const std::string id = Submit(spec).value().id();
  ASSERT_EQ(jobs_.Get(id).value().reason(), "profiling the model on " + w1);
  jobs_.ScheduleQueued();
  EXPECT_TRUE(cancelled.empty());  // alive: nothing cancelled
  clock_.Advance(absl::Seconds(4));
  for (const std::string& w : {w2, w3}) {
    v1::HeartbeatRequest beat;
    beat.set_worker_id(w);
    beat.set_incarnation(1);
    ASSERT_TRUE(registry_.Heartbeat(beat).ok());
  }
  clock_.Advance(absl::Seconds(3));
  ASSERT_EQ(registry_.CheckLeases(), 1);  // w1, READY: no job learns of it
  jobs_.ScheduleQueued();
  EXPECT_EQ(cancelled, (std::vector<std::string>{"127.0.0.1:7001"}));
  jobs_.ScheduleQueued();
  EXPECT_EQ(cancelled, (std::vector<std::string>{"127.0.0.1:7001", "127.0.0.1:7001"}));
  jobs_.AwaitProfiling();
  background_.RunAll();
  jobs_.AwaitProfiling();
  background_.RunAll();
  EXPECT_EQ(asked, (std::vector<std::string>{"127.0.0.1:7001", "127.0.0.1:7002"}));
  EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING) << jobs_.Get(id).value().reason();
}

// A job cancelled while its model is profiled: the next scheduling pass
// cancels the profiling call, so its worker (held until the call returns)
// is freed within a unit's measurement, not after the whole profile (up to
// the fetch deadline, 10 minutes) that nobody needs any more.
TEST_F(JobManagerTest, CancelledWhileProfiling_TheCallIsCancelled) {
  std::vector<std::string> cancelled;
  absl::Notification cancel;
  jobs_.SetProfileFetcher(
      [&](const std::string&, const std::string&,
          const v1::ProfileRequest&) -> absl::StatusOr<v1::ModelProfile> {
        // Bounded: never cancelled, the test fails rather than hangs.
        cancel.WaitForNotificationWithTimeout(absl::Seconds(60));
        return absl::CancelledError("cancelled");
      },
      nullptr,
      [&](const std::string& address) {
        cancelled.push_back(address);
        if (!cancel.HasBeenNotified()) cancel.Notify();
      });
  AddWorker(7001);
  const std::string id = Submit(SmallSpec(1)).value().id();
  ASSERT_TRUE(absl::StartsWith(jobs_.Get(id).value().reason(), "profiling the model on "));
  jobs_.ScheduleQueued();
  EXPECT_TRUE(cancelled.empty());  // running: nothing cancelled
  ASSERT_TRUE(jobs_.Cancel(id).ok());
  jobs_.ScheduleQueued();
  EXPECT_EQ(cancelled, (std::vector<std::string>{"127.0.0.1:7001"}));
  jobs_.AwaitProfiling();
  background_.RunAll();
  EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_CANCELLED);
}

// The worker profiling a job stays READY, and later jobs wait for it; but
// an earlier queued job (the profiling one went ahead of it: backfill)
// took it and trained on it while it measured the profile that every later
// plan of that model uses. It is held now, as recovering jobs' survivors.
TEST_F(JobManagerTest, WorkerProfilingAJob_NotTakenByAnEarlierQueuedJob) {
  absl::Notification release;
  jobs_.SetProfileFetcher([&](const std::string&, const std::string&,
                              const v1::ProfileRequest& r) -> absl::StatusOr<v1::ModelProfile> {
    if (r.seq_len() == 4) release.WaitForNotification();  // the later job's model only
    return FakeProfile();
  });
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  // A first job of the older job's model: profiled, and cached for it.
  const std::string primer = Submit(SmallSpec(1)).value().id();
  jobs_.AwaitProfiling();
  background_.RunAll();
  ASSERT_TRUE(jobs_.Cancel(primer).ok());
  const std::string older = Submit(SmallSpec(3)).value().id();  // 3 stages on 2 workers: waits
  ASSERT_EQ(jobs_.Get(older).value().state(), v1::JOB_STATE_QUEUED);
  v1::JobSpec other = SmallSpec(2);
  other.mutable_training()->set_seq_len(4);
  const std::string later = Submit(other).value().id();
  ASSERT_EQ(jobs_.Get(later).value().reason(), "profiling the model on " + w1);
  AddWorker(7003);
  jobs_.ScheduleQueued();
  background_.RunAll();
  EXPECT_EQ(registry_.Get(w1).value().state(), v1::WORKER_STATE_READY);
  const v1::Job waiting = jobs_.Get(older).value();
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(waiting.reason(),
            "waiting for 3 READY workers (2 ready; 1 more READY but held for another job's "
            "profiling, recovery or step boundary)");
  // Once the profile is in, the older job comes first, on all three.
  release.Notify();
  jobs_.AwaitProfiling();
  background_.RunAll();
  EXPECT_EQ(jobs_.Get(older).value().state(), v1::JOB_STATE_RUNNING)
      << jobs_.Get(older).value().reason();
}

// A job cancelled while its model is profiled keeps the worker held until
// the fetch returns (no other job trains beside the measurement), and the
// profile is not cached for later jobs of the model.
TEST_F(JobManagerTest, CancelledWhileProfiling_WorkerHeldUntilTheFetchReturns_NotCached) {
  absl::Notification release;
  jobs_.SetProfileFetcher([&](const std::string&, const std::string&,
                              const v1::ProfileRequest& r) -> absl::StatusOr<v1::ModelProfile> {
    if (r.seq_len() == 4) release.WaitForNotification();  // the profiled job's model only
    return FakeProfile();
  });
  const std::string w1 = AddWorker(7001);
  // A job of another model, profiled and cached first.
  const std::string primer = Submit(SmallSpec(1)).value().id();
  jobs_.AwaitProfiling();
  background_.RunAll();
  ASSERT_TRUE(jobs_.Cancel(primer).ok());
  ASSERT_EQ(jobs_.profiles().size(), 1);
  v1::JobSpec slow = SmallSpec(1);
  slow.mutable_training()->set_seq_len(4);
  const std::string profiled = Submit(slow).value().id();
  ASSERT_EQ(jobs_.Get(profiled).value().reason(), "profiling the model on " + w1);
  ASSERT_TRUE(jobs_.Cancel(profiled).ok());
  const std::string next = Submit(SmallSpec(1)).value().id();  // the cached model
  jobs_.ScheduleQueued();
  background_.RunAll();
  EXPECT_EQ(jobs_.Get(next).value().state(), v1::JOB_STATE_QUEUED)
      << jobs_.Get(next).value().reason();
  // The READY worker it waits for is counted, and why it is not taken.
  EXPECT_EQ(jobs_.Get(next).value().reason(),
            "waiting for 1 READY workers (0 ready; 1 more READY but held for another job's "
            "profiling, recovery or step boundary)");
  release.Notify();
  jobs_.AwaitProfiling();
  background_.RunAll();
  EXPECT_EQ(jobs_.profiles().size(), 1);  // the cancelled job's profile not kept
  EXPECT_EQ(jobs_.Get(next).value().state(), v1::JOB_STATE_RUNNING)
      << jobs_.Get(next).value().reason();
}

// A worker's profile is cached for every later job of the model on its
// device kind, and stored: fields the coordinator does not know (up to the
// 4 MiB reply) are not kept.
TEST_F(JobManagerTest, ProfileReplyUnknownFields_NotCached) {
  v1::ProfileRequest asked;
  jobs_.SetProfileFetcher(
      [&](const std::string&, const std::string&,
          const v1::ProfileRequest& request) -> absl::StatusOr<v1::ModelProfile> {
        asked = request;
        v1::ModelProfile reply = FakeProfile();
        reply.GetReflection()->MutableUnknownFields(&reply)->AddLengthDelimited(
            99, std::string(1 << 16, 'u'));
        return reply;
      });
  const std::string w1 = AddWorker(7001);
  AddWorker(7002);
  v1::JobSpec spec = SmallSpec(2);
  spec.mutable_parallelism()->set_solver("bipartition");
  Submit(spec).value();
  jobs_.AwaitProfiling();
  background_.RunAll();
  ASSERT_EQ(jobs_.profiles().size(), 1);
  const std::optional<v1::ModelProfile> cached =
      jobs_.profiles().Get(ProfileKey(asked, ProfileDeviceKey(registry_.Get(w1).value().device(),
                                                              registry_.Get(w1).value().build())));
  ASSERT_TRUE(cached.has_value());
  EXPECT_TRUE(cached->GetReflection()->GetUnknownFields(*cached).empty());
  EXPECT_EQ(cached->SerializeAsString(), FakeProfile().SerializeAsString());
}

// A job queued behind one being profiled waits for it, and its reason
// says so with the count of READY workers it could take (not the one
// profiling).
TEST_F(JobManagerTest, QueuedBehindAProfilingJob_ReasonNamesItAndCountsReady) {
  absl::Notification release;
  HoldProfilesUntil(&release);
  AddWorker(7001);
  AddWorker(7002);
  AddWorker(7003);
  const std::string first = Submit(SmallSpec(2)).value().id();
  ASSERT_EQ(jobs_.Get(first).value().state(), v1::JOB_STATE_PROFILING);
  const std::string second = Submit(SmallSpec(1)).value().id();
  Schedule();
  const v1::Job waiting = jobs_.Get(second).value();
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(waiting.reason(), absl::StrCat("waiting while job ", first, " is profiled (2 ready)"));
  release.Notify();
  jobs_.AwaitProfiling();
  background_.RunAll();
  Schedule();
  EXPECT_EQ(jobs_.Get(first).value().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(jobs_.Get(second).value().state(), v1::JOB_STATE_RUNNING);
}

// A queued job short of workers fails at its queue timeout even while
// another job is profiled: the profile would not give it more workers
// (it waited out the whole profile, up to three 10-minute attempts).
TEST_F(JobManagerTest, QueuedShortOfWorkersBehindAProfilingJob_FailsAtItsQueueTimeout) {
  absl::Notification release;
  HoldProfilesUntil(&release);
  AddWorker(7001);
  AddWorker(7002);
  const std::string first = Submit(SmallSpec(2)).value().id();
  ASSERT_EQ(jobs_.Get(first).value().state(), v1::JOB_STATE_PROFILING);
  v1::JobSpec big = SmallSpec(3);
  big.mutable_scheduling()->mutable_queue_timeout()->set_seconds(60);
  const std::string second = Submit(big).value().id();
  Schedule();
  EXPECT_EQ(jobs_.Get(second).value().state(), v1::JOB_STATE_QUEUED);
  clock_.Advance(absl::Seconds(61));
  Schedule();
  const v1::Job failed = jobs_.Get(second).value();
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(failed.reason(), "not placed within spec.scheduling.queue_timeout"))
      << failed.reason();
  release.Notify();
  jobs_.AwaitProfiling();
  background_.RunAll();
  Schedule();
  EXPECT_EQ(jobs_.Get(first).value().state(), v1::JOB_STATE_RUNNING);
}

// An auto layout that searches T with tensor_partitions 0 may choose
// stages of 2 ranks, whose AccTFM Alg. 1 needs the units timed on halves
// of a micro-batch: the profile asks for them before any T is chosen
// (micro-batches of 2 samples: halves, no quarters). With partitions 1 it
// does not.
TEST_F(JobManagerTest, AutoLayoutSearchingT_ProfilesThePartitionsAlgOneNeeds) {
  std::vector<std::vector<int>> asked;
  jobs_.SetProfileFetcher(
      [&](const std::string&, const std::string&,
          const v1::ProfileRequest& request) -> absl::StatusOr<v1::ModelProfile> {
        asked.emplace_back(request.partitions().begin(), request.partitions().end());
        return FakeProfile(request);
      });
  AddWorker(7001);
  AddWorker(7002);
  v1::JobSpec spec = SmallSpec(0);
  spec.mutable_parallelism()->set_data(0);
  spec.mutable_parallelism()->set_tensor(0);
  spec.mutable_parallelism()->set_workers(2);
  spec.mutable_parallelism()->set_tensor_partitions(0);
  const std::string id = Submit(spec).value().id();
  jobs_.AwaitProfiling();
  background_.RunAll();
  ASSERT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING) << jobs_.Get(id).value().reason();
  ASSERT_TRUE(jobs_.Cancel(id).ok());
  spec.mutable_parallelism()->set_tensor_partitions(1);
  const std::string plain = Submit(spec).value().id();
  jobs_.AwaitProfiling();
  background_.RunAll();
  ASSERT_EQ(jobs_.Get(plain).value().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(asked, (std::vector<std::vector<int>>{{2}, {}}));
}

// The uniform split needs no costs, but its prediction does: measured too.
TEST_F(JobManagerTest, UniformJob_IsProfiledToo) {
  int calls = 0;
  AnswerProfilesCounting(&calls);
  const std::string w1 = AddWorker(7001);
  AddWorker(7002);
  const std::string id = Submit(SmallSpec(2)).value().id();  // solver uniform
  jobs_.AwaitProfiling();
  background_.RunAll();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  const v1::Plan plan = jobs_.GetPlan(id).value();
  EXPECT_EQ(plan.solver(), "uniform");
  EXPECT_TRUE(absl::StartsWith(plan.profile_source(), "measured on cpu: by " + w1))
      << plan.profile_source();
}

TEST_F(JobManagerTest, ProfilingFails_JobRunsOnTheAnalyticProfileAndSaysWhy) {
  const std::string id = SubmitWithFailingProfiler(absl::UnavailableError("worker gone"));
  EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  const v1::Plan plan = jobs_.GetPlan(id).value();
  EXPECT_TRUE(absl::StrContains(plan.profile_source(), "analytic: FLOPs at"));
  EXPECT_TRUE(
      absl::StrContains(plan.profile_source(), "profiling failed: UNAVAILABLE: worker gone"))
      << plan.profile_source();
  EXPECT_EQ(plan.candidates_size(), 3);
}

// A profile that ran past the fetch's deadline on two workers (the job's
// first, then another of its kind: the first might have been wedged) would
// again: later jobs of the model plan on the analytic profile at once,
// saying why, rather than each hold the queue for the whole deadline; an
// hour later it is tried again. Another failure (a worker gone) is not
// remembered.
TEST_F(JobManagerTest, ProfilingTimesOut_LaterJobsOfTheModelDoNotWaitForItAgain) {
  int calls = 0;
  absl::Status answer = absl::DeadlineExceededError("Deadline Exceeded");
  jobs_.SetProfileFetcher([&](const std::string&, const std::string&,
                              const v1::ProfileRequest&) -> absl::StatusOr<v1::ModelProfile> {
    ++calls;
    return answer;
  });
  int port = 7001;
  const auto run_one = [&] {  // on two new workers (the clock moves past the others' heartbeats)
    AddWorker(port++);
    AddWorker(port++);
    const std::string id = Submit(SmallSpec(2)).value().id();
    jobs_.AwaitProfiling();
    background_.RunAll();
    EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING);
    const std::string source = jobs_.GetPlan(id).value().profile_source();
    EXPECT_TRUE(jobs_.Cancel(id).ok());
    return source;
  };
  EXPECT_TRUE(absl::StrContains(run_one(), "profiling failed: DEADLINE_EXCEEDED"));
  EXPECT_EQ(calls, 2);
  clock_.Advance(absl::Minutes(30));
  const std::string second = run_one();
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(absl::StrContains(second,
                                "profiling failed: an earlier job's profile of this model (on "
                                "cpu:) ran past the coordinator's deadline (DEADLINE_EXCEEDED: "
                                "Deadline Exceeded); not tried again for another 30m"))
      << second;
  clock_.Advance(absl::Minutes(31));
  answer = absl::UnavailableError("worker gone");
  EXPECT_TRUE(absl::StrContains(run_one(), "profiling failed: UNAVAILABLE: worker gone"));
  EXPECT_EQ(calls, 3);
  run_one();
  EXPECT_EQ(calls, 4);
}

// A worker's error text may hold any bytes (gRPC decodes a status
// message's %XX escapes): saved with the job in the plan's profile_source,
// one that is not UTF-8 would not parse back, and the coordinator would
// refuse its own state at the next start.
TEST_F(JobManagerTest, ProfilingFailsWithBytesNotUtf8_ProfileSourceParsesBack) {
  const std::string id = SubmitWithFailingProfiler(absl::UnknownError("worker \xff gone"));
  const v1::Plan plan = jobs_.GetPlan(id).value();
  EXPECT_TRUE(absl::StrContains(plan.profile_source(), "UNKNOWN: worker \\xff gone"))
      << plan.profile_source();
  v1::Plan parsed;
  EXPECT_TRUE(parsed.ParseFromString(plan.SerializeAsString()));
  EXPECT_EQ(parsed.profile_source(), plan.profile_source());
}

// A worker that answers with a profile of another model (one unit too
// many: the planner would index past the model and CHECK-fail) is refused
// like a failed profiling: the job runs on the analytic profile, says why,
// and nothing is cached or saved for later jobs and restarts.
TEST_F(JobManagerTest, WorkerProfileUnfitForTheModel_RefusedNotCached) {
  jobs_.SetProfileFetcher([](const std::string&, const std::string&,
                             const v1::ProfileRequest&) -> absl::StatusOr<v1::ModelProfile> {
    v1::ModelProfile p = FakeProfile();
    *p.add_units() = p.units(1);
    return p;
  });
  AddWorker(7001);
  AddWorker(7002);
  v1::JobSpec spec = SmallSpec(2);
  spec.mutable_parallelism()->set_solver("bipartition");
  const std::string id = Submit(spec).value().id();
  jobs_.AwaitProfiling();
  background_.RunAll();
  EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_RUNNING) << jobs_.Get(id).value().reason();
  const v1::Plan plan = jobs_.GetPlan(id).value();
  EXPECT_TRUE(absl::StrContains(plan.profile_source(), "analytic: FLOPs at"));
  EXPECT_TRUE(absl::StrContains(plan.profile_source(),
                                "profiling failed: INVALID_ARGUMENT: worker profile: units has 5 "
                                "entries; the model has 4 units"))
      << plan.profile_source();
  EXPECT_EQ(jobs_.profiles().size(), 0);
}

TEST_F(JobManagerTest, UploadWithoutTensors_ForwardOnlyStageFinishesItsWeights) {
  const std::string w1 = AddWorker(7001);
  const std::string id = Submit(SmallSpec(1)).value().id();
  v1::WeightsChunk identity;
  identity.set_worker_id(w1);
  identity.set_job_id(id);
  EXPECT_TRUE(jobs_.AddWeightsChunk(identity).ok());
  identity.add_values(1.0f);
  EXPECT_EQ(jobs_.AddWeightsChunk(identity).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(JobManagerTest, Submit_OverPlanningBudget_ResourceExhaustedBeforeAnyWork) {
  v1::JobSpec spec = SmallSpec(64);
  spec.mutable_model()->set_n_layer(96);  // 194 units: 64 * 194^3 = 4.7e8 bipartition steps
  spec.mutable_parallelism()->set_solver("bipartition");
  absl::Status status = Submit(spec).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(status.message(), "planning budget")) << status.message();
  EXPECT_TRUE(absl::StrContains(status.message(), "; use solver pipedream or uniform, or fewer"))
      << status.message();
  spec.mutable_parallelism()->set_solver("pipedream");
  EXPECT_TRUE(Submit(spec).ok());
  spec = SmallSpec(4);
  spec.mutable_training()->set_batch_size(4096);
  spec.mutable_training()->set_micro_batches(4096);
  spec.mutable_training()->set_eval_interval(10);  // + 16 validation micro-batches
  spec.mutable_training()->set_eval_windows(16);   // 4 x (4096 + 16) > 16384
  status = Submit(spec).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StartsWith(status.message(), "spec.training.micro_batches: 4 stages x (4096"))
      << status.message();
  // Validation windows the larger part: named so (eval_windows is within
  // its own bound).
  spec.mutable_training()->set_batch_size(4);
  spec.mutable_training()->set_micro_batches(4);
  spec.mutable_training()->set_eval_windows(65536);  // micro-batches of 1 window
  status = Submit(spec).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StartsWith(status.message(), "spec.training.eval_windows: 4 stages x (4 "))
      << status.message();
  EXPECT_EQ(jobs_.List().size(), 1u);
}

// An elastic job re-plans on up to elastic.max_workers stages when spare
// workers come: the budget holds for that plan, which no later check sees.
TEST_F(JobManagerTest, Submit_ElasticGrowthOverPlanningBudget_ResourceExhausted) {
  v1::JobSpec spec = SmallSpec(2);
  spec.mutable_model()->set_n_layer(96);  // 194 units: 2 * 194^3 = 1.5e7 steps to start
  spec.mutable_parallelism()->set_solver("bipartition");
  spec.mutable_checkpoint()->set_interval_steps(5);  // growth needs checkpoints
  spec.mutable_elastic()->set_max_workers(64);       // 64 * 194^3 = 4.7e8 once grown
  absl::Status status = Submit(spec).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(status.message(), "64 stages (spec.elastic.max_workers)"))
      << status.message();
  EXPECT_TRUE(absl::StrContains(status.message(), "a lower spec.elastic.max_workers"))
      << status.message();
  spec.mutable_elastic()->set_max_workers(32);  // 2.3e8
  EXPECT_TRUE(Submit(spec).ok());
  spec = SmallSpec(2);
  spec.mutable_model()->set_n_layer(2);  // 6 units
  spec.mutable_training()->set_batch_size(4096);
  spec.mutable_training()->set_micro_batches(4096);  // 2 x 4096 to start
  spec.mutable_checkpoint()->set_interval_steps(5);
  spec.mutable_elastic()->set_max_workers(6);  // 6 x 4096 > 16384 once grown
  status = Submit(spec).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StartsWith(
      status.message(), "spec.training.micro_batches: 6 stages (spec.elastic.max_workers) x"))
      << status.message();
  EXPECT_EQ(jobs_.List().size(), 1u);
}

TEST_F(JobManagerTest, Submit_WeightsPathWithoutOutputDirOrEscaping_Rejected) {
  JobManager no_output(&registry_, &hub_, &clock_);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_output()->set_weights_path("w.safetensors");
  absl::Status status = no_output.Submit(spec).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(status.message(),
                               "spec.output.weights_path: this coordinator "
                               "writes no files"))
      << status.message();
  ASSERT_EQ(symlink("/tmp", (OutputDir() + "/escape").c_str()), 0);
  spec.mutable_output()->set_weights_path("escape/w.safetensors");
  status = Submit(spec).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "\"escape\" is a symbolic link"))
      << status.message();
}

TEST_F(JobManagerTest, Submit_PendingLimit_ResourceExhausted) {
  JobManager small(&registry_, &hub_, &clock_, JobManagerOptions{.max_pending_jobs = 2});
  ASSERT_TRUE(small.Submit(SmallSpec(3)).ok());  // no workers: both stay QUEUED
  ASSERT_TRUE(small.Submit(SmallSpec(3)).ok());
  absl::Status status = small.Submit(SmallSpec(3)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(small.Cancel(small.List()[0].id()).ok());
  EXPECT_TRUE(small.Submit(SmallSpec(3)).ok());
}

// request_id: a repeat with the same spec is the same job; another spec is
// ALREADY_EXISTS; malformed ids are refused.
TEST_F(JobManagerTest, Submit_RequestId_RepeatIsTheSameJobOtherSpecRefused) {
  v1::JobSpec spec = SmallSpec(3);
  const absl::StatusOr<v1::Job> first = jobs_.Submit(spec, "5f0c2a1e-0b7d-4c39-9a51-3e2d9c7b8a10");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->request_id(), "5f0c2a1e-0b7d-4c39-9a51-3e2d9c7b8a10");
  const absl::StatusOr<v1::Job> again = jobs_.Submit(spec, "5f0c2a1e-0b7d-4c39-9a51-3e2d9c7b8a10");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->id(), first->id());
  EXPECT_EQ(jobs_.List().size(), 1u);
  v1::JobSpec other = spec;
  other.mutable_training()->set_steps(spec.training().steps() + 1);
  const absl::Status refused = jobs_.Submit(other, "5f0c2a1e-0b7d-4c39-9a51-3e2d9c7b8a10").status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kAlreadyExists) << refused;
  // Without an id, or with another, each Submit is a job.
  EXPECT_NE(jobs_.Submit(spec).value().id(), first->id());
  EXPECT_NE(jobs_.Submit(spec, "b").value().id(), first->id());
  EXPECT_EQ(jobs_.List().size(), 3u);
  for (const std::string& bad : {std::string("has space"), std::string("slash/"),
                                 std::string("\xff"), std::string(kMaxRequestIdBytes + 1, 'a')}) {
    SCOPED_TRACE(bad);
    const absl::Status status = jobs_.Submit(spec, bad).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_TRUE(absl::StartsWith(status.message(), "request_id: ")) << status;
  }
  EXPECT_TRUE(jobs_.Submit(spec, std::string(kMaxRequestIdBytes, 'a')).ok());
  EXPECT_EQ(jobs_.List().size(), 4u);
}

TEST_F(JobManagerTest, EndedJobs_PrunedByCountAndAge_NewestKept) {
  JobManager jobs(
      &registry_, &hub_, &clock_,
      JobManagerOptions{
          .id_epoch = "e1", .ended_job_retention = absl::Hours(1), .max_ended_jobs = 2});
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(jobs.Submit(SmallSpec(3)).value().id());
    ASSERT_TRUE(jobs.Cancel(ids.back()).ok());
  }
  EXPECT_EQ(ids[0], "job-e1-1");
  ids.push_back(jobs.Submit(SmallSpec(3)).value().id());  // prunes the oldest ended
  EXPECT_EQ(jobs.Get(ids[0]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(jobs.Get(ids[1]).ok());
  clock_.Advance(absl::Hours(2));
  ids.push_back(jobs.Submit(SmallSpec(3)).value().id());  // prunes the old ones by age
  EXPECT_EQ(jobs.Get(ids[1]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(jobs.Get(ids[2]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(jobs.List().size(), 2u);  // the two still queued
  // Jobs that end while nothing is submitted are pruned too, by the
  // scheduling pass (they stayed until the next submit).
  auto ended = [&jobs] {
    int n = 0;
    for (const v1::Job& job : jobs.List()) n += IsTerminal(job.state()) ? 1 : 0;
    return n;
  };
  std::vector<std::string> later;
  for (int i = 0; i < 3; ++i) later.push_back(jobs.Submit(SmallSpec(3)).value().id());
  for (const std::string& id : later) ASSERT_TRUE(jobs.Cancel(id).ok());
  ASSERT_GT(ended(), 2);
  jobs.ScheduleQueued();
  EXPECT_EQ(ended(), 2);
  EXPECT_TRUE(jobs.Get(later.back()).ok());  // the newest kept
}

// Pruning goes by when a job ended, not when it was submitted: a long job
// submitted before many short ones was pruned the moment it ended, and the
// user following it lost its outcome.
TEST_F(JobManagerTest, EndedJobs_PrunedByWhenTheyEnded_NotBySubmission) {
  JobManager jobs(&registry_, &hub_, &clock_,
                  JobManagerOptions{.id_epoch = "e2", .max_ended_jobs = 2});
  const std::string long_job = jobs.Submit(SmallSpec(3)).value().id();  // no workers: queued
  std::vector<std::string> short_jobs;
  for (int i = 0; i < 2; ++i) {
    clock_.Advance(absl::Seconds(1));
    short_jobs.push_back(jobs.Submit(SmallSpec(3)).value().id());
    ASSERT_TRUE(jobs.Cancel(short_jobs.back()).ok());
  }
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(jobs.Cancel(long_job).ok());
  jobs.ScheduleQueued();  // the pruning pass
  const absl::StatusOr<v1::Job> kept = jobs.Get(long_job);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(jobs.Get(short_jobs[0]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(jobs.Get(short_jobs[1]).ok());
}

// A MemoryStore whose commits fail while `failing` is set (an unreachable
// state store).
class UnreachableWhileFailingStore final : public MemoryBackedStore {
 public:
  absl::Status Commit(const std::vector<StoreWrite>& writes) override {
    if (failing.load()) return absl::UnavailableError("the store is unreachable");
    return CommitThrough(writes);
  }
  std::string Describe() const override { return "memory"; }

  std::atomic<bool> failing{false};
};

// Job `id` (one stage, on `worker`, checkpoints every 5 steps) runs steps 1
// to 5 and reports its checkpoint of step 5, which completes it.
void RunToCheckpointFive(JobManager& jobs, const std::string& worker, const std::string& id,
                         const v1::Assignment& assignment) {
  for (int64_t iteration = 0; iteration < 5; ++iteration) {
    v1::ReportProgressRequest step;
    step.set_worker_id(worker);
    step.set_job_id(id);
    step.set_plan_version(1);
    step.set_iteration(iteration);
    step.add_micro_batch_losses(1.0f);
    step.add_micro_batch_losses(1.0f);
    ASSERT_TRUE(jobs.ReportProgress(step).ok()) << iteration;
  }
  v1::ReportProgressRequest checkpoint;
  checkpoint.set_worker_id(worker);
  checkpoint.set_job_id(id);
  checkpoint.set_plan_version(1);
  checkpoint.set_iteration(4);
  checkpoint.mutable_checkpoint()->set_step(5);
  for (int u = assignment.backward_units().begin(); u < assignment.backward_units().end(); ++u) {
    v1::UnitFile* f = checkpoint.mutable_checkpoint()->add_units();
    f->set_unit(u);
    f->set_file(absl::StrFormat("unit-%04d.safetensors", u));
    f->set_bytes(100 + u);
    f->set_sha256(std::string(64, 'a' + u));
  }
  ASSERT_TRUE(jobs.ReportProgress(checkpoint).ok());
  EXPECT_EQ(jobs.Get(id).value().progress().checkpoint_step(), 5);
}

// The unit files RunToCheckpointFive reports, in `step_dir`, each of the
// size reported (the stage would have written them there).
void WriteUnitFilesOfFive(const std::string& step_dir, const v1::Assignment& assignment) {
  std::filesystem::create_directories(step_dir);
  for (int u = assignment.backward_units().begin(); u < assignment.backward_units().end(); ++u) {
    std::ofstream(absl::StrFormat("%s/unit-%04d.safetensors", step_dir, u), std::ios::binary)
        << std::string(100 + u, 'w');
  }
}

// An ended job whose newest checkpoint's manifest failed to write (a full
// or read-only volume; here a directory in its place, which even root
// cannot rename over) is not pruned while the write is tried again every
// 5 s, even past max_ended_jobs: pruned, the retry found no job and gave
// up, and the checkpoint stayed without a manifest for good (export and
// init.from took an older step). Once written, the job goes.
TEST_F(JobManagerTest, EndedJobs_ManifestWriteRetrying_NotPrunedUntilWritten) {
  JobManager jobs(&registry_, &hub_, &clock_,
                  JobManagerOptions{.output_dir = OutputDir(),
                                    .id_epoch = "e3",
                                    .max_ended_jobs = 1,
                                    .background_runner = background_.Runner()});
  const std::string worker = AddWorker(7001);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_training()->set_steps(100);
  spec.mutable_checkpoint()->set_interval_steps(5);
  spec.mutable_checkpoint()->set_dir("retried");
  const std::string id = jobs.Submit(spec).value().id();
  background_.RunAll();
  ASSERT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  const std::string manifest = OutputDir() + "/retried/step-00000005/manifest.json";
  std::filesystem::create_directories(manifest + "/in-the-way");
  // A retry writes only over the files the manifest records.
  WriteUnitFilesOfFive(OutputDir() + "/retried/step-00000005", AssignmentOf(worker));
  ASSERT_NO_FATAL_FAILURE(RunToCheckpointFive(jobs, worker, id, AssignmentOf(worker)));
  jobs.FlushIo();
  ASSERT_TRUE(std::filesystem::is_directory(manifest));  // the write failed
  ASSERT_TRUE(jobs.Cancel(id).ok());
  // Past the late sweep's wait: the end's sweeps are done, which alone no
  // longer holds the job. The retries meanwhile fail too.
  clock_.Advance(kLateSweepWait + absl::Seconds(1));
  for (int pass = 0; pass < 2; ++pass) {
    jobs.ScheduleQueued();
    jobs.FlushIo();
  }
  clock_.Advance(absl::Seconds(1));
  const std::string later = jobs.Submit(SmallSpec(3)).value().id();  // one worker: queued
  ASSERT_TRUE(jobs.Cancel(later).ok());
  jobs.ScheduleQueued();  // the pruning pass: `later` is the one ended job kept
  ASSERT_TRUE(jobs.Get(id).ok()) << "pruned with its manifest unwritten";
  std::filesystem::remove_all(manifest);  // the way cleared
  clock_.Advance(absl::Seconds(5));
  jobs.ScheduleQueued();
  jobs.FlushIo();
  EXPECT_TRUE(std::filesystem::is_regular_file(manifest));
  jobs.ScheduleQueued();
  EXPECT_EQ(jobs.Get(id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(jobs.Get(later).ok());
}

// The same retry after the step directory was removed (an operator freeing
// space; it had no manifest): the directory is not made again holding only
// a manifest, which passed it for a complete checkpoint that export and
// init.from would take and no stage could load. The manifest is dropped,
// said once, and no longer holds the ended job.
TEST_F(JobManagerTest, EndedJobs_ManifestRetryAfterItsStepDirWasRemoved_DirNotMadeAgain) {
  JobManager jobs(&registry_, &hub_, &clock_,
                  JobManagerOptions{.output_dir = OutputDir(),
                                    .id_epoch = "e5",
                                    .max_ended_jobs = 1,
                                    .background_runner = background_.Runner()});
  const std::string worker = AddWorker(7001);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_training()->set_steps(100);
  spec.mutable_checkpoint()->set_interval_steps(5);
  spec.mutable_checkpoint()->set_dir("freed");
  const std::string id = jobs.Submit(spec).value().id();
  background_.RunAll();
  ASSERT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  const std::string step_dir = OutputDir() + "/freed/step-00000005";
  std::filesystem::create_directories(step_dir + "/manifest.json/in-the-way");
  WriteUnitFilesOfFive(step_dir, AssignmentOf(worker));
  ASSERT_NO_FATAL_FAILURE(RunToCheckpointFive(jobs, worker, id, AssignmentOf(worker)));
  jobs.FlushIo();
  ASSERT_TRUE(std::filesystem::is_directory(step_dir + "/manifest.json"));  // the write failed
  ASSERT_TRUE(jobs.Cancel(id).ok());
  jobs.FlushIo();  // the end's first sweep (it keeps the complete step)
  ASSERT_TRUE(std::filesystem::is_directory(step_dir));
  std::filesystem::remove_all(step_dir);
  ::testing::internal::CaptureStderr();
  clock_.Advance(absl::Seconds(5));
  jobs.ScheduleQueued();  // the retry
  jobs.FlushIo();
  const std::string logged = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(std::filesystem::exists(step_dir));
  EXPECT_EQ(::pipetrain::testing::LinesWith(
                logged, "job " + id +
                            ": the manifest of checkpoint freed/step-00000005 is not written: its "
                            "directory is gone"),
            1)
      << logged;
  // Past the late sweep's wait, the job is pruned like any other.
  clock_.Advance(kLateSweepWait + absl::Seconds(1));
  for (int pass = 0; pass < 2; ++pass) {
    jobs.ScheduleQueued();
    jobs.FlushIo();
  }
  EXPECT_FALSE(std::filesystem::exists(step_dir));
  clock_.Advance(absl::Seconds(1));
  const std::string later = jobs.Submit(SmallSpec(3)).value().id();  // one worker: queued
  ASSERT_TRUE(jobs.Cancel(later).ok());
  jobs.ScheduleQueued();
  EXPECT_EQ(jobs.Get(id).status().code(), absl::StatusCode::kNotFound);
}

// A cancelled job whose manifest waits for a save that succeeds (the state
// store unreachable) is not pruned past the retention while its end is
// unsaved (a failover would run it again), and leaves no held manifest
// behind once the save succeeds and it is pruned: held manifests grew with
// every such job for the process's life.
TEST_F(JobManagerTest, EndedJobs_CancelledWithAHeldManifest_PrunedOnceSavedNoneLeftHeld) {
  UnreachableWhileFailingStore store;
  CoordinatorState state(&store);
  JobManager jobs(&registry_, &hub_, &clock_,
                  JobManagerOptions{.output_dir = OutputDir(),
                                    .id_epoch = "e4",
                                    .ended_job_retention = absl::Hours(1),
                                    .state = &state,
                                    .background_runner = background_.Runner()});
  const std::string worker = AddWorker(7001);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_training()->set_steps(100);
  spec.mutable_checkpoint()->set_interval_steps(5);
  spec.mutable_checkpoint()->set_dir("held");
  const std::string id = jobs.Submit(spec).value().id();
  background_.RunAll();
  ASSERT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  store.failing = true;
  ASSERT_NO_FATAL_FAILURE(RunToCheckpointFive(jobs, worker, id, AssignmentOf(worker)));
  jobs.FlushIo();
  ASSERT_EQ(jobs.HeldManifestsForTesting(id), 1u);
  (void)jobs.Cancel(id);  // ended here; its save fails (UNAVAILABLE, retried)
  ASSERT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_CANCELLED);
  clock_.Advance(absl::Hours(2));
  // The first pass retries the save (it fails) and sweeps the directory a
  // second time; the next keeps the job, its end unsaved.
  for (int pass = 0; pass < 2; ++pass) {
    jobs.ScheduleQueued();
    jobs.FlushIo();
  }
  ASSERT_TRUE(jobs.Get(id).ok());
  EXPECT_EQ(jobs.HeldManifestsForTesting(id), 1u);
  store.failing = false;
  clock_.Advance(absl::Seconds(1));
  jobs.ScheduleQueued();  // the save's retry, which succeeds
  jobs.FlushIo();
  jobs.ScheduleQueued();  // prunes it, its retention over
  ASSERT_EQ(jobs.Get(id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(jobs.HeldManifestsForTesting(id), 0u);
}

// A manifest held by a failed save is written after a later save that
// succeeds, which may come hours on: checked as a retry is. Here the job
// ended and its step directory was removed meanwhile (an operator freeing
// space; without a manifest it looked incomplete): the save that succeeds
// does not make it again holding only a manifest, which passed it for a
// complete checkpoint that export and init.from would take and no stage
// could load. The manifest is dropped, said once.
TEST_F(JobManagerTest, EndedJobs_HeldManifestAfterItsStepDirWasRemoved_DirNotMadeAgain) {
  UnreachableWhileFailingStore store;
  CoordinatorState state(&store);
  JobManager jobs(&registry_, &hub_, &clock_,
                  JobManagerOptions{.output_dir = OutputDir(),
                                    .id_epoch = "e7",
                                    .state = &state,
                                    .background_runner = background_.Runner()});
  const std::string worker = AddWorker(7001);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_training()->set_steps(100);
  spec.mutable_checkpoint()->set_interval_steps(5);
  spec.mutable_checkpoint()->set_dir("held-freed");
  const std::string id = jobs.Submit(spec).value().id();
  background_.RunAll();
  ASSERT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  const std::string step_dir = OutputDir() + "/held-freed/step-00000005";
  WriteUnitFilesOfFive(step_dir, AssignmentOf(worker));
  store.failing = true;
  ASSERT_NO_FATAL_FAILURE(RunToCheckpointFive(jobs, worker, id, AssignmentOf(worker)));
  jobs.FlushIo();
  ASSERT_EQ(jobs.HeldManifestsForTesting(id), 1u);
  (void)jobs.Cancel(id);  // ended here; its save fails (UNAVAILABLE, retried)
  ASSERT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_CANCELLED);
  jobs.FlushIo();  // the end's first sweep (it keeps the complete step)
  ASSERT_TRUE(std::filesystem::is_directory(step_dir));
  std::filesystem::remove_all(step_dir);
  store.failing = false;
  ::testing::internal::CaptureStderr();
  clock_.Advance(absl::Seconds(2));
  jobs.ScheduleQueued();  // the save's retry, which succeeds
  jobs.FlushIo();
  const std::string logged = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(state.LoadJobs().value().at(0).job().state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(jobs.HeldManifestsForTesting(id), 0u);
  EXPECT_FALSE(std::filesystem::exists(step_dir));
  EXPECT_EQ(::pipetrain::testing::LinesWith(
                logged, "job " + id +
                            ": the manifest of checkpoint held-freed/step-00000005 is not "
                            "written: its directory is gone"),
            1)
      << logged;
}

// A restarted coordinator that cannot check a missing manifest's unit files
// (EIO, ESTALE, EMFILE; here, as a stand-in the test can make, its
// --output-dir moved away, which the coordinator's start-up would refuse)
// writes the manifest once it can, trying again every 5 s as
// after a failed write: that counted as damage, and the checkpoint stayed
// without a manifest (neither exported nor named by init.from) until the
// next restart.
TEST_F(JobManagerTest, Restore_UnitFilesCannotBeChecked_ManifestWrittenByARetry) {
  MemoryStore store;
  CoordinatorState state(&store);
  const std::string volume = OutputDir() + "/volume";
  std::filesystem::create_directories(volume);
  const std::string step_dir = volume + "/late/step-00000005";
  const std::string manifest = step_dir + "/manifest.json";
  const JobManagerOptions options{.output_dir = volume,
                                  .id_epoch = "e8",
                                  .state = &state,
                                  .background_runner = background_.Runner()};
  std::string id;
  {
    JobManager first(&registry_, &hub_, &clock_, options);
    const std::string worker = AddWorker(7001);
    v1::JobSpec spec = SmallSpec(1);
    spec.mutable_training()->set_steps(100);
    spec.mutable_checkpoint()->set_interval_steps(5);
    spec.mutable_checkpoint()->set_dir("late");
    id = first.Submit(spec).value().id();
    background_.RunAll();
    ASSERT_EQ(first.Get(id).value().state(), v1::JOB_STATE_RUNNING);
    std::filesystem::create_directories(manifest + "/in-the-way");
    WriteUnitFilesOfFive(step_dir, AssignmentOf(worker));
    ASSERT_NO_FATAL_FAILURE(RunToCheckpointFive(first, worker, id, AssignmentOf(worker)));
    first.FlushIo();
    ASSERT_TRUE(std::filesystem::is_directory(manifest));  // the write failed
    ASSERT_TRUE(first.Cancel(id).ok());
    first.FlushIo();
  }                                       // stopped while the write waited for its retry
  std::filesystem::remove_all(manifest);  // the way cleared
  std::filesystem::rename(volume, volume + ".unmounted");
  JobManager restarted(&registry_, &hub_, &clock_, options);
  ASSERT_TRUE(restarted.Restore().ok());
  restarted.FlushIo();
  std::filesystem::rename(volume + ".unmounted", volume);
  ASSERT_FALSE(std::filesystem::exists(manifest));
  clock_.Advance(absl::Seconds(5));
  restarted.ScheduleQueued();  // the retry
  restarted.FlushIo();
  EXPECT_TRUE(std::filesystem::is_regular_file(manifest));
  EXPECT_EQ(restarted.Get(id).value().state(), v1::JOB_STATE_CANCELLED);
}

// An ended job's drawings (megabytes for a plan of many micro-batches)
// stay only for the newest ended jobs; the plan itself stays.
TEST_F(JobManagerTest, EndedJobs_OnlyTheNewestKeepTheirDrawings) {
  JobManager jobs(&registry_, &hub_, &clock_,
                  JobManagerOptions{.id_epoch = "e1",
                                    .max_ended_jobs_with_drawings = 1,
                                    .background_runner = background_.Runner()});
  const std::string worker = AddWorker(7001);
  std::vector<std::string> ids;
  for (int i = 0; i < 2; ++i) {
    v1::JobSpec spec = SmallSpec(1);
    spec.mutable_training()->set_steps(20);
    ids.push_back(jobs.Submit(spec).value().id());
    background_.RunAll();
    ASSERT_FALSE(jobs.GetPlan(ids.back()).value().timeline_svg().empty());
    // A traced step: the plan shows the measured timeline too.
    v1::ReportProgressRequest traced = IterationReport(worker, ids.back(), 0, {1.0f}, false);
    FillTrace(0, AssignmentOf(worker).program().instructions_size(), traced.mutable_trace());
    ASSERT_TRUE(jobs.ReportProgress(traced).ok());
    ASSERT_FALSE(jobs.GetPlan(ids.back()).value().measured_timeline_svg().empty());
    ASSERT_TRUE(jobs.Cancel(ids.back()).ok());
  }
  jobs.ScheduleQueued();  // the pruning pass
  const v1::Plan older = jobs.GetPlan(ids[0]).value();
  EXPECT_TRUE(older.timeline_svg().empty());
  EXPECT_TRUE(older.chrome_trace_json().empty());
  // What the measured timeline was drawn from is gone too.
  EXPECT_TRUE(older.measured_timeline_svg().empty());
  EXPECT_TRUE(older.measured_chrome_trace_json().empty());
  EXPECT_EQ(older.stages_size(), 1);  // the plan itself is kept
  const v1::Plan newer = jobs.GetPlan(ids[1]).value();
  EXPECT_FALSE(newer.timeline_svg().empty());
  EXPECT_FALSE(newer.measured_timeline_svg().empty());
  // The predicted drawings alone (REST's timeline.svg): the measured one
  // is not drawn.
  const v1::Plan predicted = jobs.GetPlan(ids[1], JobManager::PlanParts::kWithoutMeasured).value();
  EXPECT_EQ(predicted.timeline_svg(), newer.timeline_svg());
  EXPECT_TRUE(predicted.measured_timeline_svg().empty());
  EXPECT_TRUE(predicted.measured_chrome_trace_json().empty());
  // A job cancelled before it was planned has no drawings, and takes no
  // place from a job that has.
  const std::string unplanned = jobs.Submit(SmallSpec(3)).value().id();  // one worker: queued
  ASSERT_TRUE(jobs.Cancel(unplanned).ok());
  jobs.ScheduleQueued();
  EXPECT_FALSE(jobs.GetPlan(ids[1]).value().timeline_svg().empty());
}

// The numbers of a plan without its drawings (each /metrics scrape): none
// copied or drawn, and the stored plan keeps them.
TEST_F(JobManagerTest, GetPlanWithoutDrawings_NumbersOnlyAndTheStoredPlanKeepsItsDrawings) {
  AddWorker(7001);
  const std::string id = Submit(SmallSpec(1)).value().id();
  const v1::Plan all = jobs_.GetPlan(id).value();
  ASSERT_FALSE(all.timeline_svg().empty());
  ASSERT_FALSE(all.chrome_trace_json().empty());
  const v1::Plan numbers = jobs_.GetPlan(id, JobManager::PlanParts::kWithoutDrawings).value();
  EXPECT_TRUE(numbers.timeline_svg().empty());
  EXPECT_TRUE(numbers.chrome_trace_json().empty());
  EXPECT_TRUE(numbers.measured_timeline_svg().empty());
  EXPECT_EQ(numbers.version(), all.version());
  EXPECT_EQ(numbers.stages_size(), all.stages_size());
  EXPECT_EQ(numbers.predicted_iteration_seconds(), all.predicted_iteration_seconds());
  EXPECT_EQ(jobs_.GetPlan(id).value().timeline_svg(), all.timeline_svg());
}

// Planning runs off the job manager's lock (here when the test runs it):
// meanwhile the job is PLANNING with its workers held, and other jobs'
// reports and reads go on.
TEST_F(JobManagerTest, JobBeingPlanned_WorkersHeldOtherJobsGoOn) {
  const std::string w1 = AddWorker(7001);
  const std::string running = Submit(SmallSpec(1)).value().id();
  const std::string w2 = AddWorker(7002);
  const std::string planned = jobs_.Submit(SmallSpec(1)).value().id();  // planning waits
  v1::Job job = jobs_.Get(planned).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_PLANNING);
  EXPECT_EQ(job.reason(), "planning on " + w2);
  EXPECT_EQ(registry_.Get(w2).value().state(), v1::WORKER_STATE_ASSIGNED);
  EXPECT_EQ(registry_.Get(w2).value().job_id(), planned);
  EXPECT_EQ(jobs_.GetPlan(planned).status().code(), absl::StatusCode::kFailedPrecondition);
  v1::ReportProgressRequest r;
  r.set_worker_id(w1);
  r.set_job_id(running);
  r.set_plan_version(1);
  r.set_iteration(0);
  r.add_micro_batch_losses(2.5f);
  ASSERT_TRUE(jobs_.ReportProgress(r).ok());
  EXPECT_EQ(jobs_.Get(running).value().progress().step(), 1);
  EXPECT_EQ(background_.RunAll(), 1);
  job = jobs_.Get(planned).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(job.reason(), "");
  EXPECT_EQ(AssignmentOf(w2).job_id(), planned);
}

// A plan's time waiting for the background thread and computing reach the
// events (metrics): here the fake clock moves only while it waits.
TEST_F(JobManagerTest, Planned_EventSaysHowLongThePlanWaitedAndComputed) {
  std::vector<std::pair<double, double>> planned;
  jobs_.SetEvents(JobEvents{.planned = [&planned](double queued, double computing) {
    planned.emplace_back(queued, computing);
  }});
  AddWorker(7001);
  jobs_.Submit(SmallSpec(1)).value();  // planning waits
  clock_.Advance(absl::Seconds(2));
  EXPECT_EQ(background_.RunAll(), 1);
  EXPECT_EQ(planned, (std::vector<std::pair<double, double>>{{2.0, 0.0}}));
}

// Every ending reaches the events once, with its state: what
// pipetrain_jobs_ended_total counts (pruning never lowers it).
TEST_F(JobManagerTest, Ended_EventOncePerJobWithItsState) {
  std::vector<v1::JobState> ended;
  jobs_.SetEvents(JobEvents{.ended = [&ended](v1::JobState s) { ended.push_back(s); }});
  const std::string w1 = AddWorker(7001);
  const std::string cancelled = Submit(SmallSpec(1)).value().id();
  ASSERT_TRUE(jobs_.Cancel(cancelled).ok());
  // A repeat: answered, and no second event.
  EXPECT_TRUE(jobs_.Cancel(cancelled).ok());
  const std::string diverged = Submit(SmallSpec(1)).value().id();
  Report(w1, diverged, 0, {std::numeric_limits<float>::quiet_NaN()}, false);
  EXPECT_EQ(ended, (std::vector<v1::JobState>{v1::JOB_STATE_CANCELLED, v1::JOB_STATE_FAILED}));
  // Ended otherwise: refused, and no event.
  const absl::StatusOr<v1::Job> too_late = jobs_.Cancel(diverged);
  EXPECT_EQ(too_late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(too_late.status().message(), "already ended (FAILED)"))
      << too_late.status();
  EXPECT_EQ(ended.size(), 2u);
}

// A worker lost while a job's first plan is made: the job goes back to
// QUEUED, saying why, and is planned again on the workers left, instead of
// failing when its plan is in.
TEST_F(JobManagerTest, WorkerLostWhilePlanning_FirstPlanRequeuedAndPlacedOnTheOthers) {
  int planned = 0;  // plans taken (pipetrain_plan_seconds)
  jobs_.SetEvents(JobEvents{.planned = [&planned](double, double) { ++planned; }});
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002), w3 = AddWorker(7003);
  const std::string id = jobs_.Submit(SmallSpec(2)).value().id();  // planning waits
  ASSERT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_PLANNING);
  registry_.MarkLost(w2, registry_.Get(w2).value().incarnation(), "pod deleted");
  v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);
  EXPECT_TRUE(absl::StartsWith(job.reason(), "a worker was lost while the job was being planned ("))
      << job.reason();
  EXPECT_TRUE(absl::EndsWith(job.reason(), "pod deleted); waiting to be planned again"))
      << job.reason();
  EXPECT_EQ(registry_.Get(w1).value().state(), v1::WORKER_STATE_READY);
  EXPECT_EQ(background_.RunAll(), 1);  // overtaken: not computed
  EXPECT_EQ(planned, 0);
  EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_QUEUED);
  EXPECT_FALSE(hub_.Newer(w1, 0).has_value());
  Schedule();
  EXPECT_EQ(planned, 1);  // the new placement's
  job = jobs_.Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(std::vector<std::string>(job.worker_ids().begin(), job.worker_ids().end()),
            (std::vector<std::string>{w1, w3}));
  EXPECT_EQ(job.plan_version(), 1);
}

// The registry tells its listener of a loss after leaving its own lock:
// a plan that comes in between finds the worker LOST and goes back to
// QUEUED as a loss while planning would, instead of running on it and
// failing (no checkpoints) when the loss arrives.
TEST_F(JobManagerTest, WorkerLostJustBeforeThePlanIsIn_RequeuedNotFailed) {
  std::vector<std::tuple<std::string, std::string, std::string, int64_t>> held;
  registry_.SetLossListener(
      [&held](const std::string& w, const std::string& j, const std::string& reason,
              int64_t incarnation) { held.emplace_back(w, j, reason, incarnation); });
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002), w3 = AddWorker(7003);
  const std::string id = jobs_.Submit(SmallSpec(2)).value().id();  // planning waits
  ASSERT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_PLANNING);
  registry_.MarkLost(w2, registry_.Get(w2).value().incarnation(), "pod deleted");
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(background_.RunAll(), 1);  // the plan is in before the loss
  v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED) << job.reason();
  EXPECT_EQ(job.reason(), absl::StrCat("a worker was lost while the job was being planned (",
                                       "it is LOST); waiting to be planned again"));
  EXPECT_FALSE(hub_.Newer(w1, 0).has_value());
  for (const auto& [w, j, reason, incarnation] : held)
    jobs_.OnWorkerLost(w, j, reason, incarnation);
  EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_QUEUED);
  Schedule();
  job = jobs_.Get(id).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  EXPECT_EQ(std::vector<std::string>(job.worker_ids().begin(), job.worker_ids().end()),
            (std::vector<std::string>{w1, w3}));
}

// Cancelled while it is planned: the plan is dropped when it is in, no
// worker is sent it, and the workers are free at once. Cancelled before
// its turn on the planning thread, it is not computed at all (it held up
// every placement behind it) and reaches no pipetrain_plan_seconds.
TEST_F(JobManagerTest, CancelWhilePlanning_PlanDroppedWorkersFree) {
  int planned = 0;
  jobs_.SetEvents(JobEvents{.planned = [&planned](double, double) { ++planned; }});
  const std::string w1 = AddWorker(7001);
  const std::string id = jobs_.Submit(SmallSpec(1)).value().id();  // planning waits
  ASSERT_TRUE(jobs_.Cancel(id).ok());
  EXPECT_EQ(registry_.Get(w1).value().state(), v1::WORKER_STATE_READY);
  EXPECT_EQ(background_.RunAll(), 1);
  EXPECT_EQ(planned, 0);
  EXPECT_EQ(jobs_.Get(id).value().state(), v1::JOB_STATE_CANCELLED);
  EXPECT_FALSE(hub_.Newer(w1, 0).has_value());
  EXPECT_EQ(registry_.Get(w1).value().state(), v1::WORKER_STATE_READY);
}

// The default background thread against calls from other threads (run it
// under TSan): jobs cancelled and workers lost while jobs are being planned
// leave a consistent state, whatever the interleaving: each RUNNING job's
// workers are assigned to it and were sent its plan; every other worker's
// current assignment runs nothing, or runs a RUNNING job that lists it.
// The weights file reserves the whole model's bytes when the first chunk
// comes, which takes a while on a slow volume: created off the manager's lock, other calls (reports, heartbeats' drain
// checks, other jobs) go on meanwhile.
TEST(JobManagerWeightsFileTest, CreatedOffTheLock_OtherCallsGoOnMeanwhile) {
  FakeClock clock;
  WorkerRegistry registry(WorkerRegistry::Options{"", absl::Seconds(1), absl::Seconds(5), &clock});
  AssignmentHub hub;
  JobManager* manager = nullptr;
  int created = 0;
  JobManagerOptions options{.output_dir = OutputDir()};
  options.before_weights_file_created = [&manager, &created] {
    ++created;
    absl::Notification answered;
    std::thread other([&] {
      manager->CountByState();
      answered.Notify();
    });
    // Under the lock, the other call would wait for this one to return.
    EXPECT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(30)));
    other.join();
  };
  JobManager jobs(&registry, &hub, &clock, options);
  manager = &jobs;
  v1::RegisterWorkerRequest request;
  request.set_data_address("127.0.0.1:7001");
  const std::string w1 = registry.Register(request).value().worker_id();
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_output()->set_weights_path("off-lock/final.safetensors");
  const std::string id = jobs.Submit(spec).value().id();
  jobs.AwaitBackgroundWork();
  ASSERT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  const GptConfig model = ResolveJobSpec(spec).value().train.model;
  for (const ParameterShape& p : UnitParameterShapes(model, 0)) {
    ASSERT_TRUE(jobs.AddWeightsChunk(WholeTensor(w1, id, p)).ok()) << p.name;
  }
  EXPECT_EQ(created, 1);  // once, by the first chunk
  const std::vector<std::string> files = FilesIn(OutputDir() + "/off-lock");
  ASSERT_EQ(files.size(), 1u);
  EXPECT_TRUE(absl::StartsWith(files[0], "final.safetensors.tmp.")) << files[0];
  ASSERT_TRUE(jobs.Cancel(id).ok());
}

// A job whose final weights would not fit the output directory's file
// system is refused at submit (FAILED_PRECONDITION naming both sizes): it
// trained to its end and failed writing them. Room enough, or room not
// known, and it is taken; a job without weights_path is not checked.
TEST(JobManagerWeightsFileTest, NoRoomForTheFinalWeights_RefusedAtSubmit) {
  FakeClock clock;
  WorkerRegistry registry(WorkerRegistry::Options{"", absl::Seconds(1), absl::Seconds(5), &clock});
  AssignmentHub hub;
  std::optional<double> free_bytes = 1000;
  int asked = 0;
  JobManagerOptions options{.output_dir = OutputDir()};
  options.free_bytes_for_testing = [&](int dir_fd) {
    EXPECT_GE(dir_fd, 0);
    ++asked;
    return free_bytes;
  };
  JobManager jobs(&registry, &hub, &clock, options);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_output()->set_weights_path("not-yet-there/final.safetensors");
  const absl::StatusOr<v1::Job> refused = jobs.Submit(spec);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  const GptConfig model = ResolveJobSpec(spec).value().train.model;
  double need = 0;
  std::set<std::string> seen;
  for (int u = 0; u < NumUnits(model); ++u) {
    for (const ParameterShape& p : UnitParameterShapes(model, u)) {
      if (!seen.insert(p.name).second) continue;
      double numel = 1;
      for (int64_t d : p.shape) numel *= static_cast<double>(d);
      need += 4 * numel;
    }
  }
  EXPECT_TRUE(absl::StrContains(
      refused.status().message(),
      absl::StrCat("spec.output.weights_path: the final weights take ", static_cast<int64_t>(need),
                   " bytes, but the file system of the "
                   "coordinator's --output-dir has 1000 free")))
      << refused.status();
  free_bytes = need;
  EXPECT_TRUE(jobs.Submit(spec).ok());
  spec.mutable_output()->set_weights_path("other/final.safetensors");
  free_bytes = std::nullopt;
  EXPECT_TRUE(jobs.Submit(spec).ok());
  EXPECT_EQ(asked, 3);
  spec.mutable_output()->clear_weights_path();
  free_bytes = 0;
  EXPECT_TRUE(jobs.Submit(spec).ok());
  EXPECT_EQ(asked, 3);
}

TEST(JobManagerBackgroundTest, CancelsAndLossesWhilePlanning_StateStaysConsistent) {
  FakeClock clock;
  WorkerRegistry registry(WorkerRegistry::Options{"", absl::Seconds(1), absl::Seconds(5), &clock});
  AssignmentHub hub;
  JobManager jobs(&registry, &hub, &clock, JobManagerOptions{.output_dir = OutputDir()});
  registry.SetLossListener(
      [&jobs](const std::string& w, const std::string& j, const std::string& reason,
              int64_t incarnation) { jobs.OnWorkerLost(w, j, reason, incarnation); });
  std::vector<v1::RegisterWorkerResponse> workers;
  for (int i = 0; i < 8; ++i) {
    v1::RegisterWorkerRequest request;
    request.set_data_address("127.0.0.1:" + std::to_string(7001 + i));
    workers.push_back(registry.Register(request).value());
  }
  // One job planned and cancelled first: protobuf builds its descriptors
  // lazily (the plan's and the state names'), guarded by once-flags inside
  // Debian's uninstrumented protobuf that TSan cannot see; built here,
  // before the threads race, they are ordered before every later use.
  const std::string warm_up = jobs.Submit(SmallSpec(2)).value().id();
  jobs.AwaitBackgroundWork();
  ASSERT_TRUE(jobs.Cancel(warm_up).ok());
  std::vector<std::string> ids;
  for (int j = 0; j < 6; ++j) ids.push_back(jobs.Submit(SmallSpec(2)).value().id());
  std::thread losses([&] {
    for (int i = 0; i < 8; i += 3) {
      registry.MarkLost(workers[i].worker_id(), workers[i].incarnation(), "chaos");
    }
  });
  std::thread cancels([&] {
    for (int j = 0; j < 6; j += 2) jobs.Cancel(ids[j]).IgnoreError();
  });
  for (int k = 0; k < 5; ++k) jobs.ScheduleQueued();
  losses.join();
  cancels.join();
  jobs.AwaitBackgroundWork();
  jobs.ScheduleQueued();  // what the losses sent back to the queue
  jobs.AwaitBackgroundWork();
  std::map<std::string, std::string> job_of;  // worker -> RUNNING job listing it
  for (const v1::Job& job : jobs.List()) {
    SCOPED_TRACE(job.id() + " " + v1::JobState_Name(job.state()) + ": " + job.reason());
    EXPECT_NE(job.state(), v1::JOB_STATE_PLANNING);  // every plan is in or dropped
    if (job.state() != v1::JOB_STATE_RUNNING) continue;
    ASSERT_EQ(job.worker_ids_size(), 2);
    for (const std::string& w : job.worker_ids()) {
      const v1::Worker worker = registry.Get(w).value();
      EXPECT_EQ(worker.state(), v1::WORKER_STATE_ASSIGNED) << w;
      EXPECT_EQ(worker.job_id(), job.id()) << w;
      EXPECT_TRUE(job_of.emplace(w, job.id()).second) << w << " runs two jobs";
    }
  }
  for (const v1::RegisterWorkerResponse& w : workers) {
    const auto current = hub.Newer(w.worker_id(), 0);
    if (!current.has_value() || current->assignment.action() != v1::Assignment::ACTION_RUN) {
      EXPECT_EQ(job_of.count(w.worker_id()), 0u) << w.worker_id() << " was never sent its plan";
      continue;
    }
    auto it = job_of.find(w.worker_id());
    ASSERT_NE(it, job_of.end()) << w.worker_id() << " runs " << current->assignment.job_id()
                                << ", which is not RUNNING";
    EXPECT_EQ(current->assignment.job_id(), it->second) << w.worker_id();
  }
}

TEST_F(JobManagerTest, Schedule_BigJobWaiting_LaterJobThatFitsRunsFirst) {
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  const std::string big = Submit(SmallSpec(3)).value().id();    // 3 workers: cannot place
  const std::string small = Submit(SmallSpec(2)).value().id();  // fits the 2 READY
  EXPECT_EQ(jobs_.Get(big)->state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(jobs_.Get(big)->reason(), "waiting for 3 READY workers (2 ready)");
  EXPECT_EQ(jobs_.Get(small)->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(jobs_.Get(small)->worker_ids(0), w1);
  EXPECT_EQ(jobs_.Get(small)->worker_ids(1), w2);
}

TEST_F(JobManagerTest, Schedule_QueueTimeout_FailsWithReasonAtTheDeadlineNotBefore) {
  AddWorker(7001);
  v1::JobSpec spec = SmallSpec(3);
  spec.mutable_scheduling()->mutable_queue_timeout()->set_seconds(60);
  const std::string id = Submit(spec).value().id();
  clock_.Advance(absl::Seconds(60));
  Schedule();
  EXPECT_EQ(jobs_.Get(id)->state(), v1::JOB_STATE_QUEUED);  // exactly the timeout: still waiting
  clock_.Advance(absl::Seconds(1));
  Schedule();
  const v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.reason(),
            "not placed within spec.scheduling.queue_timeout (1m): waiting for 3 READY workers "
            "(1 ready); add workers or ask for fewer stages");
}

TEST_F(JobManagerTest, LossHistory_KeepsTheLastStepsAndListLeavesItOut) {
  const std::string w1 = AddWorker(7001);
  const int steps = kMaxLossHistory + 5;
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_training()->set_steps(steps);
  const std::string id = Submit(spec).value().id();
  for (int i = 0; i < steps; ++i) Report(w1, id, i, {static_cast<float>(i)}, false);
  const v1::JobProgress progress = jobs_.Get(id).value().progress();
  EXPECT_EQ(progress.step(), steps);
  ASSERT_EQ(progress.loss_history_size(), kMaxLossHistory);
  EXPECT_EQ(progress.loss_history_start(), 5);
  EXPECT_EQ(progress.loss_history(0), 5.0f);
  EXPECT_EQ(progress.loss_history(kMaxLossHistory - 1), static_cast<float>(steps - 1));
  EXPECT_EQ(jobs_.List().at(0).progress().loss_history_size(), 0);
  EXPECT_EQ(jobs_.List().at(0).progress().step(), steps);
  EXPECT_EQ(jobs_.List().at(0).progress().loss_history_start(), 5);
  // Listing leaves the job's own history whole.
  EXPECT_EQ(jobs_.Get(id).value().progress().loss_history_size(), kMaxLossHistory);
}

// The weightsPath acceptance: every way out of --output-dir is refused at
// submit, naming the field, and nothing appears outside it.
TEST_F(JobManagerTest, Submit_WeightsPathsEscapingTheOutputDir_RejectedNothingWrittenOutside) {
  const std::string base = OutputDir() + "/escape-test";
  const std::string out = base + "/out", outside = base + "/outside";
  ASSERT_EQ(mkdir(base.c_str(), 0755), 0);
  ASSERT_EQ(mkdir(out.c_str(), 0755), 0);
  ASSERT_EQ(mkdir(outside.c_str(), 0755), 0);
  ASSERT_EQ(symlink(outside.c_str(), (out + "/link").c_str()), 0);
  std::ofstream(outside + "/victim") << "precious";
  ASSERT_EQ(symlink((outside + "/victim").c_str(), (out + "/final").c_str()), 0);
  JobManager jobs(&registry_, &hub_, &clock_, JobManagerOptions{.output_dir = out});
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/etc/x", "must be a relative path"},
      {"../x", "\"..\" components are not allowed"},
      {outside + "/abs.safetensors", "must be a relative path"},
      {"link/x.safetensors", "\"link\" is a symbolic link or not a directory"},
      {"final", "\"final\" exists and is a symbolic link"},
  };
  for (const auto& [path, why] : cases) {
    SCOPED_TRACE(path);
    v1::JobSpec spec = SmallSpec(1);
    spec.mutable_output()->set_weights_path(path);
    absl::Status status = jobs.Submit(spec).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(status.message(), "spec.output.weights_path: ")) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), why)) << status;
  }
  EXPECT_TRUE(jobs.List().empty());
  std::string contents;
  std::getline(std::ifstream(outside + "/victim"), contents);
  EXPECT_EQ(contents, "precious");
  int entries = 0;
  for (DIR* dir = opendir(outside.c_str()); dir != nullptr;) {
    dirent* entry = readdir(dir);
    if (entry == nullptr) {
      closedir(dir);
      break;
    }
    if (std::string(entry->d_name) != "." && std::string(entry->d_name) != "..") ++entries;
  }
  EXPECT_EQ(entries, 1);  // the victim only
}

// A weights path the final rename cannot replace is refused at submit, not
// after every step ran: a FIFO (socket, device) at its name, or a directory
// the coordinator may not write (the operator's: FAILED_PRECONDITION).
TEST_F(JobManagerTest, Submit_WeightsPathNotReplaceable_RefusedUpFront) {
  ASSERT_EQ(mkfifo((OutputDir() + "/pipe.safetensors").c_str(), 0600), 0);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_output()->set_weights_path("pipe.safetensors");
  const absl::Status fifo = Submit(spec).status();
  EXPECT_EQ(fifo.code(), absl::StatusCode::kInvalidArgument) << fifo;
  EXPECT_TRUE(absl::StrContains(fifo.message(), "exists and is not a regular file")) << fifo;
  const std::string closed = OutputDir() + "/readonly";
  ASSERT_EQ(mkdir(closed.c_str(), 0500), 0);
  spec.mutable_output()->set_weights_path("readonly/w.safetensors");
  absl::Status refused;
  {
    const WithoutFileAccessOverride unprivileged;
    ASSERT_TRUE(unprivileged.ok());
    refused = Submit(spec).status();
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "is not writable by the coordinator"))
      << refused;
  EXPECT_TRUE(jobs_.List().empty());
  ASSERT_EQ(chmod(closed.c_str(), 0700), 0);
  EXPECT_TRUE(Submit(spec).ok());
}

// A directory on the way to the weights that is not there yet is made at
// the job's end in the deepest one that is (the output directory at
// least): that one is checked. It was not, and a job writing into a
// directory the coordinator may not write failed after every step.
TEST_F(JobManagerTest, Submit_WeightsDirectoryToBeMadeInAClosedOne_RefusedUpFront) {
  const std::string closed = OutputDir() + "/readonly";
  ASSERT_EQ(mkdir(closed.c_str(), 0500), 0);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_output()->set_weights_path("readonly/new/w.safetensors");
  v1::JobSpec in_output_dir = spec;
  in_output_dir.mutable_output()->set_weights_path("new/w.safetensors");
  absl::Status refused;
  absl::Status refused_in_output_dir;
  {
    const WithoutFileAccessOverride unprivileged;
    ASSERT_TRUE(unprivileged.ok());
    refused = Submit(spec).status();
    ASSERT_EQ(chmod(OutputDir().c_str(), 0500), 0);
    refused_in_output_dir = Submit(in_output_dir).status();
    ASSERT_EQ(chmod(OutputDir().c_str(), 0700), 0);
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_EQ(refused.message(),
            "spec.output.weights_path: \"readonly\", where the directories of "
            "\"readonly/new/w.safetensors\" would be made, is not writable by the coordinator: "
            "Permission denied (the coordinator may not enter it: ask the operator)");
  EXPECT_EQ(refused_in_output_dir.code(), absl::StatusCode::kFailedPrecondition)
      << refused_in_output_dir;
  EXPECT_EQ(refused_in_output_dir.message(),
            "spec.output.weights_path: the coordinator's --output-dir, where the directories of "
            "\"new/w.safetensors\" would be made, is not writable by the coordinator: "
            "Permission denied (the coordinator may not enter it: ask the operator)");
  EXPECT_TRUE(jobs_.List().empty());
  ASSERT_EQ(chmod(closed.c_str(), 0700), 0);
  EXPECT_TRUE(Submit(spec).ok());
  EXPECT_TRUE(Submit(in_output_dir).ok());
}

// Whether this process may give a child a mount namespace of its own
// (root, or CAP_SYS_ADMIN): tried in a child, which mounts nothing.
bool CanUnshareMounts() {
  const pid_t child = fork();
  if (child == 0) {
    // The whole of what the test does: some containers allow the unshare
    // but refuse mounts (AppArmor).
    _exit(unshare(CLONE_NEWNS) == 0 &&
                  mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
                  mount("tmpfs", "/tmp", "tmpfs", MS_RDONLY, nullptr) == 0
              ? 0
              : 1);
  }
  int status = 0;
  return child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) &&
         WEXITSTATUS(status) == 0;
}

// A weights directory on a read-only mount (EROFS) is refused as one the
// coordinator may not write (EACCES) is: only EACCES was. In a child with
// a mount namespace of its own, a read-only tmpfs mounted there.
TEST_F(JobManagerDeathTest, Submit_WeightsDirectoryOnAReadOnlyMount_FailedPrecondition) {
  if (!CanUnshareMounts()) GTEST_SKIP() << "no mount namespace or mounts for this process";
  const std::string mounted = OutputDir() + "/mounted";
  ASSERT_EQ(mkdir(mounted.c_str(), 0700), 0);
  // Prints what Submit answers for a file in the mount, and for one in a
  // directory to be made there.
  const auto submit_on_read_only_mount = [&] {
    // Private first: the read-only mount must not reach the parent's
    // namespace.
    if (unshare(CLONE_NEWNS) != 0 ||
        mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        mount("tmpfs", mounted.c_str(), "tmpfs", MS_RDONLY, nullptr) != 0) {
      _exit(2);
    }
    v1::JobSpec spec = SmallSpec(1);
    for (const char* weights : {"mounted/w.safetensors", "mounted/new/w.safetensors"}) {
      spec.mutable_output()->set_weights_path(weights);
      fprintf(stderr, "[%s]\n", jobs_.Submit(spec).status().ToString().c_str());
    }
    _exit(0);
  };
  EXPECT_EXIT(submit_on_read_only_mount(), ::testing::ExitedWithCode(0),
              "\\[FAILED_PRECONDITION: spec\\.output\\.weights_path: the directory of "
              "\"mounted/w\\.safetensors\" is not writable by the coordinator: Read-only file "
              "system \\(the coordinator may not enter it: ask the operator\\)\\]\n"
              "\\[FAILED_PRECONDITION: spec\\.output\\.weights_path: \"mounted\", where the "
              "directories of \"mounted/new/w\\.safetensors\" would be made, is not writable by "
              "the coordinator: Read-only file system");
}

TEST_F(JobManagerTest, Progress_OutOfBoundsReports_InvalidArgumentJobUnchanged) {
  const std::string w1 = AddWorker(7001);
  const std::string id = Submit(SmallSpec(1)).value().id();  // 2 micro-batches, 3 steps
  v1::ReportProgressRequest r;
  r.set_worker_id(w1);
  r.set_job_id(id);
  r.set_plan_version(1);
  for (int i = 0; i < 3; ++i) r.add_micro_batch_losses(1.0f);
  absl::Status status = jobs_.ReportProgress(r).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "ReportProgressRequest.micro_batch_losses: 3 losses for a job of 2 micro-batches");
  r.clear_micro_batch_losses();
  r.set_iteration(3);
  EXPECT_EQ(jobs_.ReportProgress(r).status().code(), absl::StatusCode::kInvalidArgument);
  r.set_iteration(0);
  r.set_error(std::string(16385, 'e'));
  EXPECT_EQ(jobs_.ReportProgress(r).status().code(), absl::StatusCode::kInvalidArgument);
  r.clear_error();
  r.mutable_checkpoint()->set_error(std::string(16385, 'e'));
  status = jobs_.ReportProgress(r).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "ReportProgressRequest.checkpoint.error: 16385 bytes exceeds the limit of 16384");
  const v1::Job job = jobs_.Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.progress().step(), 0);
}

// A job that reached its end while its saves fail (a leader that lost
// its etcd, which a failover then restores as last saved: RUNNING) is not
// shown SUCCEEDED until its end is saved: a client told so, and a job
// without checkpoints then FAILED after the failover. Shown RUNNING with a
// reason saying why, by Get, List and Summaries alike.
TEST_F(JobManagerTest, SucceededWhileSavesFail_ShownRunningUntilSaved) {
  UnreachableWhileFailingStore store;
  CoordinatorState state(&store);
  JobManager jobs(
      &registry_, &hub_, &clock_,
      JobManagerOptions{
          .id_epoch = "e5", .state = &state, .background_runner = background_.Runner()});
  const std::string worker = AddWorker(7001);
  const std::string id = jobs.Submit(SmallSpec(1)).value().id();  // 3 steps
  background_.RunAll();
  ASSERT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(jobs.ReportProgress(IterationReport(worker, id, 0, {2.0f, 2.0f}, false)).ok());
  ASSERT_TRUE(jobs.ReportProgress(IterationReport(worker, id, 1, {2.0f, 2.0f}, false)).ok());
  store.failing = true;
  ASSERT_TRUE(jobs.ReportProgress(IterationReport(worker, id, 2, {1.0f, 1.0f}, true)).ok());
  background_.RunAll();
  jobs.FlushIo();  // the end's save fails
  const v1::Job shown = jobs.Get(id).value();
  EXPECT_EQ(shown.state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(absl::StrContains(shown.reason(), "waits to be saved")) << shown.reason();
  EXPECT_EQ(jobs.List().at(0).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(jobs.Summaries().at(0).state, v1::JOB_STATE_RUNNING);
  store.failing = false;
  clock_.Advance(absl::Seconds(2));
  jobs.ScheduleQueued();  // the save's retry
  jobs.FlushIo();
  EXPECT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(jobs.List().at(0).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(jobs.Summaries().at(0).state, v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(state.LoadJobs().value().at(0).job().state(), v1::JOB_STATE_SUCCEEDED);
}

// The end's save in flight (a store that hangs, an etcd call waiting out
// its deadline) is no saved end either: shown RUNNING, and a cancel meanwhile
// is answered UNAVAILABLE (the end may yet be lost), until it returns.
TEST_F(JobManagerTest, SucceededWhileItsSaveHangs_ShownRunningUntilItReturns) {
  HeldCommitStore store;
  CoordinatorState state(&store);
  JobManager jobs(
      &registry_, &hub_, &clock_,
      JobManagerOptions{
          .id_epoch = "e6", .state = &state, .background_runner = background_.Runner()});
  const std::string worker = AddWorker(7001);
  const std::string id = jobs.Submit(SmallSpec(1)).value().id();  // 3 steps
  background_.RunAll();
  ASSERT_TRUE(jobs.ReportProgress(IterationReport(worker, id, 0, {2.0f, 2.0f}, false)).ok());
  ASSERT_TRUE(jobs.ReportProgress(IterationReport(worker, id, 1, {2.0f, 2.0f}, false)).ok());
  jobs.FlushIo();
  store.hold = true;
  ASSERT_TRUE(jobs.ReportProgress(IterationReport(worker, id, 2, {1.0f, 1.0f}, true)).ok());
  store.entered.get_future().wait();  // the end's save, held
  EXPECT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(jobs.CountByState()[v1::JOB_STATE_SUCCEEDED], 0);
  EXPECT_EQ(jobs.Cancel(id).status().code(), absl::StatusCode::kUnavailable);
  store.release.set_value();
  jobs.FlushIo();
  EXPECT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(jobs.CountByState()[v1::JOB_STATE_SUCCEEDED], 1);
  EXPECT_EQ(jobs.Cancel(id).status().code(), absl::StatusCode::kFailedPrecondition);
}

// A success whose end waits to be saved holds its files as a running job
// does: a failover meanwhile restores it RUNNING, and it writes its weights
// file and checkpoint directory again. A job naming them was accepted (the
// submit checks read SUCCEEDED), and two live jobs wrote one file. Refused
// as while it ran, until its end is saved.
TEST_F(JobManagerTest, Submit_PathsOfASuccessWhoseSaveHangs_RefusedAsWhileItRanUntilSaved) {
  HeldCommitStore store;
  CoordinatorState state(&store);
  JobManager jobs(&registry_, &hub_, &clock_,
                  JobManagerOptions{.output_dir = OutputDir(),
                                    .id_epoch = "e7",
                                    .state = &state,
                                    .background_runner = background_.Runner()});
  const std::string worker = AddWorker(7001);
  v1::JobSpec weights = SmallSpec(1);  // 3 steps
  weights.mutable_output()->set_weights_path("finishing/final.safetensors");
  v1::JobSpec checkpoints = SmallSpec(1);
  checkpoints.mutable_checkpoint()->set_interval_steps(5);  // none taken: only the directory
  checkpoints.mutable_checkpoint()->set_dir("finishing/ck");
  v1::JobSpec both = weights;
  *both.mutable_checkpoint() = checkpoints.checkpoint();
  const std::string id = jobs.Submit(both).value().id();
  background_.RunAll();
  ASSERT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  const GptConfig model = ResolveJobSpec(both).value().train.model;
  for (int u = 0; u < NumUnits(model); ++u) {
    for (const ParameterShape& p : UnitParameterShapes(model, u)) {
      ASSERT_TRUE(jobs.AddWeightsChunk(WholeTensor(worker, id, p)).ok()) << p.name;
    }
  }
  ASSERT_TRUE(jobs.ReportProgress(IterationReport(worker, id, 2, {1.0f, 1.0f}, true)).ok());
  ASSERT_TRUE(jobs.FinishWeights(worker, id).ok());
  jobs.FlushIo();
  store.hold = true;
  EXPECT_EQ(background_.RunAll(), 1);  // the weights file written: the job SUCCEEDED
  store.entered.get_future().wait();   // the end's save, held
  EXPECT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  const std::string held_by =
      " " + id + " (RUNNING, finishing: its end waits to be saved to the state store)";
  const absl::Status same_file = jobs.Submit(weights).status();
  EXPECT_EQ(same_file.code(), absl::StatusCode::kInvalidArgument) << same_file;
  EXPECT_EQ(same_file.message(),
            "spec.output.weights_path: \"finishing/final.safetensors\" is the output of job" +
                held_by + ", which has not ended; give this job a file of its own");
  const absl::Status same_dir = jobs.Submit(checkpoints).status();
  EXPECT_EQ(same_dir.code(), absl::StatusCode::kInvalidArgument) << same_dir;
  EXPECT_EQ(same_dir.message(), "spec.checkpoint.dir: \"finishing/ck\" is in use by job" + held_by +
                                    "; give this job a directory of its own");
  EXPECT_EQ(jobs.List().size(), 1u);
  store.release.set_value();
  jobs.FlushIo();  // the end saved, and the directory's first sweep done
  ASSERT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_SUCCEEDED);
  const absl::StatusOr<v1::Job> file_taken = jobs.Submit(weights);
  EXPECT_TRUE(file_taken.ok()) << file_taken.status();
  // The directory as any ended job's: free once its late sweep is done.
  EXPECT_EQ(jobs.Submit(checkpoints).status().code(), absl::StatusCode::kUnavailable);
  clock_.Advance(kLateSweepWait + absl::Seconds(1));
  for (int pass = 0; pass < 2; ++pass) {
    jobs.ScheduleQueued();
    jobs.FlushIo();
  }
  const absl::StatusOr<v1::Job> dir_taken = jobs.Submit(checkpoints);
  EXPECT_TRUE(dir_taken.ok()) << dir_taken.status();
}

// pipetrain_jobs_ended_total counts a success once its end is saved, as
// Get shows it: counted at its end, it was counted while still shown
// RUNNING, and again by the leader that ran it once more after a failover.
// A restart that restores it ended counts it no more.
TEST_F(JobManagerTest, EndedEvent_SuccessWhoseSaveHangs_CountedOnceWhenSaved) {
  HeldCommitStore store;
  CoordinatorState state(&store);
  std::vector<v1::JobState> ended;  // appended to on io_, read after FlushIo
  const JobEvents events{.ended = [&ended](v1::JobState s) { ended.push_back(s); }};
  std::string id;
  {
    JobManager jobs(
        &registry_, &hub_, &clock_,
        JobManagerOptions{
            .id_epoch = "e8", .state = &state, .background_runner = background_.Runner()});
    jobs.SetEvents(events);
    const std::string worker = AddWorker(7001);
    id = jobs.Submit(SmallSpec(1)).value().id();  // 3 steps
    background_.RunAll();
    ASSERT_TRUE(jobs.ReportProgress(IterationReport(worker, id, 0, {2.0f, 2.0f})).ok());
    ASSERT_TRUE(jobs.ReportProgress(IterationReport(worker, id, 1, {2.0f, 2.0f})).ok());
    jobs.FlushIo();
    store.hold = true;
    ASSERT_TRUE(jobs.ReportProgress(IterationReport(worker, id, 2, {1.0f, 1.0f}, true)).ok());
    store.entered.get_future().wait();  // the end's save, held
    EXPECT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_RUNNING);
    EXPECT_TRUE(ended.empty());
    store.release.set_value();
    jobs.FlushIo();
    EXPECT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_SUCCEEDED);
    EXPECT_EQ(ended, std::vector<v1::JobState>{v1::JOB_STATE_SUCCEEDED});
    // Later passes and saves count nothing more.
    clock_.Advance(absl::Seconds(2));
    jobs.ScheduleQueued();
    jobs.FlushIo();
    EXPECT_EQ(ended.size(), 1u);
  }
  JobManager restarted(&registry_, &hub_, &clock_,
                       JobManagerOptions{.id_epoch = "e9", .state = &state});
  restarted.SetEvents(events);
  ASSERT_TRUE(restarted.Restore().ok());
  restarted.FlushIo();
  EXPECT_EQ(restarted.Get(id).value().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(ended.size(), 1u);
}

// A failure whose end waits to be saved is no saved end either: a failover
// meanwhile restores the job as last saved, and one with checkpoints
// resumes and may succeed, writing its weights file. It was shown FAILED
// (`submit --follow` exited 1), a cancel was refused as of an ended job
// (400, not retried), and its weights path was free for another job. Shown
// RUNNING ("ending: ..."), a cancel answered UNAVAILABLE and its paths held
// as while it ran, and counted ended, once the save returns.
TEST_F(JobManagerTest, FailedWhileItsSaveHangs_ShownRunningAndHeldUntilItReturns) {
  HeldCommitStore store;
  CoordinatorState state(&store);
  JobManager jobs(&registry_, &hub_, &clock_,
                  JobManagerOptions{.output_dir = OutputDir(),
                                    .id_epoch = "e10",
                                    .state = &state,
                                    .background_runner = background_.Runner()});
  std::vector<v1::JobState> ended;  // appended to on io_, read after FlushIo
  jobs.SetEvents(JobEvents{.ended = [&ended](v1::JobState s) { ended.push_back(s); }});
  const std::string worker = AddWorker(7001);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_output()->set_weights_path("ending/final.safetensors");
  const std::string id = jobs.Submit(spec).value().id();
  background_.RunAll();
  ASSERT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  jobs.FlushIo();
  store.hold = true;
  v1::ReportProgressRequest error;
  error.set_worker_id(worker);
  error.set_job_id(id);
  error.set_plan_version(1);
  error.set_error("recv timed out");  // its own error, not a peer's: the job fails
  ASSERT_TRUE(jobs.ReportProgress(error).ok());
  store.entered.get_future().wait();  // the end's save, held
  const std::string why = "worker " + worker + ": recv timed out [stages: 0=" + worker + "]";
  const v1::Job shown = jobs.Get(id).value();
  EXPECT_EQ(shown.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(shown.reason(), "ending: it failed (" + why +
                                "), and that end waits to be saved to the state store (a save "
                                "that fails is retried every second; the coordinator's log says "
                                "why)");
  EXPECT_EQ(jobs.CountByState()[v1::JOB_STATE_FAILED], 0);
  const absl::Status cancel = jobs.Cancel(id).status();
  EXPECT_EQ(cancel.code(), absl::StatusCode::kUnavailable) << cancel;
  EXPECT_EQ(cancel.message(),
            "job " + id + " failed, which waits to be saved to the state store; ask again");
  const absl::Status same_file = jobs.Submit(spec).status();
  EXPECT_EQ(same_file.code(), absl::StatusCode::kInvalidArgument) << same_file;
  EXPECT_EQ(same_file.message(),
            "spec.output.weights_path: \"ending/final.safetensors\" is the output of job " + id +
                " (RUNNING, ending: its failure waits to be saved to the state store), which has "
                "not ended; give this job a file of its own");
  store.release.set_value();
  jobs.FlushIo();
  EXPECT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(jobs.Get(id).value().reason(), why);
  EXPECT_EQ(jobs.CountByState()[v1::JOB_STATE_FAILED], 1);
  EXPECT_EQ(ended, std::vector<v1::JobState>{v1::JOB_STATE_FAILED});
  EXPECT_EQ(jobs.Cancel(id).status().code(), absl::StatusCode::kFailedPrecondition);
  const absl::StatusOr<v1::Job> file_taken = jobs.Submit(spec);
  EXPECT_TRUE(file_taken.ok()) << file_taken.status();
}

// An end's work on the output volume (removing the weights temporaries a
// dead coordinator left) is queued after the end's save: queued before it,
// on the one io_ queue, an output volume that hangs (NFS) held the save,
// and a cancel answered UNAVAILABLE with the state store healthy, again at
// every try. Here the save is held: the temporary is still there when it
// starts, and goes once it returns.
TEST_F(JobManagerTest, Cancel_LeftoverTemporariesRemovedAfterTheEndsSave) {
  HeldCommitStore store;
  CoordinatorState state(&store);
  JobManager jobs(&registry_, &hub_, &clock_,
                  JobManagerOptions{.output_dir = OutputDir(),
                                    .id_epoch = "e11",
                                    .state = &state,
                                    .background_runner = background_.Runner()});
  const std::string dir = OutputDir() + "/hung";
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  const std::string stale = "final.safetensors.tmp.1.0";  // pid 1: a container's coordinator
  std::ofstream(dir + "/" + stale) << "half a file";
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_output()->set_weights_path("hung/final.safetensors");
  const std::string id = jobs.Submit(spec).value().id();  // no workers: queued
  jobs.FlushIo();
  store.hold = true;
  // Answered at once (no wait): the save is held.
  EXPECT_EQ(jobs.Cancel(id, absl::ZeroDuration()).status().code(), absl::StatusCode::kUnavailable);
  store.entered.get_future().wait();  // the end's save, held: nothing after it has run
  EXPECT_EQ(FilesIn(dir), std::vector<std::string>{stale});
  store.release.set_value();
  jobs.FlushIo();
  EXPECT_TRUE(FilesIn(dir).empty());
  EXPECT_EQ(jobs.Cancel(id).value().state(), v1::JOB_STATE_CANCELLED);
}

// A repeated cancel is answered by whether the cancel is recorded (a save
// taken after it succeeded), not by whether the job's latest save did:
// that may be a later one of the same CANCELLED job (a restart's save that
// stops listing expired checkpoints, a retried removal's) failing. It was
// answered UNAVAILABLE, "the state store did not record it ... runs it
// again", with the stored record CANCELLED.
TEST_F(JobManagerTest, Cancel_RepeatedAfterALaterSaveFailed_AnsweredAsRecorded) {
  UnreachableWhileFailingStore store;
  CoordinatorState state(&store);
  v1::JobSpec spec = SmallSpec(1);  // 3 steps
  spec.mutable_checkpoint()->set_interval_steps(1);
  spec.mutable_checkpoint()->set_dir("recorded");
  std::string id;
  {
    JobManager jobs(
        &registry_, &hub_, &clock_,
        JobManagerOptions{.output_dir = OutputDir(), .id_epoch = "e12", .state = &state});
    id = jobs.Submit(spec).value().id();  // no workers: queued
    ASSERT_EQ(jobs.Cancel(id).value().state(), v1::JOB_STATE_CANCELLED);
  }
  // As a coordinator that stopped between the save that expired a
  // checkpoint and its removal leaves it: the restart removes it, then
  // saves the job without it.
  store::StoredJob stored = state.LoadJobs().value().at(0);
  ASSERT_EQ(stored.job().state(), v1::JOB_STATE_CANCELLED);
  v1::ResumeFrom* expired = stored.add_expiring();
  expired->set_step(1);
  expired->set_dir("recorded/step-00000001");
  ASSERT_TRUE(state.SaveJob(stored).ok());
  JobManager restarted(
      &registry_, &hub_, &clock_,
      JobManagerOptions{.output_dir = OutputDir(), .id_epoch = "e13", .state = &state});
  store.failing = true;
  ASSERT_TRUE(restarted.Restore().ok());
  restarted.FlushIo();  // the removal
  restarted.FlushIo();  // and the save after it, which fails
  ASSERT_EQ(restarted.JobsWithFailedSave(), 1);
  const absl::StatusOr<v1::Job> repeat = restarted.Cancel(id);
  ASSERT_TRUE(repeat.ok()) << repeat.status();
  EXPECT_EQ(repeat->state(), v1::JOB_STATE_CANCELLED);
  store.failing = false;
  JobManager again(
      &registry_, &hub_, &clock_,
      JobManagerOptions{.output_dir = OutputDir(), .id_epoch = "e14", .state = &state});
  ASSERT_TRUE(again.Restore().ok());
  EXPECT_EQ(again.Get(id).value().state(), v1::JOB_STATE_CANCELLED);
}

// A cancel not saved yet (the store unreachable) holds the job's paths, and
// is not pruned, as an unsaved success or failure does: a failover before
// its save restores the job RUNNING, writing its weights file again. A
// resubmit of the same spec is told to retry (UNAVAILABLE); it was
// accepted, and two jobs could write one file. Once saved, it frees them.
TEST_F(JobManagerTest, Cancel_Unsaved_HoldsItsPathsUntilSaved) {
  UnreachableWhileFailingStore store;
  CoordinatorState state(&store);
  JobManager jobs(&registry_, &hub_, &clock_,
                  JobManagerOptions{.output_dir = OutputDir(),
                                    .id_epoch = "e24",
                                    .ended_job_retention = absl::Hours(1),
                                    .max_ended_jobs = 0,
                                    .state = &state,
                                    .background_runner = background_.Runner()});
  AddWorker(7001);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_output()->set_weights_path("held/final.safetensors");
  const std::string id = jobs.Submit(spec).value().id();
  background_.RunAll();
  ASSERT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  jobs.FlushIo();
  store.failing = true;
  EXPECT_EQ(jobs.Cancel(id).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_CANCELLED);
  clock_.Advance(absl::Hours(2));
  for (int pass = 0; pass < 2; ++pass) {  // the retried saves fail too
    jobs.ScheduleQueued();
    jobs.FlushIo();
  }
  ASSERT_TRUE(jobs.Get(id).ok());  // not pruned
  const absl::Status refused = jobs.Submit(spec).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(),
                                absl::StrCat("retry once the cancel of job ", id, " is saved")))
      << refused;
  store.failing = false;
  clock_.Advance(absl::Seconds(1));
  jobs.ScheduleQueued();  // the save's retry
  jobs.FlushIo();
  const absl::StatusOr<v1::Job> again = jobs.Submit(spec);
  EXPECT_TRUE(again.ok()) << again.status();
}

// A failure whose end is not saved yet is not pruned, past the retention
// and max_ended_jobs (0 here) as the store stays unreachable: the store
// says it runs, and a failover restores it so. Pruned, it was never
// counted ended, and its paths went free (its stored record not deleted
// either) while it could still run again. Once saved, it counts and goes.
TEST_F(JobManagerTest, EndedJobs_FailureWhoseEndIsUnsaved_NotPrunedUntilSaved) {
  UnreachableWhileFailingStore store;
  CoordinatorState state(&store);
  JobManager jobs(&registry_, &hub_, &clock_,
                  JobManagerOptions{.output_dir = OutputDir(),
                                    .id_epoch = "e15",
                                    .ended_job_retention = absl::Hours(1),
                                    .max_ended_jobs = 0,
                                    .state = &state,
                                    .background_runner = background_.Runner()});
  std::vector<v1::JobState> ended;  // appended to on io_, read after FlushIo
  jobs.SetEvents(JobEvents{.ended = [&ended](v1::JobState s) { ended.push_back(s); }});
  const std::string worker = AddWorker(7001);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_output()->set_weights_path("unpruned/final.safetensors");
  const std::string id = jobs.Submit(spec).value().id();
  background_.RunAll();
  ASSERT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  jobs.FlushIo();
  store.failing = true;
  v1::ReportProgressRequest error;
  error.set_worker_id(worker);
  error.set_job_id(id);
  error.set_plan_version(1);
  error.set_error("recv timed out");  // its own error: the job fails
  ASSERT_TRUE(jobs.ReportProgress(error).ok());
  jobs.FlushIo();  // the end's save fails
  clock_.Advance(absl::Hours(2));
  for (int pass = 0; pass < 2; ++pass) {  // the retried saves fail too
    jobs.ScheduleQueued();
    jobs.FlushIo();
  }
  const absl::StatusOr<v1::Job> kept = jobs.Get(id);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(absl::StartsWith(kept->reason(), "ending: it failed (")) << kept->reason();
  EXPECT_EQ(jobs.Submit(spec).status().code(), absl::StatusCode::kInvalidArgument);  // path held
  EXPECT_TRUE(ended.empty());
  store.failing = false;
  clock_.Advance(absl::Seconds(1));
  jobs.ScheduleQueued();  // the save's retry
  jobs.FlushIo();
  EXPECT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(ended, std::vector<v1::JobState>{v1::JOB_STATE_FAILED});
  jobs.ScheduleQueued();
  EXPECT_EQ(jobs.Get(id).status().code(), absl::StatusCode::kNotFound);
  jobs.FlushIo();  // the deletion
  EXPECT_TRUE(state.LoadJobs().value().empty());
}

// A restart while a recovery's re-plan is being computed (PLANNING, minutes
// at the planning budget) keeps the recovery's cause, as one while the job
// waits (RECOVERING) does: the cause is stored for the re-plan too. Here
// the last save is the re-plan's, as when the recovery's own save failed
// (a partition cut the worker and the store off) and was retried as the
// re-plan began. It said only "the coordinator restarted".
TEST_F(JobManagerTest, Restore_StoredWhileARecoveryReplans_KeepsItsCause) {
  UnreachableWhileFailingStore store;
  CoordinatorState state(&store);
  BackgroundQueue planning;  // outlives the managers: the re-plan is left unrun
  const std::string w1 = AddWorker(7001), w2 = AddWorker(7002);
  v1::JobSpec spec = SmallSpec(1);
  spec.mutable_training()->set_steps(100);
  spec.mutable_checkpoint()->set_interval_steps(5);
  spec.mutable_checkpoint()->set_dir("replanned");
  const std::string cause = "worker " + w1 + " was lost (its host went down)";
  std::string id;
  {
    JobManager jobs(&registry_, &hub_, &clock_,
                    JobManagerOptions{.output_dir = OutputDir(),
                                      .id_epoch = "e16",
                                      .state = &state,
                                      .background_runner = planning.Runner()});
    id = jobs.Submit(spec).value().id();
    planning.RunAll();
    ASSERT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_RUNNING);
    ASSERT_EQ(jobs.Get(id).value().worker_ids(0), w1);
    jobs.FlushIo();
    store.failing = true;
    const int64_t incarnation = registry_.Get(w1).value().incarnation();
    registry_.MarkLost(w1, incarnation, "its host went down");  // the listener is jobs_'s
    jobs.OnWorkerLost(w1, id, cause, incarnation);
    ASSERT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_RECOVERING);
    jobs.FlushIo();  // the recovery's save fails
    store.failing = false;
    clock_.Advance(absl::Seconds(2));
    // One pass queues the retried save (it takes the job as it is when it
    // runs) and begins the re-plan on w2.
    jobs.ScheduleQueued();
    ASSERT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_PLANNING);
    jobs.FlushIo();
  }
  ASSERT_EQ(state.LoadJobs().value().at(0).job().state(), v1::JOB_STATE_PLANNING);
  JobManager restarted(&registry_, &hub_, &clock_,
                       JobManagerOptions{.output_dir = OutputDir(),
                                         .id_epoch = "e17",
                                         .state = &state,
                                         .background_runner = planning.Runner()});
  ASSERT_TRUE(restarted.Restore().ok());
  const v1::Job job = restarted.Get(id).value();
  EXPECT_EQ(job.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(job.reason(),
            "recovering: the coordinator restarted (while recovering: " + cause + ")");
}

// A stored creation time past 9999 (a damaged or foreign-written store)
// is replaced by the restart's time: taken, it dated every job
// submitted later after it (creation times only increase), and the REST
// API answered 500 for each, as protobuf's JSON printer refuses such a
// time.
TEST_F(JobManagerTest, Restore_StoredCreateTimePastTheYear9999_ReplacedLaterJobsDatedNow) {
  UnreachableWhileFailingStore store;
  CoordinatorState state(&store);
  std::string id;
  {
    JobManager jobs(&registry_, &hub_, &clock_,
                    JobManagerOptions{.id_epoch = "e18", .state = &state});
    id = jobs.Submit(SmallSpec(3)).value().id();  // no workers: queued
  }
  store::StoredJob stored = state.LoadJobs().value().at(0);
  stored.mutable_job()->mutable_create_time()->set_seconds(253402300800);  // 10000-01-01
  ASSERT_TRUE(state.SaveJob(stored).ok());
  JobManager restarted(&registry_, &hub_, &clock_,
                       JobManagerOptions{.id_epoch = "e19", .state = &state});
  ASSERT_TRUE(restarted.Restore().ok());
  restarted.FlushIo();
  // Not failed: a clock stepped by a day gives healthy records such times.
  const v1::Job kept = restarted.Get(id).value();
  EXPECT_EQ(kept.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(FromProtoTimestamp(kept.create_time()), clock_.Now());
  const v1::Job later = restarted.Submit(SmallSpec(3)).value();
  EXPECT_EQ(FromProtoTimestamp(later.create_time()), clock_.Now() + absl::Nanoseconds(1));
  std::string json;
  for (const v1::Job& job : restarted.List()) {
    EXPECT_TRUE(google::protobuf::util::MessageToJsonString(job, &json).ok()) << job.id();
  }
}

// A job the restart fails (here: it ran, and has no checkpoints) ends as
// one that fails while the coordinator runs: shown RUNNING ("ending: ...")
// and counted ended only once that end is saved. The store says it runs,
// and a failover meanwhile restores it so (a standby given the
// --output-dir this leader lacks resumes it). It was shown FAILED at once
// and counted, and counted again by the next leader that failed it too.
TEST_F(JobManagerTest, Restore_JobFailedByTheRestart_ShownRunningAndCountedOnceSaved) {
  UnreachableWhileFailingStore store;
  CoordinatorState state(&store);
  AddWorker(7001);
  std::string id;
  {
    JobManager jobs(
        &registry_, &hub_, &clock_,
        JobManagerOptions{
            .id_epoch = "e20", .state = &state, .background_runner = background_.Runner()});
    id = jobs.Submit(SmallSpec(1)).value().id();
    background_.RunAll();
    ASSERT_EQ(jobs.Get(id).value().state(), v1::JOB_STATE_RUNNING);
  }
  JobManager restarted(&registry_, &hub_, &clock_,
                       JobManagerOptions{.id_epoch = "e21", .state = &state});
  std::vector<v1::JobState> ended;  // appended to on io_, read after FlushIo
  restarted.SetEvents(JobEvents{.ended = [&ended](v1::JobState s) { ended.push_back(s); }});
  store.failing = true;
  ASSERT_TRUE(restarted.Restore().ok());
  restarted.FlushIo();  // the failure's save fails
  const v1::Job shown = restarted.Get(id).value();
  EXPECT_EQ(shown.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(shown.reason(),
            "ending: it failed (the coordinator restarted while the job ran, and the job has no "
            "checkpoints (spec.checkpoint) to resume from), and that end waits to be saved to the "
            "state store (a save that fails is retried every second; the coordinator's log says "
            "why)");
  EXPECT_EQ(restarted.CountByState()[v1::JOB_STATE_FAILED], 0);
  EXPECT_EQ(restarted.Cancel(id).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(ended.empty());
  store.failing = false;
  clock_.Advance(absl::Seconds(2));
  restarted.ScheduleQueued();  // the save's retry
  restarted.FlushIo();
  EXPECT_EQ(restarted.Get(id).value().state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(ended, std::vector<v1::JobState>{v1::JOB_STATE_FAILED});
}

// A job that never ran (its queue timeout passed) and whose failure is not
// saved yet is shown as a failover would restore it, QUEUED ("ending:
// ..."), not RUNNING. Nor FAILED: restored QUEUED, it is placed as soon as
// workers are READY, and runs.
TEST_F(JobManagerTest, QueueTimeoutWhileSavesFail_ShownQueuedAsAFailoverRestoresIt) {
  UnreachableWhileFailingStore store;
  CoordinatorState state(&store);
  v1::JobSpec spec = SmallSpec(3);
  spec.mutable_scheduling()->mutable_queue_timeout()->set_seconds(60);
  std::string id;
  {
    JobManager jobs(
        &registry_, &hub_, &clock_,
        JobManagerOptions{
            .id_epoch = "e22", .state = &state, .background_runner = background_.Runner()});
    id = jobs.Submit(spec).value().id();  // no workers: queued
    store.failing = true;
    clock_.Advance(absl::Seconds(61));
    jobs.ScheduleQueued();
    jobs.FlushIo();  // the failure's save fails
    const v1::Job shown = jobs.Get(id).value();
    EXPECT_EQ(shown.state(), v1::JOB_STATE_QUEUED);
    EXPECT_EQ(shown.reason(),
              "ending: it failed (not placed within spec.scheduling.queue_timeout (1m): waiting "
              "for 3 READY workers (0 ready); add workers or ask for fewer stages), and that end "
              "waits to be saved to the state store (a save that fails is retried every second; "
              "the coordinator's log says why)");
    EXPECT_EQ(jobs.List().at(0).state(), v1::JOB_STATE_QUEUED);
    EXPECT_EQ(jobs.Summaries().at(0).state, v1::JOB_STATE_QUEUED);
    EXPECT_EQ(jobs.CountByState()[v1::JOB_STATE_QUEUED], 1);
    EXPECT_EQ(jobs.CountByState()[v1::JOB_STATE_RUNNING], 0);
  }  // its last try fails too
  JobManager restarted(
      &registry_, &hub_, &clock_,
      JobManagerOptions{
          .id_epoch = "e23", .state = &state, .background_runner = background_.Runner()});
  ASSERT_TRUE(restarted.Restore().ok());
  EXPECT_EQ(restarted.Get(id).value().state(), v1::JOB_STATE_QUEUED);
  for (int port = 7001; port <= 7003; ++port) AddWorker(port);
  restarted.ScheduleQueued();
  background_.RunAll();
  EXPECT_EQ(restarted.Get(id).value().state(), v1::JOB_STATE_RUNNING);
}

// Sets field `number` of `m`, which this build does not know, as a newer
// build's field reads here.
void AddUnknownField(google::protobuf::Message* m, int number) {
  m->GetReflection()->MutableUnknownFields(m)->AddVarint(number, 1);
}

// A coordinator rolled back, or an HA standby of the older build taking
// over, restores state a newer coordinator wrote. Every stored spec is the
// resolved one, which sets each field it has, so each of the newer build's
// jobs carries every field added since that it uses; its profile, every
// key above 0.
class JobManagerNewerStateTest : public JobManagerTest {
 protected:
  // Job id_, RUNNING on one worker with checkpoints (a restart resumes it),
  // stored in state_; its record as stored.
  void StoreRunningJob(store::StoredJob* stored) {
    AddWorker(7001);
    v1::JobSpec spec = SmallSpec(1);
    spec.mutable_training()->set_steps(100);
    spec.mutable_checkpoint()->set_interval_steps(5);
    spec.mutable_checkpoint()->set_dir("newer");
    JobManager jobs(&registry_, &hub_, &clock_, Options("n1"));
    id_ = jobs.Submit(spec).value().id();
    background_.RunAll();
    ASSERT_EQ(jobs.Get(id_).value().state(), v1::JOB_STATE_RUNNING);
    jobs.FlushIo();
    *stored = state_.LoadJobs().value().at(0);
    ASSERT_EQ(stored->job().state(), v1::JOB_STATE_RUNNING);
    ASSERT_FALSE(stored->profile_json().empty());
  }
  JobManagerOptions Options(const std::string& epoch) {
    return JobManagerOptions{.output_dir = OutputDir(),
                             .id_epoch = epoch,
                             .state = &state_,
                             .background_runner = background_.Runner()};
  }
  // A restart refuses the state, naming the job and `what` it does not
  // know, and leaves `stored` as it is: nothing restored, failed or saved.
  void ExpectRefusedLeftAsStored(const store::StoredJob& stored, const std::string& what) {
    JobManager restarted(&registry_, &hub_, &clock_, Options("n2"));
    const absl::Status restored = restarted.Restore();
    EXPECT_EQ(restored.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(restored.message(),
              "memory holds job " + id_ + " whose " + what +
                  ", which this coordinator does not know: a newer coordinator wrote it; run a "
                  "coordinator at least as new as the one that wrote it (the job is left as "
                  "stored)");
    restarted.FlushIo();
    EXPECT_TRUE(restarted.List().empty());
    const std::vector<store::StoredJob> after = state_.LoadJobs().value();
    ASSERT_EQ(after.size(), 1u);
    EXPECT_EQ(after[0].job().state(), v1::JOB_STATE_RUNNING);
    EXPECT_EQ(after[0].SerializeAsString(), stored.SerializeAsString());
  }
  // A restart by a build that knows all of the job's record resumes it.
  void ExpectResumed(const store::StoredJob& known) {
    ASSERT_TRUE(state_.SaveJob(known).ok());
    JobManager restarted(&registry_, &hub_, &clock_, Options("n3"));
    ASSERT_TRUE(restarted.Restore().ok());
    EXPECT_EQ(restarted.Get(id_).value().state(), v1::JOB_STATE_RECOVERING);
  }

  MemoryStore store_;
  CoordinatorState state_{&store_};
  std::string id_;
};

// A spec field this build does not know: restored, ResolveJobSpec refused
// it and the job FAILED for good, saved so.
TEST_F(JobManagerNewerStateTest, Restore_SpecFieldOfANewerBuild_RefusedLeftAsStored) {
  store::StoredJob stored;
  ASSERT_NO_FATAL_FAILURE(StoreRunningJob(&stored));
  const store::StoredJob known = stored;
  AddUnknownField(stored.mutable_job()->mutable_spec()->mutable_parallelism(), 9999);
  ASSERT_TRUE(state_.SaveJob(stored).ok());
  ExpectRefusedLeftAsStored(stored, "spec.parallelism has field number 9999");
  ExpectResumed(known);
}

// Nor in the submitted auto-layout parts kept beside the spec (a
// one-replica layout drops them from the stored spec; a re-plan copies them
// back and ResolveJobSpec refused them).
TEST_F(JobManagerNewerStateTest, Restore_AutoLayoutFieldOfANewerBuild_RefusedLeftAsStored) {
  store::StoredJob stored;
  ASSERT_NO_FATAL_FAILURE(StoreRunningJob(&stored));
  const store::StoredJob known = stored;
  AddUnknownField(stored.mutable_auto_layout_data_parallel_compression(), 9999);
  ASSERT_TRUE(state_.SaveJob(stored).ok());
  ExpectRefusedLeftAsStored(stored, "auto_layout_data_parallel_compression has field number 9999");
  ExpectResumed(known);
}

// A profile key this build does not know (as "transient_bytes" was to
// builds before it): restored, the profile did not parse, and the job
// FAILED for good ("the stored profile does not fit the model"), saved so.
TEST_F(JobManagerNewerStateTest, Restore_ProfileKeyOfANewerBuild_RefusedLeftAsStored) {
  store::StoredJob stored;
  ASSERT_NO_FATAL_FAILURE(StoreRunningJob(&stored));
  const store::StoredJob known = stored;
  std::string profile = stored.profile_json();
  const size_t first_unit = profile.find(R"("units":[{)");
  ASSERT_NE(first_unit, std::string::npos) << profile;
  profile.insert(first_unit + std::string(R"("units":[{)").size(), R"("future_key":1,)");
  stored.set_profile_json(profile);
  ASSERT_TRUE(state_.SaveJob(stored).ok());
  ExpectRefusedLeftAsStored(stored, "profile_json has key units[0].future_key");
  ExpectResumed(known);
}

// An ended job of the newer build is restored as it was: nothing fails it,
// and refused, such jobs would bar a rollback until they were pruned.
TEST_F(JobManagerNewerStateTest, Restore_EndedJobWithAFieldOfANewerBuild_RestoredAsItWas) {
  std::string id;
  {
    JobManager jobs(&registry_, &hub_, &clock_, Options("n4"));
    id = jobs.Submit(SmallSpec(3)).value().id();  // no workers: queued
    ASSERT_EQ(jobs.Cancel(id).value().state(), v1::JOB_STATE_CANCELLED);
    jobs.FlushIo();
  }
  store::StoredJob stored = state_.LoadJobs().value().at(0);
  AddUnknownField(stored.mutable_job()->mutable_spec(), 9999);
  ASSERT_TRUE(state_.SaveJob(stored).ok());
  JobManager restarted(&registry_, &hub_, &clock_, Options("n5"));
  ASSERT_TRUE(restarted.Restore().ok());
  EXPECT_EQ(restarted.Get(id).value().state(), v1::JOB_STATE_CANCELLED);
}

}  // namespace
}  // namespace pipetrain
