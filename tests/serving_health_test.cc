// ServingHealth against a real in-process gRPC server and HTTP server:
// grpc.health.v1 Check and Watch, reflection, /healthz and /readyz.
#include "common/serving_health.h"

#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <algorithm>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/pipetrain/v1/dataplane.grpc.pb.h"
#include "tests/grpc_probe.h"

namespace pipetrain {
namespace {

using ::pipetrain::testing::CheckHealth;
using ::pipetrain::testing::HealthWatch;
using ::pipetrain::testing::ListServices;

constexpr char kService[] = "pipetrain.v1.DataPlaneService";
constexpr absl::Duration kTimeout = absl::Seconds(10);

class ServingHealthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EnableGrpcHealthAndReflection();
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);  // every method UNIMPLEMENTED: only its name matters
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                   grpc::InsecureChannelCredentials());
    health_.Attach(server_.get());
    ServeHealthEndpoints(http_, &health_);
    absl::StatusOr<int> http_port = http_.Start("127.0.0.1", 0);
    ASSERT_TRUE(http_port.ok()) << http_port.status();
    client_ = std::make_unique<httplib::Client>("127.0.0.1", *http_port);
    client_->set_read_timeout(10);
  }
  void TearDown() override {
    health_.Detach();
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }

  std::string Check(const std::string& service) {
    absl::StatusOr<std::string> status = CheckHealth(channel_, service, kTimeout);
    return status.ok() ? *status : status.status().ToString();
  }
  int ReadyzStatus() {
    httplib::Result result = client_->Get("/readyz");
    return result ? result->status : 0;
  }

  v1::DataPlaneService::CallbackService service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  ServingHealth health_{{kService}, "starting"};
  HttpServer http_{HttpServer::Options{.bearer_token = "secret"}};  // probes need none
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(ServingHealthTest, Check_BeforeReady_NotServingAndReadyz503NamingWhy) {
  EXPECT_EQ(Check(""), "NOT_SERVING");
  EXPECT_EQ(Check(kService), "NOT_SERVING");
  httplib::Result result = client_->Get("/readyz");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 503);
  EXPECT_EQ(nlohmann::json::parse(result->body)["message"], "not ready: starting");
  result = client_->Get("/healthz");  // alive all the same
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 200);
}

TEST_F(ServingHealthTest, Check_Ready_ServingForServerAndService) {
  health_.SetReady();
  EXPECT_EQ(Check(""), "SERVING");
  EXPECT_EQ(Check(kService), "SERVING");
  EXPECT_EQ(ReadyzStatus(), 200);
  EXPECT_EQ(Check("no.such.Service"), "NOT_FOUND: service name unknown");
}

TEST_F(ServingHealthTest, Drain_WatchSeesNotServing_AndSetReadyCannotUndoIt) {
  health_.SetReady();
  absl::StatusOr<std::unique_ptr<HealthWatch>> watch = HealthWatch::Open(channel_, "", kTimeout);
  ASSERT_TRUE(watch.ok()) << watch.status();
  EXPECT_EQ((*watch)->Next().value_or("error"), "SERVING");
  health_.Drain("draining: test");
  EXPECT_EQ((*watch)->Next().value_or("error"), "NOT_SERVING");
  health_.SetReady();
  EXPECT_EQ(Check(kService), "NOT_SERVING");
  EXPECT_EQ(ReadyzStatus(), 503);
  EXPECT_EQ(health_.reason(), "draining: test");
  health_.SetNotReady("registering again");  // the drain's reason stands
  EXPECT_EQ(health_.reason(), "draining: test");
}

// A worker the coordinator dropped is not ready while it registers again,
// and ready once registered.
TEST_F(ServingHealthTest, SetNotReadyThenReady_FollowsTheRegistration) {
  health_.SetReady();
  health_.SetNotReady("registering again");
  EXPECT_EQ(Check(kService), "NOT_SERVING");
  EXPECT_EQ(ReadyzStatus(), 503);
  EXPECT_EQ(health_.reason(), "registering again");
  health_.SetReady();
  EXPECT_EQ(Check(kService), "SERVING");
}

TEST_F(ServingHealthTest, ListServices_NamesTheServiceHealthAndReflection) {
  absl::StatusOr<std::vector<std::string>> services = ListServices(channel_, kTimeout);
  ASSERT_TRUE(services.ok()) << services.status();
  std::sort(services->begin(), services->end());
  EXPECT_EQ(*services,
            (std::vector<std::string>{"grpc.health.v1.Health",
                                      "grpc.reflection.v1alpha.ServerReflection", kService}));
}

}  // namespace
}  // namespace pipetrain
