#include "coordinator/api/grpc_service.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "common/clock.h"
#include "common/grpc_credentials.h"
#include "common/rpc_status.h"
#include "coordinator/api/bad_specs_testing.h"
#include "coordinator/api/coordinator_metrics.h"
#include "coordinator/jobs/assignment_hub.h"
#include "coordinator/jobs/background_queue_testing.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/registry/worker_registry.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "proto/pipetrain/v1/coordinator.grpc.pb.h"
#include "spec/job_spec.h"

namespace pipetrain {
namespace {

constexpr char kJoinToken[] = "join-secret";
constexpr char kUserToken[] = "user-secret";

// Every call gets a deadline: a broken server fails the test, it does not hang it.
void SetDeadline(grpc::ClientContext& context) {
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
}

// The service on a free loopback port over a real registry and job manager
// (fake clock), and a client stub.
class GrpcServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    jobs_.SetEvents(metrics_.Events());  // as the coordinator's main does
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    builder.experimental().SetInterceptorCreators(metrics_.rpc().Interceptors());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    const std::string address = "127.0.0.1:" + std::to_string(port);
    stub_ = v1::CoordinatorService::NewStub(
        BearerChannel(address, grpc::InsecureChannelCredentials(), {}, kUserToken));
    raw_ = v1::CoordinatorService::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    service_.Shutdown();
    server_->Shutdown();
  }

  grpc::Status Register(const std::string& token, v1::RegisterWorkerResponse* response,
                        const std::string& address = "127.0.0.1:9001") {
    v1::RegisterWorkerRequest request;
    request.set_join_token(token);
    request.set_data_address(address);
    grpc::ClientContext context;
    SetDeadline(context);
    return stub_->RegisterWorker(&context, request, response);
  }

  grpc::Status Submit(const v1::JobSpec& spec, v1::Job* job) {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    grpc::ClientContext context;
    SetDeadline(context);
    grpc::Status status = stub_->SubmitJob(&context, request, job);
    jobs_.AwaitBackgroundWork();  // planned off the lock: RUNNING once this returns
    return status;
  }

  v1::JobSpec ValidSpec() {
    absl::StatusOr<v1::JobSpec> spec = JobSpecFromJson(ValidSpecJson());
    EXPECT_TRUE(spec.ok()) << spec.status();
    return spec.value_or(v1::JobSpec());
  }

  // Registers one worker and opens its assignment stream on `context`.
  std::unique_ptr<grpc::ClientReader<v1::Assignment>> Watch(grpc::ClientContext& context,
                                                            v1::RegisterWorkerResponse* worker) {
    EXPECT_TRUE(Register(kJoinToken, worker).ok());
    v1::WatchAssignmentsRequest request;
    request.set_worker_id(worker->worker_id());
    request.set_incarnation(worker->incarnation());
    SetDeadline(context);
    AddBearer(context, worker->session_token());
    return raw_->WatchAssignments(&context, request);
  }

  std::string MetricsText() {
    metrics_.Refresh();
    return prometheus::TextSerializer().Serialize(metrics_.registry()->Collect());
  }

  FakeClock clock_;
  WorkerRegistry workers_{WorkerRegistry::Options{.join_token = kJoinToken, .clock = &clock_}};
  AssignmentHub hub_;
  JobManager jobs_{&workers_, &hub_, &clock_};
  CoordinatorMetrics metrics_{&workers_, &jobs_};
  const CallerAuth auth_{kUserToken, &workers_};
  CoordinatorGrpcService service_{&workers_, &jobs_, &hub_, &metrics_, &auth_};
  std::unique_ptr<grpc::Server> server_;
  // Users call through stub_ (the user token on every call); workers through
  // raw_ with their session credential added per call.
  std::unique_ptr<v1::CoordinatorService::Stub> stub_;
  std::unique_ptr<v1::CoordinatorService::Stub> raw_;
};

TEST_F(GrpcServiceTest, RegisterWorker_WithoutJoinToken_Unauthenticated) {
  v1::RegisterWorkerResponse response;
  grpc::Status status = Register("", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "token")) << status.error_message();
}

TEST_F(GrpcServiceTest, RegisterWorker_WithJoinToken_ReturnsIdAndLease) {
  v1::RegisterWorkerResponse response;
  grpc::Status status = Register(kJoinToken, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.worker_id(), "w-1");
  EXPECT_EQ(response.incarnation(), 1);
  EXPECT_EQ(response.heartbeat_interval_seconds(), 1.0);
  EXPECT_EQ(response.lease_seconds(), 5.0);
}

TEST_F(GrpcServiceTest, Heartbeat_RegisteredWorker_Ok) {
  v1::RegisterWorkerResponse worker;
  ASSERT_TRUE(Register(kJoinToken, &worker).ok());
  v1::HeartbeatRequest request;
  request.set_worker_id(worker.worker_id());
  request.set_incarnation(worker.incarnation());
  request.set_current_instruction("idle");
  v1::HeartbeatResponse response;
  grpc::ClientContext context;
  SetDeadline(context);
  AddBearer(context, worker.session_token());
  grpc::Status status = raw_->Heartbeat(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(workers_.Get("w-1")->current_instruction(), "idle");
}

// A drain outlives a coordinator restart: heartbeats tell the worker it is
// drained, and a process that registers again saying so is drained from
// the moment it is READY: a job waiting for a worker does not get it.
TEST_F(GrpcServiceTest, Heartbeat_DrainedWorker_ToldSoAndRegisteringAgainStaysDrained) {
  v1::RegisterWorkerResponse worker;
  ASSERT_TRUE(Register(kJoinToken, &worker).ok());
  auto heartbeat = [&](const v1::RegisterWorkerResponse& w) {
    v1::HeartbeatRequest request;
    request.set_worker_id(w.worker_id());
    request.set_incarnation(w.incarnation());
    v1::HeartbeatResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    AddBearer(context, w.session_token());
    EXPECT_TRUE(raw_->Heartbeat(&context, request, &response).ok());
    return response.drained();
  };
  EXPECT_FALSE(heartbeat(worker));
  ASSERT_TRUE(jobs_.Drain(worker.worker_id()).ok());
  EXPECT_TRUE(heartbeat(worker));

  // The process registers again (as after a coordinator restart), drained.
  v1::RegisterWorkerRequest again;
  again.set_join_token(kJoinToken);
  again.set_data_address("127.0.0.1:9001");
  again.set_drained(true);
  v1::RegisterWorkerResponse second;
  {
    grpc::ClientContext context;
    SetDeadline(context);
    ASSERT_TRUE(stub_->RegisterWorker(&context, again, &second).ok());
  }
  ASSERT_EQ(second.incarnation(), 2);
  EXPECT_TRUE(heartbeat(second));
  v1::Job job;
  v1::JobSpec spec = ValidSpec();
  spec.mutable_parallelism()->set_stages(1);
  ASSERT_TRUE(Submit(spec, &job).ok());
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED) << job.reason();
  v1::ListWorkersResponse listed;
  grpc::ClientContext context;
  SetDeadline(context);
  ASSERT_TRUE(stub_->ListWorkers(&context, v1::ListWorkersRequest(), &listed).ok());
  ASSERT_EQ(listed.workers_size(), 1);
  EXPECT_TRUE(listed.workers(0).drained());
  EXPECT_EQ(listed.workers(0).state(), v1::WORKER_STATE_READY);
}

