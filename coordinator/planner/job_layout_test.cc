// ChooseJobLayout against brute force: every layout planned on its own as
// a job naming its D, the choice the fastest of them; the choice follows
// the links (data parallelism on fast ones, the pipeline on slow ones);
// layouts without a plan are listed with their reason.
#include "coordinator/planner/job_layout.h"

#include <algorithm>
#include <string>

#include "absl/strings/match.h"
#include "coordinator/planner/cluster_testing.h"
#include "coordinator/planner/data_parallel_layout.h"
#include "coordinator/planner/solve_plan.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"

namespace pipetrain {
namespace {

// A 2-layer (6-unit), d_model 128 job of 8 sequences of 64 tokens in 4
// micro-batches over `workers` workers, data 0 (auto), its data-parallel
// all-reduce through `dp_codec`, each stage on `tensor` tensor ranks.
v1::JobSpec AutoSpec(int workers, const std::string& dp_codec = "none", int tensor = 1) {
  v1::JobSpec spec;
  spec.set_name("job-layout-test");
  spec.mutable_model()->set_n_layer(2);
  spec.mutable_model()->set_n_head(4);
  spec.mutable_model()->set_d_model(128);
  spec.mutable_training()->set_seq_len(64);
  spec.mutable_training()->set_batch_size(8);
  spec.mutable_training()->set_micro_batches(4);
  spec.mutable_training()->set_steps(10);
  spec.mutable_data()->set_synthetic_bytes(100000);
  spec.mutable_parallelism()->set_solver("pipedream");
  spec.mutable_parallelism()->set_data(kDataParallelAuto);
  spec.mutable_parallelism()->set_workers(workers);
  spec.mutable_compression()->mutable_data_parallel()->set_codec(dp_codec);
  spec.mutable_parallelism()->set_tensor(tensor);
  return spec;
}

ModelProfile ProfileOf(const ResolvedJobSpec& job) {
  return AnalyticProfile(job.train.model, job.train.seq_len,
                         job.train.batch_size / job.train.micro_batches, 1e10);
}

// Chooses a layout for `workers` workers on `cluster` and checks it against
// each layout planned as its own job (with `dp_codec` where it has
// replicas): the same predictions, and the choice the lowest of them (ties:
// the smaller T, then the smaller D). With `tensor` ranks per stage, the
// layouts are D replicas of the workers / tensor groups; with tensor 0
// (searched), those of every T dividing the workers and the 4 heads.
// Returns the chosen D, and its T in `chosen_tensor` when given.
int ChosenAgainstBruteForce(int workers, const ClusterSpec& cluster,
                            const std::string& dp_codec = "none", int tensor = 1,
                            int* chosen_tensor = nullptr) {
  const ResolvedJobSpec automatic = ResolveJobSpec(AutoSpec(workers, dp_codec, tensor)).value();
  const ModelProfile profile = ProfileOf(automatic);
  absl::StatusOr<ChosenJobLayout> choice =
      ChooseJobLayout(automatic, "job", 1, profile, cluster, "analytic");
  EXPECT_TRUE(choice.ok()) << choice.status();
  if (!choice.ok()) return 0;
  int best = 0, best_tensor = 0;
  double best_seconds = 0;
  size_t trial = 0;
  std::vector<int> tensors;
  for (int t = 1; t <= workers; ++t) {
    if ((tensor == 0 || t == tensor) && workers % t == 0 && 4 % t == 0) tensors.push_back(t);
  }
  for (int t : tensors) {
    const int groups = workers / t;
    for (int d = 1; d <= groups; ++d) {
      if (groups % d != 0 || 4 % d != 0 || groups / d > 6) continue;
      v1::JobSpec spec = AutoSpec(workers, d > 1 ? dp_codec : "none", t);
      spec.mutable_parallelism()->clear_workers();
      spec.mutable_parallelism()->set_data(d);
      spec.mutable_parallelism()->set_stages(groups / d);
      absl::StatusOr<CompiledPlan> own =
          PlanJob(ResolveJobSpec(spec).value(), "job", 1, profile, cluster, "analytic");
      EXPECT_TRUE(own.ok()) << own.status();
      if (!own.ok()) return 0;
      const double seconds = own->plan.predicted_iteration_seconds();
      EXPECT_LT(trial, choice->trials.size());
      if (trial >= choice->trials.size()) return 0;
      EXPECT_EQ(choice->trials[trial].data_parallel, d);
      EXPECT_EQ(choice->trials[trial].stages, groups / d);
      EXPECT_EQ(choice->trials[trial].tensor_parallel, t);
      EXPECT_EQ(choice->trials[trial].predicted_step_seconds, seconds);
      ++trial;
      if (best == 0 || seconds < best_seconds) {
        best = d;
        best_tensor = t;
        best_seconds = seconds;
      }
    }
  }
  EXPECT_EQ(trial, choice->trials.size());
  EXPECT_EQ(choice->searched_tensor, tensor == 0);
  EXPECT_EQ(choice->resolved.data_parallel, best);
  EXPECT_EQ(choice->resolved.stages, workers / (best * best_tensor));
  EXPECT_EQ(choice->resolved.tensor_parallel, best_tensor);
  EXPECT_EQ(choice->compiled.plan.tensor_parallel(), best_tensor);
  EXPECT_EQ(choice->resolved.spec.parallelism().data(), best);
  EXPECT_EQ(choice->resolved.spec.parallelism().tensor(), best_tensor);
  EXPECT_EQ(choice->compiled.plan.data_parallel(), best);
  EXPECT_EQ(choice->compiled.plan.predicted_iteration_seconds(), best_seconds);
  EXPECT_EQ(choice->compiled.plan.stages_size(), workers);
  if (best > 1 && dp_codec != "none") {
    EXPECT_EQ(choice->resolved.spec.compression().data_parallel().codec(), dp_codec);
  }
  if (chosen_tensor != nullptr) *chosen_tensor = best_tensor;
  return best;
}

TEST(ChooseJobLayout, FastLinks_AllReplicasSlowLinks_ThePipeline) {
  // 10 GB/s: the all-reduce is cheap and every stage boundary a bubble, so
  // 4 replicas of the whole model win. 1 MB/s: all-reducing the model
  // (~0.5 M parameters, seconds) costs far more than the pipeline's
  // activations (256 KB, a quarter second), so one pipeline wins.
  EXPECT_EQ(ChosenAgainstBruteForce(4, testing::TestCluster(4, 1e10, 1e-6)), 4);
  EXPECT_EQ(ChosenAgainstBruteForce(4, testing::TestCluster(4, 1e6, 1e-4)), 1);
  EXPECT_GT(ChosenAgainstBruteForce(6, testing::TestCluster(6, 1e8, 1e-4)), 0);  // 1 x 6 or 2 x 3
  EXPECT_EQ(ChosenAgainstBruteForce(1, testing::TestCluster(1, 1e8, 1e-4)), 1);
}

// GPU and CPU workers whose order interleaves the kinds: every layout with
// replicas is planned on them arranged so that each stage's replicas are
// of one kind (as a job naming its layout is placed), and the order is
// returned for the placement. In the cluster's order each layout was
// refused (CheckReplicaDevices), and with no single pipeline possible
// (8 stages of 6 units) the job failed.
TEST(ChooseJobLayout, KindsInterleaved_EachLayoutArrangedByKind) {
  ClusterSpec cluster = testing::TestCluster(8, 1e10, 1e-6);
  for (int i : {2, 3, 4, 5}) cluster.workers[i].gpu = true;
  const ResolvedJobSpec automatic = ResolveJobSpec(AutoSpec(8)).value();
  absl::StatusOr<ChosenJobLayout> choice =
      ChooseJobLayout(automatic, "job", 1, ProfileOf(automatic), cluster, "analytic");
  ASSERT_TRUE(choice.ok()) << choice.status();
  for (const LayoutTrial& t : choice->trials) {
    EXPECT_TRUE(t.status.ok()) << t.data_parallel << " x " << t.stages << ": " << t.status;
  }
  ASSERT_EQ(choice->order.size(), 8u);
  std::vector<size_t> sorted = choice->order;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) EXPECT_EQ(sorted[i], i);
  ClusterSpec arranged = cluster;
  for (size_t i = 0; i < 8; ++i) arranged.workers[i] = cluster.workers[choice->order[i]];
  EXPECT_TRUE(
      CheckReplicaDevices(arranged, choice->resolved.data_parallel, choice->resolved.stages, 1)
          .ok());
  EXPECT_FALSE(
      CheckReplicaDevices(cluster, choice->resolved.data_parallel, choice->resolved.stages, 1)
          .ok());
  // The plan names the arranged workers at their positions.
  for (int p = 0; p < choice->compiled.plan.stages_size(); ++p) {
    EXPECT_EQ(choice->compiled.plan.stages(p).worker_id(), arranged.workers[p].name) << p;
  }
  // One kind only: the cluster's order, nothing to return.
  const ClusterSpec cpus = testing::TestCluster(8, 1e10, 1e-6);
  absl::StatusOr<ChosenJobLayout> plain =
      ChooseJobLayout(automatic, "job", 1, ProfileOf(automatic), cpus, "analytic");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(plain->order.empty());
}

// Stages of 2 tensor ranks: 8 workers are 4 groups, laid out as 1 x 4,
// 2 x 2 or 4 x 1 groups, each planned as the job naming it would be. On
// fast links the replicas win as without tensor ranks; on slow ones every
// layout pays the ranks' all-reduces, and the brute force decides. The
// line says the ranks.
TEST(ChooseJobLayout, TensorRanks_LayoutsOfTheGroups) {
  EXPECT_EQ(ChosenAgainstBruteForce(8, testing::TestCluster(8, 1e10, 1e-6), "none", 2), 4);
  EXPECT_GT(ChosenAgainstBruteForce(8, testing::TestCluster(8, 1e6, 1e-4), "none", 2), 0);
  const ResolvedJobSpec automatic = ResolveJobSpec(AutoSpec(8, "none", 2)).value();
  absl::StatusOr<ChosenJobLayout> choice = ChooseJobLayout(
      automatic, "job", 1, ProfileOf(automatic), testing::TestCluster(8, 1e10, 1e-6), "analytic");
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_TRUE(absl::StartsWith(DescribeLayoutChoice(*choice),
                               "4 replicas x 1 stage of 2 tensor ranks chosen by "
                               "spec.parallelism.data 0 (auto); predicted s/step: 1 x 4 "))
      << DescribeLayoutChoice(*choice);
}

// Tensor 0 searches T as well: the 4 heads allow T 1, 2 and 4, and every
// (T, D) is planned as the job naming it would be. On 1 MB/s links the
// tensor ranks' all-reduces, two per block each way, cost far more than
// the pipeline's activations, so one pipeline of single ranks wins; on
// fast links and other counts the brute force decides (at 10 GB/s,
// 4 x 1 x 1 and 2 x 1 x 2 predict within 0.1 ms of each other). The line
// lists D x P x T.
TEST(ChooseJobLayout, TensorSearched_EveryTAndDAgainstBruteForce) {
  int tensor = 0;
  EXPECT_EQ(ChosenAgainstBruteForce(4, testing::TestCluster(4, 1e6, 1e-4), "none", 0, &tensor), 1);
  EXPECT_EQ(tensor, 1);
  EXPECT_GT(ChosenAgainstBruteForce(4, testing::TestCluster(4, 1e10, 1e-6), "none", 0), 0);
  EXPECT_GT(ChosenAgainstBruteForce(8, testing::TestCluster(8, 1e8, 1e-4), "none", 0), 0);
  EXPECT_GT(ChosenAgainstBruteForce(3, testing::TestCluster(3, 1e8, 1e-4), "none", 0), 0);
  EXPECT_GT(ChosenAgainstBruteForce(8, testing::TestCluster(8, 3e7, 1e-4), "powersgd:rank=1", 0),
            0);
  const ResolvedJobSpec automatic = ResolveJobSpec(AutoSpec(4, "none", 0)).value();
  absl::StatusOr<ChosenJobLayout> choice = ChooseJobLayout(
      automatic, "job", 1, ProfileOf(automatic), testing::TestCluster(4, 1e6, 1e-4), "analytic");
  ASSERT_TRUE(choice.ok()) << choice.status();
  const std::string line = DescribeLayoutChoice(*choice);
  EXPECT_TRUE(absl::StartsWith(line,
                               "1 replica x 4 stages of 1 tensor rank chosen by "
                               "spec.parallelism.data 0 and tensor 0 (auto); predicted s/step "
                               "(replicas x stages x tensor ranks): 1 x 4 x 1 "))
      << line;
  EXPECT_TRUE(absl::StrContains(line, ", 1 x 1 x 4 ")) << line;
}

// Searching T over a vocabulary of 258 (2 x 129): T 4 splits no layout,
// and the line says why, with the way out, after the trials.
TEST(ChooseJobLayout, TensorSearched_TheTNotTriedAndWhy) {
  v1::JobSpec spec = AutoSpec(4, "none", 0);
  spec.mutable_model()->set_vocab_size(258);
  const ResolvedJobSpec automatic = ResolveJobSpec(spec).value();
  absl::StatusOr<ChosenJobLayout> choice = ChooseJobLayout(
      automatic, "job", 1, ProfileOf(automatic), testing::TestCluster(4, 1e6, 1e-4), "analytic");
  ASSERT_TRUE(choice.ok()) << choice.status();
  for (const LayoutTrial& t : choice->trials) EXPECT_LE(t.tensor_parallel, 2);
  EXPECT_EQ(choice->tensor_not_tried,
            std::vector<std::string>{"T 4 (tensor parallelism of 4 does not divide "
                                     "model.vocab_size 258 (pad it to a multiple of 4, e.g. 260; "
                                     "the data's token ids stay valid))"});
  const std::string line = DescribeLayoutChoice(*choice);
  EXPECT_TRUE(absl::EndsWith(line, "; not tried: " + choice->tensor_not_tried[0])) << line;
  // The cube takes p^3 ranks: of 8 workers' divisors only 8 is a candidate,
  // and it splits the 4 heads and 128 wide model (p 2) but not 258 tokens.
  v1::JobSpec cube = AutoSpec(8, "none", 0);
  cube.mutable_parallelism()->set_tensor_mode("3d");
  cube.mutable_training()->set_micro_batches(2);  // 4 samples each: p^2
  cube.mutable_model()->set_vocab_size(258);
  EXPECT_TRUE(absl::StartsWith(ResolveJobSpec(cube).status().message(),
                               "spec.parallelism.workers: no layout of 8 workers"))
      << ResolveJobSpec(cube).status();
  cube.mutable_model()->set_vocab_size(256);
  const ResolvedJobSpec cube_ok = ResolveJobSpec(cube).value();
  absl::StatusOr<ChosenJobLayout> cube_choice = ChooseJobLayout(
      cube_ok, "job", 1, ProfileOf(cube_ok), testing::TestCluster(8, 1e9, 1e-5), "analytic");
  ASSERT_TRUE(cube_choice.ok()) << cube_choice.status();
  EXPECT_EQ(cube_choice->resolved.tensor_parallel, 8);
  EXPECT_TRUE(cube_choice->tensor_not_tried.empty());  // 2 and 4 are no cubes
  // Not searching T, nothing is listed.
  spec.mutable_parallelism()->set_tensor(2);
  const ResolvedJobSpec fixed = ResolveJobSpec(spec).value();
  absl::StatusOr<ChosenJobLayout> fixed_choice = ChooseJobLayout(
      fixed, "job", 1, ProfileOf(fixed), testing::TestCluster(4, 1e6, 1e-4), "analytic");
  ASSERT_TRUE(fixed_choice.ok()) << fixed_choice.status();
  EXPECT_TRUE(fixed_choice->tensor_not_tried.empty());
}

// A data-parallel codec takes part in the choice: each layout with
// replicas is planned with it (its stages picked by the planner). On 30 MB/s
// links the exact all-reduce of the ~0.5 M parameters makes the pipeline
// fastest; PowerSGD of rank 1 shrinks the matrices' share enough for two
// replicas to win.
TEST(ChooseJobLayout, DataParallelCodec_PlannedIntoEveryReplicatedLayout) {
  const ClusterSpec cluster = testing::TestCluster(4, 3e7, 1e-4);
  EXPECT_EQ(ChosenAgainstBruteForce(4, cluster), 1);
  EXPECT_GT(ChosenAgainstBruteForce(4, cluster, "powersgd:rank=1"), 1);
  EXPECT_GT(ChosenAgainstBruteForce(4, testing::TestCluster(4, 1e10, 1e-6), "bf16"), 1);
}

TEST(ChooseJobLayout, LayoutsThatDoNotFitAreListedAndSkipped) {
  const ResolvedJobSpec automatic = ResolveJobSpec(AutoSpec(4)).value();
  const ModelProfile profile = ProfileOf(automatic);
  // What one worker needs for the whole model (bipartition.h's memory: the
  // weights, their gradient and two AdamW moments, and one micro-batch's
  // stash in flight); 3/4 of it per worker fits the 4-stage pipeline, not
  // a whole replica on one worker.
  double model_bytes = 0;
  for (const UnitProfile& u : profile.units) model_bytes += 4 * u.weight_bytes + u.stash_bytes;
  absl::StatusOr<ChosenJobLayout> choice =
      ChooseJobLayout(automatic, "job", 1, profile,
                      testing::TestCluster(4, 1e10, 1e-6, 0, 0.75 * model_bytes), "analytic");
  ASSERT_TRUE(choice.ok()) << choice.status();
  ASSERT_EQ(choice->trials.size(), 3u);  // D = 1, 2, 4
  EXPECT_TRUE(choice->trials[0].status.ok()) << choice->trials[0].status;
  EXPECT_EQ(choice->trials[2].status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(choice->resolved.data_parallel, 4);
  const std::string line = DescribeLayoutChoice(*choice);
  EXPECT_TRUE(absl::StartsWith(line, absl::StrCat(choice->resolved.data_parallel, " replicas x ")))
      << line;
  EXPECT_TRUE(absl::StrContains(line, "4 x 1 no plan (RESOURCE_EXHAUSTED)")) << line;

  // Nothing fits: every layout's reason, under the first one's code.
  absl::StatusOr<ChosenJobLayout> none =
      ChooseJobLayout(automatic, "job", 1, profile,
                      testing::TestCluster(4, 1e10, 1e-6, 0, 0.01 * model_bytes), "analytic");
  ASSERT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(
      absl::StartsWith(none.status().message(), "no layout of 4 workers has a plan: 1 x 4: "))
      << none.status();
  EXPECT_TRUE(absl::StrContains(none.status().message(), "; 2 x 2: ")) << none.status();
  EXPECT_TRUE(absl::StrContains(none.status().message(), "; 4 x 1: ")) << none.status();
}

// The submit-time budget of an auto job is every layout's planning work.
TEST(ChooseJobLayout, PlanningWorkIsEveryLayoutsWork) {
  const ResolvedJobSpec automatic = ResolveJobSpec(AutoSpec(4)).value();
  double steps = 0;
  int64_t micro_batches = 0;
  for (int d : {1, 2, 4}) {
    const PlanningWork work = EstimatePlanningWork(ResolveDataParallelLayout(automatic, d).value());
    steps += work.solver_steps;
    micro_batches = std::max(micro_batches, work.stage_micro_batches);
  }
  const PlanningWork work = EstimatePlanningWork(automatic);
  EXPECT_GT(work.solver_steps, 0);
  EXPECT_DOUBLE_EQ(work.solver_steps, steps);
  EXPECT_EQ(work.stage_micro_batches, micro_batches);
  // Searching T: the layouts of every T too (1 x 2 and 2 x 1 of 2 ranks,
  // 1 x 1 of 4).
  const ResolvedJobSpec searched = ResolveJobSpec(AutoSpec(4, "none", 0)).value();
  for (const LayoutDegrees& l :
       {LayoutDegrees{1, 2, 2}, LayoutDegrees{2, 1, 2}, LayoutDegrees{1, 1, 4}}) {
    steps += EstimatePlanningWork(ResolveDataParallelLayout(searched, l).value()).solver_steps;
  }
  EXPECT_DOUBLE_EQ(EstimatePlanningWork(searched).solver_steps, steps);
}

// A recovery plans the layouts of fewer workers, and fewer may have more:
// 4 workers have three (1 x 4, 2 x 2, 4 x 1) where 5 have one (1 x 5), so
// the budget of 5 is checked against the work of 4.
TEST(ChooseJobLayout, PlanningWorkIsTheLargestOverFewerWorkers) {
  const ResolvedJobSpec five = ResolveJobSpec(AutoSpec(5)).value();
  const ResolvedJobSpec four = ResolveJobSpec(AutoSpec(4)).value();
  ASSERT_EQ(AutoLayoutDegrees(five.spec, 5).size(), 1u);
  const double own = EstimatePlanningWork(ResolveDataParallelLayout(five, 1).value()).solver_steps;
  ASSERT_LT(own, EstimatePlanningWork(four).solver_steps);
  EXPECT_DOUBLE_EQ(EstimatePlanningWork(five).solver_steps,
                   EstimatePlanningWork(four).solver_steps);
}

TEST(ChooseJobLayout, RefusesAJobThatNamedItsLayoutOrTheWrongWorkers) {
  const ResolvedJobSpec automatic = ResolveJobSpec(AutoSpec(4)).value();
  const ModelProfile profile = ProfileOf(automatic);
  EXPECT_EQ(
      ChooseJobLayout(automatic, "job", 1, profile, testing::TestCluster(3, 1e9, 1e-4), "analytic")
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  const ResolvedJobSpec named = ResolveDataParallelLayout(automatic, 2).value();
  EXPECT_EQ(
      ChooseJobLayout(named, "job", 1, profile, testing::TestCluster(4, 1e9, 1e-4), "analytic")
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain
