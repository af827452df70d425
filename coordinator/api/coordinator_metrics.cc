#include "coordinator/api/coordinator_metrics.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "proto/pipetrain/v1/coordinator.pb.h"

namespace pipetrain {
namespace {

// From 100 µs (a loopback round trip) to 10 s (a plan compiled in a handler).
const prometheus::Histogram::BucketBoundaries& RpcBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
      0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};
  return *buckets;
}

// The unary methods of pipetrain.v1.Coordinator, read from the proto so that
// a new method gets its histogram without an edit here.
std::vector<std::string> UnaryMethods() {
  const google::protobuf::ServiceDescriptor* service =
      v1::RegisterWorkerRequest::descriptor()->file()->FindServiceByName("Coordinator");
  std::vector<std::string> names;
  for (int i = 0; service != nullptr && i < service->method_count(); ++i) {
    const google::protobuf::MethodDescriptor* method = service->method(i);
    if (!method->client_streaming() && !method->server_streaming()) {
      names.push_back(method->name());
    }
  }
  return names;
}

bool IsCountable(double seconds) { return std::isfinite(seconds) && seconds > 0; }

}  // namespace

CoordinatorMetrics::CoordinatorMetrics(const WorkerRegistry* workers, const JobManager* jobs)
    : workers_(workers), jobs_(jobs), registry_(std::make_unique<prometheus::Registry>()) {
  workers_by_state_ = &prometheus::BuildGauge()
                           .Name("pipetrain_workers")
                           .Help("Registered workers per state (JOINING, READY, ASSIGNED, LOST, LEFT).")
                           .Register(*registry_);
  jobs_by_state_ = &prometheus::BuildGauge()
                        .Name("pipetrain_jobs")
                        .Help("Jobs per state (QUEUED ... CANCELLED).")
                        .Register(*registry_);
  job_loss_ = &prometheus::BuildGauge()
                   .Name("pipetrain_job_loss")
                   .Help("Mean training loss of the current job's last step.")
                   .Register(*registry_)
                   .Add({});
  job_val_loss_ = &prometheus::BuildGauge()
                       .Name("pipetrain_job_val_loss")
                       .Help("The current job's latest validation loss "
                             "(spec.training.eval_interval; 0 before its first evaluation).")
                       .Register(*registry_)
                       .Add({});
  job_tokens_per_second_ = &prometheus::BuildGauge()
                                .Name("pipetrain_job_tokens_per_second")
                                .Help("Training throughput of the current job, tokens per second.")
                                .Register(*registry_)
                                .Add({});
  plan_predicted_seconds_ =
      &prometheus::BuildGauge()
           .Name("pipetrain_plan_predicted_iteration_seconds")
           .Help("The current job's plan: predicted iteration time of its bottleneck stage.")
           .Register(*registry_)
           .Add({});
  plan_version_ = &prometheus::BuildGauge()
                       .Name("pipetrain_plan_version")
                       .Help("The current job's plan version (1 for its first plan; "
                             "a re-plan would raise it).")
                       .Register(*registry_)
                       .Add({});
  job_steps_ = &prometheus::BuildCounter()
                    .Name("pipetrain_job_steps_total")
                    .Help("Optimizer steps completed, over all jobs.")
                    .Register(*registry_)
                    .Add({});
  stage_busy_ = &prometheus::BuildCounter()
                     .Name("pipetrain_stage_busy_seconds_total")
                     .Help("Compute time reported by pipeline stage, seconds.")
                     .Register(*registry_);
  stage_idle_ = &prometheus::BuildCounter()
                     .Name("pipetrain_stage_idle_seconds_total")
                     .Help("Time pipeline stages waited on receives (the bubble), seconds.")
                     .Register(*registry_);
  rpc_duration_ = &prometheus::BuildHistogram()
                       .Name("pipetrain_rpc_duration_seconds")
                       .Help("Time to handle a unary coordinator RPC, seconds.")
                       .Register(*registry_);
  for (const std::string& method : UnaryMethods()) {
    rpc_by_method_[method] = &rpc_duration_->Add({{"method", method}}, RpcBuckets());
  }
  rpc_refused_ = &prometheus::BuildCounter()
                      .Name("pipetrain_rpc_refused_total")
                      .Help(
                          "Coordinator RPCs refused by authentication, by method and code "
                          "(UNAUTHENTICATED: no or a wrong credential; PERMISSION_DENIED: "
                          "a worker credential used for another worker).")
                      .Register(*registry_);
  recoveries_ = &prometheus::BuildCounter()
                     .Name("pipetrain_job_recoveries_total")
                     .Help(
                         "Times jobs went RECOVERING, by what set it off (worker_lost, "
                         "peer_failure, checkpoint_unusable).")
                     .Register(*registry_);
  for (const char* reason : {"worker_lost", "peer_failure", "checkpoint_unusable"}) {
    recoveries_->Add({{"reason", reason}});
  }
  recovery_seconds_ = &prometheus::BuildHistogram()
                           .Name("pipetrain_job_recovery_seconds")
                           .Help(
                               "From a worker's loss being detected to the first step "
                               "completed on the new plan, seconds.")
                           .Register(*registry_)
                           .Add({}, prometheus::Histogram::BucketBoundaries{0.25, 0.5, 1, 2, 5, 10,
                                                                            30, 60, 120, 300});
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
  checkpoint_write_seconds_ =
      &prometheus::BuildHistogram()
           .Name("pipetrain_checkpoint_write_seconds")
           .Help(
               "A stage writing its unit files of a checkpoint (off the training thread), "
               "seconds.")
           .Register(*registry_)
           .Add({}, prometheus::Histogram::BucketBoundaries{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                                                            10, 30, 60});
  checkpoint_bytes_ = &prometheus::BuildCounter()
                           .Name("pipetrain_checkpoint_bytes_total")
                           .Help("Bytes of the unit files of complete checkpoints.")
                           .Register(*registry_)
                           .Add({});
  Refresh();  // every state appears from the first scrape on
}

