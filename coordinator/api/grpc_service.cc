#include "coordinator/api/grpc_service.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/enum_names.h"
#include "common/grpc_credentials.h"
#include "common/logging.h"
#include "common/raw_request.h"
#include "common/status_macros.h"
#include "coordinator/api/grpc_status.h"
#include "coordinator/api/list_pages.h"
#include "coordinator/api/weights_upload.h"

namespace pipetrain {

CoordinatorGrpcService::CoordinatorGrpcService(WorkerRegistry* workers, JobManager* jobs,
                                               AssignmentHub* hub, CoordinatorMetrics* metrics,
                                               const CallerAuth* auth, Runner store_calls,
                                               Runner registrations, size_t max_plan_reply_bytes)
    : workers_(workers),
      jobs_(jobs),
      metrics_(metrics),
      auth_(auth),
      max_plan_reply_bytes_(max_plan_reply_bytes),
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

absl::Status CoordinatorGrpcService::AnyWorkerCall(
    const grpc::CallbackServerContext& context) const {
  return auth_->AuthenticateWorker(AuthorizationOf(context)).status();
}

namespace {

// A stream that only finishes with `status`; it deletes itself when done.
class RejectedStream final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit RejectedStream(const absl::Status& status) { Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

}  // namespace

template <typename Request, typename Response>
class CoordinatorGrpcService::TypedCall final : public grpc::ServerUnaryReactor {
 public:
  TypedCall(grpc::CallbackServerContext* context, grpc::ByteBuffer* answer)
      : context_(context), answer_(answer) {}

  grpc::CallbackServerContext* context() const { return context_; }

  // Serializes `response` when `status` is OK, and finishes the call.
  // Once, from any thread.
  void FinishWith(const absl::Status& status) {
    Finish(ToGrpcStatus(status.ok() ? SerializeAnswer(response, answer_) : status));
  }

  void OnDone() override { delete this; }

  Request request;
  Response response;

