// JobManager: choosing what runs where: the queued jobs' turn
// (ScheduleQueued), spare and drained workers, re-planning at a step
// boundary, and the job layout's worker counts (replicas, tensor ranks).
// Contracts: job_manager.h.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/enum_names.h"
#include "common/logging.h"
#include "common/proto_time.h"
#include "common/status_macros.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/job_manager_internal.h"
#include "coordinator/jobs/memory_budget.h"
#include "coordinator/planner/data_parallel_layout.h"

namespace pipetrain {

using job_manager_internal::IsGoneWorker;
using job_manager_internal::MarkedInIncarnation;
using job_manager_internal::NotAmong;

namespace {

// Whether a job runs on CPU workers only (a 3-D tensor job: CanRunLocked).
bool CpuOnly(const ResolvedJobSpec& resolved) { return resolved.tensor_mode == "3d"; }

// Whether `record` may not take spare `worker` (in `incarnation`) now:
// found unfit for it, or it crashed joining it lately (SparesForLocked).
// A template: JobRecord is JobManager's own type.
template <typename JobRecord>
bool KeptOutOf(const JobRecord& record, const std::string& worker, int64_t incarnation,
               absl::Time now) {
  const auto crashed = record.join_crashes.find(worker);
  return MarkedInIncarnation(record.unfit, worker, incarnation) ||
         (crashed != record.join_crashes.end() && now < crashed->second.until);
}

// OneKindPerStageLocked's choice of `need` of `ready`, for a job whose
// stages must each be of one device kind when `one_kind` (`replicas` x
// `ranks` workers a stage); `gpu_kinds` tells which workers are GPUs.
std::optional<std::vector<std::string>> OneKindPerStage(
    const std::vector<std::string>& ready, int need, bool one_kind, int replicas, int ranks,
    absl::FunctionRef<std::vector<bool>(const std::vector<std::string>&)> gpu_kinds) {
  std::vector<std::string> first(ready.begin(), ready.begin() + need);
  if (!one_kind) return first;
  if (need == 0 || need % (replicas * ranks) != 0) return std::nullopt;  // no whole stages
  std::optional<std::vector<size_t>> picked =
      ArrangeByDeviceKind(gpu_kinds(ready), replicas, need / (replicas * ranks), ranks);
  if (!picked.has_value()) return std::nullopt;
  std::vector<std::string> out;
  for (size_t i : *picked) out.push_back(ready[i]);
  return out;
}

// What a QUEUED job left short keeps of `ready` (the READY workers it can
// run on, in order; `ready_gpu` their kinds) when it needs `stages` stages
// of `per_stage` workers, each stage of one kind: of the counts of GPU
// stages that the cluster's workers it can run on, busy ones included
// (kinds `live_gpu`), could fill, the one that keeps the most of `ready`
// (of equals, the fewest GPU stages); of each kind, the first up to its
// stages' places. Kept as the first `need` by id, a job only GPUs could
// hold kept CPUs, and the GPUs it waited for went to later jobs. Empty
// when no count could be filled.
std::vector<std::string> KeptForStagesOfOneKind(const std::vector<std::string>& ready,
                                                const std::vector<bool>& ready_gpu,
                                                const std::vector<bool>& live_gpu, int stages,
                                                int per_stage) {
  const int ready_gpus = std::count(ready_gpu.begin(), ready_gpu.end(), true);
  const int live_gpus = std::count(live_gpu.begin(), live_gpu.end(), true);
  const int ready_cpus = static_cast<int>(ready_gpu.size()) - ready_gpus;
  const int live_cpus = static_cast<int>(live_gpu.size()) - live_gpus;
  int best = -1, gpus = 0, cpus = 0;
  for (int gpu_stages = 0; gpu_stages <= stages; ++gpu_stages) {
    const int gpu_places = gpu_stages * per_stage, cpu_places = (stages - gpu_stages) * per_stage;
    if (gpu_places > live_gpus || cpu_places > live_cpus) continue;
    const int kept_gpus = std::min(ready_gpus, gpu_places);
    const int kept_cpus = std::min(ready_cpus, cpu_places);
    if (kept_gpus + kept_cpus > best) {
      best = kept_gpus + kept_cpus;
      gpus = kept_gpus;
      cpus = kept_cpus;
    }
  }
  std::vector<std::string> kept;
  for (size_t i = 0; i < ready.size(); ++i) {
    int& left = ready_gpu[i] ? gpus : cpus;
    if (left > 0) {
      kept.push_back(ready[i]);
      --left;
    }
  }
  return kept;
}

}  // namespace

// The registry's workers as one scheduling pass (ScheduleQueued) read
// them: a List and a ReadyWorkers, once. Every queued job read them all
// again (a ReadyWorkers and a Get for each READY worker's drain,
// SpareWorkersLocked; as much again for its reason's held count,
// HeldReadyLocked; a Get each for a CPU-only job's kinds): with 256 jobs
// queued on 4,096 workers, about a million record copies a pass, under the
// jobs lock every running job's progress report waits on. Every recovering
// job read them again too (TryReplanLocked: a ReadyWorkers, its spares as
// a queued job does, and every other recovering job's, asking whether one
// waits for them, NoJobWaitsForSparesLocked): with 20 jobs recovering
// beside 500 idle workers, about 680,000 record copies a pass. A placement
// (a queued job's or a recovery's) reads the workers it takes again before
// and after (ReadAgainLocked): other changes meanwhile (a worker lost, or
// one that became READY) are the next pass's, but one no longer spare is
// not placed (Assign asks only for READY: a worker drained or stopping a
// job since would be).
class JobManager::PassWorkers {
 public:
  // `all`: the registry's List(); `ready`: its ReadyWorkers(); `drained`:
  // JobManager::IsDrainedLocked.
  PassWorkers(const std::vector<v1::Worker>& all, const std::vector<std::string>& ready,
              absl::FunctionRef<bool(const v1::Worker&)> drained) {
    const std::set<std::string> listed_ready(ready.begin(), ready.end());
    workers_.reserve(all.size());
    for (const v1::Worker& w : all) {
      index_[w.id()] = workers_.size();
      workers_.push_back(Worker{w.id()});
      Set(workers_.back(), w, listed_ready.count(w.id()) > 0, drained(w));
    }
  }

