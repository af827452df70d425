// Elastic jobs across processes (DESIGN.md §11, the Elastic issue): a job
// with checkpoints that loses workers re-plans on the ones left, resumes
// from its last complete checkpoint, and ends with exactly the per-step
// losses and final weights of an uninterrupted single-process run.
//
// The kills are real (SIGKILL of a worker process at a step drawn from a
// seeded generator, printed so a failure can be replayed); the comparison
// is bitwise.
#include <signal.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cli/coordinator_client.h"
#include "common/coordinator_endpoints.h"
#include "common/safetensors.h"
#include "coordinator/store/etcd_testing.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "spec/job_spec.h"
#include "tests/cluster_testing.h"
#include "tests/parallel_cluster_testing.h"
#include "worker/checkpoint/unit_checkpoint.h"
#include "worker/data/corpus.h"
#include "worker/model/gpt_config.h"
#include "worker/model/weights_io.h"
#include "worker/runtime/data_parallel_testing.h"
#include "worker/train/local_trainer.h"

namespace pipetrain {
namespace {

constexpr int kSteps = 40;

v1::JobSpec ElasticSpec(int stages, const std::string& solver, const std::string& weights) {
  v1::JobSpec spec;
  spec.set_name("elastic");
  // Large enough that a step takes tens of milliseconds here, so a kill
  // lands near the step drawn.
  spec.mutable_model()->set_n_layer(2);
  spec.mutable_model()->set_n_head(4);
  spec.mutable_model()->set_d_model(128);
  auto* t = spec.mutable_training();
  t->set_seq_len(64);
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

using testing::Reference;

// train-local's run of ElasticSpec with `steps` steps (computed once each);
// no val_loss: ElasticSpec asks for no validation.
const Reference& TrainLocally(int64_t steps = kSteps) {
  static std::map<int64_t, Reference>* cache = new std::map<int64_t, Reference>;
  auto found = cache->find(steps);
  if (found != cache->end()) return found->second;
  v1::JobSpec spec = ElasticSpec(1, "uniform", "");
  spec.mutable_training()->set_steps(steps);
  ResolvedJobSpec job = ResolveJobSpec(spec).value();
  const CorpusSpec corpus{"", job.data_format, job.train.model.vocab_size, job.synthetic_bytes,
                          job.train.seed};
  Dataset data =
      Dataset::Create(LoadCorpus(corpus).value(), job.train.seq_len, job.val_fraction).value();
  auto trainer = LocalTrainer::Create(job.train, &data).value();
  Reference& ref = (*cache)[steps];  // in the cache, not a copy of a leaked one
  for (int i = 0; i < job.train.steps; ++i) ref.losses.push_back(trainer->Step().value().loss);
  for (Parameter* p : trainer->model().parameters()) ref.weights[p->name] = p->value.ToVector();
  return ref;
}

// train-local's per-step losses for `spec`, started from the Hugging Face
// weights at `weights_path` with fresh AdamW state (spec.init.from).
std::vector<float> LocalLossesFrom(const v1::JobSpec& spec, const std::string& weights_path) {
  ResolvedJobSpec resolved = ResolveJobSpec(spec).value();
  const CorpusSpec corpus{"", resolved.data_format, resolved.train.model.vocab_size,
                          resolved.synthetic_bytes, resolved.train.seed};
  Dataset data =
      Dataset::Create(LoadCorpus(corpus).value(), resolved.train.seq_len, resolved.val_fraction)
          .value();
  auto trainer = LocalTrainer::Create(resolved.train, &data).value();
  std::vector<float> losses;
  absl::Status loaded = LoadWeights(weights_path, trainer->model().parameters());
  EXPECT_TRUE(loaded.ok()) << loaded;
  if (!loaded.ok()) return losses;
  for (int64_t i = 0; i < resolved.train.steps; ++i) {
    losses.push_back(trainer->Step().value().loss);
  }
  return losses;
}

// As testing::ExpectEqualsTrainLocal, within data_parallel_testing.h's tolerances:
// for jobs whose replicas sum gradients in another order.
void ExpectCloseToTrainLocal(const v1::Job& job) {
  const Reference& ref = TrainLocally();
  testing::ExpectLossesClose(std::vector<float>(job.progress().loss_history().begin(),
                                                job.progress().loss_history().end()),
                             ref.losses, "losses");
  auto file = ReadSafetensors(job.weights_path());
  ASSERT_TRUE(file.ok()) << file.status();
  std::map<std::string, std::vector<float>> weights;
  for (const NamedTensor& t : file->tensors) weights[t.name] = t.tensor.ToVector();
  testing::ExpectWeightsClose(weights, ref.weights, job.spec().model().d_model(), "weights");
}

// `job`'s final weights are bitwise `reference`'s, tensor by tensor.
void ExpectSameWeights(const v1::Job& job, const v1::Job& reference) {
  auto want = ReadSafetensors(reference.weights_path());
  auto got = ReadSafetensors(job.weights_path());
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->tensors.size(), want->tensors.size());
  for (const NamedTensor& t : want->tensors) {
    const Tensor* mine = got->Find(t.name);
    ASSERT_NE(mine, nullptr) << t.name;
    EXPECT_EQ(mine->ToVector(), t.tensor.ToVector()) << t.name << " (bitwise)";
  }
}

class ElasticClusterTest : public ::testing::Test {
 protected:
  void Start(const std::string& subdir, int workers, std::vector<std::string> coordinator_args = {},
             std::vector<std::string> worker_args = {}) {
    // Default heartbeats and lease (1 s, 5 s): a killed worker is known gone
    // when its assignment stream closes, not when its lease ends.
    cluster_ = testing::StartTestCluster(subdir, workers, std::move(coordinator_args),
                                         std::move(worker_args));
    ASSERT_NE(cluster_, nullptr);
    stub_ = ConnectCoordinator(cluster_->grpc_address(), "", cluster_->user_token());
  }
  // Waits for step >= `step` on the job's current plan, then SIGKILLs the
  // process of its stage `stage`; returns that worker's id.
  std::string KillAtStep(const std::string& id, int64_t step, int stage) {
    v1::Job job = testing::AwaitJob(*stub_, id, absl::Seconds(120), [&](const v1::Job& j) {
      return testing::Ended(j) ||
             (j.state() == v1::JOB_STATE_RUNNING && j.progress().step() >= step);
    });
    EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
    if (job.state() != v1::JOB_STATE_RUNNING) return "";
    const std::string victim = job.worker_ids(std::min(stage, job.worker_ids_size() - 1));
    const int process = testing::ProcessOf(*stub_, victim);
    EXPECT_GE(process, 0) << victim;
    if (process < 0) return "";
    std::fprintf(stderr, "killing %s (stage %d) at step %lld\n", victim.c_str(), stage,
                 static_cast<long long>(job.progress().step()));
    cluster_->worker(process).Signal(SIGKILL);
    return victim;
  }
  // The job's last plan went on from a checkpoint (every 5 steps), not
  // from step 0: training is deterministic, so a recovery that ignored the
  // checkpoint and started over would still end as train-local does.
  static void ExpectResumedFromACheckpoint(const v1::Job& job) {
    ASSERT_GE(job.plan_history_size(), 2);
    const v1::PlanVersion& last = job.plan_history(job.plan_history_size() - 1);
    EXPECT_GT(last.start_step(), 0) << last.reason();
    EXPECT_EQ(last.start_step() % 5, 0) << last.reason();
    EXPECT_TRUE(absl::StrContains(last.reason(), "resumed from checkpoint step")) << last.reason();
  }
  // Runs the job to its end and checks it against train-local.
  v1::Job Finish(const std::string& id) {
    const v1::Job job = testing::AwaitJob(*stub_, id, absl::Seconds(180), testing::Ended);
    testing::ExpectEqualsTrainLocal(job, TrainLocally(job.spec().training().steps()));
    return job;
  }
  // Kills job `id`'s worker of `stage` (KillAtStep) at step 12, waits for
  // the end, and expects one recovery onto a plan of 2 workers from a
  // checkpoint, and bitwise `reference`'s losses and final weights.
  v1::Job KillOnceAndExpectBitwise(const std::string& id, int stage, const v1::Job& reference) {
    EXPECT_FALSE(KillAtStep(id, 12, stage).empty());
    const v1::Job job = testing::AwaitJob(*stub_, id, absl::Seconds(180), testing::Ended);
    EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
    EXPECT_EQ(job.progress().recoveries(), 1);
    EXPECT_EQ(job.plan_history_size(), 2);
    if (job.plan_history_size() == 2) {
      EXPECT_EQ(job.plan_history(1).worker_ids_size(), 2);
      EXPECT_GT(job.plan_history(1).start_step(), 0);
    }
    EXPECT_EQ(std::vector<float>(job.progress().loss_history().begin(),
                                 job.progress().loss_history().end()),
              std::vector<float>(reference.progress().loss_history().begin(),
                                 reference.progress().loss_history().end()));
    ExpectSameWeights(job, reference);
    return job;
  }
  std::string CheckpointFile(const std::string& subdir, const std::string& id, int step, int unit) {
    return absl::StrFormat("%s/%s/checkpoints/%s/step-%08d/unit-%04d.safetensors",
                           std::getenv("TEST_TMPDIR"), subdir, id, step, unit);
  }
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<v1::CoordinatorService::Stub> stub_;
};

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

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
  testing::ExpectEqualsTrainLocal(job, TrainLocally(job.spec().training().steps()));
  EXPECT_EQ(job.worker_ids_size(), 3);
  EXPECT_EQ(job.progress().recoveries(), 1);
  ASSERT_EQ(job.plan_history_size(), 2);
  EXPECT_EQ(job.plan_history(1).version(), 2);
  EXPECT_TRUE(absl::StrContains(job.plan_history(1).reason(), victim))
      << job.plan_history(1).reason();
  EXPECT_EQ(job.plan_history(1).start_step() % 5, 0);
  EXPECT_GT(job.plan_history(1).start_step(), 0);
  // The job had reached kill_step when the worker died and resumed from
  // start_step: what lay between was run again.
  EXPECT_GE(job.progress().steps_redone(), kill_step - job.plan_history(1).start_step());
}

// The file at `path`, or "" when it cannot be read.
std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Polls `done` (the file system, which has nothing to wait on) until it is
// true or `timeout` has passed; returns its last value.
bool AwaitTrue(absl::Duration timeout, const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

// A worker killed while a checkpoint is written: every other stage
// completed checkpoint kHeldStep, the victim never reported its part, and
// the job resumes from an earlier checkpoint and ends as train-local. The
// order is the same in every run: the victim's write of kHeldStep is held
// (--test-hold-checkpoint, worker/checkpoint/checkpoint_hold.h) while the
// other stages write theirs, and it is killed once their files are there.
TEST_F(ElasticClusterTest, KilledWhileACheckpointIsWritten_PartialOneIgnored) {
  constexpr int kHeldStep = 10;
  constexpr int kHeldUnit = 5;  // the head, on the last stage
  const std::string marker = absl::StrCat(std::getenv("TEST_TMPDIR"), "/partial.held");
  Start("partial", 4, {},
        {absl::StrCat("--test-hold-checkpoint=", kHeldStep, ":", kHeldUnit, ":", marker)});
  const v1::JobSpec spec = ElasticSpec(4, "uniform", "partial.safetensors");
  const int units = NumUnits(ResolveJobSpec(spec).value().train.model);
  const std::string id = testing::SubmitJob(*stub_, spec);
  // The holder names itself and its stage's units in the marker.
  std::string held;
  ASSERT_TRUE(AwaitTrue(absl::Seconds(120), [&] { return !(held = ReadAll(marker)).empty(); }))
      << "no worker began checkpoint " << kHeldStep;
  const std::vector<std::string> lines = absl::StrSplit(held, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << held;
  std::set<int> victim_units;
  for (absl::string_view u : absl::StrSplit(lines[1], ' '))
    victim_units.insert(std::stoi(std::string(u)));
  ASSERT_EQ(victim_units.count(kHeldUnit), 1u) << held;
  int process = -1;
  for (int i = 0; i < cluster_->num_workers(); ++i) {
    if (std::to_string(cluster_->worker(i).pid()) == lines[0]) process = i;
  }
  ASSERT_GE(process, 0) << "no worker has pid " << lines[0];
  // Every other stage's files of that step, written while the victim holds.
  for (int unit = 0; unit < units; ++unit) {
    if (victim_units.count(unit) > 0) continue;
    const std::string file = CheckpointFile("partial", id, kHeldStep, unit);
    ASSERT_TRUE(AwaitTrue(absl::Seconds(60), [&] { return Exists(file); }))
        << "checkpoint " << kHeldStep << " never got " << file;
  }
  for (int unit : victim_units) {
    EXPECT_FALSE(Exists(CheckpointFile("partial", id, kHeldStep, unit))) << "unit " << unit;
  }
  cluster_->worker(process).Signal(SIGKILL);
  std::fprintf(stderr, "killed worker process %d while checkpoint %d was written\n", process,
               kHeldStep);
  const v1::Job job = Finish(id);
  EXPECT_EQ(job.progress().recoveries(), 1);
  ASSERT_GE(job.plan_history_size(), 2);
  EXPECT_LT(job.plan_history(1).start_step(), kHeldStep)
      << "resumed from a checkpoint the victim never finished";
}

TEST_F(ElasticClusterTest, TwoKillsInARow_EndsOnTwoWorkers) {
  Start("twice", 4);
  const std::string id = testing::SubmitJob(*stub_, ElasticSpec(4, "uniform", "twice.safetensors"));
  ASSERT_FALSE(KillAtStep(id, 12, 1).empty());
  // The second as soon as the first recovery runs.
  const v1::Job recovered = testing::AwaitJob(*stub_, id, absl::Seconds(60), [](const v1::Job& j) {
    return testing::Ended(j) || (j.state() == v1::JOB_STATE_RUNNING && j.plan_version() == 2);
  });
  ASSERT_EQ(recovered.state(), v1::JOB_STATE_RUNNING) << recovered.reason();
  ASSERT_FALSE(KillAtStep(id, recovered.progress().step() + 2, 0).empty());
  const v1::Job job = Finish(id);
  EXPECT_EQ(job.worker_ids_size(), 2);
  EXPECT_EQ(job.progress().recoveries(), 2);
  EXPECT_EQ(job.plan_history_size(), 3);
}

// Data parallelism (2 replicas of 2 stages) and a lost replica worker: the
// job re-plans with whole replicas, 2 of 1 stage on the 3 workers left,
// resumes from replica 0's checkpoint and ends as train-local on the same
// global batch, to 1e-5 (data_parallel_testing.h); SUCCEEDED also says the
// replicas' final weights agreed bitwise (their digests).
TEST_F(ElasticClusterTest, DataParallelReplicaWorkerKilled_RecoversWithWholeReplicas) {
  Start("dp", 4);
  v1::JobSpec spec = ElasticSpec(2, "uniform", "dp.safetensors");
  spec.mutable_parallelism()->set_data(2);
  const std::string id = testing::SubmitJob(*stub_, spec);
  ASSERT_FALSE(KillAtStep(id, 12, 3).empty());  // replica 1's stage 1
  const v1::Job job = testing::AwaitJob(*stub_, id, absl::Seconds(180), testing::Ended);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  EXPECT_EQ(job.worker_ids_size(), 2);
  EXPECT_EQ(job.progress().recoveries(), 1);
  ASSERT_EQ(job.plan_history_size(), 2);
  EXPECT_EQ(job.plan_history(1).worker_ids_size(), 2);
  ExpectResumedFromACheckpoint(job);
  ExpectCloseToTrainLocal(job);
}

// Compressed data-parallel gradients (PowerSGD with error feedback, 2
// replicas of 1 stage on 3 workers): replica 1's worker is killed, the
// spare takes its place, and every worker restores its replica's residuals
// and PowerSGD's warm starts from the checkpoint, which replica 0 wrote
// with both replicas' (worker/checkpoint/unit_checkpoint.h). So the job
// ends bitwise as an uninterrupted one: per-step losses and final weights.
TEST_F(ElasticClusterTest, CompressedReplicaWorkerKilled_ErrorFeedbackRestoredBitwise) {
  Start("dp-compressed", 3);
  auto compressed = [](const std::string& weights) {
    v1::JobSpec spec = ElasticSpec(1, "uniform", weights);
    spec.mutable_parallelism()->set_data(2);
    spec.mutable_compression()->mutable_data_parallel()->set_codec("powersgd:rank=4");
    spec.mutable_compression()->mutable_data_parallel()->add_stages(0);
    return spec;
  };
  const v1::Job reference =
      testing::AwaitJob(*stub_, testing::SubmitJob(*stub_, compressed("dpc-whole.safetensors")),
                        absl::Seconds(180), testing::Ended);
  ASSERT_EQ(reference.state(), v1::JOB_STATE_SUCCEEDED) << reference.reason();

  // Replica 1's worker.
  KillOnceAndExpectBitwise(testing::SubmitJob(*stub_, compressed("dpc.safetensors")), 1, reference);
}

// PowerSGD on the pipeline's links both ways (2 stages on 3 workers): the
// worker of stage 1 is killed, the spare takes its place, and each stage
// restores its links' warm starts from its first unit's file
// (worker/checkpoint/unit_checkpoint.h). So the job ends bitwise as an
// uninterrupted one; without them the links would restart from PowerSGD's
// fixed Q and the losses after the checkpoint would differ.
TEST_F(ElasticClusterTest, CompressedLinksWorkerKilled_WarmStartsRestoredBitwise) {
  Start("links", 3);
  auto compressed = [](const std::string& weights) {
    v1::JobSpec spec = ElasticSpec(2, "uniform", weights);
    spec.mutable_compression()->set_forward("powersgd:rank=4");
    spec.mutable_compression()->set_backward("powersgd:rank=4");
    return spec;
  };
  const v1::Job reference =
      testing::AwaitJob(*stub_, testing::SubmitJob(*stub_, compressed("links-whole.safetensors")),
                        absl::Seconds(180), testing::Ended);
  ASSERT_EQ(reference.state(), v1::JOB_STATE_SUCCEEDED) << reference.reason();
  KillOnceAndExpectBitwise(testing::SubmitJob(*stub_, compressed("links.safetensors")), 1,
                           reference);
}

// spec.parallelism.data 0 (auto) on 4 workers: whatever layout the job
// chose, a killed worker leaves 3, and with 4 micro-batches a job naming
// its replicas could only wait for a fourth (or drop a whole replica);
// this one chooses again, goes on as one 3-stage pipeline from its last
// checkpoint and ends as train-local does.
TEST_F(ElasticClusterTest, AutoLayoutWorkerKilled_LayoutChosenAgainOnTheRest) {
  Start("auto", 4);
  v1::JobSpec spec = ElasticSpec(0, "uniform", "auto.safetensors");
  spec.mutable_parallelism()->set_data(0);
  spec.mutable_parallelism()->set_workers(4);
  const std::string id = testing::SubmitJob(*stub_, spec);
  ASSERT_FALSE(KillAtStep(id, 12, 3).empty());
  const v1::Job job = testing::AwaitJob(*stub_, id, absl::Seconds(180), testing::Ended);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  EXPECT_EQ(job.worker_ids_size(), 3);
  EXPECT_EQ(job.spec().parallelism().data(), 1);
  EXPECT_EQ(job.spec().parallelism().stages(), 3);
  ASSERT_EQ(job.plan_history_size(), 2);
  EXPECT_TRUE(absl::StrContains(job.plan_history(0).reason(), "chosen by spec.parallelism.data 0"))
      << job.plan_history(0).reason();
  EXPECT_TRUE(absl::StrContains(job.plan_history(1).reason(),
                                "1 replica x 3 stages chosen by spec.parallelism.data 0 (auto)"))
      << job.plan_history(1).reason();
  ExpectResumedFromACheckpoint(job);
  ExpectCloseToTrainLocal(job);
}

// Tensor parallelism (T = 2, 2 stages): the stages' rank 0 write the
// checkpoints their ranks gathered (unsplit tensors and moments); one rank
// of stage 1 is killed; the job re-plans on whole tensor groups (2 of the 3
// left: 1 stage of 2 ranks), and each rank cuts its shards and moments from
// the checkpoint. Gathering and cutting only copy, and a 2-rank stage sums
// the same partial products however the units are staged, so the job must
// end bitwise as an uninterrupted 2-rank job; that one equals train-local's
// losses within 1e-5 (its weights are held to train-local's over 10 steps
// by tensor_parallel_cluster_test; over 40, AdamW's drift is larger).
TEST_F(ElasticClusterTest, TensorRankKilled_ResumesFromGatheredShardsBitwise) {
  Start("tp", 4);
  v1::JobSpec whole = ElasticSpec(1, "uniform", "tp-whole.safetensors");
  whole.mutable_parallelism()->set_tensor(2);
  const v1::Job reference = testing::AwaitJob(*stub_, testing::SubmitJob(*stub_, whole),
                                              absl::Seconds(180), testing::Ended);
  ASSERT_EQ(reference.state(), v1::JOB_STATE_SUCCEEDED) << reference.reason();
  const std::vector<float> losses(reference.progress().loss_history().begin(),
                                  reference.progress().loss_history().end());
  testing::ExpectLossesClose(losses, TrainLocally().losses, "uninterrupted losses");

  v1::JobSpec spec = ElasticSpec(2, "uniform", "tp.safetensors");
  spec.mutable_parallelism()->set_tensor(2);
  // Stage 1's rank 1.
  const v1::Job job = KillOnceAndExpectBitwise(testing::SubmitJob(*stub_, spec), 3, reference);

  // spec.init.from with tensor parallelism: the final weights (Hugging Face
  // names, unsplit) cut into 2 ranks' shards, fresh AdamW state; as
  // train-local started from that file, within 1e-5.
  v1::JobSpec from = ElasticSpec(1, "uniform", "");  // 3 workers are left
  from.mutable_parallelism()->set_tensor(2);
  from.mutable_init()->set_from("tp.safetensors");
  const v1::Job started = testing::AwaitJob(*stub_, testing::SubmitJob(*stub_, from),
                                            absl::Seconds(180), testing::Ended);
  ASSERT_EQ(started.state(), v1::JOB_STATE_SUCCEEDED) << started.reason();
  testing::ExpectLossesClose(std::vector<float>(started.progress().loss_history().begin(),
                                                started.progress().loss_history().end()),
                             LocalLossesFrom(from, job.weights_path()), "losses from the weights");

  // The same weights into a vocabulary padded to 258 (as Megatron pads
  // GPT-2's 50257 to 50304 for its tensor ranks): the file's 256 rows,
  // then zero rows; as train-local loading the file into the padded model.
  v1::JobSpec padded = from;
  padded.mutable_model()->set_vocab_size(258);
  const v1::Job padded_run = testing::AwaitJob(*stub_, testing::SubmitJob(*stub_, padded),
                                               absl::Seconds(180), testing::Ended);
  ASSERT_EQ(padded_run.state(), v1::JOB_STATE_SUCCEEDED) << padded_run.reason();
  testing::ExpectLossesClose(std::vector<float>(padded_run.progress().loss_history().begin(),
                                                padded_run.progress().loss_history().end()),
                             LocalLossesFrom(padded, job.weights_path()),
                             "losses from the weights, vocabulary padded");
}

// AccTFM partitions tuned by measurement (tensorPartitions 0) on one stage
// of 2 tensor ranks, with a spare: once a checkpoint holds the stage's
// choice, its rank 1 is killed and the spare takes its place on the same
// layout. Both ranks then run the counts the checkpoint recorded instead
// of measuring again (each worker's log says so, and the spare's never
// mentions a measurement), and the newest checkpoint still records them.
TEST_F(ElasticClusterTest, TunedTensorRankKilled_RecordedPartitionCountsKept) {
  Start("tuned", 3);
  v1::JobSpec spec = ElasticSpec(1, "uniform", "tuned.safetensors");
  spec.mutable_parallelism()->set_tensor(2);
  spec.mutable_parallelism()->set_tensor_partitions(0);  // Alg. 1, then measured
  const std::string id = testing::SubmitJob(*stub_, spec);
  // The choice comes after at most 1 + 3 candidates x 2 steps: the
  // checkpoint of step 10 holds it.
  const v1::Job checkpointed = testing::AwaitJob(*stub_, id, absl::Seconds(120), [](const auto& j) {
    return testing::Ended(j) || j.progress().checkpoint_step() >= 10;
  });
  ASSERT_EQ(checkpointed.state(), v1::JOB_STATE_RUNNING) << checkpointed.reason();
  ASSERT_FALSE(KillAtStep(id, 0, 1).empty());
  const v1::Job job = testing::AwaitJob(*stub_, id, absl::Seconds(180), testing::Ended);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  EXPECT_EQ(job.progress().recoveries(), 1);
  ASSERT_EQ(job.plan_history_size(), 2);
  EXPECT_GE(job.plan_history(1).start_step(), 10);

  const GptConfig model = ResolveJobSpec(spec).value().train.model;
  auto file = ReadSafetensors(CheckpointFile("tuned", id, job.progress().checkpoint_step(), 0));
  ASSERT_TRUE(file.ok()) << file.status();
  const auto record = file->metadata.find("tuned_partitions");
  ASSERT_NE(record, file->metadata.end());
  absl::StatusOr<TunedPartitions> tuned = ParseTunedPartitions(record->second, model);
  ASSERT_TRUE(tuned.ok()) << tuned.status();
  EXPECT_EQ(tuned->tensor_parallel, 2);
  EXPECT_EQ(tuned->samples, 2);
  EXPECT_EQ(tuned->backward_end, NumUnits(model));

  const std::set<std::string> before(job.plan_history(0).worker_ids().begin(),
                                     job.plan_history(0).worker_ids().end());
  for (const std::string& worker : job.plan_history(1).worker_ids()) {
    SCOPED_TRACE(worker);
    const int process = testing::ProcessOf(*stub_, worker);
    ASSERT_GE(process, 0);
    std::ifstream in(cluster_->worker_log(process));
    const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(absl::StrContains(log, "tensor partitions as measured before the checkpoint"));
    if (before.count(worker) == 0) {
      EXPECT_FALSE(absl::StrContains(log, "tensor partitions measured over"));
    }
  }
}

TEST_F(ElasticClusterTest, HeadOwnerKilled_TiedEmbeddingRestored) {
  Start("head", 4);
  const std::string id = testing::SubmitJob(*stub_, ElasticSpec(4, "uniform", "head.safetensors"));
  ASSERT_FALSE(KillAtStep(id, 17, 3).empty());  // stage 3 holds the head and its wte copy
  const v1::Job job = Finish(id);
  EXPECT_EQ(job.progress().recoveries(), 1);
  ExpectResumedFromACheckpoint(job);
}

TEST_F(ElasticClusterTest, BiPartitionPlan_WorkerKilled_ReplannedWithBiPartition) {
  Start("bipart", 4);
  v1::JobSpec spec = ElasticSpec(4, "bipartition", "bipart.safetensors");
  const std::string id = testing::SubmitJob(*stub_, spec);
  ASSERT_FALSE(KillAtStep(id, 14, 1).empty());
  const v1::Job job = Finish(id);
  EXPECT_EQ(job.worker_ids_size(), 3);
  v1::GetPlanRequest request;
  request.set_job_id(id);
  v1::Plan plan;
  ASSERT_TRUE(stub_->GetPlan(WithDeadline(absl::Seconds(5)).get(), request, &plan).ok());
  EXPECT_EQ(plan.solver(), "bipartition");
  EXPECT_EQ(plan.version(), 2);
}

TEST_F(ElasticClusterTest, CorruptLatestCheckpoint_FallsBackToThePreviousOne) {
  // Checkpoint 20 is held (checkpoint_hold.h), so 15 stays the latest
  // complete one while the test corrupts it: one completed meanwhile would
  // be loaded instead, and nothing would fall back.
  constexpr int kHeldStep = 20;
  constexpr int kHeldUnit = 5;  // the head, on the last stage
  const std::string marker = absl::StrCat(std::getenv("TEST_TMPDIR"), "/corrupt.held");
  Start("corrupt", 4, {},
        {absl::StrCat("--test-hold-checkpoint=", kHeldStep, ":", kHeldUnit, ":", marker)});
  const std::string id =
      testing::SubmitJob(*stub_, ElasticSpec(4, "uniform", "corrupt.safetensors"));
  v1::Job job = testing::AwaitJob(*stub_, id, absl::Seconds(120), [](const v1::Job& j) {
    return testing::Ended(j) || j.progress().checkpoint_step() >= 15;
  });
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  ASSERT_EQ(job.progress().checkpoint_step(), 15);
  // Flip a byte in the middle of unit 2's file of the latest checkpoint, then
  // kill a worker: the stage that loads unit 2 finds the checksum wrong.
  const int64_t latest = job.progress().checkpoint_step();
  const std::string path = CheckpointFile("corrupt", id, latest, 2);
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(file.is_open()) << path;
    file.seekg(0, std::ios::end);
    const std::streamoff middle = file.tellg() / 2;
    file.seekg(middle);
    char byte = 0;
    file.read(&byte, 1);
    byte ^= 0x40;
    file.seekp(middle);
    file.write(&byte, 1);
  }
  // The holder of checkpoint 20 is killed (its writer waits for the
  // process's end): the recovery resumes from 15, whose unit 2 is corrupt.
  std::string held;
  ASSERT_TRUE(AwaitTrue(absl::Seconds(120), [&] { return !(held = ReadAll(marker)).empty(); }))
      << "no worker began checkpoint " << kHeldStep;
  const std::vector<std::string> lines = absl::StrSplit(held, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << held;
  int process = -1;
  for (int i = 0; i < cluster_->num_workers(); ++i) {
    if (std::to_string(cluster_->worker(i).pid()) == lines[0]) process = i;
  }
  ASSERT_GE(process, 0) << "no worker has pid " << lines[0];
  cluster_->worker(process).Signal(SIGKILL);
  job = Finish(id);
  // Resumed from an older checkpoint than the corrupt one, and said why.
  bool fell_back = false;
  for (const v1::PlanVersion& v : job.plan_history()) {
    if (absl::StrContains(v.reason(), "could not be loaded")) {
      fell_back = true;
      EXPECT_LT(v.start_step(), latest) << v.reason();
      EXPECT_TRUE(absl::StrContains(v.reason(), "SHA-256")) << v.reason();
    }
  }
  EXPECT_TRUE(fell_back);
}

TEST_F(ElasticClusterTest, CoordinatorKilledAndRestarted_JobsWorkersAndHistoryBack) {
  // Outside the coordinator's --output-dir (the cluster's directory).
  const std::string state = std::string(std::getenv("TEST_TMPDIR")) + "/restart-state";
  Start("restart", 4, {"--state-dir=" + state});
  // A job that ends before the restart, and one that runs through it.
  v1::JobSpec short_spec = ElasticSpec(2, "uniform", "");
  short_spec.mutable_training()->set_steps(3);
  const std::string done_id = testing::SubmitJob(*stub_, short_spec);
  const v1::Job done = testing::AwaitJob(*stub_, done_id, absl::Seconds(60), testing::Ended);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.reason();
  const std::string id =
      testing::SubmitJob(*stub_, ElasticSpec(4, "uniform", "restart.safetensors"));
  const v1::Job before = testing::AwaitJob(*stub_, id, absl::Seconds(120), [](const v1::Job& j) {
    return testing::Ended(j) || (j.state() == v1::JOB_STATE_RUNNING && j.progress().step() >= 17);
  });
  ASSERT_EQ(before.state(), v1::JOB_STATE_RUNNING) << before.reason();
  v1::ListWorkersResponse workers_before;
  ASSERT_TRUE(stub_->ListWorkers(WithDeadline(absl::Seconds(5)).get(), {}, &workers_before).ok());

  ASSERT_TRUE(cluster_->KillAndRestartCoordinator().ok());
  stub_ = ConnectCoordinator(cluster_->grpc_address(), "", cluster_->user_token());
  const v1::Job job = Finish(id);
  EXPECT_EQ(testing::GetJob(*stub_, done_id).progress().loss_history_size(), 3);
  EXPECT_EQ(testing::GetJob(*stub_, done_id).state(), v1::JOB_STATE_SUCCEEDED);
  bool resumed = false;
  for (const v1::PlanVersion& v : job.plan_history()) {
    resumed = resumed || absl::StrContains(v.reason(), "the coordinator restarted");
  }
  EXPECT_TRUE(resumed);
  // A recovery of its own kind (none was counted when Restore ran before
  // the metrics were connected).
  const std::string metrics = testing::ScrapeMetrics(cluster_->http_port());
  EXPECT_TRUE(absl::StrContains(
      metrics, "pipetrain_job_recoveries_total{reason=\"coordinator_restart\"} 1\n"))
      << metrics;
  // The same workers, under the same ids, registered again.
  v1::ListWorkersResponse workers_after;
  ASSERT_TRUE(stub_->ListWorkers(WithDeadline(absl::Seconds(5)).get(), {}, &workers_after).ok());
  ASSERT_EQ(workers_after.workers_size(), workers_before.workers_size());
  for (int i = 0; i < workers_after.workers_size(); ++i) {
    EXPECT_EQ(workers_after.workers(i).id(), workers_before.workers(i).id());
    EXPECT_EQ(workers_after.workers(i).data_address(), workers_before.workers(i).data_address());
    EXPECT_GT(workers_after.workers(i).incarnation(), workers_before.workers(i).incarnation());
  }
}

TEST_F(ElasticClusterTest, TwoWorkersJoinMidRun_JobGrowsToFour) {
  Start("join", 2);
  v1::JobSpec spec = ElasticSpec(2, "uniform", "join.safetensors");
  spec.mutable_training()->set_steps(150);
  spec.mutable_elastic()->set_max_workers(4);
  const std::string id = testing::SubmitJob(*stub_, spec);
  v1::Job job = testing::AwaitJob(*stub_, id, absl::Seconds(60), [](const v1::Job& j) {
    return testing::Ended(j) || j.progress().step() >= 8;
  });
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  ASSERT_TRUE(cluster_->AddWorker().ok());
  ASSERT_TRUE(cluster_->AddWorker().ok());
  job = Finish(id);
  EXPECT_EQ(job.worker_ids_size(), 4);
  EXPECT_EQ(job.progress().recoveries(), 0);
  EXPECT_EQ(job.progress().steps_redone(), 0);
  ASSERT_GE(job.plan_history_size(), 2);
  for (int v = 1; v < job.plan_history_size(); ++v) {
    EXPECT_TRUE(absl::StrContains(job.plan_history(v).reason(), "joined"))
        << job.plan_history(v).reason();
    EXPECT_GT(job.plan_history(v).start_step(), 8);
  }
  EXPECT_EQ(job.plan_history(job.plan_history_size() - 1).worker_ids_size(), 4);
}

TEST_F(ElasticClusterTest, DrainedByUser_ReplannedWithoutItNoStepRedone) {
  Start("drain", 4);
  v1::JobSpec spec = ElasticSpec(4, "uniform", "drain.safetensors");
  spec.mutable_training()->set_steps(100);
  const std::string id = testing::SubmitJob(*stub_, spec);
  v1::Job job = testing::AwaitJob(*stub_, id, absl::Seconds(60), [](const v1::Job& j) {
    return testing::Ended(j) || j.progress().step() >= 10;
  });
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  const std::string victim = job.worker_ids(1);
  v1::DrainWorkerRequest request;
  request.set_worker_id(victim);
  v1::Worker drained;
  ASSERT_TRUE(stub_->DrainWorker(WithDeadline(absl::Seconds(5)).get(), request, &drained).ok());
  job = Finish(id);
  EXPECT_EQ(job.worker_ids_size(), 3);
  for (const std::string& w : job.worker_ids()) EXPECT_NE(w, victim);
  EXPECT_EQ(job.progress().steps_redone(), 0);
  EXPECT_EQ(job.progress().recoveries(), 0);
  ASSERT_EQ(job.plan_history_size(), 2);
  EXPECT_TRUE(absl::StrContains(job.plan_history(1).reason(), victim + " drained"))
      << job.plan_history(1).reason();
  // It gets no job until it registers again.
  v1::JobSpec next = ElasticSpec(4, "uniform", "");
  next.mutable_training()->set_steps(2);
  next.mutable_scheduling()->mutable_queue_timeout()->set_seconds(2);
  const v1::Job waited = testing::AwaitJob(*stub_, testing::SubmitJob(*stub_, next),
                                           absl::Seconds(30), testing::Ended);
  EXPECT_EQ(waited.state(), v1::JOB_STATE_FAILED) << "ran on the drained worker";
  // Failed for want of a fourth worker, not on the drained one.
  EXPECT_TRUE(absl::StrContains(waited.reason(), "not placed within spec.scheduling.queue_timeout"))
      << waited.reason();
  EXPECT_TRUE(absl::StrContains(waited.reason(), "(3 ready; 1 more READY but drained"))
      << waited.reason();
}

TEST_F(ElasticClusterTest, WorkerTerminated_DrainsBeforeLeavingNoStepRedone) {
  Start("sigterm", 4);
  v1::JobSpec spec = ElasticSpec(4, "uniform", "sigterm.safetensors");
  spec.mutable_training()->set_steps(100);
  const std::string id = testing::SubmitJob(*stub_, spec);
  v1::Job job = testing::AwaitJob(*stub_, id, absl::Seconds(60), [](const v1::Job& j) {
    return testing::Ended(j) || j.progress().step() >= 10;
  });
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  const std::string victim = job.worker_ids(2);
  const int process = testing::ProcessOf(*stub_, victim);
  ASSERT_GE(process, 0);
  cluster_->worker(process).Signal(SIGTERM);
  EXPECT_EQ(cluster_->worker(process).Wait(absl::Seconds(60)), std::optional<int>(0));
  job = Finish(id);
  EXPECT_EQ(job.worker_ids_size(), 3);
  EXPECT_EQ(job.progress().steps_redone(), 0);
  EXPECT_EQ(job.progress().recoveries(), 0);
}

TEST_F(ElasticClusterTest, InitFromACheckpointAndFromWeights_GoOnAsTrainLocalWould) {
  Start("init", 2);
  // Job A: 12 steps, checkpoints after 5 and 10, final weights written.
  v1::JobSpec a = ElasticSpec(2, "uniform", "init-a.safetensors");
  a.mutable_training()->set_steps(12);
  const v1::Job job_a = Finish(testing::SubmitJob(*stub_, a));
  ASSERT_EQ(job_a.progress().checkpoint_step(), 10);

  // Job B goes on from A's newest checkpoint (step 10) to step 40: the
  // steps after 10 of an uninterrupted 40-step run.
  v1::JobSpec b = ElasticSpec(2, "uniform", "init-b.safetensors");
  b.mutable_init()->set_from("checkpoints/" + job_a.id());
  const v1::Job job_b =
      testing::AwaitJob(*stub_, testing::SubmitJob(*stub_, b), absl::Seconds(180), testing::Ended);
  ASSERT_EQ(job_b.state(), v1::JOB_STATE_SUCCEEDED) << job_b.reason();
  const Reference& ref = TrainLocally(kSteps);
  ASSERT_EQ(job_b.progress().loss_history_start(), 10);
  ASSERT_EQ(job_b.progress().loss_history_size(), kSteps - 10);
  for (int i = 10; i < kSteps; ++i) {
    EXPECT_EQ(job_b.progress().loss_history(i - 10), ref.losses[i]) << "step " << i;
  }
  auto weights_b = ReadSafetensors(job_b.weights_path());
  ASSERT_TRUE(weights_b.ok()) << weights_b.status();
  for (const auto& [name, values] : ref.weights) {
    const Tensor* tensor = weights_b->Find(name);
    ASSERT_NE(tensor, nullptr) << name;
    EXPECT_EQ(tensor->ToVector(), values) << name;
  }

  // Job C starts from A's final weights (Hugging Face names), with fresh
  // AdamW state from step 0: as train-local started from that file.
  v1::JobSpec c = ElasticSpec(2, "uniform", "");
  c.mutable_init()->set_from("init-a.safetensors");
  const v1::Job job_c =
      testing::AwaitJob(*stub_, testing::SubmitJob(*stub_, c), absl::Seconds(180), testing::Ended);
  ASSERT_EQ(job_c.state(), v1::JOB_STATE_SUCCEEDED) << job_c.reason();
  const std::vector<float> local = LocalLossesFrom(c, job_a.weights_path());
  ASSERT_EQ(job_c.progress().loss_history_size(), kSteps);
  ASSERT_EQ(local.size(), static_cast<size_t>(kSteps));
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_EQ(job_c.progress().loss_history(i), local[i]) << "step " << i;
  }

  // Refused at submit, nothing started: another model's checkpoint, a
  // path outside the output directory, something that is not there.
  v1::JobSpec wider = b;
  wider.mutable_model()->set_d_model(64);
  v1::SubmitJobRequest request;
  *request.mutable_spec() = wider;
  v1::Job refused;
  grpc::Status s = stub_->SubmitJob(WithDeadline(absl::Seconds(10)).get(), request, &refused);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "another model")) << s.error_message();
  for (const char* bad : {"../escape", "no/such/checkpoint"}) {
    request.mutable_spec()->mutable_init()->set_from(bad);
    s = stub_->SubmitJob(WithDeadline(absl::Seconds(10)).get(), request, &refused);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad;
    EXPECT_TRUE(absl::StartsWith(s.error_message(), "spec.init.from")) << s.error_message();
  }
}

