// DESIGN.md §4 and §12 across processes: a coordinator and 9 worker
// processes on loopback run D replicas of a P-stage pipeline
// (spec.parallelism.data), D in {2, 3} and P in {1, 2, 3}, 1F1B and GPipe,
// a pinned Bi-Partition plan among them, with gradient clipping by the
// global norm and a warm-up + cosine schedule. The per-step losses (from
// the coordinator) and the exported weights must equal train-local's on
// the same global batch within 1e-5 relative (worker/runtime/
// data_parallel_testing.h says why not bitwise, and how the key bias is
// held), and every replica must end with bitwise the same weights: each
// stage reports a SHA-256 of its final weights and the coordinator fails
// the job when two replicas' copies differ (JobManager; checked below by a
// job that SUCCEEDED).
#include <array>
#include <cstdio>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/coordinator_client.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"
#include "tests/cluster_testing.h"
#include "tests/parallel_cluster_testing.h"
#include "worker/data/corpus.h"
#include "worker/runtime/data_parallel_testing.h"
#include "worker/train/local_trainer.h"

namespace pipetrain {
namespace {

using testing::ExpectMatchesTrainLocal;
using testing::Reference;
using testing::TrainLocally;

constexpr int kSteps = testing::kParallelTestSteps;

// 6 micro-batches of 2 sequences (divisible by 2 and 3 replicas).
v1::JobSpec Spec(int replicas, int stages, const std::string& schedule,
                 const std::string& weights_path) {
  v1::JobSpec spec =
      testing::ParallelTestSpec({"data-parallel", 2, 12, 6, 5, stages, schedule, weights_path});
  spec.mutable_parallelism()->set_data(replicas);
  return spec;
}

class DataParallelClusterTest : public testing::SharedClusterTest {
 protected:
  static void SetUpTestSuite() { StartSharedCluster("dp", 9); }
};

TEST_F(DataParallelClusterTest, ReplicasOfOneToThreeStages_MatchTrainLocal) {
  const Reference ref = TrainLocally(Spec(1, 1, "1f1b", ""));
  for (int replicas : {2, 3}) {
    for (int stages : {1, 2, 3}) {
      for (const std::string schedule : {"1f1b", "gpipe"}) {
        const std::string name = absl::StrCat("D", replicas, "P", stages, schedule);
        SCOPED_TRACE(name);
        ExpectMatchesTrainLocal(cluster_, Spec(replicas, stages, schedule, name + ".safetensors"),
                                ref);
      }
    }
  }
}

// A pinned Bi-Partition plan (solver manual; units 0 embed, 1 attn_0,
// 2 mlp_0, 3 attn_1, 4 mlp_1, 5 head): the middle worker runs backward
// passes only, recomputing its forward, in every replica.
TEST_F(DataParallelClusterTest, BiPartitionPlanReplicated_MatchesTrainLocal) {
  const Reference ref = TrainLocally(Spec(1, 1, "1f1b", ""));
  const std::vector<std::array<int, 4>> pinned = {{0, 2, 0, 1}, {2, 2, 1, 4}, {2, 6, 4, 6}};
  for (int replicas : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("D", replicas));
    v1::JobSpec spec = Spec(replicas, 3, "1f1b", absl::StrCat("bi", replicas, ".safetensors"));
    spec.mutable_parallelism()->set_solver("manual");
    for (const auto& r : pinned) {
      v1::ManualStage* stage = spec.mutable_parallelism()->add_manual_stages();
      stage->set_forward_begin(r[0]);
      stage->set_forward_end(r[1]);
      stage->set_backward_begin(r[2]);
      stage->set_backward_end(r[3]);
    }
    ExpectMatchesTrainLocal(cluster_, spec, ref);
  }
}

// spec.parallelism.data 0 (auto) on 6 of the workers: the planner picks
// one of 1 x 6, 2 x 3, 3 x 2 and 6 x 1 (whichever its simulation finds
// fastest on this host), the job names it in its spec and plan history,
// and it trains as train-local does.
TEST_F(DataParallelClusterTest, AutoLayout_ChosenByThePlannerAndMatchesTrainLocal) {
  const Reference ref = TrainLocally(Spec(1, 1, "1f1b", ""));
  v1::JobSpec spec = Spec(0, 0, "1f1b", "auto.safetensors");
  spec.mutable_parallelism()->set_workers(6);
  v1::Job job;
  ExpectMatchesTrainLocal(cluster_, spec, ref, &job);
  const v1::ParallelismSpec& chosen = job.spec().parallelism();
  EXPECT_GE(chosen.data(), 1);
  EXPECT_EQ(chosen.data() * chosen.stages(), 6);
  ASSERT_GE(job.plan_history_size(), 1);
  EXPECT_TRUE(absl::StrContains(
      job.plan_history(0).reason(),
      absl::StrCat(testing::LayoutWords(chosen.data(), chosen.stages()),
                   " chosen by spec.parallelism.data 0 (auto); predicted s/step: 1 x 6 ")))
      << job.plan_history(0).reason();
}

// pipetrain_collectives_total summed over purposes and the cluster's 9
// workers.
double CollectivesInMetrics() {
  double total = 0;
  for (int w = 0; w < 9; ++w) {
    const std::string text = testing::ScrapeMetrics(testing::WorkerMetricsPort("dp", w));
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      if (!absl::StartsWith(line, "pipetrain_collectives_total{")) continue;
      double value = 0;
      EXPECT_TRUE(absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) << line;
      total += value;
    }
  }
  return total;
}