  // SpareWorkersLocked(reserved), of those only the CPU workers for a
  // CPU-only job (ThatCanRunLocked).
  std::vector<std::string> Spare(const std::set<std::string>& reserved, bool cpu_only) const {
    std::vector<std::string> spare;
    for (const Worker& w : workers_) {
      if (IsSpare(w) && Runs(&w, cpu_only) && reserved.count(w.id) == 0) spare.push_back(w.id);
    }
    return spare;
  }
  // HeldReadyLocked: of `reserved`, those READY and not drained that a job
  // (CPU only or not) could run on, less those in `counted`.
  size_t HeldReady(const std::set<std::string>& reserved, bool cpu_only,
                   const std::vector<std::string>& counted = {}) const {
    size_t held = 0;
    for (const std::string& id : reserved) {
      const Worker* w = Find(id);
      if (w != nullptr && IsSpare(*w) && Runs(w, cpu_only) &&
          std::find(counted.begin(), counted.end(), id) == counted.end()) {
        ++held;
      }
    }
    return held;
  }
  // DrainedReadyLocked: those READY but drained.
  size_t DrainedReady() const {
    return std::count_if(workers_.begin(), workers_.end(),
                         [](const Worker& w) { return w.ready && w.drained; });
  }
  // READY (stopping its last job or not) or ASSIGNED, and not drained.
  std::vector<std::string> Live() const {
    std::vector<std::string> live;
    for (const Worker& w : workers_) {
      if (w.up && !w.drained) live.push_back(w.id);
    }
    return live;
  }
  // ThatCanRunLocked: `ids` less those a CPU-only job cannot run on.
  std::vector<std::string> ThatRun(std::vector<std::string> ids, bool cpu_only) const {
    ids.erase(std::remove_if(ids.begin(), ids.end(),
                             [&](const std::string& id) { return !Runs(Find(id), cpu_only); }),
              ids.end());
    return ids;
  }
  // GpuKindsLocked: one unknown when read counts as a CPU.
  std::vector<bool> GpuKinds(const std::vector<std::string>& ids) const {
    std::vector<bool> gpu;
    gpu.reserve(ids.size());
    for (const std::string& id : ids) {
      const Worker* w = Find(id);
      gpu.push_back(w != nullptr && w->gpu);
    }
    return gpu;
  }
  // IncarnationOf: 0 for one unknown when read.
  int64_t Incarnation(const std::string& id) const {
    const Worker* w = Find(id);
    return w == nullptr ? 0 : w->incarnation;
  }
  // Among ReadyWorkers: READY and not stopping its last job.
  bool Ready(const std::string& id) const {
    const Worker* w = Find(id);
    return w != nullptr && w->ready;
  }
  // IsGoneWorker: unknown when read, LOST or LEFT.
  bool Gone(const std::string& id) const {
    const Worker* w = Find(id);
    return w == nullptr || !w->known || w->gone;
  }
  // `id` as the registry answers for it now (`drained` by IsDrainedLocked),
  // read again for a placement: READY still only if it was, and if its
  // record shows no stop of a job under way (ReadyWorkers leaves such a
  // worker out; a late heartbeat may say so after the pass read it).
  // Whether it is spare still.
  bool Update(const std::string& id, const absl::StatusOr<v1::Worker>& now, bool drained) {
    const auto it = index_.find(id);
    if (it == index_.end()) return false;  // not one the pass offered
    Worker& w = workers_[it->second];
    if (now.ok()) {
      Set(w, *now,
          w.ready && now->state() == v1::WORKER_STATE_READY &&
              !absl::StartsWith(now->current_instruction(), "stopping job "),
          drained);
    } else {
      w = Worker{id};
    }
    return IsSpare(w);
  }

 private:
  struct Worker {
    std::string id;
    bool known = false;  // registered when read
    int64_t incarnation = 0;
    bool gpu = false;
    bool ready = false;  // among ReadyWorkers: READY, not stopping its last job
    bool up = false;     // READY or ASSIGNED
    bool gone = false;   // LOST or LEFT
    bool drained = false;
  };

  static void Set(Worker& w, const v1::Worker& info, bool ready, bool drained) {
    w.known = true;
    w.incarnation = info.incarnation();
    w.gpu = !info.device().gpu_model().empty();
    w.ready = ready;
    w.up = info.state() == v1::WORKER_STATE_READY || info.state() == v1::WORKER_STATE_ASSIGNED;
    w.gone = info.state() == v1::WORKER_STATE_LOST || info.state() == v1::WORKER_STATE_LEFT;
    w.drained = drained;
  }
  static bool IsSpare(const Worker& w) { return w.ready && !w.drained; }
  // CanRunLocked: a CPU-only job runs only on a worker known to have no GPU.
  static bool Runs(const Worker* w, bool cpu_only) {
    return !cpu_only || (w != nullptr && w->known && !w->gpu);
  }
  const Worker* Find(const std::string& id) const {
    const auto it = index_.find(id);
    return it == index_.end() ? nullptr : &workers_[it->second];
  }

