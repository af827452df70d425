// DESIGN.md §4 across processes: a coordinator and 4 worker processes on
// loopback train the same small GPT for 10 iterations of 4 micro-batches
// with P = 1..4 stages, uniform and pipedream plans, 1F1B and GPipe. The
// per-iteration losses (from the coordinator) and the exported weights file
// must equal LocalTrainer's. The Service issue asks for 1e-5 relative; the
// design makes them bitwise equal, which the test checks (and which implies
// that bound); so is the validation loss measured after the last step
// (spec.training.eval_interval).
#include <array>
#include <cstdlib>

#include "cli/coordinator_client.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/cluster_testing.h"
#include "tests/parallel_cluster_testing.h"

namespace pipetrain {
namespace {

v1::JobSpec Spec(int stages, const std::string& solver, const std::string& schedule,
                 const std::string& weights_path) {
  v1::JobSpec spec;
  spec.set_name("equivalence");
  spec.mutable_model()->set_n_layer(2);
  spec.mutable_model()->set_n_head(2);
  spec.mutable_model()->set_d_model(32);
  auto* t = spec.mutable_training();
  t->set_seq_len(16);
  t->set_batch_size(8);
  t->set_micro_batches(4);
  t->set_steps(10);
  t->set_lr(1e-3f);
  t->set_seed(5);
  // Validation after the last step, over 41 windows: 21 micro-batches (20 of
  // 2 windows, one of 1), more than a mailbox's evaluation window (8 past
  // the latest taken), so a stage that runs ahead is held back by it.
  t->set_eval_interval(10);
  t->set_eval_windows(41);
  spec.mutable_data()->set_synthetic_bytes(100000);
  spec.mutable_parallelism()->set_stages(stages);
  spec.mutable_parallelism()->set_solver(solver);
  spec.mutable_parallelism()->set_schedule(schedule);
  spec.mutable_output()->set_weights_path(weights_path);
  return spec;
}

using testing::Reference;
using testing::TrainLocally;

class ClusterEquivalenceTest : public ::testing::Test {
 protected:
  // Planned over a declared 1 Gbit/s network (the coordinator's
  // --network): whatever the plans, the results are train-local's.
  static void SetUpTestSuite() {
    cluster_ = testing::StartTestCluster("eq", 4, {"--network=1Gbit,0.2ms"}).release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  static LocalCluster* cluster_;
};

LocalCluster* ClusterEquivalenceTest::cluster_ = nullptr;

// Runs `spec` on the cluster and expects train-local's losses, validation
// loss and weights file, bitwise (testing::ExpectEqualsTrainLocal).
// `submitted` (if given) receives the job's id.
void ExpectRunEqualsTrainLocal(LocalCluster* cluster, const v1::JobSpec& spec, const Reference& ref,
                               std::string* submitted = nullptr) {
  ASSERT_NE(cluster, nullptr);
  auto stub = ConnectCoordinator(cluster->grpc_address(), "", cluster->user_token());
  const std::string id = testing::SubmitJob(*stub, spec);
  if (submitted != nullptr) *submitted = id;
  const v1::Job job = testing::AwaitJob(*stub, id, absl::Minutes(5), testing::Ended);
  testing::ExpectEqualsTrainLocal(job, ref);
  // The coordinator wrote it under its --output-dir (the cluster's directory).
  EXPECT_TRUE(absl::EndsWith(job.weights_path(), "/" + spec.output().weights_path()))
      << job.weights_path();
}

// A name under the coordinator's --output-dir.
std::string WeightsPath(const std::string& name) { return "w-" + name + ".safetensors"; }

TEST_F(ClusterEquivalenceTest, AllStageCountsSolversAndSchedules_MatchTrainLocal) {
  const Reference ref = TrainLocally(Spec(1, "uniform", "1f1b", ""));
  for (int stages = 1; stages <= 4; ++stages) {
    for (const std::string solver : {"uniform", "pipedream"}) {
      for (const std::string schedule : {"1f1b", "gpipe"}) {
        SCOPED_TRACE("P=" + std::to_string(stages) + " " + solver + " " + schedule);
        const std::string path = WeightsPath(std::to_string(stages) + solver + schedule);
        ExpectRunEqualsTrainLocal(cluster_, Spec(stages, solver, schedule, path), ref);
      }
    }
  }
}

// Bi-Partition plans whose forward and backward cuts differ, pinned with
// solver "manual" so the test does not depend on what a solver picks for
// this tiny model (units: 0 embed, 1 attn_0, 2 mlp_0, 3 attn_1, 4 mlp_1,
// 5 head): recompute on the backward owner, routed inputs, weight sync,
// a backward-only and a forward-only worker.
TEST_F(ClusterEquivalenceTest, BiPartitionPlans_ThreeAndFourWorkers_MatchTrainLocal) {
  const Reference ref = TrainLocally(Spec(1, "uniform", "1f1b", ""));
  struct Pinned {
    std::string name;
    std::vector<std::array<int, 4>> stages;  // forward begin/end, backward begin/end
  };
  const std::vector<Pinned> plans = {
      {"p3-backward-cut-first", {{0, 1, 0, 2}, {1, 4, 2, 4}, {4, 6, 4, 6}}},
      {"p3-backward-only-worker", {{0, 2, 0, 1}, {2, 2, 1, 4}, {2, 6, 4, 6}}},
      {"p4-forward-only-head", {{0, 1, 0, 2}, {1, 3, 2, 3}, {3, 5, 3, 6}, {5, 6, 6, 6}}},
      {"p4-staggered", {{0, 2, 0, 1}, {2, 3, 1, 3}, {3, 4, 3, 5}, {4, 6, 5, 6}}},
  };
  for (const Pinned& plan : plans) {
    for (const std::string schedule : {"1f1b", "gpipe"}) {
      SCOPED_TRACE(plan.name + " " + schedule);
      v1::JobSpec spec = Spec(static_cast<int>(plan.stages.size()), "manual", schedule,
                              WeightsPath(plan.name + schedule));
      for (const auto& r : plan.stages) {
        v1::ManualStage* stage = spec.mutable_parallelism()->add_manual_stages();
        stage->set_forward_begin(r[0]);
        stage->set_forward_end(r[1]);
        stage->set_backward_begin(r[2]);
        stage->set_backward_end(r[3]);
      }
      ExpectRunEqualsTrainLocal(cluster_, spec, ref);
    }
  }
}

// The whole path of a bipartition job: PROFILING on a worker, the solver,
// then the run — whatever cuts it picks, the result is train-local's.
TEST_F(ClusterEquivalenceTest, BiPartitionSolverJob_ProfilesThenMatchesTrainLocal) {
  const Reference ref = TrainLocally(Spec(1, "uniform", "1f1b", ""));
  for (const std::string solver : {"bipartition", "auto"}) {
    SCOPED_TRACE(solver);
    std::string id;
    ExpectRunEqualsTrainLocal(cluster_, Spec(4, solver, "1f1b", WeightsPath(solver)), ref, &id);
    ASSERT_FALSE(id.empty());
    auto stub = ConnectCoordinator(cluster_->grpc_address(), "", cluster_->user_token());
    v1::GetPlanRequest request;
    request.set_job_id(id);
    v1::Plan plan;
    grpc::ClientContext plan_context;
    ASSERT_TRUE(stub->GetPlan(&plan_context, request, &plan).ok());
    EXPECT_TRUE(absl::StartsWith(plan.profile_source(), "measured on cpu:"))
        << plan.profile_source();
    EXPECT_TRUE(absl::StrContains(plan.profile_source(),
                                  "links modelled at 0.125 GB/s and 200 us latency (the "
                                  "coordinator's --network)"))
        << plan.profile_source();
    EXPECT_GT(plan.predicted_iteration_seconds(), 0);
    EXPECT_TRUE(absl::StrContains(plan.timeline_svg(), "<svg"));
    if (solver == "auto") {
      EXPECT_EQ(plan.candidates_size(), 3);
    }
  }
}

// Gradient clipping by the global norm and a warm-up + cosine schedule
// across processes: the stages exchange their gradient sums over the data
// plane before each optimizer step, and the losses and weights stay
// train-local's bitwise.
TEST_F(ClusterEquivalenceTest, ClippingAndCosineSchedule_ThreeStages_MatchTrainLocal) {
  v1::JobSpec spec = Spec(3, "uniform", "1f1b", WeightsPath("clip"));
  spec.mutable_training()->set_grad_clip(0.05f);
  spec.mutable_training()->set_lr_schedule("cosine");
  spec.mutable_training()->set_warmup_steps(3);
  spec.mutable_training()->set_min_lr(1e-4f);
  const Reference ref = TrainLocally(spec);
  v1::JobSpec unclipped = spec;
  unclipped.mutable_training()->set_grad_clip(0);
  ASSERT_NE(TrainLocally(unclipped).losses, ref.losses) << "the clip never bit";
  ExpectRunEqualsTrainLocal(cluster_, spec, ref);
}

}  // namespace
}  // namespace pipetrain