JobEvents CoordinatorMetrics::Events() {
  JobEvents events;
  events.recovery_started = [this](const std::string& reason) {
    recoveries_->Add({{"reason", reason}}).Increment();
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
  return events;
}

void CoordinatorMetrics::Refresh() {
  for (const auto& [state, count] : workers_->CountByState()) {
    workers_by_state_->Add({{"state", v1::WorkerState_Name(state)}}).Set(count);
  }
  const std::map<v1::JobState, int> jobs = jobs_->CountByState();
  for (int s = v1::JobState_MIN + 1; s <= v1::JobState_MAX; ++s) {
    const auto state = static_cast<v1::JobState>(s);
    const auto it = jobs.find(state);
    jobs_by_state_->Add({{"state", v1::JobState_Name(state)}})
        .Set(it == jobs.end() ? 0 : it->second);
  }
  RefreshCurrentJob();
}

void CoordinatorMetrics::RefreshCurrentJob() {
  const std::vector<v1::Job> jobs = jobs_->List();  // submission order
  const v1::Job* current = nullptr;
  for (auto it = jobs.rbegin(); it != jobs.rend() && current == nullptr; ++it) {
    if (it->state() == v1::RUNNING) current = &*it;
  }
  for (auto it = jobs.rbegin(); it != jobs.rend() && current == nullptr; ++it) {
    if (it->progress().step() > 0) current = &*it;
  }
  if (current == nullptr) return;
  job_loss_->Set(current->progress().loss());
  job_val_loss_->Set(current->progress().val_loss());
  job_tokens_per_second_->Set(current->progress().tokens_per_second());
  absl::StatusOr<v1::Plan> plan = jobs_->GetPlan(current->id());
  if (plan.ok()) {
    plan_predicted_seconds_->Set(plan->predicted_iteration_seconds());
    plan_version_->Set(static_cast<double>(plan->version()));
  }
}

void CoordinatorMetrics::ObserveRpc(absl::string_view method, double seconds) {
  auto it = rpc_by_method_.find(method);
  prometheus::Histogram& histogram =
      it != rpc_by_method_.end()
          ? *it->second
          : rpc_duration_->Add({{"method", std::string(method)}}, RpcBuckets());
  histogram.Observe(seconds);
}

void CoordinatorMetrics::CountRefused(absl::string_view method, absl::StatusCode code) {
  if (code != absl::StatusCode::kUnauthenticated && code != absl::StatusCode::kPermissionDenied) {
    return;
  }
  rpc_refused_->Add({{"method", std::string(method)}, {"code", absl::StatusCodeToString(code)}})
      .Increment();
}

void CoordinatorMetrics::AddStageTime(int stage, double busy_seconds, double idle_seconds) {
  if (stage < 0) return;
  const prometheus::Labels labels = {{"stage", StageLabel(stage)}};
  if (IsCountable(busy_seconds)) stage_busy_->Add(labels).Increment(busy_seconds);
  if (IsCountable(idle_seconds)) stage_idle_->Add(labels).Increment(idle_seconds);
}

void CoordinatorMetrics::CountStep() { job_steps_->Increment(); }

std::string CoordinatorMetrics::StageLabel(int stage) {
  if (stage >= kMaxStageLabel) return absl::StrCat(kMaxStageLabel, "+");
  return absl::StrCat(stage);
}

}  // namespace pipetrain
