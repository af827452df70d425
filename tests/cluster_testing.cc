#include "tests/cluster_testing.h"

#include <sys/stat.h>

#include <cstdlib>

#include "cli/coordinator_client.h"
#include "gtest/gtest.h"

namespace pipetrain::testing {

std::unique_ptr<LocalCluster> StartTestCluster(const std::string& subdir, int workers,
                                               std::vector<std::string> coordinator_args,
                                               std::vector<std::string> worker_args) {
  LocalClusterOptions options;
  auto coordinator = FindSiblingBinary("coordinator", "pipetrain-coordinator");
  auto worker = FindSiblingBinary("worker", "pipetrain-worker");
  EXPECT_TRUE(coordinator.ok() && worker.ok()) << coordinator.status() << worker.status();
  if (!coordinator.ok() || !worker.ok()) return nullptr;
  options.coordinator_binary = *coordinator;
  options.worker_binary = *worker;
  options.workers = workers;
  options.dir = std::string(std::getenv("TEST_TMPDIR")) + "/" + subdir;
  mkdir(options.dir.c_str(), 0755);
  options.join_token = "test-token";
  options.coordinator_args = std::move(coordinator_args);
  options.worker_args = std::move(worker_args);
  auto cluster = LocalCluster::Start(options);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? std::move(*cluster) : nullptr;
}

std::string SubmitJob(v1::Coordinator::Stub& stub, const v1::JobSpec& spec) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  v1::Job job;
  grpc::Status s = stub.SubmitJob(WithDeadline(absl::Seconds(10)).get(), request, &job);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return job.id();
}

v1::Job GetJob(v1::Coordinator::Stub& stub, const std::string& id) {
  v1::GetJobRequest request;
  request.set_id(id);
  v1::Job job;
  grpc::Status s = stub.GetJob(WithDeadline(absl::Seconds(10)).get(), request, &job);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return job;
}

v1::Job AwaitJob(v1::Coordinator::Stub& stub, const std::string& id, absl::Duration timeout,
                 const std::function<bool(const v1::Job&)>& done) {
  const absl::Time deadline = absl::Now() + timeout;
  v1::Job job = GetJob(stub, id);
  while (!done(job) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    job = GetJob(stub, id);
  }
  return job;
}

bool Ended(const v1::Job& job) {
  return job.state() == v1::SUCCEEDED || job.state() == v1::FAILED ||
         job.state() == v1::CANCELLED;
}

}  // namespace pipetrain::testing
