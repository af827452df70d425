#include "coordinator/api/grpc_service.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/enum_names.h"
#include "common/grpc_credentials.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "coordinator/api/grpc_status.h"
#include "coordinator/api/list_pages.h"
#include "coordinator/api/weights_upload.h"

namespace pipetrain {

CoordinatorGrpcService::CoordinatorGrpcService(WorkerRegistry* workers, JobManager* jobs,
                                               AssignmentHub* hub, CoordinatorMetrics* metrics,
                                               const CallerAuth* auth, Runner store_calls,
                                               Runner registrations)
    : workers_(workers),
      jobs_(jobs),
      metrics_(metrics),
      auth_(auth),
      streams_(hub,
               [workers](const std::string& worker_id, int64_t incarnation) {
                 workers->MarkLost(worker_id, incarnation,
                                   "its assignment stream closed: the process exited or lost its "
                                   "connection to the coordinator");
               }),
      store_calls_(
          store_calls
              ? std::move(store_calls)
              : [this](std::function<void()> task) { own_store_calls_.Post(std::move(task)); }),
      registrations_(registrations ? std::move(registrations) : [this](std::function<void()> task) {
        own_registrations_.Post(std::move(task));
      }) {
  PT_CHECK(workers != nullptr && jobs != nullptr && hub != nullptr && metrics != nullptr &&
           auth != nullptr);
}

absl::Status CoordinatorGrpcService::UserCall(const grpc::CallbackServerContext& context) const {
  return auth_->CheckUser(AuthorizationOf(context));
}

absl::Status CoordinatorGrpcService::WorkerCall(const grpc::CallbackServerContext& context,
                                                absl::string_view worker_id) const {
  return auth_->CheckWorker(AuthorizationOf(context), worker_id).status();
}

void CoordinatorGrpcService::CountRefusal(const grpc::CallbackServerContext& context,
                                          absl::string_view method, const absl::Status& refused) {
  if (refused.code() == absl::StatusCode::kUnauthenticated &&
      auth_->IsStaleWorkerSession(AuthorizationOf(context))) {
    metrics_->CountStaleSession(method);
  } else {
    metrics_->CountRefused(method, refused.code());
  }
}

void CoordinatorGrpcService::Shutdown() { streams_.Shutdown(); }

template <typename Handler>
grpc::ServerUnaryReactor* CoordinatorGrpcService::Respond(grpc::CallbackServerContext* context,
                                                          absl::string_view method,
                                                          const absl::Status& authorized,
                                                          Handler handler, const Runner& run) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!authorized.ok()) {
    CountRefusal(*context, method, authorized);
    reactor->Finish(ToGrpcStatus(authorized));
    return reactor;
  }
  run([reactor, handler]() { reactor->Finish(ToGrpcStatus(handler())); });
  return reactor;
}

template <typename Handler>
grpc::ServerUnaryReactor* CoordinatorGrpcService::Unary(grpc::CallbackServerContext* context,
                                                        absl::string_view method,
                                                        const absl::Status& authorized,
                                                        Handler handler) {
  return Respond(context, method, authorized, std::move(handler),
                 [](std::function<void()> task) { task(); });
}

