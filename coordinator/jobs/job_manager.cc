#include "coordinator/jobs/job_manager.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <system_error>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/confined_path.h"
#include "common/enum_names.h"
#include "common/logging.h"
#include "common/proto_time.h"
#include "common/secrets.h"
#include "common/status_macros.h"
#include "common/utf8_prefix.h"
#include "coordinator/jobs/memory_budget.h"
#include "coordinator/jobs/plan_drawings.h"
#include "coordinator/jobs/stored_job_check.h"
#include "coordinator/planner/bipartition.h"
#include "coordinator/planner/device_links.h"
#include "coordinator/planner/job_layout.h"
#include "coordinator/planner/measured_timeline.h"
#include "coordinator/planner/planner.h"
#include "coordinator/planner/replica_device_groups.h"
#include "coordinator/planner/solve_plan.h"
#include "coordinator/planner/timeline_render.h"
#include "worker/checkpoint/checkpoint_manifest.h"
#include "worker/model/gpt_config.h"
#include "worker/train/divergence.h"

namespace pipetrain {
namespace {

// The model's units' names in order, as a worker's profile names them.
std::vector<std::string> UnitNamesOf(const GptConfig& model) {
  std::vector<std::string> names;
  for (int u = 0; u < NumUnits(model); ++u) names.push_back(UnitName(model, u));
  return names;
}

// The sizes `model`'s shape gives each unit for `request` (the analytic
// profile's), and its FLOPs as seconds at kModelSizesFlopsPerSecond: what
// a worker's profile must agree with (CheckWorkerProfile).
ModelProfile ModelSizes(const GptConfig& model, const v1::ProfileRequest& request) {
  return AnalyticProfile(model, request.seq_len(), request.micro_batch_size(),
                         kModelSizesFlopsPerSecond);
}

// A worker's error text becomes the job's reason, which every GetJob returns.
constexpr size_t kMaxReportedErrorBytes = 16384;

// ReportProgressRequest.busy_seconds and idle_seconds: one step's, at most.
constexpr double kMaxReportedStepSeconds = 1e6;

// The token embedding, which the head ties to (its stage holds a copy).
constexpr char kTiedEmbeddingName[] = "wte.weight";

v1::Assignment StopAssignment(const std::string& job_id, int64_t version) {
  v1::Assignment a;
  a.set_action(v1::Assignment::ACTION_STOP);
  a.set_job_id(job_id);
  a.set_plan_version(version);
  return a;
}

// The GEMM rate `w`'s cores reach: on the CPU, the best start-up probe of
// the workers in `workers` on w's host (they compute on the same cores; a
// probe taken while others probed too measures that contention, which the
// planner models itself, coordinator/planner/host_sharing.h); on a GPU,
// w's own.
double HostGflops(const std::vector<v1::Worker>& workers, const v1::Worker& w) {
  double best = w.device().measured_gflops();
  if (!w.device().gpu_model().empty() || w.device().hostname().empty()) return best;
  for (const v1::Worker& other : workers) {
    if (other.device().hostname() == w.device().hostname() && other.device().gpu_model().empty()) {
      best = std::max(best, other.device().measured_gflops());
    }
  }
  return best;
}

// The data plane's cost per message for the planner's links
// (cluster->data_plane_*): each host's best measurement (its workers probe
// at once at start-up and slow each other, as HostGflops says), then the
// slowest host's. Workers that did not measure (0) are left out; none
// measured: zeros (not modelled).
void SetSlowestHostDataPlane(const std::vector<v1::Worker>& workers, ClusterSpec* cluster) {
  std::map<std::string, std::pair<double, double>> best;  // host -> {overhead, rate}
  for (const v1::Worker& w : workers) {
    const double o = w.device().data_plane_overhead_seconds();
    const double rate = w.device().data_plane_bytes_per_second();
    if (!(o > 0) || !(rate > 0)) continue;
    auto [it, fresh] = best.try_emplace(w.device().hostname(), o, rate);
    if (!fresh) {
      it->second.first = std::min(it->second.first, o);
      it->second.second = std::max(it->second.second, rate);
    }
  }
  double overhead = 0, rate = 0;
  for (const auto& [host, cost] : best) {
    overhead = std::max(overhead, cost.first);
    rate = rate == 0 ? cost.second : std::min(rate, cost.second);
  }
  cluster->data_plane_overhead_seconds = overhead;
  cluster->data_plane_bytes_per_second = rate;
}

// The job's stages as device-link members: each worker's host, GPU and
// current NCCL id (the registry keeps it out of v1::Worker).
std::vector<DeviceLinkMember> DeviceLinkMembers(const std::vector<v1::Worker>& workers,
                                                const WorkerRegistry& registry) {
  std::vector<DeviceLinkMember> members;
  for (const v1::Worker& w : workers) {
    members.push_back({w.device().hostname(), w.device().gpu_index(),
                       registry.NcclUniqueId(w.id()).value_or(""),
                       w.device().gpu_pci_bus_id()});
  }
  return members;
}

// Uses up a group's NCCL id, `owner`'s (it must reach one group only; the
// worker reports a fresh one once its assignment carries it).
void ConsumeGroupId(const std::string& job_id, const v1::Worker& owner, const std::string& id,
                    WorkerRegistry* registry) {
  if (!registry->ConsumeNcclUniqueId(owner.id(), id)) {
    PT_LOG(WARNING) << "job " << job_id << ": " << owner.id()
                    << " replaced its NCCL id while the job was planned; the group uses the "
                       "one it had";
  }
}

// Uses up each group's id (ConsumeGroupId) and logs the groups and the
// links that stayed on the wire for their order.
void ConsumeDeviceGroupIds(const std::string& job_id, const DeviceLinkPlan& links,
                           const std::vector<v1::Worker>& workers, WorkerRegistry* registry) {
  for (const DeviceLinkGroup& g : links.groups) {
    const v1::Worker& owner = workers[g.id_owner_stage];
    ConsumeGroupId(job_id, owner, g.group.nccl_unique_id(), registry);
    std::vector<std::string> gpus;  // PCI addresses, or ordinals from older workers
    for (int s : g.group.stages()) {
      const v1::DeviceInfo& device = workers[s].device();
      gpus.push_back(device.gpu_pci_bus_id().empty() ? absl::StrCat(device.gpu_index())
                                                     : device.gpu_pci_bus_id());
    }
    PT_LOG(INFO) << "job " << job_id << ": device group stages "
                 << absl::StrJoin(g.group.stages(), ",") << " (host "
                 << owner.device().hostname() << ", GPUs " << absl::StrJoin(gpus, ",")
                 << "; NCCL id from " << owner.id() << ")";
  }
  for (const auto& [from, to] : links.order_differs) {
    PT_LOG(INFO) << "job " << job_id << ": stage " << from << " -> " << to
                 << " stays on the wire: the receiver takes the tensors in another order";
  }
}

// As ConsumeDeviceGroupIds, for the replica groups (each carries the id of
// one of its members, replica_device_groups.h).
void ConsumeReplicaGroupIds(const std::string& job_id, const ReplicaDeviceGroupPlan& plan,
                            const std::vector<v1::Worker>& workers, WorkerRegistry* registry) {
  for (const ReplicaDeviceGroupPlan::Group& g : plan.groups) {
    const v1::Worker& owner = workers[g.id_owner];
    ConsumeGroupId(job_id, owner, g.group.nccl_unique_id(), registry);
    PT_LOG(INFO) << "job " << job_id << ": stage " << g.stage << " (tensor rank " << g.tensor_rank
                 << ") sums its gradients over its " << g.group.replicas_size()
                 << " replicas with NCCL on host " << owner.device().hostname() << " (NCCL id from "
                 << owner.id() << ")";
  }
}

// Removes the temporaries of `name` in `dir_fd` that coordinators left when
// they died during an upload (safetensors.h: RemoveAbandonedTemporaries),
// each of them reserving the whole file's space: a coordinator that crashed
// in a loop would otherwise fill the disk, one temporary a crash.
void RemoveAbandonedWeightTemporaries(int dir_fd, const std::string& name,
                                      const std::string& job_id) {
  for (const std::string& removed : RemoveAbandonedTemporaries(dir_fd, name)) {
    PT_LOG(INFO) << "job " << job_id << ": removed " << removed
                 << ", left by a coordinator that stopped during an upload";
  }
}

// Removes each checkpoint directory of job `job_id` (RemoveCheckpointDir,
// with `written_before`), logging the ones that fail. On io_.
void RemoveCheckpointDirs(const std::string& output_dir, const std::string& job_id,
                          const std::vector<v1::ResumeFrom>& dirs,
                          std::optional<absl::Time> written_before = std::nullopt) {
  for (const v1::ResumeFrom& dir : dirs) {
    absl::Status removed = RemoveCheckpointDir(output_dir, dir, written_before);
    if (!removed.ok()) PT_LOG(WARNING) << "job " << job_id << ": " << removed;
  }
}

// Removes the step directories of `checkpoint_dir` that have no manifest,
// but those named in `keep`: their files written before `written_before`.
// On io_.
void RemoveStepDirsWithoutManifest(const std::string& output_dir, const std::string& job_id,
                                   const std::string& checkpoint_dir,
                                   const std::set<std::string>& keep, absl::Time written_before) {
  std::vector<v1::ResumeFrom> doomed;
  for (v1::ResumeFrom& dir : StepDirsWithoutManifest(output_dir, checkpoint_dir)) {
    if (keep.count(dir.dir()) == 0) doomed.push_back(std::move(dir));
  }
  RemoveCheckpointDirs(output_dir, job_id, doomed, written_before);
}

}  // namespace

JobManager::JobManager(WorkerRegistry* registry, AssignmentHub* hub, Clock* clock,
                       JobManagerOptions options)
    : registry_(registry), hub_(hub), clock_(clock), options_(std::move(options)) {
  if (!options_.background_runner) background_ = std::make_unique<SerialExecutor>();
}

JobManager::~JobManager() {
  {
    AnnotatedMutexLock lock(&mu_);
    stopping_ = true;
  }
  if (loop_.joinable()) loop_.join();
  if (cancel_fetches_) cancel_fetches_();  // none starts once stopping_ is set
  AwaitProfiling();
  // A plan being computed ends and is dropped (stopping_); those queued
  // behind it are not computed.
  planning_stopped_.store(true, std::memory_order_release);
  background_.reset();
}

void JobManager::AwaitBackgroundWork() {
  AnnotatedMutexLock lock(&mu_);
  auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return background_in_flight_ == 0; };
  mu_.AwaitWithTimeout(none, absl::InfiniteDuration());
}

void JobManager::AwaitProfiling() {
  // A fetch's end schedules the queue, which may start another fetch: until
  // none is left (none starts once stopping_ is set, ScheduleQueued).
  while (true) {
    std::vector<Profiler> profilers;
    {
      AnnotatedMutexLock lock(&mu_);
      if (profilers_.empty()) return;
      profilers.swap(profilers_);
    }
    for (Profiler& p : profilers) p.thread.join();
  }
}

void JobManager::ReapProfilersLocked() {
  for (auto it = profilers_.begin(); it != profilers_.end();) {
    if (!it->done->load()) {
      ++it;
      continue;
    }
    it->thread.join();  // its last act is done: it ends without the lock
    it = profilers_.erase(it);
  }
}

void JobManager::SetProfileFetcher(ProfileFetcher fetcher, std::function<void()> cancel_all) {
  fetcher_ = std::move(fetcher);
  cancel_fetches_ = std::move(cancel_all);
}

void JobManager::SetEvents(JobEvents events) { events_ = std::move(events); }

v1::ProfileRequest JobManager::ProfileRequestFor(const JobRecord& record) const {
  v1::ProfileRequest request;
  *request.mutable_model() = record.resolved.spec.model();
  request.set_seq_len(record.resolved.train.seq_len);
  request.set_micro_batch_size(record.resolved.train.batch_size / record.resolved.train.micro_batches);
  request.set_seed(record.resolved.train.seed);
  // AccTFM's Alg. 1 picks partitions from measured compute per partition
  // size (acctfm.txt §4.2): time the units on halves and quarters too.
  // An auto layout profiles for every T it may choose.
  const v1::ParallelismSpec& p = record.auto_layout_workers > 0
                                     ? record.auto_layout_parallelism
                                     : record.resolved.spec.parallelism();
  if ((p.tensor() > 1 || p.tensor() == kTensorParallelAuto) && p.tensor_partitions() == 0) {
    for (int k : {2, 4}) {
      if (request.micro_batch_size() % k == 0) request.add_partitions(k);
    }
  }
  return request;
}

std::string JobManager::NotProfiledForMemory(const JobRecord& record,
                                             const v1::ProfileRequest& request,
                                             const std::vector<v1::Worker>& workers) {
  // Every plan holds each unit's fp32 weights, their gradients and both
  // AdamW moments (BiPartitionCosts::Memory: 4x the weights of a stage's
  // backward units, activations on top), once per replica; tensor ranks
  // split a unit's share. A bound no plan can beat, from shapes alone.
  const std::vector<double> budgets = PlanMemoryBudgets(workers);
  double total = 0, largest = 0;
  for (double b : budgets) {
    if (b <= 0) return "";  // unlimited
    total += b;
    largest = std::max(largest, b);
  }
  const ModelProfile sizes = ModelSizes(record.resolved.train.model, request);
  double weights = 0, largest_unit = 0;
  for (const UnitProfile& u : sizes.units) {
    weights += u.weight_bytes;
    largest_unit = std::max(largest_unit, u.weight_bytes);
  }
  const int replicas = std::max(1, record.resolved.data_parallel);
  const int tensor = record.resolved.tensor_parallel == kTensorParallelAuto
                         ? static_cast<int>(workers.size())
                         : std::max(1, record.resolved.tensor_parallel);
  if (4 * weights * replicas > total) {
    return absl::StrCat("its weights, their gradients and AdamW moments alone (",
                        BytesAndGiB(4 * weights), replicas > 1 ? " per replica" : "",
                        ") exceed the memory of its ", workers.size(), " workers together (",
                        BytesAndGiB(total), ")");
  }
  if (4 * largest_unit / tensor > largest) {
    return absl::StrCat("its largest unit's weights, gradients and AdamW moments (",
                        BytesAndGiB(4 * largest_unit / tensor),
                        ") exceed the memory of its "
                        "roomiest worker (",
                        BytesAndGiB(largest), ")");
  }
  // The profiler runs each unit whole on workers[0]: its weights,
  // gradients and moments, one micro-batch's stash and the pass's
  // transient allocations at once. A worker killed for memory while
  // profiling ends the job's profiling and the worker.
  double pass = 0;
  std::string unit;
  for (const UnitProfile& u : sizes.units) {
    const double need = 4 * u.weight_bytes + u.stash_bytes + u.transient_bytes;
    if (need > pass) pass = need, unit = u.name;
  }
  if (budgets[0] > 0 && pass > budgets[0]) {
    return absl::StrCat("profiling its largest unit (", unit, ": ", BytesAndGiB(pass),
                        " for one micro-batch) would exceed the memory of ", workers[0].id(),
                        ", which would profile it (", BytesAndGiB(budgets[0]), ")");
  }
  return "";
}

bool JobManager::ChooseProfileLocked(JobRecord& record, const std::vector<v1::Worker>& workers,
                                     ModelProfile* profile, std::string* source,
                                     double* reference_gflops) {
  const v1::ProfileRequest request = ProfileRequestFor(record);
  const std::string kind = DeviceKind(workers[0].device());
  const std::string key = ProfileKey(request, kind);
  std::optional<v1::ModelProfile> cached = profiles_.Get(key);
  const ModelProfile sizes = ModelSizes(record.resolved.train.model, request);
  if (cached) {
    // Checked when it was fetched; a store written before that check
    // existed may still hold one unfit for this model: measure it again.
    const absl::Status fit =
        CheckWorkerProfile(*cached, request, UnitNamesOf(record.resolved.train.model), &sizes);
    if (!fit.ok()) {
      PT_LOG(WARNING) << "cached profile " << key << " not used: " << fit;
      cached.reset();
    }
  }
  if (cached) {
    *profile = FromProto(*cached, &sizes);
    // Measured for this job a moment ago (its profile then waits in the
    // cache like any), or for an earlier job of the same model and device.
    *source = record.profiled_by.empty()
                  ? absl::StrCat("measured on ", kind, " for an earlier job (cached)")
                  : absl::StrCat("measured on ", kind, " by ", record.profiled_by);
    *reference_gflops = HostGflops(workers, workers[0]);
    return true;
  }
  // Every solver: those that cut by cost need it, and every plan's
  // prediction (what users compare their step time with) is only as good as
  // its costs; the analytic profile left small models' non-GEMM work out
  // (the demo was predicted at a third of its measured step). But not a
  // model that cannot fit these workers whatever its profile: profiling
  // runs each of its units on one worker, and such units killed workers
  // (out of memory) before the plan was refused.
  const std::string unfit = NotProfiledForMemory(record, request, workers);
  if (fetcher_ && record.profile_error.empty() && unfit.empty()) {
    record.job.set_state(v1::JOB_STATE_PROFILING);
    record.job.set_reason(absl::StrCat("profiling the model on ", workers[0].id()));
    TouchLocked(record);
    PT_LOG(INFO) << "job " << record.job.id() << ": profiling on " << workers[0].id();
    ReapProfilersLocked();
    auto done = std::make_shared<std::atomic<bool>>(false);
    try {
      std::thread thread([this, id = record.job.id(), key, worker = workers[0].id(),
                          address = workers[0].data_address(),
                          session = registry_->SessionToken(workers[0].id()).value_or(""), request,
                          done] {
        FinishProfiling(id, key, worker, request, fetcher_(address, session, request));
        done->store(true);
      });
      profilers_.push_back({std::move(thread), std::move(done)});
      return false;
    } catch (const std::system_error& e) {
      // No thread to be had (a pids limit reached): the job plans on the
      // analytic profile, as when profiling fails, rather than the
      // uncaught exception ending the coordinator.
      record.profile_error = absl::StrCat("no thread to profile with: ", e.what());
      PT_LOG(WARNING) << "job " << record.job.id() << ": " << record.profile_error;
    }
  }
  double fastest = 0;
  for (const v1::Worker& w : workers) fastest = std::max(fastest, w.device().measured_gflops());
  const double rate = fastest > 0 ? fastest * 1e9 : 1e11;
  const TrainConfig& t = record.resolved.train;
  *profile = AnalyticProfile(t.model, t.seq_len, t.batch_size / t.micro_batches, rate);
  *source = absl::StrCat("analytic: FLOPs at ", rate / 1e9, " GFLOP/s",
                         !unfit.empty() ? absl::StrCat(" (not profiled: ", unfit, ")")
                         : record.profile_error.empty()
                             ? ""
                             : absl::StrCat(" (profiling failed: ", record.profile_error, ")"));
  *reference_gflops = fastest;
  return true;
}

