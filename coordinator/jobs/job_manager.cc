// JobManager's own life and its queries: construction and shutdown, the
// scheduling loop, Get, List, Cancel and GetPlan, a job's end and the
// pruning of ended jobs, a lost worker. The other concerns of the class
// live beside this file (job_manager_*.cc); its contracts: job_manager.h.
#include "coordinator/jobs/job_manager.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "common/echo_input.h"
#include "common/enum_names.h"
#include "common/logging.h"
#include "common/proto_time.h"
#include "common/status_macros.h"
#include "coordinator/jobs/plan_drawings.h"
#include "coordinator/planner/measured_timeline.h"
#include "coordinator/planner/timeline_render.h"

namespace pipetrain {

JobManager::JobManager(WorkerRegistry* registry, AssignmentHub* hub, Clock* clock,
                       JobManagerOptions options)
    : registry_(registry),
      hub_(hub),
      clock_(clock),
      elapsed_clock_(options.elapsed_clock != nullptr ? options.elapsed_clock : clock),
      options_(std::move(options)) {
  if (!options_.background_runner) {
    background_ = std::make_unique<SerialExecutor>();
    weights_sync_ = std::make_unique<SerialExecutor>();
  }
}

JobManager::~JobManager() {
  {
    AnnotatedMutexLock lock(&mu_);
    stopping_ = true;
  }
  if (loop_.joinable()) loop_.join();
  {
    // The saves and deletions that failed (the scheduling loop retried
    // them every second) get a last try, queued on io_, which runs them
    // before it goes: without it a restart, or the next leader, restored
    // the job as saved last (an ended job RUNNING again, a pruned one
    // back). A try that fails again is logged.
    AnnotatedMutexLock lock(&mu_);
    next_save_retry_ = next_delete_retry_ = next_settle_ = absl::InfinitePast();
    RetryUnsavedLocked();
    RetryDeletesLocked();
    SettleSubmitsLocked();
  }
  if (cancel_fetches_) cancel_fetches_();  // none starts once stopping_ is set
  AwaitProfiling();
  // A plan being computed ends and is dropped (stopping_); those queued
  // behind it are not computed.
  planning_stopped_.store(true, std::memory_order_release);
  background_.reset();
  weights_sync_.reset();
}

void JobManager::AwaitBackgroundWork() {
  AnnotatedMutexLock lock(&mu_);
  auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return background_in_flight_ == 0; };
  mu_.AwaitWithTimeout(none, absl::InfiniteDuration());
}

void JobManager::SetEvents(JobEvents events) { events_ = std::move(events); }