template <typename Handler>
grpc::ServerUnaryReactor* CoordinatorGrpcService::OffReaction(grpc::CallbackServerContext* context,
                                                              absl::string_view method,
                                                              const absl::Status& authorized,
                                                              Handler handler, const Runner& run) {
  // The context stays valid until the call is finished; IsCancelled is
  // thread-safe.
  auto unless_abandoned = [context, handler = std::move(handler)]() -> absl::Status {
    if (context->IsCancelled()) {
      return absl::CancelledError(
          "the call was abandoned (its deadline passed) while it waited for earlier calls; "
          "nothing was done");
    }
    return handler();
  };
  return Respond(context, method, authorized, std::move(unless_abandoned), run);
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::RegisterWorker(
    grpc::CallbackServerContext* context, const v1::RegisterWorkerRequest* request,
    v1::RegisterWorkerResponse* response) {
  // The join token travels in the request. Off the reaction: Register
  // returns once the state store has the worker, and a fleet registering
  // at once (after a failover) would hold gRPC's callback threads, and the
  // heartbeats queued behind them, for a commit each.
  return OffReaction(
      context, "RegisterWorker", workers_->CheckJoinToken(request->join_token()),
      [this, request, response]() -> absl::Status {
        ASSIGN_OR_RETURN(*response, workers_->Register(*request));
        streams_.Supersede(response->worker_id(), response->incarnation());
        // One pass for the registrations until it begins: it sees them all.
        if (!schedule_posted_.exchange(true)) {
          executor_.Post([this] {
            schedule_posted_.store(false);
            jobs_->ScheduleQueued();
          });
        }
        return absl::OkStatus();
      },
      registrations_);
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::Heartbeat(grpc::CallbackServerContext* context,
                                                            const v1::HeartbeatRequest* request,
                                                            v1::HeartbeatResponse* response) {
  return Unary(context, "Heartbeat", WorkerCall(*context, request->worker_id()),
               [&]() -> absl::Status {
                 RETURN_IF_ERROR(workers_->Heartbeat(*request));
                 // So the worker can say it is drained when it registers
                 // again (a drain outlives a coordinator restart).
                 ASSIGN_OR_RETURN(const v1::Worker self, workers_->Get(request->worker_id()));
                 response->set_drained(jobs_->IsDrained(self));
                 return absl::OkStatus();
               });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::DeregisterWorker(
    grpc::CallbackServerContext* context, const v1::DeregisterWorkerRequest* request,
    v1::DeregisterWorkerResponse*) {
  return Unary(context, "DeregisterWorker", WorkerCall(*context, request->worker_id()),
               [&] { return workers_->Deregister(request->worker_id(), request->incarnation()); });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::DrainWorker(grpc::CallbackServerContext* context,
                                                              const v1::DrainWorkerRequest* request,
                                                              v1::Worker* response) {
  // A user may drain any worker; a worker only itself (as it shuts down).
  absl::Status allowed = UserCall(*context);
  if (!allowed.ok()) {
    absl::Status as_worker = WorkerCall(*context, request->worker_id());
    if (as_worker.ok() || as_worker.code() == absl::StatusCode::kPermissionDenied) {
      allowed = as_worker;
    }
  }
  // Waits for the store's commit of the drain.
  return OffReaction(
      context, "DrainWorker", allowed,
      [this, request, response]() -> absl::Status {
        ASSIGN_OR_RETURN(*response, jobs_->Drain(request->worker_id()));
        return absl::OkStatus();
      },
      store_calls_);
}

absl::Status CoordinatorGrpcService::CheckWatcher(
    const v1::WatchAssignmentsRequest& request) const {
  if (request.worker_id().empty()) {
    return absl::InvalidArgumentError("WatchAssignments: worker_id is empty; register first");
  }
  ASSIGN_OR_RETURN(v1::Worker worker, workers_->Get(request.worker_id()));
  if (worker.incarnation() != request.incarnation()) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker.id(), " incarnation ", request.incarnation(),
                     " is not current (", worker.incarnation(), "); register again"));
  }
  if (worker.state() == v1::WORKER_STATE_LOST || worker.state() == v1::WORKER_STATE_LEFT) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", worker.id(), " is ", EnumShortName(worker.state()), "; register again"));
  }
  return absl::OkStatus();
}