void JobManager::FinishProfiling(const std::string& job_id, const std::string& key,
                                 const std::string& worker, const v1::ProfileRequest& request,
                                 const absl::StatusOr<v1::ModelProfile>& fetched) {
  {
    AnnotatedMutexLock lock(&mu_);
    JobRecord* record = FindLocked(job_id);
    // A worker's answer is a peer's input: checked against the model before
    // the planner (or the store, for later restarts) sees it. With the job
    // gone there is no model to check it against, and nobody waiting.
    absl::StatusOr<v1::ModelProfile> profile = fetched;
    if (profile.ok() && record == nullptr) profile = absl::NotFoundError("job gone");
    if (profile.ok()) {
      const ModelProfile sizes = ModelSizes(record->resolved.train.model, request);
      const absl::Status fit =
          CheckWorkerProfile(*profile, request, UnitNamesOf(record->resolved.train.model), &sizes);
      if (!fit.ok()) profile = fit;
    }
    if (profile.ok()) {
      // Kept for every later job of the model (and stored): the checked
      // fields only.
      profile->DiscardUnknownFields();
      record->profiled_by = worker;
      const std::vector<std::string> evicted = profiles_.Put(key, *profile);
      if (options_.state != nullptr) {
        absl::Status saved = options_.state->SaveProfile(key, *profile);
        if (!saved.ok()) PT_LOG(WARNING) << "profile " << key << " not saved: " << saved;
        DropStoredProfiles(evicted);
      }
    } else if (record != nullptr) {
      // A worker that left meanwhile (SIGTERM drains it, and its profile is
      // cut short) says nothing about the model: another may profile it.
      absl::StatusOr<v1::Worker> profiler = registry_->Get(worker);
      const bool left = !profiler.ok() || IsDrainedLocked(*profiler) ||
                        (profiler->state() != v1::WORKER_STATE_READY &&
                         profiler->state() != v1::WORKER_STATE_ASSIGNED);
      if (left && ++record->profile_attempts < kMaxProfileAttempts) {
        PT_LOG(WARNING) << "job " << job_id << ": profiling on " << worker
                        << " ended as that worker left (" << profile.status()
                        << "); profiling again on another";
      } else {
        record->profile_error = profile.status().ToString();
        PT_LOG(WARNING) << "job " << job_id << ": profiling failed: " << profile.status();
      }
    }
    if (record != nullptr && record->job.state() == v1::JOB_STATE_PROFILING) {
      record->job.set_state(v1::JOB_STATE_QUEUED);
      record->job.set_reason(profile.ok() || !record->profile_error.empty()
                                 ? "profiled; waiting to be planned"
                                 : absl::StrCat("waiting to be profiled again: ", worker,
                                                " left while it profiled the model"));
      TouchLocked(*record);
    }
  }
  ScheduleQueued();
}

void JobManager::StartSchedulingLoop(absl::Duration period) {
  loop_ = std::thread([this, period] {
    AnnotatedMutexLock lock(&mu_);
    while (!mu_.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; }, period)) {
      mu_.Unlock();
      ScheduleQueued();
      mu_.Lock();
    }
  });
}

JobManager::JobRecord* JobManager::FindLocked(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

void JobManager::DropStoredProfiles(const std::vector<std::string>& keys) {
  if (options_.state == nullptr) return;
  for (const std::string& key : keys) {
    const absl::Status dropped = options_.state->DeleteProfile(key);
    if (!dropped.ok()) PT_LOG(WARNING) << "profile " << key << " not dropped: " << dropped;
  }
}

void JobManager::DropEndedJobDetail(JobRecord& record) {
  // What only drawings and a running job use: the workers' compiled
  // programs (megabytes for thousands of micro-batches, in each stage's
  // assignment), the traced steps the measured timeline is drawn from, and
  // the weights upload's bookkeeping. Moved out, so the memory is freed.
  DropPlanDrawings(record.plan);
  std::vector<v1::Assignment>().swap(record.assignments);
  record.traced = record.tracing = JobRecord::TracedStep{};
  std::map<std::string, std::pair<int, Shape>>().swap(record.weight_owner);
  std::map<std::string, size_t>().swap(record.weights_index);
  std::map<std::string, CoveredRanges>().swap(record.weights_covered);
}

void JobManager::TouchLocked(JobRecord& record) {
  *record.job.mutable_update_time() = ToProtoTimestamp(clock_->Now());
}

store::StoredJob JobManager::StoredJobLocked(JobRecord& record) {
  store::StoredJob stored;
  *stored.mutable_job() = record.job;
  *stored.mutable_plan() = record.plan;
  // Drawings, not state (plan.proto): a large job's would outgrow the
  // store's record limit, and every later save of the job would fail.
  DropPlanDrawings(*stored.mutable_plan());
  if (record.checkpoints != nullptr) {
    for (const v1::ResumeFrom& c : record.checkpoints->Complete()) *stored.add_checkpoints() = c;
  }
  if (record.profile.has_value()) stored.set_profile_json(ProfileToJson(*record.profile));
  stored.set_profile_source(record.profile_source);
  stored.set_reference_gflops(record.reference_gflops);
  stored.set_recoveries_without_progress(record.recoveries_without_progress);
  if (record.init_checkpoint.has_value())
    *stored.mutable_init_checkpoint() = *record.init_checkpoint;
  stored.set_init_weights(record.init_weights);
  stored.set_auto_layout_workers(record.auto_layout_workers);
  *stored.mutable_auto_layout_data_parallel_compression() = record.auto_layout_compression;
  if (record.auto_layout_workers > 0) {
    *stored.mutable_auto_layout_parallelism() = record.auto_layout_parallelism;
  }
  record.last_persisted = clock_->Now();
  return stored;
}

absl::Status JobManager::SaveStoredJob(const store::StoredJob& job) const {
  absl::Status saved = options_.state->SaveJob(job);
  if (!saved.ok()) {
    PT_LOG(ERROR) << "job " << job.job().id() << ": could not save its state: " << saved;
  }
  return saved;
}

absl::Status JobManager::PersistLocked(JobRecord& record,
                                       std::function<void(const absl::Status&)> then) {
  if (options_.state == nullptr) {
    // On io_ all the same: `then` may take the lock, and does file work.
    if (then) io_.Post([then = std::move(then)] { then(absl::OkStatus()); });
    return absl::OkStatus();
  }
  // Off the lock, in order: a commit waits for the disk, and every stage's
  // report waits for the lock. A failed save must not stay the last word
  // (a job ends once: a cancelled one would come back RUNNING after a
  // restart), so it is noted for RetryUnsavedLocked; a later one that
  // succeeds clears the note (io_ runs saves in order).
  // One save of a job waits at a time: a call while one waits joins it,
  // and the save takes the job as it is when it runs. So saves slower
  // than the changes (a checkpoint completing every step, each wanting
  // one) cost one snapshot, not a queue of them (which grew the
  // coordinator by hundreds of MB).
  auto [queued, first] = queued_saves_.try_emplace(record.job.id());
  if (then) queued->second.push_back(std::move(then));
  if (!first) return absl::OkStatus();
  io_.Post([this, id = record.job.id()] {
    std::optional<store::StoredJob> stored;
    std::vector<std::function<void(const absl::Status&)>> thens;
    {
      AnnotatedMutexLock lock(&mu_);
      auto it = queued_saves_.find(id);
      thens = std::move(it->second);
      queued_saves_.erase(it);
      if (JobRecord* record = FindLocked(id)) stored = StoredJobLocked(*record);
    }
    // A job pruned meanwhile: its deletion is queued behind this.
    const absl::Status saved = stored.has_value()
                                   ? SaveStoredJob(*stored)
                                   : absl::NotFoundError(absl::StrCat("job ", id, " was pruned"));
    // Checkpoints expired while earlier saves failed: the state just saved
    // no longer names them, so their directories go now (a retry with no
    // later checkpoint would otherwise leave them for good, past `keep`).
    std::vector<v1::ResumeFrom> expired;
    if (stored.has_value()) {
      AnnotatedMutexLock lock(&mu_);
      if (saved.ok()) {
        unsaved_.erase(id);
        if (JobRecord* record = FindLocked(id)) expired.swap(record->expired_unsaved);
      } else {
        unsaved_.insert(id);
      }
    }
    if (!expired.empty()) RemoveCheckpointDirs(options_.output_dir, id, expired);
    for (const auto& then : thens) then(saved);
  });
  return absl::OkStatus();
}

void JobManager::RetryUnsavedLocked() {
  const absl::Time now = clock_->Now();
  if (unsaved_.empty() || now < next_save_retry_) return;
  next_save_retry_ = now + absl::Seconds(1);
  const std::set<std::string> ids = std::move(unsaved_);
  unsaved_.clear();
  for (const std::string& id : ids) {
    JobRecord* record = FindLocked(id);
    if (record == nullptr) continue;  // pruned: its deletion is queued
    PT_LOG(INFO) << "job " << id << ": saving its state again";
    PersistLocked(*record).IgnoreError();  // noted again if it fails
  }
}

absl::Status JobManager::Restore() {
  if (options_.state == nullptr) return absl::OkStatus();
  ASSIGN_OR_RETURN(auto profiles, options_.state->LoadProfiles());
  for (const auto& [key, profile] : profiles) DropStoredProfiles(profiles_.Put(key, profile));
  ASSIGN_OR_RETURN(std::vector<store::StoredJob> stored, options_.state->LoadJobs());
  std::sort(stored.begin(), stored.end(), [](const store::StoredJob& a, const store::StoredJob& b) {
    return FromProtoTimestamp(a.job().create_time()) < FromProtoTimestamp(b.job().create_time());
  });
  AnnotatedMutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  int resumed = 0;
  std::vector<std::string> failed_by_restart, ended_with_checkpoints;
  for (store::StoredJob& s : stored) {
    auto record = std::make_unique<JobRecord>();
    record->job = std::move(*s.mutable_job());
    const std::string id = record->job.id();
    if (id.empty() || jobs_.count(id) > 0) continue;
    const bool ended_before = IsTerminal(record->job.state());
    absl::StatusOr<ResolvedJobSpec> resolved = ResolveJobSpec(record->job.spec());
    // As at Submit: a job re-plans (a recovery, elastic growth) with no
    // later check of what planning it costs.
    if (resolved.ok()) {
      if (absl::Status budget = CheckPlanningBudget(*resolved); !budget.ok()) resolved = budget;
    }
    const bool spec_resolves = resolved.ok();
    if (!resolved.ok()) {  // a spec this version no longer accepts
      if (!IsTerminal(record->job.state())) {
        record->job.set_state(v1::JOB_STATE_FAILED);
        record->job.set_reason(
            absl::StrCat("after a coordinator restart, the spec is no longer "
                         "valid: ",
                         resolved.status().message()));
      }
      resolved = ResolvedJobSpec{};
      resolved->spec = record->job.spec();
    }
    record->resolved = std::move(*resolved);
    // What the store holds is checked before anything is indexed, divided
    // or counted by it (stored_job_check.h): a job whose state does not
    // fit fails, unless it has ended already.
    auto fail_unfit = [&record](const std::string& what, const std::string& mismatch) {
      if (IsTerminal(record->job.state())) return;
      record->job.set_state(v1::JOB_STATE_FAILED);
      record->job.set_reason(
          absl::StrCat("after a coordinator restart, the stored ", what, ": ", mismatch));
    };
    record->plan = std::move(*s.mutable_plan());
    // Which stage owns which weights comes from the plan's unit ranges and
    // the model's parameter shapes. Without the job's own model (its spec
    // no longer resolves: the default model stands in) or with ranges past
    // it, that lookup would CHECK-fail and stop the coordinator from
    // starting; a plan whose degrees do not hold would divide by zero in
    // /metrics. Such a plan is dropped, whatever the job's state.
    const std::string plan_mismatch = StoredPlanMismatch(
        record->plan,
        spec_resolves ? std::optional<int>(NumUnits(record->resolved.train.model)) : std::nullopt);
    if (!plan_mismatch.empty()) {
      fail_unfit("plan does not fit the model", plan_mismatch);
      record->plan.Clear();
    }
    const std::string counters_mismatch =
        StoredCountersMismatch(record->job, {s.checkpoints().begin(), s.checkpoints().end()});
    if (!counters_mismatch.empty()) fail_unfit("progress is out of range", counters_mismatch);
    const bool owners_known = spec_resolves && plan_mismatch.empty();
    for (int st = 0; st < record->plan.stages_size(); ++st) {
      record->stage_of[record->plan.stages(st).worker_id()] = st;
      if (owners_known) RecordWeightOwners(*record, st);
    }
    record->stages.assign(record->plan.stages_size(), StageProgress{});
    // A re-plan splits the model by the profile's units: one that does not
    // parse or fit is dropped (a job that needs it fails below).
    std::string profile_mismatch;
    if (!s.profile_json().empty()) {
      absl::StatusOr<ModelProfile> profile = ParseProfileJson(s.profile_json());
      if (!profile.ok()) {
        profile_mismatch = std::string(profile.status().message());
      } else if (spec_resolves) {
        profile_mismatch = StoredProfileMismatch(*profile, record->resolved.train.model);
      }
      if (profile_mismatch.empty()) record->profile = *std::move(profile);
    }
    record->profile_source = s.profile_source();
    record->reference_gflops = s.reference_gflops();
    record->recoveries_without_progress = s.recoveries_without_progress();
    if (s.has_init_checkpoint()) {
      record->init_checkpoint = s.init_checkpoint();
      record->init_step = s.init_checkpoint().step();
    }
    record->init_weights = s.init_weights();
    record->init_source =
        record->init_checkpoint.has_value() ? record->init_checkpoint->dir() : record->init_weights;
    // Bounded as spec.parallelism.workers is: a stored value is not
    // trusted (MinJobWorkers searches layouts up to it, under the lock).
    record->auto_layout_workers =
        record->resolved.data_parallel == kDataParallelAuto
            ? record->resolved.layout_workers
            : std::clamp(s.auto_layout_workers(), 0, static_cast<int32_t>(kMaxStages));
    record->auto_layout_compression = record->resolved.data_parallel == kDataParallelAuto
                                          ? record->resolved.spec.compression().data_parallel()
                                          : s.auto_layout_data_parallel_compression();
    // A job stored before tensor 0 existed has none: its T was fixed.
    record->auto_layout_parallelism =
        record->resolved.data_parallel != kDataParallelAuto && s.has_auto_layout_parallelism()
            ? s.auto_layout_parallelism()
            : record->resolved.spec.parallelism();
    const v1::CheckpointSpec& checkpoint = record->resolved.spec.checkpoint();
    if (checkpoint.interval_steps() > 0 && !checkpoint.dir().empty()) {
      record->checkpoints = std::make_unique<CheckpointCatalog>(
          checkpoint, record->resolved.train.model, record->resolved.train.steps);
      const std::string checkpoints_mismatch =
          record->checkpoints->RestoreComplete({s.checkpoints().begin(), s.checkpoints().end()});
      // None is taken then: expiring them would delete what they name.
      if (!checkpoints_mismatch.empty()) {
        fail_unfit("checkpoints do not fit the job", checkpoints_mismatch);
      }
      if (record->checkpoints->Latest() != nullptr) {
        record->furthest_checkpoint_step = record->checkpoints->Latest()->step();
      }
    }
    const v1::JobState state = record->job.state();
    // Not planned yet: it waits again (a first plan that was being made
    // was never stored).
    if (state == v1::JOB_STATE_PROFILING ||
        (state == v1::JOB_STATE_PLANNING && record->job.plan_version() == 0)) {
      record->job.set_state(v1::JOB_STATE_QUEUED);
    }
    // Restored waiting: its workers get the grace period to register again
    // before a queue timeout that passed while the coordinator was down
    // fails it (its wait counts from its creation).
    if (record->job.state() == v1::JOB_STATE_QUEUED) {
      record->restart_grace_until = now + options_.restart_grace;
    } else if (state == v1::JOB_STATE_PLANNING || state == v1::JOB_STATE_RUNNING ||
               state == v1::JOB_STATE_RECOVERING) {
      if (!profile_mismatch.empty()) {
        fail_unfit("profile does not fit the model", profile_mismatch);
        if (events_.ended) events_.ended(v1::JOB_STATE_FAILED);
      } else if (record->checkpoints == nullptr || !record->profile.has_value()) {
        record->job.set_state(v1::JOB_STATE_FAILED);
        record->job.set_reason(
            "the coordinator restarted while the job ran, and the job has no checkpoints "
            "(spec.checkpoint) to resume from");
        if (events_.ended) events_.ended(v1::JOB_STATE_FAILED);
      } else {
        // As a recovery from the loss of every worker, which get the grace
        // period to come back.
        record->job.set_state(v1::JOB_STATE_RECOVERING);
        record->recovery_reason = "the coordinator restarted";
        record->job.set_reason("recovering: the coordinator restarted");
        record->recovery_started = now;
        record->restart_grace_until = now + options_.restart_grace;
        record->survivors.assign(record->job.worker_ids().begin(), record->job.worker_ids().end());
        ++resumed;
        if (events_.recovery_started) events_.recovery_started(RecoveryKind::kCoordinatorRestart);
      }
    }
    // Failed by this restart: what the old coordinator was uploading goes,
    // as EndLocked removes it for a job that fails while this one runs.
    if (!ended_before && record->job.state() == v1::JOB_STATE_FAILED) {
      RemoveAbandonedWeightsOf(*record);
      // So do its checkpoints' leftovers, once every job is restored (the
      // sweep skips a directory another live job shares), and the failure
      // is saved. Not when the spec no longer resolves: its checkpoint
      // directory was not checked again, and the version that stored it
      // (rolled back to) could still resume it.
      if (spec_resolves) failed_by_restart.push_back(id);
    }
    // Ended before the restart: its late sweep (SweepStoppedJobsLocked) was
    // not stored, and stages may have written a step after the end.
    if (ended_before && spec_resolves && record->checkpoints != nullptr) {
      ended_with_checkpoints.push_back(id);
    }
    if (events_.restored) events_.restored(id, record->job.progress().step());
    order_.push_back(id);
    jobs_[id] = std::move(record);
  }
  for (const std::string& id : ended_with_checkpoints) {
    JobRecord& record = *jobs_[id];
    // No workers (ended before it ran): nothing was written. A live job
    // sharing the directory: its steps are not ours to judge.
    if (options_.output_dir.empty() || record.job.worker_ids_size() == 0 ||
        CheckpointDirUserLocked(record.resolved.spec.checkpoint().dir()) != nullptr) {
      continue;
    }
    // The second sweep again, of what the ended job's stages wrote after
    // its end, once they have stopped (or kLateSweepWait from now); its
    // directory stays reserved until then (checkpoint_sweeps_pending).
    record.checkpoint_sweeps_pending = 1;
    record.late_sweep_workers.assign(record.job.worker_ids().begin(),
                                     record.job.worker_ids().end());
    record.late_sweep_since = now;
    record.late_sweep_by = now + kLateSweepWait;
  }
  for (const std::string& id : failed_by_restart) {
    SweepCheckpointDirsLocked(*jobs_[id], absl::Now());
    // Else the store says RUNNING, and every restart fails it again (its
    // "ended" counted each time).
    PersistLocked(*jobs_[id]).IgnoreError();  // logged
  }
  PT_LOG(INFO) << "restored " << jobs_.size() << " jobs (" << resumed << " to resume) and "
               << profiles.size() << " profiles from " << options_.state->Describe();
  return absl::OkStatus();
}

absl::Status JobManager::CheckPaths(const ResolvedJobSpec& resolved) const {
  const std::string& weights = resolved.spec.output().weights_path();
  if (!weights.empty()) {
    if (options_.output_dir.empty()) {
      return absl::InvalidArgumentError(
          "spec.output.weights_path: this coordinator writes no files (it was started without "
          "--output-dir); leave the field empty or ask the operator");
    }
    RETURN_IF_ERROR(OpenConfinedParent(options_.output_dir, kOutputDirFlag,
                                       "spec.output.weights_path", weights,
                                       /*create_dirs=*/false)
                        .status());
  }
  const v1::CheckpointSpec& checkpoint = resolved.spec.checkpoint();
  if (checkpoint.interval_steps() > 0 && options_.output_dir.empty()) {
    return absl::InvalidArgumentError(
        "spec.checkpoint: this coordinator keeps no checkpoints (it was started without "
        "--output-dir); leave spec.checkpoint.interval_steps at 0 or ask the operator");
  }
  if (checkpoint.interval_steps() > 0 && !checkpoint.dir().empty()) {
    RETURN_IF_ERROR(OpenConfinedParent(options_.output_dir, kOutputDirFlag, "spec.checkpoint.dir",
                                       absl::StrCat(checkpoint.dir(), "/manifest.json"),
                                       /*create_dirs=*/false)
                        .status());
  }
  const std::string& data = resolved.spec.data().path();
  if (!data.empty() && !options_.data_roots.empty()) {
    RETURN_IF_ERROR(ResolveUnderRoots("spec.data.path", data, options_.data_roots).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<JobManager::InitSource> JobManager::ResolveInit(
    const ResolvedJobSpec& resolved) const {
  InitSource init;
  const std::string& from = resolved.spec.init().from();
  if (from.empty()) return init;
  if (options_.output_dir.empty()) {
    return absl::InvalidArgumentError(
        "spec.init.from: this coordinator has no --output-dir to find it under");
  }
  // Resolved (links followed), it must still lie under the output directory.
  std::unique_ptr<char, void (*)(void*)> root(realpath(options_.output_dir.c_str(), nullptr),
                                              std::free);
  std::unique_ptr<char, void (*)(void*)> real(
      realpath(absl::StrCat(options_.output_dir, "/", from).c_str(), nullptr), std::free);
  if (root == nullptr || real == nullptr ||
      !absl::StartsWith(std::string(real.get()), std::string(root.get()) + "/")) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.init.from: ", from,
                     " is not a checkpoint directory or weights file under the "
                     "coordinator's --output-dir"));
  }
  const std::string path = real.get();
  auto invalid = [](const absl::Status& status) {
    return absl::InvalidArgumentError(absl::StrCat("spec.init.from: ", status.message()));
  };
  const GptConfig& model = resolved.train.model;
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    if (!absl::EndsWith(path, ".safetensors")) {
      return absl::InvalidArgumentError(
          "spec.init.from: names a file that is not .safetensors (Hugging Face GPT-2 weights) "
          "nor a checkpoint directory");
    }
    // Every tensor the model needs, with its shape: checked now, so a job
    // never starts on weights that do not fit. From the header alone: the
    // file may be gigabytes, and Submit is a user's request.
    absl::StatusOr<std::vector<SafetensorsShape>> contents = ReadSafetensorsShapes(path);
    if (!contents.ok()) return invalid(contents.status());
    auto find = [&contents](const std::string& name) -> const Shape* {
      for (const SafetensorsShape& s : *contents) {
        if (s.name == name) return &s.shape;
      }
      return nullptr;
    };
    for (int u = 0; u < NumUnits(model); ++u) {
      for (const ParameterShape& p : UnitParameterShapes(model, u)) {
        const Shape* t = find(p.name);
        const Shape* prefixed = find("transformer." + p.name);
        // The workers refuse a file holding both (FindParameterTensor):
        // refused here, before the job starts.
        if (t != nullptr && prefixed != nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat("spec.init.from: ", from, " holds both '", p.name, "' and 'transformer.",
                           p.name, "': which one to load is ambiguous; keep one"));
        }
        if (t == nullptr) t = prefixed;
        // A padded vocabulary takes the file's rows (gpt_config.h).
        const Shape shape(p.shape.begin(), p.shape.end());
        const std::string wanted = ShapeToString(shape);
        if (t == nullptr) {
          return absl::InvalidArgumentError(absl::StrCat("spec.init.from: ", from,
                                                         " has no tensor ", p.name,
                                                         " (this model's is ", wanted, ")"));
        }
        if (!CheckFitsParameter(p.name, shape, *t).ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat("spec.init.from: ", from, " has ", p.name, " of shape ",
                           ShapeToString(*t), ", which does not fit this model's ", wanted));
        }
      }
    }
    init.weights = from;
    return init;
  }
  absl::StatusOr<CheckpointLocation> at = LocateCheckpoint(path);
  if (!at.ok()) return invalid(at.status());
  absl::StatusOr<CheckpointManifest> manifest =
      ReadCheckpointManifest(absl::StrCat(at->path(), "/", kCheckpointManifestName));
  if (!manifest.ok()) return invalid(manifest.status());
  const GptConfig& m = manifest->model;
  if (m.vocab_size != model.vocab_size || m.max_seq_len != model.max_seq_len ||
      m.n_layer != model.n_layer || m.n_head != model.n_head || m.d_model != model.d_model ||
      manifest->seed != resolved.train.seed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.init.from: ", from, " is a checkpoint of another model or seed (vocab ", m.vocab_size,
        ", max_seq_len ", m.max_seq_len, ", ", m.n_layer, " layers, ", m.n_head, " heads, d_model ",
        m.d_model, ", seed ", manifest->seed, "); this job's must equal it"));
  }
  if (manifest->step >= resolved.train.steps) {
    return absl::InvalidArgumentError(absl::StrCat("spec.init.from: the checkpoint has taken ",
                                                   manifest->step, " steps; spec.training.steps (",
                                                   resolved.train.steps, ") must be larger"));
  }
  // Its directory relative to the output directory (the workers' root).
  const std::string step_dir = at->path();
  if (!absl::StartsWith(step_dir, std::string(root.get()) + "/")) {
    return absl::InvalidArgumentError("spec.init.from: not under the coordinator's --output-dir");
  }
  // Each unit file there, of the size the manifest records: a stat each,
  // so a truncated or missing file is refused now rather than when the job
  // starts (its contents' SHA-256 is checked by the worker that loads it).
  for (const v1::UnitFile& f : manifest->units) {
    const std::string unit_path = absl::StrCat(step_dir, "/", f.file());
    struct stat unit;
    if (lstat(unit_path.c_str(), &unit) != 0 || !S_ISREG(unit.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec.init.from: ", from, ": its manifest lists ", f.file(),
          ", which is missing or not a regular file; the checkpoint is damaged (give an "
          "earlier step-* directory)"));
    }
    if (unit.st_size != f.bytes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.init.from: ", from, ": ", f.file(), " is ", unit.st_size,
                       " bytes, its manifest records ", f.bytes(),
                       "; the checkpoint is damaged (give an earlier step-* directory)"));
    }
  }
  v1::ResumeFrom checkpoint;
  checkpoint.set_step(manifest->step);
  checkpoint.set_dir(step_dir.substr(std::strlen(root.get()) + 1));
  for (const v1::UnitFile& f : manifest->units) *checkpoint.add_units() = f;
  init.checkpoint = std::move(checkpoint);
  return init;
}