  std::vector<Worker> workers_;  // in the registry's order (by id number)
  absl::flat_hash_map<std::string, size_t> index_;
};

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
  RetryDeletesLocked();
  RetryManifestsLocked();
  RetryExpiringLocked();
  SettleSubmitsLocked();
  SweepStoppedJobsLocked();
  CancelAbandonedProfilesLocked();
  const absl::Time now = elapsed_clock_->Now();
  // Recovering jobs first: they ran already, and hold on to their workers.
  // Every one's survivors are reserved before any re-plans (reserved only
  // on its turn, a later job's were an earlier one's spares), and so are
  // the workers profiling a job (an earlier queued job took them).
  std::set<std::string> reserved = HeldWorkersLocked();
  // The workers as the whole pass sees them (PassWorkers), read once when a
  // job first needs them; the re-plans below read them from it, and read
  // the workers they place again into it.
  std::optional<PassWorkers> pass_workers;
  const auto workers = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!pass_workers.has_value()) {
      pass_workers.emplace(registry_->List(), registry_->ReadyWorkers(),
                           [&](const v1::Worker& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                             return IsDrainedLocked(w);
                           });
    }
    return &*pass_workers;
  };
  for (const std::string& id : order_) {
    JobRecord& record = *jobs_.at(id);
    if (record.job.state() == v1::JOB_STATE_RECOVERING) {
      TryReplanLocked(record, &reserved, workers());
    }
  }
  // One still recovering waits for workers (too few for its minimum, a
  // plan with more memory, survivors to be heard from): the spares it
  // could use are its own (NoJobWaitsForSparesLocked), not a queued job's.
  // Taken by a later job one by one as they registered, they left it
  // waiting until its queue timeout failed it.
  for (const std::string& id : order_) {
    const JobRecord& record = *jobs_.at(id);
    if (record.job.state() != v1::JOB_STATE_RECOVERING) continue;
    for (std::string& w :
         OfItsKindsLocked(record, SparesForLocked(record, reserved, workers()), workers())) {
      reserved.insert(std::move(w));
    }
  }
  // A job being profiled is being placed: the worker it profiles on stays
  // READY meanwhile, so later jobs wait rather than take it (and say so).
  std::string profiling;
  // Aging: later jobs that fit go first (backfill), so a stream of small
  // jobs kept a large one short until its queue timeout failed it, though
  // the cluster holds it. The first QUEUED job left short that has waited
  // past half its spec.scheduling.queue_timeout, and that the cluster's
  // workers could hold once the busy ones are freed (one they never could
  // would hold workers from everyone until it fails), keeps the READY
  // workers it could use, up to its need, for this pass: later jobs
  // backfill only onto the others, and it runs once enough are freed.
  std::string aged;
  std::vector<std::string> held_for_aged;
  // OneKindPerStageLocked, of what the pass read.
  const auto one_kind_per_stage = [&](const JobRecord& record, const std::vector<std::string>& set,
                                      int need) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return OneKindPerStage(
        set, need, StagesOfOneKind(record), Replicas(record), TensorRanks(record),
        [&](const std::vector<std::string>& ids) { return workers()->GpuKinds(ids); });
  };
  // The cluster's workers `record` can run on, READY or busy and not
  // drained: listed once a pass, when a job first waited that long.
  std::optional<std::vector<std::string>> live;
  const auto live_for = [&](const JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!live.has_value()) live = workers()->Live();
    return workers()->ThatRun(*live, CpuOnly(record.resolved));
  };
  const auto cluster_could_hold = [&](const JobRecord& record, int need)
                                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const std::vector<std::string> usable = live_for(record);
    return static_cast<int>(usable.size()) >= need &&
           one_kind_per_stage(record, usable, need).has_value();
  };
  // The READY workers the aged job keeps: of `ready` (those it can run on,
  // holding no set), up to `need`; with stages each of one kind, those of
  // the kinds it could run on once the busy ones are freed
  // (KeptForStagesOfOneKind), not the first `need` by id.
  const auto kept_for_aged = [&](const JobRecord& record, int need,
                                 const std::vector<std::string>& ready)
                                 ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!StagesOfOneKind(record)) {
      return std::vector<std::string>(ready.begin(),
                                      ready.begin() + std::min<size_t>(need, ready.size()));
    }
    const int per_stage = WorkersPerStage(record);
    return KeptForStagesOfOneKind(ready, workers()->GpuKinds(ready),
                                  workers()->GpuKinds(live_for(record)), need / per_stage,
                                  per_stage);
  };
  // Every queued job's spares (SpareWorkersLocked(reserved), those it can
  // run on) and the READY workers held from it (HeldReadyLocked): the same
  // for each job CPU-only or not, as `reserved` stays as it is until the
  // queued jobs are placed. Listed once for them all (by CpuOnly), and
  // again after a placement.
  std::map<bool, std::pair<std::vector<std::string>, size_t>> offered;
  const auto offer = [&](const JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const bool cpu_only = CpuOnly(record.resolved);
    auto it = offered.find(cpu_only);
    if (it == offered.end()) {
      const PassWorkers* read = workers();
      it = offered
               .emplace(cpu_only, std::make_pair(read->Spare(reserved, cpu_only),
                                                 read->HeldReady(reserved, cpu_only)))
               .first;
    }
    return &it->second;
  };
  for (const std::string& id : order_) {
    JobRecord& record = *jobs_.at(id);
    if (record.job.state() == v1::JOB_STATE_PROFILING && profiling.empty()) profiling = id;
    if (record.job.state() != v1::JOB_STATE_QUEUED) continue;
    std::vector<std::string> ready = NotAmong(offer(record)->first, held_for_aged);
    const int need = JobWorkers(record.resolved);
    // Enough of them, the set it is placed on: each stage of one kind
    // where replicas or tensor ranks must be (the first READY workers in id
    // order could mix GPUs and CPUs, and its planning failed the job for
    // good while enough of one kind were READY).
    std::optional<std::vector<std::string>> placed_on;
    if (static_cast<int>(ready.size()) >= need) {
      if (record.place_by_memory) ready = RoomiestFirstLocked(std::move(ready), need);
      placed_on = one_kind_per_stage(record, ready, need);
    }
    // Short of workers past its queue timeout: failed, whether or not
    // another job is being profiled meanwhile (a profile takes up to a
    // few minutes, and would not give this one more workers).
    if (!placed_on.has_value()) {
      const bool cpu_only = CpuOnly(record.resolved);
      const size_t aged_holds = workers()->ThatRun(held_for_aged, cpu_only).size();
      const std::string waiting =
          static_cast<int>(ready.size()) >= need
              ? WaitingForKinds(record, need, absl::StrCat(ready.size(), " READY"))
              : absl::StrCat("waiting for ", need,
                             cpu_only ? " READY CPU workers (" : " READY workers (",
                             ReadyCount(ready.size(), offer(record)->second,
                                        workers()->DrainedReady()),
                             aged_holds == 0
                                 ? ""
                                 : absl::StrCat("; ", aged_holds, " more READY but held for job ",
                                                aged, ", queued past half its queue timeout"),
                             cpu_only ? "; spec.parallelism.tensor_mode 3d runs on the CPU "
                                        "backend only)"
                                      : ")");
      const absl::Duration waited = now - record.queued_since;
      if (waited > record.resolved.queue_timeout && now >= record.restart_grace_until) {
        EndLocked(record, v1::JOB_STATE_FAILED,
                  absl::StrCat("not placed within spec.scheduling.queue_timeout (",
                               absl::FormatDuration(record.resolved.queue_timeout), "): ", waiting,
                               "; add workers or ask for fewer stages"));
        continue;
      }
      if (aged.empty() && waited > record.resolved.queue_timeout / 2 &&
          cluster_could_hold(record, need)) {
        aged = id;
        held_for_aged = kept_for_aged(record, need, ready);
      }
      if (profiling.empty()) {
        record.job.set_reason(waiting);
        continue;  // later jobs that fit the READY workers go first (backfill)
      }
    }
    if (!profiling.empty()) {
      record.job.set_reason(
          absl::StrCat("waiting while job ", profiling, " is profiled (", ready.size(), " ready)"));
      continue;
    }
    ready = *std::move(placed_on);
    // Read again first, only those it takes: one drained (registered again
    // as a drained process), stopping a job or gone since the pass read it
    // is not placed, and the next pass chooses again.
    const std::string changed = ReadAgainLocked(ready, *workers());
    if (!changed.empty()) {
      offered.clear();
      record.job.set_reason(absl::StrCat("waiting to be placed: ", changed));
      continue;
    }
    absl::Status started = StartLocked(record, ready);
    // Those it took are ASSIGNED now (or one was found gone): read again,
    // and the spares listed again for the jobs after it.
    ReadAgainLocked(ready, *workers());
    offered.clear();
    if (!started.ok()) {
      // A worker counted READY above changed since (lost, or gone): none
      // was assigned, and the next pass counts again.
      record.job.set_reason(absl::StrCat("waiting to be placed: ", started.message()));
      continue;
    }
    if (record.job.state() == v1::JOB_STATE_PROFILING) profiling = id;  // later jobs wait for it
  }
  if (!profiling.empty()) return;
  reserved.insert(held_for_aged.begin(), held_for_aged.end());
  // Spare workers grow running elastic jobs, those no job waits for: a
  // QUEUED job holds the spares it can run on (every one, or the CPU
  // workers of a CPU-only job), and growth takes the rest. Asked whether
  // any queued job could run on a spare, a 3-D tensor job short of CPU
  // workers with two idle kept an idle GPU from elastic GPU jobs.
  std::set<bool> queued_kinds;  // CpuOnly of each QUEUED job
  for (const std::string& id : order_) {
    const JobRecord& record = *jobs_.at(id);
    if (record.job.state() == v1::JOB_STATE_QUEUED) queued_kinds.insert(CpuOnly(record.resolved));
  }
  for (const bool cpu_only : queued_kinds) {
    for (std::string& w : workers()->Spare(reserved, cpu_only)) reserved.insert(std::move(w));
  }
  // NoJobWaitsForSparesLocked, of what the pass read: asked of the registry
  // as it is now, a worker READY since the pass read it (registered, or
  // its stop done) is in no reservation, and a queued job that could run
  // on it stopped all growth for the pass. A QUEUED job holds every spare
  // it can run on by now (above).
  for (const std::string& id : order_) {
    const JobRecord& record = *jobs_.at(id);
    const v1::JobState state = record.job.state();
    // A job being planned may yet go back to waiting (a worker lost).
    if (state == v1::JOB_STATE_PROFILING || state == v1::JOB_STATE_PLANNING) return;
    if (state != v1::JOB_STATE_RECOVERING) continue;
    const std::vector<std::string> spare = SparesForLocked(record, reserved, workers());
    if (!spare.empty() && !OfItsKindsLocked(record, spare, workers()).empty()) return;
  }
  for (const std::string& id : order_) {
    JobRecord& record = *jobs_.at(id);
    if (record.job.state() != v1::JOB_STATE_RUNNING || record.checkpoints == nullptr ||
        record.stop_at > 0 || record.job.worker_ids_size() >= MaxJobWorkers(record)) {
      continue;
    }
    // Not while its checkpoints fail (none complete since): the boundary's
    // checkpoint would most likely fail too, and its recovery rewind the
    // job to its last complete one (or step 0), thousands of steps, then
    // fail it after 3 such spares. Without the spare it trains on, as a
    // job whose writes fail does.
    if (record.job.progress().checkpoint_failures() > 0) continue;
    const std::vector<std::string> spare = SparesForLocked(record, reserved, workers());
    if (spare.empty()) continue;  // another job may take those unfit for this one
    const int current = record.job.worker_ids_size();
    int want = std::min<int>(spare.size(), MaxJobWorkers(record) - current);
    want -= want % WorkerStep(record);  // a stage more for every replica, or none
    // Only as many as a plan would use: an auto layout may have none for
    // the larger count (a prime one, say), and a boundary that re-plans on
    // the same workers would be asked for again, step after step.
    want = std::max(0, UsableWorkers(record, current + want) - current);
    if (want == 0) continue;
    // Its workers first, then the spares: each new stage of one kind where
    // it must be (the first spares by id could mix a GPU and a CPU; the
    // boundary's plan was refused and they were marked unfit for it).
    std::vector<std::string> candidates(record.job.worker_ids().begin(),
                                        record.job.worker_ids().end());
    candidates.insert(candidates.end(), spare.begin(), spare.end());
    const std::vector<std::string> grown =
        UsableSetLocked(record, candidates, current + want, workers());
    const std::vector<std::string> joining = NotAmong(grown, record.job.worker_ids());
    // None, or a set without one of its workers: it keeps its plan.
    if (joining.empty() || grown.size() != current + joining.size()) continue;
    if (RequestBoundaryLocked(record, absl::StrCat(absl::StrJoin(joining, ", "), " joined"))) {
      for (const std::string& w : joining) reserved.insert(w);
      record.boundary_joiners = joining;
      record.boundary_held = joining;
    }
  }
}

