// gRPC health checking, reflection and readiness on real coordinator and
// worker processes, as grpc_health_probe, grpcurl and Kubernetes see them:
// SERVING once ready, the services listed by reflection, and NOT_SERVING
// with /readyz 503 while a process drains after SIGTERM
// (--shutdown-delay-seconds keeps it serving meanwhile; a second SIGTERM
// ends the wait).
#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/coordinator_client.h"
#include "common/ports_file.h"
#include "gtest/gtest.h"
#include "tests/cluster_testing.h"
#include "tests/grpc_probe.h"

namespace pipetrain {
namespace {

using ::pipetrain::testing::CheckHealth;
using ::pipetrain::testing::HealthWatch;
using ::pipetrain::testing::ListServices;

constexpr absl::Duration kTimeout = absl::Seconds(30);
constexpr char kSubdir[] = "health";

std::shared_ptr<grpc::Channel> ChannelTo(int port) {
  return grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
}

int HttpStatus(int port, const std::string& path) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(10);
  client.set_read_timeout(10);
  httplib::Result result = client.Get(path.c_str());
  return result ? result->status : 0;
}

std::vector<std::string> Sorted(absl::StatusOr<std::vector<std::string>> names) {
  EXPECT_TRUE(names.ok()) << names.status();
  std::vector<std::string> out = names.value_or(std::vector<std::string>{});
  std::sort(out.begin(), out.end());
  return out;
}

// Waits (on the server's own Watch stream, no polling) until `service` is
// SERVING; false if the stream ends first.
bool AwaitServing(const std::shared_ptr<grpc::Channel>& channel, const std::string& service) {
  absl::StatusOr<std::unique_ptr<HealthWatch>> watch =
      HealthWatch::Open(channel, service, kTimeout);
  if (!watch.ok()) return false;
  for (;;) {
    absl::StatusOr<std::string> status = (*watch)->Next();
    if (!status.ok()) return false;
    if (*status == "SERVING") return true;
  }
}

// SIGTERM to `process` while a Watch on `channel` is open: the watch must see
// NOT_SERVING and /readyz on `http_port` must say 503 while the process still
// serves; a second SIGTERM ends it with exit code 0.
void ExpectDrainsThenExits(Subprocess& process, const std::shared_ptr<grpc::Channel>& channel,
                           const std::string& service, int http_port) {
  absl::StatusOr<std::unique_ptr<HealthWatch>> watch = HealthWatch::Open(channel, "", kTimeout);
  ASSERT_TRUE(watch.ok()) << watch.status();
  ASSERT_EQ((*watch)->Next().value_or("error"), "SERVING");
  EXPECT_EQ(HttpStatus(http_port, "/readyz"), 200);

  process.Signal(SIGTERM);
  EXPECT_EQ((*watch)->Next().value_or("error"), "NOT_SERVING");
  EXPECT_EQ(CheckHealth(channel, service, kTimeout).value_or("error"), "NOT_SERVING");
  EXPECT_EQ(HttpStatus(http_port, "/readyz"), 503);
  EXPECT_EQ(HttpStatus(http_port, "/healthz"), 200);  // draining, but alive

  process.Signal(SIGTERM);
  std::optional<int> exit = process.Wait(kTimeout);
  ASSERT_TRUE(exit.has_value());
  EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0) << *exit;
}