namespace {

// Whether `path` is `dir` or lies under it. Both are canonical relative
// names (CheckPaths' CheckConfinedName: no empty, "." or ".." component,
// no trailing '/'): one file, one spelling, so a prefix test is exact.
bool PathWithin(const std::string& path, const std::string& dir) {
  return path == dir || absl::StartsWith(path, absl::StrCat(dir, "/"));
}

}  // namespace

// An ended job whose checkpoint directory is still reserved for its sweeps.
constexpr char kLeftoversBeingRemoved[] =
    ": its leftover files are being removed once its workers have stopped, within a minute; "
    "retry then";

const JobManager::JobRecord* JobManager::CheckpointDirUserLocked(const std::string& dir) const {
  for (const auto* jobs : {&jobs_, &submitting_}) {
    for (const auto& [id, record] : *jobs) {
      if (record->checkpoints == nullptr) continue;
      if (IsTerminal(record->job.state()) && record->checkpoint_sweeps_pending == 0) continue;
      const std::string& theirs = record->job.spec().checkpoint().dir();
      if (PathWithin(dir, theirs) || PathWithin(theirs, dir)) return record.get();
    }
  }
  return nullptr;
}

const JobManager::JobRecord* JobManager::CheckpointDirHoldingLocked(const std::string& path) const {
  for (const auto* jobs : {&jobs_, &submitting_}) {
    for (const auto& [id, record] : *jobs) {
      if (record->checkpoints == nullptr) continue;
      if (IsTerminal(record->job.state()) && record->checkpoint_sweeps_pending == 0) continue;
      if (PathWithin(path, record->job.spec().checkpoint().dir())) return record.get();
    }
  }
  return nullptr;
}

const JobManager::JobRecord* JobManager::InitSourceInLocked(const std::string& dir) const {
  for (const auto* jobs : {&jobs_, &submitting_}) {
    for (const auto& [id, record] : *jobs) {
      if (IsTerminal(record->job.state()) || record->init_source.empty()) continue;
      if (PathWithin(record->init_source, dir)) return record.get();
    }
  }
  return nullptr;
}

const JobManager::JobRecord* JobManager::WeightsPathInLocked(const std::string& dir) const {
  for (const auto* jobs : {&jobs_, &submitting_}) {
    for (const auto& [id, record] : *jobs) {
      if (IsTerminal(record->job.state())) continue;
      const std::string& weights = record->job.spec().output().weights_path();
      if (!weights.empty() && PathWithin(weights, dir)) return record.get();
    }
  }
  return nullptr;
}

const JobManager::JobRecord* JobManager::WeightsPathUserLocked(const std::string& path) const {
  // Canonical relative names too (CheckPaths).
  for (const auto* jobs : {&jobs_, &submitting_}) {
    for (const auto& [id, record] : *jobs) {
      if (IsTerminal(record->job.state())) continue;
      if (record->job.spec().output().weights_path() == path) return record.get();
    }
  }
  return nullptr;
}

absl::StatusOr<v1::Job> JobManager::Submit(const v1::JobSpec& spec) {
  ASSIGN_OR_RETURN(ResolvedJobSpec resolved, ResolveJobSpec(spec));
  RETURN_IF_ERROR(CheckPlanningBudget(resolved));
  RETURN_IF_ERROR(CheckPaths(resolved));
  ASSIGN_OR_RETURN(InitSource init, ResolveInit(resolved));
  std::string job_id;
  std::optional<store::StoredJob> stored;
  {
    AnnotatedMutexLock lock(&mu_);
    int pending = static_cast<int>(submitting_.size());
    for (const auto& [id, other] : jobs_) pending += IsTerminal(other->job.state()) ? 0 : 1;
    if (pending >= options_.max_pending_jobs) {
      return absl::ResourceExhaustedError(
          absl::StrCat(pending,
                       " jobs are already queued or running (the coordinator's limit); wait for "
                       "some to end or cancel them"));
    }
    auto record = std::make_unique<JobRecord>();
    // An id no job has: a restored job may hold the next one (a restart
    // without an epoch, or one whose clock-made epoch repeats an earlier
    // start's), and a second record under its id would replace it. Taken
    // (next_id_ moved past it) only once the job is accepted below: a
    // refused request changes nothing.
    int64_t n = next_id_;
    do {
      record->job.set_id(options_.id_epoch.empty()
                             ? absl::StrCat("job-", n++)
                             : absl::StrCat("job-", options_.id_epoch, "-", n++));
    } while (jobs_.count(record->job.id()) > 0 || submitting_.count(record->job.id()) > 0);
    // Both would write the file, and the last to finish would replace the
    // other's weights while both reported the path as theirs.
    const std::string& weights = resolved.spec.output().weights_path();
    if (const JobRecord* other = weights.empty() ? nullptr : WeightsPathUserLocked(weights)) {
      return absl::InvalidArgumentError(absl::StrCat("spec.output.weights_path \"", weights,
                                                     "\" is the output of job ", other->job.id(),
                                                     " (", EnumShortName(other->job.state()),
                                                     "), which has not ended; give this job a file "
                                                     "of its own"));
    }
    // A checkpoint directory's files are replaced by each checkpoint and
    // its step directories deleted as they expire: weights there are lost.
    if (const JobRecord* other = weights.empty() ? nullptr : CheckpointDirHoldingLocked(weights)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec.output.weights_path \"", weights, "\" lies in the checkpoint directory \"",
          other->job.spec().checkpoint().dir(), "\" of job ", other->job.id(), " (",
          EnumShortName(other->job.state()),
          "), whose checkpoints would replace or delete it; write it elsewhere"));
    }
    // Where it starts from, resolved (links followed): a live job expires
    // its older checkpoints, and this job resumes from that one until it has
    // a checkpoint of its own.
    const std::string init_source =
        init.checkpoint.has_value() ? init.checkpoint->dir() : init.weights;
    const JobRecord* init_holder =
        init_source.empty() ? nullptr : CheckpointDirHoldingLocked(init_source);
    // An ended job's sweeps remove only steps without a manifest: a complete
    // checkpoint of its directory may be started from at once (a weights
    // file there may lie in a step they remove).
    if (init_holder != nullptr && init.checkpoint.has_value() &&
        IsTerminal(init_holder->job.state())) {
      init_holder = nullptr;
    }
    if (init_holder != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec.init.from \"", resolved.spec.init().from(),
          "\" lies in the checkpoint directory \"", init_holder->job.spec().checkpoint().dir(),
          "\" of job ", init_holder->job.id(), " (", EnumShortName(init_holder->job.state()),
          IsTerminal(init_holder->job.state())
              ? absl::StrCat(kLeftoversBeingRemoved, ")")
              : "), which deletes its older checkpoints as it goes; start from it once that job "
                "has ended, or from a copy outside that directory"));
    }
    v1::CheckpointSpec* checkpoint = resolved.spec.mutable_checkpoint();
    if (checkpoint->interval_steps() > 0) {
      if (checkpoint->dir().empty()) {
        checkpoint->set_dir(absl::StrCat("checkpoints/", record->job.id()));
      }
      // Two live jobs writing step-N directories in one place would
      // overwrite each other's files, and each would expire (delete) the
      // other's: refused while the other has not ended.
      if (const JobRecord* other = CheckpointDirUserLocked(checkpoint->dir())) {
        const std::string& theirs = other->job.spec().checkpoint().dir();
        return absl::InvalidArgumentError(absl::StrCat(
            "spec.checkpoint.dir \"", checkpoint->dir(), "\" ",
            theirs == checkpoint->dir() ? "is in use by job"
                                        : absl::StrCat("overlaps \"", theirs, "\", that of job"),
            " ", other->job.id(), " (", EnumShortName(other->job.state()),
            IsTerminal(other->job.state()) ? kLeftoversBeingRemoved : "",
            "); give this job a directory of its own"));
      }
      if (const JobRecord* other = InitSourceInLocked(checkpoint->dir())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "spec.checkpoint.dir \"", checkpoint->dir(), "\" holds \"", other->init_source,
            "\", where job ", other->job.id(), " (", EnumShortName(other->job.state()),
            ") started from (spec.init.from), which this job's checkpoints could replace or "
            "delete; give this job a directory of its own"));
      }
      if (const JobRecord* other = WeightsPathInLocked(checkpoint->dir())) {
        return absl::InvalidArgumentError(
            absl::StrCat("spec.checkpoint.dir \"", checkpoint->dir(), "\" holds \"",
                         other->job.spec().output().weights_path(), "\", the weights file of job ",
                         other->job.id(), " (", EnumShortName(other->job.state()),
                         "); give this job a directory of its own"));
      }
      if (!weights.empty() && PathWithin(weights, checkpoint->dir())) {
        return absl::InvalidArgumentError(
            absl::StrCat("spec.output.weights_path \"", weights,
                         "\" lies in this job's own checkpoint directory \"", checkpoint->dir(),
                         "\", whose checkpoints would replace or delete it; write it elsewhere"));
      }
      // Every kept checkpoint lists each unit's file in the job's stored
      // record, which must stay within the store's value limit.
      const int units = NumUnits(resolved.train.model);
      if (StoredCheckpointBytes(*checkpoint, units) > kMaxStoredCheckpointBytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "spec.checkpoint.keep: ", checkpoint->keep(), " checkpoints of this ", units,
            "-unit model take up to ", StoredCheckpointBytes(*checkpoint, units),
            " bytes of the coordinator's stored state for the job (each unit's file and "
            "checksum), over the ",
            kMaxStoredCheckpointBytes, " it allows; keep at most ",
            std::max(1, MaxStoredKeep(*checkpoint, units))));
      }
      record->checkpoints = std::make_unique<CheckpointCatalog>(*checkpoint, resolved.train.model,
                                                                resolved.train.steps);
    }
    *record->job.mutable_spec() = resolved.spec;
    record->init_weights = init.weights;
    record->init_source = init_source;
    if (init.checkpoint.has_value()) {
      record->init_checkpoint = init.checkpoint;
      record->init_step = init.checkpoint->step();
      record->job.mutable_progress()->set_step(record->init_step);
      record->job.mutable_progress()->set_loss_history_start(record->init_step);
    }
    record->job.set_state(v1::JOB_STATE_QUEUED);
    record->job.set_reason(absl::StrCat("waiting for ", JobWorkers(resolved), " READY workers"));
    record->auto_layout_workers = resolved.layout_workers;
    if (resolved.data_parallel == kDataParallelAuto) {
      record->auto_layout_compression = resolved.spec.compression().data_parallel();
      record->auto_layout_parallelism = resolved.spec.parallelism();
    }
    *record->job.mutable_create_time() = ToProtoTimestamp(clock_->Now());
    TouchLocked(*record);
    record->resolved = std::move(resolved);
    if (options_.state != nullptr) stored = StoredJobLocked(*record);
    job_id = record->job.id();
    next_id_ = n;
    // Held here while it is saved: it claims its weights path and
    // checkpoint directory and counts as pending, but nothing schedules,
    // lists or cancels it before the store has it.
    submitting_[job_id] = std::move(record);
  }
  // Saved off the lock: a commit waits for the disk (or etcd), and every
  // stage's report and every API call wait for the lock. No other save of
  // this job can come first: nothing else sees it yet.
  const absl::Status saved = stored.has_value() ? SaveStoredJob(*stored) : absl::OkStatus();
  // A failed commit may still have been applied (etcd: a deadline passed,
  // the leader changed): the job would come back after a restart or a
  // failover although the caller was told otherwise. It is deleted again;
  // only when that commits is "nothing was submitted" sure.
  const absl::Status forgotten = saved.ok() ? absl::OkStatus() : options_.state->DeleteJob(job_id);
  {
    AnnotatedMutexLock lock(&mu_);
    auto it = submitting_.find(job_id);
    std::unique_ptr<JobRecord> record = std::move(it->second);
    submitting_.erase(it);
    if (!saved.ok() && forgotten.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "could not record the job durably; nothing was submitted: ", saved.message()));
    }
    if (!saved.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "could not record the job durably (", saved.message(),
          ") nor make sure the state store dropped it (", forgotten.message(),
          "): it is not running, but may come back as ", job_id,
          " after a coordinator restart or failover; look for it before submitting again"));
    }
    order_.push_back(job_id);
    jobs_[job_id] = std::move(record);
  }
  ScheduleQueued();
  return Get(job_id);
}

absl::StatusOr<v1::Job> JobManager::Get(const std::string& job_id) const {
  AnnotatedMutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  return it->second->job;
}

std::vector<v1::Job> JobManager::List() const {
  AnnotatedMutexLock lock(&mu_);
  std::vector<v1::Job> out;
  out.reserve(order_.size());
  for (const std::string& id : order_) {
    // Without copying the history (up to kMaxLossHistory floats a job, and
    // every scrape of /metrics lists every job): it is set aside for the
    // copy and put back, both O(1).
    v1::Job& job = jobs_.at(id)->job;
    if (!job.has_progress()) {
      out.push_back(job);
      continue;
    }
    google::protobuf::RepeatedField<float> history;
    history.Swap(job.mutable_progress()->mutable_loss_history());
    out.push_back(job);
    history.Swap(job.mutable_progress()->mutable_loss_history());
  }
  return out;
}

