#include "coordinator/jobs/job_manager.h"

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/confined_path.h"
#include "common/logging.h"
#include "common/secrets.h"
#include "common/status_macros.h"
#include "coordinator/planner/device_links.h"
#include "coordinator/planner/planner.h"
#include "coordinator/planner/solve_plan.h"
#include "worker/model/gpt_config.h"

namespace pipetrain {
namespace {

absl::Time FromTimestamp(const google::protobuf::Timestamp& t) {
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

void SetTimestamp(absl::Time t, google::protobuf::Timestamp* out) {
  const int64_t nanos = absl::ToUnixNanos(t);
  out->set_seconds(nanos / 1000000000);
  out->set_nanos(static_cast<int32_t>(nanos % 1000000000));
}

// A worker's error text becomes the job's reason, which every GetJob returns.
constexpr size_t kMaxReportedErrorBytes = 16384;

// The token embedding, which the head ties to (its stage holds a copy).
constexpr char kTiedEmbeddingName[] = "wte.weight";

v1::Assignment StopAssignment(const std::string& job_id, int64_t version) {
  v1::Assignment a;
  a.set_action(v1::Assignment::STOP);
  a.set_job_id(job_id);
  a.set_plan_version(version);
  return a;
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

// Uses up each group's id (it must reach one group only; the worker reports
// a fresh one once its assignment carries it) and logs the groups and the
// links that stayed on the wire for their order.
void ConsumeDeviceGroupIds(const std::string& job_id, const DeviceLinkPlan& links,
                           const std::vector<v1::Worker>& workers, WorkerRegistry* registry) {
  for (const DeviceLinkGroup& g : links.groups) {
    const v1::Worker& owner = workers[g.id_owner_stage];
    if (!registry->ConsumeNcclUniqueId(owner.id(), g.group.nccl_unique_id())) {
      PT_LOG(WARNING) << "job " << job_id << ": " << owner.id()
                      << " replaced its NCCL id while the job was planned; the group uses the "
                         "one it had";
    }
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

}  // namespace

bool IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

JobManager::JobManager(WorkerRegistry* registry, AssignmentHub* hub, Clock* clock,
                       JobManagerOptions options)
    : registry_(registry), hub_(hub), clock_(clock), options_(std::move(options)) {}

JobManager::~JobManager() {
  {
    AnnotatedMutexLock lock(&mu_);
    stopping_ = true;
  }
  if (loop_.joinable()) loop_.join();
  AwaitProfiling();
}

void JobManager::AwaitProfiling() {
  std::vector<std::thread> profilers;
  {
    AnnotatedMutexLock lock(&mu_);
    profilers.swap(profilers_);
  }
  for (std::thread& t : profilers) t.join();
}

void JobManager::SetProfileFetcher(ProfileFetcher fetcher) { fetcher_ = std::move(fetcher); }

v1::ProfileRequest JobManager::ProfileRequestFor(const JobRecord& record) const {
  v1::ProfileRequest request;
  *request.mutable_model() = record.resolved.spec.model();
  request.set_seq_len(record.resolved.train.seq_len);
  request.set_micro_batch_size(record.resolved.train.batch_size / record.resolved.train.micro_batches);
  request.set_seed(record.resolved.train.seed);
  return request;
}

bool JobManager::ChooseProfileLocked(JobRecord& record, const std::vector<v1::Worker>& workers,
                                     ModelProfile* profile, std::string* source,
                                     double* reference_gflops) {
  const v1::ProfileRequest request = ProfileRequestFor(record);
  const std::string kind = DeviceKind(workers[0].device());
  const std::string key = ProfileKey(request, kind);
  if (std::optional<v1::ModelProfile> cached = profiles_.Get(key)) {
    *profile = FromProto(*cached);
    *source = absl::StrCat("measured on ", kind, " by ", workers[0].id(), " (cached)");
    *reference_gflops = workers[0].device().measured_gflops();
    return true;
  }
  const std::string& solver = record.resolved.solver;
  const bool wants_measured = solver == kSolverBiPartition || solver == kSolverAuto;
  if (wants_measured && fetcher_ && record.profile_error.empty()) {
    record.job.set_state(v1::PROFILING);
    record.job.set_reason(absl::StrCat("profiling the model on ", workers[0].id()));
    TouchLocked(record);
    PT_LOG(INFO) << "job " << record.job.id() << ": profiling on " << workers[0].id();
    profilers_.emplace_back(
        [this, id = record.job.id(), key, address = workers[0].data_address(),
         session = registry_->SessionToken(workers[0].id()).value_or(""),
         request] { FinishProfiling(id, key, fetcher_(address, session, request)); });
    return false;
  }
  double fastest = 0;
  for (const v1::Worker& w : workers) fastest = std::max(fastest, w.device().measured_gflops());
  const double rate = fastest > 0 ? fastest * 1e9 : 1e11;
  const TrainConfig& t = record.resolved.train;
  *profile = AnalyticProfile(t.model, t.seq_len, t.batch_size / t.micro_batches, rate);
  *source = absl::StrCat("analytic: FLOPs at ", rate / 1e9, " GFLOP/s",
                         record.profile_error.empty()
                             ? ""
                             : absl::StrCat(" (profiling failed: ", record.profile_error, ")"));
  *reference_gflops = fastest;
  return true;
}

void JobManager::FinishProfiling(const std::string& job_id, const std::string& key,
                                 const absl::StatusOr<v1::ModelProfile>& profile) {
  {
    AnnotatedMutexLock lock(&mu_);
    JobRecord* record = FindLocked(job_id);
    if (profile.ok()) {
      profiles_.Put(key, *profile);
    } else if (record != nullptr) {
      record->profile_error = profile.status().ToString();
      PT_LOG(WARNING) << "job " << job_id << ": profiling failed: " << profile.status();
    }
    if (record != nullptr && record->job.state() == v1::PROFILING) {
      record->job.set_state(v1::QUEUED);
      record->job.set_reason("profiled; waiting to be planned");
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

void JobManager::TouchLocked(JobRecord& record) {
  SetTimestamp(clock_->Now(), record.job.mutable_update_time());
}

absl::Status JobManager::CheckPaths(const ResolvedJobSpec& resolved) const {
  const std::string& weights = resolved.spec.output().weights_path();
  if (!weights.empty()) {
    if (options_.output_dir.empty()) {
      return absl::InvalidArgumentError(
          "spec.output.weights_path: this coordinator writes no files (it was started without "
          "--output-dir); leave the field empty or ask the operator");
    }
    RETURN_IF_ERROR(OpenConfinedParent(options_.output_dir, "spec.output.weights_path", weights,
                                       /*create_dirs=*/false)
                        .status());
  }
  const std::string& data = resolved.spec.data().path();
  if (!data.empty() && !options_.data_roots.empty()) {
    RETURN_IF_ERROR(ResolveUnderRoots("spec.data.path", data, options_.data_roots).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> JobManager::Submit(const v1::JobSpec& spec) {
  ASSIGN_OR_RETURN(ResolvedJobSpec resolved, ResolveJobSpec(spec));
  RETURN_IF_ERROR(CheckPlanningBudget(resolved));
  RETURN_IF_ERROR(CheckPaths(resolved));
  v1::Job job;
  {
    AnnotatedMutexLock lock(&mu_);
    int pending = 0;
    for (const auto& [id, other] : jobs_) pending += IsTerminal(other->job.state()) ? 0 : 1;
    if (pending >= options_.max_pending_jobs) {
      return absl::ResourceExhaustedError(
          absl::StrCat(pending,
                       " jobs are already queued or running (the coordinator's limit); wait for "
                       "some to end or cancel them"));
    }
    PruneLocked();
    auto record = std::make_unique<JobRecord>();
    record->job.set_id(options_.id_epoch.empty()
                           ? absl::StrCat("job-", next_id_++)
                           : absl::StrCat("job-", options_.id_epoch, "-", next_id_++));
    *record->job.mutable_spec() = resolved.spec;
    record->job.set_state(v1::QUEUED);
    record->job.set_reason(absl::StrCat("waiting for ", resolved.stages, " READY workers"));
    SetTimestamp(clock_->Now(), record->job.mutable_create_time());
    TouchLocked(*record);
    record->resolved = std::move(resolved);
    job = record->job;
    order_.push_back(job.id());
    jobs_[job.id()] = std::move(record);
  }
  ScheduleQueued();
  return Get(job.id());
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
  for (const std::string& id : order_) {
    out.push_back(jobs_.at(id)->job);
    out.back().mutable_progress()->clear_loss_history();
  }
  return out;
}

absl::StatusOr<v1::Job> JobManager::Cancel(const std::string& job_id) {
  AnnotatedMutexLock lock(&mu_);
  JobRecord* record = FindLocked(job_id);
  if (record == nullptr) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  if (IsTerminal(record->job.state())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " already ended (", v1::JobState_Name(record->job.state()), ")"));
  }
  EndLocked(*record, v1::CANCELLED, "cancelled by the user");
  return record->job;
}

absl::StatusOr<v1::Plan> JobManager::GetPlan(const std::string& job_id) const {
  AnnotatedMutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  if (it->second->plan.version() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " has no plan yet (", v1::JobState_Name(it->second->job.state()), ")"));
  }
  return it->second->plan;
}

void JobManager::ScheduleQueued() {
  AnnotatedMutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  for (const std::string& id : order_) {
    JobRecord& record = *jobs_.at(id);
    // A job being profiled is being placed: the worker it profiles on stays
    // READY meanwhile, so later jobs wait rather than take it.
    if (record.job.state() == v1::PROFILING) return;
    if (record.job.state() != v1::QUEUED) continue;
    std::vector<std::string> ready = registry_->ReadyWorkers();
    const int need = record.resolved.stages;
    if (static_cast<int>(ready.size()) < need) {
      const std::string waiting =
          absl::StrCat("waiting for ", need, " READY workers (", ready.size(), " ready)");
      const absl::Duration waited = now - FromTimestamp(record.job.create_time());
      if (waited > record.resolved.queue_timeout) {
        EndLocked(record, v1::FAILED,
                  absl::StrCat("not placed within spec.scheduling.queue_timeout (",
                               absl::FormatDuration(record.resolved.queue_timeout), "): ", waiting,
                               "; add workers or ask for fewer stages"));
        continue;
      }
      record.job.set_reason(waiting);
      continue;  // later jobs that fit the READY workers go first (backfill)
    }
    ready.resize(need);
    absl::Status started = StartLocked(record, ready);
    if (!started.ok()) EndLocked(record, v1::FAILED, std::string(started.message()));
    if (record.job.state() == v1::PROFILING) return;  // later jobs wait for it
  }
}

absl::Status JobManager::StartLocked(JobRecord& record, const std::vector<std::string>& workers) {
  const std::string& id = record.job.id();
  std::vector<std::string> addresses;
  std::vector<v1::Worker> infos;
  for (const std::string& w : workers) {
    ASSIGN_OR_RETURN(v1::Worker worker, registry_->Get(w));
    addresses.push_back(worker.data_address());
    infos.push_back(worker);
  }
  ModelProfile profile;
  std::string source;
  double reference_gflops = 0;
  if (!ChooseProfileLocked(record, infos, &profile, &source, &reference_gflops)) {
    return absl::OkStatus();  // PROFILING; planned when the profile arrives
  }
  record.job.set_state(v1::PLANNING);
  ClusterSpec cluster;
  for (const v1::Worker& w : infos) {
    const double gflops = w.device().measured_gflops();
    const double speed = gflops > 0 && reference_gflops > 0 ? gflops / reference_gflops : 1.0;
    // What the worker may use (its cgroup or --memory-limit), not the
    // host's RAM; GPU workers hold the model in device memory.
    const int64_t host = w.device().memory_limit_bytes() > 0 ? w.device().memory_limit_bytes()
                                                             : w.device().memory_bytes();
    const double memory = w.device().gpu_model().empty() ? host : w.device().gpu_memory_bytes();
    cluster.workers.push_back({w.id(), speed, static_cast<double>(memory)});
  }
  cluster.bandwidth_bytes_per_second = kAssumedBandwidth;
  cluster.latency_seconds = kAssumedLatency;
  ASSIGN_OR_RETURN(CompiledPlan compiled, PlanJob(record.resolved, id, 1, profile, cluster, source));
  const DeviceLinkPlan links =
      PlanDeviceLinks(DeviceLinkMembers(infos, *registry_), &compiled.programs);
  RETURN_IF_ERROR(registry_->Assign(workers, id));
  ConsumeDeviceGroupIds(id, links, infos, registry_);
  record.plan = compiled.plan;
  record.stages.assign(workers.size(), StageProgress{});
  // Only this plan's workers learn it: their streams prove it to each other.
  const std::string data_plane_secret = RandomToken();
  for (size_t s = 0; s < workers.size(); ++s) {
    v1::Assignment a;
    a.set_action(v1::Assignment::RUN);
    a.set_job_id(id);
    a.set_plan_version(record.plan.version());
    *a.mutable_spec() = record.resolved.spec;
    a.set_stage(static_cast<int>(s));
    a.set_num_stages(static_cast<int>(workers.size()));
    a.set_data_plane_secret(data_plane_secret);
    *a.mutable_forward_units() = record.plan.stages(s).forward();
    *a.mutable_backward_units() = record.plan.stages(s).backward();
    for (const std::string& address : addresses) a.add_peer_addresses(address);
    *a.mutable_program() = compiled.programs[s];
    if (!compiled.eval_programs.empty()) *a.mutable_eval_program() = compiled.eval_programs[s];
    if (links.group_of_stage[s] >= 0) {
      *a.mutable_device_group() = links.groups[links.group_of_stage[s]].group;
    }
    record.stage_of[workers[s]] = static_cast<int>(s);
    RecordWeightOwners(record, static_cast<int>(s));
    record.job.add_worker_ids(workers[s]);
    record.assignments.push_back(a);
    hub_->Set(workers[s], std::move(a));
  }
  record.job.set_state(v1::RUNNING);
  record.job.set_plan_version(record.plan.version());
  record.job.set_reason("");
  record.last_step_time = clock_->Now();
  TouchLocked(record);
  PT_LOG(INFO) << "job " << id << " running on " << absl::StrJoin(workers, ", ");
  return absl::OkStatus();
}

void JobManager::EndLocked(JobRecord& record, v1::JobState state, const std::string& reason) {
  record.job.set_state(state);
  record.job.set_reason(reason);
  TouchLocked(record);
  for (const std::string& worker : record.job.worker_ids()) {
    hub_->Set(worker, StopAssignment(record.job.id(), record.plan.version()));
  }
  registry_->Release(record.job.id());
  record.weights.clear();
  PT_LOG(INFO) << "job " << record.job.id() << " " << v1::JobState_Name(state)
               << (reason.empty() ? "" : ": " + reason);
}

absl::StatusOr<JobManager::JobRecord*> JobManager::ForWorkerLocked(const std::string& worker_id,
                                                                   const std::string& job_id) {
  JobRecord* record = FindLocked(job_id);
  if (record == nullptr) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  if (IsTerminal(record->job.state())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " already ended (", v1::JobState_Name(record->job.state()), ")"));
  }
  if (record->stage_of.count(worker_id) == 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("worker ", worker_id, " is not part of job ", job_id));
  }
  return record;
}

absl::StatusOr<v1::ReportProgressResponse> JobManager::ReportProgress(
    const v1::ReportProgressRequest& r) {
  AnnotatedMutexLock lock(&mu_);
  v1::ReportProgressResponse response;
  ASSIGN_OR_RETURN(JobRecord * record, ForWorkerLocked(r.worker_id(), r.job_id()));
  if (r.plan_version() != record->plan.version()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "plan version ", r.plan_version(), " is stale; current is ", record->plan.version()));
  }
  RETURN_IF_ERROR(CheckProgressBounds(r, *record));
  if (!r.error().empty()) {
    // Errors name peers by stage; say which worker runs each stage.
    std::vector<std::string> stages;
    for (int s = 0; s < record->job.worker_ids_size(); ++s) {
      stages.push_back(absl::StrCat(s, "=", record->job.worker_ids(s)));
    }
    EndLocked(*record, v1::FAILED,
              absl::StrCat("worker ", r.worker_id(), ": ", r.error(), " [stages: ",
                           absl::StrJoin(stages, ", "), "]"));
    return response;
  }
  StageProgress& stage = record->stages[record->stage_of.at(r.worker_id())];
  if (r.ready()) {
    stage.ready = true;
    response.set_all_ready(std::all_of(record->stages.begin(), record->stages.end(),
                                       [](const StageProgress& s) { return s.ready; }));
    return response;
  }
  stage.iterations_done = std::max(stage.iterations_done, r.iteration() + 1);
  stage.busy_seconds += r.busy_seconds();
  stage.idle_seconds += r.idle_seconds();
  stage.finished = stage.finished || r.finished();
  if (r.micro_batch_losses_size() > 0) {
    double sum = 0.0;  // as LocalTrainer: double sum, divided, as float
    for (float l : r.micro_batch_losses()) sum += l;
    const float loss = static_cast<float>(sum / r.micro_batch_losses_size());
    v1::JobProgress* p = record->job.mutable_progress();
    p->set_step(r.iteration() + 1);
    p->set_loss(loss);
    p->add_loss_history(loss);
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
    if (seconds > 0) p->set_tokens_per_second(double(t.batch_size) * t.seq_len / seconds);
    record->last_step_time = now;
  }
  if (r.has_val_loss()) {
    v1::JobProgress* p = record->job.mutable_progress();
    p->set_val_loss(r.val_loss());
    p->set_val_step(r.iteration() + 1);
  }
  TouchLocked(*record);
  MaybeCompleteLocked(*record);
  response.set_all_ready(true);
  return response;
}

absl::Status JobManager::AddWeightsChunk(const v1::WeightsChunk& c) {
  AnnotatedMutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobRecord * record, ForWorkerLocked(c.worker_id(), c.job_id()));
  if (c.tensor_name().empty()) {  // names the stream only (coordinator.proto)
    if (c.values_size() > 0) {
      return absl::InvalidArgumentError("a weights chunk with values must name its tensor");
    }
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(CheckWeightsChunkLocked(*record, c));
  auto it = std::find_if(record->weights.begin(), record->weights.end(),
                         [&](const NamedTensor& t) { return t.name == c.tensor_name(); });
  if (it == record->weights.end()) {
    // The model's shape, checked above: never a size the client chose.
    record->weights.push_back(
        {c.tensor_name(), Tensor::Zeros(record->weight_owner.at(c.tensor_name()).second)});
    it = record->weights.end() - 1;
  }
  Tensor& t = it->tensor;
  if (c.offset() < 0 || c.offset() + c.values_size() > t.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk of ", c.tensor_name(), " at ", c.offset(), " + ", c.values_size(),
        " exceeds its ", t.numel(), " elements"));
  }
  std::copy(c.values().begin(), c.values().end(), t.data() + c.offset());
  record->weights_filled[c.tensor_name()] += c.values_size();
  return absl::OkStatus();
}