std::string JobManager::ReadAgainLocked(const std::vector<std::string>& workers,
                                        PassWorkers& pass) const {
  std::vector<std::string> changed;
  for (const std::string& w : workers) {
    const absl::StatusOr<v1::Worker> info = registry_->Get(w);
    if (!pass.Update(w, info, info.ok() && IsDrainedLocked(*info))) changed.push_back(w);
  }
  if (changed.empty()) return "";
  return absl::StrCat(absl::StrJoin(changed, ", "), changed.size() == 1 ? " is" : " are",
                      " no longer spare (drained, stopping a job or gone since it was counted)");
}

bool JobManager::ReadyInPass(const PassWorkers& pass, const std::string& worker) {
  return pass.Ready(worker);
}

std::optional<std::vector<std::string>> JobManager::OneKindPerStageLocked(
    const JobRecord& record, const std::vector<std::string>& ready, int need) const {
  return OneKindPerStage(ready, need, StagesOfOneKind(record), Replicas(record),
                         TensorRanks(record),
                         [this](const std::vector<std::string>& ids)
                             ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return GpuKindsLocked(ids); });
}

std::vector<std::string> JobManager::UsableSetLocked(const JobRecord& record,
                                                     const std::vector<std::string>& candidates,
                                                     int most, const PassWorkers* pass) const {
  int count = UsableWorkers(record, std::clamp<int>(most, 0, candidates.size()));
  if (!StagesOfOneKind(record)) return {candidates.begin(), candidates.begin() + count};
  const std::vector<bool> gpu = GpuKindsLocked(candidates, pass);
  for (; count > 0; count -= WorkersPerStage(record)) {
    std::optional<std::vector<size_t>> picked = ArrangeByDeviceKind(
        gpu, Replicas(record), count / WorkersPerStage(record), TensorRanks(record));
    if (!picked.has_value()) continue;
    std::sort(picked->begin(), picked->end());  // back in their order of preference
    std::vector<std::string> set;
    for (size_t i : *picked) set.push_back(candidates[i]);
    return set;
  }
  return {};
}