absl::StatusOr<v1::Job> JobManager::Cancel(const std::string& job_id) {
  v1::Job cancelled;
  auto saved = std::make_shared<absl::Status>();  // set on the io thread, read after FlushIo
  {
    AnnotatedMutexLock lock(&mu_);
    JobRecord* record = FindLocked(job_id);
    if (record == nullptr) return absl::NotFoundError(absl::StrCat("no job ", job_id));
    const bool unsaved_cancel = record->job.state() == v1::JOB_STATE_CANCELLED &&
                                (unsaved_.count(job_id) > 0 || record->cancel_unconfirmed);
    if (IsTerminal(record->job.state()) && !unsaved_cancel) {
      return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " already ended (",
                                                        EnumShortName(record->job.state()), ")"));
    }
    if (!unsaved_cancel) EndLocked(*record, v1::JOB_STATE_CANCELLED, "cancelled by the user");
    // Answered once the store has the cancel: a coordinator that dies right
    // after must not restore the job RUNNING. This save, queued after
    // EndLocked's, says whether it has.
    PersistLocked(*record, [saved](const absl::Status& s) { *saved = s; }).IgnoreError();
    cancelled = record->job;
    // The answer is the basic view, as GetJob's default: the loss history
    // (up to a few hundred KB) is GetJob with JOB_VIEW_FULL's.
    cancelled.mutable_progress()->clear_loss_history();
  }
  FlushIo();
  {
    AnnotatedMutexLock lock(&mu_);
    if (JobRecord* record = FindLocked(job_id); record != nullptr) {
      record->cancel_unconfirmed = !saved->ok();
    }
  }
  if (!saved->ok()) {
    return absl::UnavailableError(absl::StrCat(
        "job ", job_id, " is cancelled here, but the state store did not record it (",
        saved->message(),
        "); the coordinator saves it again every second, and one that stops before a save "
        "succeeds restores the job and runs it again: cancel again to see it recorded"));
  }
  return cancelled;
}

absl::StatusOr<v1::Plan> JobManager::GetPlan(const std::string& job_id, PlanParts parts) const {
  v1::Plan plan;
  MeasuredStepCopy measured;
  {
    AnnotatedMutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", job_id));
    if (it->second->plan.version() == 0) {
      const v1::JobState state = it->second->job.state();
      return absl::FailedPreconditionError(
          IsTerminal(state)
              ? absl::StrCat("job ", job_id, " ended ", EnumShortName(state),
                             " before it was planned: it has no plan")
              : absl::StrCat("job ", job_id, " has no plan yet (", EnumShortName(state), ")"));
    }
    if (parts == PlanParts::kWithoutDrawings) {
      // The stored drawings are set aside for the copy and put back (O(1)
      // swaps), as List does with the loss history.
      v1::Plan& stored = it->second->plan;
      std::string timeline, trace;
      timeline.swap(*stored.mutable_timeline_svg());
      trace.swap(*stored.mutable_chrome_trace_json());
      plan = stored;
      timeline.swap(*stored.mutable_timeline_svg());
      trace.swap(*stored.mutable_chrome_trace_json());
      return plan;
    }
    plan = it->second->plan;
    measured = CopyMeasuredStep(*it->second);
  }
  AddMeasuredTimeline(measured, &plan);
  return plan;
}

void JobManager::AddTraceLocked(JobRecord& record, int stage_index, const v1::StepTrace& trace) {
  // Stages report a traced step in any order, and may be a traced step
  // apart: a trace older than the one being collected is dropped.
  JobRecord::TracedStep& tracing = record.tracing;
  if (trace.iteration() < tracing.iteration) return;
  if (trace.iteration() > tracing.iteration) tracing = JobRecord::TracedStep{trace.iteration(), {}};
  tracing.by_stage[stage_index] = trace;
  // CheckStepTrace bounded the known fields; unknown ones (up to the 4 MiB
  // request) would be kept and copied on every GetPlan.
  tracing.by_stage[stage_index].DiscardUnknownFields();
  if (tracing.by_stage.size() == record.assignments.size()) record.traced = tracing;
}

size_t JobManager::TracedBytesForTesting(const std::string& job_id) const {
  AnnotatedMutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return 0;
  size_t bytes = 0;
  for (const JobRecord::TracedStep* step : {&it->second->traced, &it->second->tracing}) {
    for (const auto& [stage, trace] : step->by_stage) bytes += trace.ByteSizeLong();
  }
  return bytes;
}

JobManager::MeasuredStepCopy JobManager::CopyMeasuredStep(const JobRecord& record) {
  MeasuredStepCopy copy;
  if (record.traced.iteration < 0) return copy;
  copy.job_id = record.job.id();
  copy.iteration = record.traced.iteration;
  copy.workers = static_cast<int>(record.traced.by_stage.size());
  std::vector<int> timings;
  for (const auto& [stage, trace] : record.traced.by_stage) {
    timings.push_back(trace.instructions_size());
  }
  const int lanes = LeadingLanesWithin(timings, kMaxMeasuredTimelineTimings);
  for (const auto& [stage, trace] : record.traced.by_stage) {
    if (static_cast<int>(copy.traces.size()) == lanes) break;
    copy.programs.push_back(record.assignments[stage].program());
    copy.traces.push_back(trace);
    copy.names.push_back(record.job.worker_ids(stage));
  }
  return copy;
}

void JobManager::AddMeasuredTimeline(const MeasuredStepCopy& step, v1::Plan* plan) {
  if (step.iteration < 0) return;
  std::vector<const v1::Program*> programs;
  std::vector<const v1::StepTrace*> traces;
  for (size_t w = 0; w < step.programs.size(); ++w) {
    programs.push_back(&step.programs[w]);
    traces.push_back(&step.traces[w]);
  }
  absl::StatusOr<SimulationResult> measured = MeasuredTimeline(programs, traces);
  if (!measured.ok()) {  // checked as they came: a bug
    PT_LOG(WARNING) << "job " << step.job_id << ": no measured timeline: " << measured.status();
    return;
  }
  TimelineSvgOptions svg;
  // Lanes start where each worker began the step: a worker done early with
  // the step before begins this one early, so steps overlap across workers
  // and the span is more than the step time.
  svg.title = absl::StrCat("job ", step.job_id, ": measured step ", step.iteration + 1,
                           " (workers' clocks)");
  if (static_cast<int>(step.traces.size()) < step.workers) {
    absl::StrAppend(&svg.title, ", its first ", step.traces.size(), " of ", step.workers,
                    " workers");
  }
  svg.span_name = "first start to last end";
  plan->set_measured_step(step.iteration);
  plan->set_measured_timeline_svg(TimelineSvg(*measured, step.names, svg));
  plan->set_measured_chrome_trace_json(ChromeTraceJson(*measured, step.names));
}

void JobManager::ScheduleQueued() {
  AnnotatedMutexLock lock(&mu_);
  // Shutting down: nothing new is placed, and no profile fetch starts after
  // the destructor's AwaitProfiling has taken the list (a thread left
  // joinable in profilers_ would terminate the process).
  if (stopping_) return;
  // Ended jobs beyond the limits go in every pass (a Submit ends with one),
  // so jobs that end while nothing is submitted go too.
  PruneLocked();
  RetryUnsavedLocked();
  SweepStoppedJobsLocked();
  const absl::Time now = clock_->Now();
  // Counted once a pass, when a waiting job first needs it (it reads every
  // READY worker's record).
  std::optional<size_t> drained_ready_count;
  const auto drained_ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!drained_ready_count.has_value()) drained_ready_count = DrainedReadyLocked();
    return *drained_ready_count;
  };
  // Recovering jobs first: they ran already, and hold on to their workers.
  std::set<std::string> reserved;
  for (const std::string& id : order_) {
    JobRecord& record = *jobs_.at(id);
    if (record.job.state() == v1::JOB_STATE_RECOVERING) TryReplanLocked(record, &reserved);
  }
  // A job being profiled is being placed: the worker it profiles on stays
  // READY meanwhile, so later jobs wait rather than take it (and say so).
  std::string profiling;
  for (const std::string& id : order_) {
    JobRecord& record = *jobs_.at(id);
    if (record.job.state() == v1::JOB_STATE_PROFILING && profiling.empty()) profiling = id;
    if (record.job.state() != v1::JOB_STATE_QUEUED) continue;
    std::vector<std::string> ready = SpareWorkersLocked(reserved);
    if (!profiling.empty()) {
      record.job.set_reason(
          absl::StrCat("waiting while job ", profiling, " is profiled (", ready.size(), " ready)"));
      continue;
    }
    const int need = JobWorkers(record.resolved);
    if (static_cast<int>(ready.size()) < need) {
      const std::string waiting = absl::StrCat("waiting for ", need, " READY workers (",
                                               ReadyCount(ready.size(), drained_ready()), ")");
      const absl::Duration waited = now - FromProtoTimestamp(record.job.create_time());
      if (waited > record.resolved.queue_timeout && now >= record.restart_grace_until) {
        EndLocked(record, v1::JOB_STATE_FAILED,
                  absl::StrCat("not placed within spec.scheduling.queue_timeout (",
                               absl::FormatDuration(record.resolved.queue_timeout), "): ", waiting,
                               "; add workers or ask for fewer stages"));
        continue;
      }
      record.job.set_reason(waiting);
      continue;  // later jobs that fit the READY workers go first (backfill)
    }
    if (record.place_by_memory) ready = RoomiestFirstLocked(std::move(ready), need);
    ready.resize(need);
    absl::Status started = StartLocked(record, ready);
    if (!started.ok()) {
      // A worker counted READY above changed since (lost, or gone): none
      // was assigned, and the next pass counts again.
      record.job.set_reason(absl::StrCat("waiting to be placed: ", started.message()));
      continue;
    }
    if (record.job.state() == v1::JOB_STATE_PROFILING) profiling = id;  // later jobs wait for it
  }
  if (!profiling.empty()) return;
  // Spare workers grow running elastic jobs, once no job waits for them.
  for (const std::string& id : order_) {
    const v1::JobState state = jobs_.at(id)->job.state();
    // A job being planned may yet go back to waiting (a worker lost).
    if (state == v1::JOB_STATE_QUEUED || state == v1::JOB_STATE_PROFILING ||
        state == v1::JOB_STATE_PLANNING) {
      return;
    }
  }
  for (const std::string& id : order_) {
    JobRecord& record = *jobs_.at(id);
    if (record.job.state() != v1::JOB_STATE_RUNNING || record.checkpoints == nullptr ||
        record.stop_at > 0 || record.job.worker_ids_size() >= MaxJobWorkers(record)) {
      continue;
    }
    const std::vector<std::string> spare = SparesForLocked(record, reserved);
    if (spare.empty()) continue;  // another job may take those unfit for this one
    const int current = record.job.worker_ids_size();
    int want = std::min<int>(spare.size(), MaxJobWorkers(record) - current);
    want -= want % WorkerStep(record);  // a stage more for every replica, or none
    // Only as many as a plan would use: an auto layout may have none for
    // the larger count (a prime one, say), and a boundary that re-plans on
    // the same workers would be asked for again, step after step.
    want = std::max(0, UsableWorkers(record, current + want) - current);
    if (want == 0) continue;
    const std::vector<std::string> joining(spare.begin(), spare.begin() + want);
    if (RequestBoundaryLocked(record, absl::StrCat(absl::StrJoin(joining, ", "), " joined"))) {
      for (const std::string& w : joining) reserved.insert(w);
    }
  }
}

std::vector<std::string> JobManager::RoomiestFirstLocked(std::vector<std::string> workers,
                                                         int need) const {
  std::vector<v1::Worker> infos;
  for (const std::string& w : workers) {
    absl::StatusOr<v1::Worker> info = registry_->Get(w);
    // One gone since it was counted: last (StartLocked then finds it gone),
    // as a budget of one byte (an empty one would read as unlimited).
    if (!info.ok()) {
      info = v1::Worker();
      info->mutable_device()->set_memory_bytes(1);
    }
    infos.push_back(*std::move(info));
  }
  std::vector<std::string> ordered;
  std::vector<bool> taken(workers.size(), false);
  for (size_t i : RoomiestWorkers(infos, need)) {
    ordered.push_back(workers[i]);
    taken[i] = true;
  }
  for (size_t i = 0; i < workers.size(); ++i) {
    if (!taken[i]) ordered.push_back(std::move(workers[i]));
  }
  return ordered;
}

size_t JobManager::DrainedReadyLocked() const {
  size_t drained = 0;
  for (const std::string& w : registry_->ReadyWorkers()) drained += IsDrainedLocked(w) ? 1 : 0;
  return drained;
}

std::string JobManager::ReadyCount(size_t ready, size_t drained) {
  // Drained workers stay READY (`pipetrain workers` lists them so) but are
  // never placed: counted apart, a job waiting beside them says why.
  return drained == 0 ? absl::StrCat(ready, " ready")
                      : absl::StrCat(ready, " ready; ", drained,
                                     " more READY but drained, taking no job until restarted");
}

std::vector<std::string> JobManager::SparesForLocked(const JobRecord& record,
                                                     const std::set<std::string>& reserved) const {
  std::vector<std::string> spare = SpareWorkersLocked(reserved);
  spare.erase(std::remove_if(spare.begin(), spare.end(),
                             [&](const std::string& w) {
                               auto it = record.unfit.find(w);
                               return it != record.unfit.end() && it->second == IncarnationOf(w);
                             }),
              spare.end());
  return spare;
}

std::vector<std::string> JobManager::SpareWorkersLocked(
    const std::set<std::string>& reserved) const {
  std::vector<std::string> spare;
  for (std::string& w : registry_->ReadyWorkers()) {
    if (reserved.count(w) == 0 && !IsDrainedLocked(w)) spare.push_back(std::move(w));
  }
  return spare;
}

int64_t JobManager::IncarnationOf(const std::string& worker_id) const {
  absl::StatusOr<v1::Worker> worker = registry_->Get(worker_id);
  return worker.ok() ? worker->incarnation() : 0;
}

bool JobManager::IsLostLocked(const JobRecord& record, const std::string& worker_id) const {
  // A worker that registered again since (a new incarnation) is back.
  auto it = record.lost.find(worker_id);
  return it != record.lost.end() && IncarnationOf(worker_id) == it->second;
}

bool JobManager::IsDrainedLocked(const std::string& worker_id) const {
  absl::StatusOr<v1::Worker> worker = registry_->Get(worker_id);
  return worker.ok() && IsDrainedLocked(*worker);
}

bool JobManager::IsDrainedLocked(const v1::Worker& worker) const {
  // Registered as a drained process: the registry's record says so from
  // the moment it is READY, so no placement can come first.
  if (worker.drained()) return true;
  auto it = drained_.find(worker.id());
  return it != drained_.end() && it->second == worker.incarnation();
}

bool JobManager::RequestBoundaryLocked(JobRecord& record, const std::string& reason) {
  // Beyond every stage's progress: `furthest` is the most advanced stage's
  // last report, and a stage learns the step at its next report (one
  // iteration later at most), so every stage learns it before passing it.
  int64_t furthest = record.job.progress().step();
  for (const StageProgress& s : record.stages) furthest = std::max(furthest, s.iterations_done);
  const int64_t step = furthest + 3;
  if (step >= record.resolved.train.steps) return false;  // it ends sooner than that
  record.stop_at = step;
  record.boundary_reason = reason;
  record.checkpoints->AllowStep(step);
  PT_LOG(INFO) << "job " << record.job.id() << ": re-planning after step " << step << " (" << reason
               << ")";
  return true;
}

void JobManager::MaybeReplanAtBoundaryLocked(JobRecord& record) {
  // The boundary's checkpoint complete, and its last step's loss in.
  if (record.stop_at == 0 || record.job.state() != v1::JOB_STATE_RUNNING) return;
  const v1::ResumeFrom* latest = record.checkpoints->Latest();
  if (latest == nullptr || latest->step() != record.stop_at ||
      record.job.progress().step() < record.stop_at) {
    return;
  }
  ReplanAtBoundaryLocked(record);
}

void JobManager::ReplanAtBoundaryLocked(JobRecord& record) {
  const std::string reason = record.boundary_reason;
  const int64_t step = record.stop_at;
  record.stop_at = 0;
  std::vector<std::string> chosen;
  for (const std::string& w : record.job.worker_ids()) {
    if (!IsDrainedLocked(w)) chosen.push_back(w);
  }
  const std::vector<std::string> old(record.job.worker_ids().begin(),
                                     record.job.worker_ids().end());
  std::set<std::string> reserved(old.begin(), old.end());
  for (const auto& [id, other] : jobs_) {
    if (other->job.state() == v1::JOB_STATE_RECOVERING) {
      reserved.insert(other->survivors.begin(), other->survivors.end());
    }
  }
  const size_t own = chosen.size();
  for (const std::string& w : SparesForLocked(record, reserved)) {
    if (static_cast<int>(chosen.size()) >= MaxJobWorkers(record)) break;
    chosen.push_back(w);
  }
  KeepWholeReplicas(record, &chosen);
  if (static_cast<int>(chosen.size()) < MinJobWorkers(record)) {
    // A spare went away meanwhile: wait for workers as a recovery does.
    return StartRecoveryLocked(record, "", reason, RecoveryKind::kWorkerLost);
  }
  // Those the new plan leaves out stop now: once released, another job may
  // take them before this plan is in.
  for (const std::string& w : old) {
    if (std::find(chosen.begin(), chosen.end(), w) == chosen.end()) {
      StopWorkerLocked(record, w);
    }
  }
  registry_->Release(record.job.id());
  PendingPlacement pending;
  pending.origin = PlacementOrigin::kBoundary;
  pending.resume = *record.checkpoints->Latest();
  pending.reason = absl::StrCat(reason, "; re-planned at step ", step);
  pending.failure_prefix = absl::StrCat("re-planning at step ", step, " (", reason, ") failed: ");
  if (chosen.size() > own) pending.joiners.assign(chosen.begin() + own, chosen.end());
  absl::Status placed = BeginPlacementLocked(record, chosen, std::move(pending));
  if (!placed.ok()) {
    // A chosen worker went since it was counted: recover as from its loss
    // (the boundary's checkpoint is complete, so nothing is redone).
    return StartRecoveryLocked(
        record, "", absl::StrCat(reason, "; re-planning at step ", step, ": ", placed.message()),
        RecoveryKind::kWorkerLost);
  }
}

bool JobManager::IsDrained(const v1::Worker& worker) const {
  AnnotatedMutexLock lock(&mu_);
  return IsDrainedLocked(worker);
}

absl::StatusOr<v1::Worker> JobManager::Drain(const std::string& worker_id) {
  absl::StatusOr<v1::Worker> drained;
  {
    AnnotatedMutexLock lock(&mu_);
    drained = DrainLocked(worker_id);
  }
  if (!drained.ok()) return drained;
  // Saved before it is acknowledged, off the lock (a store commit).
  const absl::Status saved = registry_->MarkDrained(worker_id, drained->incarnation());
  // FAILED_PRECONDITION: that incarnation is gone since (registered again,
  // as a new process or with the drain it heard of): nothing to keep.
  if (!saved.ok() && saved.code() != absl::StatusCode::kFailedPrecondition) {
    return absl::UnavailableError(absl::StrCat(
        worker_id, " is draining here, but the state store did not record it (", saved.message(),
        "); a coordinator that restarts before the worker's next heartbeat would forget it: "
        "drain again to see it recorded"));
  }
  return drained;
}

