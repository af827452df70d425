#include "tests/parallel_cluster_testing.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cli/coordinator_client.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"
#include "tests/cluster_testing.h"
#include "worker/data/corpus.h"
#include "worker/runtime/data_parallel_testing.h"
#include "worker/train/local_trainer.h"

namespace pipetrain {
namespace testing {

v1::JobSpec ParallelTestSpec(const ParallelTestJob& job) {
  v1::JobSpec spec;
  spec.set_name(job.name);
  spec.mutable_model()->set_n_layer(2);
  spec.mutable_model()->set_n_head(job.heads);
  spec.mutable_model()->set_d_model(32);
  auto* t = spec.mutable_training();
  t->set_seq_len(16);
  t->set_batch_size(job.batch);
  t->set_micro_batches(job.micro_batches);
  t->set_steps(kParallelTestSteps);
  t->set_lr(1e-3f);
  t->set_seed(job.seed);
  t->set_grad_clip(0.05f);
  t->set_lr_schedule("cosine");
  t->set_warmup_steps(3);
  t->set_min_lr(1e-4f);
  t->set_eval_interval(kParallelTestSteps);
  t->set_eval_windows(7);
  spec.mutable_data()->set_synthetic_bytes(100000);
  spec.mutable_parallelism()->set_stages(job.stages);
  spec.mutable_parallelism()->set_solver("uniform");
  spec.mutable_parallelism()->set_schedule(job.schedule);
  spec.mutable_output()->set_weights_path(job.weights_path);
  return spec;
}

LocalCluster* SharedClusterTest::cluster_ = nullptr;

void SharedClusterTest::StartSharedCluster(const std::string& name, int workers) {
  cluster_ = StartTestCluster(name, workers).release();
}

void SharedClusterTest::TearDownTestSuite() {
  delete cluster_;
  cluster_ = nullptr;
}

Reference TrainLocally(const v1::JobSpec& spec) {
  ResolvedJobSpec job = ResolveJobSpec(spec).value();
  const CorpusSpec corpus{"", job.data_format, job.train.model.vocab_size, job.synthetic_bytes,
                          job.train.seed};
  Dataset data =
      Dataset::Create(LoadCorpus(corpus).value(), job.train.seq_len, job.val_fraction).value();
  auto trainer = LocalTrainer::Create(job.train, &data).value();
  Reference ref;
  for (int i = 0; i < job.train.steps; ++i) ref.losses.push_back(trainer->Step().value().loss);
  ref.val_loss = trainer->Evaluate().value();
  for (Parameter* p : trainer->model().parameters()) ref.weights[p->name] = p->value.ToVector();
  return ref;
}

void ExpectMatchesTrainLocal(LocalCluster* cluster, const v1::JobSpec& spec, const Reference& ref,
                             v1::Job* ended) {
  ASSERT_NE(cluster, nullptr);
  auto stub = ConnectCoordinator(cluster->grpc_address(), "", cluster->user_token());
  const std::string id = SubmitJob(*stub, spec);
  const v1::Job job = AwaitJob(*stub, id, absl::Minutes(5), Ended);
  if (ended != nullptr) *ended = job;
  // SUCCEEDED also says the replicas' weight digests agreed.
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  const v1::ParallelismSpec& p = spec.parallelism();
  EXPECT_EQ(job.worker_ids_size(),
            p.has_data() && p.data() == 0
                ? p.workers()
                : std::max(1, p.data()) * p.stages() * std::max(1, p.tensor()));
  const std::vector<float> losses(job.progress().loss_history().begin(),
                                  job.progress().loss_history().end());
  ExpectLossesClose(losses, ref.losses, "losses");
  EXPECT_EQ(job.progress().val_step(), spec.training().steps());
  ExpectLossesClose({job.progress().val_loss()}, {ref.val_loss}, "validation loss");
  auto file = ReadSafetensors(job.weights_path());
  ASSERT_TRUE(file.ok()) << file.status();
  std::map<std::string, std::vector<float>> weights;
  for (const auto& [name, values] : ref.weights) {
    const Tensor* t = file->Find(name);
    if (t != nullptr) weights[name] = t->ToVector();
  }
  EXPECT_EQ(file->tensors.size(), ref.weights.size());
  ExpectWeightsClose(weights, ref.weights, spec.model().d_model(), "weights",
                     p.tensor() > 1 ? kTensorParallelWeightsRelative : kDataParallelRelative);
}

void ExpectEqualsTrainLocal(const v1::Job& ended, const Reference& reference) {
  SCOPED_TRACE(ended.spec().name() + " (" + ended.id() + ")");
  ASSERT_EQ(ended.state(), v1::JOB_STATE_SUCCEEDED) << ended.reason();
  const int steps = static_cast<int>(reference.losses.size());
  ASSERT_EQ(ended.progress().loss_history_size(), steps);
  for (int i = 0; i < steps; ++i) {
    EXPECT_EQ(ended.progress().loss_history(i), reference.losses[i])
        << "step " << i << " (bitwise)";
  }
  if (ended.spec().training().eval_interval() > 0) {
    EXPECT_EQ(ended.progress().val_step(), ended.spec().training().steps());
    EXPECT_EQ(ended.progress().val_loss(), reference.val_loss) << "validation loss (bitwise)";
  }
  auto file = ReadSafetensors(ended.weights_path());
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->tensors.size(), reference.weights.size());
  for (const auto& [name, values] : reference.weights) {
    const Tensor* t = file->Find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->ToVector(), values) << name << " (bitwise)";
  }
}

std::string LayoutWords(int replicas, int stages) {
  return absl::StrCat(replicas, replicas == 1 ? " replica x " : " replicas x ", stages,
                      stages == 1 ? " stage" : " stages");
}

}  // namespace testing
}  // namespace pipetrain