void JobManager::RecordWeightOwners(JobRecord& record, int stage) {
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
  if (r.error().size() > kMaxReportedErrorBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReportProgressRequest.error: ", r.error().size(),
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

absl::Status JobManager::FinishWeights(const std::string& worker_id, const std::string& job_id) {
  AnnotatedMutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobRecord * record, ForWorkerLocked(worker_id, job_id));
  record->stages[record->stage_of.at(worker_id)].weights_done = true;
  MaybeCompleteLocked(*record);
  return absl::OkStatus();
}

void JobManager::MaybeCompleteLocked(JobRecord& record) {
  const bool want_weights = !record.resolved.spec.output().weights_path().empty();
  for (const StageProgress& s : record.stages) {
    if (!s.finished || (want_weights && !s.weights_done)) return;
  }
  if (want_weights) {
    int64_t total = 0;
    for (const NamedTensor& t : record.weights) {
      if (record.weights_filled[t.name] < t.tensor.numel()) {
        return EndLocked(record, v1::FAILED, absl::StrCat("incomplete upload of ", t.name));
      }
      total += t.tensor.numel();
    }
    const int64_t expected = CountParameters(record.resolved.train.model);
    if (total != expected) {
      return EndLocked(record, v1::FAILED, absl::StrCat("uploaded weights hold ", total,
                                                        " values; the model has ", expected));
    }
    absl::StatusOr<std::string> written = WriteWeightsLocked(record);
    if (!written.ok()) {
      return EndLocked(record, v1::FAILED, std::string(written.status().message()));
    }
    record.job.set_weights_path(*written);
  }
  EndLocked(record, v1::SUCCEEDED, "");
}

absl::StatusOr<std::string> JobManager::WriteWeightsLocked(JobRecord& record) {
  const std::string& name = record.resolved.spec.output().weights_path();
  // Walked again now (links may have appeared since submit); missing
  // directories under the output directory are created.
  ASSIGN_OR_RETURN(ConfinedParent parent,
                   OpenConfinedParent(options_.output_dir, "spec.output.weights_path", name,
                                      /*create_dirs=*/true));
  RETURN_IF_ERROR(WriteSafetensorsAt(parent.dir.get(), parent.name, record.weights, {}, 0600));
  return absl::StrCat(options_.output_dir, "/", name);
}

void JobManager::PruneLocked() {
  const absl::Time oldest_kept = clock_->Now() - options_.ended_job_retention;
  int ended = 0;
  for (const std::string& id : order_) ended += IsTerminal(jobs_.at(id)->job.state()) ? 1 : 0;
  std::vector<std::string> kept;
  for (const std::string& id : order_) {
    const v1::Job& job = jobs_.at(id)->job;
    const absl::Time ended_at = FromTimestamp(job.update_time());
    const bool prune =
        IsTerminal(job.state()) && (ended > options_.max_ended_jobs || ended_at < oldest_kept);
    if (prune) {
      --ended;
      jobs_.erase(id);
    } else {
      kept.push_back(id);
    }
  }
  order_ = std::move(kept);
}

void JobManager::OnWorkerLost(const std::string& worker_id, const std::string& job_id,
                              const std::string& reason) {
  AnnotatedMutexLock lock(&mu_);
  JobRecord* record = FindLocked(job_id);
  if (record == nullptr || IsTerminal(record->job.state())) return;
  EndLocked(*record, v1::FAILED, reason);
}

std::map<v1::JobState, int> JobManager::CountByState() const {
  AnnotatedMutexLock lock(&mu_);
  std::map<v1::JobState, int> counts;
  for (const auto& [id, record] : jobs_) counts[record->job.state()]++;
  return counts;
}

}  // namespace pipetrain
