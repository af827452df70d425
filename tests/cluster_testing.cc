#include "tests/cluster_testing.h"

#include <sys/stat.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/coordinator_client.h"
#include "common/ports_file.h"
#include "gtest/gtest.h"
#include "httplib.h"

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
  // A test that crashes takes its cluster with it (the coordinator watches
  // no parent; a worker would wait out its coordinator's loss first).
  options.exit_with_parent = true;
  options.join_token = "test-join-token";
  options.user_token = "test-user-token";
  options.coordinator_args = {"--output-dir=" + options.dir};
  options.coordinator_args.insert(options.coordinator_args.end(), coordinator_args.begin(),
                                  coordinator_args.end());
  // Checkpoints go where the coordinator keeps its files (one disk here).
  options.worker_args = {"--checkpoint-root=" + options.dir};
  options.worker_args.insert(options.worker_args.end(), worker_args.begin(), worker_args.end());
  auto cluster = LocalCluster::Start(options);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? std::move(*cluster) : nullptr;
}

v1::JobSpec TinyJobSpec(int steps, int stages) {
  v1::JobSpec spec;
  spec.mutable_model()->set_n_layer(1);
  spec.mutable_model()->set_n_head(2);
  spec.mutable_model()->set_d_model(16);
  spec.mutable_training()->set_seq_len(8);
  spec.mutable_training()->set_batch_size(2);
  spec.mutable_training()->set_steps(steps);
  spec.mutable_data()->set_synthetic_bytes(5000);
  spec.mutable_parallelism()->set_stages(stages);
  return spec;
}

std::string SubmitJob(v1::CoordinatorService::Stub& stub, const v1::JobSpec& spec) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  v1::Job job;
  grpc::Status s = stub.SubmitJob(WithDeadline(absl::Seconds(10)).get(), request, &job);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return job.id();
}

namespace {

// GetJob's call, its failure returned rather than expected.
grpc::Status TryGetJob(v1::CoordinatorService::Stub& stub, const std::string& id, v1::Job* job) {
  v1::GetJobRequest request;
  request.set_id(id);
  request.set_view(v1::JOB_VIEW_FULL);  // tests compare loss histories
  return stub.GetJob(WithDeadline(absl::Seconds(10)).get(), request, job);
}

}  // namespace

v1::Job GetJob(v1::CoordinatorService::Stub& stub, const std::string& id) {
  v1::Job job;
  grpc::Status s = TryGetJob(stub, id, &job);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return job;
}

v1::Job AwaitJob(v1::CoordinatorService::Stub& stub, const std::string& id, absl::Duration timeout,
                 const std::function<bool(const v1::Job&)>& done) {
  // A submit that failed (its own failure already reported) has no job to
  // wait for: polling "" would add a failure every 50 ms until the timeout.
  if (id.empty()) {
    ADD_FAILURE() << "AwaitJob: no job id (the submit failed)";
    return v1::Job();
  }
  // `done` sees only jobs the coordinator returned: the empty Job of a
  // failed call would satisfy "state() != RUNNING" at once. A few failed
  // calls in a row (the coordinator is gone) end the wait.
  constexpr int kMaxFailedCallsInARow = 3;
  const absl::Time deadline = absl::Now() + timeout;
  int failed_in_a_row = 0;
  v1::Job job;
  while (true) {
    v1::Job got;
    if (const grpc::Status s = TryGetJob(stub, id, &got); s.ok()) {
      job = std::move(got);
      failed_in_a_row = 0;
      if (done(job)) return job;
    } else if (++failed_in_a_row >= kMaxFailedCallsInARow) {
      ADD_FAILURE() << "AwaitJob(" << id << "): GetJob failed " << failed_in_a_row
                    << " times in a row, the last: " << s.error_message();
      return job;
    }
    if (absl::Now() >= deadline) return job;
    absl::SleepFor(absl::Milliseconds(50));
  }
}

bool Ended(const v1::Job& job) {
  return job.state() == v1::JOB_STATE_SUCCEEDED || job.state() == v1::JOB_STATE_FAILED ||
         job.state() == v1::JOB_STATE_CANCELLED;
}

bool AwaitReadyWorkers(v1::CoordinatorService::Stub& stub, int n) {
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  while (absl::Now() < deadline) {
    v1::ListWorkersResponse workers;
    if (stub.ListWorkers(WithDeadline(absl::Seconds(5)).get(), {}, &workers).ok()) {
      int ready = 0;
      for (const v1::Worker& w : workers.workers()) ready += w.state() == v1::WORKER_STATE_READY;
      if (ready >= n) return true;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

int ProcessOf(v1::CoordinatorService::Stub& stub, const std::string& id) {
  v1::ListWorkersResponse workers;
  if (!stub.ListWorkers(WithDeadline(absl::Seconds(5)).get(), {}, &workers).ok()) return -1;
  for (const v1::Worker& w : workers.workers()) {
    if (w.id() == id && absl::StartsWith(w.node_name(), "local-")) {
      return std::stoi(w.node_name().substr(6));
    }
  }
  return -1;
}

int WorkerMetricsPort(const std::string& subdir, int worker) {
  const std::string path =
      absl::StrCat(std::getenv("TEST_TMPDIR"), "/", subdir, "/worker-", worker, ".ports");
  absl::StatusOr<int> port = ReadPort(path, "metrics_port");
  EXPECT_TRUE(port.ok()) << port.status();
  return port.ok() ? *port : 0;
}

std::string ScrapeMetrics(int port) {
  httplib::Client client("127.0.0.1", port);
  auto response = client.Get("/metrics");
  EXPECT_TRUE(response && response->status == 200) << "GET /metrics on port " << port;
  return response ? response->body : "";
}

}  // namespace pipetrain::testing
