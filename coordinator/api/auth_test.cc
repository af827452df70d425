// Every pipetrain.v1.CoordinatorService method and every REST endpoint, called as a
// stranger would: without credentials, with a wrong one, and with a real
// credential of the wrong role or of another worker. Each call must be
// refused (UNAUTHENTICATED or PERMISSION_DENIED; HTTP 401) and change
// nothing: jobs, workers, metrics (but the refusal counter) and files.
// Positive controls show the same calls succeed with the right credential,
// so the refusals are the credentials' doing.
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>
#include <httplib.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/grpc_credentials.h"
#include "common/http_server.h"
#include "common/secrets.h"
#include "coordinator/api/bad_specs_testing.h"
#include "coordinator/api/caller_auth.h"
#include "coordinator/api/coordinator_metrics.h"
#include "coordinator/api/grpc_service.h"
#include "coordinator/api/page_cursor.h"
#include "coordinator/api/rest_service.h"
#include "coordinator/jobs/assignment_hub.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/registry/registration_limits.h"
#include "coordinator/registry/worker_registry.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "proto/pipetrain/v1/coordinator.grpc.pb.h"
#include "spec/job_spec.h"

namespace pipetrain {
namespace {

constexpr char kJoinToken[] = "join-7f3a9c";
constexpr char kUserToken[] = "user-e41b07";

// The coordinator's --output-dir, one per test.
std::string OutputDir() {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/out-",
                      ::testing::UnitTest::GetInstance()->current_test_info()->name());
}

// Every file and directory under `dir`, recursively, as "path size".
std::string ListTree(const std::string& dir) {
  std::string out;
  std::unique_ptr<FILE, decltype(&pclose)> find(
      popen(("find '" + dir + "' -printf '%p %s\\n' | sort").c_str(), "r"), &pclose);
  char buffer[4096];
  while (find != nullptr && fgets(buffer, sizeof(buffer), find.get()) != nullptr) out += buffer;
  return out;
}

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(mkdir(OutputDir().c_str(), 0700), 0);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::CoordinatorService::NewStub(channel_);
    RegisterRestRoutes(http_, &workers_, &jobs_);
    ServePrometheus(http_, metrics_.registry(), [this] { metrics_.Refresh(); });
    absl::StatusOr<int> http_port = http_.Start("127.0.0.1", 0);
    ASSERT_TRUE(http_port.ok()) << http_port.status();
    client_ = std::make_unique<httplib::Client>("127.0.0.1", *http_port);
    client_->set_read_timeout(10);