// Fused embedding synchronization (Optimus-CC §6) across processes: the
// same losses and weights bit for bit as the exchange plus all-reduce it
// replaces, and one collective fewer per step on each of the embedding's
// and the head's owners, counted from the workers' metrics.
TEST_F(DataParallelClusterTest, FusedEmbeddingSync_BitwiseUnfused_OneCollectiveFewerInMetrics) {
  ASSERT_NE(cluster_, nullptr);
  auto stub = ConnectCoordinator(cluster_->grpc_address(), "", cluster_->user_token());
  std::vector<v1::Job> jobs;
  std::vector<double> collectives;
  for (const bool fused : {false, true}) {
    v1::JobSpec spec = Spec(2, 2, "1f1b", fused ? "fused.safetensors" : "unfused.safetensors");
    spec.mutable_parallelism()->set_fused_embedding_sync(fused);
    const double before = CollectivesInMetrics();
    const std::string id = testing::SubmitJob(*stub, spec);
    jobs.push_back(testing::AwaitJob(*stub, id, absl::Minutes(5), testing::Ended));
    ASSERT_EQ(jobs.back().state(), v1::JOB_STATE_SUCCEEDED) << jobs.back().reason();
    collectives.push_back(CollectivesInMetrics() - before);
  }
  EXPECT_EQ(std::vector<float>(jobs[1].progress().loss_history().begin(),
                               jobs[1].progress().loss_history().end()),
            std::vector<float>(jobs[0].progress().loss_history().begin(),
                               jobs[0].progress().loss_history().end()));
  EXPECT_EQ(jobs[1].progress().val_loss(), jobs[0].progress().val_loss());
  auto unfused = ReadSafetensors(jobs[0].weights_path());
  auto fused = ReadSafetensors(jobs[1].weights_path());
  ASSERT_TRUE(unfused.ok() && fused.ok());
  ASSERT_EQ(fused->tensors.size(), unfused->tensors.size());
  for (const auto& t : unfused->tensors) {
    const Tensor* other = fused->Find(t.name);
    ASSERT_NE(other, nullptr) << t.name;
    EXPECT_EQ(other->ToVector(), t.tensor.ToVector()) << t.name << " (bitwise)";
  }
  std::printf("collectives in the workers' metrics: unfused %.0f, fused %.0f\n", collectives[0],
              collectives[1]);
  // 2 replicas x 2 owners x 10 steps.
  EXPECT_EQ(collectives[0] - collectives[1], 2 * 2 * kSteps)
      << "unfused " << collectives[0] << ", fused " << collectives[1];
}

