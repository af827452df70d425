#include "tests/parallel_cluster_testing.h"

#include <algorithm>

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

void ExpectMatchesTrainLocal(LocalCluster* cluster, const v1::JobSpec& spec, const Reference& ref) {
  ASSERT_NE(cluster, nullptr);
  auto stub = ConnectCoordinator(cluster->grpc_address(), "", cluster->user_token());
  const std::string id = SubmitJob(*stub, spec);
  const v1::Job job = AwaitJob(*stub, id, absl::Minutes(5), Ended);
  // SUCCEEDED also says the replicas' weight digests agreed.
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  const v1::ParallelismSpec& p = spec.parallelism();
  EXPECT_EQ(job.worker_ids_size(), std::max(1, p.data()) * p.stages() * std::max(1, p.tensor()));
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
  ExpectWeightsClose(weights, ref.weights, spec.model().d_model(), spec.training().lr(),
                     static_cast<int>(spec.training().steps()), "weights",
                     p.tensor() > 1 ? kTensorParallelWeightsRelative : kDataParallelRelative);
}

}  // namespace testing
}  // namespace pipetrain
