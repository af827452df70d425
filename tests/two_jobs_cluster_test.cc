// Two jobs at once on one cluster: a coordinator and 4 worker processes on
// loopback run two 2-stage jobs side by side (different seeds, so different
// data, weights and losses), and a third 2-stage job, queued behind them,
// is placed on the first job's freed workers while the second still runs.
// Each job must SUCCEED with exactly (bitwise) the per-step losses,
// validation loss and final weights of its own train-local run: a tensor,
// a report or a mailbox of one job that reached another would show.
//
// The second job is held while the first finishes and the third starts:
// one of its workers is stopped (SIGSTOP) once the job steps, and continued
// (SIGCONT) once the third steps, the two then running side by side. So
// "still running" holds by construction, not by a guess at how fast the
// jobs go. Its neighbour waits in a receive meanwhile (worker
// --recv-timeout-seconds, 60 s by default), and the coordinator's 60 s
// lease keeps the stopped worker from being declared LOST; the hold lasts
// well under the data plane's 30 s keepalive.
#include <signal.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/coordinator_client.h"
#include "gtest/gtest.h"
#include "tests/cluster_testing.h"
#include "tests/parallel_cluster_testing.h"

namespace pipetrain {
namespace {

using testing::AwaitJob;
using testing::AwaitReadyWorkers;
using testing::Ended;
using testing::ExpectEqualsTrainLocal;
using testing::ProcessOf;
using testing::Reference;
using testing::TrainLocally;

constexpr int kWorkers = 4;
// A step of these jobs takes 2 to 4 ms here, a poll of AwaitJob 50 ms.
// The second job's steps: enough that it cannot end between the poll that
// sees it step and the SIGSTOP that holds it (about 1 ms apart; a first
// poll here saw step 10). The third's: enough that some of them run beside
// the second once it is continued.
constexpr int kFirstSteps = 20;
constexpr int kSecondSteps = 200;
constexpr int kThirdSteps = 100;

// TinyJobSpec's model on 2 stages (2 micro-batches of 1 sequence), `steps`
// steps from `seed`, validation after the last step, no compression (the
// default), weights exported to w-<name>.safetensors under the
// coordinator's --output-dir. Only the seed and the step count differ
// between the jobs, so that one measured profile serves all three.
v1::JobSpec TwoStageJob(const std::string& name, uint64_t seed, int steps) {
  v1::JobSpec spec = testing::TinyJobSpec(steps, /*stages=*/2);
  spec.set_name(name);
  spec.mutable_training()->set_micro_batches(2);
  spec.mutable_training()->set_seed(seed);
  spec.mutable_training()->set_eval_interval(steps);
  spec.mutable_output()->set_weights_path("w-" + name + ".safetensors");
  return spec;
}

std::set<std::string> Workers(const v1::Job& job) {
  return {job.worker_ids().begin(), job.worker_ids().end()};
}

int64_t Nanos(const google::protobuf::Timestamp& t) { return t.seconds() * 1000000000 + t.nanos(); }

TEST(TwoJobsClusterTest, TwoJobsAtOnceAndAThirdQueued_EachMatchesItsOwnTrainLocal) {
  const std::vector<v1::JobSpec> specs = {TwoStageJob("first", 1, kFirstSteps),
                                          TwoStageJob("second", 2, kSecondSteps),
                                          TwoStageJob("third", 3, kThirdSteps)};
  std::vector<Reference> refs;
  for (const v1::JobSpec& spec : specs) refs.push_back(TrainLocally(spec));
  // Jobs that trained alike could swap their results unseen.
  for (int a = 0; a < 3; ++a) {
    for (int b = a + 1; b < 3; ++b) ASSERT_NE(refs[a].losses[0], refs[b].losses[0]) << a << b;
  }

  auto cluster = testing::StartTestCluster("two_jobs", kWorkers, {"--lease-seconds=60"});
  ASSERT_NE(cluster, nullptr);
  auto stub = ConnectCoordinator(cluster->grpc_address(), "", cluster->user_token());
  // All READY before the first submit, so that the first two are placed together.
  ASSERT_TRUE(AwaitReadyWorkers(*stub, kWorkers));
  std::vector<std::string> ids;
  for (const v1::JobSpec& spec : specs) ids.push_back(testing::SubmitJob(*stub, spec));

  const auto stepping = [](const v1::Job& j) {
    return Ended(j) || (j.state() == v1::JOB_STATE_RUNNING && j.progress().step() >= 1);
  };
  // Hold the second job once it steps: its last stage's process stopped.
  const v1::Job second_running = AwaitJob(*stub, ids[1], absl::Minutes(2), stepping);
  ASSERT_EQ(second_running.state(), v1::JOB_STATE_RUNNING) << second_running.reason();
  ASSERT_EQ(second_running.worker_ids_size(), 2);
  const int held = ProcessOf(*stub, second_running.worker_ids(1));
  ASSERT_GE(held, 0) << second_running.worker_ids(1);
  cluster->worker(held).Signal(SIGSTOP);
  const v1::Job first = AwaitJob(*stub, ids[0], absl::Minutes(2), Ended);
  // The third starts on the first's workers; then the second goes on beside it.
  const v1::Job third_running = AwaitJob(*stub, ids[2], absl::Minutes(2), stepping);
  const v1::Job second_meanwhile = testing::GetJob(*stub, ids[1]);
  cluster->worker(held).Signal(SIGCONT);
  const v1::Job third = AwaitJob(*stub, ids[2], absl::Minutes(2), Ended);
  const v1::Job second = AwaitJob(*stub, ids[1], absl::Minutes(2), Ended);

  // The first two ran at once on disjoint workers: the second was placed
  // before the first ended (its update_time: its last change, the end).
  ASSERT_EQ(first.plan_history_size(), 1);
  ASSERT_EQ(second.plan_history_size(), 1);
  ASSERT_EQ(third.plan_history_size(), 1);
  EXPECT_LT(Nanos(second.plan_history(0).time()), Nanos(first.update_time()));
  EXPECT_EQ(Workers(first).size(), 2u);
  EXPECT_EQ(Workers(second), Workers(second_running));
  for (const std::string& w : first.worker_ids()) EXPECT_EQ(Workers(second).count(w), 0u) << w;
  // The third took the first's freed workers while the second still ran.
  EXPECT_EQ(Workers(third_running), Workers(first));
  EXPECT_EQ(Workers(third), Workers(first));
  EXPECT_EQ(second_meanwhile.state(), v1::JOB_STATE_RUNNING) << second_meanwhile.reason();

  // Bitwise: without data or tensor parallelism every sum runs in
  // train-local's order.
  ExpectEqualsTrainLocal(first, refs[0]);
  ExpectEqualsTrainLocal(second, refs[1]);
  ExpectEqualsTrainLocal(third, refs[2]);
}

}  // namespace
}  // namespace pipetrain
