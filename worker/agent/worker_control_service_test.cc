// WorkerControlService on a server with pipetrain's limits
// (common/grpc_server_limits.h): who may call it, how many calls wait, and
// that clients holding every synchronous thread (as unauthenticated
// reflection streams can) do not keep the coordinator's profile out.
#include "worker/agent/worker_control_service.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/grpc_server_limits.h"
#include "common/secrets.h"
#include "common/testing/holding_sync_service.h"
#include "gtest/gtest.h"
#include "proto/pipetrain/v1/profile.grpc.pb.h"
#include "worker/agent/session_credential.h"
#include "worker/model/backend_select.h"

namespace pipetrain {
namespace {

constexpr char kToken[] = "session-token-for-the-test";

v1::ProfileRequest SmallRequest() {
  v1::ProfileRequest request;
  v1::ModelSpec* model = request.mutable_model();
  model->set_n_layer(1);
  model->set_n_head(2);
  model->set_d_model(16);
  model->set_vocab_size(32);
  model->set_max_seq_len(8);
  request.set_seq_len(8);
  request.set_micro_batch_size(2);
  request.set_warmup(1);
  request.set_repetitions(1);
  request.set_seed(7);
  return request;
}

// The service under test beside a HoldingSyncService, on one server.
class Served {
 public:
  explicit Served(ProfileBackendFactory make_backend = nullptr)
      : control_(&session_, std::move(make_backend)) {
    session_.Set(kToken);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    ApplyGrpcServerLimits(builder, "test");
    builder.RegisterService(&holding_);
    builder.RegisterService(&control_);
    server_ = builder.BuildAndStart();
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::WorkerControlService::NewStub(channel_);
  }
  ~Served() { server_->Shutdown(); }

  int port() const { return port_; }
  v1::WorkerControlService::Stub& stub() { return *stub_; }
  // Calls Profile with `bytes` as its request, as they are.
  grpc::Status ProfileWithBytes(const std::string& bytes, const std::string& token) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    const grpc::internal::RpcMethod rpc("/pipetrain.v1.WorkerControlService/Profile",
                                        grpc::internal::RpcMethod::NORMAL_RPC);
    return grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
        channel_.get(), rpc, Context(token).get(), request, &response);
  }
  void StopControl() { control_.Stop(); }

  // A context with what the coordinator presents (or `token` instead).
  static std::unique_ptr<grpc::ClientContext> Context(
      const std::string& token = WorkerControlCredential(kToken)) {
    auto context = std::make_unique<grpc::ClientContext>();
    if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return context;
  }

 private:
  SessionCredential session_;
  testing::HoldingSyncService holding_;
  WorkerControlService control_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerControlService::Stub> stub_;
};

TEST(WorkerControlServiceTest, WithTheSessionCredential_Profiles) {
  Served served;
  v1::ModelProfile profile;
  const grpc::Status status =
      served.stub().Profile(Served::Context().get(), SmallRequest(), &profile);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(profile.micro_batch_size(), 2);
  EXPECT_GT(profile.units_size(), 0);
}

TEST(WorkerControlServiceTest, WithoutTheSessionCredential_Unauthenticated) {
  Served served;
  // The session credential itself is not accepted: a copy of what crosses
  // this (unencrypted) port must not be the credential.
  for (const std::string& token : {std::string(""), std::string("some-other-token"),
                                   std::string(kToken), WorkerControlCredential("other")}) {
    v1::ModelProfile profile;
    const grpc::Status status =
        served.stub().Profile(Served::Context(token).get(), SmallRequest(), &profile);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << token;
  }
}

// The request's bytes are parsed only after the credential passed and
// when they fit kMaxProfileRequestBytes: gRPC parsed them first, and
// 8 MiB of unknown fields grew about 16 times before a stranger was
// refused. Bytes that are no message show the order: UNAUTHENTICATED
// without the credential (gRPC's parse answered first before),
// INVALID_ARGUMENT with it.
TEST(WorkerControlServiceTest, RequestBytes_ParsedOnlyAfterTheCredentialAndTheSizeBound) {
  Served served;
  const std::string garbage = "\xff\xff\xff\xff";  // a field of wire type 7: none
  grpc::Status status = served.ProfileWithBytes(garbage, "");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
  status = served.ProfileWithBytes(garbage, WorkerControlCredential(kToken));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_EQ(status.error_message(), "Profile: the request is not a pipetrain.v1.ProfileRequest");
  v1::ProfileRequest large = SmallRequest();
  large.mutable_partitions()->Resize(kMaxProfileRequestBytes, 2);
  status = served.ProfileWithBytes(large.SerializeAsString(), WorkerControlCredential(kToken));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  // The positive control, through the same bytes path.
  status =
      served.ProfileWithBytes(SmallRequest().SerializeAsString(), WorkerControlCredential(kToken));
  EXPECT_TRUE(status.ok()) << status.error_message();
}

