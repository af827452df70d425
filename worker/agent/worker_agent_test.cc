// WorkerAgent against a scripted coordinator: what it does when the
// coordinator drops it and then refuses it.
#include "worker/agent/worker_agent.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/annotated_mutex.h"
#include "worker/transport/data_plane_server.h"
#include "worker/transport/grpc_transport.h"
#include "worker/transport/mailbox.h"

namespace pipetrain {
namespace {

// Registers the first worker, forgets it at its first heartbeat
// (FAILED_PRECONDITION, as a restarted coordinator does) and refuses every
// later registration with UNAUTHENTICATED (as after the join token changed).
class ForgetfulCoordinator final : public v1::CoordinatorService::Service {
 public:
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest*,
                              v1::RegisterWorkerResponse* response) override {
    if (registrations_.fetch_add(1) > 0) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "join token not accepted");
    }
    response->set_worker_id("w-1");
    response->set_incarnation(1);
    response->set_session_token("w-1.1.secret");
    response->set_heartbeat_interval_seconds(0.05);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override {
    heartbeats_.fetch_add(1);
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "incarnation not current");
  }
  grpc::Status WatchAssignments(grpc::ServerContext*, const v1::WatchAssignmentsRequest*,
                                grpc::ServerWriter<v1::Assignment>*) override {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "no assignments here");
  }
  int registrations() const { return registrations_.load(); }
  int heartbeats() const { return heartbeats_.load(); }

 private:
  std::atomic<int> registrations_{0};
  std::atomic<int> heartbeats_{0};
};

TEST(WorkerAgentTest, RefusedReRegistrationIsReportedAndHeartbeatsStop) {
  ForgetfulCoordinator coordinator;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&coordinator);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  Mailbox mailbox;
  auto data_plane = DataPlaneServer::Start("127.0.0.1:0", &mailbox);
  ASSERT_TRUE(data_plane.ok()) << data_plane.status();

  WorkerAgentOptions options;
  options.coordinator_address = absl::StrCat("127.0.0.1:", port);
  options.join_token = "join";
  AnnotatedMutex mu;  // a hand-off TSan sees (absl::Notification's it does not)
  absl::Status refusal;
  bool refused = false;
  options.on_registration_refused = [&](const absl::Status& status) {
    AnnotatedMutexLock lock(&mu);
    refusal = status;
    refused = true;
  };
  WorkerAgent agent(options, data_plane->get(), &mailbox,
                    [&mailbox](int stage, const std::vector<std::string>& peers,
                               const JobCredential& credential) {
                      GrpcTransportOptions transport_options;
                      transport_options.credential = credential;
                      return std::unique_ptr<Transport>(
                          new GrpcTransport(stage, peers, &mailbox, std::move(transport_options)));
                    });
  ASSERT_TRUE(agent.Start().ok());
  {
    AnnotatedMutexLock lock(&mu);
    ASSERT_TRUE(mu.AwaitWithTimeout([&] { return refused; }, absl::Seconds(30)));
  }
  EXPECT_EQ(refusal.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(refusal.message().find("join token not accepted"), std::string::npos)
      << refusal.message();
  EXPECT_EQ(coordinator.registrations(), 2);  // no retry: it cannot help
  EXPECT_EQ(coordinator.heartbeats(), 1);     // the heartbeat thread has ended
  agent.Stop();
  (*data_plane)->Shutdown();
  server->Shutdown();
}

}  // namespace
}  // namespace pipetrain