    // Two workers; a job with an output file runs on w-1.
    one_ = Register("127.0.0.1:9001");
    two_ = Register("127.0.0.1:9002");
    v1::JobSpec spec = JobSpecFromJson(ValidSpecJson()).value();
    spec.mutable_output()->set_weights_path("weights.safetensors");
    job_ = jobs_.Submit(spec).value().id();
    jobs_.AwaitBackgroundWork();
    ASSERT_EQ(jobs_.Get(job_)->state(), v1::JOB_STATE_RUNNING);
    ASSERT_EQ(jobs_.Get(job_)->worker_ids(0), "w-1");
  }

  void TearDown() override {
    http_.Stop();
    service_.Shutdown();
    server_->Shutdown();
  }

  v1::RegisterWorkerResponse Register(const std::string& address) {
    v1::RegisterWorkerRequest request;
    request.set_join_token(kJoinToken);
    request.set_data_address(address);
    return workers_.Register(request).value();
  }

  // What a refused call must leave as it was.
  std::string Snapshot() {
    std::string out;
    for (const v1::Job& job : jobs_.List()) out += job.DebugString();
    for (const v1::Worker& worker : workers_.List()) out += worker.DebugString();
    metrics_.Refresh();
    const std::string text = prometheus::TextSerializer().Serialize(metrics_.registry()->Collect());
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      // Refusals are counted, and process_* (CPU, memory) change by themselves.
      if (absl::StrContains(line, "pipetrain_rpc_refused_total")) continue;
      if (absl::StartsWith(line, "process_")) continue;
      absl::StrAppend(&out, line, "\n");
    }
    return out + ListTree(OutputDir());
  }

  // A client context with `authorization` ("" = none) and a deadline.
  static std::unique_ptr<grpc::ClientContext> Context(const std::string& authorization) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    if (!authorization.empty()) context->AddMetadata("authorization", authorization);
    return context;
  }

  // Calls every method once with `authorization`; returns each status by name.
  std::vector<std::pair<std::string, grpc::Status>> CallEveryMethod(
      const std::string& authorization) {
    std::vector<std::pair<std::string, grpc::Status>> out;
    v1::Job job;
    v1::SubmitJobRequest submit;
    *submit.mutable_spec() = JobSpecFromJson(ValidSpecJson()).value();
    out.push_back({"SubmitJob", stub_->SubmitJob(Context(authorization).get(), submit, &job)});
    v1::GetJobRequest get;
    get.set_id(job_);
    out.push_back({"GetJob", stub_->GetJob(Context(authorization).get(), get, &job)});
    v1::ListJobsResponse jobs;
    out.push_back({"ListJobs", stub_->ListJobs(Context(authorization).get(), {}, &jobs)});
    v1::CancelJobRequest cancel;
    cancel.set_id(job_);
    out.push_back({"CancelJob", stub_->CancelJob(Context(authorization).get(), cancel, &job)});
    v1::ListWorkersResponse workers;
    out.push_back({"ListWorkers", stub_->ListWorkers(Context(authorization).get(), {}, &workers)});
    v1::GetPlanRequest plan_request;
    plan_request.set_job_id(job_);
    v1::Plan plan;
    out.push_back({"GetPlan", stub_->GetPlan(Context(authorization).get(), plan_request, &plan)});
    CallWorkerMethods(authorization, out);
    return out;
  }

  // The worker methods, each acting for w-1 on its job.
  void CallWorkerMethods(const std::string& authorization,
                         std::vector<std::pair<std::string, grpc::Status>>& out) {
    v1::HeartbeatRequest beat;
    beat.set_worker_id("w-1");
    beat.set_incarnation(1);
    beat.set_current_instruction("pwned");
    v1::HeartbeatResponse beat_response;
    out.push_back(
        {"Heartbeat", stub_->Heartbeat(Context(authorization).get(), beat, &beat_response)});
    v1::ReportProgressRequest progress;
    progress.set_worker_id("w-1");
    progress.set_incarnation(1);
    progress.set_job_id(job_);
    progress.set_plan_version(1);
    progress.set_error("injected failure");
    progress.set_busy_seconds(1e6);
    v1::ReportProgressResponse progress_response;
    out.push_back({"ReportProgress", stub_->ReportProgress(Context(authorization).get(), progress,
                                                           &progress_response)});
    auto context = Context(authorization);
    v1::UploadWeightsResponse upload_response;
    auto writer = stub_->UploadWeights(context.get(), &upload_response);
    v1::WeightsChunk chunk;
    chunk.set_worker_id("w-1");
    chunk.set_job_id(job_);
    writer->Write(chunk);
    writer->WritesDone();
    out.push_back({"UploadWeights", writer->Finish()});
    v1::WatchAssignmentsRequest watch;
    watch.set_worker_id("w-1");
    watch.set_incarnation(1);
    auto watch_context = Context(authorization);
    auto reader = stub_->WatchAssignments(watch_context.get(), watch);
    v1::Assignment assignment;
    while (reader->Read(&assignment)) {
    }
    out.push_back({"WatchAssignments", reader->Finish()});
    v1::DeregisterWorkerRequest leave;
    leave.set_worker_id("w-1");
    leave.set_incarnation(1);
    v1::DeregisterWorkerResponse leave_response;
    out.push_back({"DeregisterWorker",
                   stub_->DeregisterWorker(Context(authorization).get(), leave, &leave_response)});
    // A user's or the worker's own: acting for w-1 here.
    v1::DrainWorkerRequest drain;
    drain.set_worker_id("w-1");
    v1::Worker drained;
    out.push_back(
        {"DrainWorker", stub_->DrainWorker(Context(authorization).get(), drain, &drained)});
    for (const std::string& token :
         {std::string(""), std::string("wrong"), std::string(kUserToken), one_.session_token()}) {
      v1::RegisterWorkerRequest request;
      request.set_join_token(token);
      request.set_data_address("10.9.9.9:1");
      v1::RegisterWorkerResponse response;
      out.push_back({absl::StrCat("RegisterWorker(join token \"", token.substr(0, 8), "\")"),
                     stub_->RegisterWorker(Context(authorization).get(), request, &response)});
    }
  }

  FakeClock clock_;
  WorkerRegistry workers_{WorkerRegistry::Options{.join_token = kJoinToken, .clock = &clock_}};
  AssignmentHub hub_;
  JobManager jobs_{&workers_, &hub_, &clock_, JobManagerOptions{.output_dir = OutputDir()}};
  CoordinatorMetrics metrics_{&workers_, &jobs_};
  const CallerAuth auth_{kUserToken, &workers_};
  CoordinatorGrpcService service_{&workers_, &jobs_, &hub_, &metrics_, &auth_};
  HttpServer http_{HttpServer::Options{.bearer_token = kUserToken}};
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::CoordinatorService::Stub> stub_;
  std::unique_ptr<httplib::Client> client_;
  v1::RegisterWorkerResponse one_, two_;
  std::string job_;
};

