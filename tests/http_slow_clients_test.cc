// The real coordinator and worker keep answering /healthz while 64 clients
// hold connections open by trickling request heads (or sending nothing), on
// the coordinator's REST port and on a worker's metrics port. Before the
// connection gate (common/http_gate.h) eight such clients froze both, and a
// Kubernetes liveness probe would have restarted the pod.
#include <httplib.h>

#include <memory>
#include <string>

#include "cli/local_cluster.h"
#include "common/slow_http_clients.h"
#include "gtest/gtest.h"
#include "tests/cluster_testing.h"

namespace pipetrain {
namespace {

// /healthz with a one-second budget for connecting, writing and reading,
// as a liveness probe gives it: a server with its threads held fails here.
// Returns the status, or -1 (with the client's error) when there was none.
int ProbeHealthz(int port, std::string* error) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(1);
  client.set_read_timeout(1);
  client.set_write_timeout(1);
  httplib::Result result = client.Get("/healthz");
  if (!result) {
    *error = httplib::to_string(result.error());
    return -1;
  }
  return result->status;
}

// Opens 64 slow connections to `port` (48 trickling, 16 silent), then
// probes /healthz on a new connection, more times than the server has
// handler threads.
void ExpectHealthzUnderSlowClients(int port, const std::string& what) {
  auto slow = SlowHttpClients::Open(port, {.connections = 64, .trickling = 48});
  ASSERT_TRUE(slow.ok()) << what << ": " << slow.status();
  for (int i = 0; i < 8; ++i) {
    std::string error;
    EXPECT_EQ(ProbeHealthz(port, &error), 200) << what << ", probe " << i << ": " << error;
  }
}

TEST(HttpSlowClientsTest, CoordinatorAndWorker_SixtyFourSlowClients_HealthzStillAnswered) {
  auto cluster = testing::StartTestCluster("http_slow_clients", 1);
  ASSERT_NE(cluster, nullptr);
  absl::StatusOr<int> worker_port = cluster->worker_metrics_port(0);
  ASSERT_TRUE(worker_port.ok()) << worker_port.status();

  ExpectHealthzUnderSlowClients(cluster->http_port(), "coordinator REST port");
  ExpectHealthzUnderSlowClients(*worker_port, "worker metrics port");
}

}  // namespace
}  // namespace pipetrain