// Selective stage compression across processes, with error feedback:
// PowerSGD, and a quantizer, on stages 0 and 1 of 3, and bf16 in a layout
// the planner chooses (data 0 over 6 workers, the stages its choice too).
// Each job SUCCEEDS (so the replicas' final weights agreed bit for bit)
// and trains alike: its last loss within 2% of train-local's loss drop
// (first loss minus last) of train-local's last. Measured: PowerSGD rank 2
// 2.7e-3 of the drop, linear:bits=8 9e-4, bf16 under 1e-4; linear:bits=4
// in bits=8's place 3.6e-2 and bits=2 9.9e-2, both within the 5%-of-loss
// window this replaced (a third of the drop of 0.38).
TEST_F(DataParallelClusterTest, SelectiveStageCompression_ReplicasAgreeAndTrain) {
  ASSERT_NE(cluster_, nullptr);
  const Reference ref = TrainLocally(Spec(1, 1, "1f1b", ""));
  const double drop = double{ref.losses.front()} - ref.losses.back();
  ASSERT_GT(drop, 0) << "train-local does not train";
  auto stub = ConnectCoordinator(cluster_->grpc_address(), "", cluster_->user_token());
  for (const std::string codec : {"powersgd:rank=2", "linear:bits=8", "auto bf16"}) {
    SCOPED_TRACE(codec);
    v1::JobSpec spec = Spec(2, 3, "1f1b", "compressed.safetensors");
    v1::DataParallelCompressionSpec* dp = spec.mutable_compression()->mutable_data_parallel();
    if (codec == "auto bf16") {
      spec = Spec(0, 0, "1f1b", "compressed.safetensors");
      spec.mutable_parallelism()->set_workers(6);
      spec.mutable_compression()->mutable_data_parallel()->set_codec("bf16");
    } else {
      dp->set_codec(codec);
      dp->add_stages(0);
      dp->add_stages(1);
    }
    const std::string id = testing::SubmitJob(*stub, spec);
    const v1::Job job = testing::AwaitJob(*stub, id, absl::Minutes(5), testing::Ended);
    ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
    ASSERT_EQ(job.progress().loss_history_size(), kSteps);
    const float last = job.progress().loss_history(kSteps - 1);
    EXPECT_NEAR(last, ref.losses.back(), 0.02 * drop) << "train-local's drop " << drop;
    if (codec != "auto bf16") {
      EXPECT_NE(last, ref.losses.back());  // the codec bites
      continue;
    }
    // The layout chosen keeps the codec where it has replicas.
    const int replicas = job.spec().parallelism().data();
    EXPECT_EQ(replicas * job.spec().parallelism().stages(), 6);
    EXPECT_EQ(job.spec().compression().data_parallel().codec(), replicas > 1 ? "bf16" : "none");
  }
}

// Bad input: the field is named.
TEST_F(DataParallelClusterTest, MicroBatchesNotDivisibleByReplicas_Rejected) {
  ASSERT_NE(cluster_, nullptr);
  auto stub = ConnectCoordinator(cluster_->grpc_address(), "", cluster_->user_token());
  v1::JobSpec spec = Spec(2, 1, "1f1b", "");
  spec.mutable_training()->set_batch_size(10);
  spec.mutable_training()->set_micro_batches(5);
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  v1::Job job;
  grpc::ClientContext context;
  const grpc::Status status = stub->SubmitJob(&context, request, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message().rfind("spec.training.micro_batches: ", 0), 0u)
      << status.error_message();
}

}  // namespace
}  // namespace pipetrain