TEST_F(AuthTest, EveryGrpcMethod_BadCredentials_RefusedAndNothingChanges) {
  const std::string before = Snapshot();
  const std::string w1_wrong_secret = "Bearer w-1.1." + std::string(64, '0');
  const struct {
    std::string what;
    std::string authorization;
    grpc::StatusCode worker_code;  // expected of the worker methods
  } variants[] = {
      {"no credential", "", grpc::StatusCode::UNAUTHENTICATED},
      {"a wrong token", "Bearer wrong", grpc::StatusCode::UNAUTHENTICATED},
      {"a wrong session secret for w-1", w1_wrong_secret, grpc::StatusCode::UNAUTHENTICATED},
      {"another worker's (w-2's) credential", "Bearer " + two_.session_token(),
       grpc::StatusCode::PERMISSION_DENIED},
      {"the join token as a bearer", absl::StrCat("Bearer ", kJoinToken),
       grpc::StatusCode::UNAUTHENTICATED},
  };
  int refused = 0;
  std::set<std::string> called;
  for (const auto& v : variants) {
    for (const auto& [method, status] : CallEveryMethod(v.authorization)) {
      called.insert(method.substr(0, method.find('(')));
      SCOPED_TRACE(method + " with " + v.what);
      const bool worker_method = method == "Heartbeat" || method == "ReportProgress" ||
                                 method == "UploadWeights" || method == "WatchAssignments" ||
                                 method == "DeregisterWorker" || method == "DrainWorker";
      if (absl::StartsWith(method, "RegisterWorker")) {
        EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
      } else if (worker_method) {
        EXPECT_EQ(status.error_code(), v.worker_code) << status.error_message();
      } else {
        EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
      }
      ++refused;
    }
  }
  EXPECT_EQ(refused, 5 * 16);
  // Every method the service has was called: each handler checks its own
  // caller (no interceptor), so a new RPC must be added here to be checked.
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          v1::CoordinatorService::service_full_name());
  ASSERT_NE(service, nullptr);
  std::set<std::string> every;
  for (int m = 0; m < service->method_count(); ++m) every.insert(service->method(m)->name());
  EXPECT_EQ(called, every);
  EXPECT_EQ(Snapshot(), before);
  metrics_.Refresh();
  const std::string text = prometheus::TextSerializer().Serialize(metrics_.registry()->Collect());
  EXPECT_TRUE(absl::StrContains(
      text, "pipetrain_rpc_refused_total{code=\"UNAUTHENTICATED\",method=\"SubmitJob\"} 5\n"))
      << text;
  EXPECT_TRUE(absl::StrContains(
      text, "pipetrain_rpc_refused_total{code=\"PERMISSION_DENIED\",method=\"Heartbeat\"} 1\n"));
}