// Which of the cluster's coordinators leads: the index in `addresses` of
// the one that answers a call (a follower refuses, naming the leader); -1.
int LeaderIndex(const std::vector<std::string>& addresses, const std::string& token) {
  for (size_t i = 0; i < addresses.size(); ++i) {
    auto stub = ConnectCoordinator(addresses[i], "", token);
    auto context = WithDeadline(absl::Seconds(2));
    v1::ListJobsResponse jobs;
    if (stub->ListJobs(context.get(), {}, &jobs).ok()) return static_cast<int>(i);
  }
  return -1;
}

TEST(HighlyAvailableCoordinatorsTest, LeaderKilled_FollowerTakesOverWithinLeasePlus5sJobFinishes) {
  absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start("ha");
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  constexpr int kLeaseSeconds = 2;
  LocalClusterOptions options;
  options.coordinator_binary = FindSiblingBinary("coordinator", "pipetrain-coordinator").value();
  options.worker_binary = FindSiblingBinary("worker", "pipetrain-worker").value();
  options.workers = 4;
  options.exit_with_parent = true;  // as StartTestCluster's
  // The processes' logs stay with the test's outputs (a failed takeover is
  // diagnosed from them).
  const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  options.dir = std::string(outputs != nullptr ? outputs : std::getenv("TEST_TMPDIR")) + "/ha";
  mkdir(options.dir.c_str(), 0700);
  options.join_token = "ha-join";
  options.user_token = "ha-user";
  options.coordinator_args = {"--output-dir=" + options.dir,
                              "--etcd-endpoints=" + (*etcd)->endpoint(),
                              absl::StrCat("--leader-lease-seconds=", kLeaseSeconds)};
  options.worker_args = {"--checkpoint-root=" + options.dir};
  options.standby_coordinators = 1;
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::vector<std::string> addresses = absl::StrSplit((*cluster)->grpc_address(), ',');
  ASSERT_EQ(addresses.size(), 2u);
  // The stub finds the leader among both.
  auto stub = ConnectCoordinator((*cluster)->grpc_address(), "", options.user_token);
  const std::string id = testing::SubmitJob(*stub, ElasticSpec(4, "uniform", "ha.safetensors"));
  ASSERT_FALSE(id.empty());
  v1::Job job = testing::AwaitJob(*stub, id, absl::Seconds(60), [](const v1::Job& j) {
    return testing::Ended(j) || j.progress().step() >= 12;
  });
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.reason();
  // The follower refuses, naming the leader.
  const int leader = LeaderIndex(addresses, options.user_token);
  ASSERT_GE(leader, 0);
  {
    auto follower = ConnectCoordinator(addresses[1 - leader], "", options.user_token);
    auto context = WithDeadline(absl::Seconds(2));
    v1::ListJobsResponse jobs;
    const grpc::Status refused = follower->ListJobs(context.get(), {}, &jobs);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_TRUE(absl::StrContains(refused.error_message(), addresses[leader]))
        << refused.error_message();
    EXPECT_EQ(LeaderHint(*context), addresses[leader]);
  }
  // On its HTTP port: alive, not ready, scraped (so not "down"), the API
  // refused naming the leader; as leader later, the same port serves it.
  const int follower_http_port =
      leader == 0 ? (*cluster)->standby_http_port(0) : (*cluster)->http_port();
  const httplib::Headers bearer = {{"Authorization", "Bearer " + options.user_token}};
  {
    httplib::Client http("127.0.0.1", follower_http_port);
    auto alive = http.Get("/healthz");
    ASSERT_TRUE(alive) << "no HTTP on the follower's port " << follower_http_port;
    EXPECT_EQ(alive->status, 200);
    auto ready = http.Get("/readyz");
    ASSERT_TRUE(ready);
    EXPECT_EQ(ready->status, 503) << ready->body;
    auto scraped = http.Get("/metrics");
    ASSERT_TRUE(scraped);
    EXPECT_EQ(scraped->status, 200);
    EXPECT_TRUE(absl::StrContains(scraped->body, "pipetrain_build_info{")) << scraped->body;
    auto jobs = http.Get("/v1/jobs", bearer);
    ASSERT_TRUE(jobs);
    EXPECT_EQ(jobs->status, 503) << jobs->body;
    EXPECT_TRUE(absl::StrContains(jobs->body, addresses[leader])) << jobs->body;
  }
  Subprocess& leader_process = leader == 0 ? (*cluster)->coordinator() : (*cluster)->standby(0);
  const absl::Time killed = absl::Now();
  leader_process.Signal(SIGKILL);
  // The other takes over within its lease plus 5 s.
  int new_leader = -1;
  while (absl::Now() - killed < absl::Seconds(kLeaseSeconds + 5) && new_leader < 0) {
    auto other = ConnectCoordinator(addresses[1 - leader], "", options.user_token);
    auto context = WithDeadline(absl::Seconds(1));
    v1::ListJobsResponse jobs;
    if (other->ListJobs(context.get(), {}, &jobs).ok()) new_leader = 1 - leader;
    if (new_leader < 0) absl::SleepFor(absl::Milliseconds(50));  // polls a remote state
  }
  const double takeover = absl::ToDoubleSeconds(absl::Now() - killed);
  std::fprintf(stderr, "takeover after %.2f s (lease %d s)\n", takeover, kLeaseSeconds);
  ASSERT_EQ(new_leader, 1 - leader) << "no takeover within the lease plus 5 s";
  auto survivor = ConnectCoordinator(addresses[new_leader], "", options.user_token);
  {
    // gRPC answers just before the leader's HTTP server has the port.
    httplib::Client http("127.0.0.1", follower_http_port);
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    int status = 0;
    while (status != 200 && absl::Now() < deadline) {
      auto jobs = http.Get("/v1/jobs", bearer);
      status = jobs ? jobs->status : 0;
      if (status != 200) absl::SleepFor(absl::Milliseconds(50));  // polls a remote state
    }
    EXPECT_EQ(status, 200) << "GET /v1/jobs on the new leader's port " << follower_http_port;
  }
  job = testing::AwaitJob(*survivor, id, absl::Seconds(180), testing::Ended);
  testing::ExpectEqualsTrainLocal(job, TrainLocally(job.spec().training().steps()));
  bool resumed = false;
  for (const v1::PlanVersion& v : job.plan_history()) {
    resumed = resumed || absl::StrContains(v.reason(), "the coordinator restarted");
  }
  EXPECT_TRUE(resumed);
}

}  // namespace
}  // namespace pipetrain