absl::StatusOr<v1::Worker> JobManager::DrainLocked(const std::string& worker_id) {
  ASSIGN_OR_RETURN(v1::Worker worker, registry_->Get(worker_id));
  // A LOST or LEFT incarnation is out of service already, and the drain
  // would not cover the next one (drained_ holds the incarnation): saying
  // "draining" would tell the operator something that is not happening.
  if (worker.state() == v1::WORKER_STATE_LOST || worker.state() == v1::WORKER_STATE_LEFT) {
    return absl::FailedPreconditionError(absl::StrCat(
        worker_id, " is ", EnumShortName(worker.state()),
        ": out of service already; a process that registers again under this id is a new "
        "incarnation, which this drain would not cover (drain it once it is READY)"));
  }
  JobRecord* record = worker.job_id().empty() ? nullptr : FindLocked(worker.job_id());
  if (record != nullptr && !IsTerminal(record->job.state()) && !IsDrainedLocked(worker_id)) {
    if (record->checkpoints == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          worker_id, " runs job ", record->job.id(),
          ", which has no checkpoints (spec.checkpoint) to re-plan from; cancel the job or "
          "let it finish first"));
    }
    std::set<std::string> reserved;
    // Being planned, the job's workers are the placement's. Those drained
    // already leave at the same boundary: not counted as staying.
    const std::vector<std::string> workers =
        record->pending.has_value() ? record->pending->workers
                                    : std::vector<std::string>(record->job.worker_ids().begin(),
                                                               record->job.worker_ids().end());
    const int staying = static_cast<int>(std::count_if(
        workers.begin(), workers.end(), [&](const std::string& w) { return !IsDrainedLocked(w); }));
    const int left = staying - 1 + static_cast<int>(SparesForLocked(*record, reserved).size());
    // As many as the re-plan could use (whole stages, a count with a layout).
    if (UsableWorkers(*record, std::max(0, left)) < MinJobWorkers(*record)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "draining ", worker_id, " would leave job ", record->job.id(), " fewer than its ",
          MinJobWorkers(*record), " workers (",
          record->auto_layout_workers > 0 ? "the fewest with a layout of spec.parallelism.workers"
                                          : "spec.elastic.min_workers x spec.parallelism.data",
          "); add a worker first"));
    }
  }
  // Idempotent: asked again, nothing more happens (the boundary's reason
  // would otherwise grow with every call, and with it the stored job).
  if (IsDrainedLocked(worker_id)) {
    worker.set_drained(true);
    return worker;
  }
  drained_[worker_id] = worker.incarnation();
  PT_LOG(INFO) << "draining " << worker_id;
  if (record != nullptr && record->job.state() == v1::JOB_STATE_RUNNING && record->stop_at == 0) {
    RequestBoundaryLocked(*record, absl::StrCat(worker_id, " drained"));
  } else if (record != nullptr && record->job.state() == v1::JOB_STATE_RUNNING) {
    record->boundary_reason += absl::StrCat("; ", worker_id, " drained");
  }
  worker.set_drained(true);
  return worker;
}

absl::Status JobManager::StartLocked(JobRecord& record, const std::vector<std::string>& workers) {
  std::vector<v1::Worker> infos;
  for (const std::string& w : workers) {
    ASSIGN_OR_RETURN(v1::Worker worker, registry_->Get(w));
    infos.push_back(worker);
  }
  ModelProfile profile;
  std::string source;
  double reference_gflops = 0;
  if (!ChooseProfileLocked(record, infos, &profile, &source, &reference_gflops)) {
    return absl::OkStatus();  // PROFILING; planned when the profile arrives
  }
  record.profile = profile;
  record.profile_source = source;
  record.reference_gflops = reference_gflops;
  PendingPlacement pending;
  pending.origin = PlacementOrigin::kInitial;
  pending.reason = "initial plan";
  if (record.place_by_memory) {
    pending.failure_prefix = "on the READY workers with the most memory: ";
  }
  return BeginPlacementLocked(record, workers, std::move(pending));
}

absl::Status JobManager::BeginPlacementLocked(JobRecord& record,
                                              const std::vector<std::string>& workers,
                                              PendingPlacement pending) {
  const std::string& id = record.job.id();
  // No checkpoint of its own yet: where spec.init.from starts it.
  if (!pending.resume.has_value() && record.init_checkpoint.has_value()) {
    pending.resume = record.init_checkpoint;
  }
  std::vector<v1::Worker> infos;
  for (const std::string& w : workers) {
    ASSIGN_OR_RETURN(v1::Worker worker, registry_->Get(w));
    infos.push_back(worker);
  }
  PlanningInput input;
  ClusterSpec& cluster = input.cluster;
  // What each worker may use (its cgroup or --memory-limit; GPU workers
  // hold the model in device memory), a host's RAM or a GPU shared by the
  // workers that draw on it.
  const std::vector<double> memory = PlanMemoryBudgets(infos, &input.shared_memory);
  for (size_t i = 0; i < infos.size(); ++i) {
    const v1::Worker& w = infos[i];
    const double gflops = HostGflops(infos, w);
    const double reference = record.reference_gflops;
    // Within the planner's bounds (cluster files' too): a registration's
    // GFLOP/s anywhere in [0, 1e9] could make a speed of 1e-302.
    const double speed =
        gflops > 0 && reference > 0 ? std::clamp(gflops / reference, 1e-6, 1e6) : 1.0;
    WorkerSpec spec{w.id(), speed, memory[i]};
    // Which workers share a host's cores (host_sharing.h); bounded at
    // registration (registration_limits.h).
    spec.host = w.device().hostname();
    spec.host_cores = w.device().cpu_cores();
    spec.compute_threads = w.device().compute_threads();
    spec.gpu = !w.device().gpu_model().empty();
    cluster.workers.push_back(spec);
  }
  // Workers that emulate their links (--emulate-link) say so: plan with
  // the slowest; otherwise with the assumed network.
  double bandwidth = 0, latency = 0;
  bool emulated = true;
  for (const v1::Worker& w : infos) {
    const double b = w.device().link_bandwidth_bytes_per_second();
    const double l = w.device().link_latency_seconds();
    // DeviceInfo's bounds; a value outside them means "not emulated".
    if (!(b >= 1e3 && b <= 1e13) || !(l >= 0 && l <= 10)) {
      emulated = false;
      break;
    }
    bandwidth = bandwidth == 0 ? b : std::min(bandwidth, b);
    latency = std::max(latency, l);
  }
  cluster.bandwidth_bytes_per_second = emulated ? bandwidth : kAssumedBandwidth;
  cluster.latency_seconds = emulated ? latency : kAssumedLatency;
  cluster.links_emulated = emulated;
  SetSlowestHostDataPlane(infos, &cluster);
  // Held for this job from now on: a worker lost while the job is planned
  // is the job's loss (OnWorkerLost), and no other job takes these.
  RETURN_IF_ERROR(registry_->Assign(workers, id));
  input.job_id = id;
  input.version = record.plan.version() + 1;
  input.workers = static_cast<int>(workers.size());
  input.resolved = record.resolved;
  input.auto_layout_workers = record.auto_layout_workers;
  input.auto_layout_compression = record.auto_layout_compression;
  input.auto_layout_parallelism = record.auto_layout_parallelism;
  input.profile = *record.profile;
  input.profile_source = record.profile_source;
  input.reason = pending.reason;
  input.queued_at = clock_->Now();
  pending.workers = workers;
  pending.infos = std::move(infos);
  pending.version = input.version;
  record.pending = std::move(pending);
  const int64_t placement = ++record.placement;
  record.job.set_state(v1::JOB_STATE_PLANNING);
  record.job.set_reason(absl::StrCat("planning on ", absl::StrJoin(workers, ", ")));
  TouchLocked(record);
  // Shutting down: nobody would take the plan (the job is restored from
  // its stored state, which is not PLANNING).
  if (stopping_) return absl::OkStatus();
  RunInBackgroundLocked([this, placement, input = std::move(input)] {
    // At shutdown the plans still queued are not computed: nobody takes them.
    PlanningOutput output;
    if (planning_stopped_.load(std::memory_order_acquire)) {
      output.status = absl::CancelledError("the coordinator is shutting down");
    } else {
      const absl::Time started = clock_->Now();
      output = PlanPlacement(input);
      output.queued_seconds = absl::ToDoubleSeconds(started - input.queued_at);
      output.computing_seconds = absl::ToDoubleSeconds(clock_->Now() - started);
    }
    FinishPlacement(input.job_id, placement, std::move(output));
  });
  return absl::OkStatus();
}

JobManager::PlanningOutput JobManager::PlanPlacement(const PlanningInput& in) {
  PlanningOutput out;
  // A plan refused for memory: "has N bytes" is then a share; say of what.
  auto say_shares = [&in](absl::Status s) {
    if (s.code() != absl::StatusCode::kResourceExhausted || in.shared_memory.empty()) return s;
    return absl::ResourceExhaustedError(
        absl::StrCat(s.message(), " (memory per worker: ", in.shared_memory, ")"));
  };
  ResolvedJobSpec resolved = in.resolved;
  out.placed_reason = in.reason;
  // spec.parallelism.data 0 (auto): the layout is chosen now, on these
  // workers and the job's profile, and until the next plan the job is as
  // if it had named it (its spec shows the choice).
  std::optional<CompiledPlan> chosen;
  if (in.auto_layout_workers > 0) {
    absl::StatusOr<ResolvedJobSpec> automatic = ResolveAsAutoLayout(
        resolved.spec, in.workers, in.auto_layout_compression, &in.auto_layout_parallelism);
    if (!automatic.ok()) {
      out.status = automatic.status();
      return out;
    }
    absl::StatusOr<ChosenJobLayout> chose = ChooseJobLayout(
        *automatic, in.job_id, in.version, in.profile, in.cluster, in.profile_source);
    if (!chose.ok()) {
      out.status = say_shares(chose.status());
      return out;
    }
    out.placed_reason = absl::StrCat(in.reason, "; ", DescribeLayoutChoice(*chose));
    resolved = std::move(chose->resolved);
    out.chosen = resolved;
    chosen = std::move(chose->compiled);
  }
  // A re-plan may use another number of stages (spec.elastic); the
  // replicas (spec.parallelism.data) and tensor ranks (.tensor) stay,
  // replica r's stage s, rank t on workers[(r * stages + s) * tensor + t].
  const int replicas = std::max(1, resolved.data_parallel);
  const int tensor = std::max(1, resolved.tensor_parallel);
  if (in.workers == 0 || in.workers % (replicas * tensor) != 0) {
    out.status =
        absl::InternalError(absl::StrCat(in.workers, " workers for ", replicas,
                                         " data-parallel replicas of ", tensor, " tensor ranks"));
    return out;
  }
  if (chosen.has_value()) {
    out.compiled = *std::move(chosen);
    return out;
  }
  resolved.stages = in.workers / (replicas * tensor);
  resolved.spec.mutable_parallelism()->set_stages(resolved.stages);
  absl::StatusOr<CompiledPlan> planned =
      PlanJob(resolved, in.job_id, in.version, in.profile, in.cluster, in.profile_source);
  if (!planned.ok()) {
    out.status = say_shares(planned.status());
    return out;
  }
  out.compiled = *std::move(planned);
  return out;
}

void JobManager::FinishPlacement(const std::string& job_id, int64_t placement,
                                 PlanningOutput output) {
  AnnotatedMutexLock lock(&mu_);
  --background_in_flight_;
  if (events_.planned && !stopping_) {
    events_.planned(output.queued_seconds, output.computing_seconds);
  }
  JobRecord* record = FindLocked(job_id);
  // Overtaken while it was planned (cancelled, a worker lost, shutting
  // down): whatever changed the job released its workers.
  if (stopping_ || record == nullptr || record->job.state() != v1::JOB_STATE_PLANNING ||
      record->placement != placement || !record->pending.has_value()) {
    return;
  }
  PendingPlacement pending = *std::move(record->pending);
  record->pending.reset();
  if (!output.status.ok() && RetryWithMoreMemoryLocked(*record, pending, output.status)) return;
  if (!output.status.ok() && RetryWithoutJoinersLocked(*record, pending, output.status)) return;
  if (!output.status.ok()) {
    return EndLocked(*record, v1::JOB_STATE_FAILED,
                     absl::StrCat(pending.failure_prefix, output.status.message()));
  }
  CommitPlacementLocked(*record, std::move(pending), std::move(output));
}

bool JobManager::RetryWithMoreMemoryLocked(JobRecord& record, const PendingPlacement& pending,
                                           const absl::Status& refusal) {
  if (refusal.code() != absl::StatusCode::kResourceExhausted ||
      pending.origin != PlacementOrigin::kInitial || record.place_by_memory) {
    return false;
  }
  // The candidates: these workers (still the job's in the registry) and
  // every spare READY one.
  std::vector<std::string> candidates = pending.workers;
  for (std::string& w : SpareWorkersLocked({})) candidates.push_back(std::move(w));
  const int need = static_cast<int>(pending.workers.size());
  std::vector<std::string> roomiest = RoomiestFirstLocked(std::move(candidates), need);
  roomiest.resize(need);
  if (std::set<std::string>(roomiest.begin(), roomiest.end()) ==
      std::set<std::string>(pending.workers.begin(), pending.workers.end())) {
    return false;  // no other READY workers have more: the refusal stands
  }
  registry_->Release(record.job.id());
  record.place_by_memory = true;
  record.job.set_state(v1::JOB_STATE_QUEUED);
  record.job.set_reason(absl::StrCat("the plan on ", absl::StrJoin(pending.workers, ", "),
                                     " did not fit (", refusal.message(),
                                     "); waiting to be placed on the READY workers with the "
                                     "most memory"));
  PT_LOG(INFO) << "job " << record.job.id() << ": " << record.job.reason();
  TouchLocked(record);
  return true;
}

bool JobManager::RetryWithoutJoinersLocked(JobRecord& record, PendingPlacement& pending,
                                           const absl::Status& refusal) {
  if (pending.origin == PlacementOrigin::kInitial || pending.joiners.empty()) return false;
  for (const v1::Worker& w : pending.infos) {
    if (std::find(pending.joiners.begin(), pending.joiners.end(), w.id()) !=
        pending.joiners.end()) {
      record.unfit[w.id()] = w.incarnation();
    }
  }
  const std::string note = absl::StrCat("the plan with ", absl::StrJoin(pending.joiners, ", "),
                                        " was refused (", refusal.message(), ")");
  PT_LOG(WARNING) << "job " << record.job.id() << ": " << note << "; going on without them";
  std::vector<std::string> rest;
  for (const std::string& w : pending.workers) {
    if (std::find(pending.joiners.begin(), pending.joiners.end(), w) == pending.joiners.end()) {
      rest.push_back(w);
    }
  }
  KeepWholeReplicas(record, &rest);
  registry_->Release(record.job.id());
  const PlacementOrigin origin = pending.origin;
  absl::Status placed = absl::FailedPreconditionError(
      absl::StrCat("fewer than ", MinJobWorkers(record), " workers without them"));
  if (static_cast<int>(rest.size()) >= MinJobWorkers(record)) {
    pending.joiners.clear();
    pending.reason = absl::StrCat(pending.reason, "; without the workers refused: ", note);
    placed = BeginPlacementLocked(record, rest, std::move(pending));
  }
  if (placed.ok()) return true;
  if (origin == PlacementOrigin::kRecovery) {
    // Still the same recovery: its survivors and losses stand, and the next
    // pass chooses again from the workers left.
    record.job.set_state(v1::JOB_STATE_RECOVERING);
    record.job.set_reason(
        absl::StrCat("recovering: ", record.recovery_reason, "; ", note, "; ", placed.message()));
    TouchLocked(record);
    return true;
  }
  StartRecoveryLocked(record, "",
                      absl::StrCat(record.boundary_reason, "; ", note, "; ", placed.message()),
                      RecoveryKind::kReplanRefused);
  return true;
}