// Calls CoordinatorService's `method` with `bytes` as its request, as they
// are (a unary call, or WatchAssignments' stream, cancelled after one
// message).
grpc::Status CallWithBytes(grpc::Channel* channel, const std::string& method,
                           const std::string& bytes, const std::string& authorization) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  if (!authorization.empty()) context.AddMetadata("authorization", authorization);
  const std::string name = "/pipetrain.v1.CoordinatorService/" + method;
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  if (method == "WatchAssignments") {
    const grpc::internal::RpcMethod rpc(name.c_str(), grpc::internal::RpcMethod::SERVER_STREAMING);
    std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
        grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel, rpc, &context,
                                                                      request));
    if (reader->Read(&response)) context.TryCancel();
    return reader->Finish();
  }
  const grpc::internal::RpcMethod rpc(name.c_str(), grpc::internal::RpcMethod::NORMAL_RPC);
  return grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel, rpc, &context, request, &response);
}

// A request's bytes are parsed only after the caller's credential in the
// metadata passed, and only when they fit the method's bound: gRPC parsed
// them first, and 4 MiB of empty repeated or unknown fields grew 16-30x in
// memory before a stranger was refused. Bytes that are no message show
// the order: UNAUTHENTICATED without a credential (gRPC's parse answered
// INTERNAL before), INVALID_ARGUMENT with one.
TEST_F(AuthTest, RequestBytes_ParsedOnlyAfterTheCredentialAndTheSizeBound) {
  const std::string garbage = "\xff\xff\xff\xff";  // field 0x1fffffff... of wire type 7: none
  const std::string user = absl::StrCat("Bearer ", kUserToken);
  const std::string worker = "Bearer " + one_.session_token();
  const std::string before = Snapshot();
  const struct {
    std::string method, request_type, authorization;
  } methods[] = {
      {"SubmitJob", "SubmitJobRequest", user},
      {"GetJob", "GetJobRequest", user},
      {"ListJobs", "ListJobsRequest", user},
      {"CancelJob", "CancelJobRequest", user},
      {"ListWorkers", "ListWorkersRequest", user},
      {"GetPlan", "GetPlanRequest", user},
      {"DrainWorker", "DrainWorkerRequest", user},
      {"DrainWorker", "DrainWorkerRequest", worker},
      {"Heartbeat", "HeartbeatRequest", worker},
      {"DeregisterWorker", "DeregisterWorkerRequest", worker},
      {"ReportProgress", "ReportProgressRequest", worker},
      {"WatchAssignments", "WatchAssignmentsRequest", worker},
  };
  for (const auto& m : methods) {
    SCOPED_TRACE(m.method);
    grpc::Status s = CallWithBytes(channel_.get(), m.method, garbage, "");
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
    s = CallWithBytes(channel_.get(), m.method, garbage, m.authorization);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_EQ(s.error_message(),
              absl::StrCat(m.method, ": the request is not a pipetrain.v1.", m.request_type));
  }
  // RegisterWorker's credential is in its request: only the bound comes first.
  grpc::Status s = CallWithBytes(channel_.get(), "RegisterWorker", garbage, "");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(Snapshot(), before);

  // Past kMaxSmallRequestBytes (well-formed requests): RESOURCE_EXHAUSTED
  // before anything else, a stranger's registration too.
  v1::GetJobRequest get;
  get.set_id(std::string(kMaxSmallRequestBytes, 'j'));
  s = CallWithBytes(channel_.get(), "GetJob", get.SerializeAsString(), user);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(),
                                absl::StrCat("GetJob: a request of ", get.ByteSizeLong(),
                                             " bytes is over this method's limit of 16384 bytes")))
      << s.error_message();
  v1::RegisterWorkerRequest join;
  join.set_join_token(std::string(kMaxSmallRequestBytes, 't'));
  s = CallWithBytes(channel_.get(), "RegisterWorker", join.SerializeAsString(), "");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  // SubmitJob and ReportProgress keep the server's bound: a large request
  // is read (and refused for what it holds).
  v1::SubmitJobRequest submit;
  submit.set_request_id(std::string(kMaxSmallRequestBytes, 'r'));
  s = CallWithBytes(channel_.get(), "SubmitJob", submit.SerializeAsString(), user);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "request_id")) << s.error_message();
  EXPECT_EQ(Snapshot(), before);
}