void JobManager::StartSchedulingLoop(absl::Duration period) {
  loop_ = std::thread([this, period] {
    AnnotatedMutexLock lock(&mu_);
    while (!mu_.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; },
                                 period)) {
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

void JobManager::DropEndedJobDetail(JobRecord& record) {
  // What only drawings and a running job use: the workers' compiled
  // programs (megabytes for thousands of micro-batches, in each stage's
  // assignment), the traced steps the measured timeline is drawn from, and
  // the weights upload's bookkeeping. Moved out, so the memory is freed.
  DropPlanDrawings(record.plan);
  std::vector<JobRecord::AssignedStage>().swap(record.assignments);
  record.traced = record.tracing = JobRecord::TracedStep{};
  std::map<std::string, std::pair<int, Shape>>().swap(record.weight_owner);
  std::map<std::string, size_t>().swap(record.weights_index);
  std::map<std::string, CoveredRanges>().swap(record.weights_covered);
}

void JobManager::TouchLocked(JobRecord& record) {
  *record.job.mutable_update_time() = ToProtoTimestamp(clock_->Now());
}

absl::Status CheckIdArgument(absl::string_view field, absl::string_view id) {
  if (id.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  if (id.size() > kMaxIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, " ", EchoInput(id), " is ", id.size(),
                                                   " bytes; the limit is ", kMaxIdBytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> JobManager::Get(const std::string& job_id) const {
  RETURN_IF_ERROR(CheckIdArgument("job id", job_id));
  AnnotatedMutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", EchoInput(job_id)));
  v1::Job job = it->second->job;
  ShowUnsavedEndLocked(job);
  return job;
}

bool JobManager::EndShownRunningLocked(const v1::Job& job) const {
  return (job.state() == v1::JOB_STATE_SUCCEEDED || job.state() == v1::JOB_STATE_FAILED) &&
         end_unsaved_.count(job.id()) > 0;
}

bool JobManager::CancelUnsavedLocked(const v1::Job& job) const {
  return job.state() == v1::JOB_STATE_CANCELLED && end_unsaved_.count(job.id()) > 0;
}

bool JobManager::EndedForOthersLocked(const v1::Job& job) const {
  return IsTerminal(job.state()) && end_unsaved_.count(job.id()) == 0;
}

v1::JobState JobManager::ShownStateLocked(const v1::Job& job) const {
  if (!EndShownRunningLocked(job)) return job.state();
  // As Restore makes of its last save: a job never planned waits again.
  return job.plan_version() == 0 ? v1::JOB_STATE_QUEUED : v1::JOB_STATE_RUNNING;
}

void JobManager::ShowUnsavedEndLocked(v1::Job& job) const {
  if (!EndShownRunningLocked(job)) return;
  constexpr absl::string_view kRetried =
      "(a save that fails is retried every second; the coordinator's log says why)";
  if (job.state() == v1::JOB_STATE_SUCCEEDED) {
    job.set_reason(absl::StrCat(
        "finishing: its last step is done, and its end waits to be saved to the state store ",
        kRetried));
  } else {
    job.set_reason(absl::StrCat("ending: it failed (", job.reason(),
                                "), and that end waits to be saved to the state store ", kRetried));
  }
  job.set_state(ShownStateLocked(job));
}

std::vector<v1::Job> JobManager::List() const {
  AnnotatedMutexLock lock(&mu_);
  std::vector<v1::Job> out;
  out.reserve(order_.size());
  for (const std::string& id : order_) {
    // Without copying the history (up to kMaxLossHistory floats a job): it
    // is set aside for the copy and put back, both O(1).
    v1::Job& job = jobs_.at(id)->job;
    if (!job.has_progress()) {
      out.push_back(job);
    } else {
      google::protobuf::RepeatedField<float> history;
      history.Swap(job.mutable_progress()->mutable_loss_history());
      out.push_back(job);
      history.Swap(job.mutable_progress()->mutable_loss_history());
    }
    ShowUnsavedEndLocked(out.back());
  }
  return out;
}

std::vector<JobManager::JobSummary> JobManager::Summaries() const {
  AnnotatedMutexLock lock(&mu_);
  std::vector<JobSummary> out;
  out.reserve(order_.size());
  const absl::Time now = elapsed_clock_->Now();
  for (const std::string& id : order_) {
    const JobRecord& record = *jobs_.at(id);
    const v1::Job& job = record.job;
    const v1::TrainingSpec& training = job.spec().training();
    // As ShowUnsavedEndLocked shows it (/metrics and the list pages read
    // this).
    const v1::JobState state = ShownStateLocked(job);
    // By its own state: an end shown RUNNING has no step to come. Every
    // way into RUNNING (a plan's start) sets last_step_time, and so does
    // each chunk of the final weights' upload. Not while the complete file
    // is synced (writing_weights): a large model's may take minutes, and
    // a cancel then, as the alert's runbook would have it, drops the file.
    const absl::Duration without_step =
        job.state() == v1::JOB_STATE_RUNNING && !record.writing_weights
            ? now - record.last_step_time
            : absl::ZeroDuration();
    out.push_back({job.id(), absl::ToUnixNanos(FromProtoTimestamp(job.create_time())), state,
                   job.progress().step(), job.progress().loss(), job.progress().val_loss(),
                   double(training.batch_size()) * double(training.seq_len()),
                   job.progress().checkpoint_failures(), record.init_step, without_step});
  }
  return out;
}

absl::StatusOr<v1::Job> JobManager::Cancel(const std::string& job_id,
                                           absl::Duration answer_within) {
  RETURN_IF_ERROR(CheckIdArgument("job id", job_id));
  v1::Job cancelled;
  // The save's status, set on the io thread. An AnnotatedMutex, not an
  // absl::Notification, as in FlushIo: TSan must see the hand-off.
  struct Saved {
    AnnotatedMutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    absl::Status status ABSL_GUARDED_BY(mu);
  };
  auto saved = std::make_shared<Saved>();
  {
    AnnotatedMutexLock lock(&mu_);
    JobRecord* record = FindLocked(job_id);
    if (record == nullptr) return absl::NotFoundError(absl::StrCat("no job ", EchoInput(job_id)));
    // Only a cancel ends a job CANCELLED: a cancel of one is a repeat (the
    // caller's retry after a lost answer, or after an UNAVAILABLE whose
    // save went through after all), answered as the first was. Recorded
    // once a save of the job taken after its end succeeded (end_unsaved_):
    // not by whether the latest save did, which may be a later one (an
    // expired checkpoint's removal) of a snapshot CANCELLED all the same.
    const bool cancelled_before = record->job.state() == v1::JOB_STATE_CANCELLED;
    const bool unsaved_cancel = cancelled_before && end_unsaved_.count(job_id) > 0;
    // Shown RUNNING ("finishing", "ending"): its end may yet be lost, and
    // the job run on (a checkpointed one resumed), with no cancel recorded.
    if (EndShownRunningLocked(record->job)) {
      return absl::UnavailableError(absl::StrCat(
          "job ", job_id,
          record->job.state() == v1::JOB_STATE_SUCCEEDED ? " reached its end" : " failed",
          ", which waits to be saved to the state store; ask again"));
    }
    if (IsTerminal(record->job.state()) && !cancelled_before) {
      return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " already ended (",
                                                        EnumShortName(record->job.state()), ")"));
    }
    if (cancelled_before && !unsaved_cancel) {
      // Recorded already: nothing to save.
      cancelled = record->job;
      cancelled.mutable_progress()->clear_loss_history();
      return cancelled;
    }
    // Until a save of the cancel succeeds (end_unsaved_), a repeat
    // meanwhile (a REST cancel beside a gRPC one) saves again and waits
    // too, rather than being told at once that the cancel is recorded.
    if (!unsaved_cancel) EndLocked(*record, v1::JOB_STATE_CANCELLED, "cancelled by the user");
    // Answered once the store has the cancel: a coordinator that dies right
    // after must not restore the job RUNNING. This save, queued after
    // EndLocked's, says whether it has.
    PersistLocked(*record, [saved](const absl::Status& s) {
      AnnotatedMutexLock lock(&saved->mu);
      saved->status = s;
      saved->done = true;
    }).IgnoreError();
    cancelled = record->job;
    // The answer is the basic view, as GetJob's default: the loss history
    // (up to a few hundred KB) is GetJob with JOB_VIEW_FULL's.
    cancelled.mutable_progress()->clear_loss_history();
  }
  // This save only (io_ runs in order; the end queues its own file work,
  // the removal of leftovers on the output volume, after its save, though
  // file work queued before the end, this job's manifest writes and
  // checkpoint removals or another job's sweep, still runs first: a hung
  // volume can hold it), not every job's file work queued since, and
  // for at most cancel_save_wait: the cancel runs on the thread submits and
  // drains share, and a backlog on io_ (checkpoint removals on slow
  // storage, a slow store) held them all, and the client past its deadline.
  absl::Status save_status;
  {
    const absl::Duration wait =
        std::max(absl::ZeroDuration(), std::min(options_.cancel_save_wait, answer_within));
    AnnotatedMutexLock lock(&saved->mu);
    const bool done = saved->mu.AwaitWithTimeout(
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(saved->mu) { return saved->done; }, wait);
    save_status = done ? saved->status
                       : absl::DeadlineExceededError(absl::StrCat(
                             "its save still waits behind the coordinator's other file and "
                             "store work after ",
                             absl::FormatDuration(wait),
                             wait < options_.cancel_save_wait ? " (the call's deadline)" : ""));
  }
  if (!save_status.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "job ", job_id, " is cancelled here, but the state store did not record it (",
        save_status.message(),
        "); the coordinator saves it again every second, and one that stops before a save "
        "succeeds restores the job and runs it again: cancel again to see it recorded"));
  }
  return cancelled;
}

absl::StatusOr<v1::Plan> JobManager::GetPlan(const std::string& job_id, PlanParts parts) const {
  RETURN_IF_ERROR(CheckIdArgument("job id", job_id));
  v1::Plan plan;
  MeasuredStepCopy measured;
  {
    AnnotatedMutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", EchoInput(job_id)));
    if (it->second->plan.version() == 0) {
      const v1::JobState state = it->second->job.state();
      return absl::FailedPreconditionError(
          IsTerminal(state)
              ? absl::StrCat("job ", job_id, " ended ", EnumShortName(state),
                             " before it was planned: it has no plan")
              : absl::StrCat("job ", job_id, " has no plan yet (", EnumShortName(state), ")"));
    }
    if (parts == PlanParts::kWithoutDrawings) return PlanCopyWithoutDrawings(it->second->plan);
    if (parts == PlanParts::kMeasuredTimelineSvg) {
      plan.set_job_id(it->second->plan.job_id());
      plan.set_version(it->second->plan.version());
    } else {
      plan = it->second->plan;
    }
    if (parts == PlanParts::kWithoutMeasured) return plan;
    measured = CopyMeasuredStep(*it->second);
  }
  AddMeasuredTimeline(measured, parts != PlanParts::kMeasuredTimelineSvg, &plan);
  return plan;
}

void JobManager::AddTraceLocked(JobRecord& record, int stage_index, const v1::StepTrace& trace) {
  // Stages report a traced step in any order, and may be a traced step
  // apart: a trace older than the one being collected, or not newer than
  // the one shown, is dropped.
  JobRecord::TracedStep& tracing = record.tracing;
  if (trace.iteration() < tracing.iteration || trace.iteration() <= record.traced.iteration) return;
  if (trace.iteration() > tracing.iteration) {
    tracing = JobRecord::TracedStep{trace.iteration()};
    // The lanes CopyMeasuredStep draws, from the programs' sizes: a worker
    // times each instruction of its program (StageRuntime), so its trace
    // is as long. The plan's programs stay until a new plan resets this.
    std::vector<int> timings;
    timings.reserve(record.assignments.size());
    for (const JobRecord::AssignedStage& stage : record.assignments) {
      timings.push_back(stage.program.instructions_size());
    }
    tracing.drawn_lanes = LeadingLanesWithin(timings, kMaxMeasuredTimelineTimings);
  }
  tracing.arrived.insert(stage_index);
  if (stage_index < tracing.drawn_lanes) {
    v1::StepTrace& kept = tracing.by_stage[stage_index] = trace;
    // CheckStepTrace bounded the known fields; unknown ones (up to the 4 MiB
    // request) would be kept and copied on every GetPlan.
    kept.DiscardUnknownFields();
  }
  if (tracing.arrived.size() == record.assignments.size()) {
    // Moved, not copied: a copy under mu_ of a large job's traces stalled
    // every other job's reports.
    record.traced = std::move(tracing);
    tracing = JobRecord::TracedStep{};
  }
}

size_t JobManager::HeldManifestsForTesting(const std::string& job_id) const {
  AnnotatedMutexLock lock(&mu_);
  auto it = manifests_after_save_.find(job_id);
  return it == manifests_after_save_.end() ? 0 : it->second.size();
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
  copy.workers = static_cast<int>(record.traced.arrived.size());
  // AddTraceLocked kept the traces of the drawn lanes only.
  for (const auto& [stage, trace] : record.traced.by_stage) {
    copy.programs.push_back(record.assignments[stage].program);
    copy.traces.push_back(trace);
    copy.names.push_back(record.job.worker_ids(stage));
  }
  return copy;
}

void JobManager::AddMeasuredTimeline(const MeasuredStepCopy& step, bool with_chrome_trace,
                                     v1::Plan* plan) {
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
  if (with_chrome_trace) {
    plan->set_measured_chrome_trace_json(ChromeTraceJson(*measured, step.names));
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
  std::function<void()> sweep = CheckpointSweepLocked(record, absl::Now());
  // Unsaved until a save of the end succeeds (end_unsaved_): a failover
  // before it restores the job as last saved and runs it again. A success
  // or failure is shown RUNNING until then (ShowUnsavedEndLocked), and
  // counted ended then (PersistLocked); a cancel is shown CANCELLED, and
  // Cancel answers UNAVAILABLE until then. Each holds its paths until then
  // (EndedForOthersLocked). Marked after the sweep is
  // armed, which asks whether another live job shares the directory: this
  // one would count as one.
  if (options_.state != nullptr) end_unsaved_.insert(record.job.id());
  const bool shown_running = EndShownRunningLocked(record.job);
  PersistLocked(record).IgnoreError();  // logged
  // This end's file work on the output volume after the save, on the same
  // queue: it must not hold the end's save (nor Cancel, which waits for it)
  // while the store is healthy. File work queued earlier still runs first
  // (io_ is one queue).
  if (state != v1::JOB_STATE_SUCCEEDED) RemoveAbandonedWeightsOf(record);
  if (sweep) io_.Post(std::move(sweep));
  if (events_.ended && !shown_running) events_.ended(state);
  const std::string ended = absl::StrCat("job ", record.job.id(), " ", EnumShortName(state),
                                         reason.empty() ? "" : ": ", reason);
  // A failure at WARNING: an operator who logs only warnings (or alerts
  // on them) saw the job's RECOVERING but never its end.
  if (state == v1::JOB_STATE_FAILED) {
    PT_LOG(WARNING) << ended;
  } else {
    PT_LOG(INFO) << ended;
  }
}

void JobManager::RunInBackgroundLocked(std::function<void()> task) {
  RunOnLocked(background_.get(), std::move(task));
}

void JobManager::RunWeightsSyncLocked(std::function<void()> task) {
  RunOnLocked(weights_sync_.get(), std::move(task));
}

void JobManager::RunOnLocked(SerialExecutor* executor, std::function<void()> task) {
  ++background_in_flight_;
  if (options_.background_runner) {
    options_.background_runner(std::move(task));
  } else {
    executor->Post(std::move(task));
  }
}

void JobManager::PruneLocked() {
  const absl::Time oldest_kept = clock_->Now() - options_.ended_job_retention;
  // The ended jobs, the latest to end first (an ended job's update_time is
  // its end), ties the later submitted first. By end, not by submission: a
  // long job submitted before many short ones was pruned the moment it
  // ended, its outcome lost to the user following it.
  // Ended as EndedForOthersLocked says, however long the store fails: not
  // a job whose end waits to be saved. The store says it runs, and a
  // failover restores it so (the delete of a pruned job fails too):
  // pruned, its paths went free while it could still run again (and a
  // success or failure was never counted ended).
  std::vector<std::pair<absl::Time, size_t>> ended;  // (ended at, index in order_)
  for (size_t i = 0; i < order_.size(); ++i) {
    const v1::Job& job = jobs_.at(order_[i])->job;
    if (EndedForOthersLocked(job)) ended.emplace_back(FromProtoTimestamp(job.update_time()), i);
  }
  std::sort(ended.begin(), ended.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second > b.second;
  });
  std::vector<bool> prune(order_.size(), false);
  // Whether a manifest of the job whose write failed waits for its retry
  // (manifest_failures_ is keyed (job id, step directory): the job's first
  // entry is the first at or after (id, "")).
  const auto manifest_retrying = [this](const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto failed = manifest_failures_.lower_bound({id, std::string()});
    if (failed != manifest_failures_.end() && failed->first.first == id) return true;
    return std::any_of(unwritten_manifests_.begin(), unwritten_manifests_.end(),
                       [&id](const ManifestToWrite& m) { return m.job_id == id; });
  };
  int planned_with_detail = 0;
  for (size_t rank = 0; rank < ended.size(); ++rank) {
    const auto& [ended_at, index] = ended[rank];
    JobRecord& record = *jobs_.at(order_[index]);
    if (rank >= static_cast<size_t>(std::max(0, options_.max_ended_jobs)) ||
        ended_at < oldest_kept) {
      // Not while its checkpoint directory is being swept: the sweeps find
      // their job by id (the second one runs only for jobs still here, up
      // to a minute after the end), and the directory stays reserved until
      // they are done. Nor while manifests of its complete checkpoints wait
      // for its next good save (a state store failing), up to the retention
      // time: pruned, they were never written, and those checkpoints (kept
      // by the sweeps as complete) could be neither resumed nor exported.
      // Nor while checkpoints wait for removal after a good save (expired,
      // or dropped as unusable; a failed removal is tried again on a
      // backoff, RetryExpiringLocked): pruned, they stayed on disk with
      // their manifests, and the sweeps keep complete ones, so `init.from`
      // or `checkpoint export` of the directory could take a corrupt one.
      // Nor while a manifest whose write failed waits for its retry (a
      // full or read-only volume; every 5 s, RetryManifestsLocked): pruned,
      // the retry found no job and gave up, and the newest checkpoints
      // stayed without one (export and `init.from` took an older step).
      // A later pass prunes it; past the retention it goes all the same: a
      // warning names the expired checkpoints left (WarnExpiringLeftLocked);
      // manifests still unwritten go without one (their last failure was
      // logged).
      const bool files_wait = manifests_after_save_.count(record.job.id()) > 0 ||
                              !record.expiring.empty() || manifest_retrying(record.job.id());
      if (record.checkpoint_sweeps_pending == 0 && (!files_wait || ended_at < oldest_kept)) {
        prune[index] = true;
      }
      continue;
    }
    // Only a planned job has drawings: one cancelled while queued takes no
    // place from those that have.
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
    if (options_.state != nullptr) io_.Post([this, id] { DeleteStoredJob(id); });
    save_failures_.erase(id);
    end_unsaved_.erase(id);  // none: an unsaved end is not pruned
    // Past the retention with a save still failing: no save of a pruned
    // job comes to write or drop them (RetryUnsavedLocked skips it), and
    // they stayed for the process's life. (A failed manifest write's
    // entries go at its next retry, which finds the job gone.)
    manifests_after_save_.erase(id);
    WarnExpiringLeftLocked(*jobs_.at(id));
    jobs_.erase(id);
  }
  order_ = std::move(kept);
  // Workers the registry has evicted (an address not seen for long: a
  // restarted pod comes back on another one, under another id) leave no
  // assignment or drain mark behind.
  auto evicted = [this](const std::string& worker_id) {
    return registry_->Get(worker_id).status().code() == absl::StatusCode::kNotFound;
  };
  // Asked of the registry before the hub's lock is taken: the lock order is
  // the registry's, then the hub's (job_manager.h), and Forget runs its
  // predicate under the hub's.
  std::set<std::string> gone;
  for (const std::string& id : hub_->WorkerIds()) {
    if (evicted(id)) gone.insert(id);
  }
  if (!gone.empty()) hub_->Forget([&gone](const std::string& id) { return gone.count(id) > 0; });
  // The registry asked off drained_mu_ (a leaf lock).
  std::vector<std::string> marked;
  {
    AnnotatedMutexLock drained_lock(&drained_mu_);
    for (const auto& [id, incarnation] : drained_) marked.push_back(id);
  }
  std::vector<std::string> forgotten;
  for (const std::string& id : marked) {
    if (evicted(id)) forgotten.push_back(id);
  }
  AnnotatedMutexLock drained_lock(&drained_mu_);
  for (const std::string& id : forgotten) drained_.erase(id);
}

void JobManager::WarnExpiringLeftLocked(const JobRecord& record) {
  if (record.expiring.empty()) return;
  // Held until the retention ran out (PruneLocked), tried meanwhile
  // (RetryExpiringLocked): what is still listed stays on disk for good,
  // manifests and all, once nothing remembers it.
  std::vector<std::string> dirs;
  for (const ExpiredCheckpoint& e : record.expiring) dirs.push_back(e.from.dir());
  PT_LOG(WARNING) << "job " << record.job.id() << " pruned with " << dirs.size()
                  << " expired checkpoint(s) not removed (their removal failed, waited for a "
                     "save of the job's state that never succeeded, or another job uses the "
                     "directory); given up (remove them by hand, under --output-dir): "
                  << absl::StrJoin(dirs, ", ");
}

void JobManager::OnWorkerLost(const std::string& worker_id, const std::string& job_id,
                              const std::string& reason, int64_t incarnation) {
  AnnotatedMutexLock lock(&mu_);
  JobRecord* record = FindLocked(job_id);
  if (record == nullptr || IsTerminal(record->job.state())) return;
  // Its workers are done: the job only waits for its weights file. The
  // worker is told to stop all the same: the hub keeps its RUN, which a new
  // incarnation (a restarted process, a lapsed lease) would otherwise take
  // up and run again, its reports counting as the stage's.
  if (record->writing_weights) return StopWorkerLocked(*record, worker_id);
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
    return StopWorkerLocked(*record, worker_id);  // as above: no rerun of its RUN
  }
  // Lost as it joined (before its stage's first step): not offered to the
  // job again for a while (JobRecord::join_crashes).
  if (auto stage = record->stage_of.find(worker_id);
      stage != record->stage_of.end() && JoinedThisPlanLocked(*record, worker_id) &&
      static_cast<size_t>(stage->second) < record->stages.size() &&
      record->stages[stage->second].iterations_done == 0) {
    JobRecord::JoinCrash& crash = record->join_crashes[worker_id];
    crash.count = std::min(crash.count + 1, 30);
    const absl::Duration wait =
        std::min(absl::Minutes(1) * (int64_t{1} << std::min(crash.count - 1, 6)), absl::Hours(1));
    crash.until = elapsed_clock_->Now() + wait;
    PT_LOG(WARNING) << "job " << job_id << ": " << worker_id << " was lost as it joined (" << reason
                    << "; " << crash.count << (crash.count == 1 ? " time" : " times")
                    << "); not offered to the job again for " << absl::FormatDuration(wait);
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

void JobManager::HoldIoForTesting() {
  io_.Post([] {
    absl::Notification never;
    never.WaitForNotification();
  });
}

std::map<v1::JobState, int> JobManager::CountByState() const {
  AnnotatedMutexLock lock(&mu_);
  std::map<v1::JobState, int> counts;
  for (const auto& [id, record] : jobs_) counts[ShownStateLocked(record->job)]++;
  return counts;
}

}  // namespace pipetrain
