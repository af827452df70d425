// JobManager: profiling a job's model before it is planned (which worker
// profiles, whether it fits, and the reply's checks). Contracts:
// job_manager.h.
#include <algorithm>
#include <memory>
#include <optional>
#include <system_error>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/echo_input.h"
#include "common/enum_names.h"
#include "common/logging.h"
#include "coordinator/jobs/host_gflops.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/jobs/job_manager_internal.h"
#include "coordinator/jobs/memory_budget.h"
#include "coordinator/planner/bipartition.h"
#include "coordinator/planner/solve_plan.h"
#include "worker/model/gpt_config.h"

namespace pipetrain {

using job_manager_internal::ModelSizes;

namespace {

// The model's units' names in order, as a worker's profile names them.
std::vector<std::string> UnitNamesOf(const GptConfig& model) {
  std::vector<std::string> names;
  for (int u = 0; u < NumUnits(model); ++u) names.push_back(UnitName(model, u));
  return names;
}

}  // namespace

ModelProfile job_manager_internal::ModelSizes(const GptConfig& model,
                                              const v1::ProfileRequest& request,
                                              AnalyticAttention attention) {
  return AnalyticProfile(model, request.seq_len(), request.micro_batch_size(),
                         kModelSizesFlopsPerSecond, attention);
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

void JobManager::SetProfileFetcher(ProfileFetcher fetcher, std::function<void()> cancel_all,
                                   std::function<void(const std::string&)> cancel_to) {
  fetcher_ = std::move(fetcher);
  cancel_fetches_ = std::move(cancel_all);
  cancel_fetches_to_ = std::move(cancel_to);
}

void JobManager::CancelAbandonedProfilesLocked() {
  if (!cancel_fetches_to_) return;
  for (auto& [id, record] : jobs_) {
    if (!record->profile_in_flight) continue;
    absl::StatusOr<v1::Worker> profiler = registry_->Get(record->profiling_on);
    const bool profiler_gone = !profiler.ok() || profiler->state() == v1::WORKER_STATE_LOST ||
                               profiler->state() == v1::WORKER_STATE_LEFT;
    // A job that ended meanwhile (cancelled while profiling) throws the
    // profile away: its worker, held until the fetch returns, is freed now
    // rather than after the whole measurement (up to the fetch deadline).
    const bool job_ended = IsTerminal(record->job.state());
    if (!profiler_gone && !job_ended) continue;
    if (!record->profile_cancel_asked) {
      if (profiler_gone) {
        PT_LOG(WARNING) << "job " << id << ": " << record->profiling_on << " was "
                        << (profiler.ok() ? EnumShortName(profiler->state()) : "removed")
                        << " while it profiled the model; its call is cancelled";
      } else {
        PT_LOG(INFO) << "job " << id << " ended while " << record->profiling_on
                     << " profiled its model; the call is cancelled";
      }
      record->profile_cancel_asked = true;
    }
    // Every pass until the fetch returns: a call not in flight at the last
    // one (before its first attempt, between retries) is ended by the next.
    cancel_fetches_to_(record->profiling_address);
  }
}

v1::ProfileRequest JobManager::ProfileRequestFor(const JobRecord& record) const {
  v1::ProfileRequest request;
  *request.mutable_model() = record.resolved.spec.model();
  request.set_seq_len(record.resolved.train.seq_len);
  request.set_micro_batch_size(record.resolved.train.batch_size /
                               record.resolved.train.micro_batches);
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
                                             const std::vector<v1::Worker>& workers) const {
  // Every plan holds each unit's fp32 weights, their gradients and both
  // AdamW moments (BiPartitionCosts::Memory: 4x the weights of a stage's
  // backward units, activations on top), once per replica, less the tied
  // wte's value and moments (3x) where one worker holds both ends of the
  // model; tensor ranks split a unit's share. A bound no plan can beat,
  // from shapes alone.
  const std::vector<double> budgets =
      PlanMemoryBudgets(workers, nullptr, options_.gpu_memory_reserve_bytes);
  double total = 0, largest = 0;
  bool some_unlimited = false;  // then no plan-wide bound: the profiler's own below
  for (double b : budgets) {
    some_unlimited = some_unlimited || b <= 0;
    total += b;
    largest = std::max(largest, b);
  }
  const ModelProfile sizes =
      ModelSizes(record.resolved.train.model, request, AnalyticAttentionOf(workers[0].device()));
  double weights = 0, largest_unit = 0;
  for (const UnitProfile& u : sizes.units) {
    weights += u.weight_bytes;
    largest_unit = std::max(largest_unit, u.weight_bytes);
  }
  const double tied = sizes.units.size() >= 2 ? std::min(sizes.units.front().weight_bytes,
                                                         sizes.units.back().weight_bytes)
                                              : 0.0;
  const double state = 4 * weights - 3 * tied;
  const int replicas = std::max(1, record.resolved.data_parallel);
  const int tensor = record.resolved.tensor_parallel == kTensorParallelAuto
                         ? static_cast<int>(workers.size())
                         : std::max(1, record.resolved.tensor_parallel);
  if (!some_unlimited && state * replicas > total) {
    return absl::StrCat("its weights, their gradients and AdamW moments alone (",
                        BytesAndGiB(state), replicas > 1 ? " per replica" : "",
                        ") exceed the memory of its ", workers.size(), " workers together (",
                        BytesAndGiB(total), ")");
  }
  if (!some_unlimited && 4 * largest_unit / tensor > largest) {
    return absl::StrCat("its largest unit's weights, gradients and AdamW moments (",
                        BytesAndGiB(4 * largest_unit / tensor),
                        ") exceed the memory of its "
                        "roomiest worker (",
                        BytesAndGiB(largest), ")");
  }
  // The profiler runs each unit whole on workers[0]: its weights,
  // gradients and moments, one micro-batch's stash (it frees each pass's
  // before the next), the pass's transient allocations, and the unit's
  // output and output gradient, at once. A worker killed for memory while
  // profiling ends the job's profiling and the worker.
  double pass = 0;
  std::string unit;
  for (const UnitProfile& u : sizes.units) {
    const double need =
        4 * u.weight_bytes + u.stash_bytes + u.transient_bytes + 2 * u.activation_bytes;
    if (need > pass) pass = need, unit = u.name;
  }
  if (budgets[0] > 0 && pass > budgets[0]) {
    return absl::StrCat("profiling its largest unit (", unit, ": ", BytesAndGiB(pass),
                        " for one micro-batch) would exceed the memory of ", workers[0].id(),
                        ", which would profile it (", BytesAndGiB(budgets[0]), ")");
  }
  return "";
}

bool JobManager::ChooseProfileLocked(JobRecord& record, const std::vector<v1::Worker>& placed,
                                     ModelProfile* profile, std::string* source,
                                     double* reference_gflops) {
  // workers[0] profiles: the first placed, or the first of its kind that
  // is not the one worker whose profile of the key ran past the deadline.
  std::vector<v1::Worker> workers = placed;
  const v1::ProfileRequest request = ProfileRequestFor(record);
  const std::string kind = DeviceKind(workers[0].device());
  const std::string key =
      ProfileKey(request, ProfileDeviceKey(workers[0].device(), workers[0].build()));
  std::optional<v1::ModelProfile> cached = profiles_.Get(key);
  // As workers[0] runs attention: the key's device part says the same.
  const AnalyticAttention attention = AnalyticAttentionOf(workers[0].device());
  const ModelProfile sizes = ModelSizes(record.resolved.train.model, request, attention);
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
  if (auto timed_out = profile_timeouts_.find(key);
      timed_out != profile_timeouts_.end() && record.profile_error.empty()) {
    const absl::Duration left = timed_out->second.until - elapsed_clock_->Now();
    const std::string& wedged = timed_out->second.worker;
    const auto other = std::find_if(workers.begin(), workers.end(), [&](const v1::Worker& w) {
      return w.id() != wedged && ProfileDeviceKey(w.device(), w.build()) ==
                                     ProfileDeviceKey(workers[0].device(), workers[0].build());
    });
    if (left > absl::ZeroDuration() && !wedged.empty() && other != workers.end()) {
      std::iter_swap(workers.begin(), other);  // of the same key: `key` holds
    } else if (left > absl::ZeroDuration() && !wedged.empty()) {
      // Not given up: a later job placed with another of the kind tries.
      record.profile_error = absl::StrCat(
          "a profile of this model on ", wedged, " ran past the coordinator's deadline (",
          timed_out->second.error, "), and no other ", kind, " worker of this job's may try it");
    } else if (left > absl::ZeroDuration()) {
      record.profile_error =
          absl::StrCat("an earlier job's profile of this model (on ", kind,
                       ") ran past the coordinator's deadline (", timed_out->second.error,
                       "); not tried again for another ",
                       absl::FormatDuration(absl::Ceil(left, absl::Minutes(1))));
    } else {
      profile_timeouts_.erase(timed_out);
    }
  }
  const std::string unfit = NotProfiledForMemory(record, request, workers);
  if (fetcher_ && record.profile_error.empty() && unfit.empty()) {
    ReapProfilersLocked();
    auto done = std::make_shared<std::atomic<bool>>(false);
    try {
      // FinishProfiling takes mu_, held here until the state below is set.
      std::thread thread([this, id = record.job.id(), key, worker = workers[0].id(),
                          incarnation = workers[0].incarnation(),
                          address = workers[0].data_address(),
                          session = registry_->SessionToken(workers[0].id()).value_or(""), request,
                          done] {
        FinishProfiling(id, key, worker, incarnation, request, fetcher_(address, session, request));
        done->store(true);
      });
      profilers_.push_back({std::move(thread), std::move(done)});
      // PROFILING only once a profiler runs: set before, a job whose thread
      // could not start stayed PROFILING for good when its placement on
      // the analytic profile then failed.
      record.job.set_state(v1::JOB_STATE_PROFILING);
      record.job.set_reason(absl::StrCat("profiling the model on ", workers[0].id()));
      record.profiling_on = workers[0].id();
      record.profiling_address = workers[0].data_address();
      record.profile_cancel_asked = false;
      record.profiling_attention = attention;
      record.profile_in_flight = true;
      TouchLocked(record);
      PT_LOG(INFO) << "job " << record.job.id() << ": profiling on " << workers[0].id();
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
  *profile = AnalyticProfile(t.model, t.seq_len, t.batch_size / t.micro_batches, rate, attention);
  *source = absl::StrCat("analytic: FLOPs at ", rate / 1e9, " GFLOP/s",
                         !unfit.empty() ? absl::StrCat(" (not profiled: ", unfit, ")")
                         : record.profile_error.empty()
                             ? ""
                             : absl::StrCat(" (profiling failed: ", record.profile_error, ")"));
  *reference_gflops = fastest;
  return true;
}

void JobManager::FinishProfiling(const std::string& job_id, const std::string& key,
                                 const std::string& worker, int64_t incarnation,
                                 const v1::ProfileRequest& request,
                                 const absl::StatusOr<v1::ModelProfile>& fetched) {
  {
    AnnotatedMutexLock lock(&mu_);
    JobRecord* record = FindLocked(job_id);
    // A worker's answer is a peer's input: checked against the model before
    // the planner (or the store, for later restarts) sees it. With the job
    // gone there is no model to check it against, and nobody waiting.
    absl::StatusOr<v1::ModelProfile> profile = fetched;
    if (record != nullptr) record->profile_in_flight = false;
    std::string again;  // why the job is to be profiled again, if it is
    if (profile.ok() && record == nullptr) profile = absl::NotFoundError("job gone");
    // A job that ended meanwhile released its hold on the worker only now,
    // but another job may have run beside the measurement before this
    // change, and nobody waits for it: not kept for later jobs.
    if (profile.ok() && IsTerminal(record->job.state())) {
      profile = absl::CancelledError("the job ended while its model was profiled");
    }
    if (profile.ok()) {
      const ModelProfile sizes =
          ModelSizes(record->resolved.train.model, request, record->profiling_attention);
      const absl::Status fit =
          CheckWorkerProfile(*profile, request, UnitNamesOf(record->resolved.train.model), &sizes);
      if (!fit.ok()) profile = fit;
    }
    if (profile.ok()) {
      // Kept for every later job of the model (and stored): the checked
      // fields only.
      profile->DiscardUnknownFields();
      record->profiled_by = worker;
      profile_timeouts_.erase(key);  // a wedged worker's, another measured it
      const std::vector<std::string> evicted = profiles_.Put(key, *profile);
      // Stored on io_, off the lock (a commit waits for the disk or etcd,
      // and every call waits for the lock); in order, so that a later
      // eviction's delete comes after this save. Losing it to a crash
      // costs only a profiling run after the restart.
      if (options_.state != nullptr) {
        io_.Post([this, key, stored = *profile, evicted] {
          absl::Status saved = options_.state->SaveProfile(key, stored);
          if (!saved.ok()) PT_LOG(WARNING) << "profile " << key << " not saved: " << saved;
          DropStoredProfiles(evicted);
        });
      }
    } else if (record != nullptr && !IsTerminal(record->job.state())) {
      // (A job that ended meanwhile needs no profile: its fetch was
      // cancelled, or its result thrown away above.)
      // A worker that left meanwhile (SIGTERM drains it, and its profile is
      // cut short) says nothing about the model: another may profile it.
      // Left as the one asked: by its incarnation, and a call cancelled as
      // it was lost; a process that restarted (or a lease that lapsed and
      // was renewed) is READY again by the time this looks, and its
      // failure planned the job on the analytic profile or not by a race.
      absl::StatusOr<v1::Worker> profiler = registry_->Get(worker);
      const bool left = !profiler.ok() || IsDrainedLocked(*profiler) ||
                        profiler->incarnation() != incarnation || record->profile_cancel_asked ||
                        (profiler->state() != v1::WORKER_STATE_READY &&
                         profiler->state() != v1::WORKER_STATE_ASSIGNED);
      const bool timed_out = profile.status().code() == absl::StatusCode::kDeadlineExceeded;
      auto earlier = profile_timeouts_.find(key);
      const bool first_timeout =
          earlier == profile_timeouts_.end() || earlier->second.until <= elapsed_clock_->Now();
      // Remembered for later jobs of the key; at most kMaxProfileTimeouts
      // keys (the one that expires first goes).
      const auto remember = [&](ProfileTimeout timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (profile_timeouts_.size() >= kMaxProfileTimeouts && !profile_timeouts_.count(key)) {
          profile_timeouts_.erase(std::min_element(
              profile_timeouts_.begin(), profile_timeouts_.end(),
              [](const auto& a, const auto& b) { return a.second.until < b.second.until; }));
        }
        profile_timeouts_[key] = std::move(timeout);
      };
      if (left && ++record->profile_attempts < kMaxProfileAttempts) {
        PT_LOG(WARNING) << "job " << job_id << ": profiling on " << worker
                        << " ended as that worker left (" << profile.status()
                        << "); profiling again on another";
        again = absl::StrCat(worker, " left while it profiled the model");
      } else if (!left && timed_out && first_timeout &&
                 ++record->profile_attempts < kMaxProfileAttempts) {
        // The first past the deadline for the key: that worker may be
        // wedged (a hung device or profiler, while it heartbeats READY)
        // rather than the model too slow to profile. Another of its kind
        // tries (ChooseProfileLocked) before the key is given up. Counted
        // as an attempt: with a deadline past the key's memory (an hour),
        // each timeout was a first again, and the job's workers took turns
        // forever, every later job waiting behind it.
        remember({elapsed_clock_->Now() + kProfileTimeoutMemory,
                  ValidUtf8(profile.status().ToString()), worker});
        PT_LOG(WARNING) << "job " << job_id << ": profiling on " << worker
                        << " ran past the deadline (" << profile.status()
                        << "); profiling again on another worker of its kind";
        again = absl::StrCat(worker, "'s profile of the model ran past the deadline");
      } else {
        // Saved with the job (Plan.profile_source): UTF-8 whatever the
        // fetcher quoted, or the stored job would not parse back.
        record->profile_error = ValidUtf8(profile.status().ToString());
        PT_LOG(WARNING) << "job " << job_id << ": profiling failed: " << profile.status();
        // A second worker past the deadline: the key is given up.
        if (timed_out) {
          remember({elapsed_clock_->Now() + kProfileTimeoutMemory, record->profile_error, ""});
        }
      }
    }
    if (record != nullptr && record->job.state() == v1::JOB_STATE_PROFILING) {
      record->job.set_state(v1::JOB_STATE_QUEUED);
      record->job.set_reason(again.empty() ? "profiled; waiting to be planned"
                                           : absl::StrCat("waiting to be profiled again: ", again));
      TouchLocked(*record);
    }
  }
  ScheduleQueued();
}

void JobManager::DropStoredProfiles(const std::vector<std::string>& keys) {
  if (options_.state == nullptr) return;
  for (const std::string& key : keys) {
    const absl::Status dropped = options_.state->DeleteProfile(key);
    if (!dropped.ok()) PT_LOG(WARNING) << "profile " << key << " not dropped: " << dropped;
  }
}

}  // namespace pipetrain