// Every request bounded by kMaxSmallRequestBytes, with each field a client
// sets at its documented bound, fits in half of it: a field added later
// that pushes a legitimate request past the bound fails here, not as a
// RESOURCE_EXHAUSTED a worker retries for ever.
TEST(SmallRequestBound, EveryFieldAtItsBound_FitsInHalf) {
  const std::string id(kMaxIdBytes, 'i');
  v1::RegisterWorkerRequest join;
  join.set_join_token(std::string(kMaxSecretBytes, 't'));
  v1::DeviceInfo* d = join.mutable_device();
  d->set_hostname(std::string(kMaxNameBytes, 'h'));
  d->set_cpu_model(std::string(kMaxDescriptionBytes, 'c'));
  d->set_gpu_model(std::string(kMaxDescriptionBytes, 'g'));
  d->set_backend(std::string(kMaxDescriptionBytes, 'b'));
  d->set_gpu_pci_bus_id(std::string(kMaxPciBusIdBytes, 'p'));
  d->set_nccl_unique_id(std::string(kMaxNcclIdBytes, 'n'));
  d->set_cpu_cores(kMaxCpuCores);
  d->set_compute_threads(kMaxCpuCores);
  d->set_gpu_sm_count(kMaxCpuCores);
  d->set_gpu_index(kMaxCpuCores);
  d->set_memory_bytes(kMaxMemoryBytes);
  d->set_memory_limit_bytes(kMaxMemoryBytes);
  d->set_gpu_memory_bytes(kMaxMemoryBytes);
  d->set_memory_reserve_bytes(kMaxMemoryBytes);
  d->set_mailbox_limit_bytes(kMaxMemoryBytes);
  d->set_measured_gflops(kMaxGflops);
  d->set_link_bandwidth_bytes_per_second(1e13);
  d->set_link_latency_seconds(1);
  d->set_data_plane_overhead_seconds(kMaxDataPlaneOverheadSeconds);
  d->set_data_plane_bytes_per_second(kMaxDataPlaneBytesPerSecond);
  join.set_data_address(std::string(kMaxAddressBytes, 'a'));
  join.set_metrics_address(std::string(kMaxAddressBytes, 'm'));
  join.set_node_name(std::string(kMaxNameBytes, 'n'));
  join.set_drained(true);
  join.set_previous_incarnation(std::numeric_limits<int64_t>::max());
  join.mutable_build()->set_version(std::string(kMaxBuildFieldBytes, 'v'));
  join.mutable_build()->set_commit(std::string(kMaxBuildFieldBytes, 'c'));
  join.set_data_plane_tls(true);
  join.set_registration_id(std::string(kMaxRegistrationIdBytes, 'r'));
  v1::HeartbeatRequest beat;
  beat.set_worker_id(id);
  beat.set_incarnation(std::numeric_limits<int64_t>::max());
  beat.set_current_instruction(std::string(kMaxDescriptionBytes, 'x'));
  beat.set_nccl_unique_id(std::string(kMaxNcclIdBytes, 'n'));
  beat.set_last_job_id(std::string(kMaxDescriptionBytes, 'j'));
  v1::ListJobsRequest list_jobs;
  list_jobs.set_page_size(1000);
  list_jobs.set_page_token(std::string(kMaxPageTokenBytes, 'p'));
  list_jobs.set_view(v1::JOB_VIEW_FULL);
  v1::ListWorkersRequest list_workers;
  list_workers.set_page_size(1000);
  list_workers.set_page_token(std::string(kMaxPageTokenBytes, 'p'));
  v1::GetJobRequest get;
  get.set_id(id);
  get.set_view(v1::JOB_VIEW_FULL);
  v1::CancelJobRequest cancel;
  cancel.set_id(id);
  v1::GetPlanRequest plan;
  plan.set_job_id(id);
  v1::DrainWorkerRequest drain;
  drain.set_worker_id(id);
  v1::DeregisterWorkerRequest leave;
  leave.set_worker_id(id);
  leave.set_incarnation(std::numeric_limits<int64_t>::max());
  v1::WatchAssignmentsRequest watch;
  watch.set_worker_id(id);
  watch.set_incarnation(std::numeric_limits<int64_t>::max());
  const std::vector<const google::protobuf::Message*> requests = {
      &join, &beat, &list_jobs, &list_workers, &get, &cancel, &plan, &drain, &leave, &watch};
  for (const google::protobuf::Message* request : requests) {
    SCOPED_TRACE(request->GetTypeName());
    EXPECT_LE(request->ByteSizeLong(), kMaxSmallRequestBytes / 2);
  }
  // Every field of those messages is set above: one added without a bound
  // here fails this count.
  std::vector<const google::protobuf::Message*> messages = requests;
  messages.push_back(&join.device());
  messages.push_back(&join.build());
  size_t fields = 0, set = 0;
  for (const google::protobuf::Message* request : messages) {
    std::vector<const google::protobuf::FieldDescriptor*> present;
    request->GetReflection()->ListFields(*request, &present);
    fields += request->GetDescriptor()->field_count();
    set += present.size();
  }
  EXPECT_EQ(set, fields) << "a request field without a bound in this test";
}