void JobManager::CommitPlacementLocked(JobRecord& record, PendingPlacement pending,
                                       PlanningOutput output) {
  const std::string& id = record.job.id();
  if (output.chosen.has_value()) {
    record.resolved = *std::move(output.chosen);
    *record.job.mutable_spec() = record.resolved.spec;
  }
  if (pending.origin == PlacementOrigin::kRecovery) {
    v1::JobProgress* p = record.job.mutable_progress();
    // The history of steps [0, resume_step) stays; later steps are redone.
    if (pending.resume_step < p->loss_history_start()) {
      // Resumed before the kept history begins (a checkpoint older than its
      // last 10000 steps): none of it precedes the resume point, and the
      // steps redone are recorded from there.
      p->clear_loss_history();
      p->set_loss_history_start(pending.resume_step);
    } else if (const int64_t keep = pending.resume_step - p->loss_history_start();
               keep < p->loss_history_size()) {
      p->mutable_loss_history()->Truncate(static_cast<int>(keep));
    }
    p->set_step(pending.resume_step);
    // Complete checkpoints beyond the resume point are redone: held, the
    // redo's files would be checked against their old checksums (other
    // bytes under another layout) and a step boundary among or below them
    // would never complete.
    if (record.checkpoints != nullptr) {
      for (int64_t step : record.checkpoints->ForgetAfter(pending.resume_step)) {
        PT_LOG(INFO) << "job " << id << ": checkpoint of step " << step
                     << " forgotten: the recovery resumes before it and redoes it";
      }
      const v1::ResumeFrom* latest = record.checkpoints->Latest();
      p->set_checkpoint_step(latest != nullptr ? latest->step() : 0);
    }
    if (p->val_step() > pending.resume_step) p->set_val_step(0), p->set_val_loss(0);
    p->set_steps_redone(p->steps_redone() + pending.redone);
    p->set_recoveries(p->recoveries() + 1);
  }
  const std::vector<std::string>& workers = pending.workers;
  const std::vector<v1::Worker>& infos = pending.infos;
  const v1::ResumeFrom* resume = pending.resume.has_value() ? &*pending.resume : nullptr;
  const int64_t version = pending.version;
  const std::string& placed_reason = output.placed_reason;
  CompiledPlan compiled = std::move(output.compiled);
  std::vector<std::string> addresses;
  for (const v1::Worker& w : infos) addresses.push_back(w.data_address());
  // Whole replicas of whole stages (PlanPlacement checked).
  const int replicas = Replicas(record);
  const int tensor = TensorRanks(record);
  const int stages = static_cast<int>(workers.size()) / (replicas * tensor);
  // Device links join a pipeline's stages on a host, each replica's its
  // own groups over the programs the replicas share; the tensor ranks
  // share programs too, so with tensor parallelism every link stays on the
  // data plane (their sends and receives would need a group per rank).
  const std::vector<DeviceLinkMember> members = DeviceLinkMembers(infos, *registry_);
  DeviceLinkPlan links;
  links.group_of_stage.assign(workers.size(), -1);
  if (tensor == 1) {
    ReplicatedDeviceLinkPlan planned =
        PlanReplicatedDeviceLinks(members, replicas, &compiled.programs);
    if (planned.replicas_differ) {
      PT_LOG(INFO) << "job " << id << ": every link stays on the wire: the replicas' workers "
                   << "would mark the shared programs' device links differently";
    }
    links = std::move(planned.links);
  }
  // The replicas of a stage on the GPUs of one host sum its gradients with
  // NCCL (exact stages only), with ids the device groups left free.
  std::vector<bool> id_taken(workers.size(), false);
  for (const DeviceLinkGroup& g : links.groups) id_taken[g.id_owner_stage] = true;
  const ReplicaDeviceGroupPlan replica_groups =
      PlanReplicaDeviceGroups(members, replicas, stages, tensor,
                              {compiled.plan.data_parallel_compressed_stages().begin(),
                               compiled.plan.data_parallel_compressed_stages().end()},
                              id_taken);
  ConsumeDeviceGroupIds(id, links, infos, registry_);
  ConsumeReplicaGroupIds(id, replica_groups, infos, registry_);
  record.plan = compiled.plan;
  record.stages.assign(workers.size(), StageProgress{});
  record.traced = record.tracing = JobRecord::TracedStep{};
  record.assignments.clear();
  record.stage_of.clear();
  record.weight_owner.clear();
  record.tied_embedding_stages.clear();
  DropWeightsFile(record);
  record.job.clear_worker_ids();
  record.job.mutable_progress()->clear_stage_times();
  const int64_t start_step = resume != nullptr ? resume->step() : 0;
  // Only this plan's workers learn it: their streams prove it to each other.
  const std::string data_plane_secret = RandomToken();
  // What the plan gave each worker, as PlanMemoryBudgets shared it out.
  const std::vector<double> budgets = PlanMemoryBudgets(infos);
  for (size_t g = 0; g < workers.size(); ++g) {
    const int s = static_cast<int>(g) / tensor % stages;  // the replica's stage
    v1::Assignment a;
    a.set_action(v1::Assignment::ACTION_RUN);
    a.set_job_id(id);
    a.set_plan_version(record.plan.version());
    *a.mutable_spec() = record.resolved.spec;
    a.set_stage(s);
    a.set_num_stages(stages);
    a.set_replica(static_cast<int>(g) / (stages * tensor));
    a.set_replicas(replicas);
    a.set_tensor_rank(static_cast<int>(g) % tensor);
    a.set_tensor_parallel(tensor);
    *a.mutable_tensor_partitions_forward() = record.plan.tensor_partitions_forward();
    *a.mutable_tensor_partitions_backward() = record.plan.tensor_partitions_backward();
    for (int c : record.plan.data_parallel_compressed_stages()) {
      if (c != s) continue;
      a.set_data_parallel_powersgd_rank(record.plan.data_parallel_powersgd_rank());
      a.set_data_parallel_quantizer(record.plan.data_parallel_quantizer());
    }
    a.set_data_plane_secret(data_plane_secret);
    a.set_start_iteration(start_step);
    a.set_data_sha256(record.job.data_sha256());
    // Its corpus lives in the host's RAM, whatever its device's memory.
    if (infos[g].device().gpu_model().empty()) a.set_host_memory_budget_bytes(budgets[g]);
    for (int t = 0; t < stages; ++t) {
      const v1::UnitRange& b = record.plan.stages(t * tensor).backward();
      if (b.end() > b.begin()) a.add_optimizer_stages(t);
    }
    if (resume != nullptr) *a.mutable_resume() = *resume;
    if (resume == nullptr) a.set_init_weights(record.init_weights);
    *a.mutable_forward_units() = record.plan.stages(g).forward();
    *a.mutable_backward_units() = record.plan.stages(g).backward();
    for (const std::string& address : addresses) a.add_peer_addresses(address);
    *a.mutable_program() = compiled.programs[s];
    if (!compiled.eval_programs.empty()) *a.mutable_eval_program() = compiled.eval_programs[s];
    if (links.group_of_stage[g] >= 0) {
      *a.mutable_device_group() = links.groups[links.group_of_stage[g]].group;
    }
    if (replica_groups.group_of_worker[g] >= 0) {
      *a.mutable_replica_device_group() =
          replica_groups.groups[replica_groups.group_of_worker[g]].group;
    }
    record.stage_of[workers[g]] = static_cast<int>(g);
    RecordWeightOwners(record, static_cast<int>(g));
    record.job.add_worker_ids(workers[g]);
    record.job.mutable_progress()->add_stage_times()->set_worker_id(workers[g]);
    record.assignments.push_back(a);
    hub_->Set(workers[g], std::move(a));
  }
  v1::PlanVersion* history = record.job.add_plan_history();
  history->set_version(version);
  history->set_reason(placed_reason);
  history->set_start_step(start_step);
  for (const std::string& w : workers) history->add_worker_ids(w);
  *history->mutable_time() = ToProtoTimestamp(clock_->Now());
  if (record.job.plan_history_size() > kMaxPlanHistory) {
    record.job.mutable_plan_history()->DeleteSubrange(0, 1);
  }
  record.job.set_state(v1::JOB_STATE_RUNNING);
  record.job.set_plan_version(record.plan.version());
  record.job.set_reason("");
  record.last_step_time = clock_->Now();
  TouchLocked(record);
  PersistLocked(record).IgnoreError();  // logged
  PT_LOG(INFO) << "job " << id << " running on " << absl::StrJoin(workers, ", ") << " (plan "
               << version << ": " << placed_reason << (start_step > 0 ? ", from step " : "")
               << (start_step > 0 ? absl::StrCat(start_step) : "") << ")";
  if (pending.origin == PlacementOrigin::kRecovery) {
    if (events_.steps_redone) events_.steps_redone(pending.redone);
    record.recovering_since = record.recovery_started;
    record.recovery_waiting_seconds =
        absl::ToDoubleSeconds(pending.planning_start - record.recovery_started);
    record.replanned_at = clock_->Now();
    record.recovery_planning_seconds =
        absl::ToDoubleSeconds(record.replanned_at - pending.planning_start);
  }
  // A worker drained while the job was planned leaves at the next boundary,
  // as from a running job.
  for (const std::string& w : workers) {
    if (!IsDrainedLocked(w) || record.checkpoints == nullptr) continue;
    if (record.stop_at == 0) {
      RequestBoundaryLocked(record, absl::StrCat(w, " drained"));
    } else {
      record.boundary_reason += absl::StrCat("; ", w, " drained");
    }
  }
}

void JobManager::AbandonPlacementLocked(JobRecord& record, const std::string& worker,
                                        const std::string& reason, int64_t incarnation) {
  const PlacementOrigin origin = record.pending->origin;
  record.pending.reset();  // its task, when it ends, finds the job moved on
  const std::string why =
      absl::StrCat("a worker was lost while the job was being planned (", reason, ")");
  PT_LOG(WARNING) << "job " << record.job.id() << ": " << why;
  switch (origin) {
    case PlacementOrigin::kInitial:
      registry_->Release(record.job.id());
      record.job.set_state(v1::JOB_STATE_QUEUED);
      record.job.set_reason(absl::StrCat(why, "; waiting to be planned again"));
      TouchLocked(record);
      return;
    case PlacementOrigin::kRecovery:
      // Back to waiting, as before the re-plan; it is planned again
      // without the worker, which counts as lost in this recovery.
      registry_->Release(record.job.id());
      record.lost[worker] = incarnation > 0 ? incarnation : IncarnationOf(worker);
      record.job.set_state(v1::JOB_STATE_RECOVERING);
      record.job.set_reason(absl::StrCat("recovering: ", record.recovery_reason, "; ", why));
      TouchLocked(record);
      return;
    case PlacementOrigin::kBoundary:
      // Its stages stopped after the boundary's complete checkpoint: a
      // recovery resumes there, redoing nothing.
      return StartRecoveryLocked(record, worker, why, RecoveryKind::kWorkerLost, incarnation);
  }
}

void JobManager::StartRecoveryLocked(JobRecord& record, const std::string& lost,
                                     const std::string& reason, RecoveryKind kind,
                                     int64_t lost_incarnation) {
  // The incarnation that is gone: a worker that registered again is lost
  // only as it was (IsLostLocked), and its new incarnation is a candidate.
  const int64_t gone = lost_incarnation > 0 ? lost_incarnation : IncarnationOf(lost);
  if (record.job.state() == v1::JOB_STATE_RECOVERING) {  // another loss while waiting
    if (!lost.empty()) record.lost[lost] = gone;
    return;
  }
  if (record.checkpoints == nullptr) return EndLocked(record, v1::JOB_STATE_FAILED, reason);
  if (record.recoveries_without_progress >= kMaxRecoveriesWithoutProgress) {
    return EndLocked(record, v1::JOB_STATE_FAILED,
                     absl::StrCat("gave up after ", record.recoveries_without_progress,
                                  " recoveries without a new checkpoint; last: ", reason));
  }
  ++record.recoveries_without_progress;
  record.stop_at = 0;
  record.pending.reset();
  record.job.set_state(v1::JOB_STATE_RECOVERING);
  record.job.set_reason(absl::StrCat("recovering: ", reason));
  record.recovery_started = clock_->Now();
  record.recovery_reason = reason;
  record.recovering_since.reset();
  record.lost.clear();
  if (!lost.empty()) record.lost[lost] = gone;
  record.survivors.clear();
  for (const std::string& w : record.job.worker_ids()) {
    if (w != lost) record.survivors.push_back(w);
    StopWorkerLocked(record, w);
  }
  registry_->Release(record.job.id());
  record.checkpoints->ClearPending();
  // The redone steps end with a fresh upload: the partial file goes now.
  DropWeightsFile(record);
  TouchLocked(record);
  PersistLocked(record).IgnoreError();  // logged
  if (events_.recovery_started) events_.recovery_started(kind);
  PT_LOG(WARNING) << "job " << record.job.id() << " RECOVERING: " << reason;
}

void JobManager::TryReplanLocked(JobRecord& record, std::set<std::string>* reserved) {
  // Every former worker must be accounted for: alive (a heartbeat since the
  // loss) or gone. A dead one left READY would be planned again and fail.
  std::vector<std::string> alive;
  bool waiting = false;
  for (const std::string& w : record.survivors) {
    if (IsLostLocked(record, w) || IsDrainedLocked(w)) continue;
    absl::StatusOr<v1::Worker> worker = registry_->Get(w);
    const bool gone = !worker.ok() || worker->state() == v1::WORKER_STATE_LOST ||
                      worker->state() == v1::WORKER_STATE_LEFT;
    if (gone && clock_->Now() < record.restart_grace_until) {
      waiting = true;  // after a restart: it may still register again
      continue;
    }
    if (gone) continue;
    reserved->insert(w);
    if (FromProtoTimestamp(worker->last_heartbeat()) <= record.recovery_started) {
      waiting = true;
    } else if (worker->state() == v1::WORKER_STATE_READY) {
      alive.push_back(w);
    }
  }
  const absl::Time now = clock_->Now();
  if (waiting) {
    record.job.set_reason(absl::StrCat("recovering: ", record.recovery_reason,
                                       "; waiting to hear from the other workers"));
    return;
  }
  // Survivors first (in stage order), then spare READY workers.
  std::vector<std::string> chosen = alive;
  for (const std::string& w : SparesForLocked(record, *reserved)) {
    if (std::find(chosen.begin(), chosen.end(), w) == chosen.end() && !IsLostLocked(record, w)) {
      chosen.push_back(w);
    }
  }
  if (static_cast<int>(chosen.size()) > MaxJobWorkers(record)) {
    chosen.resize(MaxJobWorkers(record));
  }
  // Counted before whole replicas are kept: 3 of a 4-rank group's workers
  // are "3 ready", though none can be used yet.
  const size_t ready = chosen.size();
  KeepWholeReplicas(record, &chosen);
  if (static_cast<int>(chosen.size()) < MinJobWorkers(record)) {
    const std::string waiting_for =
        absl::StrCat("waiting for ", MinJobWorkers(record), " READY workers (",
                     ReadyCount(ready, DrainedReadyLocked()), ")");
    if (now - record.recovery_started > record.resolved.queue_timeout) {
      return EndLocked(record, v1::JOB_STATE_FAILED,
                       absl::StrCat("could not recover within spec.scheduling.queue_timeout: ",
                                    waiting_for, "; after ", record.recovery_reason));
    }
    record.job.set_reason(absl::StrCat("recovering: ", record.recovery_reason, "; ", waiting_for));
    return;
  }
  const v1::JobProgress& p = record.job.progress();
  // Where the recorded losses reach: a checkpoint whose last step's loss
  // never arrived would leave a hole in the history.
  const v1::ResumeFrom* resume = record.checkpoints->LatestAtOrBefore(p.step());
  PendingPlacement pending;
  pending.origin = PlacementOrigin::kRecovery;
  if (resume != nullptr) pending.resume = *resume;
  // Without one: where the job started (spec.init.from's checkpoint, or 0).
  pending.resume_step = resume != nullptr ? resume->step() : record.init_step;
  pending.redone = std::max<int64_t>(0, p.step() - pending.resume_step);
  pending.planning_start = now;
  pending.reason = absl::StrCat(
      record.recovery_reason, "; resumed from ",
      resume != nullptr
          ? absl::StrCat("checkpoint step ", pending.resume_step)
          : absl::StrCat("step ", pending.resume_step, " (no checkpoint of its own yet)"));
  pending.failure_prefix = absl::StrCat("re-planning after ", record.recovery_reason, " failed: ");
  if (chosen.size() > alive.size())
    pending.joiners.assign(chosen.begin() + alive.size(), chosen.end());
  absl::Status placed = BeginPlacementLocked(record, chosen, std::move(pending));
  if (!placed.ok()) {
    // A chosen worker went since it was counted: none was assigned, and the
    // next pass counts again.
    record.job.set_reason(
        absl::StrCat("recovering: ", record.recovery_reason, "; ", placed.message()));
    return;
  }
  for (const std::string& w : chosen) reserved->insert(w);
}

absl::Status JobManager::AddCheckpointLocked(JobRecord& record, int stage,
                                             const v1::CheckpointWritten& c) {
  if (record.checkpoints == nullptr) {
    return absl::InvalidArgumentError(
        "ReportProgressRequest.checkpoint: the job has no checkpoints (spec.checkpoint)");
  }
  if (!(c.write_seconds() >= 0 && c.write_seconds() <= kMaxReportedStepSeconds)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReportProgressRequest.checkpoint.write_seconds: ", c.write_seconds(),
                     " is outside [0, ", kMaxReportedStepSeconds, "]"));
  }
  if (!c.error().empty()) {
    PT_LOG(WARNING) << "job " << record.job.id() << ": stage " << stage
                    << " could not write its checkpoint of step " << c.step() << ": "
                    << c.error().substr(0, 4096);
    if (events_.checkpoint_failed) events_.checkpoint_failed();
    // Shown in the job (GetJob, `pipetrain job`), not only the log and a
    // counter: a job whose checkpoints all fail cannot recover as asked.
    v1::JobProgress* progress = record.job.mutable_progress();
    progress->set_checkpoint_failures(progress->checkpoint_failures() + 1);
    progress->set_checkpoint_error(
        absl::StrCat("step ", c.step(), ", stage ", stage, ": ", Utf8Prefix(c.error(), 1024)));
    // The job goes on, as at any step, unless the failed one is the step
    // boundary a drain or join waits for: every stage stops after it and
    // waits for a checkpoint that will never complete. Then the job
    // recovers from its latest complete checkpoint instead (the drained
    // worker left out, the joining one taken), redoing the steps since.
    if (record.stop_at > 0 && c.step() == record.stop_at &&
        record.job.state() == v1::JOB_STATE_RUNNING) {
      StartRecoveryLocked(
          record, "",
          absl::StrCat("the checkpoint of step ", c.step(), " (", record.boundary_reason,
                       ") failed on stage ", stage, ": ", c.error().substr(0, 1024)),
          RecoveryKind::kCheckpointFailed);
    }
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::optional<v1::ResumeFrom> complete,
                   record.checkpoints->Add(c, record.plan.stages(stage).backward()));
  // Steps that can no longer complete: their files go, off the lock (the
  // stored state never names an incomplete step).
  if (std::vector<v1::ResumeFrom> abandoned = record.checkpoints->TakeAbandoned();
      !abandoned.empty()) {
    io_.Post(
        [output_dir = options_.output_dir, id = record.job.id(), abandoned = std::move(abandoned)] {
          RemoveCheckpointDirs(output_dir, id, abandoned);
        });
  }
  if (events_.checkpoint_written) {  // write_seconds checked above
    events_.checkpoint_written(c.write_seconds());
  }
  if (!complete.has_value()) return absl::OkStatus();
  record.job.mutable_progress()->set_checkpoint_step(complete->step());
  record.job.mutable_progress()->set_checkpoint_failures(0);
  record.job.mutable_progress()->clear_checkpoint_error();
  // Progress is a checkpoint beyond every earlier one: a step redone after
  // its checkpoint was dropped does not count, or recoveries that drop
  // and redo the same step would never give up.
  if (complete->step() > record.furthest_checkpoint_step) {
    record.furthest_checkpoint_step = complete->step();
    record.recoveries_without_progress = 0;
  }
  // Files off the lock, in order, after the state that lists the new
  // checkpoint is saved: the manifest (for people and tools; resuming needs
  // only the checksummed unit files), then the expired ones go, but only if
  // the save succeeded (else the stored state may still name them).
  PersistLocked(record, [this, output_dir = options_.output_dir, id = record.job.id(),
                         model = record.resolved.spec.model(), seed = record.resolved.train.seed,
                         complete = *complete,
                         expired = record.checkpoints->TakeExpired()](const absl::Status& saved) {
    // Not for a checkpoint already gone from the catalog (expired while
    // saves waited: checkpoints completing faster than manifests are
    // written, two fsyncs each, would otherwise queue a manifest each
    // ahead of every later save and every cancel).
    bool held = false;
    {
      AnnotatedMutexLock lock(&mu_);
      JobRecord* record = FindLocked(id);
      held = record != nullptr && record->checkpoints != nullptr &&
             record->checkpoints->Holds(complete.step());
      // Kept for a later successful save (the catalog forgot them), which
      // removes them (PersistLocked; it took those of earlier failed saves
      // already when this save succeeded).
      if (record != nullptr && !saved.ok()) {
        record->expired_unsaved.insert(record->expired_unsaved.end(), expired.begin(),
                                       expired.end());
      }
    }
    if (held) {
      absl::Status manifest = WriteCheckpointManifest(output_dir, id, model, seed, complete);
      if (!manifest.ok()) PT_LOG(WARNING) << "job " << id << ": " << manifest;
    }
    if (!saved.ok()) {
      PT_LOG(WARNING) << "job " << id << ": kept " << expired.size()
                      << " expired checkpoint(s) until a later save: the state that drops "
                         "them was not saved";
      return;
    }
    RemoveCheckpointDirs(output_dir, id, expired);
  }).IgnoreError();  // logged, and retried (RetryUnsavedLocked)
  if (events_.checkpoint_completed) {
    int64_t bytes = 0;
    for (const v1::UnitFile& f : complete->units()) bytes += f.bytes();
    events_.checkpoint_completed(bytes);
  }
  PT_LOG(INFO) << "job " << record.job.id() << ": checkpoint of step " << complete->step()
               << " complete (" << complete->dir() << ")";
  MaybeReplanAtBoundaryLocked(record);
  return absl::OkStatus();
}

void JobManager::SweepCheckpointDirsLocked(JobRecord& record, absl::Time ended) {
  // Steps that never completed (the one being written when the job was
  // cancelled or failed, those a recovery stopped short of) can no longer:
  // their files go. So do the other step directories without a manifest,
  // which no catalog of this process knows: a previous coordinator's, killed
  // while it wrote or expired them; but not while another live job shares
  // the directory (state stored before sharing was refused), nor the steps
  // this job holds complete (a manifest whose write failed). The directory
  // stays this job's until the removal is done (checkpoint_sweep_pending),
  // and only files written before the end go. (Manifests are written on
  // io_ too, so those of checkpoints completed before the end are in place
  // when this runs.)
  if (record.checkpoints != nullptr && !options_.output_dir.empty()) {
    const std::string& checkpoint_dir = record.resolved.spec.checkpoint().dir();
    const bool shared = CheckpointDirUserLocked(checkpoint_dir) != nullptr;
    std::vector<v1::ResumeFrom> incomplete = record.checkpoints->TakeIncomplete();
    // Not for the second pass: the complete steps (kept) and the incomplete
    // ones (removed first, tried once).
    std::set<std::string> known;
    for (const v1::ResumeFrom& c : record.checkpoints->Complete()) known.insert(c.dir());
    for (const v1::ResumeFrom& i : incomplete) known.insert(i.dir());
    // Stages stopping may still write a step or two after the end (a cancel
    // reaches them tens of ms later); those files come after `ended`, so
    // a second sweep removes them once the workers have stopped
    // (SweepStoppedJobsLocked). The soak test left a step directory for
    // most cancelled jobs before it.
    record.checkpoint_sweeps_pending = shared ? 1 : 2;
    if (!shared) {
      record.late_sweep_workers.assign(record.job.worker_ids().begin(),
                                       record.job.worker_ids().end());
      record.late_sweep_since = clock_->Now();
      record.late_sweep_by = record.late_sweep_since + kLateSweepWait;
    }
    io_.Post([this, output_dir = options_.output_dir, id = record.job.id(), checkpoint_dir, shared,
              known = std::move(known), incomplete = std::move(incomplete), ended] {
      RemoveCheckpointDirs(output_dir, id, incomplete, ended);
      if (!shared) RemoveStepDirsWithoutManifest(output_dir, id, checkpoint_dir, known, ended);
      AnnotatedMutexLock lock(&mu_);
      if (JobRecord* done = FindLocked(id)) --done->checkpoint_sweeps_pending;
    });
  }
}