grpc::ServerWriteReactor<v1::Assignment>* CoordinatorGrpcService::WatchAssignments(
    grpc::CallbackServerContext* context, const v1::WatchAssignmentsRequest* request) {
  absl::Status valid = WorkerCall(*context, request->worker_id());
  if (!valid.ok()) {
    CountRefusal(*context, "WatchAssignments", valid);
  } else {
    valid = CheckWatcher(*request);
  }
  if (!valid.ok()) {
    // A reactor that only finishes; it deletes itself when done.
    class Rejected final : public grpc::ServerWriteReactor<v1::Assignment> {
     public:
      explicit Rejected(grpc::Status status) { Finish(std::move(status)); }
      void OnDone() override { delete this; }
    };
    return new Rejected(ToGrpcStatus(valid));
  }
  return streams_.Open(request->worker_id(), request->incarnation());
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::ReportProgress(
    grpc::CallbackServerContext* context, const v1::ReportProgressRequest* request,
    v1::ReportProgressResponse* response) {
  return Unary(context, "ReportProgress", WorkerCall(*context, request->worker_id()),
               [&]() -> absl::Status {
                 JobManager::ProgressCounted counted;
                 ASSIGN_OR_RETURN(*response, jobs_->ReportProgress(*request, &counted));
                 RecordProgress(*request, counted);
                 return absl::OkStatus();
               });
}

void CoordinatorGrpcService::RecordProgress(const v1::ReportProgressRequest& request,
                                            const JobManager::ProgressCounted& counted) {
  // What the job took, only: a retried report, one of a stopped plan or
  // another replica's losses would count twice or for nothing.
  if (counted.step) metrics_->CountStep();
  if (!counted.stage_time || counted.workers <= 0) return;
  // worker_ids is in plan order: replica-major, then stage, tensor rank
  // innermost (the spec carries the layout a plan chose). A stage's
  // counters get the mean of its workers' times.
  const int workers = counted.workers, replicas = counted.replicas, tensor = counted.tensor;
  const double share = workers % (replicas * tensor) == 0 ? 1.0 / (replicas * tensor) : 1.0;
  metrics_->AddStageTime(
      CoordinatorMetrics::PipelineStageOf(counted.worker_index, workers, replicas, tensor),
      request.busy_seconds() * share, request.idle_seconds() * share);
}

grpc::ServerReadReactor<v1::WeightsChunk>* CoordinatorGrpcService::UploadWeights(
    grpc::CallbackServerContext* context, v1::UploadWeightsResponse*) {
  // The credential is read when the stream opens; every chunk must name its worker.
  return NewWeightsUpload(
      context, AuthorizationOf(*context), auth_, metrics_, jobs_,
      [this](const std::string& worker_id) {
        return &upload_strands_[std::hash<std::string>()(worker_id) % upload_strands_.size()];
      },
      &open_uploads_);
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::SubmitJob(grpc::CallbackServerContext* context,
                                                            const v1::SubmitJobRequest* request,
                                                            v1::Job* response) {
  // Waits for the store's commit of the job.
  return OffReaction(
      context, "SubmitJob", UserCall(*context),
      [this, request, response]() -> absl::Status {
        ASSIGN_OR_RETURN(*response, jobs_->Submit(request->spec(), request->request_id()));
        return absl::OkStatus();
      },
      store_calls_);
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::GetJob(grpc::CallbackServerContext* context,
                                                         const v1::GetJobRequest* request,
                                                         v1::Job* response) {
  return Unary(context, "GetJob", UserCall(*context), [&]() -> absl::Status {
    ASSIGN_OR_RETURN(*response, GetJobInView(*jobs_, *request));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::ListJobs(grpc::CallbackServerContext* context,
                                                           const v1::ListJobsRequest* request,
                                                           v1::ListJobsResponse* response) {
  return Unary(context, "ListJobs", UserCall(*context), [&]() -> absl::Status {
    ASSIGN_OR_RETURN(*response, ListJobsPage(*jobs_, *request));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::CancelJob(grpc::CallbackServerContext* context,
                                                            const v1::CancelJobRequest* request,
                                                            v1::Job* response) {
  // Waits for the store's commit of the cancel, behind the saves queued before it.
  return OffReaction(
      context, "CancelJob", UserCall(*context),
      [this, context, request, response]() -> absl::Status {
        // Within the caller's deadline: it reads "not yet recorded" and
        // asks again, rather than a DEADLINE_EXCEEDED for a cancel made.
        ASSIGN_OR_RETURN(
            *response,
            jobs_->Cancel(request->id(), CallerWaitBudget(context->deadline(), absl::Now())));
        return absl::OkStatus();
      },
      store_calls_);
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::ListWorkers(grpc::CallbackServerContext* context,
                                                              const v1::ListWorkersRequest* request,
                                                              v1::ListWorkersResponse* response) {
  return Unary(context, "ListWorkers", UserCall(*context), [&]() -> absl::Status {
    ASSIGN_OR_RETURN(*response, ListWorkersPage(*workers_, *jobs_, *request));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::GetPlan(grpc::CallbackServerContext* context,
                                                          const v1::GetPlanRequest* request,
                                                          v1::Plan* response) {
  return Unary(context, "GetPlan", UserCall(*context), [&]() -> absl::Status {
    ASSIGN_OR_RETURN(*response, jobs_->GetPlan(request->job_id()));
    return absl::OkStatus();
  });
}

}  // namespace pipetrain