// Anyone reaching the port can call without a credential, in a loop:
// every call is refused, and at most 10 of them are logged per 10 s.
TEST(WorkerControlServiceTest, ManyRefusedCalls_LoggedAFewTimes) {
  Served served;
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 50; ++i) {
    v1::ModelProfile profile;
    const grpc::Status status =
        served.stub().Profile(Served::Context("").get(), SmallRequest(), &profile);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << i;
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  size_t lines = 0;
  for (size_t at = log.find("refused a WorkerControl.Profile call"); at != std::string::npos;
       at = log.find("refused a WorkerControl.Profile call", at + 1)) {
    ++lines;
  }
  EXPECT_GE(lines, 1u);
  EXPECT_LE(lines, 10u);
}

TEST(WorkerControlServiceTest, BadRequest_InvalidArgumentNamingTheField) {
  Served served;
  v1::ProfileRequest request = SmallRequest();
  request.set_seq_len(0);
  v1::ModelProfile profile;
  const grpc::Status status = served.stub().Profile(Served::Context().get(), request, &profile);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("seq_len"), std::string::npos) << status.error_message();
}

// The regression this service's callback form fixes: with every synchronous
// thread held, a profile was refused RESOURCE_EXHAUSTED and the job planned
// on the analytic estimate instead of the measured one.
TEST(WorkerControlServiceTest, EverySyncThreadHeld_StillProfiles) {
  Served served;
  testing::HeldSyncCalls held = testing::HoldSyncThreads(served.port(), 2 * kMaxSyncServerThreads);
  ASSERT_GE(held.refused, 1) << "the synchronous threads were not all taken";
  v1::ModelProfile profile;
  grpc::Status status = served.stub().Profile(Served::Context().get(), SmallRequest(), &profile);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_GT(profile.units_size(), 0);
  status = served.stub().Profile(Served::Context("").get(), SmallRequest(), &profile);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
  EXPECT_EQ(held.EndAll(), 0);
}

// Calls past kMaxPendingProfiles (one running, the rest waiting) are
// refused at once; the others are served in turn.
// A worker shutting down stops its profile before the next unit (the
// server's shutdown waits for it, and a large model's takes minutes).
TEST(WorkerControlServiceTest, Stop_RunningProfileEndsCancelled) {
  absl::Notification started, release;
  Served served([&] {
    started.Notify();
    release.WaitForNotification();  // the profile has begun: Stop comes now
    return SelectBackend("cpu", "fp32");
  });
  const v1::ProfileRequest request = SmallRequest();
  v1::ModelProfile profile;
  grpc::Status status;
  absl::Notification done;
  std::unique_ptr<grpc::ClientContext> context = Served::Context();
  served.stub().async()->Profile(context.get(), &request, &profile, [&](grpc::Status s) {
    status = s;
    done.Notify();
  });
  started.WaitForNotification();
  served.StopControl();
  release.Notify();
  done.WaitForNotification();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED) << status.error_message();
  EXPECT_EQ(status.error_message(), "the worker is shutting down");
  EXPECT_EQ(profile.units_size(), 0);
}

TEST(WorkerControlServiceTest, CallsPastThePendingLimit_ResourceExhausted) {
  absl::Notification release;
  std::atomic<int> backends_made{0};
  Served served([&] {
    ++backends_made;
    release.WaitForNotification();  // the first profile holds the profiler thread
    return SelectBackend("cpu", "fp32");
  });
  constexpr int kCalls = kMaxPendingProfiles + 2;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<v1::ModelProfile> profiles(kCalls);
  std::vector<grpc::Status> statuses(kCalls);
  const v1::ProfileRequest request = SmallRequest();
  // Ends before the release: the refused calls, and any that fails
  // otherwise (which the checks below report instead of the test hanging).
  std::atomic<int> ended_early{0}, done{0};
  absl::Notification early_ones_ended, all_done;
  for (int i = 0; i < kCalls; ++i) {
    contexts.push_back(Served::Context());
    served.stub().async()->Profile(
        contexts.back().get(), &request, &profiles[i], [&, i](grpc::Status status) {
          statuses[i] = status;
          if (!release.HasBeenNotified() && ++ended_early == kCalls - kMaxPendingProfiles) {
            early_ones_ended.Notify();
          }
          if (++done == kCalls) all_done.Notify();
        });
  }
  // None of the accepted calls can end before the release, so exactly the
  // calls past the limit are refused, whatever order they arrived in.
  early_ones_ended.WaitForNotification();
  release.Notify();
  all_done.WaitForNotification();
  int ok = 0;
  for (const grpc::Status& status : statuses) {
    if (status.ok()) {
      ++ok;
    } else {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
          << status.error_message();
    }
  }
  EXPECT_EQ(ok, kMaxPendingProfiles);
  EXPECT_EQ(backends_made.load(), kMaxPendingProfiles);
}

}  // namespace
}  // namespace pipetrain