void JobManager::SweepStoppedJobsLocked() {
  const absl::Time now = clock_->Now();
  for (auto& [id, record] : jobs_) {
    if (record->late_sweep_workers.empty()) continue;
    // (A lambda may not name a structured binding in C++17: clang refuses.)
    const absl::Time since = record->late_sweep_since;
    const bool stopped =
        now >= record->late_sweep_by ||
        std::all_of(record->late_sweep_workers.begin(), record->late_sweep_workers.end(),
                    [&](const std::string& w) { return registry_->StoppedSince(w, since); });
    if (!stopped) continue;
    record->late_sweep_workers.clear();
    // Every step directory without a manifest but those this job holds
    // complete (a manifest whose write failed); files up to now.
    std::set<std::string> complete;
    for (const v1::ResumeFrom& c : record->checkpoints->Complete()) complete.insert(c.dir());
    io_.Post([this, output_dir = options_.output_dir, id = id,
              checkpoint_dir = record->resolved.spec.checkpoint().dir(),
              complete = std::move(complete), until = absl::Now()] {
      RemoveStepDirsWithoutManifest(output_dir, id, checkpoint_dir, complete, until);
      AnnotatedMutexLock lock(&mu_);
      if (JobRecord* done = FindLocked(id)) --done->checkpoint_sweeps_pending;
    });
  }
}

void JobManager::EndLocked(JobRecord& record, v1::JobState state, const std::string& reason) {
  record.pending.reset();
  record.job.set_state(state);
  record.job.set_reason(reason);
  TouchLocked(record);
  for (const std::string& worker : record.job.worker_ids()) StopWorkerLocked(record, worker);
  registry_->Release(record.job.id());
  DropWeightsFile(record);
  if (state != v1::JOB_STATE_SUCCEEDED) RemoveAbandonedWeightsOf(record);
  SweepCheckpointDirsLocked(record, absl::Now());
  PersistLocked(record).IgnoreError();  // logged
  if (events_.ended) events_.ended(state);
  PT_LOG(INFO) << "job " << record.job.id() << " " << EnumShortName(state)
               << (reason.empty() ? "" : ": " + reason);
}

absl::StatusOr<JobManager::JobRecord*> JobManager::ForWorkerLocked(const std::string& worker_id,
                                                                   const std::string& job_id) {
  JobRecord* record = FindLocked(job_id);
  if (record == nullptr) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  if (IsTerminal(record->job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " already ended (", EnumShortName(record->job.state()), ")"));
  }
  if (record->stage_of.count(worker_id) == 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("worker ", worker_id, " is not part of job ", job_id));
  }
  return record;
}

absl::StatusOr<v1::ReportProgressResponse> JobManager::ReportProgress(
    const v1::ReportProgressRequest& r, ProgressCounted* counted) {
  ProgressCounted ignored;
  if (counted == nullptr) counted = &ignored;
  *counted = ProgressCounted();
  AnnotatedMutexLock lock(&mu_);
  v1::ReportProgressResponse response;
  ASSIGN_OR_RETURN(JobRecord * record, ForWorkerLocked(r.worker_id(), r.job_id()));
  if (r.plan_version() != record->plan.version()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "plan version ", r.plan_version(), " is stale; current is ", record->plan.version()));
  }
  RETURN_IF_ERROR(CheckProgressBounds(r, *record));
  const int stage_index = record->stage_of.at(r.worker_id());
  // A recovering job drops traces (below), and one restored from the store
  // has no assignments to check them against until it is planned again.
  const bool stopped = record->job.state() == v1::JOB_STATE_RECOVERING ||
                       record->job.state() == v1::JOB_STATE_PLANNING || record->writing_weights;
  if (r.has_trace() && !stopped) {
    if (stage_index >= static_cast<int>(record->assignments.size())) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", r.job_id(), " has no program for stage ", stage_index, " yet"));
    }
    RETURN_IF_ERROR(
        CheckStepTrace(r.trace(), r.iteration(), record->assignments[stage_index].program()));
  }
  response.set_stop_after_step(record->stop_at);
  // Data parallelism: replica 0 speaks for all (the replicas hold the same
  // weights, and its loss stage reports every replica's losses); tensor
  // parallelism: rank 0 for its stage's ranks (they compute the same loss).
  const bool replica_zero = stage_index < StagesPerReplica(*record);
  const bool speaks = replica_zero && stage_index % TensorRanks(*record) == 0;
  if (r.has_checkpoint()) {
    if (!replica_zero) {
      return absl::PermissionDeniedError(absl::StrCat(
          "ReportProgressRequest.checkpoint: ", r.worker_id(),
          " runs a data-parallel replica other than 0, whose stages write no checkpoints"));
    }
    // A writer of the stopped plan that finished after the job stopped: a
    // checkpoint it completed now could expire the one the re-plan resumes
    // from (kept: spec.checkpoint.keep), so it counts for nothing.
    if (stopped) {
      PT_LOG(INFO) << "job " << r.job_id() << ": checkpoint of step " << r.checkpoint().step()
                   << " from " << r.worker_id() << " ignored: the job is "
                   << EnumShortName(record->job.state());
      response.set_all_ready(true);
      return response;
    }
    RETURN_IF_ERROR(AddCheckpointLocked(*record, stage_index, r.checkpoint()));
    response.set_all_ready(true);
    return response;
  }
  // The stopped plan's last words: its steps will be redone, or (being
  // re-planned at a boundary) it stopped after the boundary's step, or it
  // finished and its weights are being written.
  if (stopped) return response;
  if (!r.error().empty()) {
    // Errors name peers by stage; say which worker runs each stage.
    std::vector<std::string> stages;
    for (int s = 0; s < record->job.worker_ids_size(); ++s) {
      stages.push_back(absl::StrCat(s, "=", record->job.worker_ids(s)));
    }
    const std::string reason = absl::StrCat("worker ", r.worker_id(), ": ", r.error(),
                                            " [stages: ", absl::StrJoin(stages, ", "), "]");
    // A stage says its plan's resume point is unusable while it loads it,
    // before it reports ready (JobRunner). Only then is the claim taken,
    // and only that checkpoint dropped: said at any other time it is an
    // error like any other, so that one worker cannot drop a job's
    // checkpoints one after another.
    const v1::Assignment* assigned = stage_index < static_cast<int>(record->assignments.size())
                                         ? &record->assignments[stage_index]
                                         : nullptr;
    std::optional<v1::ResumeFrom> dropped;
    if (r.checkpoint_unusable() && record->checkpoints != nullptr && assigned != nullptr &&
        assigned->has_resume() && !record->stages[stage_index].ready) {
      dropped = record->checkpoints->Drop(assigned->resume().step());
    }
    if (dropped.has_value()) {
      record->job.mutable_progress()->set_checkpoint_step(
          record->checkpoints->Latest() != nullptr ? record->checkpoints->Latest()->step() : 0);
      StartRecoveryLocked(
          *record, "",
          absl::StrCat("checkpoint ", dropped->dir(), " could not be loaded (", reason, ")"),
          RecoveryKind::kCheckpointUnusable);
    } else if (r.peer_failure()) {
      StartRecoveryLocked(*record, "", reason, RecoveryKind::kPeerFailure);
    } else {
      EndLocked(*record, v1::JOB_STATE_FAILED, reason);
    }
    return response;
  }
  // Only a stage that runs the model's last unit forward computes a loss
  // (and a validation loss). One from any other is a fault or a lie, and
  // refused before anything of the report is applied: the job's loss is
  // taken from replica 0's loss stage alone.
  if ((r.micro_batch_losses_size() > 0 || r.has_val_loss()) &&
      !(stage_index < record->plan.stages_size() &&
        record->plan.stages(stage_index).forward().end() ==
            NumUnits(record->resolved.train.model))) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReportProgressRequest.", r.has_val_loss() ? "val_loss" : "micro_batch_losses",
                     ": ", r.worker_id(), "'s stage ", stage_index,
                     " does not run the model's last unit, so it computes no loss"));
  }
  // The tokens every stage trains on: the first digest a job hears is its
  // own (the first plan's stages are compared with each other here, before
  // any of them passes the start barrier); later plans' stages check theirs
  // against it themselves (Assignment.data_sha256), and here again.
  if (!r.data_sha256().empty() && r.data_sha256() != record->job.data_sha256()) {
    if (!record->job.data_sha256().empty()) {
      EndLocked(*record, v1::JOB_STATE_FAILED,
                absl::StrCat("worker ", r.worker_id(), " read other tokens from spec.data",
                             record->resolved.spec.data().path().empty()
                                 ? " (generated text)"
                                 : absl::StrCat(".path ", record->resolved.spec.data().path()),
                             " (SHA-256 ", r.data_sha256(), ") than the job trains on (",
                             record->job.data_sha256(),
                             ", Job.data_sha256): the file differs on that host, or was "
                             "changed or replaced since the job began"));
      return response;
    }
    record->job.set_data_sha256(r.data_sha256());
    PersistLocked(*record).IgnoreError();  // logged; saved again with the next change
  }
  StageProgress& stage = record->stages[stage_index];
  // The slowest stage's checkpoint load: sent with the start barrier, or
  // (a plan without one) with the first iteration's report.
  const double load = r.resume_load_seconds();
  if (std::isfinite(load) && load > 0 && load < 1e6 && record->job.plan_history_size() > 0) {
    v1::PlanVersion* v = record->job.mutable_plan_history(record->job.plan_history_size() - 1);
    v->set_resume_load_seconds(std::max(v->resume_load_seconds(), load));
  }
  if (r.ready()) {
    stage.ready = true;
    response.set_all_ready(std::all_of(record->stages.begin(), record->stages.end(),
                                       [](const StageProgress& s) { return s.ready; }));
    return response;
  }
  // A stage reports its iterations in order, each once: one already counted
  // is a retry whose answer was lost (JobRunner::ReportWithRetries), answered
  // as before but not applied again (its loss and times added twice).
  if (r.iteration() < stage.iterations_done) {
    PT_LOG(INFO) << "job " << r.job_id() << ": " << r.worker_id() << "'s report of iteration "
                 << r.iteration() << " came again; counted once";
    return response;
  }
  stage.iterations_done = r.iteration() + 1;
  counted->stage_time = true;
  if (r.has_trace()) AddTraceLocked(*record, stage_index, r.trace());
  if (stage_index < record->job.progress().stage_times_size()) {
    v1::StageTime* time = record->job.mutable_progress()->mutable_stage_times(stage_index);
    time->set_steps(time->steps() + 1);
    time->set_busy_seconds(time->busy_seconds() + r.busy_seconds());
    time->set_idle_seconds(time->idle_seconds() + r.idle_seconds());
  }
  stage.finished = stage.finished || r.finished();
  if (r.finished()) stage.weights_digest = r.weights_digest();
  if (r.micro_batch_losses_size() > 0 && speaks) {
    double sum = 0.0;  // as LocalTrainer: double sum, divided, as float
    for (float l : r.micro_batch_losses()) sum += l;
    const float loss = static_cast<float>(sum / r.micro_batch_losses_size());
    v1::JobProgress* p = record->job.mutable_progress();
    p->set_step(r.iteration() + 1);
    p->set_loss(loss);
    // As train-local: a diverged job stops here rather than train on NaNs.
    if (absl::Status finite = CheckLossFinite(r.iteration() + 1, loss); !finite.ok()) {
      EndLocked(*record, v1::JOB_STATE_FAILED, std::string(finite.message()));
      return response;
    }
    p->add_loss_history(loss);
    counted->step = true;
    if (p->loss_history_size() > kMaxLossHistory) {
      const int drop = p->loss_history_size() - kMaxLossHistory;
      p->mutable_loss_history()->erase(p->mutable_loss_history()->begin(),
                                       p->mutable_loss_history()->begin() + drop);
      p->set_loss_history_start(p->loss_history_start() + drop);
    }
    const absl::Time now = clock_->Now();
    // The step's wall time, less the validation pass the loss stage ran
    // after it (training throughput, not evaluation).
    const double seconds =
        absl::ToDoubleSeconds(now - record->last_step_time) - r.eval_seconds();
    const TrainConfig& t = record->resolved.train;
    // The first step of a resumed plan includes loading: not throughput.
    const bool first_after_recovery = record->recovering_since.has_value();
    if (seconds > 0 && !first_after_recovery) {
      p->set_tokens_per_second(double(t.batch_size) * t.seq_len / seconds);
    }
    record->last_step_time = now;
    if (now - record->last_persisted >= absl::Seconds(1)) PersistLocked(*record).IgnoreError();
    if (first_after_recovery) {
      const double total = absl::ToDoubleSeconds(now - *record->recovering_since);
      const double restart = absl::ToDoubleSeconds(now - record->replanned_at);
      if (events_.recovered) {
        events_.recovered(total, record->recovery_waiting_seconds,
                          record->recovery_planning_seconds, restart);
      }
      PT_LOG(INFO) << "job " << record->job.id() << " recovered in " << total << " s (waiting "
                   << record->recovery_waiting_seconds << " s, planning "
                   << record->recovery_planning_seconds << " s, load and first step " << restart
                   << " s)";
      record->recovering_since.reset();
    }
  }
  if (r.has_val_loss() && speaks) {
    // As the training loss: a NaN or infinite validation loss is a
    // diverged model, not a number to show.
    if (absl::Status finite = CheckLossFinite(r.iteration() + 1, r.val_loss()); !finite.ok()) {
      EndLocked(*record, v1::JOB_STATE_FAILED,
                absl::StrCat("the validation loss: ", finite.message()));
      return response;
    }
    v1::JobProgress* p = record->job.mutable_progress();
    p->set_val_loss(r.val_loss());
    p->set_val_step(r.iteration() + 1);
  }
  TouchLocked(*record);
  MaybeCompleteLocked(*record);
  // Last: a re-plan replaces the stages (and `stage`).
  MaybeReplanAtBoundaryLocked(*record);
  response.set_all_ready(true);
  return response;
}

absl::Status JobManager::AddWeightsChunk(const v1::WeightsChunk& c) {
  // A worker checks its weights before it uploads them (JobRunner), so a
  // NaN or infinity here is a fault or a lie: it must not reach the file
  // of a job that then says SUCCEEDED. Checked off the lock.
  for (int i = 0; i < c.values_size(); ++i) {
    if (!std::isfinite(c.values(i))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "WeightsChunk.values: ",
          absl::CHexEscape(absl::string_view(c.tensor_name()).substr(0, 128)), " holds ",
          c.values(i), " at element ", c.offset() + i, "; weights must be finite"));
    }
  }
  std::shared_ptr<SafetensorsFileWriter> file;
  size_t index = 0;
  {
    AnnotatedMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(JobRecord * record, ForWorkerLocked(c.worker_id(), c.job_id()));
    RETURN_IF_ERROR(CheckUploadingLocked(*record));
    if (c.tensor_name().empty()) {  // names the stream only (coordinator.proto)
      if (c.values_size() > 0) {
        return absl::InvalidArgumentError("a weights chunk with values must name its tensor");
      }
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(CheckWeightsChunkLocked(*record, c));
    // The model's shape, checked above: never a size the client chose.
    const int64_t numel = NumElements(record->weight_owner.at(c.tensor_name()).second);
    // Compared without a sum: offset + values_size could overflow (a chunk at
    // 2^63 - k would wrap below the tensor's start).
    if (c.offset() < 0 || c.offset() > numel || c.values_size() > numel - c.offset()) {
      return absl::InvalidArgumentError(absl::StrCat("chunk of ", c.tensor_name(), " at ",
                                                     c.offset(), " + ", c.values_size(),
                                                     " exceeds its ", numel, " elements"));
    }
    // The job asks for no file: checked, and nothing kept.
    if (record->resolved.spec.output().weights_path().empty()) return absl::OkStatus();
    // A stage sends each tensor's chunks in order (one run); chunks
    // scattered with gaps would each keep a run in memory (numel / 2 of
    // them for a worker sending every other value).
    if (auto covered = record->weights_covered.find(c.tensor_name());
        covered != record->weights_covered.end() && covered->second.runs() >= kMaxWeightsRuns &&
        !covered->second.Touches(c.offset(), c.offset() + c.values_size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunks of ", c.tensor_name(), " arrive scattered over more than ",
                       kMaxWeightsRuns, " separate ranges; send a tensor's chunks in order"));
    }
    absl::Status opened =
        record->weights_file == nullptr ? OpenWeightsFileLocked(*record) : absl::OkStatus();
    if (!opened.ok()) {
      EndLocked(*record, v1::JOB_STATE_FAILED,
                absl::StrCat("cannot write the final weights: ", opened.message()));
      return opened;
    }
    file = record->weights_file;
    index = record->weights_index.at(c.tensor_name());
  }
  // Straight to the file, outside the lock (a slow disk holds up this
  // upload only): the coordinator keeps none of the weights in memory.
  const absl::Status written = file->Write(index, c.offset(), c.values().data(), c.values_size());
  AnnotatedMutexLock lock(&mu_);
  JobRecord* record = FindLocked(c.job_id());
  // The job moved on meanwhile (ended, re-planned): nothing to record.
  if (record == nullptr || record->weights_file != file) return written;
  if (!written.ok()) {
    // A disk that fails (or fills) fails the job now, saying why.
    EndLocked(*record, v1::JOB_STATE_FAILED,
              absl::StrCat("cannot write the final weights: ", written.message()));
    return written;
  }
  record->weights_covered[c.tensor_name()].Add(c.offset(), c.offset() + c.values_size());
  return absl::OkStatus();
}

int JobManager::Replicas(const JobRecord& record) {
  return std::max(1, record.resolved.data_parallel);
}

int JobManager::TensorRanks(const JobRecord& record) {
  return std::max(1, record.resolved.tensor_parallel);
}

int JobManager::WorkersPerStage(const JobRecord& record) {
  return Replicas(record) * TensorRanks(record);
}

int JobManager::StagesPerReplica(const JobRecord& record) {
  return record.plan.stages_size() / std::max(1, record.plan.data_parallel());
}

bool JobManager::SearchesTensorRanks(const JobRecord& record) {
  return record.auto_layout_workers > 0 && record.auto_layout_parallelism.has_tensor() &&
         record.auto_layout_parallelism.tensor() == kTensorParallelAuto;
}

v1::JobSpec JobManager::AutoLayoutSpec(const JobRecord& record) {
  v1::JobSpec spec = record.resolved.spec;
  if (record.auto_layout_parallelism.has_tensor()) {
    v1::ParallelismSpec* p = spec.mutable_parallelism();
    const v1::ParallelismSpec& submitted = record.auto_layout_parallelism;
    p->set_tensor(submitted.tensor());
    p->set_tensor_mode(submitted.tensor_mode());
  }
  return spec;
}