std::vector<std::string> JobManager::OfItsKindsLocked(const JobRecord& record,
                                                      std::vector<std::string> spares,
                                                      const PassWorkers* pass) const {
  if (!StagesOfOneKind(record)) return spares;
  // A recovering job's survivors gone since (not its own any more) still
  // say which kinds it runs on: with every survivor gone, spares of any
  // kind would count.
  std::vector<std::string> workers = OwnWorkersLocked(record, pass);
  if (workers.empty() && record.job.state() == v1::JOB_STATE_RECOVERING) {
    workers = record.survivors;
    if (workers.empty())
      workers.assign(record.job.worker_ids().begin(), record.job.worker_ids().end());
  }
  const std::vector<bool> own = GpuKindsLocked(workers, pass);
  if (own.empty()) return spares;  // no worker left to say which
  const std::set<bool> kinds(own.begin(), own.end());
  const std::vector<bool> gpu = GpuKindsLocked(spares, pass);
  std::vector<std::string> kept;
  for (size_t i = 0; i < spares.size(); ++i) {
    if (kinds.count(gpu[i]) > 0) kept.push_back(std::move(spares[i]));
  }
  return kept;
}

std::vector<bool> JobManager::GpuKindsLocked(const std::vector<std::string>& workers,
                                             const PassWorkers* pass) const {
  if (pass != nullptr) return pass->GpuKinds(workers);
  std::vector<bool> gpu;
  for (const std::string& w : workers) {
    absl::StatusOr<v1::Worker> info = registry_->Get(w);
    gpu.push_back(info.ok() && !info->device().gpu_model().empty());
  }
  return gpu;
}

std::vector<std::string> JobManager::RoomiestFirstLocked(
    std::vector<std::string> workers, int need, const std::vector<std::string>& beside) const {
  const auto infos_of = [this](const std::vector<std::string>& ids) {
    std::vector<v1::Worker> infos;
    for (const std::string& w : ids) {
      absl::StatusOr<v1::Worker> info = registry_->Get(w);
      // One gone since it was counted: last (StartLocked then finds it
      // gone), as a budget of one byte (an empty one would read as
      // unlimited).
      if (!info.ok()) {
        info = v1::Worker();
        info->mutable_device()->set_memory_bytes(1);
      }
      infos.push_back(*std::move(info));
    }
    return infos;
  };
  std::vector<std::string> ordered;
  std::vector<bool> taken(workers.size(), false);
  for (size_t i : RoomiestWorkers(infos_of(workers), need, infos_of(beside),
                                  options_.gpu_memory_reserve_bytes)) {
    ordered.push_back(workers[i]);
    taken[i] = true;
  }
  for (size_t i = 0; i < workers.size(); ++i) {
    if (!taken[i]) ordered.push_back(std::move(workers[i]));
  }
  return ordered;
}

size_t JobManager::DrainedReadyLocked(const PassWorkers* pass) const {
  if (pass != nullptr) return pass->DrainedReady();
  size_t drained = 0;
  for (const std::string& w : registry_->ReadyWorkers()) drained += IsDrainedLocked(w) ? 1 : 0;
  return drained;
}

std::string JobManager::ReadyCount(size_t ready, size_t held, size_t drained) {
  // Held and drained workers stay READY (`pipetrain workers` lists them so)
  // but are not placed: counted apart, a job waiting beside them says why.
  std::string count = absl::StrCat(ready, " ready");
  if (held > 0) {
    absl::StrAppend(&count, "; ", held,
                    " more READY but held for another job's profiling, recovery or step boundary");
  }
  if (drained > 0) {
    absl::StrAppend(&count, "; ", drained,
                    " more READY but drained, taking no job until restarted");
  }
  return count;
}

size_t JobManager::HeldReadyLocked(const JobRecord& record, const std::set<std::string>& reserved,
                                   const std::vector<std::string>& counted,
                                   const PassWorkers* pass) const {
  if (pass != nullptr) return pass->HeldReady(reserved, CpuOnly(record.resolved), counted);
  size_t held = 0;
  for (const std::string& w : ThatCanRunLocked(record, SpareWorkersLocked({}))) {
    if (reserved.count(w) > 0 && std::find(counted.begin(), counted.end(), w) == counted.end()) {
      ++held;
    }
  }
  return held;
}

JobManager::JobRecord* JobManager::RecoveringJobOfLocked(const std::string& worker_id) {
  for (const auto& [id, record] : jobs_) {
    if (record->job.state() == v1::JOB_STATE_RECOVERING &&
        std::count(record->survivors.begin(), record->survivors.end(), worker_id) > 0 &&
        !IsLostLocked(*record, worker_id)) {
      return record.get();
    }
  }
  return nullptr;
}

std::set<std::string> JobManager::HeldWorkersLocked() const {
  std::set<std::string> held;
  for (const auto& [id, record] : jobs_) {
    if (record->job.state() == v1::JOB_STATE_RECOVERING) {
      held.insert(record->survivors.begin(), record->survivors.end());
    }
    // Until its fetch returns, even once the job ended: a job placed on it
    // would train beside the measurement, skewing the profile (which is
    // then not kept), and slow itself down.
    if (record->profile_in_flight && !record->profiling_on.empty()) {
      held.insert(record->profiling_on);
    }
    if (HoldsSparesLocked(*record)) {
      held.insert(record->boundary_held.begin(), record->boundary_held.end());
    }
  }
  return held;
}

bool JobManager::HoldsSparesLocked(const JobRecord& record) {
  return (record.job.state() == v1::JOB_STATE_RUNNING && record.stop_at > 0) ||
         (record.job.state() == v1::JOB_STATE_PLANNING && record.pending.has_value());
}

JobManager::JobRecord* JobManager::BoundaryHolderOfLocked(const std::string& worker_id) {
  for (const auto& [id, record] : jobs_) {
    if (HoldsSparesLocked(*record) &&
        std::count(record->boundary_held.begin(), record->boundary_held.end(), worker_id) > 0) {
      return record.get();
    }
  }
  return nullptr;
}

std::vector<std::string> JobManager::OwnSparesLocked(const JobRecord& record) const {
  std::set<std::string> reserved = HeldWorkersLocked();
  // Its own holds count only while its boundary or placement is pending:
  // after it, the list is stale and those workers may be another job's.
  const bool holding = HoldsSparesLocked(record);
  if (holding) {
    for (const std::string& w : record.boundary_held) reserved.erase(w);
  }
  std::vector<std::string> spares = OfItsKindsLocked(record, SparesForLocked(record, reserved));
  if (holding) {
    std::stable_partition(spares.begin(), spares.end(), [&](const std::string& w) {
      return std::count(record.boundary_held.begin(), record.boundary_held.end(), w) > 0;
    });
  }
  return spares;
}