TEST_F(GrpcServiceTest, DeregisterWorker_Registered_LeftAndIdempotent) {
  v1::RegisterWorkerResponse worker;
  ASSERT_TRUE(Register(kJoinToken, &worker).ok());
  v1::DeregisterWorkerRequest request;
  request.set_worker_id(worker.worker_id());
  request.set_incarnation(worker.incarnation());
  for (int attempt = 0; attempt < 2; ++attempt) {
    v1::DeregisterWorkerResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    AddBearer(context, worker.session_token());
    grpc::Status status = raw_->DeregisterWorker(&context, request, &response);
    EXPECT_TRUE(status.ok()) << "attempt " << attempt << ": " << status.error_message();
  }
  EXPECT_EQ(workers_.Get(worker.worker_id())->state(), v1::WORKER_STATE_LEFT);
}

TEST_F(GrpcServiceTest, DeregisterWorker_UnknownOrOldIncarnation_Rejected) {
  v1::RegisterWorkerResponse worker;
  ASSERT_TRUE(Register(kJoinToken, &worker).ok());
  ASSERT_TRUE(Register(kJoinToken, &worker).ok());  // same address: incarnation 2
  v1::DeregisterWorkerRequest request;
  request.set_worker_id(worker.worker_id());
  request.set_incarnation(1);
  v1::DeregisterWorkerResponse response;
  grpc::ClientContext old_context;
  SetDeadline(old_context);
  AddBearer(old_context, worker.session_token());
  EXPECT_EQ(raw_->DeregisterWorker(&old_context, request, &response).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  request.set_worker_id("w-9");  // w-1's credential cannot act for anyone else
  grpc::ClientContext unknown_context;
  SetDeadline(unknown_context);
  AddBearer(unknown_context, worker.session_token());
  EXPECT_EQ(raw_->DeregisterWorker(&unknown_context, request, &response).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(workers_.Get(worker.worker_id())->state(), v1::WORKER_STATE_READY);
}

TEST_F(GrpcServiceTest, Heartbeat_SupersededSession_UnauthenticatedRegisterAgain) {
  v1::RegisterWorkerResponse first, second;
  ASSERT_TRUE(Register(kJoinToken, &first).ok());
  ASSERT_TRUE(Register(kJoinToken, &second).ok());  // same address: incarnation 2
  v1::HeartbeatRequest request;
  request.set_worker_id("w-1");
  request.set_incarnation(1);
  v1::HeartbeatResponse response;
  grpc::ClientContext context;
  SetDeadline(context);
  AddBearer(context, first.session_token());
  grpc::Status status = raw_->Heartbeat(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "register again"))
      << status.error_message();
}

TEST_F(GrpcServiceTest, SubmitJob_MalformedSpecs_InvalidArgumentNamingTheField) {
  int checked = 0;
  for (const BadSpec& bad : BadSpecs()) {
    if (bad.json_only) continue;  // a proto client cannot send unknown fields or wrong types
    SCOPED_TRACE(bad.name);
    absl::StatusOr<v1::JobSpec> spec = JobSpecFromJson(bad.json);
    ASSERT_TRUE(spec.ok()) << spec.status();
    v1::Job job;
    grpc::Status status = Submit(*spec, &job);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_TRUE(absl::StrContains(status.error_message(), bad.field))
        << status.error_message() << " does not name " << bad.field;
    // The details say the same, as a google.rpc.BadRequest field violation.
    absl::StatusOr<DecodedRpcStatus> details = DecodeRpcStatus(status.error_details());
    ASSERT_TRUE(details.ok()) << details.status();
    EXPECT_EQ(details->code, 3);
    ASSERT_EQ(details->violations.size(), 1u) << status.error_message();
    EXPECT_EQ(absl::StrCat(details->violations[0].field, ": ", details->violations[0].description),
              status.error_message());
    ++checked;
  }
  EXPECT_EQ(checked, 11);
}

TEST_F(GrpcServiceTest, WatchAssignments_JobRunsThenIsCancelled_StreamsRunThenStop) {
  grpc::ClientContext watch;
  v1::RegisterWorkerResponse worker;
  std::unique_ptr<grpc::ClientReader<v1::Assignment>> stream = Watch(watch, &worker);

  v1::Job job;
  ASSERT_TRUE(Submit(ValidSpec(), &job).ok());
  // The worker was READY at submission: placed at once (planned off the
  // job manager's lock, so PLANNING or already RUNNING), then running.
  EXPECT_TRUE(job.state() == v1::JOB_STATE_PLANNING || job.state() == v1::JOB_STATE_RUNNING)
      << v1::JobState_Name(job.state());
  EXPECT_EQ(jobs_.Get(job.id())->state(), v1::JOB_STATE_RUNNING);

  v1::Assignment assignment;
  ASSERT_TRUE(stream->Read(&assignment));
  EXPECT_EQ(assignment.action(), v1::Assignment::ACTION_RUN);
  EXPECT_EQ(assignment.job_id(), job.id());
  EXPECT_EQ(assignment.plan_version(), 1);
  EXPECT_EQ(assignment.stage(), 0);
  EXPECT_EQ(assignment.num_stages(), 1);
  EXPECT_GT(assignment.program().instructions_size(), 0);

  v1::CancelJobRequest cancel;
  cancel.set_id(job.id());
  v1::Job cancelled;
  grpc::ClientContext context;
  SetDeadline(context);
  ASSERT_TRUE(stub_->CancelJob(&context, cancel, &cancelled).ok());
  EXPECT_EQ(cancelled.state(), v1::JOB_STATE_CANCELLED);

  ASSERT_TRUE(stream->Read(&assignment));
  EXPECT_EQ(assignment.action(), v1::Assignment::ACTION_STOP);
  EXPECT_EQ(assignment.job_id(), job.id());

  watch.TryCancel();
  EXPECT_FALSE(stream->Read(&assignment));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(GrpcServiceTest, WatchAssignments_AfterJobStarted_SendsCurrentAssignmentFirst) {
  v1::RegisterWorkerResponse worker;
  ASSERT_TRUE(Register(kJoinToken, &worker).ok());
  v1::Job job;
  ASSERT_TRUE(Submit(ValidSpec(), &job).ok());

  v1::WatchAssignmentsRequest request;
  request.set_worker_id(worker.worker_id());
  request.set_incarnation(worker.incarnation());
  grpc::ClientContext watch;
  SetDeadline(watch);
  AddBearer(watch, worker.session_token());
  std::unique_ptr<grpc::ClientReader<v1::Assignment>> stream =
      raw_->WatchAssignments(&watch, request);
  v1::Assignment assignment;
  ASSERT_TRUE(stream->Read(&assignment));
  EXPECT_EQ(assignment.action(), v1::Assignment::ACTION_RUN);
  EXPECT_EQ(assignment.job_id(), job.id());
  watch.TryCancel();
  stream->Finish().IgnoreError();
}

TEST_F(GrpcServiceTest, WatchAssignments_AnotherWorkersCredential_PermissionDenied) {
  v1::RegisterWorkerResponse worker;
  ASSERT_TRUE(Register(kJoinToken, &worker).ok());
  v1::WatchAssignmentsRequest request;
  request.set_worker_id("w-7");
  request.set_incarnation(1);
  grpc::ClientContext watch;
  SetDeadline(watch);
  AddBearer(watch, worker.session_token());
  auto stream = raw_->WatchAssignments(&watch, request);
  v1::Assignment assignment;
  EXPECT_FALSE(stream->Read(&assignment));
  grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "w-7")) << status.error_message();
}

