// `promtool check metrics` accepts the coordinator's and a worker's /metrics
// after a short job has run (so labelled families have samples).
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "cli/coordinator_client.h"
#include "cli/local_cluster.h"
#include "gtest/gtest.h"
#include "tests/cluster_testing.h"

namespace pipetrain {
namespace {

// Runs promtool on `text`; returns its exit status and output.
std::pair<int, std::string> Promtool(const std::string& text, const std::string& name) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  const std::string in = dir + "/" + name + ".prom", out = dir + "/" + name + ".promtool";
  std::ofstream(in) << text;
  const int status = std::system(("promtool check metrics < " + in + " > " + out + " 2>&1").c_str());
  std::ifstream result(out);
  return {status, std::string(std::istreambuf_iterator<char>(result), {})};
}

TEST(MetricsExpositionTest, CoordinatorAndWorkerMetrics_PassPromtool) {
  ASSERT_EQ(std::system("command -v promtool > /dev/null"), 0)
      << "promtool is missing: run scripts/setup.sh (Debian package prometheus)";
  auto cluster = testing::StartTestCluster("metrics", 1);
  ASSERT_NE(cluster, nullptr);
  auto stub = ConnectCoordinator(cluster->grpc_address(), "", cluster->user_token());
  const std::string id = testing::SubmitJob(*stub, testing::TinyJobSpec(/*steps=*/3));
  const v1::Job job = testing::AwaitJob(*stub, id, absl::Seconds(60), testing::Ended);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();

  const std::string coordinator = testing::ScrapeMetrics(cluster->http_port());
  EXPECT_NE(coordinator.find("pipetrain_workers{"), std::string::npos) << coordinator;
  auto [c_status, c_out] = Promtool(coordinator, "coordinator");
  EXPECT_EQ(c_status, 0) << c_out;

  const std::string worker = testing::ScrapeMetrics(testing::WorkerMetricsPort("metrics", 0));
  EXPECT_NE(worker.find("pipetrain_stage_compute_seconds_total{phase=\"forward\"}"),
            std::string::npos) << worker;
  EXPECT_NE(worker.find("pipetrain_stage_iterations_total 3"), std::string::npos) << worker;
  auto [w_status, w_out] = Promtool(worker, "worker");
  EXPECT_EQ(w_status, 0) << w_out;
}

}  // namespace
}  // namespace pipetrain
