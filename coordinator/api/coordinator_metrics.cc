#include "coordinator/api/coordinator_metrics.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/enum_names.h"
#include "common/job_state.h"
#include "common/metrics/build_info_metric.h"
#include "coordinator/jobs/recovery_kind.h"
#include "google/protobuf/descriptor.h"
#include "proto/pipetrain/v1/coordinator.grpc.pb.h"
#include "proto/pipetrain/v1/coordinator.pb.h"

namespace pipetrain {
namespace {

// The methods the coordinator's gRPC server has: pipetrain.v1.CoordinatorService's,
// read from the proto so that a new method gets its series without an edit
// here, with health checking and reflection.
std::vector<std::string> CoordinatorMethods() {
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          v1::CoordinatorService::service_full_name());
  std::vector<std::string> methods = GrpcRedMetrics::HealthAndReflectionMethods();
  if (service != nullptr) {
    for (std::string& method : GrpcRedMetrics::MethodsOf({service})) methods.push_back(method);
  }
  return methods;
}

bool IsCountable(double seconds) { return std::isfinite(seconds) && seconds > 0; }

// A small plan takes milliseconds; planner.h's budget allows a few seconds
// of solving. A plan may queue behind others and behind a large job's final
// weights file, which can take minutes: up to 10 min, so that p95 does not
// stop at the top bucket.
prometheus::Histogram::BucketBoundaries PlanSecondsBuckets() {
  return {0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
}

}  // namespace

CoordinatorMetrics::CoordinatorMetrics(const WorkerRegistry* workers, const JobManager* jobs)
    : workers_(workers),
      jobs_(jobs),
      registry_(std::make_unique<prometheus::Registry>()),
      rpc_(*registry_, CoordinatorMethods()),
      http_(*registry_),
      exposition_({registry_.get(), &process_}) {
  AddBuildInfo(*registry_);
  // Only a serving coordinator makes these metrics (a follower serves
  // follower_http.h's), so this is when it began serving: its counters
  // start at 0 then. PipetrainJobFailed reads a count above 0 soon after
  // as recent failures, whatever Prometheus remembers.
  prometheus::BuildGauge()
      .Name("pipetrain_coordinator_serving_since_timestamp_seconds")
      .Help(
          "When this coordinator began serving (started, or won the leader election), "
          "Unix seconds; its counters start at 0 then.")
      .Register(*registry_)
      .Add({})
      .Set(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  workers_by_state_ =
      &prometheus::BuildGauge()
           .Name("pipetrain_workers")
           .Help("Registered workers per state (JOINING, READY, ASSIGNED, LOST, LEFT).")
           .Register(*registry_);
  jobs_checkpoint_failing_ =
      &prometheus::BuildGauge()
           .Name("pipetrain_jobs_checkpoint_failing")
           .Help(
               "Jobs not ended whose checkpoint writes failed since their last complete "
               "checkpoint: a lost worker sends such a job back to that checkpoint.")
           .Register(*registry_)
           .Add({});
  jobs_state_save_failing_ =
      &prometheus::BuildGauge()
           .Name("pipetrain_jobs_state_save_failing")
           .Help(
               "Jobs whose latest save to the state store failed (saved again every second): a "
               "restart or failover meanwhile restores them as last saved, and their expired "
               "checkpoints stay on disk.")
           .Register(*registry_)
           .Add({});
  state_save_failures_ = &prometheus::BuildCounter()
                              .Name("pipetrain_state_save_failures_total")
                              .Help(
                                  "Saves of a job's state to the state store (SQLite under "
                                  "--state-dir, or etcd) that failed, retries included.")
                              .Register(*registry_)
                              .Add({});
  jobs_state_delete_failing_ =
      &prometheus::BuildGauge()
           .Name("pipetrain_jobs_state_delete_failing")
           .Help(
               "Jobs whose latest delete from the state store failed (deleted again every "
               "second): a pruned job comes back at a restart or failover meanwhile, and a failed "
               "submit holds its paths and request_id.")
           .Register(*registry_)
           .Add({});
  jobs_io_queue_age_seconds_ =
      &prometheus::BuildGauge()
           .Name("pipetrain_jobs_io_queue_age_seconds")
           .Help(
               "How long the oldest unfinished task on the coordinator's job I/O queue (state "
               "saves and deletes, profile saves, checkpoint manifests and removals, one at a "
               "time) has waited or run; 0 when idle. A stuck file operation holds every later "
               "save without failing one.")
           .Register(*registry_)
           .Add({});
  state_delete_failures_ = &prometheus::BuildCounter()
                                .Name("pipetrain_state_delete_failures_total")
                                .Help(
                                    "Deletes of a job's state from the state store (pruned jobs', "
                                    "failed submits') that failed, retries included.")
                                .Register(*registry_)
                                .Add({});
  workers_drained_ = &prometheus::BuildGauge()
                          .Name("pipetrain_workers_drained")
                          .Help(
                              "Workers drained and not gone (LEFT or LOST): they are counted "
                              "in pipetrain_workers by state, READY ones included, but get no "
                              "job until their process restarts.")
                          .Register(*registry_)
                          .Add({});
  worker_info_ = &prometheus::BuildGauge()
                      .Name("pipetrain_worker_info")
                      .Help(
                          "1 for each registered worker that has not left, labelled with the "
                          "address of its /metrics (what it registered with)")
                      .Register(*registry_);
  jobs_by_state_ = &prometheus::BuildGauge()
                        .Name("pipetrain_jobs")
                        .Help("Jobs per state (QUEUED ... CANCELLED).")
                        .Register(*registry_);
  // Read from the job manager's own times, not from steps over all jobs
  // next to pipetrain_jobs: a drain's or join's boundary re-plans between
  // two scrapes, and one stalled job hid behind another that steps.
  job_longest_without_step_ =
      &prometheus::BuildGauge()
           .Name("pipetrain_job_longest_without_step_seconds")
           .Help(
               "Over RUNNING jobs, the longest time since a job's last completed optimizer step "
               "or the start of its current plan (a re-plan for a drain, join or recovery starts "
               "it again), seconds; 0 when none runs.")
           .Register(*registry_)
           .Add({});
  job_loss_ = &prometheus::BuildGauge()
                   .Name("pipetrain_job_loss")
                   .Help("Mean training loss of the current job's last step.")
                   .Register(*registry_)
                   .Add({});
  job_val_loss_ = &prometheus::BuildGauge()
                       .Name("pipetrain_job_val_loss")
                       .Help(
                           "The current job's latest validation loss "
                           "(spec.training.eval_interval; 0 before its first evaluation).")
                       .Register(*registry_)
                       .Add({});
  job_tokens_ = &prometheus::BuildCounter()
                     .Name("pipetrain_job_tokens_total")
                     .Help(
                         "Tokens trained, over all jobs: batch_size * seq_len for each step "
                         "completed (a step redone after a recovery counts once).")
                     .Register(*registry_)
                     .Add({});
  plan_predicted_seconds_ =
      &prometheus::BuildGauge()
           .Name("pipetrain_plan_predicted_iteration_seconds")
           .Help("The current job's plan: its simulated iteration (step) time, in seconds.")
           .Register(*registry_)
           .Add({});
  plan_version_ = &prometheus::BuildGauge()
                       .Name("pipetrain_plan_version")
                       .Help(
                           "The current job's plan version (1 for its first plan; "
                           "each re-plan, for a recovery, drain or join, raises it).")
                       .Register(*registry_)
                       .Add({});
  plan_stage_busy_ = &prometheus::BuildGauge()
                          .Name("pipetrain_plan_predicted_stage_busy_seconds")
                          .Help(
                              "The current job's plan: the simulated step's compute time of "
                              "each pipeline stage, the largest of its workers'.")
                          .Register(*registry_);
  plan_stage_idle_ = &prometheus::BuildGauge()
                          .Name("pipetrain_plan_predicted_stage_idle_seconds")
                          .Help(
                              "The current job's plan: the simulated step's idle time of each "
                              "pipeline stage (waiting for input or the step's end), the largest "
                              "of its workers'.")
                          .Register(*registry_);
  job_steps_ = &prometheus::BuildCounter()
                    .Name("pipetrain_job_steps_total")
                    .Help("Optimizer steps completed, over all jobs.")
                    .Register(*registry_)
                    .Add({});
  stage_busy_ = &prometheus::BuildCounter()
                     .Name("pipetrain_stage_busy_seconds_total")
                     .Help(
                         "Busy time (compute and handing sends over) the workers of each "
                         "pipeline stage reported, seconds, averaged over the stage's replicas "
                         "and tensor ranks.")
                     .Register(*registry_);
  stage_idle_ = &prometheus::BuildCounter()
                     .Name("pipetrain_stage_idle_seconds_total")
                     .Help(
                         "Time the workers of each pipeline stage reported waiting on "
                         "receives (the bubble) and in collectives with other stages or "
                         "replicas, seconds, averaged over the stage's replicas and tensor "
                         "ranks.")
                     .Register(*registry_);
  rpc_refused_ = &prometheus::BuildCounter()
                      .Name("pipetrain_rpc_refused_total")
                      .Help(
                          "Coordinator RPCs refused by authentication, by method and code "
                          "(UNAUTHENTICATED: no or a wrong credential; PERMISSION_DENIED: "
                          "a worker credential used for another worker, or over REST a "
                          "cross-origin or DNS-rebinding request).")
                      .Register(*registry_);
  rpc_stale_sessions_ = &prometheus::BuildCounter()
                             .Name("pipetrain_rpc_stale_sessions_total")
                             .Help(
                                 "Worker calls refused (UNAUTHENTICATED) for a session of "
                                 "their own gone stale, by method: after a coordinator restart "
                                 "or a re-registration, until the worker registers again. Not "
                                 "in pipetrain_rpc_refused_total.")
                             .Register(*registry_);
  // Each CoordinatorService method's UNAUTHENTICATED series exists from the
  // first scrape, so that rate() sees the first stranger's call (method
  // names as CountRefused gets them: the short ones). PERMISSION_DENIED and
  // REST routes appear with their first refusal.
  if (const google::protobuf::ServiceDescriptor* service =
          google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
              v1::CoordinatorService::service_full_name())) {
    for (int m = 0; m < service->method_count(); ++m) {
      rpc_refused_->Add({{"method", service->method(m)->name()},
                         {"code", absl::StatusCodeToString(absl::StatusCode::kUnauthenticated)}});
    }
  }
  recoveries_ = &prometheus::BuildCounter()
                     .Name("pipetrain_job_recoveries_total")
                     .Help(
                         "Times jobs went RECOVERING, by what set it off (worker_lost, "
                         "peer_failure, checkpoint_unusable, checkpoint_failed, "
                         "coordinator_restart, replan_refused).")
                     .Register(*registry_);
  for (const RecoveryKind kind : kAllRecoveryKinds) {
    recoveries_->Add({{"reason", RecoveryKindName(kind)}});
  }
  recovery_seconds_ =
      &prometheus::BuildHistogram()
           .Name("pipetrain_job_recovery_seconds")
           .Help(
               "From a worker's loss being detected to the first step "
               "completed on the new plan, seconds.")
           .Register(*registry_)
           // Up to 2 h: a recovery waiting for workers may last
           // scheduling.queue_timeout (default 1 h).
           .Add({}, prometheus::Histogram::BucketBoundaries{0.25, 0.5, 1, 2, 5, 10, 30, 60, 120,
                                                            300, 600, 1800, 3600, 7200});
  steps_redone_ = &prometheus::BuildCounter()
                       .Name("pipetrain_job_steps_redone_total")
                       .Help(
                           "Steps run again after recoveries (those after the checkpoint "
                           "resumed from).")
                       .Register(*registry_)
                       .Add({});
  checkpoints_ = &prometheus::BuildCounter()
                      .Name("pipetrain_checkpoints_total")
                      .Help(
                          "Checkpoints completed (result=complete) and stage writes that "
                          "failed (result=failed).")
                      .Register(*registry_);
  checkpoints_->Add({{"result", "complete"}});
  checkpoints_->Add({{"result", "failed"}});
  jobs_ended_ = &prometheus::BuildCounter()
                     .Name("pipetrain_jobs_ended_total")
                     .Help(
                         "Jobs that ended, by final state (SUCCEEDED, FAILED, CANCELLED); a "
                         "success or failure counts once its end is saved to the state store "
                         "(shown RUNNING until then); unlike pipetrain_jobs it does not fall "
                         "when ended jobs are pruned.")
                     .Register(*registry_);
  for (const char* state : {"SUCCEEDED", "FAILED", "CANCELLED"}) {
    jobs_ended_->Add({{"state", state}});
  }
  checkpoint_write_seconds_ =
      &prometheus::BuildHistogram()
           .Name("pipetrain_checkpoint_write_seconds")
           .Help(
               "A stage writing its unit files of a checkpoint (off the training thread), "
               "seconds.")
           .Register(*registry_)
           // Up to 1 h: a unit file may hold 64 GiB, written and fsynced to
           // a shared volume (NFS) that may be slow or filling up.
           .Add({}, prometheus::Histogram::BucketBoundaries{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                                                            10, 30, 60, 120, 300, 600, 1800, 3600});
  plan_seconds_ = &prometheus::BuildHistogram()
                       .Name("pipetrain_plan_seconds")
                       .Help(
                           "A placement's planning (first plans and re-plans), seconds: "
                           "phase=queued waiting for the job manager's planning thread (one "
                           "plan at a time; final weights files sync on a thread of their own), "
                           "phase=computing the solver, layout search and compiler.")
                       .Register(*registry_);
  for (const char* phase : {"queued", "computing"}) {
    plan_seconds_->Add({{"phase", phase}}, PlanSecondsBuckets());
  }
  checkpoint_bytes_ = &prometheus::BuildCounter()
                           .Name("pipetrain_checkpoint_bytes_total")
                           .Help("Bytes of the unit files of complete checkpoints.")
                           .Register(*registry_)
                           .Add({});
  {
    // Steps of jobs loaded from the store were trained before this process:
    // they are not counted again after a restart (here for jobs restored
    // before the metrics were made; Events().restored for those after).
    // Listed before the lock: the job manager's lock comes first.
    const std::vector<JobManager::JobSummary> listed = jobs_->Summaries();
    AnnotatedMutexLock lock(&refresh_mu_);
    for (const JobManager::JobSummary& job : listed) steps_counted_[job.id] = job.step;
  }
  Refresh();  // every state appears from the first scrape on
}

JobEvents CoordinatorMetrics::Events() {
  JobEvents events;
  events.recovery_started = [this](RecoveryKind kind) {
    recoveries_->Add({{"reason", RecoveryKindName(kind)}}).Increment();
  };
  events.recovered = [this](double total, double, double, double) {
    recovery_seconds_->Observe(total);
  };
  events.steps_redone = [this](int64_t steps) { steps_redone_->Increment(double(steps)); };
  events.checkpoint_written = [this](double seconds) {
    checkpoint_write_seconds_->Observe(seconds);
  };
  events.checkpoint_completed = [this](int64_t bytes) {
    checkpoints_->Add({{"result", "complete"}}).Increment();
    checkpoint_bytes_->Increment(double(bytes));
  };
  events.checkpoint_failed = [this] { checkpoints_->Add({{"result", "failed"}}).Increment(); };
  events.ended = [this](v1::JobState state) {
    jobs_ended_->Add({{"state", EnumShortName(state)}}).Increment();
  };
  events.restored = [this](const std::string& job_id, int64_t step) {
    AnnotatedMutexLock lock(&refresh_mu_);
    int64_t& counted = steps_counted_[job_id];
    counted = std::max(counted, step);
  };
  events.state_save_failed = [this] { state_save_failures_->Increment(); };
  events.state_delete_failed = [this] { state_delete_failures_->Increment(); };
  events.planned = [this](double queued, double computing) {
    plan_seconds_->Add({{"phase", "queued"}}, PlanSecondsBuckets()).Observe(queued);
    plan_seconds_->Add({{"phase", "computing"}}, PlanSecondsBuckets()).Observe(computing);
  };
  return events;
}

void CoordinatorMetrics::Refresh() {
  AnnotatedMutexLock scrape(&scrape_mu_);
  const std::map<v1::WorkerState, int> workers = workers_->CountByState();
  for (int s = v1::WorkerState_MIN + 1; s <= v1::WorkerState_MAX; ++s) {
    const auto state = static_cast<v1::WorkerState>(s);
    if (!v1::WorkerState_IsValid(s)) continue;
    const auto it = workers.find(state);
    workers_by_state_->Add({{"state", EnumShortName(state)}})
        .Set(it == workers.end() ? 0 : it->second);
  }
  const std::map<v1::JobState, int> counts = jobs_->CountByState();
  for (int s = v1::JobState_MIN + 1; s <= v1::JobState_MAX; ++s) {
    const auto state = static_cast<v1::JobState>(s);
    if (!v1::JobState_IsValid(s)) continue;
    const auto it = counts.find(state);
    jobs_by_state_->Add({{"state", EnumShortName(state)}}).Set(it == counts.end() ? 0 : it->second);
  }
  const std::vector<JobManager::JobSummary> jobs = jobs_->Summaries();  // submission order
  int failing = 0;
  absl::Duration longest_without_step = absl::ZeroDuration();
  for (const JobManager::JobSummary& job : jobs) {
    if (!IsTerminal(job.state) && job.checkpoint_failures > 0) ++failing;
    longest_without_step = std::max(longest_without_step, job.without_step);
  }
  jobs_checkpoint_failing_->Set(failing);
  job_longest_without_step_->Set(absl::ToDoubleSeconds(longest_without_step));
  jobs_state_save_failing_->Set(jobs_->JobsWithFailedSave());
  jobs_state_delete_failing_->Set(jobs_->JobsWithFailedDelete());
  jobs_io_queue_age_seconds_->Set(absl::ToDoubleSeconds(jobs_->IoQueueAge()));
  RefreshWorkers();
  RefreshCurrentJob(jobs);
  CountTokens(jobs);
}

void CoordinatorMetrics::RefreshWorkers() {
  std::set<std::string> present;
  int drained = 0;
  for (const v1::Worker& worker : workers_->List()) {
    const bool gone =
        worker.state() == v1::WORKER_STATE_LEFT || worker.state() == v1::WORKER_STATE_LOST;
    // A gone worker serves no /metrics; Prometheus keeps its history.
    if (!gone && !worker.metrics_address().empty()) present.insert(worker.metrics_address());
    if (!gone && jobs_->IsDrained(worker)) ++drained;
  }
  workers_drained_->Set(drained);
  AnnotatedMutexLock lock(&refresh_mu_);
  for (auto it = worker_info_series_.begin(); it != worker_info_series_.end();) {
    if (present.count(it->first) > 0) {
      ++it;
      continue;
    }
    worker_info_->Remove(it->second);
    it = worker_info_series_.erase(it);
  }
  for (const std::string& address : present) {
    if (worker_info_series_.count(address) > 0) continue;
    prometheus::Gauge& gauge = worker_info_->Add({{"metrics_address", address}});
    gauge.Set(1);
    worker_info_series_[address] = &gauge;
  }
}

void CoordinatorMetrics::RefreshCurrentJob(const std::vector<JobManager::JobSummary>& jobs) {
  const JobManager::JobSummary* current = nullptr;
  for (auto it = jobs.rbegin(); it != jobs.rend() && current == nullptr; ++it) {
    if (it->state == v1::JOB_STATE_RUNNING) current = &*it;
  }
  // Else the last job that trained a step (one begun from a checkpoint
  // shows that checkpoint's step before it trains any).
  for (auto it = jobs.rbegin(); it != jobs.rend() && current == nullptr; ++it) {
    if (it->step > it->init_step) current = &*it;
  }
  // None (the last one pruned), or its plan unreadable: 0 and no stage
  // series, rather than a job's that is gone, or another job's plan
  // beside this one's loss.
  job_loss_->Set(current == nullptr ? 0 : current->loss);
  job_val_loss_->Set(current == nullptr ? 0 : current->val_loss);
  absl::StatusOr<v1::Plan> plan =
      current == nullptr ? absl::StatusOr<v1::Plan>(absl::NotFoundError("no current job"))
                         : jobs_->GetPlan(current->id, JobManager::PlanParts::kWithoutDrawings);
  std::vector<double> busy, idle;
  plan_predicted_seconds_->Set(plan.ok() ? plan->predicted_iteration_seconds() : 0);
  plan_version_->Set(plan.ok() ? static_cast<double>(plan->version()) : 0);
  if (plan.ok()) {
    // Per pipeline stage (the stage label as pipetrain_stage_busy_seconds_
    // total's), the largest over its replicas and tensor ranks; beyond the
    // label cap a gauge could not tell the stages apart.
    const int workers = plan->stages_size();
    const int replicas = std::max(1, plan->data_parallel());
    const int tensor = std::max(1, plan->tensor_parallel());
    for (int g = 0; g < workers; ++g) {
      const int stage = PipelineStageOf(g, workers, replicas, tensor);
      if (stage >= kMaxStageLabel) continue;
      if (stage >= static_cast<int>(busy.size())) busy.resize(stage + 1), idle.resize(stage + 1);
      busy[stage] = std::max(busy[stage], plan->stages(g).predicted_busy_seconds());
      idle[stage] = std::max(idle[stage], plan->stages(g).predicted_idle_seconds());
    }
  }
  const int shown = static_cast<int>(busy.size());
  AnnotatedMutexLock lock(&refresh_mu_);
  for (int stage = 0; stage < shown; ++stage) {
    const prometheus::Labels labels = {{"stage", StageLabel(stage)}};
    plan_stage_busy_->Add(labels).Set(busy[stage]);
    plan_stage_idle_->Add(labels).Set(idle[stage]);
  }
  for (int g = shown; g < predicted_stages_shown_; ++g) {
    const prometheus::Labels labels = {{"stage", StageLabel(g)}};
    plan_stage_busy_->Remove(&plan_stage_busy_->Add(labels));
    plan_stage_idle_->Remove(&plan_stage_idle_->Add(labels));
  }
  predicted_stages_shown_ = shown;
}

void CoordinatorMetrics::CountTokens(const std::vector<JobManager::JobSummary>& jobs) {
  AnnotatedMutexLock lock(&refresh_mu_);
  // Jobs pruned since the last scrape are forgotten (an id is never given
  // twice): otherwise every job ever submitted would keep an entry.
  std::set<std::string> listed;
  for (const JobManager::JobSummary& job : jobs) listed.insert(job.id);
  for (auto it = steps_counted_.begin(); it != steps_counted_.end();) {
    it = listed.count(it->first) > 0 ? std::next(it) : steps_counted_.erase(it);
  }
  for (const JobManager::JobSummary& job : jobs) {
    // A job begun from a checkpoint counts from that checkpoint's step:
    // the steps before it were trained by another job (which counted them).
    int64_t& counted = steps_counted_.try_emplace(job.id, job.init_step).first->second;
    const int64_t step = job.step;
    if (step <= counted) continue;  // none new, or redoing steps after a recovery
    job_tokens_->Increment(job.tokens_per_step * double(step - counted));
    counted = step;
  }
}

std::function<void(const std::string&, const std::string&, int, double)>
CoordinatorMetrics::HttpObserver() {
  auto red = http_.Observer();
  return
      [this, red](const std::string& method, const std::string& route, int status, double seconds) {
        red(method, route, status, seconds);
        // Both labels come from bounded sets (HttpServer::Options::on_response).
        // 403: a browser's cross-origin or DNS-rebinding request, refused
        // before its handler (a wrong credential is 401).
        if (status == 401) {
          CountRefused(absl::StrCat(method, " ", route), absl::StatusCode::kUnauthenticated);
        } else if (status == 403) {
          CountRefused(absl::StrCat(method, " ", route), absl::StatusCode::kPermissionDenied);
        }
      };
}

void CoordinatorMetrics::CountRefused(absl::string_view method, absl::StatusCode code) {
  if (code != absl::StatusCode::kUnauthenticated && code != absl::StatusCode::kPermissionDenied) {
    return;
  }
  rpc_refused_->Add({{"method", std::string(method)}, {"code", absl::StatusCodeToString(code)}})
      .Increment();
}

void CoordinatorMetrics::CountStaleSession(absl::string_view method) {
  rpc_stale_sessions_->Add({{"method", std::string(method)}}).Increment();
}

void CoordinatorMetrics::AddStageTime(int stage, double busy_seconds, double idle_seconds) {
  if (stage < 0) return;
  const prometheus::Labels labels = {{"stage", StageLabel(stage)}};
  // Both series exist once a stage reports: a stage that never waits has
  // an idle series at 0, so idle / (busy + idle) reads 0, not nothing.
  prometheus::Counter& busy = stage_busy_->Add(labels);
  prometheus::Counter& idle = stage_idle_->Add(labels);
  if (IsCountable(busy_seconds)) busy.Increment(busy_seconds);
  if (IsCountable(idle_seconds)) idle.Increment(idle_seconds);
}

void CoordinatorMetrics::CountStep() { job_steps_->Increment(); }

int CoordinatorMetrics::PipelineStageOf(int index, int workers, int replicas, int tensor) {
  // In 64 bits: the degrees come from a plan (a restored one is checked,
  // stored_job_check.h, but a product that wrapped to 0 would divide by it).
  const int64_t group = int64_t{replicas} * tensor;
  if (replicas < 1 || tensor < 1 || workers < group || workers % group != 0) return index;
  const int64_t stages = workers / group;
  return static_cast<int>(index / tensor % stages);
}

std::string CoordinatorMetrics::StageLabel(int stage) {
  if (stage >= kMaxStageLabel) return absl::StrCat(kMaxStageLabel, "+");
  return absl::StrCat(stage);
}

}  // namespace pipetrain