TEST_F(GrpcServiceTest, WatchAssignments_StaleIncarnation_FailedPrecondition) {
  v1::RegisterWorkerResponse first, second;
  ASSERT_TRUE(Register(kJoinToken, &first).ok());
  ASSERT_TRUE(Register(kJoinToken, &second).ok());  // same address: new incarnation
  ASSERT_EQ(second.incarnation(), 2);
  v1::WatchAssignmentsRequest request;
  request.set_worker_id("w-1");
  request.set_incarnation(1);
  grpc::ClientContext watch;
  SetDeadline(watch);
  AddBearer(watch, second.session_token());
  auto stream = raw_->WatchAssignments(&watch, request);
  v1::Assignment assignment;
  EXPECT_FALSE(stream->Read(&assignment));
  grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "register again"))
      << status.error_message();
}

TEST_F(GrpcServiceTest, WatchAssignments_WorkerReregisters_OldStreamAborted) {
  grpc::ClientContext watch;
  v1::RegisterWorkerResponse worker;
  auto stream = Watch(watch, &worker);
  v1::Job job;
  ASSERT_TRUE(Submit(ValidSpec(), &job).ok());
  v1::Assignment assignment;
  ASSERT_TRUE(stream->Read(&assignment));  // the stream is open on the server
  v1::RegisterWorkerResponse again;
  ASSERT_TRUE(Register(kJoinToken, &again).ok());
  ASSERT_EQ(again.incarnation(), 2);
  EXPECT_FALSE(stream->Read(&assignment));
  grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "superseded by incarnation 2"))
      << status.error_message();
}

