// Elastic jobs across processes (DESIGN.md §11, the Elastic issue): a job
// with checkpoints that loses workers re-plans on the ones left, resumes
// from its last complete checkpoint, and ends with exactly the per-step
// losses and final weights of an uninterrupted single-process run.
//
// The kills are real (SIGKILL of a worker process at a step drawn from a
// seeded generator, printed so a failure can be replayed); the comparison
// is bitwise.
#include <signal.h>

#include <cmath>
#include <cstdlib>
#include <random>

#include "absl/strings/match.h"
#include "cli/coordinator_client.h"
#include "common/safetensors.h"
#include "coordinator/jobs/job_spec.h"
#include "gtest/gtest.h"
#include "tests/cluster_testing.h"
#include "worker/data/corpus.h"
#include "worker/train/local_trainer.h"

namespace pipetrain {
namespace {

constexpr int kSteps = 40;

v1::JobSpec ElasticSpec(int stages, const std::string& solver, const std::string& weights) {
  v1::JobSpec spec;
  spec.set_name("elastic");
  spec.mutable_model()->set_n_layer(2);
  spec.mutable_model()->set_n_head(2);
  spec.mutable_model()->set_d_model(32);
  auto* t = spec.mutable_training();
  t->set_seq_len(16);
  t->set_batch_size(8);
  t->set_micro_batches(4);
  t->set_steps(kSteps);
  t->set_lr(1e-3f);
  t->set_seed(11);
  spec.mutable_data()->set_synthetic_bytes(100000);
  spec.mutable_parallelism()->set_stages(stages);
  spec.mutable_parallelism()->set_solver(solver);
  spec.mutable_output()->set_weights_path(weights);
  spec.mutable_checkpoint()->set_interval_steps(5);
  return spec;
}

struct Reference {
  std::vector<float> losses;
  std::map<std::string, std::vector<float>> weights;
};

const Reference& TrainLocally() {
  static const Reference* ref = [] {
    ResolvedJobSpec job = ResolveJobSpec(ElasticSpec(1, "uniform", "")).value();
    const CorpusSpec corpus{"", job.data_format, job.train.model.vocab_size, job.synthetic_bytes,
                            job.train.seed};
    Dataset data =
        Dataset::Create(LoadCorpus(corpus).value(), job.train.seq_len, job.val_fraction).value();
    auto trainer = LocalTrainer::Create(job.train, &data).value();
    auto* r = new Reference;
    for (int i = 0; i < job.train.steps; ++i) r->losses.push_back(trainer->Step().value().loss);
    for (Parameter* p : trainer->model().parameters()) r->weights[p->name] = p->value.ToVector();
    return r;
  }();
  return *ref;
}

// The local process index behind worker `id` (its node name "local-<i>").
int ProcessOf(v1::Coordinator::Stub& stub, const std::string& id) {
  v1::ListWorkersResponse workers;
  if (!stub.ListWorkers(WithDeadline(absl::Seconds(5)).get(), {}, &workers).ok()) return -1;
  for (const v1::Worker& w : workers.workers()) {
    if (w.id() == id && absl::StartsWith(w.node_name(), "local-")) {
      return std::stoi(w.node_name().substr(6));
    }
  }
  return -1;
}

void ExpectEqualsTrainLocal(const v1::Job& job) {
  const Reference& ref = TrainLocally();
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason();
  ASSERT_EQ(job.progress().loss_history_size(), kSteps);
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_EQ(job.progress().loss_history(i), ref.losses[i]) << "step " << i << " (bitwise)";
  }
  auto file = ReadSafetensors(job.weights_path());
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->tensors.size(), ref.weights.size());
  for (const auto& [name, values] : ref.weights) {
    const Tensor* t = file->Find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->ToVector(), values) << name << " (bitwise)";
  }
}

class ElasticClusterTest : public ::testing::Test {
 protected:
  void Start(const std::string& subdir, int workers) {
    cluster_ = testing::StartTestCluster(subdir, workers,
                                         {"--lease-seconds=2", "--heartbeat-seconds=0.2"});
    ASSERT_NE(cluster_, nullptr);
    stub_ = ConnectCoordinator(cluster_->grpc_address(), "", cluster_->user_token());
  }
  // Waits for step >= `step` on the job's current plan, then SIGKILLs the
  // process of its stage `stage`; returns that worker's id.
  std::string KillAtStep(const std::string& id, int64_t step, int stage) {
    v1::Job job = testing::AwaitJob(*stub_, id, absl::Seconds(120), [&](const v1::Job& j) {
      return testing::Ended(j) || (j.state() == v1::RUNNING && j.progress().step() >= step);
    });
    EXPECT_EQ(job.state(), v1::RUNNING) << job.reason();
    if (job.state() != v1::RUNNING) return "";
    const std::string victim = job.worker_ids(std::min(stage, job.worker_ids_size() - 1));
    const int process = ProcessOf(*stub_, victim);
    EXPECT_GE(process, 0) << victim;
    if (process < 0) return "";
    std::fprintf(stderr, "killing %s (stage %d) at step %lld\n", victim.c_str(), stage,
                 static_cast<long long>(job.progress().step()));
    cluster_->worker(process).Signal(SIGKILL);
    return victim;
  }
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

TEST_F(ElasticClusterTest, WorkerKilledAtRandomStep_EndsOnThreeWorkersEqualToTrainLocal) {
  Start("kill1", 4);
  std::mt19937 random(20261126);
  const int kill_step = std::uniform_int_distribution<int>(10, 30)(random);
  const int stage = std::uniform_int_distribution<int>(0, 3)(random);
  std::fprintf(stderr, "kill at step %d, stage %d\n", kill_step, stage);
  const std::string id = testing::SubmitJob(*stub_, ElasticSpec(4, "uniform", "kill1.safetensors"));
  const std::string victim = KillAtStep(id, kill_step, stage);
  ASSERT_FALSE(victim.empty());
  const v1::Job job = testing::AwaitJob(*stub_, id, absl::Seconds(180), testing::Ended);
  ExpectEqualsTrainLocal(job);
  EXPECT_EQ(job.worker_ids_size(), 3);
  EXPECT_EQ(job.progress().recoveries(), 1);
  ASSERT_EQ(job.plan_history_size(), 2);
  EXPECT_EQ(job.plan_history(1).version(), 2);
  EXPECT_TRUE(absl::StrContains(job.plan_history(1).reason(), victim))
      << job.plan_history(1).reason();
  EXPECT_EQ(job.plan_history(1).start_step() % 5, 0);
  EXPECT_GT(job.plan_history(1).start_step(), 0);
  EXPECT_GE(job.progress().steps_redone(), 0);
}

}  // namespace
}  // namespace pipetrain