void JobManager::HoldBoundarySparesLocked(JobRecord& record) {
  if (!HoldsSparesLocked(record)) return;
  std::vector<std::string> candidates;  // those staying, then the spares
  for (const std::string& w : OwnWorkersLocked(record)) {
    if (!IsDrainedLocked(w)) candidates.push_back(w);
  }
  const int min = MinJobWorkers(record);
  const bool staying_enough =
      static_cast<int>(UsableSetLocked(record, candidates, min).size()) >= min;
  const std::vector<std::string> spares = OwnSparesLocked(record);
  candidates.insert(candidates.end(), spares.begin(), spares.end());
  // The spares a plan of its minimum would take beside those staying,
  // arranged by device kind (the first ones by count held a CPU for a GPU
  // stage's place). Too few even with every spare: the boundary's re-plan
  // waits for workers as a recovery does; those there are held all the
  // same.
  const std::vector<std::string> usable =
      staying_enough ? std::vector<std::string>() : UsableSetLocked(record, candidates, min);
  const bool enough = static_cast<int>(usable.size()) >= min;
  std::vector<std::string> held;
  for (const std::string& w : spares) {
    const bool joiner =
        std::count(record.boundary_joiners.begin(), record.boundary_joiners.end(), w) > 0;
    const bool needed =
        !staying_enough && (!enough || std::count(usable.begin(), usable.end(), w) > 0);
    if (joiner || needed) held.push_back(w);
  }
  record.boundary_held = std::move(held);
}

JobManager::JobRecord* JobManager::RecoveryCountingOnLocked(const std::string& worker_id) {
  for (const auto& [id, record] : jobs_) {
    if (record->job.state() != v1::JOB_STATE_RECOVERING || record->checkpoints == nullptr) continue;
    const int min = MinJobWorkers(*record);
    if (UsableWorkersLeftLocked(*record, "") >= min &&
        UsableWorkersLeftLocked(*record, worker_id) < min) {
      return record.get();
    }
  }
  return nullptr;
}

std::vector<std::string> JobManager::OwnWorkersLocked(const JobRecord& record,
                                                      const PassWorkers* pass) const {
  // Being planned, the job's workers are the placement's; recovering,
  // its survivors not lost.
  std::vector<std::string> workers;
  if (record.pending.has_value()) {
    workers = record.pending->workers;
  } else if (record.job.state() == v1::JOB_STATE_RECOVERING) {
    // Not one gone since (LOST or LEFT once released, no loss names it for
    // the job) past a restart's grace: the re-plan leaves it out too
    // (TryReplanLocked), and a drain counting on it left the job short.
    const bool in_grace = elapsed_clock_->Now() < record.restart_grace_until;
    for (const std::string& w : record.survivors) {
      if (IsLostLocked(record, w)) continue;
      if (!in_grace && (pass != nullptr ? pass->Gone(w) : IsGoneWorker(registry_->Get(w)))) {
        continue;
      }
      workers.push_back(w);
    }
  } else {
    workers.assign(record.job.worker_ids().begin(), record.job.worker_ids().end());
  }
  return workers;
}

int JobManager::UsableWorkersLeftLocked(const JobRecord& record, const std::string& without) const {
  // Those drained already leave at the same boundary: not counted as
  // staying.
  const auto stays = [&](const std::string& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return w != without && !IsDrainedLocked(w);
  };
  std::vector<std::string> staying;
  for (const std::string& w : OwnWorkersLocked(record)) {
    if (stays(w)) staying.push_back(w);
  }
  // Survivors of recovering jobs, this one's among them (READY, released),
  // profiling workers and other jobs' boundary spares are not its spares.
  for (const std::string& w : OwnSparesLocked(record)) {
    if (stays(w)) staying.push_back(w);
  }
  return static_cast<int>(UsableSetLocked(record, staying, MaxJobWorkers(record)).size());
}

bool JobManager::CanRunLocked(const JobRecord& record, const std::string& worker) const {
  if (!CpuOnly(record.resolved)) return true;
  absl::StatusOr<v1::Worker> info = registry_->Get(worker);
  return info.ok() && info->device().gpu_model().empty();
}

std::vector<std::string> JobManager::ThatCanRunLocked(const JobRecord& record,
                                                      std::vector<std::string> workers) const {
  workers.erase(std::remove_if(workers.begin(), workers.end(),
                               [&](const std::string& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                 return !CanRunLocked(record, w);
                               }),
                workers.end());
  return workers;
}

std::vector<std::string> JobManager::SparesForLocked(const JobRecord& record,
                                                     const std::set<std::string>& reserved,
                                                     const PassWorkers* pass) const {
  std::vector<std::string> spare = pass != nullptr
                                       ? pass->Spare(reserved, CpuOnly(record.resolved))
                                       : ThatCanRunLocked(record, SpareWorkersLocked(reserved));
  const absl::Time now = elapsed_clock_->Now();
  spare.erase(std::remove_if(spare.begin(), spare.end(),
                             [&](const std::string& w) {
                               return KeptOutOf(record, w, IncarnationOf(w, pass), now);
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

int64_t JobManager::IncarnationOf(const std::string& worker_id, const PassWorkers* pass) const {
  if (pass != nullptr) return pass->Incarnation(worker_id);
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

bool JobManager::IsDrainedLocked(const v1::Worker& worker) const { return IsDrained(worker); }

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
  record.boundary_joiners.clear();  // a growth boundary names them after
  record.boundary_held.clear();
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

bool JobManager::NoJobWaitsForSparesLocked(const std::set<std::string>& reserved,
                                           const JobRecord* except,
                                           const PassWorkers* pass) const {
  // Listed once for every queued job, not once each (it reads every READY
  // worker's record); whether a job can run on one of them depends only
  // on whether it runs on CPU workers only (CanRunLocked).
  std::optional<std::vector<std::string>> spare;
  std::map<bool, bool> runs_on_one;  // by CpuOnly
  for (const std::string& id : order_) {
    const JobRecord& record = *jobs_.at(id);
    if (&record == except) continue;
    const v1::JobState state = record.job.state();
    // A job being planned may yet go back to waiting (a worker lost).
    if (state == v1::JOB_STATE_PROFILING || state == v1::JOB_STATE_PLANNING) return false;
    // A queued job waits only for spares it can run on: a 3-D tensor job
    // (CPU only) queued for CPU workers kept every elastic GPU job off the
    // idle GPUs for its whole queue timeout. (No OfItsKindsLocked: placed
    // on whichever kind gives it a set, it runs on either.)
    if (state == v1::JOB_STATE_QUEUED) {
      if (!spare.has_value()) {
        spare = pass != nullptr ? pass->Spare(reserved, false) : SpareWorkersLocked(reserved);
      }
      const auto [it, first] = runs_on_one.emplace(CpuOnly(record.resolved), false);
      if (first) {
        it->second = pass != nullptr ? !pass->ThatRun(*spare, CpuOnly(record.resolved)).empty()
                                     : !ThatCanRunLocked(record, *spare).empty();
      }
      if (it->second) return false;
    }
    // A recovering job still here waits for workers (too few for its
    // minimum, or survivors to go idle): spares it could use are its own.
    // Grown into another job, one by one, they left it waiting until its
    // queue timeout failed it.
    if (state == v1::JOB_STATE_RECOVERING &&
        !OfItsKindsLocked(record, SparesForLocked(record, reserved, pass), pass).empty()) {
      return false;
    }
  }
  return true;
}

void JobManager::ReplanAtBoundaryLocked(JobRecord& record) {
  const int64_t step = record.stop_at;
  record.stop_at = 0;  // its own holds are spares to it again
  std::vector<std::string> chosen;
  for (const std::string& w : record.job.worker_ids()) {
    if (!IsDrainedLocked(w)) chosen.push_back(w);
  }
  const std::vector<std::string> old(record.job.worker_ids().begin(),
                                     record.job.worker_ids().end());
  std::set<std::string> reserved = HeldWorkersLocked();
  reserved.insert(old.begin(), old.end());
  // Past its minimum, a job takes only the spares held for this boundary,
  // or those no other job waits for (as ScheduleQueued grows jobs): a
  // drain's boundary took a spare a recovering or queued job was counting
  // on, which then waited until its queue timeout failed it. A QUEUED job
  // waits only for the spares it can run on, as in ScheduleQueued (one
  // job of each tensor mode is asked: CanRunLocked reads no more of it).
  const std::set<std::string> held_for_it(record.boundary_held.begin(), record.boundary_held.end());
  const std::set<std::string> for_queued = SparesForQueuedLocked(reserved);
  std::set<std::string> waited_for = reserved;
  waited_for.insert(for_queued.begin(), for_queued.end());
  const bool may_grow = NoJobWaitsForSparesLocked(waited_for);
  // Those held for it first: below its minimum it takes any, and another
  // spare taken before its own would leave its own idle and a waiting job
  // one short. Then those no queued job can run on: in id order, an idle
  // CPU a queued CPU-only job needed took the place an idle GPU would fill.
  std::vector<std::string> spares = SparesForLocked(record, reserved);
  std::stable_partition(spares.begin(), spares.end(),
                        [&for_queued](const std::string& w) { return for_queued.count(w) == 0; });
  std::stable_partition(spares.begin(), spares.end(),
                        [&held_for_it](const std::string& w) { return held_for_it.count(w) > 0; });
  for (const std::string& w : spares) {
    // By the set a plan could use (arranged by device kind), not the count.
    const bool past_minimum =
        static_cast<int>(UsableSetLocked(record, chosen, MaxJobWorkers(record)).size()) >=
        MinJobWorkers(record);
    if (past_minimum && (!may_grow || for_queued.count(w) > 0) && held_for_it.count(w) == 0) {
      continue;
    }
    chosen.push_back(w);
  }
  chosen = UsableSetLocked(record, chosen, MaxJobWorkers(record));
  // A growth boundary whose joiner was drained or lost before it: the
  // reason says so, rather than naming a join that did not happen.
  for (const std::string& w : record.boundary_joiners) {
    if (std::find(chosen.begin(), chosen.end(), w) != chosen.end()) continue;
    const absl::StatusOr<v1::Worker> info = registry_->Get(w);
    if (IsDrainedLocked(w)) {
      absl::StrAppend(&record.boundary_reason, "; ", w, " drained before the boundary");
    } else if (!info.ok() || info->state() != v1::WORKER_STATE_READY) {
      absl::StrAppend(&record.boundary_reason, "; ", w, " lost before the boundary");
    }
  }
  // Spares it takes that no join named (in a drained worker's place, or a
  // lost joiner's): named too.
  std::vector<std::string> joiners = NotAmong(chosen, old);
  const std::vector<std::string> unnamed = NotAmong(joiners, record.boundary_joiners);
  if (!unnamed.empty() && static_cast<int>(chosen.size()) >= MinJobWorkers(record)) {
    absl::StrAppend(&record.boundary_reason, "; ", absl::StrJoin(unnamed, ", "), " joined");
  }
  record.boundary_joiners.clear();
  record.boundary_held.clear();
  std::vector<std::string> sorted_old = old, sorted_chosen = chosen;
  std::sort(sorted_old.begin(), sorted_old.end());
  std::sort(sorted_chosen.begin(), sorted_chosen.end());
  const std::string reason = record.boundary_reason;
  const std::string same = sorted_old == sorted_chosen ? " on the same workers" : "";
  if (static_cast<int>(chosen.size()) < MinJobWorkers(record)) {
    // A spare went away meanwhile (or those left hold no set whose stages
    // are each of one kind): wait for workers as a recovery does.
    return StartRecoveryLocked(record, "", reason, RecoveryKind::kWorkerLost);
  }
  // Those the new plan leaves out stop now: once released, another job may
  // take them before this plan is in.
  for (const std::string& w : NotAmong(old, chosen)) StopWorkerLocked(record, w);
  registry_->Release(record.job.id());
  PendingPlacement pending;
  pending.origin = PlacementOrigin::kBoundary;
  pending.resume = *record.checkpoints->Latest();
  pending.reason = absl::StrCat(reason, "; re-planned at step ", step, same);
  pending.failure_prefix = absl::StrCat("re-planning at step ", step, " (", reason, ") failed: ");
  pending.joiners = std::move(joiners);
  absl::Status placed = BeginPlacementLocked(record, chosen, std::move(pending));
  if (!placed.ok()) {
    // A chosen worker went since it was counted: recover as from its loss
    // (the boundary's checkpoint is complete, so nothing is redone).
    return StartRecoveryLocked(
        record, "", absl::StrCat(reason, "; re-planning at step ", step, ": ", placed.message()),
        RecoveryKind::kWorkerLost);
  }
}

std::set<std::string> JobManager::SparesForQueuedLocked(const std::set<std::string>& reserved,
                                                        const PassWorkers* pass) const {
  std::map<std::string, const JobRecord*> queued;  // by tensor mode
  for (const std::string& id : order_) {
    const JobRecord& other = *jobs_.at(id);
    if (other.job.state() == v1::JOB_STATE_QUEUED) {
      queued.emplace(other.resolved.tensor_mode, &other);
    }
  }
  std::vector<std::string> idle;
  if (!queued.empty()) {
    idle = pass != nullptr ? pass->Spare(reserved, false) : SpareWorkersLocked(reserved);
  }
  std::set<std::string> for_queued;
  for (const auto& [mode, other] : queued) {
    for (std::string& w : pass != nullptr ? pass->ThatRun(idle, CpuOnly(other->resolved))
                                          : ThatCanRunLocked(*other, idle)) {
      for_queued.insert(std::move(w));
    }
  }
  return for_queued;
}

bool JobManager::IsDrained(const v1::Worker& worker) const {
  // Registered as a drained process: the registry's record says so from
  // the moment it is READY, so no placement can come first.
  if (worker.drained()) return true;
  AnnotatedMutexLock lock(&drained_mu_);
  return MarkedInIncarnation(drained_, worker.id(), worker.incarnation());
}

absl::StatusOr<v1::Worker> JobManager::Drain(const std::string& worker_id) {
  RETURN_IF_ERROR(CheckIdArgument("worker id", worker_id));
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
  // Idempotent: asked again, nothing more happens (the boundary's reason
  // would otherwise grow with every call, and with it the stored job). So
  // too across a restart: a drain answered UNAVAILABLE ("drain again"), or
  // not answered, that the store recorded is restored with the worker,
  // LOST until its process registers again, and kept then.
  if (IsDrainedLocked(worker)) {
    worker.set_drained(true);
    return worker;
  }
  // A LOST or LEFT incarnation is out of service already, and the drain
  // would not cover the next one (drained_ holds the incarnation): saying
  // "draining" would tell the operator something that is not happening.
  // But one LOST only because this coordinator restored it may be alive:
  // its process registering again keeps a drain of the restored
  // incarnation (WorkerRegistry::MarkDrained), and its recovering job
  // would otherwise take it back at once.
  const bool restored_unheard =
      worker.state() == v1::WORKER_STATE_LOST && registry_->RestoredUnheard(worker_id);
  if ((worker.state() == v1::WORKER_STATE_LOST || worker.state() == v1::WORKER_STATE_LEFT) &&
      !restored_unheard) {
    return absl::FailedPreconditionError(absl::StrCat(
        worker_id, " is ", EnumShortName(worker.state()),
        ": out of service already; a process that registers again under this id is a new "
        "incarnation, which this drain would not cover (drain it once it is READY)"));
  }
  // JOINING: its registration is being saved, and a failed save makes it
  // LOST, after which the process registers again as a new incarnation
  // the drain would not cover. Refused: the operator retries in a moment.
  if (worker.state() == v1::WORKER_STATE_JOINING) {
    return absl::UnavailableError(
        absl::StrCat(worker_id,
                     " is JOINING: its registration is still being recorded; drain it again in a "
                     "moment, once it is READY"));
  }
  // A recovering job released its workers: its survivors have no job in
  // the registry, and were drained without the check below. So has a spare
  // held for a running job's boundary, which a drain may have counted on.
  JobRecord* record =
      worker.job_id().empty() ? RecoveringJobOfLocked(worker_id) : FindLocked(worker.job_id());
  bool held_spare = false, counted_spare = false;
  if (record == nullptr) {
    record = BoundaryHolderOfLocked(worker_id);
    held_spare = record != nullptr;
  }
  if (record == nullptr) {
    record = RecoveryCountingOnLocked(worker_id);
    counted_spare = record != nullptr;
  }
  if (record != nullptr && !IsTerminal(record->job.state())) {
    if (record->checkpoints == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          worker_id, " runs job ", record->job.id(),
          ", which has no checkpoints (spec.checkpoint) to re-plan from; cancel the job or "
          "let it finish first"));
    }
    // As many as the re-plan could use (whole stages, a count with a layout).
    if (UsableWorkersLeftLocked(*record, worker_id) < MinJobWorkers(*record)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "draining ", worker_id, " would leave job ", record->job.id(), " fewer than its ",
          MinJobWorkers(*record), " workers (",
          record->auto_layout_workers > 0 ? "the fewest with a layout of spec.parallelism.workers"
          : TensorRanks(*record) > 1
              ? "spec.elastic.min_workers x spec.parallelism.data x spec.parallelism.tensor"
              : "spec.elastic.min_workers x spec.parallelism.data",
          ")",
          held_spare && record->stop_at == 0
              ? ": it is a spare held for the job, being planned, to take a drained worker's place"
          : held_spare
              ? absl::StrCat(": it is the spare held for the job's re-planning after step ",
                             record->stop_at, " (", record->boundary_reason, ")")
          : counted_spare ? ": it is a spare the recovering job needs to re-plan"
                          : "",
          "; add a worker first"));
    }
  }
  {
    AnnotatedMutexLock drained_lock(&drained_mu_);
    drained_[worker_id] = worker.incarnation();
  }
  PT_LOG(INFO) << "draining " << worker_id;
  // A held spare is not the job's worker: its boundary stays as it is. A
  // job being planned asks its boundary once the plan is in
  // (CommitPlacementLocked).
  if (record != nullptr && !held_spare && record->job.state() == v1::JOB_STATE_RUNNING) {
    if (record->stop_at == 0) {
      RequestBoundaryLocked(*record, absl::StrCat(worker_id, " drained"));
    } else {
      record->boundary_reason += absl::StrCat("; ", worker_id, " drained");
    }
  } else if (record != nullptr && record->job.state() == v1::JOB_STATE_RECOVERING) {
    // Its re-plan leaves the worker out; the plan's reason says why.
    absl::StrAppend(&record->recovery_reason, "; ", worker_id, " drained");
    record->job.set_reason(absl::StrCat("recovering: ", record->recovery_reason));
  }
  // The spares the job now counts on (another in a held spare's place)
  // are held until its boundary; nothing for a recovering job.
  if (record != nullptr) HoldBoundarySparesLocked(*record);
  worker.set_drained(true);
  return worker;
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

std::string JobManager::WaitingForKinds(const JobRecord& record, int need,
                                        const std::string& count) {
  return absl::StrCat("waiting for ", need,
                      " READY workers whose kinds (GPU or CPU) give each stage's ",
                      WorkersPerStage(record), " replicas and tensor ranks one kind (", count,
                      ", in counts that do not)");
}

bool JobManager::StagesOfOneKind(const JobRecord& record) {
  return record.auto_layout_workers == 0 && record.resolved.data_parallel != kDataParallelAuto &&
         WorkersPerStage(record) > 1;
}

}  // namespace pipetrain