// Polls (a remote state: 50 ms apart, 30 s at most) until the coordinator
// lists its one worker as drained; false if it never does.
bool AwaitListedDrained(v1::CoordinatorService::Stub& stub) {
  const absl::Time deadline = absl::Now() + kTimeout;
  while (absl::Now() < deadline) {
    v1::ListWorkersResponse workers;
    if (stub.ListWorkers(WithDeadline(absl::Seconds(5)).get(), {}, &workers).ok() &&
        workers.workers_size() == 1 && workers.workers(0).drained()) {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

class HealthClusterTest : public ::testing::Test {
 protected:
  // The worker's flags besides the delay.
  virtual std::vector<std::string> WorkerFlags() const { return {}; }

  void SetUp() override {
    std::vector<std::string> worker_flags = WorkerFlags();
    worker_flags.push_back("--shutdown-delay-seconds=60");
    cluster_ = testing::StartTestCluster(kSubdir, 1, {"--shutdown-delay-seconds=60"}, worker_flags);
    ASSERT_NE(cluster_, nullptr);
    coordinator_ =
        grpc::CreateChannel(cluster_->grpc_address(), grpc::InsecureChannelCredentials());
    const std::string ports =
        absl::StrCat(std::getenv("TEST_TMPDIR"), "/", kSubdir, "/worker-0.ports");
    absl::StatusOr<int> data_port = ReadPort(ports, "data_port");
    ASSERT_TRUE(data_port.ok()) << data_port.status();
    worker_ = ChannelTo(*data_port);
    worker_http_port_ = testing::WorkerMetricsPort(kSubdir, 0);
  }

  // SIGTERM to the idle worker: the coordinator lists it as drained within
  // its 60 s delay; a second SIGTERM ends the delay, and it exits 0.
  void ExpectDrainedBeforeTheDelay() {
    ASSERT_TRUE(AwaitServing(worker_, ""));
    auto stub = ConnectCoordinator(cluster_->grpc_address(), "", cluster_->user_token());
    cluster_->worker(0).Signal(SIGTERM);  // then 60 s of serving on
    EXPECT_TRUE(AwaitListedDrained(*stub));
    cluster_->worker(0).Signal(SIGTERM);
    std::optional<int> exit = cluster_->worker(0).Wait(kTimeout);
    ASSERT_TRUE(exit.has_value());
    EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0) << *exit;
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::shared_ptr<grpc::Channel> coordinator_, worker_;
  int worker_http_port_ = 0;
};

TEST_F(HealthClusterTest, Check_BothProcesses_ServingPerService) {
  EXPECT_EQ(CheckHealth(coordinator_, "", kTimeout).value_or("error"), "SERVING");
  EXPECT_EQ(
      CheckHealth(coordinator_, "pipetrain.v1.CoordinatorService", kTimeout).value_or("error"),
      "SERVING");
  EXPECT_EQ(HttpStatus(cluster_->http_port(), "/readyz"), 200);
  EXPECT_EQ(HttpStatus(cluster_->http_port(), "/healthz"), 200);
  // A worker is ready once registered.
  ASSERT_TRUE(AwaitServing(worker_, ""));
  for (const char* service :
       {"pipetrain.v1.DataPlaneService", "pipetrain.v1.WorkerControlService"}) {
    EXPECT_EQ(CheckHealth(worker_, service, kTimeout).value_or("error"), "SERVING") << service;
  }
  EXPECT_EQ(HttpStatus(worker_http_port_, "/readyz"), 200);
}

TEST_F(HealthClusterTest, Reflection_BothProcesses_ListTheirServices) {
  EXPECT_EQ(
      Sorted(ListServices(coordinator_, kTimeout)),
      (std::vector<std::string>{"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                                "pipetrain.v1.CoordinatorService"}));
  EXPECT_EQ(Sorted(ListServices(worker_, kTimeout)),
            (std::vector<std::string>{
                "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                "pipetrain.v1.DataPlaneService", "pipetrain.v1.WorkerControlService"}));
}

TEST_F(HealthClusterTest, Sigterm_Worker_NotServingWhileDraining) {
  ASSERT_TRUE(AwaitServing(worker_, ""));
  ExpectDrainsThenExits(cluster_->worker(0), worker_, "pipetrain.v1.DataPlaneService",
                        worker_http_port_);
}

// An idle worker that is leaving is drained at once, not after its
// --shutdown-delay-seconds: in that window it serves on, and a READY one
// would be given a queued job (or taken as a spare) and then leave it.
TEST_F(HealthClusterTest, Sigterm_IdleWorker_DrainedBeforeItsShutdownDelay) {
  ExpectDrainedBeforeTheDelay();
}

// With --drain-timeout-seconds 0 the worker waits for no drain, but still
// asks for one before its delay: it was READY through the delay, and could
// be given a job it would leave at once.
class HealthClusterNoDrainWaitTest : public HealthClusterTest {
 protected:
  std::vector<std::string> WorkerFlags() const override { return {"--drain-timeout-seconds=0"}; }
};

TEST_F(HealthClusterNoDrainWaitTest, Sigterm_IdleWorker_DrainedBeforeItsShutdownDelay) {
  ExpectDrainedBeforeTheDelay();
}

TEST_F(HealthClusterTest, Sigterm_Coordinator_NotServingWhileDraining) {
  ExpectDrainsThenExits(cluster_->coordinator(), coordinator_, "pipetrain.v1.CoordinatorService",
                        cluster_->http_port());
}

}  // namespace
}  // namespace pipetrain