 private:
  grpc::CallbackServerContext* const context_;
  grpc::ByteBuffer* const answer_;
};

template <typename Request, typename Response, typename Body>
grpc::ServerUnaryReactor* CoordinatorGrpcService::Parsed(
    grpc::CallbackServerContext* context, absl::string_view method, const absl::Status& credential,
    size_t max_bytes, const grpc::ByteBuffer* raw, grpc::ByteBuffer* answer, Body body) {
  absl::Status refused = credential;
  if (!refused.ok()) {
    CountRefusal(*context, method, refused);
  } else {
    refused = CheckRequestBytes(method, raw->Length(), max_bytes);
  }
  if (!refused.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(refused));
    return reactor;
  }
  auto* call = new TypedCall<Request, Response>(context, answer);
  if (absl::Status parsed = ParseRequest(method, *raw, &call->request); !parsed.ok()) {
    call->FinishWith(parsed);
    return call;
  }
  body(call);
  return call;
}

template <typename Call, typename Handler>
void CoordinatorGrpcService::Respond(Call* call, absl::string_view method,
                                     const absl::Status& authorized, Handler handler,
                                     const Runner& run) {
  if (!authorized.ok()) {
    CountRefusal(*call->context(), method, authorized);
    call->FinishWith(authorized);
    return;
  }
  run([call, handler]() { call->FinishWith(handler()); });
}

template <typename Call, typename Handler>
void CoordinatorGrpcService::Unary(Call* call, absl::string_view method,
                                   const absl::Status& authorized, Handler handler) {
  Respond(call, method, authorized, std::move(handler), [](std::function<void()> task) { task(); });
}

template <typename Call, typename Handler>
void CoordinatorGrpcService::OffReaction(Call* call, absl::string_view method,
                                         const absl::Status& authorized, Handler handler,
                                         const Runner& run) {
  // The context stays valid until the call is finished; IsCancelled is
  // thread-safe.
  auto unless_abandoned = [context = call->context(),
                           handler = std::move(handler)]() -> absl::Status {
    if (context->IsCancelled()) {
      return absl::CancelledError(
          "the call was abandoned (its deadline passed) while it waited for earlier calls; "
          "nothing was done");
    }
    return handler();
  };
  Respond(call, method, authorized, std::move(unless_abandoned), run);
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::RegisterWorker(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw, grpc::ByteBuffer* answer) {
  // The join token travels in the request: no credential before it is
  // parsed, which kMaxSmallRequestBytes bounds. Off the reaction: Register
  // returns once the state store has the worker, and a fleet registering
  // at once (after a failover) would hold gRPC's callback threads, and the
  // heartbeats queued behind them, for a commit each.
  using Call = TypedCall<v1::RegisterWorkerRequest, v1::RegisterWorkerResponse>;
  return Parsed<v1::RegisterWorkerRequest, v1::RegisterWorkerResponse>(
      context, "RegisterWorker", absl::OkStatus(), kMaxSmallRequestBytes, raw, answer,
      [this](Call* call) {
        const v1::RegisterWorkerRequest* request = &call->request;
        v1::RegisterWorkerResponse* response = &call->response;
        OffReaction(
            call, "RegisterWorker", workers_->CheckJoinToken(request->join_token()),
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
      });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::Heartbeat(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* raw,
                                                            grpc::ByteBuffer* answer) {
  using Call = TypedCall<v1::HeartbeatRequest, v1::HeartbeatResponse>;
  return Parsed<v1::HeartbeatRequest, v1::HeartbeatResponse>(
      context, "Heartbeat", AnyWorkerCall(*context), kMaxSmallRequestBytes, raw, answer,
      [this](Call* call) {
        const v1::HeartbeatRequest* request = &call->request;
        v1::HeartbeatResponse* response = &call->response;
        Unary(call, "Heartbeat", WorkerCall(*call->context(), request->worker_id()),
              [&]() -> absl::Status {
                RETURN_IF_ERROR(workers_->Heartbeat(*request));
                // So the worker can say it is drained when it registers
                // again (a drain outlives a coordinator restart).
                ASSIGN_OR_RETURN(const v1::Worker self, workers_->Get(request->worker_id()));
                response->set_drained(jobs_->IsDrained(self));
                return absl::OkStatus();
              });
      });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::DeregisterWorker(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw, grpc::ByteBuffer* answer) {
  using Call = TypedCall<v1::DeregisterWorkerRequest, v1::DeregisterWorkerResponse>;
  return Parsed<v1::DeregisterWorkerRequest, v1::DeregisterWorkerResponse>(
      context, "DeregisterWorker", AnyWorkerCall(*context), kMaxSmallRequestBytes, raw, answer,
      [this](Call* call) {
        const v1::DeregisterWorkerRequest* request = &call->request;
        Unary(call, "DeregisterWorker", WorkerCall(*call->context(), request->worker_id()),
              [&] { return workers_->Deregister(request->worker_id(), request->incarnation()); });
      });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::DrainWorker(grpc::CallbackServerContext* context,
                                                              const grpc::ByteBuffer* raw,
                                                              grpc::ByteBuffer* answer) {
  // A user may drain any worker; a worker only itself (as it shuts down).
  const absl::Status as_user = UserCall(*context);
  absl::Status credential = as_user;
  if (!credential.ok()) {
    // A worker's own session gone stale (it registered again, or the
    // coordinator restarted) is refused as such: "user token rejected"
    // sent its operator looking for a token that workers never hold.
    const absl::Status as_worker = AnyWorkerCall(*context);
    if (as_worker.ok() || auth_->IsStaleWorkerSession(AuthorizationOf(*context))) {
      credential = as_worker;
    }
  }
  using Call = TypedCall<v1::DrainWorkerRequest, v1::Worker>;
  return Parsed<v1::DrainWorkerRequest, v1::Worker>(
      context, "DrainWorker", credential, kMaxSmallRequestBytes, raw, answer,
      [this, as_user](Call* call) {
        const v1::DrainWorkerRequest* request = &call->request;
        v1::Worker* response = &call->response;
        absl::Status allowed = as_user;
        if (!allowed.ok()) allowed = WorkerCall(*call->context(), request->worker_id());
        // Waits for the store's commit of the drain.
        OffReaction(
            call, "DrainWorker", allowed,
            [this, request, response]() -> absl::Status {
              ASSIGN_OR_RETURN(*response, jobs_->Drain(request->worker_id()));
              return absl::OkStatus();
            },
            store_calls_);
      });
}

absl::Status CoordinatorGrpcService::CheckWatcher(
    const v1::WatchAssignmentsRequest& request) const {
  if (request.worker_id().empty()) {
    return absl::InvalidArgumentError("WatchAssignments: worker_id is empty; register first");
  }
  ASSIGN_OR_RETURN(v1::Worker worker, workers_->Get(request.worker_id()));
  if (worker.incarnation() != request.incarnation()) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", worker.id(), " incarnation ",
                                                      request.incarnation(), " is not current (",
                                                      worker.incarnation(), "); register again"));
  }
  if (worker.state() == v1::WORKER_STATE_LOST || worker.state() == v1::WORKER_STATE_LEFT) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", worker.id(), " is ", EnumShortName(worker.state()), "; register again"));
  }
  return absl::OkStatus();
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* CoordinatorGrpcService::WatchAssignments(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw) {
  constexpr absl::string_view kMethod = "WatchAssignments";
  absl::Status valid = AnyWorkerCall(*context);
  if (!valid.ok()) {
    CountRefusal(*context, kMethod, valid);
    return new RejectedStream(valid);
  }
  v1::WatchAssignmentsRequest request;
  valid = CheckRequestBytes(kMethod, raw->Length(), kMaxSmallRequestBytes);
  if (valid.ok()) valid = ParseRequest(kMethod, *raw, &request);
  if (!valid.ok()) return new RejectedStream(valid);
  valid = WorkerCall(*context, request.worker_id());
  if (!valid.ok()) {
    CountRefusal(*context, kMethod, valid);
  } else {
    valid = CheckWatcher(request);
  }
  if (!valid.ok()) return new RejectedStream(valid);
  // A stream ended with a write in flight (superseded, or at shutdown) is
  // cancelled: a client that grants no window never completes that write.
  return streams_.Open(request.worker_id(), request.incarnation(),
                       [context] { context->TryCancel(); });
}

namespace {

// FAILED_PRECONDITION unless the report is of the incarnation whose session
// credential it carries. A worker's job runner reads the agent's current
// credential at each call: a runner the worker had not yet stopped when it
// registered again (or one it started, from the earlier incarnation's
// stream, as the agent registered again) sends the new credential with its
// own, earlier incarnation, and its reports must not count as the new
// incarnation's. The message carries the phrase "report of a stale job
// runner", which workers match (job_runner.cc, StaleRunnerRefused) to stop
// such a runner quietly: keep it.
absl::Status CheckReportIncarnation(const v1::ReportProgressRequest& request,
                                    const WorkerRegistry::SessionIdentity& caller) {
  if (request.incarnation() == caller.incarnation) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "worker ", caller.worker_id, ": report of a stale job runner (incarnation ",
      request.incarnation(), ", the session's is ", caller.incarnation, "); not taken"));
}

}  // namespace

grpc::ServerUnaryReactor* CoordinatorGrpcService::ReportProgress(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw, grpc::ByteBuffer* answer) {
  // Up to the server's 4 MiB: a traced step's report is large.
  using Call = TypedCall<v1::ReportProgressRequest, v1::ReportProgressResponse>;
  return Parsed<v1::ReportProgressRequest, v1::ReportProgressResponse>(
      context, "ReportProgress", AnyWorkerCall(*context), SIZE_MAX, raw, answer,
      [this](Call* call) {
        const v1::ReportProgressRequest* request = &call->request;
        v1::ReportProgressResponse* response = &call->response;
        const absl::StatusOr<WorkerRegistry::SessionIdentity> caller =
            auth_->CheckWorker(AuthorizationOf(*call->context()), request->worker_id());
        Unary(call, "ReportProgress", caller.status(), [&]() -> absl::Status {
          RETURN_IF_ERROR(CheckReportIncarnation(*request, *caller));
          JobManager::ProgressCounted counted;
          ASSIGN_OR_RETURN(*response, jobs_->ReportProgress(*request, &counted));
          RecordProgress(*request, counted);
          return absl::OkStatus();
        });
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
                                                            const grpc::ByteBuffer* raw,
                                                            grpc::ByteBuffer* answer) {
  // Up to the server's 4 MiB (a spec's manual stages). Waits for the
  // store's commit of the job.
  using Call = TypedCall<v1::SubmitJobRequest, v1::Job>;
  return Parsed<v1::SubmitJobRequest, v1::Job>(
      context, "SubmitJob", UserCall(*context), SIZE_MAX, raw, answer, [this](Call* call) {
        const v1::SubmitJobRequest* request = &call->request;
        v1::Job* response = &call->response;
        OffReaction(
            call, "SubmitJob", absl::OkStatus(),
            [this, request, response]() -> absl::Status {
              ASSIGN_OR_RETURN(*response, jobs_->Submit(request->spec(), request->request_id()));
              return absl::OkStatus();
            },
            store_calls_);
      });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::GetJob(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* raw,
                                                         grpc::ByteBuffer* answer) {
  using Call = TypedCall<v1::GetJobRequest, v1::Job>;
  return Parsed<v1::GetJobRequest, v1::Job>(
      context, "GetJob", UserCall(*context), kMaxSmallRequestBytes, raw, answer,
      [this](Call* call) {
        const v1::GetJobRequest* request = &call->request;
        v1::Job* response = &call->response;
        Unary(call, "GetJob", absl::OkStatus(), [&]() -> absl::Status {
          ASSIGN_OR_RETURN(*response, GetJobInView(*jobs_, *request));
          return absl::OkStatus();
        });
      });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::ListJobs(grpc::CallbackServerContext* context,
                                                           const grpc::ByteBuffer* raw,
                                                           grpc::ByteBuffer* answer) {
  using Call = TypedCall<v1::ListJobsRequest, v1::ListJobsResponse>;
  return Parsed<v1::ListJobsRequest, v1::ListJobsResponse>(
      context, "ListJobs", UserCall(*context), kMaxSmallRequestBytes, raw, answer,
      [this](Call* call) {
        const v1::ListJobsRequest* request = &call->request;
        v1::ListJobsResponse* response = &call->response;
        Unary(call, "ListJobs", absl::OkStatus(), [&]() -> absl::Status {
          ASSIGN_OR_RETURN(*response, ListJobsPage(*jobs_, *request));
          return absl::OkStatus();
        });
      });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::CancelJob(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* raw,
                                                            grpc::ByteBuffer* answer) {
  // Waits for the store's commit of the cancel, behind the saves queued before it.
  using Call = TypedCall<v1::CancelJobRequest, v1::Job>;
  return Parsed<v1::CancelJobRequest, v1::Job>(
      context, "CancelJob", UserCall(*context), kMaxSmallRequestBytes, raw, answer,
      [this](Call* call) {
        const v1::CancelJobRequest* request = &call->request;
        v1::Job* response = &call->response;
        grpc::CallbackServerContext* context = call->context();
        OffReaction(
            call, "CancelJob", absl::OkStatus(),
            [context, this, request, response]() -> absl::Status {
              // Within the caller's deadline: it reads "not yet recorded"
              // and asks again, rather than a DEADLINE_EXCEEDED for a
              // cancel made.
              ASSIGN_OR_RETURN(
                  *response,
                  jobs_->Cancel(request->id(), CallerWaitBudget(context->deadline(), absl::Now())));
              return absl::OkStatus();
            },
            store_calls_);
      });
}

grpc::ServerUnaryReactor* CoordinatorGrpcService::ListWorkers(grpc::CallbackServerContext* context,
                                                              const grpc::ByteBuffer* raw,
                                                              grpc::ByteBuffer* answer) {
  using Call = TypedCall<v1::ListWorkersRequest, v1::ListWorkersResponse>;
  return Parsed<v1::ListWorkersRequest, v1::ListWorkersResponse>(
      context, "ListWorkers", UserCall(*context), kMaxSmallRequestBytes, raw, answer,
      [this](Call* call) {
        const v1::ListWorkersRequest* request = &call->request;
        v1::ListWorkersResponse* response = &call->response;
        Unary(call, "ListWorkers", absl::OkStatus(), [&]() -> absl::Status {
          ASSIGN_OR_RETURN(*response, ListWorkersPage(*workers_, *jobs_, *request));
          return absl::OkStatus();
        });
      });
}

namespace {

// Leaves drawings out of `plan` until it serializes to at most `max_bytes`,
// naming each in drawings_omitted. The Chrome traces go first: only the
// CLI's pass-time table (which needs both) and its --json read them, while
// --timeline, --measured-timeline and `up` write the SVGs. The measured
// one of each goes before the predicted one, so that the table is left
// out whole rather than compared against nothing.
void FitPlanReply(size_t max_bytes, v1::Plan& plan) {
  const std::pair<const char*, std::string* (v1::Plan::*)()> drawings[] = {
      {"measured_chrome_trace_json", &v1::Plan::mutable_measured_chrome_trace_json},
      {"chrome_trace_json", &v1::Plan::mutable_chrome_trace_json},
      {"measured_timeline_svg", &v1::Plan::mutable_measured_timeline_svg},
      {"timeline_svg", &v1::Plan::mutable_timeline_svg}};
  for (const auto& [name, field] : drawings) {
    if (plan.ByteSizeLong() <= max_bytes) return;
    std::string* drawing = (plan.*field)();
    if (drawing->empty()) continue;
    std::string().swap(*drawing);  // its memory too, not only its length
    plan.add_drawings_omitted(name);
  }
}

}  // namespace

grpc::ServerUnaryReactor* CoordinatorGrpcService::GetPlan(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* raw,
                                                          grpc::ByteBuffer* answer) {
  using Call = TypedCall<v1::GetPlanRequest, v1::Plan>;
  return Parsed<v1::GetPlanRequest, v1::Plan>(
      context, "GetPlan", UserCall(*context), kMaxSmallRequestBytes, raw, answer,
      [this](Call* call) {
        const v1::GetPlanRequest* request = &call->request;
        v1::Plan* response = &call->response;
        // Off the reaction, one at a time: a traced job's measured
        // timeline copies every traced program under the job manager's
        // lock and renders tens of MB, which on gRPC's callback threads
        // delayed the heartbeats queued behind it (STYLE.md: never block
        // in a reaction).
        OffReaction(
            call, "GetPlan", absl::OkStatus(),
            [this, request, response]() -> absl::Status {
              ASSIGN_OR_RETURN(*response, jobs_->GetPlan(request->job_id()));
              FitPlanReply(max_plan_reply_bytes_, *response);
              return absl::OkStatus();
            },
            plan_reads_);
      });
}

}  // namespace pipetrain