TEST_F(GrpcServiceTest, Shutdown_OpenStream_EndsUnavailable) {
  grpc::ClientContext watch;
  v1::RegisterWorkerResponse worker;
  auto stream = Watch(watch, &worker);
  v1::Job job;
  ASSERT_TRUE(Submit(ValidSpec(), &job).ok());
  v1::Assignment assignment;
  ASSERT_TRUE(stream->Read(&assignment));  // the stream is open on the server
  service_.Shutdown();
  EXPECT_FALSE(stream->Read(&assignment));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(GrpcServiceTest, ListWorkers_OneRegistered_ReturnsIt) {
  v1::RegisterWorkerResponse worker;
  ASSERT_TRUE(Register(kJoinToken, &worker).ok());
  v1::ListWorkersResponse response;
  grpc::ClientContext context;
  SetDeadline(context);
  ASSERT_TRUE(stub_->ListWorkers(&context, v1::ListWorkersRequest(), &response).ok());
  ASSERT_EQ(response.workers_size(), 1);
  EXPECT_EQ(response.workers(0).id(), "w-1");
  EXPECT_EQ(response.workers(0).state(), v1::WORKER_STATE_READY);
  EXPECT_EQ(response.workers(0).data_address(), "127.0.0.1:9001");
}

TEST_F(GrpcServiceTest, GetPlan_RunningJob_ReturnsItsPlan) {
  v1::RegisterWorkerResponse worker;
  ASSERT_TRUE(Register(kJoinToken, &worker).ok());
  v1::Job job;
  ASSERT_TRUE(Submit(ValidSpec(), &job).ok());
  v1::GetPlanRequest request;
  request.set_job_id(job.id());
  v1::Plan plan;
  grpc::ClientContext context;
  SetDeadline(context);
  grpc::Status status = stub_->GetPlan(&context, request, &plan);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(plan.job_id(), job.id());
  EXPECT_EQ(plan.version(), 1);
  ASSERT_EQ(plan.stages_size(), 1);
  EXPECT_EQ(plan.stages(0).worker_id(), "w-1");
}

// A plan over the reply budget is sent without drawings until it fits,
// each named in drawings_omitted: the Chrome traces first, measured before
// predicted, then the SVGs. A large plan with a measured step passed the
// coordinator's 64 MiB and every GetPlan of it failed RESOURCE_EXHAUSTED.
TEST_F(GrpcServiceTest, GetPlan_OverReplyBudget_LeavesDrawingsOutNamingThem) {
  v1::RegisterWorkerResponse worker;
  ASSERT_TRUE(Register(kJoinToken, &worker).ok());
  v1::Job job;
  ASSERT_TRUE(Submit(ValidSpec(), &job).ok());
  // Step 10 traced by the job's one worker: each instruction 1 ms.
  std::optional<SequencedAssignment> assignment = hub_.Newer(worker.worker_id(), 0);
  ASSERT_TRUE(assignment.has_value());
  v1::ReportProgressRequest traced;
  traced.set_worker_id(worker.worker_id());
  traced.set_incarnation(worker.incarnation());
  traced.set_job_id(job.id());
  traced.set_plan_version(1);
  traced.set_iteration(9);
  v1::StepTrace* trace = traced.mutable_trace();
  trace->set_iteration(9);
  const int instructions = assignment->assignment.program().instructions_size();
  trace->set_seconds(0.001 * instructions);
  for (int i = 0; i < instructions; ++i) {
    v1::InstructionTiming* timing = trace->add_instructions();
    timing->set_instruction(i);
    timing->set_start_seconds(0.001 * i);
    timing->set_end_seconds(0.001 * (i + 1));
  }
  ASSERT_TRUE(jobs_.ReportProgress(traced).ok());
  const v1::Plan whole = jobs_.GetPlan(job.id()).value();
  ASSERT_FALSE(whole.measured_chrome_trace_json().empty());

  // GetPlan through a service whose replies are bounded by `budget`.
  auto get_plan = [&](size_t budget) {
    CoordinatorGrpcService service(&workers_, &jobs_, &hub_, &metrics_, &auth_, {}, {}, budget);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    EXPECT_GT(port, 0);
    auto stub = v1::CoordinatorService::NewStub(
        BearerChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(), {},
                      kUserToken));
    v1::GetPlanRequest request;
    request.set_job_id(job.id());
    v1::Plan plan;
    grpc::ClientContext context;
    SetDeadline(context);
    const grpc::Status status = stub->GetPlan(&context, request, &plan);
    EXPECT_TRUE(status.ok()) << status.error_message();
    service.Shutdown();
    server->Shutdown();
    return plan;
  };
  // What fits is sent whole.
  const v1::Plan fits = get_plan(whole.ByteSizeLong());
  EXPECT_EQ(fits.ByteSizeLong(), whole.ByteSizeLong());
  EXPECT_EQ(fits.drawings_omitted_size(), 0);
  // Over by a byte: the measured Chrome trace alone is left out.
  const v1::Plan over = get_plan(whole.ByteSizeLong() - 1);
  EXPECT_LE(over.ByteSizeLong(), whole.ByteSizeLong() - 1);
  EXPECT_EQ(std::vector<std::string>(over.drawings_omitted().begin(),
                                     over.drawings_omitted().end()),
            std::vector<std::string>{"measured_chrome_trace_json"});
  EXPECT_TRUE(over.measured_chrome_trace_json().empty());
  EXPECT_EQ(over.chrome_trace_json(), whole.chrome_trace_json());
  EXPECT_EQ(over.measured_timeline_svg(), whole.measured_timeline_svg());
  EXPECT_EQ(over.timeline_svg(), whole.timeline_svg());
  // Room for the predicted SVG alone (and the names of the rest).
  v1::Plan svg_only = whole;
  svg_only.clear_chrome_trace_json();
  svg_only.clear_measured_chrome_trace_json();
  svg_only.clear_measured_timeline_svg();
  for (const char* name :
       {"measured_chrome_trace_json", "chrome_trace_json", "measured_timeline_svg"}) {
    svg_only.add_drawings_omitted(name);
  }
  const v1::Plan small = get_plan(svg_only.ByteSizeLong());
  EXPECT_EQ(small.ByteSizeLong(), svg_only.ByteSizeLong());
  EXPECT_EQ(small.timeline_svg(), whole.timeline_svg());
  EXPECT_EQ(small.measured_step(), 9);  // still says there is a measured step
  EXPECT_EQ(small.drawings_omitted_size(), 3);
  // Under the plan without drawings: all four left out, its numbers sent.
  const v1::Plan none = get_plan(1);
  EXPECT_EQ(std::vector<std::string>(none.drawings_omitted().begin(),
                                     none.drawings_omitted().end()),
            (std::vector<std::string>{"measured_chrome_trace_json", "chrome_trace_json",
                                      "measured_timeline_svg", "timeline_svg"}));
  EXPECT_TRUE(none.timeline_svg().empty());
  ASSERT_EQ(none.stages_size(), 1);
  EXPECT_EQ(none.stages(0).worker_id(), worker.worker_id());
}

TEST_F(GrpcServiceTest, GetPlan_UnknownJob_NotFound) {
  v1::GetPlanRequest request;
  request.set_job_id("job-9");
  v1::Plan plan;
  grpc::ClientContext context;
  SetDeadline(context);
  EXPECT_EQ(stub_->GetPlan(&context, request, &plan).error_code(), grpc::StatusCode::NOT_FOUND);
}

// Each placement's planning is timed: its wait for the job manager's
// background thread and its computing, one observation of each.
TEST_F(GrpcServiceTest, SubmitJob_Placed_PlanSecondsObserved) {
  EXPECT_TRUE(
      absl::StrContains(MetricsText(), "pipetrain_plan_seconds_count{phase=\"computing\"} 0\n"));
  v1::RegisterWorkerResponse worker;
  ASSERT_TRUE(Register(kJoinToken, &worker).ok());
  v1::Job job;
  ASSERT_TRUE(Submit(ValidSpec(), &job).ok());  // placed and planned
  const std::string text = MetricsText();
  EXPECT_TRUE(absl::StrContains(text, "pipetrain_plan_seconds_count{phase=\"computing\"} 1\n"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "pipetrain_plan_seconds_count{phase=\"queued\"} 1\n"))
      << text;
}

