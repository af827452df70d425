// Helpers for the multi-process tests: start a LocalCluster from the test's
// runfiles, submit a job and wait for its state over gRPC, wait for READY
// workers and find the process behind one.
#ifndef PIPETRAIN_TESTS_CLUSTER_TESTING_H_
#define PIPETRAIN_TESTS_CLUSTER_TESTING_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cli/local_cluster.h"
#include "proto/pipetrain/v1/coordinator.grpc.pb.h"

namespace pipetrain::testing {

// Coordinator + `workers` workers logging into $TEST_TMPDIR/<subdir>;
// nullptr (and a test failure) if they do not start.
std::unique_ptr<LocalCluster> StartTestCluster(const std::string& subdir, int workers,
                                               std::vector<std::string> coordinator_args = {},
                                               std::vector<std::string> worker_args = {});

// The smallest job the cluster tests train: 1 layer of width 16 with 2
// heads, sequences of 8, batches of 2, 5000 synthetic bytes, `steps` steps
// on `stages` stages.
v1::JobSpec TinyJobSpec(int steps, int stages = 1);

// SubmitJob; returns the new job's id ("" and a test failure on error).
std::string SubmitJob(v1::CoordinatorService::Stub& stub, const v1::JobSpec& spec);

v1::Job GetJob(v1::CoordinatorService::Stub& stub, const std::string& id);

// Polls the job every 50 ms (a remote state, not synchronisation) until
// `done(job)` or `timeout`; returns the last job seen. `done` sees only jobs
// GetJob returned. A test failure, and an early return, for an empty `id`
// (a failed SubmitJob) or 3 failed GetJob calls in a row.
v1::Job AwaitJob(v1::CoordinatorService::Stub& stub, const std::string& id, absl::Duration timeout,
                 const std::function<bool(const v1::Job&)>& done);

bool Ended(const v1::Job& job);  // SUCCEEDED, FAILED or CANCELLED

// Polls ListWorkers every 50 ms (a remote state, not synchronisation), each
// call with a 5 s deadline, until at least `n` workers are READY: true, or
// false after a minute. A failed call is polled again.
bool AwaitReadyWorkers(v1::CoordinatorService::Stub& stub, int n);

// The index of the cluster's worker process behind worker `id` (for
// LocalCluster::worker), read from its node name "local-<i>": workers
// register in start order, but tests do not rely on it. -1 if ListWorkers
// fails or lists no such worker.
int ProcessOf(v1::CoordinatorService::Stub& stub, const std::string& id);

// The metrics port worker `worker` of the cluster started as `subdir` wrote
// to its ports file (0 and a test failure if it cannot be read).
int WorkerMetricsPort(const std::string& subdir, int worker);

// GET /metrics on 127.0.0.1:`port` ("" and a test failure unless 200).
std::string ScrapeMetrics(int port);

}  // namespace pipetrain::testing

#endif  // PIPETRAIN_TESTS_CLUSTER_TESTING_H_
