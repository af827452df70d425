// End to end with a real Prometheus server: a local cluster (coordinator +
// 2 workers) trains a small two-stage job while /usr/bin/prometheus scrapes
// the coordinator and both workers every second; the test then queries
// Prometheus's HTTP API until the job's loss and each worker's idle counter
// are stored. This catches what a text-format check cannot: targets that
// Prometheus rejects, expositions it fails to parse, labels that collide.
//
// Prometheus cannot listen on port 0 and report the port it got, so the
// test asks the kernel for a free port, closes it and passes it on. Another
// process may take the port in between; Prometheus then exits with "address
// already in use" and the test retries with a new port.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/coordinator_client.h"
#include "cli/local_cluster.h"
#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/cluster_testing.h"

namespace pipetrain {
namespace {

constexpr char kPrometheus[] = "/usr/bin/prometheus";
constexpr int kWorkers = 2;
constexpr int kStartAttempts = 3;
// Generous: both limits only bound a failing run; a passing one takes a
// few seconds of scrapes.
constexpr absl::Duration kReadyTimeout = absl::Seconds(20);
constexpr absl::Duration kQueryTimeout = absl::Seconds(30);

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A loopback port that was free a moment ago (see the file comment); 0 on
// error.
int PickFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// A prometheus.yml scraping the coordinator's HTTP port and the workers'
// metrics ports every second; returns its path.
std::string WriteConfig(int coordinator_port, const std::vector<int>& worker_ports) {
  std::vector<std::string> workers;
  for (int port : worker_ports) workers.push_back(absl::StrCat("\"127.0.0.1:", port, "\""));
  const std::string path = TmpDir() + "/prometheus.yml";
  std::ofstream(path) << "global:\n"
                      << "  scrape_interval: 1s\n"
                      << "  scrape_timeout: 1s\n"
                      << "scrape_configs:\n"
                      << "  - job_name: pipetrain-coordinator\n"
                      << "    static_configs:\n"
                      << "      - targets: [\"127.0.0.1:" << coordinator_port << "\"]\n"
                      << "  - job_name: pipetrain-worker\n"
                      << "    static_configs:\n"
                      << "      - targets: [" << absl::StrJoin(workers, ", ") << "]\n";
  return path;
}

// A running Prometheus and the port its HTTP API listens on.
struct PrometheusServer {
  std::unique_ptr<Subprocess> process;
  int port = 0;
  std::string log;
};

// Polls /-/ready every 100 ms (the server's state, not synchronisation)
// until it answers 200, the process exits, or kReadyTimeout passes.
bool AwaitReady(Subprocess& process, int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(1);
  const absl::Time deadline = absl::Now() + kReadyTimeout;
  while (absl::Now() < deadline && !process.Poll().has_value()) {
    auto response = client.Get("/-/ready");
    if (response && response->status == 200) return true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return false;
}

// Starts Prometheus on a free port, retrying when another process took the
// port first; a test failure naming the log otherwise.
std::optional<PrometheusServer> StartPrometheus(const std::string& config) {
  for (int attempt = 0; attempt < kStartAttempts; ++attempt) {
    PrometheusServer server;
    server.port = PickFreePort();
    server.log = absl::StrCat(TmpDir(), "/prometheus-", attempt, ".log");
    auto process = Subprocess::Spawn(
        {kPrometheus, "--config.file=" + config,
         absl::StrCat("--storage.tsdb.path=", TmpDir(), "/tsdb-", attempt),
         absl::StrCat("--web.listen-address=127.0.0.1:", server.port)},
        server.log);
    if (!process.ok()) {
      ADD_FAILURE() << "cannot start " << kPrometheus << ": " << process.status();
      return std::nullopt;
    }
    server.process = std::make_unique<Subprocess>(std::move(*process));
    if (AwaitReady(*server.process, server.port)) return server;
    server.process->Terminate(absl::Seconds(5));
    const std::string log = ReadFile(server.log);
    if (log.find("address already in use") == std::string::npos) {
      ADD_FAILURE() << "Prometheus did not become ready on port " << server.port << "; its log "
                    << server.log << ":\n" << log;
      return std::nullopt;
    }
  }
  ADD_FAILURE() << "every port picked for Prometheus was taken; see " << TmpDir()
                << "/prometheus-*.log";
  return std::nullopt;
}

// The "result" vector of an instant query, or an empty array when the query
// fails (Prometheus answers 503 while it starts, or the body is not JSON).
nlohmann::json Query(int port, const std::string& promql) {
  httplib::Client client("127.0.0.1", port);
  auto response = client.Get("/api/v1/query", httplib::Params{{"query", promql}},
                             httplib::Headers{});
  if (!response || response->status != 200) return nlohmann::json::array();
  const nlohmann::json body = nlohmann::json::parse(response->body, nullptr, false);
  if (!body.is_object() || body.value("status", "") != "success" || !body.contains("data") ||
      !body["data"].is_object() || !body["data"].contains("result") ||
      !body["data"]["result"].is_array()) {
    return nlohmann::json::array();
  }
  return body["data"]["result"];
}

// The distinct values of label `label` over `result`.
std::set<std::string> LabelValues(const nlohmann::json& result, const std::string& label) {
  std::set<std::string> values;
  for (const nlohmann::json& series : result) {
    if (series.is_object() && series.contains("metric") && series["metric"].is_object() &&
        series["metric"].contains(label) && series["metric"][label].is_string()) {
      values.insert(series["metric"][label].get<std::string>());
    }
  }
  return values;
}

// Re-runs `promql` every 250 ms until `done(result)` or kQueryTimeout;
// returns the last result.
nlohmann::json AwaitQuery(int port, const std::string& promql,
                          const std::function<bool(const nlohmann::json&)>& done) {
  const absl::Time deadline = absl::Now() + kQueryTimeout;
  nlohmann::json result = Query(port, promql);
  while (!done(result) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(250));
    result = Query(port, promql);
  }
  return result;
}

v1::JobSpec TwoStageSpec() {
  v1::JobSpec spec;
  spec.mutable_model()->set_n_layer(2);
  spec.mutable_model()->set_n_head(2);
  spec.mutable_model()->set_d_model(16);
  spec.mutable_training()->set_seq_len(8);
  spec.mutable_training()->set_batch_size(4);
  spec.mutable_training()->set_micro_batches(2);
  // More steps than the test waits for: it cancels the job once Prometheus
  // holds the series, so its length does not depend on the machine's speed.
  spec.mutable_training()->set_steps(100000);
  spec.mutable_data()->set_synthetic_bytes(20000);
  spec.mutable_parallelism()->set_stages(kWorkers);
  return spec;
}

TEST(PrometheusE2eTest, ScrapesClusterDuringJob_LossAndEachWorkersIdleStored) {
  ASSERT_EQ(access(kPrometheus, X_OK), 0)
      << kPrometheus << " is missing: run scripts/setup.sh (Debian package prometheus)";
  auto cluster = testing::StartTestCluster("prom", kWorkers);
  ASSERT_NE(cluster, nullptr);
  std::vector<int> worker_ports;
  std::set<std::string> worker_targets;
  for (int i = 0; i < kWorkers; ++i) {
    const int port = testing::WorkerMetricsPort("prom", i);
    ASSERT_NE(port, 0);
    worker_ports.push_back(port);
    worker_targets.insert(absl::StrCat("127.0.0.1:", port));
  }
  const int coordinator_port = cluster->http_port();
  auto stub = ConnectCoordinator(cluster->grpc_address(), "", cluster->user_token());
  const std::string id = testing::SubmitJob(*stub, TwoStageSpec());
  ASSERT_FALSE(id.empty());

  // Declared after the cluster: destroyed (terminated) first.
  std::optional<PrometheusServer> prometheus =
      StartPrometheus(WriteConfig(coordinator_port, worker_ports));
  ASSERT_TRUE(prometheus.has_value());
  const int port = prometheus->port;

  const nlohmann::json up = AwaitQuery(port, "up == 1", [](const nlohmann::json& r) {
    return r.size() == kWorkers + 1;
  });
  EXPECT_EQ(up.size(), kWorkers + 1u) << "targets not all up: " << up.dump()
                                      << "\nsee http://127.0.0.1:" << port << "/targets";

  const nlohmann::json loss = AwaitQuery(port, "pipetrain_job_loss > 0",
                                         [](const nlohmann::json& r) { return !r.empty(); });
  ASSERT_EQ(loss.size(), 1u) << loss.dump() << "\njob: " << testing::GetJob(*stub, id).DebugString();
  EXPECT_EQ(LabelValues(loss, "job"), std::set<std::string>{"pipetrain-coordinator"});

  const std::string idle = "pipetrain_worker_idle_seconds_total{job=\"pipetrain-worker\"}";
  const nlohmann::json idle_result = AwaitQuery(port, idle, [&](const nlohmann::json& r) {
    return LabelValues(r, "instance") == worker_targets;
  });
  EXPECT_EQ(LabelValues(idle_result, "instance"), worker_targets) << idle_result.dump();

  v1::CancelJobRequest cancel;
  cancel.set_id(id);
  v1::Job cancelled;
  grpc::Status s = stub->CancelJob(WithDeadline(absl::Seconds(10)).get(), cancel, &cancelled);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(prometheus->process->Terminate(absl::Seconds(10)), 0)
      << "Prometheus did not exit cleanly on SIGTERM; see " << prometheus->log;
}

}  // namespace
}  // namespace pipetrain