TEST_F(GrpcServiceTest, GetJobAndListJobs_AfterSubmit_ReturnTheJob) {
  v1::Job job;
  ASSERT_TRUE(Submit(ValidSpec(), &job).ok());
  v1::GetJobRequest get;
  get.set_id(job.id());
  v1::Job got;
  grpc::ClientContext get_context;
  SetDeadline(get_context);
  ASSERT_TRUE(stub_->GetJob(&get_context, get, &got).ok());
  EXPECT_EQ(got.state(), v1::JOB_STATE_QUEUED);
  v1::ListJobsResponse list;
  grpc::ClientContext list_context;
  SetDeadline(list_context);
  ASSERT_TRUE(stub_->ListJobs(&list_context, v1::ListJobsRequest(), &list).ok());
  ASSERT_EQ(list.jobs_size(), 1);
  EXPECT_EQ(list.jobs(0).id(), job.id());
}

TEST_F(GrpcServiceTest, ReportProgress_StepWithLosses_UpdatesJobAndStageMetrics) {
  v1::RegisterWorkerResponse worker;
  ASSERT_TRUE(Register(kJoinToken, &worker).ok());
  v1::Job job;
  ASSERT_TRUE(Submit(ValidSpec(), &job).ok());
  v1::ReportProgressRequest request;
  request.set_worker_id(worker.worker_id());
  request.set_incarnation(worker.incarnation());
  request.set_job_id(job.id());
  request.set_plan_version(1);
  request.set_iteration(0);
  request.add_micro_batch_losses(2.5f);  // the job has one micro-batch
  request.set_busy_seconds(0.5);
  request.set_idle_seconds(0.25);
  v1::ReportProgressResponse response;
  grpc::ClientContext context;
  SetDeadline(context);
  AddBearer(context, worker.session_token());
  grpc::Status status = raw_->ReportProgress(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();

  EXPECT_EQ(jobs_.Get(job.id())->progress().loss(), 2.5f);
  const std::string text = MetricsText();
  EXPECT_TRUE(absl::StrContains(text, "pipetrain_stage_busy_seconds_total{stage=\"0\"} 0.5"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "pipetrain_stage_idle_seconds_total{stage=\"0\"} 0.25"));
  EXPECT_TRUE(absl::StrContains(text, "pipetrain_job_steps_total 1\n"));
  EXPECT_TRUE(absl::StrContains(text, "pipetrain_job_loss 2.5\n"));
  EXPECT_TRUE(absl::StrContains(text, "\npipetrain_plan_version "));
  EXPECT_TRUE(absl::StrContains(
      text,
      "pipetrain_rpc_duration_seconds_count{code=\"OK\",method=\"/pipetrain.v1.CoordinatorService/"
      "ReportProgress\"} 1\n"));
  // The plan's predicted share of the step of each stage, beside the
  // measured one above.
  const v1::Plan plan = jobs_.GetPlan(job.id()).value();
  ASSERT_EQ(plan.stages_size(), 1);
  ASSERT_GT(plan.stages(0).predicted_busy_seconds(), 0);
  for (const auto& [name, predicted] :
       {std::pair<std::string, double>{"pipetrain_plan_predicted_stage_busy_seconds",
                                       plan.stages(0).predicted_busy_seconds()},
        std::pair<std::string, double>{"pipetrain_plan_predicted_stage_idle_seconds",
                                       plan.stages(0).predicted_idle_seconds()}}) {
    const std::string series = name + "{stage=\"0\"} ";
    const size_t at = text.find(series);
    ASSERT_NE(at, std::string::npos) << series << " missing in\n" << text;
    EXPECT_NEAR(std::stod(text.substr(at + series.size())), predicted, 1e-12 + 1e-9 * predicted)
        << name;
  }
}

// With replicas, the stage label is the pipeline stage, not the worker's
// position: a one-stage job on two replicas was reported as stages 0 and
// 1. A stage's counters get the mean of its workers' times.
TEST_F(GrpcServiceTest, ReportProgress_DataParallelJob_StageMetricsByPipelineStage) {
  v1::RegisterWorkerResponse first, second;
  ASSERT_TRUE(Register(kJoinToken, &first, "127.0.0.1:9001").ok());
  ASSERT_TRUE(Register(kJoinToken, &second, "127.0.0.1:9002").ok());
  v1::JobSpec spec = ValidSpec();
  spec.mutable_training()->set_micro_batches(2);
  spec.mutable_parallelism()->set_data(2);
  v1::Job job;
  ASSERT_TRUE(Submit(spec, &job).ok());
  job = jobs_.Get(job.id()).value();
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  ASSERT_EQ(job.worker_ids_size(), 2);
  for (const v1::RegisterWorkerResponse* worker : {&first, &second}) {
    v1::ReportProgressRequest request;
    request.set_worker_id(worker->worker_id());
    request.set_incarnation(worker->incarnation());
    request.set_job_id(job.id());
    request.set_plan_version(job.plan_version());
    request.set_iteration(0);
    request.add_micro_batch_losses(2.5f);  // each replica's last stage reports its micro-batch
    request.set_busy_seconds(worker == &first ? 0.5 : 0.7);
    request.set_idle_seconds(0.25);
    v1::ReportProgressResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    AddBearer(context, worker->session_token());
    const grpc::Status status = raw_->ReportProgress(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  const std::string text = MetricsText();
  EXPECT_TRUE(absl::StrContains(text, "pipetrain_stage_busy_seconds_total{stage=\"0\"} 0.6\n"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "pipetrain_stage_idle_seconds_total{stage=\"0\"} 0.25\n"))
      << text;
  EXPECT_FALSE(absl::StrContains(text, "{stage=\"1\"}")) << text;
}

TEST(CoordinatorMetricsTest, PipelineStageOf_ReplicaMajorTensorRankInnermost) {
  // 2 replicas x 3 stages x 2 tensor ranks.
  const int expected[] = {0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2};
  for (int g = 0; g < 12; ++g) {
    EXPECT_EQ(CoordinatorMetrics::PipelineStageOf(g, 12, 2, 2), expected[g]) << g;
  }
  EXPECT_EQ(CoordinatorMetrics::PipelineStageOf(3, 4, 1, 1), 3);  // a plain pipeline
  EXPECT_EQ(CoordinatorMetrics::PipelineStageOf(4, 5, 2, 1), 4);  // not a whole layout
}

TEST_F(GrpcServiceTest, GetJobAndListJobs_Views_LossHistoryOnlyInFull) {
  v1::RegisterWorkerResponse worker;
  ASSERT_TRUE(Register(kJoinToken, &worker).ok());
  v1::Job job;
  ASSERT_TRUE(Submit(ValidSpec(), &job).ok());
  v1::ReportProgressRequest report;
  report.set_worker_id(worker.worker_id());
  report.set_incarnation(worker.incarnation());
  report.set_job_id(job.id());
  report.set_plan_version(1);
  report.add_micro_batch_losses(2.5f);
  v1::ReportProgressResponse reported;
  grpc::ClientContext report_context;
  SetDeadline(report_context);
  AddBearer(report_context, worker.session_token());
  ASSERT_TRUE(raw_->ReportProgress(&report_context, report, &reported).ok());

  for (v1::JobView view : {v1::JOB_VIEW_UNSPECIFIED, v1::JOB_VIEW_BASIC, v1::JOB_VIEW_FULL}) {
    SCOPED_TRACE(v1::JobView_Name(view));
    const int expected = view == v1::JOB_VIEW_FULL ? 1 : 0;
    v1::GetJobRequest get;
    get.set_id(job.id());
    get.set_view(view);
    v1::Job got;
    grpc::ClientContext get_context;
    SetDeadline(get_context);
    ASSERT_TRUE(stub_->GetJob(&get_context, get, &got).ok());
    EXPECT_EQ(got.progress().loss_history_size(), expected);
    EXPECT_EQ(got.progress().loss(), 2.5f);  // in every view
    v1::ListJobsRequest list;
    list.set_view(view);
    v1::ListJobsResponse listed;
    grpc::ClientContext list_context;
    SetDeadline(list_context);
    ASSERT_TRUE(stub_->ListJobs(&list_context, list, &listed).ok());
    ASSERT_EQ(listed.jobs_size(), 1);
    EXPECT_EQ(listed.jobs(0).progress().loss_history_size(), expected);
  }
}

TEST_F(GrpcServiceTest, ListJobs_NegativePageSize_InvalidArgumentWithFieldViolation) {
  v1::ListJobsRequest request;
  request.set_page_size(-1);
  v1::ListJobsResponse response;
  grpc::ClientContext context;
  SetDeadline(context);
  grpc::Status status = stub_->ListJobs(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  absl::StatusOr<DecodedRpcStatus> details = DecodeRpcStatus(status.error_details());
  ASSERT_TRUE(details.ok()) << details.status();
  EXPECT_EQ(details->violations,
            (std::vector<FieldViolation>{
                {"page_size", "must be 0 or more (above 1000 reads as 1000), got -1"}}));
}

TEST_F(GrpcServiceTest, ReportProgress_StalePlanVersion_FailedPrecondition) {
  v1::RegisterWorkerResponse worker;
  ASSERT_TRUE(Register(kJoinToken, &worker).ok());
  v1::Job job;
  ASSERT_TRUE(Submit(ValidSpec(), &job).ok());
  v1::ReportProgressRequest request;
  request.set_worker_id(worker.worker_id());
  request.set_incarnation(worker.incarnation());
  request.set_job_id(job.id());
  request.set_plan_version(7);
  v1::ReportProgressResponse response;
  grpc::ClientContext context;
  SetDeadline(context);
  AddBearer(context, worker.session_token());
  EXPECT_EQ(raw_->ReportProgress(&context, request, &response).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

// A job runner reads the worker's current session credential at each call:
// one of an earlier incarnation, not yet stopped when the worker registered
// again, sends the new credential with its own incarnation. The credential
// is valid, the report is not the session's.
TEST_F(GrpcServiceTest, ReportProgress_OtherIncarnationThanSession_FailedPrecondition) {
  v1::RegisterWorkerResponse worker;
  ASSERT_TRUE(Register(kJoinToken, &worker).ok());
  ASSERT_EQ(worker.incarnation(), 1);
  v1::Job job;
  ASSERT_TRUE(Submit(ValidSpec(), &job).ok());
  ASSERT_EQ(jobs_.Get(job.id())->state(), v1::JOB_STATE_RUNNING);
  v1::ReportProgressRequest request;
  request.set_worker_id(worker.worker_id());
  request.set_job_id(job.id());
  request.set_plan_version(1);
  request.set_iteration(0);
  request.add_micro_batch_losses(2.5f);  // the job has one micro-batch
  auto report = [&](int64_t incarnation) {
    request.set_incarnation(incarnation);
    v1::ReportProgressResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    AddBearer(context, worker.session_token());
    return raw_->ReportProgress(&context, request, &response);
  };

  for (const int64_t other : {int64_t{0}, int64_t{2}}) {
    SCOPED_TRACE(other);
    const grpc::Status refused = report(other);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_EQ(refused.error_message(), "worker w-1: report of a stale job runner (incarnation " +
                                           std::to_string(other) +
                                           ", the session's is 1); not taken");
    EXPECT_EQ(jobs_.Get(job.id())->progress().loss_history_size(), 0);
  }
  const grpc::Status accepted = report(worker.incarnation());
  ASSERT_TRUE(accepted.ok()) << accepted.error_message();
  EXPECT_EQ(jobs_.Get(job.id())->progress().loss(), 2.5f);
  EXPECT_EQ(jobs_.Get(job.id())->progress().loss_history_size(), 1);
}

// Uploads `chunks` on one stream with credential `session` and returns the
// call's status.
grpc::Status Upload(v1::CoordinatorService::Stub& stub, const std::string& session,
                    const std::vector<v1::WeightsChunk>& chunks) {
  grpc::ClientContext context;
  SetDeadline(context);
  AddBearer(context, session);
  v1::UploadWeightsResponse response;
  auto writer = stub.UploadWeights(&context, &response);
  for (const v1::WeightsChunk& chunk : chunks) {
    if (!writer->Write(chunk)) break;  // the server ended the call early
  }
  writer->WritesDone();
  return writer->Finish();
}

v1::WeightsChunk Chunk(const std::string& worker, const std::string& job, int64_t offset) {
  v1::WeightsChunk chunk;
  chunk.set_worker_id(worker);
  chunk.set_job_id(job);
  chunk.set_tensor_name("wpe.weight");  // [max_seq_len 8, d_model 16] in ValidSpecJson()
  chunk.add_shape(8);
  chunk.add_shape(16);
  chunk.set_offset(offset);
  for (int i = 0; i < 4; ++i) chunk.add_values(static_cast<float>(offset + i));
  return chunk;
}

TEST_F(GrpcServiceTest, UploadWeights_ChunksOfARunningJob_Ok) {
  v1::RegisterWorkerResponse worker;
  ASSERT_TRUE(Register(kJoinToken, &worker).ok());
  v1::Job job;
  ASSERT_TRUE(Submit(ValidSpec(), &job).ok());
  grpc::Status status =
      Upload(*raw_, worker.session_token(), {Chunk("w-1", job.id(), 0), Chunk("w-1", job.id(), 4)});
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_F(GrpcServiceTest, UploadWeights_ChunkPastTheTensor_InvalidArgument) {
  v1::RegisterWorkerResponse worker;
  ASSERT_TRUE(Register(kJoinToken, &worker).ok());
  v1::Job job;
  ASSERT_TRUE(Submit(ValidSpec(), &job).ok());
  grpc::Status status = Upload(*raw_, worker.session_token(), {Chunk("w-1", job.id(), 126)});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "wpe.weight")) << status.error_message();
}

TEST_F(GrpcServiceTest, UploadWeights_UnknownJob_NotFound) {
  v1::RegisterWorkerResponse worker;
  ASSERT_TRUE(Register(kJoinToken, &worker).ok());
  EXPECT_EQ(Upload(*raw_, worker.session_token(), {Chunk("w-1", "job-5", 0)}).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(GrpcServiceTest, UploadWeights_TwoJobsInOneStream_InvalidArgument) {
  v1::RegisterWorkerResponse worker;
  ASSERT_TRUE(Register(kJoinToken, &worker).ok());
  v1::Job job;
  ASSERT_TRUE(Submit(ValidSpec(), &job).ok());
  grpc::Status status =
      Upload(*raw_, worker.session_token(), {Chunk("w-1", job.id(), 0), Chunk("w-1", "job-2", 4)});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "one UploadWeights stream per job"))
      << status.error_message();
}

TEST_F(GrpcServiceTest, UploadWeights_EmptyStream_InvalidArgument) {
  v1::RegisterWorkerResponse worker;
  ASSERT_TRUE(Register(kJoinToken, &worker).ok());
  EXPECT_EQ(Upload(*raw_, worker.session_token(), {}).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(GrpcServiceTest, UnaryCalls_RecordDurationPerMethodAndCode_RefusalsCountedApart) {
  v1::RegisterWorkerResponse worker;
  EXPECT_FALSE(Register("", &worker).ok());  // refused: counted as refused too
  EXPECT_TRUE(Register(kJoinToken, &worker).ok());
  v1::RegisterWorkerRequest bad;  // handled and failed
  bad.set_join_token(kJoinToken);
  grpc::ClientContext context;
  SetDeadline(context);
  EXPECT_EQ(stub_->RegisterWorker(&context, bad, &worker).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  const std::string text = MetricsText();
  const std::string method = "method=\"/pipetrain.v1.CoordinatorService/RegisterWorker\"";
  EXPECT_TRUE(absl::StrContains(
      text, "pipetrain_rpc_duration_seconds_count{code=\"OK\"," + method + "} 1\n"))
      << text;
  EXPECT_TRUE(absl::StrContains(
      text, "pipetrain_rpc_duration_seconds_count{code=\"INVALID_ARGUMENT\"," + method + "} 1\n"))
      << text;
  EXPECT_TRUE(absl::StrContains(
      text, "pipetrain_rpc_requests_total{code=\"UNAUTHENTICATED\"," + method + "} 1\n"))
      << text;
  EXPECT_TRUE(absl::StrContains(
      text, "pipetrain_rpc_refused_total{code=\"UNAUTHENTICATED\",method=\"RegisterWorker\"} 1\n"))
      << text;
  EXPECT_TRUE(absl::StrContains(
      text,
      "pipetrain_rpc_duration_seconds_count{code=\"OK\",method=\"/pipetrain.v1.CoordinatorService/"
      "SubmitJob\"} 0\n"));
}

// A worker's own session gone stale (it registered again: a restart of
// either side) is refused as any other credential, but counted apart:
// after a coordinator restart every worker's next calls are, and the
// refusals operators alert on are strangers'. A token naming no known
// worker still counts as refused.
TEST_F(GrpcServiceTest, StaleSessionOfAKnownWorker_RefusedAndCountedApartFromStrangers) {
  v1::RegisterWorkerResponse first, second;
  ASSERT_TRUE(Register(kJoinToken, &first).ok());
  ASSERT_TRUE(Register(kJoinToken, &second).ok());  // same address: new incarnation
  ASSERT_EQ(second.incarnation(), 2);
  auto heartbeat = [&](const std::string& worker_id, int64_t incarnation,
                       const std::string& token) {
    v1::HeartbeatRequest request;
    request.set_worker_id(worker_id);
    request.set_incarnation(incarnation);
    v1::HeartbeatResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    AddBearer(context, token);
    return raw_->Heartbeat(&context, request, &response).error_code();
  };
  EXPECT_EQ(heartbeat("w-1", 1, first.session_token()), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(heartbeat("w-9", 1, "w-9.1." + std::string(64, 'a')),
            grpc::StatusCode::UNAUTHENTICATED);
  // The right worker and incarnation with a guessed secret: a stranger's.
  EXPECT_EQ(heartbeat("w-1", 1, "w-1.1." + std::string(64, 'a')),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(heartbeat("w-1", 2, second.session_token()), grpc::StatusCode::OK);
  // The weights upload (a stream, authenticated on its own) alike.
  EXPECT_EQ(Upload(*raw_, first.session_token(), {}).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  const std::string text = MetricsText();
  EXPECT_TRUE(
      absl::StrContains(text, "pipetrain_rpc_stale_sessions_total{method=\"Heartbeat\"} 1\n"))
      << text;
  EXPECT_TRUE(absl::StrContains(
      text, "pipetrain_rpc_refused_total{code=\"UNAUTHENTICATED\",method=\"Heartbeat\"} 2\n"))
      << text;
  EXPECT_TRUE(
      absl::StrContains(text, "pipetrain_rpc_stale_sessions_total{method=\"UploadWeights\"} 1\n"))
      << text;
  EXPECT_FALSE(absl::StrContains(
      text, "pipetrain_rpc_refused_total{code=\"UNAUTHENTICATED\",method=\"UploadWeights\"} 1"))
      << text;
}

// SubmitJob, CancelJob, RegisterWorker and DrainWorker wait for the state
// store, so the reaction hands them to the service's store threads (STYLE.md
// item 6): none is answered until that thread has run it. A refused call is
// answered at once. Registrations have a thread of their own: one is
// answered while a submit (or a cancel, which waits for its save) waits.
TEST(GrpcServiceStoreCallsTest, SubmitCancelRegisterAndDrain_AnsweredFromTheStoreThread) {
  FakeClock clock;
  WorkerRegistry workers{WorkerRegistry::Options{.join_token = kJoinToken, .clock = &clock}};
  AssignmentHub hub;
  JobManager jobs{&workers, &hub, &clock};
  CoordinatorMetrics metrics{&workers, &jobs};
  const CallerAuth auth{kUserToken, &workers};
  BackgroundQueue held;  // the store thread's tasks, run by the test
  BackgroundQueue held_registrations;  // the registrations thread's
  CoordinatorGrpcService service{
      &workers, &jobs, &hub, &metrics, &auth, held.Runner(), held_registrations.Runner()};
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto stub = v1::CoordinatorService::NewStub(
      BearerChannel(address, grpc::InsecureChannelCredentials(), {}, kUserToken));
  auto anonymous = v1::CoordinatorService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));

  absl::StatusOr<v1::JobSpec> spec = JobSpecFromJson(ValidSpecJson());
  ASSERT_TRUE(spec.ok()) << spec.status();
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = *spec;
  v1::Job submitted;
  grpc::Status submit_status;
  std::thread submitter([&] {
    grpc::ClientContext context;
    SetDeadline(context);
    submit_status = stub->SubmitJob(&context, submit, &submitted);
  });
  const bool submit_held = held.AwaitPending(absl::Seconds(30)) && held.RunAll() == 1;
  submitter.join();
  EXPECT_TRUE(submit_held) << "SubmitJob was not handed to the store thread";
  ASSERT_TRUE(submit_status.ok()) << submit_status.error_message();
  EXPECT_EQ(submitted.state(), v1::JOB_STATE_QUEUED);

  v1::CancelJobRequest cancel;
  cancel.set_id(submitted.id());
  v1::Job cancelled;
  grpc::Status cancel_status;
  std::thread canceller([&] {
    grpc::ClientContext context;
    SetDeadline(context);
    cancel_status = stub->CancelJob(&context, cancel, &cancelled);
  });
  const bool cancel_held = held.AwaitPending(absl::Seconds(30)) && held.RunAll() == 1;
  canceller.join();
  EXPECT_TRUE(cancel_held) << "CancelJob was not handed to the store thread";
  ASSERT_TRUE(cancel_status.ok()) << cancel_status.error_message();
  EXPECT_EQ(cancelled.state(), v1::JOB_STATE_CANCELLED);

  grpc::ClientContext refused;
  SetDeadline(refused);
  EXPECT_EQ(anonymous->CancelJob(&refused, cancel, &cancelled).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(held.pending(), 0);

  // A cancel (of the cancelled job again: no job to place on the worker
  // below) waits on the store thread, unanswered, while a worker registers.
  v1::Job again;
  grpc::Status again_status;
  std::thread second_canceller([&] {
    grpc::ClientContext context;
    SetDeadline(context);
    again_status = stub->CancelJob(&context, cancel, &again);
  });
  // Not ASSERT: the thread must be joined whatever happens.
  EXPECT_TRUE(held.AwaitPending(absl::Seconds(30))) << "the cancel never reached the store thread";
  v1::RegisterWorkerRequest join;
  join.set_join_token(kJoinToken);
  join.set_data_address("127.0.0.1:9001");
  v1::RegisterWorkerResponse worker;
  grpc::ClientContext registering;
  SetDeadline(registering);
  grpc::Status register_status;
  std::thread registerer(
      [&] { register_status = stub->RegisterWorker(&registering, join, &worker); });
  const bool register_held =
      held_registrations.AwaitPending(absl::Seconds(30)) && held_registrations.RunAll() == 1;
  registerer.join();
  EXPECT_TRUE(register_held) << "RegisterWorker was not handed to the registrations thread";
  EXPECT_EQ(held.pending(), 1) << "the cancel was answered before the store thread ran it";
  EXPECT_EQ(held.RunAll(), 1);
  second_canceller.join();
  ASSERT_TRUE(register_status.ok()) << register_status.error_message();
  EXPECT_TRUE(again_status.ok()) << again_status.error_message();  // a repeat
  EXPECT_EQ(again.state(), v1::JOB_STATE_CANCELLED);
  v1::DrainWorkerRequest drain;
  drain.set_worker_id(worker.worker_id());
  v1::Worker drained;
  grpc::Status drain_status;
  std::thread drainer([&] {
    grpc::ClientContext context;
    SetDeadline(context);
    drain_status = stub->DrainWorker(&context, drain, &drained);
  });
  const bool drain_held = held.AwaitPending(absl::Seconds(30)) && held.RunAll() == 1;
  drainer.join();
  EXPECT_TRUE(drain_held) << "DrainWorker was not handed to the store thread";
  ASSERT_TRUE(drain_status.ok()) << drain_status.error_message();
  EXPECT_TRUE(drained.drained());

  service.Shutdown();
  server->Shutdown();
}

}  // namespace
}  // namespace pipetrain
