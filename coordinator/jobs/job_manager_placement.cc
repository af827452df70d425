// JobManager: placing a job on workers: planning off the lock, the retries
// of a refused plan, committing a plan (assignments, device groups) and
// re-planning a recovering job. Contracts: job_manager.h.
#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/data_plane_keys.h"
#include "common/enum_names.h"
#include "common/link_model.h"
#include "common/logging.h"
#include "common/proto_time.h"
#include "common/secrets.h"
#include "common/status_macros.h"
#include "common/utf8_prefix.h"
#include "coordinator/jobs/host_gflops.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/job_manager_internal.h"
#include "coordinator/jobs/memory_budget.h"
#include "coordinator/planner/data_parallel_layout.h"
#include "coordinator/planner/device_links.h"
#include "coordinator/planner/job_layout.h"
#include "coordinator/planner/planner.h"
#include "coordinator/planner/replica_device_groups.h"

namespace pipetrain {

using job_manager_internal::IsGoneWorker;
using job_manager_internal::MarkedInIncarnation;
using job_manager_internal::ModelSizes;
using job_manager_internal::NotAmong;

namespace {

// How long a recovery waits for a survivor that heartbeats but has not yet
// said it stopped its part of the job (the registry's `stopping`, set by
// the job's release or a heartbeat that says "stopping job", cleared by an
// idle heartbeat naming the job): a stop finishing a checkpoint write may
// take minutes, as long as the start barrier would have waited for it
// (JobRunner::kMinStartBarrierWait).
// Past this it is left out like a gone worker; planned while still
// stopping (its watch thread blocked in the stop, on a wedged mount say),
// it never took its RUN, the others waited out the start barrier, and
// each recovery took it again until the job failed.
constexpr absl::Duration kSurvivorStopWait = absl::Minutes(10);

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

// The smallest --mailbox-limit among `workers` (DeviceInfo.mailbox_limit_bytes,
// bounded at registration), for cluster->mailbox_limit_bytes: a worker's
// mailbox refuses any one tensor larger, so the planner sends none
// (MaxPlannedTensorBytes). Older workers (0) are left out; none reported: 0.
int64_t SmallestMailboxLimit(const std::vector<v1::Worker>& workers) {
  int64_t smallest = 0;
  for (const v1::Worker& w : workers) {
    const int64_t limit = w.device().mailbox_limit_bytes();
    if (limit > 0 && (smallest == 0 || limit < smallest)) smallest = limit;
  }
  return smallest;
}

// The host copies of the weights each GPU worker of `plan` steps (its
// backward units', a tensor rank's share; GpuHostCopiesAt: the most any
// one phase of its run holds, a resume's read, a step's gradients' sum, a
// checkpoint's snapshot, the final weights) against its host's RAM
// (CheckGpuHostCopies): its plan counted its device's memory only.
// `infos`: the plan's workers in its position order.
absl::Status CheckGpuHostCopiesOf(const ResolvedJobSpec& resolved, const ModelProfile& profile,
                                  const v1::Plan& plan, const std::vector<v1::Worker>& infos) {
  const int tensor = std::max(1, resolved.tensor_parallel);
  const int per_stage = tensor * std::max(1, resolved.data_parallel);
  if (plan.stages_size() != static_cast<int>(infos.size()) || infos.size() % per_stage != 0) {
    return absl::InternalError(absl::StrCat("a plan of ", plan.stages_size(), " positions for ",
                                            infos.size(), " workers"));
  }
  const int stages = static_cast<int>(infos.size()) / per_stage;
  const int units = static_cast<int>(profile.units.size());
  std::vector<int> stage_of;
  std::vector<double> stepped, copies;
  for (int g = 0; g < plan.stages_size(); ++g) {
    // Position g: replica r's stage s, tensor rank t at (r * stages + s) * tensor + t.
    stage_of.push_back(g / tensor % stages);
    copies.push_back(GpuHostCopiesAt(resolved, g / tensor / stages, g % tensor));
    const v1::UnitRange& b = plan.stages(g).backward();
    double bytes = 0;
    for (int u = std::max(0, b.begin()); u < std::min(b.end(), units); ++u) {
      bytes += profile.units[u].weight_bytes;
    }
    stepped.push_back(bytes / tensor);
  }
  return CheckGpuHostCopies(infos, stage_of, stepped, copies,
                            resolved.spec.checkpoint().interval_steps() > 0);
}

// The job's stages as device-link members: each worker's host, GPU and
// current NCCL id (the registry keeps it out of v1::Worker).
std::vector<DeviceLinkMember> DeviceLinkMembers(const std::vector<v1::Worker>& workers,
                                                const WorkerRegistry& registry) {
  std::vector<DeviceLinkMember> members;
  for (const v1::Worker& w : workers) {
    members.push_back({w.device().hostname(), w.device().gpu_index(),
                       registry.NcclUniqueId(w.id()).value_or(""), w.device().gpu_pci_bus_id()});
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
                 << absl::StrJoin(g.group.stages(), ",") << " (host " << owner.device().hostname()
                 << ", GPUs " << absl::StrJoin(gpus, ",") << "; NCCL id from " << owner.id() << ")";
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

}  // namespace

void TrimPlanHistory(google::protobuf::RepeatedPtrField<v1::PlanVersion>& history) {
  int64_t bytes = 0;
  for (const v1::PlanVersion& v : history) bytes += static_cast<int64_t>(v.ByteSizeLong());
  int drop = 0;
  while (history.size() - drop > 1 &&
         (history.size() - drop > kMaxPlanHistory || bytes > kMaxPlanHistoryBytes)) {
    bytes -= static_cast<int64_t>(history.Get(drop).ByteSizeLong());
    ++drop;
  }
  if (drop > 0) history.DeleteSubrange(0, drop);
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
  SetProfileLocked(record, std::move(profile));
  record.profile_source = source;
  // Cached, measured or analytic, it is of workers[0]'s device kind.
  record.profile_attention = AnalyticAttentionOf(infos[0].device());
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
  // Spares held for an earlier placement or boundary are not this one's.
  record.boundary_held.clear();
  // No checkpoint of its own yet: where spec.init.from starts it.
  if (!pending.resume.has_value() && record.init_checkpoint.has_value()) {
    pending.resume = record.init_checkpoint;
  }
  // Replica r's stage s, rank t on position (r * stages + s) * tensor + t
  // (PlanPlacement): the workers in an order whose every stage is of one
  // kind where the set has one (recoveries, boundaries and growth choose
  // sets by kind in order of preference, UsableSetLocked). A set that has
  // none stays as it is, and planning says why (CheckReplicaDevices).
  std::vector<std::string> positions = workers;
  if (std::optional<std::vector<std::string>> arranged =
          OneKindPerStageLocked(record, workers, static_cast<int>(workers.size()))) {
    positions = *std::move(arranged);
  }
  std::vector<v1::Worker> infos;
  for (const std::string& w : positions) {
    ASSIGN_OR_RETURN(v1::Worker worker, registry_->Get(w));
    infos.push_back(worker);
  }
  PlanningInput input;
  ClusterSpec& cluster = input.cluster;
  // What each worker may use (its cgroup or --memory-limit; GPU workers
  // hold the model in device memory), a host's RAM or a GPU shared by the
  // workers that draw on it.
  const std::vector<double> memory =
      PlanMemoryBudgets(infos, &input.shared_memory, options_.gpu_memory_reserve_bytes);
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
    spec.gpu_arithmetic = GpuArithmetic(w.device().gpu_model(), w.device().backend());
    cluster.workers.push_back(spec);
  }
  // Workers that emulate their links (--emulate-link) say so: plan with
  // the slowest; otherwise with the network the coordinator was told of
  // (--network), or the assumed one.
  double bandwidth = 0, latency = 0;
  bool emulated = true;
  for (const v1::Worker& w : infos) {
    const double b = w.device().link_bandwidth_bytes_per_second();
    const double l = w.device().link_latency_seconds();
    // DeviceInfo's bounds, which ParseLinkModel also keeps; a value outside
    // them means "not emulated".
    if (!(b >= 1e3 && b <= kMaxLinkBandwidthBytesPerSecond) || !(l >= 0 && l <= 10)) {
      emulated = false;
      break;
    }
    bandwidth = bandwidth == 0 ? b : std::min(bandwidth, b);
    latency = std::max(latency, l);
  }
  if (emulated) {
    cluster.bandwidth_bytes_per_second = bandwidth;
    cluster.latency_seconds = latency;
    cluster.links_origin = "as the workers emulate them";
  } else if (options_.network.has_value()) {
    cluster.bandwidth_bytes_per_second = options_.network->bandwidth_bytes_per_second;
    cluster.latency_seconds = absl::ToDoubleSeconds(options_.network->latency);
    cluster.links_origin = "the coordinator's --network";
  } else {
    cluster.bandwidth_bytes_per_second = kAssumedBandwidth;
    cluster.latency_seconds = kAssumedLatency;
    cluster.links_origin = "assumed, not measured: the coordinator's --network sets it";
  }
  cluster.links_emulated = emulated;
  SetSlowestHostDataPlane(infos, &cluster);
  cluster.mailbox_limit_bytes = SmallestMailboxLimit(infos);
  // Held for this job from now on: a worker lost while the job is planned
  // is the job's loss (OnWorkerLost), and no other job takes these.
  RETURN_IF_ERROR(registry_->Assign(positions, id));
  input.job_id = id;
  input.version = record.plan.version() + 1;
  input.workers = static_cast<int>(positions.size());
  input.resolved = record.resolved;
  input.auto_layout_workers = record.auto_layout_workers;
  input.auto_layout_compression = record.auto_layout_compression;
  input.auto_layout_parallelism = record.auto_layout_parallelism;
  std::vector<AnalyticAttention> attentions;
  for (const v1::Worker& w : infos) attentions.push_back(AnalyticAttentionOf(w.device()));
  std::string sized_for;
  input.profile = ProfileForAttentions(
      *record.profile, record.profile_attention, attentions,
      [&](AnalyticAttention kind) {
        return ModelSizes(record.resolved.train.model, ProfileRequestFor(record), kind);
      },
      &sized_for);
  input.profile_source = absl::StrCat(record.profile_source, sized_for);
  input.reason = pending.reason;
  input.queued_at = elapsed_clock_->Now();
  pending.workers = positions;
  pending.infos = std::move(infos);
  pending.version = input.version;
  record.pending = std::move(pending);
  const int64_t placement = ++record.placement;
  record.job.set_state(v1::JOB_STATE_PLANNING);
  record.job.set_reason(absl::StrCat("planning on ", absl::StrJoin(positions, ", ")));
  TouchLocked(record);
  // Shutting down: nobody would take the plan (the job is restored from
  // its stored state, which is not PLANNING).
  if (stopping_) return absl::OkStatus();
  RunInBackgroundLocked([this, placement, input = std::move(input)] {
    // Overtaken while it waited its turn (cancelled, a worker lost): not
    // computed, as FinishPlacement would drop it. Plans run one at a time,
    // so every placement behind it (a recovery's too) would wait for a
    // plan thrown away, seconds each (solve_plan.h's budget).
    bool overtaken;
    {
      AnnotatedMutexLock lock(&mu_);
      JobRecord* record = FindLocked(input.job_id);
      overtaken = record == nullptr || record->job.state() != v1::JOB_STATE_PLANNING ||
                  record->placement != placement || !record->pending.has_value();
    }
    // At shutdown the plans still queued are not computed: nobody takes them.
    PlanningOutput output;
    if (planning_stopped_.load(std::memory_order_acquire)) {
      output.status = absl::CancelledError("the coordinator is shutting down");
    } else if (overtaken) {
      output.status = absl::CancelledError("the job moved on before it was planned");
    } else {
      const absl::Time started = elapsed_clock_->Now();
      output = PlanPlacement(input);
      // Each worker gets its own keys (data_plane_keys.h), derived from a
      // plan secret no worker is sent: it can prove only its own streams.
      // Derived here, off the jobs lock: n^2 HMACs, seconds for the
      // largest jobs.
      if (output.status.ok()) {
        output.data_plane_keys = DeriveDataPlaneKeys(
            RandomToken(), DataPlaneJobId(input.job_id, input.version), input.workers);
      }
      output.queued_seconds = absl::ToDoubleSeconds(started - input.queued_at);
      output.computing_seconds = absl::ToDoubleSeconds(elapsed_clock_->Now() - started);
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
    out.order = std::move(chose->order);
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
  // An explicit list of compressed stages naming stages this plan lacks (a
  // re-plan onto fewer): those indices are dropped (job.proto), and so the
  // units they held are summed exactly now; said, or the job would train
  // on with less compression than asked without a word.
  std::vector<int> beyond;
  for (int s : resolved.spec.compression().data_parallel().stages()) {
    if (s >= resolved.stages) beyond.push_back(s);
  }
  if (!beyond.empty() && replicas > 1) {
    const auto& kept = out.compiled.plan.data_parallel_compressed_stages();
    absl::StrAppend(&out.placed_reason, "; spec.compression.dataParallel.stages ",
                    absl::StrJoin(beyond, ", "), beyond.size() == 1 ? " is" : " are",
                    " beyond this plan's ", resolved.stages,
                    resolved.stages == 1 ? " stage" : " stages", ": compressed now: ",
                    kept.empty() ? "none" : absl::StrCat("stages ", absl::StrJoin(kept, ", ")),
                    " (the rest sum exactly, their saved error feedback added once)");
  }
  return out;
}

void JobManager::FinishPlacement(const std::string& job_id, int64_t placement,
                                 PlanningOutput output) {
  AnnotatedMutexLock lock(&mu_);
  --background_in_flight_;
  JobRecord* record = FindLocked(job_id);
  // Overtaken while it was planned (cancelled, a worker lost, shutting
  // down): whatever changed the job released its workers.
  if (stopping_ || record == nullptr || record->job.state() != v1::JOB_STATE_PLANNING ||
      record->placement != placement || !record->pending.has_value()) {
    return;
  }
  // A worker lost since it was assigned whose loss has not reached
  // OnWorkerLost yet: the registry tells its listener after leaving its
  // own lock, and this may run in between. Committed, the job would be
  // RUNNING on a worker that is gone, and that loss (arriving next) would
  // fail a job without checkpoints that a loss while planning re-queues.
  if (std::optional<std::pair<std::string, std::string>> gone =
          LostSinceAssignedLocked(*record->pending, job_id)) {
    return AbandonPlacementLocked(*record, gone->first, gone->second,
                                  IncarnationIn(record->pending->infos, gone->first));
  }
  // Only a plan taken (sent, or its refusal acted on) reaches
  // pipetrain_plan_seconds: one skipped or dropped above says nothing of
  // how long the plans that place jobs take.
  if (events_.planned) events_.planned(output.queued_seconds, output.computing_seconds);
  PendingPlacement pending = *std::move(record->pending);
  record->pending.reset();
  // The profile the placement was planned with (its weights are the
  // model's, whichever device kind it was sized for).
  if (output.status.ok() && record->profile.has_value()) {
    // In the plan's order: an auto layout's, or the placement's.
    std::vector<v1::Worker> placed;
    for (size_t g = 0; g < pending.infos.size(); ++g) {
      placed.push_back(pending.infos.at(output.order.empty() ? g : output.order.at(g)));
    }
    output.status = CheckGpuHostCopiesOf(output.chosen.value_or(record->resolved), *record->profile,
                                         output.compiled.plan, placed);
  }
  if (!output.status.ok() && RetryWithMoreMemoryLocked(*record, pending, output.status)) return;
  if (!output.status.ok() && RetryWithoutJoinersLocked(*record, pending, output.status)) return;
  if (!output.status.ok() && WaitForRoomLocked(*record, pending, output.status)) return;
  if (!output.status.ok()) {
    return EndLocked(*record, v1::JOB_STATE_FAILED,
                     absl::StrCat(pending.failure_prefix, output.status.message()));
  }
  CommitPlacementLocked(*record, std::move(pending), std::move(output));
}

std::optional<std::pair<std::string, std::string>> JobManager::LostSinceAssignedLocked(
    const PendingPlacement& pending, const std::string& job_id) const {
  for (const v1::Worker& planned : pending.infos) {
    const absl::StatusOr<v1::Worker> now = registry_->Get(planned.id());
    if (!now.ok()) return std::make_pair(planned.id(), std::string("it is no longer registered"));
    if (now->incarnation() != planned.incarnation()) {
      return std::make_pair(planned.id(), std::string("it registered again"));
    }
    if (now->state() != v1::WORKER_STATE_ASSIGNED || now->job_id() != job_id) {
      return std::make_pair(planned.id(), absl::StrCat("it is ", EnumShortName(now->state())));
    }
  }
  return std::nullopt;
}

int64_t JobManager::IncarnationIn(const std::vector<v1::Worker>& infos,
                                  const std::string& worker_id) {
  for (const v1::Worker& w : infos) {
    if (w.id() == worker_id) return w.incarnation();
  }
  return 0;
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
  for (std::string& w : ThatCanRunLocked(record, SpareWorkersLocked(HeldWorkersLocked()))) {
    candidates.push_back(std::move(w));
  }
  // The set ScheduleQueued would place it on (each stage of one kind where
  // it must be): compared by memory alone, a roomiest set that mixed kinds
  // differed from these while the set placed next could be these again,
  // planned and refused a second time.
  const int need = static_cast<int>(pending.workers.size());
  std::optional<std::vector<std::string>> roomiest =
      OneKindPerStageLocked(record, RoomiestFirstLocked(std::move(candidates), need), need);
  if (!roomiest.has_value() ||
      std::set<std::string>(roomiest->begin(), roomiest->end()) ==
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
  const std::vector<std::string> rest =
      UsableSetLocked(record, NotAmong(pending.workers, pending.joiners), MaxJobWorkers(record));
  const bool for_memory = refusal.code() == absl::StatusCode::kResourceExhausted;
  // The spares a refusal for memory kept together with these workers
  // before (below), and those new since.
  std::vector<std::string> earlier, newcomers;
  for (const v1::Worker& w : pending.infos) {
    if (std::find(pending.joiners.begin(), pending.joiners.end(), w.id()) ==
        pending.joiners.end()) {
      continue;
    }
    const bool refused_before =
        MarkedInIncarnation(record.refused_for_memory, w.id(), w.incarnation());
    (refused_before ? earlier : newcomers).push_back(w.id());
  }
  // What is dropped (marked unfit) and what is planned on next: the spares
  // and the rest; or, refused for memory with spares that were refused with
  // these workers before and a newcomer, only those earlier ones (tried
  // with more workers and still refused, one of them cannot hold its share)
  // and the rest with the newcomers.
  std::vector<std::string> dropped = pending.joiners;
  std::vector<std::string> next = rest;
  bool dropping_every_joiner = true;
  if (for_memory && !earlier.empty() && !newcomers.empty()) {
    std::vector<std::string> with_newcomers = rest;
    with_newcomers.insert(with_newcomers.end(), newcomers.begin(), newcomers.end());
    with_newcomers = UsableSetLocked(record, with_newcomers, MaxJobWorkers(record));
    if (static_cast<int>(with_newcomers.size()) >= MinJobWorkers(record)) {
      dropped = earlier;
      next = std::move(with_newcomers);
      dropping_every_joiner = false;
    }
  }
  // Refused for memory with too few workers left to plan on without the
  // spares: the model needs more workers than these, not other ones.
  // Marked unfit, the spares were never offered to this job again, and
  // each later one was tried alone with the rest: all the workers it needed
  // could be READY while it waited out its queue timeout.
  if (for_memory && dropping_every_joiner &&
      static_cast<int>(rest.size()) < MinJobWorkers(record) &&
      static_cast<int>(pending.workers.size()) < MaxJobWorkers(record)) {
    return WaitForAnotherWorkerLocked(record, pending, refusal);
  }
  for (const v1::Worker& w : pending.infos) {
    if (std::find(dropped.begin(), dropped.end(), w.id()) != dropped.end()) {
      record.unfit[w.id()] = w.incarnation();
      if (for_memory) pending.dropped_for_memory[w.id()] = w.incarnation();
    }
  }
  const std::string note = absl::StrCat("the plan with ", absl::StrJoin(dropped, ", "),
                                        " was refused (", refusal.message(), ")");
  PT_LOG(WARNING) << "job " << record.job.id() << ": " << note << "; going on without them";
  registry_->Release(record.job.id());
  const PlacementOrigin origin = pending.origin;
  absl::Status placed = absl::FailedPreconditionError(
      absl::StrCat("fewer than ", MinJobWorkers(record), " workers without them"));
  if (static_cast<int>(next.size()) >= MinJobWorkers(record)) {
    pending.joiners = dropping_every_joiner ? std::vector<std::string>() : newcomers;
    pending.reason = absl::StrCat(pending.reason, "; without the workers refused: ", note);
    placed = BeginPlacementLocked(record, next, std::move(pending));
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

bool JobManager::WaitForRoomLocked(JobRecord& record, const PendingPlacement& pending,
                                   const absl::Status& refusal) {
  if (refusal.code() != absl::StatusCode::kResourceExhausted ||
      pending.origin == PlacementOrigin::kInitial || !pending.joiners.empty() ||
      static_cast<int>(pending.workers.size()) >= MaxJobWorkers(record)) {
    return false;
  }
  return WaitForAnotherWorkerLocked(record, pending, refusal);
}

bool JobManager::WaitForAnotherWorkerLocked(JobRecord& record, const PendingPlacement& pending,
                                            const absl::Status& refusal) {
  record.refused_for_memory.clear();
  for (const v1::Worker& w : pending.infos) record.refused_for_memory[w.id()] = w.incarnation();
  // Spares dropped for memory before this plan: the model needs more
  // workers than these, not other ones. Offered again, with a newcomer.
  for (const auto& [id, incarnation] : pending.dropped_for_memory) {
    record.refused_for_memory[id] = incarnation;
    if (MarkedInIncarnation(record.unfit, id, incarnation)) record.unfit.erase(id);
  }
  record.refused_for_memory_note =
      absl::StrCat("the plan on ", absl::StrJoin(pending.workers, ", "), " does not fit (",
                   refusal.message(), ")");
  PT_LOG(WARNING) << "job " << record.job.id() << ": " << record.refused_for_memory_note
                  << "; waiting for another worker";
  registry_->Release(record.job.id());
  if (pending.origin == PlacementOrigin::kBoundary) {
    // Its stages stopped after the boundary's complete checkpoint: the
    // recovery resumes there, redoing nothing.
    StartRecoveryLocked(record, "", record.boundary_reason, RecoveryKind::kReplanRefused);
    if (record.job.state() != v1::JOB_STATE_RECOVERING) return true;  // it ended instead
  }
  record.job.set_state(v1::JOB_STATE_RECOVERING);
  record.job.set_reason(absl::StrCat("recovering: ", record.recovery_reason, "; ",
                                     record.refused_for_memory_note,
                                     "; waiting for more READY workers"));
  TouchLocked(record);
  return true;
}

void JobManager::CommitPlacementLocked(JobRecord& record, PendingPlacement pending,
                                       PlanningOutput output) {
  const std::string& id = record.job.id();
  record.refused_for_memory.clear();
  record.refused_for_memory_note.clear();
  if (output.chosen.has_value()) {
    record.resolved = *std::move(output.chosen);
    *record.job.mutable_spec() = record.resolved.spec;
  }
  // The chosen layout was planned on the workers arranged by kind: its
  // positions are theirs in that order.
  if (!output.order.empty()) {
    PT_CHECK(output.order.size() == pending.workers.size() &&
             pending.infos.size() == pending.workers.size())
        << output.order.size() << " positions for " << pending.workers.size() << " workers";
    std::vector<std::string> workers;
    std::vector<v1::Worker> infos;
    for (size_t i : output.order) {
      workers.push_back(pending.workers.at(i));
      infos.push_back(pending.infos.at(i));
    }
    pending.workers = std::move(workers);
    pending.infos = std::move(infos);
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
    // The loss shown (and the pipetrain_job_loss gauge) is the resume
    // step's, not that of a step now redone; none when it is not kept.
    p->set_loss(p->loss_history_size() > 0 &&
                        p->loss_history_start() + p->loss_history_size() == pending.resume_step
                    ? p->loss_history(p->loss_history_size() - 1)
                    : 0.0f);
    // Complete checkpoints beyond the resume point are redone: held, the
    // redo's files would be checked against their old checksums (other
    // bytes under another layout) and a step boundary among or below them
    // would never complete. Their files go once the state that no longer
    // names them is saved (as expired ones: RemoveExpiring, manifest
    // first, only files written no later than their manifest, so not the
    // redo's): kept while the redo replaces the files one by one,
    // `init.from: <the job's directory>` and `checkpoint export` would take
    // a manifest of old checksums for the newest checkpoint.
    // Without a manifest (held by a failing store, and never written once
    // forgotten), its unit files stay (InfinitePast): the redo, which this
    // plan starts, writes them over, and the job's end sweep takes what is
    // left. This host's clock as their bound deleted the redo's, written
    // on a file server whose clock is behind (the step then completed with
    // a unit missing).
    if (record.checkpoints != nullptr) {
      for (v1::ResumeFrom& f : record.checkpoints->ForgetAfter(pending.resume_step)) {
        PT_LOG(INFO) << "job " << id << ": checkpoint of step " << f.step()
                     << " forgotten: the recovery resumes before it and redoes it";
        record.expiring.push_back(ExpiredCheckpoint{std::move(f), absl::InfinitePast()});
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
  DropWeightsFile(record);
  record.job.clear_worker_ids();
  record.job.mutable_progress()->clear_stage_times();
  const int64_t start_step = resume != nullptr ? resume->step() : 0;
  // The planning task derived them for input.workers == workers.size()
  // and this version.
  const std::vector<DataPlaneKeys>& data_plane_keys = output.data_plane_keys;
  PT_CHECK(data_plane_keys.size() == workers.size() && record.plan.version() == version)
      << data_plane_keys.size() << " keys for " << workers.size() << " workers, plan version "
      << record.plan.version() << " vs " << version;
  // Each worker's share of its host's RAM in this plan (HostRamBudgets),
  // which bounds its corpus.
  const std::vector<double> host_ram = HostRamBudgets(infos);
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
    a.set_data_plane_receive_key(data_plane_keys[g].receive_key);
    for (const std::string& key : data_plane_keys[g].send_keys) a.add_data_plane_send_keys(key);
    a.set_start_iteration(start_step);
    a.set_data_sha256(record.job.data_sha256());
    // Its corpus lives in the host's RAM, whatever its device's memory.
    a.set_host_memory_budget_bytes(host_ram[g]);
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
    record.assignments.push_back(
        {a.program(), a.has_resume() ? std::optional<v1::ResumeFrom>(a.resume()) : std::nullopt});
    hub_->Set(workers[g], std::move(a));
  }
  v1::PlanVersion* history = record.job.add_plan_history();
  history->set_version(version);
  history->set_reason(placed_reason.size() <= kMaxPlanReasonBytes
                          ? placed_reason
                          : absl::StrCat(Utf8Prefix(placed_reason, kMaxPlanReasonBytes),
                                         " ... (cut; the coordinator's log has it whole)"));
  history->set_start_step(start_step);
  for (const std::string& w : workers) history->add_worker_ids(w);
  *history->mutable_time() = ToProtoTimestamp(clock_->Now());
  TrimPlanHistory(*record.job.mutable_plan_history());
  record.job.set_state(v1::JOB_STATE_RUNNING);
  record.job.set_plan_version(record.plan.version());
  record.job.set_reason("");
  record.last_step_time = elapsed_clock_->Now();
  record.stepped_on_plan = false;
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
    record.replanned_at = elapsed_clock_->Now();
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
  HoldBoundarySparesLocked(record);
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
  // A boundary still pending (a drain, a join) is overtaken: the recovery
  // re-plans without the drained workers as well, and says why they went.
  const std::string why = record.stop_at > 0 && !record.boundary_reason.empty()
                              ? absl::StrCat(reason, "; overtaking the re-planning due after step ",
                                             record.stop_at, " (", record.boundary_reason, ")")
                              : reason;
  record.stop_at = 0;
  record.boundary_joiners.clear();
  record.boundary_held.clear();
  record.pending.reset();
  record.job.set_state(v1::JOB_STATE_RECOVERING);
  record.job.set_reason(absl::StrCat("recovering: ", why));
  record.recovery_started = elapsed_clock_->Now();
  record.recovery_reason = why;
  record.recovering_since.reset();
  record.lost.clear();
  if (!lost.empty()) record.lost[lost] = gone;
  record.survivors.clear();
  for (const std::string& w : record.job.worker_ids()) {
    if (w != lost) record.survivors.push_back(w);
    StopWorkerLocked(record, w);
  }
  NoteSurvivorHeartbeatsLocked(record);
  registry_->Release(record.job.id());
  record.checkpoints->ClearPending();
  // The redone steps end with a fresh upload: the partial file goes now.
  DropWeightsFile(record);
  TouchLocked(record);
  PersistLocked(record).IgnoreError();  // logged
  if (events_.recovery_started) events_.recovery_started(kind);
  PT_LOG(WARNING) << "job " << record.job.id() << " RECOVERING: " << why;
}

void JobManager::NoteSurvivorHeartbeatsLocked(JobRecord& record) {
  record.heartbeat_at_recovery.clear();
  for (const std::string& w : record.survivors) {
    absl::StatusOr<v1::Worker> worker = registry_->Get(w);
    record.heartbeat_at_recovery[w] =
        worker.ok() ? FromProtoTimestamp(worker->last_heartbeat()) : absl::InfinitePast();
  }
}

void JobManager::TryReplanLocked(JobRecord& record, std::set<std::string>* reserved,
                                 PassWorkers* pass) {
  // Every former worker must be accounted for: alive (a heartbeat since the
  // loss) or gone. A dead one left READY would be planned again and fail.
  std::vector<std::string> alive;
  // Former workers gone as well as the one the recovery names (two lost
  // together, or one lost while the job was recovering): said with it.
  std::vector<std::string> gone_too;
  bool waiting = false;
  std::vector<std::string> still_stopping;
  const bool stop_wait_over = elapsed_clock_->Now() - record.recovery_started >= kSurvivorStopWait;
  for (const std::string& w : record.survivors) {
    if (IsLostLocked(record, w) || IsDrainedLocked(w)) continue;
    absl::StatusOr<v1::Worker> worker = registry_->Get(w);
    const bool gone = IsGoneWorker(worker);
    if (gone && elapsed_clock_->Now() < record.restart_grace_until) {
      waiting = true;  // after a restart: it may still register again
      continue;
    }
    if (gone) {
      gone_too.push_back(absl::StrCat(
          w, " (", !worker.ok() ? "no longer registered" : EnumShortName(worker->state()), ")"));
      continue;
    }
    // JOINING: a new incarnation whose registration is being saved (READY,
    // or LOST if the save fails, within the store's time): left out now,
    // it would only join at a later boundary, after a plan without it.
    const auto at_recovery = record.heartbeat_at_recovery.find(w);
    const bool heard_since = at_recovery == record.heartbeat_at_recovery.end() ||
                             FromProtoTimestamp(worker->last_heartbeat()) != at_recovery->second;
    if (!heard_since || worker->state() == v1::WORKER_STATE_JOINING) {
      waiting = true;
    } else if (worker->state() == v1::WORKER_STATE_READY && !ReadyInPass(*pass, w)) {
      if (stop_wait_over) {
        gone_too.push_back(absl::StrCat(w, " (still stopping its part after ",
                                        absl::FormatDuration(kSurvivorStopWait), ")"));
      } else {
        still_stopping.push_back(w);
      }
    } else if (worker->state() == v1::WORKER_STATE_READY) {
      alive.push_back(w);
    }
  }
  const absl::Time now = elapsed_clock_->Now();
  if (waiting || !still_stopping.empty()) {
    record.job.set_reason(absl::StrCat(
        "recovering: ", record.recovery_reason, "; waiting to hear from the other workers",
        still_stopping.empty() ? ""
                               : absl::StrCat(" (", absl::StrJoin(still_stopping, ", "),
                                              still_stopping.size() == 1 ? " is" : " are",
                                              " still stopping; left out after ",
                                              absl::FormatDuration(kSurvivorStopWait), ")")));
    return;
  }
  // Survivors first (in stage order), then spare READY workers: those no
  // plan was refused with first (a plan with them is new), then the spares
  // a refusal for memory dropped (they may yet fit beside a newcomer),
  // roomiest first: the cut at max_workers below then drops the smallest.
  // (In id order, a too-small spare with a low id stayed in and each pass
  // cut the replacement refused last: two replacements took turns with it,
  // a new refused plan every pass, and the job neither ran nor timed out.)
  const auto refused_with = [&](const std::string& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return MarkedInIncarnation(record.refused_for_memory, w, IncarnationOf(w, pass));
  };
  // A QUEUED job waits only for the spares it can run on (one job of each
  // tensor mode is asked: CanRunLocked reads no more of it): a 3-D tensor
  // job short of CPU workers does not keep a recovery off idle GPUs.
  const std::set<std::string> for_queued = SparesForQueuedLocked(*reserved, pass);
  std::vector<std::string> chosen = alive;
  // Of each group, the spares no queued job can run on first: in id order,
  // a lost GPU's place went to an idle CPU a queued CPU-only job needed
  // while idle GPUs would do.
  std::vector<std::string> spares = SparesForLocked(record, *reserved, pass);
  std::stable_partition(spares.begin(), spares.end(),
                        [&](const std::string& w) { return for_queued.count(w) == 0; });
  // Looked up for each spare: a find in `chosen` each took spares x chosen.
  std::set<std::string> in_chosen(chosen.begin(), chosen.end());
  for (const bool refused_pass : {false, true}) {
    std::vector<std::string> group;
    for (const std::string& w : spares) {
      if (refused_with(w) == refused_pass && in_chosen.count(w) == 0 && !IsLostLocked(record, w)) {
        group.push_back(w);
      }
    }
    if (refused_pass) {
      // Beside those chosen: a spare on a host they share has only its
      // share of the host's RAM.
      group = RoomiestFirstLocked(std::move(group),
                                  MaxJobWorkers(record) - static_cast<int>(chosen.size()), chosen);
    }
    chosen.insert(chosen.end(), group.begin(), group.end());
    in_chosen.insert(group.begin(), group.end());
  }
  // A recovery replaces what it lost; it grows past its size before the
  // loss (or its minimum) only onto spares no other job waits for, as a
  // running job grows: before, it took every spare up to max_workers ahead
  // of a QUEUED job, which then waited until its queue timeout failed it.
  // The bound goes to the arrangement, not the list: cut first, a spare of
  // the wrong kind could take the place of the one a stage needs.
  std::set<std::string> waited_for = *reserved;
  waited_for.insert(for_queued.begin(), for_queued.end());
  const int before_loss = std::max(
      {MinJobWorkers(record), record.job.worker_ids_size(), static_cast<int>(alive.size())});
  int most = MaxJobWorkers(record);
  std::vector<std::string> candidates = chosen;
  if (!NoJobWaitsForSparesLocked(waited_for, &record, pass)) {
    most = std::min(most, before_loss);
  } else if (most > before_loss && !for_queued.empty()) {
    // Up to its size before the loss of any of them (survivors first), past
    // it of those no queued job can run on.
    candidates = UsableSetLocked(record, chosen, before_loss, pass);
    for (const std::string& w : NotAmong(chosen, candidates)) {
      if (for_queued.count(w) == 0) candidates.push_back(w);
    }
  }
  // Counted before whole replicas are kept: 3 of a 4-rank group's workers
  // are "3 ready", though none can be used yet.
  const std::vector<std::string> counted(
      chosen.begin(), chosen.begin() + std::min<int>(chosen.size(), MaxJobWorkers(record)));
  chosen = UsableSetLocked(record, candidates, most, pass);
  // Why it waits rather than plans; empty: it plans. The very workers a
  // plan was refused on for memory (with the spares dropped before it)
  // would be refused again, so it waits for another as for too few
  // workers. (Fewer of them may fit: workers sharing a host's RAM or a GPU
  // each get more of it.)
  const auto count = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ReadyCount(counted.size(), HeldReadyLocked(record, *reserved, counted, pass),
                      DrainedReadyLocked(pass));
  };
  std::string waiting_for;
  if (static_cast<int>(chosen.size()) < MinJobWorkers(record)) {
    waiting_for =
        UsableWorkers(record, counted.size()) >= MinJobWorkers(record)
            ? WaitingForKinds(record, MinJobWorkers(record), count())
            : absl::StrCat("waiting for ", MinJobWorkers(record), " READY workers (", count(), ")");
  } else if (!record.refused_for_memory.empty() &&
             chosen.size() == record.refused_for_memory.size() &&
             std::all_of(chosen.begin(), chosen.end(), refused_with)) {
    waiting_for = absl::StrCat(record.refused_for_memory_note, "; waiting for more READY workers (",
                               count(), ")");
  }
  const std::string also_gone =
      gone_too.empty() ? ""
                       : absl::StrCat("; ", absl::StrJoin(gone_too, ", "),
                                      gone_too.size() == 1 ? " is" : " are", " gone too");
  if (!waiting_for.empty()) {
    waiting_for += also_gone;
    // READY workers it does not count, held back after they were lost as
    // they joined it: said, or `pipetrain workers` showed them READY while
    // the job waited "for more READY workers" without a word of why.
    for (const auto& [w, crash] : record.join_crashes) {
      const absl::StatusOr<v1::Worker> held = registry_->Get(w);
      if (now < crash.until && held.ok() && held->state() == v1::WORKER_STATE_READY) {
        absl::StrAppend(&waiting_for, "; ", w, " not offered for another ",
                        absl::FormatDuration(absl::Ceil(crash.until - now, absl::Seconds(1))),
                        " (lost as it joined, ", crash.count,
                        crash.count == 1 ? " time)" : " times)");
      }
    }
    if (now - record.recovery_started > record.resolved.queue_timeout) {
      return EndLocked(record, v1::JOB_STATE_FAILED,
                       absl::StrCat("could not recover within spec.scheduling.queue_timeout: ",
                                    waiting_for, "; after ", record.recovery_reason));
    }
    record.job.set_reason(absl::StrCat("recovering: ", record.recovery_reason, "; ", waiting_for));
    return;
  }
  // Read again first, as a queued job's are: one drained, stopping a job or
  // gone since the pass read it is not placed, and the next pass counts again.
  const std::string changed = ReadAgainLocked(chosen, *pass);
  if (!changed.empty()) {
    record.job.set_reason(
        absl::StrCat("recovering: ", record.recovery_reason, "; waiting to be placed: ", changed));
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
      record.recovery_reason, also_gone, "; resumed from ",
      resume != nullptr
          ? absl::StrCat("checkpoint step ", pending.resume_step)
          : absl::StrCat("step ", pending.resume_step, " (no checkpoint of its own yet)"));
  pending.failure_prefix = absl::StrCat("re-planning after ", record.recovery_reason, " failed: ");
  pending.joiners = NotAmong(chosen, alive);
  absl::Status placed = BeginPlacementLocked(record, chosen, std::move(pending));
  // Those it took are ASSIGNED now (or one was found gone): the rest of the
  // pass reads them so.
  ReadAgainLocked(chosen, *pass);
  if (!placed.ok()) {
    // A chosen worker went since it was counted: none was assigned, and the
    // next pass counts again.
    record.job.set_reason(
        absl::StrCat("recovering: ", record.recovery_reason, "; ", placed.message()));
    return;
  }
  for (const std::string& w : chosen) reserved->insert(w);
}

}  // namespace pipetrain