int JobManager::MinJobWorkers(const JobRecord& record) {
  if (SearchesTensorRanks(record)) {
    const v1::JobSpec spec = AutoLayoutSpec(record);
    for (int n = 1; n < record.auto_layout_workers; ++n) {
      if (!AutoLayoutDegrees(spec, n).empty()) return n;
    }
    return record.auto_layout_workers;
  }
  if (record.auto_layout_workers > 0) return TensorRanks(record);  // one stage
  return record.resolved.spec.elastic().min_workers() * WorkersPerStage(record);
}

int JobManager::MaxJobWorkers(const JobRecord& record) {
  if (record.auto_layout_workers > 0) return record.auto_layout_workers;
  return record.resolved.spec.elastic().max_workers() * WorkersPerStage(record);
}

int JobManager::WorkerStep(const JobRecord& record) {
  // An auto layout re-chooses its replicas, but every stage keeps its ranks
  // unless it chooses them too.
  if (SearchesTensorRanks(record)) return 1;
  return record.auto_layout_workers > 0 ? TensorRanks(record) : WorkersPerStage(record);
}

int JobManager::UsableWorkers(const JobRecord& record, int workers) {
  if (record.auto_layout_workers == 0) return workers - workers % WorkersPerStage(record);
  const v1::JobSpec spec = AutoLayoutSpec(record);
  const int step = WorkerStep(record);
  int usable = workers - workers % step;
  while (usable > 0 && AutoLayoutDegrees(spec, usable).empty()) usable -= step;
  return usable;
}

void JobManager::KeepWholeReplicas(const JobRecord& record, std::vector<std::string>* workers) {
  workers->resize(UsableWorkers(record, static_cast<int>(workers->size())));
}

void JobManager::RecordWeightOwners(JobRecord& record, int stage) {
  // Replica 0's tensor rank 0 uploads its stage's gathered weights.
  if (stage >= StagesPerReplica(record) || stage % TensorRanks(record) != 0) return;
  const v1::UnitRange& units = record.plan.stages(stage).backward();
  for (int u = units.begin(); u < units.end(); ++u) {
    for (ParameterShape& p : UnitParameterShapes(record.resolved.train.model, u)) {
      if (p.name == kTiedEmbeddingName) record.tied_embedding_stages.insert(stage);
      record.weight_owner.try_emplace(p.name, stage, Shape(p.shape.begin(), p.shape.end()));
    }
  }
}

absl::Status JobManager::CheckProgressBounds(const v1::ReportProgressRequest& r,
                                            const JobRecord& record) {
  const int micro_batches = record.resolved.train.micro_batches;
  if (r.micro_batch_losses_size() > micro_batches) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReportProgressRequest.micro_batch_losses: ", r.micro_batch_losses_size(),
                     " losses for a job of ", micro_batches, " micro-batches"));
  }
  if (r.iteration() < 0 || r.iteration() >= record.resolved.train.steps) {
    return absl::InvalidArgumentError(absl::StrCat("ReportProgressRequest.iteration: ",
                                                   r.iteration(), " is outside the job's [0, ",
                                                   record.resolved.train.steps, ")"));
  }
  for (const auto& [field, seconds] :
       {std::pair<const char*, double>{"busy_seconds", r.busy_seconds()},
        std::pair<const char*, double>{"idle_seconds", r.idle_seconds()},
        std::pair<const char*, double>{"eval_seconds", r.eval_seconds()}}) {
    if (!(seconds >= 0 && seconds <= kMaxReportedStepSeconds)) {
      return absl::InvalidArgumentError(absl::StrCat("ReportProgressRequest.", field, ": ",
                                                     seconds, " is outside [0, ",
                                                     kMaxReportedStepSeconds, "]"));
    }
  }
  if (r.weights_digest().size() > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReportProgressRequest.weights_digest: ", r.weights_digest().size(),
                     " bytes exceeds the limit of 64"));
  }
  // Shown to users (Job.data_sha256) and compared byte for byte.
  if (!r.data_sha256().empty() &&
      (r.data_sha256().size() != 64 ||
       !std::all_of(r.data_sha256().begin(), r.data_sha256().end(),
                    [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }))) {
    return absl::InvalidArgumentError(
        "ReportProgressRequest.data_sha256: not 64 lowercase hex digits");
  }
  if (r.error().size() > kMaxReportedErrorBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReportProgressRequest.error: ", r.error().size(),
                     " bytes exceeds the limit of ", kMaxReportedErrorBytes));
  }
  if (r.checkpoint().error().size() > kMaxReportedErrorBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReportProgressRequest.checkpoint.error: ", r.checkpoint().error().size(),
                     " bytes exceeds the limit of ", kMaxReportedErrorBytes));
  }
  return absl::OkStatus();
}

absl::Status JobManager::CheckWeightsChunkLocked(const JobRecord& record,
                                                 const v1::WeightsChunk& c) const {
  auto owner = record.weight_owner.find(c.tensor_name());
  if (owner == record.weight_owner.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("UploadWeights: job ", record.job.id(), " has no tensor \"",
                     absl::CHexEscape(absl::string_view(c.tensor_name()).substr(0, 128)), "\""));
  }
  const int stage = record.stage_of.at(c.worker_id());
  const auto& [owning_stage, shape] = owner->second;
  // The tied wte.weight belongs to the embedding's and the head's stages.
  const bool owned = owning_stage == stage || (c.tensor_name() == kTiedEmbeddingName &&
                                               record.tied_embedding_stages.count(stage) > 0);
  if (!owned) {
    return absl::PermissionDeniedError(absl::StrCat("UploadWeights: ", c.tensor_name(),
                                                    " belongs to stage ", owning_stage, ", not to ",
                                                    c.worker_id(), "'s stage ", stage));
  }
  if (!std::equal(c.shape().begin(), c.shape().end(), shape.begin(), shape.end())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UploadWeights: ", c.tensor_name(), " has shape [", absl::StrJoin(shape, ", "),
        "] in this model; the chunk says [",
        absl::StrJoin(c.shape().begin(), c.shape().begin() + std::min(c.shape_size(), 8), ", "),
        c.shape_size() > 8 ? ", ..." : "", "]"));
  }
  return absl::OkStatus();
}

void JobManager::StopWorkerLocked(const JobRecord& record, const std::string& worker) {
  // The hub keeps one assignment per worker: a STOP of this job must not
  // replace the RUN of another job that has taken the worker since (a
  // boundary left it out, or it came back in a new incarnation).
  const absl::StatusOr<v1::Worker> now = registry_->Get(worker);
  if (now.ok() && !now->job_id().empty() && now->job_id() != record.job.id()) return;
  hub_->Set(worker, StopAssignment(record.job.id(), record.plan.version()));
}

absl::Status JobManager::CheckUploadingLocked(const JobRecord& record) const {
  if (record.job.state() == v1::JOB_STATE_RUNNING) return absl::OkStatus();
  // A stopped plan's stage still uploading: the job's next plan trains on
  // and uploads the weights; these would open a file (and complete it) for
  // a job that is not running.
  return absl::FailedPreconditionError(
      absl::StrCat("job ", record.job.id(), " is ", EnumShortName(record.job.state()),
                   "; its weights are uploaded by the stages of its next plan"));
}

absl::Status JobManager::FinishWeights(const std::string& worker_id, const std::string& job_id) {
  AnnotatedMutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobRecord * record, ForWorkerLocked(worker_id, job_id));
  RETURN_IF_ERROR(CheckUploadingLocked(*record));
  record->stages[record->stage_of.at(worker_id)].weights_done = true;
  MaybeCompleteLocked(*record);
  return absl::OkStatus();
}

bool JobManager::StageDone(const JobRecord& record, size_t g) {
  const StageProgress& s = record.stages[g];
  if (!s.finished) return false;
  // Only replica 0's stages upload, tensor rank 0 of each (RecordWeightOwners).
  const bool uploads =
      static_cast<int>(g) < StagesPerReplica(record) && g % TensorRanks(record) == 0;
  return !uploads || s.weights_done || record.resolved.spec.output().weights_path().empty();
}

void JobManager::MaybeCompleteLocked(JobRecord& record) {
  if (record.writing_weights) return;  // complete already; the file is being written
  const bool want_weights = !record.resolved.spec.output().weights_path().empty();
  const int uploading = StagesPerReplica(record);
  for (size_t g = 0; g < record.stages.size(); ++g) {
    if (!StageDone(record, g)) return;
  }
  // Replicas must end bitwise identical: each stage's copies agree.
  for (size_t g = uploading; g < record.stages.size(); ++g) {
    const std::string& mine = record.stages[g].weights_digest;
    const std::string& zero = record.stages[g % uploading].weights_digest;
    if (mine.empty() || mine != zero) {
      return EndLocked(
          record, v1::JOB_STATE_FAILED,
          absl::StrCat("data-parallel replicas diverged: stage ", g % uploading, " of replica ",
                       g / uploading, " (", record.job.worker_ids(g), ") ends with weights ",
                       mine.empty() ? "unreported" : mine.substr(0, 12), ", replica 0's (",
                       record.job.worker_ids(g % uploading), ") with ", zero.substr(0, 12)));
    }
  }
  if (want_weights) {
    int64_t total = 0;
    if (record.weights_file != nullptr) {
      for (const SafetensorsTensorSpec& t : record.weights_file->tensors()) {
        const int64_t numel = NumElements(t.shape);
        if (record.weights_covered[t.name].covered() < numel) {
          return EndLocked(
              record, v1::JOB_STATE_FAILED,
              absl::StrCat("incomplete upload of ", t.name, ": ",
                           record.weights_covered[t.name].covered(), " of ", numel, " values"));
        }
        total += numel;
      }
    }
    const int64_t expected = CountParameters(record.resolved.train.model);
    if (total != expected) {
      return EndLocked(
          record, v1::JOB_STATE_FAILED,
          absl::StrCat("uploaded weights hold ", total, " values; the model has ", expected));
    }
    const std::string name = record.resolved.spec.output().weights_path();
    const std::string path = absl::StrCat(options_.output_dir, "/", name);
    if (stopping_) {  // no background work starts now: committed here
      absl::Status committed = record.weights_file->Commit();
      if (!committed.ok()) {
        return EndLocked(record, v1::JOB_STATE_FAILED, std::string(committed.message()));
      }
      record.job.set_weights_path(path);
      return EndLocked(record, v1::JOB_STATE_SUCCEEDED, "");
    }
    // Synced off the lock (GPT-2 124M is 0.5 GB to sync): the job stays
    // RUNNING until the file is in (FinishWritingWeights renames it).
    record.writing_weights = true;
    record.job.set_reason(absl::StrCat("every stage finished; writing the weights to ", name));
    TouchLocked(record);
    std::shared_ptr<SafetensorsFileWriter> file = record.weights_file;
    DropWeightsFile(record);
    return RunInBackgroundLocked([this, id = record.job.id(), path, file] {
      FinishWritingWeights(id, path, *file, file->Sync());
    });
  }
  EndLocked(record, v1::JOB_STATE_SUCCEEDED, "");
}

absl::Status JobManager::OpenWeightsFileLocked(JobRecord& record) {
  const std::string& name = record.resolved.spec.output().weights_path();
  // Walked again now (links may have appeared since submit); missing
  // directories under the output directory are created.
  ASSIGN_OR_RETURN(ConfinedParent parent, OpenConfinedParent(options_.output_dir, kOutputDirFlag,
                                                             "spec.output.weights_path", name,
                                                             /*create_dirs=*/true));
  std::vector<SafetensorsTensorSpec> tensors;
  std::map<std::string, size_t> index;
  const GptConfig& model = record.resolved.train.model;
  for (int u = 0; u < NumUnits(model); ++u) {
    for (const ParameterShape& p : UnitParameterShapes(model, u)) {
      if (record.weight_owner.count(p.name) == 0 || index.count(p.name) > 0) continue;
      index[p.name] = tensors.size();
      tensors.push_back({p.name, p.shape});
    }
  }
  RemoveAbandonedWeightTemporaries(parent.dir.get(), parent.name, record.job.id());
  absl::StatusOr<std::unique_ptr<SafetensorsFileWriter>> writer =
      SafetensorsFileWriter::Create(parent.dir.get(), parent.name, std::move(tensors), 0600);
  if (!writer.ok()) {
    // The writer names the file alone; say where it is (a full disk is
    // the output directory's).
    return absl::Status(writer.status().code(),
                        absl::StrCat("spec.output.weights_path ", name, " under ", kOutputDirFlag,
                                     " ", options_.output_dir, ": ", writer.status().message()));
  }
  record.weights_file = *std::move(writer);
  record.weights_index = std::move(index);
  return absl::OkStatus();
}

void JobManager::RemoveAbandonedWeightsOf(const JobRecord& record) const {
  const std::string& weights = record.resolved.spec.output().weights_path();
  if (weights.empty() || options_.output_dir.empty()) return;
  absl::StatusOr<ConfinedParent> parent =
      OpenConfinedParent(options_.output_dir, kOutputDirFlag, "spec.output.weights_path", weights,
                         /*create_dirs=*/false);
  if (parent.ok() && parent->dir.get() >= 0) {
    RemoveAbandonedWeightTemporaries(parent->dir.get(), parent->name, record.job.id());
  }
}

void JobManager::DropWeightsFile(JobRecord& record) {
  record.weights_file.reset();
  record.weights_index.clear();
  record.weights_covered.clear();
}

void JobManager::FinishWritingWeights(const std::string& job_id, const std::string& path,
                                      SafetensorsFileWriter& file, const absl::Status& synced) {
  AnnotatedMutexLock lock(&mu_);
  --background_in_flight_;
  JobRecord* record = FindLocked(job_id);
  if (record == nullptr || IsTerminal(record->job.state())) {
    // Cancelled while it was synced: the file is not renamed in (a file
    // already under the name stays), and the temporary goes with `file`.
    PT_LOG(INFO) << "job " << job_id << " ended while its weights were written; " << path
                 << " is left as it was";
    return;
  }
  record->writing_weights = false;
  // The rename under the lock, so a cancel comes before it (and the file is
  // not renamed) or after it (the job has SUCCEEDED).
  const absl::Status committed = synced.ok() ? file.Commit() : synced;
  if (!committed.ok()) {
    return EndLocked(*record, v1::JOB_STATE_FAILED, std::string(committed.message()));
  }
  record->job.set_weights_path(path);
  EndLocked(*record, v1::JOB_STATE_SUCCEEDED, "");
}

void JobManager::RunInBackgroundLocked(std::function<void()> task) {
  ++background_in_flight_;
  if (options_.background_runner) {
    options_.background_runner(std::move(task));
  } else {
    background_->Post(std::move(task));
  }
}

void JobManager::PruneLocked() {
  const absl::Time oldest_kept = clock_->Now() - options_.ended_job_retention;
  // The ended jobs, the latest to end first (an ended job's update_time is
  // its end), ties the later submitted first. By end, not by submission: a
  // long job submitted before many short ones was pruned the moment it
  // ended, its outcome lost to the user following it.
  std::vector<std::pair<absl::Time, size_t>> ended;  // (ended at, index in order_)
  for (size_t i = 0; i < order_.size(); ++i) {
    const v1::Job& job = jobs_.at(order_[i])->job;
    if (IsTerminal(job.state())) ended.emplace_back(FromProtoTimestamp(job.update_time()), i);
  }
  std::sort(ended.begin(), ended.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second > b.second;
  });
  std::vector<bool> prune(order_.size(), false);
  int planned_with_detail = 0;
  for (size_t rank = 0; rank < ended.size(); ++rank) {
    const auto& [ended_at, index] = ended[rank];
    if (rank >= static_cast<size_t>(std::max(0, options_.max_ended_jobs)) ||
        ended_at < oldest_kept) {
      prune[index] = true;
      continue;
    }
    // Only a planned job has drawings: one cancelled while queued takes no
    // place from those that have.
    JobRecord& record = *jobs_.at(order_[index]);
    if (record.plan.version() == 0) continue;
    if (++planned_with_detail > options_.max_ended_jobs_with_drawings) {
      DropEndedJobDetail(record);
    }
  }
  std::vector<std::string> kept;
  for (size_t i = 0; i < order_.size(); ++i) {
    const std::string& id = order_[i];
    if (!prune[i]) {
      kept.push_back(id);
      continue;
    }
    if (options_.state != nullptr) {
      io_.Post([state = options_.state, id] {
        absl::Status deleted = state->DeleteJob(id);
        if (!deleted.ok()) PT_LOG(WARNING) << "job " << id << ": " << deleted;
      });
    }
    jobs_.erase(id);
  }
  order_ = std::move(kept);
  // Workers the registry has evicted (an address not seen for long: a
  // restarted pod comes back on another one, under another id) leave no
  // assignment or drain mark behind.
  auto evicted = [this](const std::string& worker_id) {
    return registry_->Get(worker_id).status().code() == absl::StatusCode::kNotFound;
  };
  hub_->Forget(evicted);
  for (auto it = drained_.begin(); it != drained_.end();) {
    it = evicted(it->first) ? drained_.erase(it) : std::next(it);
  }
}

void JobManager::OnWorkerLost(const std::string& worker_id, const std::string& job_id,
                              const std::string& reason, int64_t incarnation) {
  AnnotatedMutexLock lock(&mu_);
  JobRecord* record = FindLocked(job_id);
  if (record == nullptr || IsTerminal(record->job.state())) return;
  // Its workers are done: the job only waits for its weights file.
  if (record->writing_weights) return;
  if (record->job.state() == v1::JOB_STATE_PLANNING) {
    // Only the workers of the placement being planned are the job's now
    // (a boundary's left-out workers were stopped and released).
    const std::vector<std::string>* planned =
        record->pending.has_value() ? &record->pending->workers : nullptr;
    if (planned == nullptr ||
        std::find(planned->begin(), planned->end(), worker_id) == planned->end()) {
      return;
    }
    return AbandonPlacementLocked(*record, worker_id, reason, incarnation);
  }
  // Only a worker of the job's current plan matters.
  if (record->stage_of.count(worker_id) == 0 && record->job.state() != v1::JOB_STATE_RECOVERING)
    return;
  // One whose stage has done all its part (every step, its digest and its
  // upload) is not needed while the others finish: a worker stopped, or
  // scaled away, as its job ends. A peer it still owed data would say so
  // (a peer failure).
  if (record->job.state() == v1::JOB_STATE_RUNNING &&
      StageDone(*record, static_cast<size_t>(record->stage_of.at(worker_id)))) {
    PT_LOG(INFO) << "job " << job_id << ": " << worker_id << " went after its stage finished ("
                 << reason << "); the other stages go on";
    return;
  }
  StartRecoveryLocked(*record, worker_id, reason, RecoveryKind::kWorkerLost, incarnation);
}

void JobManager::FlushIo() {
  // An AnnotatedMutex, not an absl::Notification: TSan must see that what
  // the io_ tasks wrote (a save's status) happens before the caller reads
  // it (common/annotated_mutex.h).
  // Shared: the io_ thread may still be leaving the mutex when this
  // thread returns.
  struct Done {
    AnnotatedMutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
  };
  auto flushed = std::make_shared<Done>();
  io_.Post([flushed] {
    AnnotatedMutexLock lock(&flushed->mu);
    flushed->done = true;
  });
  AnnotatedMutexLock lock(&flushed->mu);
  flushed->mu.AwaitWithTimeout(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(flushed->mu) { return flushed->done; },
      absl::InfiniteDuration());
}

std::map<v1::JobState, int> JobManager::CountByState() const {
  AnnotatedMutexLock lock(&mu_);
  std::map<v1::JobState, int> counts;
  for (const auto& [id, record] : jobs_) counts[record->job.state()]++;
  return counts;
}

}  // namespace pipetrain