TEST_F(AuthTest, RightCredentials_SameCallsSucceed) {
  // The positive control: the refusals above are the credentials' doing.
  v1::ListJobsResponse jobs;
  EXPECT_TRUE(stub_->ListJobs(Context(absl::StrCat("Bearer ", kUserToken)).get(), {}, &jobs).ok());
  EXPECT_EQ(jobs.jobs_size(), 1);
  v1::HeartbeatRequest beat;
  beat.set_worker_id("w-1");
  beat.set_incarnation(1);
  beat.set_current_instruction("idle");
  v1::HeartbeatResponse response;
  grpc::Status status =
      stub_->Heartbeat(Context("Bearer " + one_.session_token()).get(), beat, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(workers_.Get("w-1")->current_instruction(), "idle");
  // DrainWorker: the worker itself, and a user.
  v1::DrainWorkerRequest drain;
  drain.set_worker_id("w-1");
  v1::Worker drained;
  status = stub_->DrainWorker(Context("Bearer " + one_.session_token()).get(), drain, &drained);
  // Let in: the job manager's own answer (w-1's job has no checkpoints).
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  EXPECT_TRUE(absl::StrContains(status.error_message(), "no checkpoints"));
  drain.set_worker_id("w-2");
  status = stub_->DrainWorker(Context(absl::StrCat("Bearer ", kUserToken)).get(), drain, &drained);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(drained.id(), "w-2");
}

// A worker's drain with its own session gone stale (it registered again)
// is refused as a stale session, not as a rejected user token: workers
// hold none.
TEST_F(AuthTest, DrainWorker_StaleSession_RefusedAsAStaleSession) {
  const v1::RegisterWorkerResponse again = Register("127.0.0.1:9002");
  ASSERT_EQ(again.worker_id(), two_.worker_id());
  ASSERT_NE(again.incarnation(), two_.incarnation());
  v1::DrainWorkerRequest drain;
  drain.set_worker_id(two_.worker_id());
  v1::Worker drained;
  const grpc::Status status =
      stub_->DrainWorker(Context("Bearer " + two_.session_token()).get(), drain, &drained);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
  EXPECT_FALSE(absl::StrContains(status.error_message(), "user token")) << status.error_message();
  EXPECT_FALSE(workers_.Get(two_.worker_id())->drained());
}

// The positive control for every user method and REST endpoint: the user
// token is let in everywhere the bad credentials were refused (an answer
// of the method's own, such as FAILED_PRECONDITION, is fine). A method that
// refused everyone would otherwise pass the tests above.
TEST_F(AuthTest, EveryUserMethodAndEndpoint_UserToken_LetIn) {
  const std::set<std::string> user_methods = {"SubmitJob",   "GetJob",  "ListJobs",   "CancelJob",
                                              "ListWorkers", "GetPlan", "DrainWorker"};
  int checked = 0;
  for (const auto& [method, status] : CallEveryMethod(absl::StrCat("Bearer ", kUserToken))) {
    if (user_methods.count(method) == 0) continue;
    ++checked;
    EXPECT_NE(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << method << ": " << status.error_message();
    EXPECT_NE(status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << method << ": " << status.error_message();
  }
  EXPECT_EQ(checked, static_cast<int>(user_methods.size()));
  const std::string id = job_;
  for (const auto& [method, path] : std::vector<std::pair<std::string, std::string>>{
           {"POST", "/v1/jobs"},
           {"GET", "/v1/jobs"},
           {"GET", "/v1/jobs/" + id},
           {"GET", "/v1/jobs/" + id + "/plan"},
           {"GET", "/v1/jobs/" + id + "/timeline.svg"},
           {"GET", "/v1/jobs/" + id + "/measured-timeline.svg"},
           {"GET", "/v1/workers"},
           {"POST", "/v1/workers/w-2:drain"},
           {"POST", "/v1/jobs/" + id + ":cancel"}}) {
    SCOPED_TRACE(method + " " + path);
    const httplib::Headers headers = {{"Authorization", absl::StrCat("Bearer ", kUserToken)}};
    httplib::Result result =
        method == "GET" ? client_->Get(path.c_str(), headers)
                        : client_->Post(path.c_str(), headers, ValidSpecJson(), "application/json");
    ASSERT_TRUE(result) << httplib::to_string(result.error());
    EXPECT_NE(result->status, 401) << result->body;
    EXPECT_NE(result->status, 403) << result->body;
  }
}

TEST_F(AuthTest, EveryRestEndpoint_BadCredentials_401AndNothingChanges) {
  const std::string before = Snapshot();
  const std::string id = job_;
  const std::vector<std::pair<std::string, std::string>> endpoints = {
      {"POST", "/v1/jobs"},
      {"GET", "/v1/jobs"},
      {"GET", "/v1/jobs/" + id},
      {"POST", "/v1/jobs/" + id + ":cancel"},
      {"GET", "/v1/jobs/" + id + "/plan"},
      {"GET", "/v1/jobs/" + id + "/timeline.svg"},
      {"GET", "/v1/jobs/" + id + "/measured-timeline.svg"},
      {"GET", "/v1/workers"},
      {"POST", "/v1/workers/w-1:drain"},
  };
  const std::vector<std::string> credentials = {"",
                                                "Bearer wrong",
                                                "Bearer " + one_.session_token(),
                                                absl::StrCat("Bearer ", kJoinToken),
                                                absl::StrCat("Basic ", kUserToken),
                                                absl::StrCat("Bearer ", kUserToken, "x")};
  for (const auto& [method, path] : endpoints) {
    for (const std::string& authorization : credentials) {
      SCOPED_TRACE(method + " " + path + " with \"" + authorization + "\"");
      httplib::Headers headers;
      if (!authorization.empty()) headers.emplace("Authorization", authorization);
      httplib::Result result = method == "GET" ? client_->Get(path.c_str(), headers)
                                               : client_->Post(path.c_str(), headers,
                                                               ValidSpecJson(), "application/json");
      ASSERT_TRUE(result) << httplib::to_string(result.error());
      EXPECT_EQ(result->status, 401) << result->body;
      EXPECT_TRUE(absl::StrContains(result->body, "\"code\":16"))
          << result->body;  // UNAUTHENTICATED
    }
  }
  EXPECT_EQ(Snapshot(), before);
  // The positive control.
  httplib::Result ok = client_->Get(("/v1/jobs/" + id).c_str(),
                                    {{"Authorization", absl::StrCat("Bearer ", kUserToken)}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

}  // namespace
}  // namespace pipetrain
