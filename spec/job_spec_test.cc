#include "spec/job_spec.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>

#include "absl/strings/match.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "spec/spec_bounds_testing.h"
#include "worker/data/token_file.h"

namespace pipetrain {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

// Only the required fields: 2 layers (6 units), 2 stages.
v1::JobSpec MinimalSpec() { return BoundsBaseSpec(); }

// Asserts that `spec` is rejected with INVALID_ARGUMENT and a message that
// starts with `prefix`.
void ExpectRejected(const v1::JobSpec& spec, const std::string& prefix) {
  absl::StatusOr<ResolvedJobSpec> resolved = ResolveJobSpec(spec);
  ASSERT_FALSE(resolved.ok()) << "expected a rejection starting with " << prefix;
  EXPECT_EQ(resolved.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(resolved.status().message(), prefix))
      << "message: " << resolved.status().message() << "\nexpected prefix: " << prefix;
}

TEST(ResolveJobSpec, MinimalSpec_FillsEveryDefault) {
  absl::StatusOr<ResolvedJobSpec> resolved = ResolveJobSpec(MinimalSpec());
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  const v1::JobSpec& spec = resolved->spec;
  ASSERT_TRUE(spec.model().has_vocab_size());
  EXPECT_EQ(spec.model().vocab_size(), 256);
  ASSERT_TRUE(spec.model().has_max_seq_len());
  EXPECT_EQ(spec.model().max_seq_len(), 8);
  ASSERT_TRUE(spec.has_data());
  ASSERT_TRUE(spec.data().has_format());
  EXPECT_EQ(spec.data().format(), "auto");
  ASSERT_TRUE(spec.data().has_val_fraction());
  EXPECT_EQ(spec.data().val_fraction(), 0.1);
  ASSERT_TRUE(spec.data().has_synthetic_bytes());
  EXPECT_EQ(spec.data().synthetic_bytes(), 2000000);
  const v1::TrainingSpec& t = spec.training();
  ASSERT_TRUE(t.has_micro_batches() && t.has_lr() && t.has_beta1() && t.has_beta2() &&
              t.has_eps() && t.has_weight_decay() && t.has_decay() && t.has_seed());
  EXPECT_EQ(t.micro_batches(), 1);
  EXPECT_EQ(t.lr(), 3e-4f);
  EXPECT_EQ(t.beta1(), 0.9f);
  EXPECT_EQ(t.beta2(), 0.95f);
  EXPECT_EQ(t.eps(), 1e-8f);
  EXPECT_EQ(t.weight_decay(), 0.1f);
  EXPECT_EQ(t.decay(), "matrices");
  EXPECT_EQ(t.seed(), 1u);
  ASSERT_TRUE(t.has_eval_interval() && t.has_eval_windows());
  EXPECT_EQ(t.eval_interval(), 0);
  EXPECT_EQ(t.eval_windows(), 16);
  ASSERT_TRUE(spec.parallelism().has_solver() && spec.parallelism().has_schedule());
  EXPECT_EQ(spec.parallelism().solver(), "uniform");
  EXPECT_EQ(spec.parallelism().schedule(), "1f1b");

  EXPECT_EQ(resolved->data_format, DataFormat::kAuto);
  EXPECT_EQ(resolved->val_fraction, 0.1);
  EXPECT_EQ(resolved->synthetic_bytes, 2000000);
  EXPECT_EQ(resolved->stages, 2);
  EXPECT_EQ(resolved->solver, "uniform");
  EXPECT_EQ(resolved->schedule, "1f1b");
  const v1::CompressionSpec& c = spec.compression();
  ASSERT_TRUE(c.has_forward() && c.has_backward() && c.has_error_feedback() &&
              c.has_epilogue_only());
  EXPECT_EQ(c.forward(), "none");
  EXPECT_EQ(c.backward(), "none");
  EXPECT_FALSE(c.error_feedback());
  EXPECT_FALSE(c.epilogue_only());
  EXPECT_EQ(spec.training().grad_clip(), 0);
  EXPECT_EQ(spec.training().lr_schedule(), "constant");
  EXPECT_EQ(spec.training().warmup_steps(), 0);
  EXPECT_EQ(spec.training().min_lr(), 0);
  EXPECT_EQ(spec.checkpoint().interval_steps(), 0);
  EXPECT_EQ(spec.checkpoint().keep(), 2);
  EXPECT_EQ(spec.checkpoint().dir(), "");  // JobManager names it after the job
  EXPECT_EQ(spec.elastic().min_workers(), 1);
  EXPECT_EQ(spec.elastic().max_workers(), 2);
}

TEST(ResolveJobSpec, MinimalSpec_DerivesTrainConfig) {
  absl::StatusOr<ResolvedJobSpec> resolved = ResolveJobSpec(MinimalSpec());
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  const TrainConfig& c = resolved->train;
  EXPECT_EQ(c.model.vocab_size, 256);
  EXPECT_EQ(c.model.max_seq_len, 8);
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_EQ(c.model.n_head, 2);
  EXPECT_EQ(c.model.d_model, 16);
  EXPECT_EQ(c.seq_len, 8);
  EXPECT_EQ(c.batch_size, 4);
  EXPECT_EQ(c.micro_batches, 1);
  EXPECT_EQ(c.steps, 10);
  EXPECT_EQ(c.adam.lr, 3e-4f);
  EXPECT_EQ(c.adam.beta1, 0.9f);
  EXPECT_EQ(c.adam.beta2, 0.95f);
  EXPECT_EQ(c.adam.eps, 1e-8f);
  EXPECT_EQ(c.adam.weight_decay, 0.1f);
  EXPECT_EQ(c.decay, DecayPolicy::kMatricesOnly);
  EXPECT_EQ(c.seed, 1u);
}

// Every optional field set to a non-default value, and an existing corpus.
v1::JobSpec FullSpec(const std::string& data_path) {
  v1::JobSpec spec = MinimalSpec();
  spec.set_name("full");
  spec.mutable_model()->set_vocab_size(300);
  spec.mutable_model()->set_max_seq_len(32);
  v1::DataSpec* data = spec.mutable_data();
  data->set_path(data_path);
  data->set_format("text");
  data->set_val_fraction(0.0);  // present but zero: must survive the round trip
  data->set_synthetic_bytes(5000);
  v1::TrainingSpec* t = spec.mutable_training();
  t->set_micro_batches(2);
  t->set_lr(1e-3f);
  t->set_beta1(0.8f);
  t->set_beta2(0.99f);
  t->set_eps(1e-6f);
  t->set_weight_decay(0.0f);
  t->set_decay("all");
  t->set_seed(12345678901234ull);
  t->set_eval_interval(0);  // val_fraction is 0 here
  t->set_eval_windows(8);
  t->set_grad_clip(1.0f);
  t->set_lr_schedule("cosine");
  t->set_warmup_steps(2);
  t->set_min_lr(1e-4f);
  spec.mutable_parallelism()->set_solver("pipedream");
  spec.mutable_parallelism()->set_schedule("gpipe");
  spec.mutable_parallelism()->set_objective("full");
  spec.mutable_parallelism()->set_data(1);
  spec.mutable_parallelism()->set_fused_embedding_sync(false);
  spec.mutable_parallelism()->set_tensor(1);
  spec.mutable_parallelism()->set_tensor_partitions(1);
  spec.mutable_parallelism()->set_tensor_compression("none");
  spec.mutable_parallelism()->set_tensor_mode("1d");
  spec.mutable_parallelism()->set_tensor_partitions_tune_steps(0);
  spec.mutable_output()->set_weights_path("runs/weights.safetensors");
  v1::CompressionSpec* c = spec.mutable_compression();
  c->set_forward("fp16");
  c->set_backward("powersgd:rank=2");
  c->set_error_feedback(true);
  c->set_epilogue_only(false);
  c->mutable_data_parallel()->set_codec("none");
  spec.mutable_scheduling()->mutable_queue_timeout()->set_seconds(90);
  spec.mutable_checkpoint()->set_interval_steps(5);
  spec.mutable_checkpoint()->set_dir("runs/ckpt");
  spec.mutable_checkpoint()->set_keep(3);
  spec.mutable_elastic()->set_min_workers(1);
  spec.mutable_elastic()->set_max_workers(spec.parallelism().stages());
  return spec;
}

TEST(JobSpecJson, FullSpec_RoundTrips) {
  const std::string corpus = TempPath("roundtrip.txt");
  ASSERT_TRUE(WriteBytesFile(corpus, "hello world").ok());
  const v1::JobSpec spec = FullSpec(corpus);
  const std::string json = JobSpecToJson(spec);
  EXPECT_TRUE(absl::StrContains(json, "\"nLayer\": 2")) << json;
  EXPECT_TRUE(absl::StrContains(json, "\"valFraction\": 0")) << json;
  absl::StatusOr<v1::JobSpec> parsed = JobSpecFromJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << json;
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(spec, *parsed))
      << parsed->DebugString();
  EXPECT_TRUE(parsed->data().has_val_fraction());
  EXPECT_TRUE(parsed->training().has_weight_decay());
}

TEST(ResolveJobSpec, FullSpec_KeepsEveryValue) {
  const std::string corpus = TempPath("full.txt");
  ASSERT_TRUE(WriteBytesFile(corpus, "hello world").ok());
  const v1::JobSpec spec = FullSpec(corpus);
  absl::StatusOr<ResolvedJobSpec> resolved = ResolveJobSpec(spec);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(spec, resolved->spec));
  EXPECT_EQ(resolved->data_format, DataFormat::kText);
  EXPECT_EQ(resolved->val_fraction, 0.0);
  EXPECT_EQ(resolved->synthetic_bytes, 5000);
  EXPECT_EQ(resolved->solver, "pipedream");
  EXPECT_EQ(resolved->schedule, "gpipe");
  EXPECT_EQ(resolved->train.model.max_seq_len, 32);
  EXPECT_EQ(resolved->train.micro_batches, 2);
  EXPECT_EQ(resolved->train.adam.weight_decay, 0.0f);
  EXPECT_EQ(resolved->train.decay, DecayPolicy::kAll);
  EXPECT_EQ(resolved->train.seed, 12345678901234ull);
}

TEST(JobSpecFromJson, OriginalAndCamelNames_BothAccepted) {
  absl::StatusOr<v1::JobSpec> spec = JobSpecFromJson(
      R"({"model": {"n_layer": 3, "nHead": 4, "d_model": 32},
          "training": {"seqLen": 16, "batch_size": 2, "steps": "7", "micro_batches": 2}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().n_layer(), 3);
  EXPECT_EQ(spec->model().n_head(), 4);
  EXPECT_EQ(spec->model().d_model(), 32);
  EXPECT_EQ(spec->training().seq_len(), 16);
  EXPECT_EQ(spec->training().batch_size(), 2);
  EXPECT_EQ(spec->training().steps(), 7);
  EXPECT_EQ(spec->training().micro_batches(), 2);
}

TEST(ResolveJobSpec, MissingModel_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.clear_model();
  ExpectRejected(spec, "spec.model: required");
}

TEST(ResolveJobSpec, MissingTraining_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.clear_training();
  ExpectRejected(spec, "spec.training: required");
}

TEST(ResolveJobSpec, ZeroLayers_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_model()->set_n_layer(0);
  ExpectRejected(spec, "spec.model.n_layer: ");
}

TEST(ResolveJobSpec, HeadsNotDividingDModel_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_model()->set_n_head(3);
  ExpectRejected(spec, "spec.model.n_head: 3 must divide spec.model.d_model 16");
}

TEST(ResolveJobSpec, VocabAboveUint16_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_model()->set_vocab_size(70000);
  ExpectRejected(spec, "spec.model.vocab_size: ");
}

TEST(ResolveJobSpec, MicroBatchesNotDividingBatch_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_training()->set_batch_size(8);
  spec.mutable_training()->set_micro_batches(3);
  ExpectRejected(spec, "spec.training.micro_batches: 3 must divide spec.training.batch_size 8");
}

// A micro-batch whose logits reach 2^32 elements (vocabulary 65536 x 64
// sequences x 1024 tokens) is refused naming micro_batches, with the count
// exact.
TEST(ResolveJobSpec, MicroBatchTensorOverIntRange_RejectedNamingMicroBatches) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_model()->set_vocab_size(65536);
  spec.mutable_training()->set_seq_len(1024);
  spec.mutable_training()->set_batch_size(64);
  spec.mutable_training()->set_micro_batches(1);
  ExpectRejected(spec,
                 "spec.training.micro_batches: a micro-batch of 64 sequences of 1024 tokens "
                 "needs a tensor of 4294967296 elements");
  spec.mutable_training()->set_micro_batches(4);  // 2^30: fits
  EXPECT_TRUE(ResolveJobSpec(spec).ok()) << ResolveJobSpec(spec).status();
}

// A 3.4e9-parameter model of 32 heads at an 8K context, one sequence a
// micro-batch: the layer's attention scores are 32 x 8192^2 = 2^31 values,
// but each of 8 tensor ranks holds its 4 heads' (2^28). The check counted
// the whole layer's whatever the ranks, and named micro_batches, which
// already equalled batch_size.
TEST(ResolveJobSpec, MicroBatchTensorPerTensorRank_SplitAcceptedOneSequenceNamesSeqLen) {
  v1::JobSpec spec = MinimalSpec();
  v1::ModelSpec* model = spec.mutable_model();
  model->set_n_layer(16);
  model->set_n_head(32);
  model->set_d_model(4096);
  model->set_vocab_size(32000);
  spec.mutable_training()->set_seq_len(8192);
  spec.mutable_training()->set_batch_size(8);
  spec.mutable_training()->set_micro_batches(8);
  spec.mutable_parallelism()->set_tensor(8);
  absl::StatusOr<ResolvedJobSpec> resolved = ResolveJobSpec(spec);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->train.tensor_parallel, 8);
  spec.mutable_parallelism()->set_tensor(1);
  ExpectRejected(spec,
                 "spec.training.seq_len: one sequence of 8192 tokens needs a tensor of 2147483648 "
                 "elements (the attention scores), above 2^31 - 1, and a micro-batch is already "
                 "one sequence (micro_batches = batch_size); use a shorter seq_len or more tensor "
                 "ranks (spec.parallelism.tensor)");
}

TEST(ResolveJobSpec, ZeroSteps_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_training()->set_steps(0);
  ExpectRejected(spec, "spec.training.steps: ");
}

TEST(ResolveJobSpec, NegativeLr_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_training()->set_lr(-0.1f);
  ExpectRejected(spec, "spec.training.lr: must be finite and > 0");
}

TEST(ResolveJobSpec, NanLrFromJson_Rejected) {
  // proto3 JSON accepts "NaN" for floats, so ResolveJobSpec has to reject it.
  absl::StatusOr<v1::JobSpec> with_nan = JobSpecFromJson(
      R"({"model": {"nLayer": 2, "nHead": 2, "dModel": 16},
          "training": {"seqLen": 8, "batchSize": 4, "steps": 10, "lr": "NaN"},
          "parallelism": {"stages": 2}})");
  ASSERT_TRUE(with_nan.ok()) << with_nan.status();
  ASSERT_TRUE(std::isnan(with_nan->training().lr()));
  ExpectRejected(*with_nan, "spec.training.lr: ");
}

TEST(ResolveJobSpec, Beta2One_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_training()->set_beta2(1.0f);
  ExpectRejected(spec, "spec.training.beta2: must be in [0, 1)");
}

TEST(ResolveJobSpec, UnknownDecay_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_training()->set_decay("none");
  ExpectRejected(spec, "spec.training.decay: unknown policy \"none\"");
}

TEST(ResolveJobSpec, MaxSeqLenBelowSeqLen_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_model()->set_max_seq_len(4);
  ExpectRejected(spec, "spec.model.max_seq_len: 4 must be >= spec.training.seq_len 8");
}

TEST(ResolveJobSpec, UnknownFormat_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_data()->set_format("parquet");
  ExpectRejected(spec, "spec.data.format: ");
}

TEST(ResolveJobSpec, ValFractionOne_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_data()->set_val_fraction(1.0);
  ExpectRejected(spec, "spec.data.val_fraction: must be in [0, 1), got 1");
}

// The file is not looked at here (workers resolve it under their data
// roots): a missing one passes, a path climbing with ".." does not.
TEST(ResolveJobSpec, MissingDataFile_AcceptedLexically) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_data()->set_path(TempPath("no_such_corpus.txt"));
  EXPECT_TRUE(ResolveJobSpec(spec).ok());
}

TEST(ResolveJobSpec, DataPathWithDotDot_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_data()->set_path("corpora/../../etc/shadow");
  ExpectRejected(spec, "spec.data.path: \"..\" components are not allowed");
  spec.mutable_data()->set_path(std::string(1025, 'a'));
  ExpectRejected(spec, "spec.data.path: path of 1025 bytes exceeds the limit of 1024");
}

// A path that is not UTF-8 (a Latin-1 file name, which `up` copies from
// its argument) is a client error naming the field: the proto string did
// not parse at the coordinator, which answered INTERNAL with no message.
TEST(ResolveJobSpec, DataPathNotUtf8_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_data()->set_path("corpora/M\xe4rz.txt");
  ExpectRejected(spec, "spec.data.path: is not valid UTF-8 (");
  spec.mutable_data()->set_path("corpora/M\xc3\xa4rz.txt");  // the same name in UTF-8
  EXPECT_TRUE(ResolveJobSpec(spec).ok());
}

TEST(ResolveJobSpec, GeneratedCorpusWithVocab100_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_model()->set_vocab_size(100);
  ExpectRejected(spec, "spec.model.vocab_size: 100 is too small for byte-level text");
}

TEST(ResolveJobSpec, Uint16CorpusWithVocab100_Accepted) {
  const std::string corpus = TempPath("tokens.bin");
  ASSERT_TRUE(WriteUint16TokenFile(corpus, {1, 2, 3, 99}, /*with_header=*/false).ok());
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_model()->set_vocab_size(100);
  spec.mutable_data()->set_path(corpus);
  spec.mutable_data()->set_format("uint16");
  absl::StatusOr<ResolvedJobSpec> resolved = ResolveJobSpec(spec);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->data_format, DataFormat::kUint16);
  EXPECT_EQ(resolved->train.model.vocab_size, 100);
}

TEST(ResolveJobSpec, GeneratedCorpusWithUint16Format_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_data()->set_format("uint16");
  ExpectRejected(spec, "spec.data.format: uint16 needs spec.data.path");
}

TEST(ResolveJobSpec, ZeroSyntheticBytes_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_data()->set_synthetic_bytes(0);
  ExpectRejected(spec, "spec.data.synthetic_bytes: must be >= 1, got 0");
}

TEST(ResolveJobSpec, MissingParallelism_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.clear_parallelism();
  ExpectRejected(spec, "spec.parallelism: required");
}

TEST(ResolveJobSpec, ZeroStages_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_parallelism()->set_stages(0);
  ExpectRejected(spec, "spec.parallelism.stages: required, must be >= 1, got 0");
}

TEST(ResolveJobSpec, MoreStagesThanUnits_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_parallelism()->set_stages(9);
  ExpectRejected(spec,
                 "spec.parallelism.stages: 9 stages but the model has only 6 units "
                 "(2 * n_layer + 2)");
}

TEST(ResolveJobSpec, StagesEqualToUnits_Accepted) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_parallelism()->set_stages(6);
  absl::StatusOr<ResolvedJobSpec> resolved = ResolveJobSpec(spec);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->stages, 6);
}

TEST(ResolveJobSpec, UnknownSolver_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_parallelism()->set_solver("acctfm");
  ExpectRejected(spec,
                 "spec.parallelism.solver: unknown solver \"acctfm\"; accepted: uniform, "
                 "pipedream, bipartition, auto, manual");
  // AccTFM sizes a tensor-parallel group's partitions: the message says how.
  EXPECT_TRUE(absl::StrContains(ResolveJobSpec(spec).status().message(),
                                "set spec.parallelism.tensor_partitions to 0"));
}

TEST(ResolveJobSpec, BiPartitionAndObjective_Accepted) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_parallelism()->set_solver("bipartition");
  auto resolved = ResolveJobSpec(spec);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->objective, "paper");
  spec.mutable_parallelism()->set_objective("fastest");
  ExpectRejected(spec, "spec.parallelism.objective: unknown objective \"fastest\"");
}

v1::ManualStage Stage(int fb, int fe, int bb, int be) {
  v1::ManualStage s;
  s.set_forward_begin(fb);
  s.set_forward_end(fe);
  s.set_backward_begin(bb);
  s.set_backward_end(be);
  return s;
}

TEST(ResolveJobSpec, ManualStages_ValidatedNamingTheEntry) {
  v1::JobSpec spec = MinimalSpec();
  const int units = 2 * spec.model().n_layer() + 2;
  spec.mutable_parallelism()->set_stages(2);
  spec.mutable_parallelism()->set_solver("manual");
  *spec.mutable_parallelism()->add_manual_stages() = Stage(0, 1, 0, 2);
  *spec.mutable_parallelism()->add_manual_stages() = Stage(1, units, 2, units);
  EXPECT_TRUE(ResolveJobSpec(spec).ok());
  spec.mutable_parallelism()->mutable_manual_stages(1)->set_backward_begin(3);
  ExpectRejected(spec, "spec.parallelism.manual_stages[1]: forward [1, ");
  spec.mutable_parallelism()->mutable_manual_stages(1)->set_backward_begin(2);
  spec.mutable_parallelism()->mutable_manual_stages(1)->set_backward_end(units - 1);
  ExpectRejected(spec, "spec.parallelism.manual_stages: forward ranges end at");
  spec.mutable_parallelism()->set_solver("pipedream");
  ExpectRejected(spec, "spec.parallelism.manual_stages: given but the solver is \"pipedream\"");
}

TEST(ResolveJobSpec, UnknownSchedule_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_parallelism()->set_schedule("interleaved");
  ExpectRejected(spec, "spec.parallelism.schedule: unknown schedule \"interleaved\"");
}

TEST(ResolveJobSpec, EvalInterval_CarriedIntoTrainConfig) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_training()->set_eval_interval(5);
  spec.mutable_training()->set_eval_windows(3);
  absl::StatusOr<ResolvedJobSpec> resolved = ResolveJobSpec(spec);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->train.eval_interval, 5);
  EXPECT_EQ(resolved->train.eval_windows, 3);
}

TEST(ResolveJobSpec, DataParallel_DefaultsToOneAndIsKept) {
  EXPECT_EQ(ResolveJobSpec(MinimalSpec()).value().data_parallel, 1);
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_training()->set_micro_batches(4);
  spec.mutable_parallelism()->set_data(2);
  const ResolvedJobSpec resolved = ResolveJobSpec(spec).value();
  EXPECT_EQ(resolved.data_parallel, 2);
  EXPECT_EQ(resolved.spec.parallelism().data(), 2);
  EXPECT_TRUE(resolved.spec.parallelism().fused_embedding_sync());
  EXPECT_EQ(resolved.stages, 2);
}

TEST(ResolveJobSpec, DataParallel_BadValuesRejectedNamingTheField) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_parallelism()->set_data(-1);
  ExpectRejected(spec, "spec.parallelism.data: must be >= 1, got -1");
  spec = MinimalSpec();  // 4 micro-batches cannot be shared by 3 replicas
  spec.mutable_training()->set_micro_batches(4);
  spec.mutable_parallelism()->set_data(3);
  ExpectRejected(spec, "spec.training.micro_batches: 4 micro-batches cannot be shared evenly by 3");
  spec = MinimalSpec();  // 512 replicas x 2 stages = 1024 workers: the limit
  spec.mutable_training()->set_batch_size(512);
  spec.mutable_training()->set_micro_batches(512);
  spec.mutable_parallelism()->set_data(512);
  EXPECT_TRUE(ResolveJobSpec(spec).ok());
  spec.mutable_parallelism()->set_stages(3);
  spec.mutable_model()->set_n_layer(2);
  ExpectRejected(spec,
                 "spec.parallelism.data: 512 replicas x 3 stages is 1536 workers; at most "
                 "1024");
}

// Grown to spec.elastic.max_workers stages, a job must still fit the
// worker limit: every worker would refuse the larger layout, and the job
// fail because spare workers appeared.
TEST(ResolveJobSpec, ElasticGrowthPastTheWorkerLimit_RejectedNamingMaxWorkers) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_training()->set_batch_size(512);
  spec.mutable_training()->set_micro_batches(512);
  spec.mutable_parallelism()->set_data(512);
  spec.mutable_checkpoint()->set_interval_steps(1);
  spec.mutable_elastic()->set_max_workers(2);
  EXPECT_TRUE(ResolveJobSpec(spec).ok());
  spec.mutable_elastic()->set_max_workers(3);
  ExpectRejected(spec,
                 "spec.elastic.max_workers: 512 replicas x 3 stages x 1 tensor ranks is 1536 "
                 "workers once grown; at most 1024");
}

// The files under spec.checkpoint.dir are confined paths of at most 1024
// bytes too: the dir leaves room for the longest of them.
TEST(ResolveJobSpec, CheckpointDir_RoomForItsFiles) {
  // `bytes` long, in components of 99 bytes (a name's limit is 255).
  const auto dir = [](size_t bytes) {
    std::string d;
    while (d.size() < bytes) d += d.size() % 100 == 99 ? '/' : 'c';
    return d;
  };
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_checkpoint()->set_interval_steps(1);
  spec.mutable_checkpoint()->set_dir(dir(kMaxCheckpointDirBytes));
  const absl::StatusOr<ResolvedJobSpec> longest = ResolveJobSpec(spec);
  EXPECT_TRUE(longest.ok()) << longest.status();
  spec.mutable_checkpoint()->set_dir(dir(kMaxCheckpointDirBytes + 1));
  ExpectRejected(spec, absl::StrCat("spec.checkpoint.dir: path of ", kMaxCheckpointDirBytes + 1,
                                    " bytes exceeds the limit of ", kMaxCheckpointDirBytes,
                                    " (the files under it, such as "
                                    "/step-100000000/unit-0513.safetensors, must stay within "
                                    "1024)"));
  EXPECT_EQ(kMaxCheckpointDirBytes, 987u);
}

// MinimalSpec (2 layers: 6 units) as data 0 (auto) over `workers` workers.
v1::JobSpec AutoLayoutSpec(int workers, int micro_batches) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_training()->set_batch_size(4 * micro_batches);
  spec.mutable_training()->set_micro_batches(micro_batches);
  spec.mutable_parallelism()->set_stages(0);
  spec.mutable_parallelism()->set_data(kDataParallelAuto);
  spec.mutable_parallelism()->set_workers(workers);
  return spec;
}

TEST(DataParallelDegrees, DividesWorkersAndMicroBatchesWithAStagePerUnitAtMost) {
  EXPECT_EQ(DataParallelDegrees(4, 4, 6), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(DataParallelDegrees(4, 2, 6), (std::vector<int>{1, 2}));
  EXPECT_EQ(DataParallelDegrees(12, 4, 6), (std::vector<int>{2, 4}));  // 12 stages > 6 units
  EXPECT_EQ(DataParallelDegrees(7, 2, 6), std::vector<int>{});
  EXPECT_EQ(DataParallelDegrees(1, 1, 4), std::vector<int>{1});
  // Stages of T tensor ranks: the replicas divide the groups of T.
  EXPECT_EQ(DataParallelDegrees(8, 4, 6, 2), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(DataParallelDegrees(8, 4, 6, 8), std::vector<int>{1});
  EXPECT_EQ(DataParallelDegrees(24, 6, 2, 4), (std::vector<int>{3, 6}));  // 6 groups, 2 units
  EXPECT_EQ(DataParallelDegrees(6, 4, 6, 4), std::vector<int>{});         // 4 does not divide 6
}

TEST(ResolveJobSpec, DataParallelAuto_KeptAutoAndResolvingAgainGivesTheSameSpec) {
  const ResolvedJobSpec resolved = ResolveJobSpec(AutoLayoutSpec(4, 4)).value();
  EXPECT_EQ(resolved.data_parallel, kDataParallelAuto);
  EXPECT_EQ(resolved.layout_workers, 4);
  EXPECT_EQ(resolved.stages, 0);
  const v1::ParallelismSpec& p = resolved.spec.parallelism();
  EXPECT_TRUE(p.has_data());
  EXPECT_EQ(p.data(), 0);
  EXPECT_EQ(p.stages(), 0);
  EXPECT_EQ(p.workers(), 4);
  EXPECT_EQ(p.solver(), "uniform");  // the other defaults are filled in
  EXPECT_FALSE(resolved.spec.elastic().has_min_workers());
  EXPECT_FALSE(resolved.spec.elastic().has_max_workers());
  // What the coordinator stores resolves to itself after a restart.
  const ResolvedJobSpec again = ResolveJobSpec(resolved.spec).value();
  EXPECT_EQ(again.spec.SerializeAsString(), resolved.spec.SerializeAsString());
  EXPECT_EQ(again.layout_workers, 4);
  EXPECT_EQ(JobWorkers(resolved), 4);
  v1::JobSpec named = MinimalSpec();  // 2 stages
  named.mutable_training()->set_micro_batches(4);
  named.mutable_parallelism()->set_data(2);
  named.mutable_parallelism()->set_tensor(2);
  EXPECT_EQ(JobWorkers(ResolveJobSpec(named).value()), 8);
}

TEST(ResolveDataParallelLayout, GivesTheChosenLayoutsSpecWithElasticDefaults) {
  const ResolvedJobSpec automatic = ResolveJobSpec(AutoLayoutSpec(4, 4)).value();
  const ResolvedJobSpec two = ResolveDataParallelLayout(automatic, 2).value();
  EXPECT_EQ(two.data_parallel, 2);
  EXPECT_EQ(two.stages, 2);
  EXPECT_EQ(two.layout_workers, 0);
  EXPECT_EQ(two.spec.parallelism().data(), 2);
  EXPECT_EQ(two.spec.parallelism().stages(), 2);
  EXPECT_FALSE(two.spec.parallelism().has_workers());
  EXPECT_EQ(two.spec.elastic().min_workers(), 1);
  EXPECT_EQ(two.spec.elastic().max_workers(), 2);
  EXPECT_EQ(two.train.micro_batches, 4);
  const ResolvedJobSpec four = ResolveDataParallelLayout(automatic, 4).value();
  EXPECT_EQ(four.stages, 1);
  absl::StatusOr<ResolvedJobSpec> three = ResolveDataParallelLayout(automatic, 3);
  ASSERT_EQ(three.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(three.status().message(),
            "spec.parallelism.data: 3 replicas is not a layout of 4 workers (accepted: 1, 2, 4)");
  EXPECT_EQ(ResolveDataParallelLayout(two, 2).status().code(),
            absl::StatusCode::kInvalidArgument);  // already chosen
}

// Tensor ranks with an auto layout: the search covers replicas x stages,
// every stage keeping the spec's T ranks.
TEST(ResolveJobSpec, DataParallelAuto_WithTensorRanks_LayoutsOfGroupsOfT) {
  v1::JobSpec spec = AutoLayoutSpec(8, 4);
  spec.mutable_parallelism()->set_tensor(2);
  const ResolvedJobSpec automatic = ResolveJobSpec(spec).value();
  EXPECT_EQ(automatic.data_parallel, kDataParallelAuto);
  EXPECT_EQ(automatic.layout_workers, 8);
  EXPECT_EQ(automatic.tensor_parallel, 2);
  EXPECT_EQ(JobWorkers(automatic), 8);
  EXPECT_EQ(ResolveJobSpec(automatic.spec).value().spec.SerializeAsString(),
            automatic.spec.SerializeAsString());
  const ResolvedJobSpec two = ResolveDataParallelLayout(automatic, 2).value();
  EXPECT_EQ(two.data_parallel, 2);
  EXPECT_EQ(two.stages, 2);
  EXPECT_EQ(two.tensor_parallel, 2);
  EXPECT_EQ(JobWorkers(two), 8);
  EXPECT_EQ(ResolveDataParallelLayout(automatic, 4).value().stages, 1);
  EXPECT_EQ(ResolveDataParallelLayout(automatic, 1).value().stages, 4);
  EXPECT_EQ(ResolveDataParallelLayout(automatic, 8).status().message(),
            "spec.parallelism.data: 8 replicas is not a layout of 8 workers (accepted: 1, 2, 4)");
  // Over other workers (a recovery): whole groups of 2 only.
  EXPECT_EQ(ResolveAsAutoLayout(two.spec, 6).value().layout_workers, 6);
  EXPECT_TRUE(absl::StartsWith(ResolveAsAutoLayout(two.spec, 5).status().message(),
                               "spec.parallelism.workers: 5 is not a multiple of "
                               "spec.parallelism.tensor 2"));
  // No layout: 14 workers are 7 groups, which neither 4 micro-batches nor
  // 6 units allow.
  spec = AutoLayoutSpec(14, 4);
  spec.mutable_parallelism()->set_tensor(2);
  ExpectRejected(spec,
                 "spec.parallelism.workers: no layout of 14 workers in groups of 2 tensor ranks: "
                 "the replicas D must divide both the groups and spec.training.micro_batches 4, "
                 "with groups / D stages at most the model's 6 units");
}

// AutoLayoutSpec with 4 heads (T may be 1, 2 or 4) searching T too.
v1::JobSpec TensorAutoSpec(int workers, int micro_batches) {
  v1::JobSpec spec = AutoLayoutSpec(workers, micro_batches);
  spec.mutable_model()->set_n_head(4);
  spec.mutable_parallelism()->set_tensor(kTensorParallelAuto);
  return spec;
}

std::vector<LayoutDegrees> LayoutsOf(const v1::JobSpec& spec, int workers) {
  return AutoLayoutDegrees(ResolveJobSpec(spec).value().spec, workers);
}

TEST(AutoLayoutDegrees, TheSpecsTOrEveryTThatSplitsTheModelThenEveryD) {
  using L = LayoutDegrees;
  // T fixed (the spec's): DataParallelDegrees' D.
  v1::JobSpec spec = AutoLayoutSpec(4, 4);
  EXPECT_EQ(LayoutsOf(spec, 4), (std::vector<L>{{1, 4, 1}, {2, 2, 1}, {4, 1, 1}}));
  spec.mutable_model()->set_n_head(4);
  spec.mutable_parallelism()->set_tensor(2);
  EXPECT_EQ(LayoutsOf(spec, 4), (std::vector<L>{{1, 2, 2}, {2, 1, 2}}));
  // T searched: every T dividing the workers and the 4 heads, ascending,
  // then D; 2 micro-batches allow D of 1 and 2 only.
  EXPECT_EQ(LayoutsOf(TensorAutoSpec(4, 2), 4),
            (std::vector<L>{{1, 4, 1}, {2, 2, 1}, {1, 2, 2}, {2, 1, 2}, {1, 1, 4}}));
  EXPECT_EQ(LayoutsOf(TensorAutoSpec(4, 2), 3), (std::vector<L>{{1, 3, 1}}));  // 3 splits no head
  EXPECT_EQ(LayoutsOf(TensorAutoSpec(4, 2), 1), (std::vector<L>{{1, 1, 1}}));
  // 16 workers: T 1 gives 16 stages > 6 units unless D >= 4, which 2
  // micro-batches refuse; T 8 and 16 split no 4 heads.
  EXPECT_EQ(LayoutsOf(TensorAutoSpec(16, 2), 16),
            (std::vector<L>{{2, 4, 2}, {1, 4, 4}, {2, 2, 4}}));
  // The 3-D cube: T = p^3 only (p 2: 2 | heads, 4 | d_model 16, 8 | the
  // vocabulary 256, 4 | the 4 samples of a micro-batch).
  spec = TensorAutoSpec(8, 1);
  spec.mutable_parallelism()->set_tensor_mode("3d");
  EXPECT_EQ(LayoutsOf(spec, 8), (std::vector<L>{{1, 1, 8}}));
  EXPECT_EQ(LayoutsOf(spec, 16), (std::vector<L>{{1, 2, 8}}));
}

// What AutoLayoutDegrees leaves out by the model, and why: the T that
// divide the workers (cubes only, in 3d) but split no model, ascending.
TEST(UnsplitTensorRanks, TheTThatDivideTheWorkersButSplitNoModel) {
  const v1::JobSpec spec = ResolveJobSpec(TensorAutoSpec(16, 2)).value().spec;
  const std::vector<std::pair<int, std::string>> unsplit = UnsplitTensorRanks(spec, 16);
  ASSERT_EQ(unsplit.size(), 2u);  // 2 and 4 split the 4 heads
  EXPECT_EQ(unsplit[0].first, 8);
  EXPECT_EQ(unsplit[1].first, 16);
  EXPECT_TRUE(absl::StrContains(unsplit[0].second, "model.n_head 4")) << unsplit[0].second;
  EXPECT_TRUE(UnsplitTensorRanks(spec, 4).empty());
  // 3 workers: T 3 divides them and splits no 4 heads.
  EXPECT_EQ(UnsplitTensorRanks(ResolveJobSpec(TensorAutoSpec(3, 1)).value().spec, 3).size(), 1u);
  // The cube: only p^3 counts are asked (8 of 16 workers; 2, 4, 16 are no
  // cubes), and 8 needs p^3 to divide a vocabulary of 258.
  v1::JobSpec cube = TensorAutoSpec(16, 1);
  cube.mutable_parallelism()->set_tensor_mode("3d");
  v1::JobSpec resolved = ResolveJobSpec(cube).value().spec;
  EXPECT_TRUE(UnsplitTensorRanks(resolved, 16).empty());
  resolved.mutable_model()->set_vocab_size(258);  // ResolveJobSpec refuses it: no T left
  const std::vector<std::pair<int, std::string>> cubes = UnsplitTensorRanks(resolved, 16);
  ASSERT_EQ(cubes.size(), 1u);
  EXPECT_EQ(cubes[0].first, 8);
  EXPECT_TRUE(absl::StrContains(cubes[0].second, "vocab_size 258")) << cubes[0].second;
}

// Tensor 0 with data 0: T is searched as well; the spec stays auto in
// both, and each layout names its T.
TEST(ResolveJobSpec, TensorAuto_KeptAutoAndEachLayoutNamesItsT) {
  const ResolvedJobSpec automatic = ResolveJobSpec(TensorAutoSpec(4, 2)).value();
  EXPECT_EQ(automatic.tensor_parallel, kTensorParallelAuto);
  EXPECT_TRUE(automatic.spec.parallelism().has_tensor());
  EXPECT_EQ(automatic.spec.parallelism().tensor(), 0);
  EXPECT_EQ(automatic.spec.parallelism().tensor_partitions(), 1);
  EXPECT_EQ(JobWorkers(automatic), 4);
  EXPECT_EQ(ResolveJobSpec(automatic.spec).value().spec.SerializeAsString(),
            automatic.spec.SerializeAsString());
  const ResolvedJobSpec ranks =
      ResolveDataParallelLayout(automatic, LayoutDegrees{1, 2, 2}).value();
  EXPECT_EQ(ranks.tensor_parallel, 2);
  EXPECT_EQ(ranks.stages, 2);
  EXPECT_EQ(ranks.data_parallel, 1);
  EXPECT_EQ(JobWorkers(ranks), 4);
  const ResolvedJobSpec replicas =
      ResolveDataParallelLayout(automatic, LayoutDegrees{2, 2, 1}).value();
  EXPECT_EQ(replicas.tensor_parallel, 1);
  EXPECT_EQ(replicas.data_parallel, 2);
  EXPECT_EQ(ResolveDataParallelLayout(automatic, LayoutDegrees{1, 1, 3}).status().message(),
            "spec.parallelism.data: 1 replicas x 1 stages x 3 tensor ranks is not a layout of 4 "
            "workers (accepted: 1 x 4 x 1, 2 x 2 x 1, 1 x 2 x 2, 2 x 1 x 2, 1 x 1 x 4)");
  // The D-only form needs a T to keep.
  EXPECT_EQ(ResolveDataParallelLayout(automatic, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Back to auto over other workers with the submitted parallelism: T is
  // searched again.
  const v1::ParallelismSpec submitted = automatic.spec.parallelism();
  EXPECT_EQ(ResolveAsAutoLayout(ranks.spec, 4, {}, &submitted).value().spec.SerializeAsString(),
            automatic.spec.SerializeAsString());
  EXPECT_EQ(ResolveAsAutoLayout(ranks.spec, 3, {}, &submitted).value().tensor_parallel,
            kTensorParallelAuto);
  // Without it, the chosen T stays: 3 workers are no multiple of 2.
  EXPECT_TRUE(absl::StartsWith(ResolveAsAutoLayout(ranks.spec, 3).status().message(),
                               "spec.parallelism.workers: 3 is not a multiple of "
                               "spec.parallelism.tensor 2"));
}

// The tensor fields with T searched: kept in the auto spec and by the
// layouts with tensor ranks, dropped by those of one rank per stage, and
// refused naming the field when no layout has tensor ranks.
TEST(ResolveJobSpec, TensorAuto_TensorFieldsGoToTheLayoutsWithTensorRanks) {
  v1::JobSpec spec = TensorAutoSpec(4, 2);
  spec.mutable_parallelism()->set_tensor_partitions(0);
  spec.mutable_parallelism()->set_tensor_compression("piecewise:bits=4");
  const ResolvedJobSpec automatic = ResolveJobSpec(spec).value();
  const v1::ParallelismSpec& p = automatic.spec.parallelism();
  EXPECT_EQ(p.tensor_partitions(), 0);
  EXPECT_EQ(p.tensor_partitions_tune_steps(), 2);  // the default with partitions 0
  EXPECT_EQ(p.tensor_compression(), "piecewise:bits=4");
  EXPECT_EQ(automatic.tensor_partitions, 0);
  EXPECT_EQ(ResolveJobSpec(automatic.spec).value().spec.SerializeAsString(),
            automatic.spec.SerializeAsString());
  const ResolvedJobSpec ranks =
      ResolveDataParallelLayout(automatic, LayoutDegrees{1, 2, 2}).value();
  EXPECT_EQ(ranks.tensor_partitions, 0);
  EXPECT_EQ(ranks.tensor_partitions_tune_steps, 2);
  EXPECT_EQ(ranks.tensor_compression, "piecewise:bits=4");
  const ResolvedJobSpec one = ResolveDataParallelLayout(automatic, LayoutDegrees{1, 4, 1}).value();
  EXPECT_EQ(one.tensor_partitions, 1);
  EXPECT_EQ(one.tensor_partitions_tune_steps, 0);
  EXPECT_EQ(one.tensor_compression, "none");
  // From the one-rank layout back to auto: the submitted fields return.
  const v1::ParallelismSpec submitted = automatic.spec.parallelism();
  EXPECT_EQ(ResolveAsAutoLayout(one.spec, 4, {}, &submitted).value().spec.SerializeAsString(),
            automatic.spec.SerializeAsString());
  // 3 workers have no layout with tensor ranks: the fields wait (a job
  // going on after a loss is not refused for them).
  const ResolvedJobSpec three = ResolveAsAutoLayout(one.spec, 3, {}, &submitted).value();
  EXPECT_EQ(three.spec.parallelism().tensor_partitions(), 1);
  EXPECT_EQ(three.spec.parallelism().tensor_compression(), "none");
  // Submitted so: refused.
  spec = TensorAutoSpec(3, 1);
  spec.mutable_parallelism()->set_tensor_partitions(2);
  ExpectRejected(spec,
                 "spec.parallelism.tensor_partitions: applies to stages of tensor ranks, but "
                 "every layout of 3 workers has one rank per stage");
  spec = TensorAutoSpec(3, 1);
  spec.mutable_parallelism()->set_tensor_compression("piecewise:bits=4");
  ExpectRejected(spec, "spec.parallelism.tensor_compression: applies to stages of tensor ranks");
  // A bad value is named as with a known T.
  spec = TensorAutoSpec(4, 2);
  spec.mutable_parallelism()->set_tensor_partitions(3);
  ExpectRejected(spec, "spec.parallelism.tensor_partitions: must be 0");
  // No layout at all: 7 workers of 2 micro-batches split no head.
  ExpectRejected(TensorAutoSpec(7, 2),
                 "spec.parallelism.workers: no layout of 7 workers: the "
                 "tensor ranks T must divide the workers");
  // The message says why each T dividing the workers split no model.
  const std::string seven = std::string(ResolveJobSpec(TensorAutoSpec(7, 2)).status().message());
  EXPECT_TRUE(
      absl::EndsWith(seven, " units (T 7: tensor parallelism of 7 does not divide model.n_head 4)"))
      << seven;
  // The cube's rule is stated, and its one candidate's reason given.
  spec = TensorAutoSpec(7, 2);
  spec.mutable_parallelism()->set_tensor_mode("3d");
  ExpectRejected(spec,
                 "spec.parallelism.workers: no layout of 7 workers: the tensor ranks T must be a "
                 "cube p^3 (8, 27, ...) that divides the workers and split the model "
                 "(spec.parallelism.tensor, tensor_mode 3d), and the replicas D");
  spec = TensorAutoSpec(8, 2);
  spec.mutable_parallelism()->set_tensor_mode("3d");
  spec.mutable_model()->set_vocab_size(258);
  const std::string eight = std::string(ResolveJobSpec(spec).status().message());
  EXPECT_TRUE(
      absl::EndsWith(eight,
                     " units (T 8: 3-D tensor parallelism on a 2x2x2 cube needs p^3 = 8 to divide "
                     "model.vocab_size 258)"))
      << eight;
}

// T searched for a 32-head model at an 8K context, one sequence a
// micro-batch: at T 1 (the first layouts) the layer's attention scores are
// 32 x 8192^2 = 2^31 values, past the int bound, but T 2 holds half of
// them. The spec was checked as its first layout only and refused, telling
// the user to add tensor ranks though the planner was to choose them; now
// as the first layout that resolves, and refused with the first layout's
// error only when none does.
TEST(ResolveJobSpec, TensorAuto_FirstLayoutPastIntRange_CheckedAsTheFirstThatResolves) {
  v1::JobSpec spec = TensorAutoSpec(8, 8);
  v1::ModelSpec* model = spec.mutable_model();
  model->set_n_layer(16);
  model->set_n_head(32);
  model->set_d_model(4096);
  model->set_vocab_size(32000);
  spec.mutable_training()->set_seq_len(8192);
  spec.mutable_training()->set_batch_size(8);  // micro_batches 8: one sequence each
  spec.mutable_compression()->mutable_data_parallel()->set_codec("fp16");
  absl::StatusOr<ResolvedJobSpec> automatic = ResolveJobSpec(spec);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_EQ(automatic->tensor_parallel, kTensorParallelAuto);
  EXPECT_EQ(automatic->train.tensor_parallel, 2);  // checked as 1 x 4 x 2
  EXPECT_EQ(automatic->spec.compression().data_parallel().codec(), "fp16");
  EXPECT_EQ(ResolveJobSpec(automatic->spec).value().spec.SerializeAsString(),
            automatic->spec.SerializeAsString());
  // The planner gets every layout and skips those at T 1.
  const std::string one_rank =
      "spec.training.seq_len: one sequence of 8192 tokens needs a tensor of 2147483648 elements "
      "(the attention scores), above 2^31 - 1, and a micro-batch is already one sequence "
      "(micro_batches = batch_size); use a shorter seq_len or more tensor ranks "
      "(spec.parallelism.tensor)";
  EXPECT_EQ(ResolveDataParallelLayout(*automatic, LayoutDegrees{1, 8, 1}).status().message(),
            one_rank);
  EXPECT_TRUE(ResolveDataParallelLayout(*automatic, LayoutDegrees{2, 2, 2}).ok());
  // One worker has only T 1: refused with its error.
  spec.mutable_parallelism()->set_workers(1);
  ExpectRejected(spec, one_rank);
}

TEST(ResolveAsAutoLayout, AChosenLayoutsSpecBackToAutoOverOtherWorkers) {
  const ResolvedJobSpec automatic = ResolveJobSpec(AutoLayoutSpec(4, 4)).value();
  const ResolvedJobSpec two = ResolveDataParallelLayout(automatic, 2).value();
  const ResolvedJobSpec three = ResolveAsAutoLayout(two.spec, 3).value();
  EXPECT_EQ(three.data_parallel, kDataParallelAuto);
  EXPECT_EQ(three.layout_workers, 3);
  EXPECT_EQ(three.stages, 0);
  EXPECT_FALSE(three.spec.elastic().has_max_workers());
  // Back over the original 4: the spec the job was submitted with.
  EXPECT_EQ(ResolveAsAutoLayout(two.spec, 4).value().spec.SerializeAsString(),
            automatic.spec.SerializeAsString());
  // 6 units and 4 micro-batches: 5 workers fit 1 x 5; 7 fit nothing.
  EXPECT_EQ(ResolveAsAutoLayout(two.spec, 5).value().layout_workers, 5);
  EXPECT_TRUE(absl::StartsWith(ResolveAsAutoLayout(two.spec, 7).status().message(),
                               "spec.parallelism.workers: no layout of 7 workers"));
}

// A data-parallel codec with auto: kept in the auto spec (resolving again
// gives the same spec), taken by every layout with replicas, where the
// planner picks its stages, and dropped by the layout of one replica; a
// re-choice gets it back from what the job was submitted with.
TEST(ResolveJobSpec, DataParallelAuto_CodecKeptForTheLayoutsWithReplicas) {
  v1::JobSpec spec = AutoLayoutSpec(4, 4);
  spec.mutable_compression()->mutable_data_parallel()->set_codec("bf16");
  const ResolvedJobSpec automatic = ResolveJobSpec(spec).value();
  const v1::DataParallelCompressionSpec& dp = automatic.spec.compression().data_parallel();
  EXPECT_EQ(dp.codec(), "bf16");
  EXPECT_EQ(dp.stages_size(), 0);
  EXPECT_EQ(automatic.data_parallel_quantizer, "");  // comes with a layout
  EXPECT_EQ(ResolveJobSpec(automatic.spec).value().spec.SerializeAsString(),
            automatic.spec.SerializeAsString());
  const ResolvedJobSpec two = ResolveDataParallelLayout(automatic, 2).value();
  EXPECT_EQ(two.data_parallel_quantizer, "bf16");
  EXPECT_EQ(two.spec.compression().data_parallel().codec(), "bf16");
  const ResolvedJobSpec one = ResolveDataParallelLayout(automatic, 1).value();
  EXPECT_EQ(one.data_parallel_quantizer, "");
  EXPECT_EQ(one.spec.compression().data_parallel().codec(), "none");
  // From the one-replica layout back to auto: without the submitted
  // compression the codec is gone, with it the spec is the submitted one.
  EXPECT_EQ(ResolveAsAutoLayout(one.spec, 4).value().spec.compression().data_parallel().codec(),
            "none");
  EXPECT_EQ(ResolveAsAutoLayout(one.spec, 4, dp).value().spec.SerializeAsString(),
            automatic.spec.SerializeAsString());
  // 3 workers and 4 micro-batches: only 1 x 3; the codec waits (not an error).
  const ResolvedJobSpec three = ResolveAsAutoLayout(one.spec, 3, dp).value();
  EXPECT_EQ(three.spec.compression().data_parallel().codec(), "none");
  EXPECT_EQ(three.layout_workers, 3);
  v1::JobSpec powersgd = AutoLayoutSpec(4, 4);
  powersgd.mutable_compression()->mutable_data_parallel()->set_codec("powersgd:rank=2");
  EXPECT_EQ(ResolveDataParallelLayout(ResolveJobSpec(powersgd).value(), 4)
                .value()
                .data_parallel_powersgd_rank,
            2);
}

TEST(ResolveJobSpec, DataParallelAuto_WhatNeedsAKnownLayoutIsRefusedNamingTheField) {
  v1::JobSpec spec = AutoLayoutSpec(4, 4);
  spec.mutable_parallelism()->clear_workers();
  ExpectRejected(spec, "spec.parallelism.workers: required with spec.parallelism.data 0 (auto)");
  spec = AutoLayoutSpec(4, 4);
  spec.mutable_parallelism()->set_stages(2);
  ExpectRejected(spec, "spec.parallelism.stages: is chosen by the planner");
  spec = AutoLayoutSpec(3, 4);
  spec.mutable_parallelism()->set_tensor(2);
  ExpectRejected(spec,
                 "spec.parallelism.workers: 3 is not a multiple of spec.parallelism.tensor 2: "
                 "every stage takes 2 workers");
  spec = AutoLayoutSpec(4, 4);
  spec.mutable_parallelism()->set_tensor(65);
  ExpectRejected(spec, "spec.parallelism.tensor");
  spec = AutoLayoutSpec(4, 4);
  spec.mutable_parallelism()->set_solver("manual");
  ExpectRejected(spec, "spec.parallelism.solver: manual pins");
  spec = AutoLayoutSpec(4, 4);
  spec.mutable_compression()->mutable_data_parallel()->set_codec("powersgd:rank=2");
  spec.mutable_compression()->mutable_data_parallel()->add_stages(0);
  ExpectRejected(spec, "spec.compression.data_parallel.stages: name stages of a known layout");
  spec = AutoLayoutSpec(4, 4);
  spec.mutable_compression()->mutable_data_parallel()->set_codec("bf17");
  ExpectRejected(spec, "spec.compression.data_parallel.codec");
  // 3 workers and 2 micro-batches: only 1 x 3, nothing to compress.
  spec = AutoLayoutSpec(3, 2);
  spec.mutable_compression()->mutable_data_parallel()->set_codec("bf16");
  ExpectRejected(spec,
                 "spec.compression.data_parallel.codec: compresses the replicas' all-reduce, but "
                 "every layout of 3 workers has one replica");
  spec = AutoLayoutSpec(4, 4);
  spec.mutable_elastic()->set_max_workers(4);
  ExpectRejected(spec, "spec.elastic: min_workers and max_workers count one replica's stages");
  ExpectRejected(AutoLayoutSpec(7, 2),
                 "spec.parallelism.workers: no layout of 7 workers: the replicas D must divide "
                 "both the workers and spec.training.micro_batches 2, with workers / D stages at "
                 "most the model's 6 units");
  spec = AutoLayoutSpec(4, 4);  // the rest is checked as for a layout
  spec.mutable_training()->set_lr(-1);
  ExpectRejected(spec, "spec.training.lr");
  spec = MinimalSpec();  // workers belong to auto only
  spec.mutable_parallelism()->set_workers(2);
  ExpectRejected(spec, "spec.parallelism.workers: only with spec.parallelism.data 0 (auto)");
}

TEST(ResolveJobSpec, TensorParallel_DefaultsToOneAndIsKept) {
  EXPECT_EQ(ResolveJobSpec(MinimalSpec()).value().tensor_parallel, 1);
  EXPECT_EQ(ResolveJobSpec(MinimalSpec()).value().spec.parallelism().tensor(), 1);
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_parallelism()->set_tensor(2);
  const ResolvedJobSpec resolved = ResolveJobSpec(spec).value();
  EXPECT_EQ(resolved.tensor_parallel, 2);
  EXPECT_EQ(resolved.stages, 2);
}

TEST(ResolveJobSpec, TensorParallel_BadValuesRejectedNamingTheField) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_parallelism()->set_tensor(0);  // auto: with data auto only
  ExpectRejected(spec, "spec.parallelism.tensor: 0 (auto) only with spec.parallelism.data 0");
  spec.mutable_parallelism()->set_tensor(-1);
  ExpectRejected(spec, "spec.parallelism.tensor: must be >= 1, got -1");
  spec.mutable_parallelism()->set_tensor(65);
  ExpectRejected(spec, "spec.parallelism.tensor: ");
  spec = MinimalSpec();
  spec.mutable_parallelism()->set_tensor(3);
  ExpectRejected(spec,
                 "spec.parallelism.tensor: tensor parallelism of 3 does not divide model.n_head");
  // A vocabulary T does not divide is told the padded size that would do,
  // unless that is past the largest a spec accepts.
  spec = MinimalSpec();
  spec.mutable_model()->set_n_head(12);
  spec.mutable_model()->set_d_model(48);
  spec.mutable_model()->set_vocab_size(257);
  spec.mutable_parallelism()->set_tensor(3);
  ExpectRejected(spec,
                 "spec.parallelism.tensor: tensor parallelism of 3 does not divide "
                 "model.vocab_size 257 (pad it to a multiple of 3, e.g. 258;");
  spec.mutable_model()->set_vocab_size(kMaxVocabSize);
  ExpectRejected(spec,
                 "spec.parallelism.tensor: tensor parallelism of 3 does not divide "
                 "model.vocab_size 65536, and no vocabulary of at most 65536 above it is a "
                 "multiple of 3; choose a tensor that divides it");
  // Checkpoints and initial weights are unsplit tensors: any layout takes them.
  spec = MinimalSpec();
  spec.mutable_parallelism()->set_tensor(2);
  spec.mutable_checkpoint()->set_interval_steps(10);
  spec.mutable_init()->set_from("w.safetensors");
  EXPECT_TRUE(ResolveJobSpec(spec).ok());
  spec = MinimalSpec();
  spec.mutable_parallelism()->set_tensor(2);
  spec.mutable_compression()->set_backward("token_topk:keep=0.5");
  EXPECT_TRUE(ResolveJobSpec(spec).ok());  // the ranks sum their token scores
  spec = MinimalSpec();
  spec.mutable_parallelism()->set_tensor_partitions(2);
  ExpectRejected(spec, "spec.parallelism.tensor_partitions: needs tensor parallelism");
  spec.mutable_parallelism()->set_tensor(2);
  EXPECT_EQ(ResolveJobSpec(spec).value().spec.parallelism().tensor_partitions(), 2);
  spec.mutable_parallelism()->set_tensor_partitions(3);
  ExpectRejected(
      spec, "spec.parallelism.tensor_partitions: must be 0 (Alg. 1 per layer), 1, 2 or 4, got 3");
  spec.mutable_parallelism()->set_tensor_partitions(0);
  EXPECT_EQ(ResolveJobSpec(spec).value().tensor_partitions, 0);
  // Alg. 1's counts are checked by measurement for 2 steps each by default.
  EXPECT_EQ(ResolveJobSpec(spec).value().tensor_partitions_tune_steps, 2);
  spec.mutable_parallelism()->set_tensor_partitions_tune_steps(0);
  EXPECT_EQ(ResolveJobSpec(spec).value().tensor_partitions_tune_steps, 0);
  spec.mutable_parallelism()->set_tensor_partitions_tune_steps(17);
  ExpectRejected(spec, "spec.parallelism.tensor_partitions_tune_steps: must be 0..16, got 17");
  spec.mutable_parallelism()->set_tensor_partitions_tune_steps(-1);
  ExpectRejected(spec, "spec.parallelism.tensor_partitions_tune_steps: must be 0..16");
  spec.mutable_parallelism()->set_tensor_partitions_tune_steps(3);
  spec.mutable_parallelism()->set_tensor_partitions(2);
  ExpectRejected(spec,
                 "spec.parallelism.tensor_partitions_tune_steps: needs "
                 "spec.parallelism.tensor_partitions 0");
  spec.mutable_parallelism()->clear_tensor_partitions_tune_steps();
  EXPECT_EQ(ResolveJobSpec(spec).value().tensor_partitions_tune_steps, 0);
}

TEST(ResolveJobSpec, TensorMode_DefaultOneDThreeDNeedsACubeThatSplitsTheModel) {
  v1::JobSpec spec = MinimalSpec();  // 2 heads, d_model 16, vocabulary 256, 4 samples
  EXPECT_EQ(ResolveJobSpec(spec).value().tensor_mode, "1d");
  EXPECT_EQ(ResolveJobSpec(spec).value().spec.parallelism().tensor_mode(), "1d");
  spec.mutable_parallelism()->set_tensor(8);
  spec.mutable_parallelism()->set_tensor_mode("3d");
  EXPECT_EQ(ResolveJobSpec(spec).value().tensor_mode, "3d");
  // 1-D would need 8 to divide the 2 heads.
  spec.mutable_parallelism()->set_tensor_mode("1d");
  ExpectRejected(spec,
                 "spec.parallelism.tensor: tensor parallelism of 8 does not divide model.n_head");
  spec.mutable_parallelism()->set_tensor_mode("2d");
  ExpectRejected(spec, "spec.parallelism.tensor_mode: must be \"1d\" or \"3d\", got \"2d\"");
  spec.mutable_parallelism()->set_tensor_mode(std::string(40, 'x'));
  ExpectRejected(spec, "spec.parallelism.tensor_mode: ");
  spec.mutable_parallelism()->set_tensor_mode("3d");
  spec.mutable_parallelism()->set_tensor(4);  // not a cube
  ExpectRejected(spec, "spec.parallelism.tensor: 3-D tensor parallelism needs p^3 workers");
  spec.mutable_parallelism()->set_tensor(8);
  spec.mutable_model()->set_n_head(1);
  ExpectRejected(spec,
                 "spec.parallelism.tensor: 3-D tensor parallelism on a 2x2x2 cube needs p = "
                 "2 to divide model.n_head 1");
  spec = MinimalSpec();
  spec.mutable_parallelism()->set_tensor(8);
  spec.mutable_parallelism()->set_tensor_mode("3d");
  spec.mutable_model()->set_d_model(18);
  spec.mutable_model()->set_n_head(2);
  ExpectRejected(spec,
                 "spec.parallelism.tensor: 3-D tensor parallelism on a 2x2x2 cube needs "
                 "p^2 = 4 to divide model.d_model 18");
  spec = MinimalSpec();
  spec.mutable_parallelism()->set_tensor(8);
  spec.mutable_parallelism()->set_tensor_mode("3d");
  spec.mutable_model()->set_vocab_size(260);
  ExpectRejected(spec,
                 "spec.parallelism.tensor: 3-D tensor parallelism on a 2x2x2 cube needs "
                 "p^3 = 8 to divide model.vocab_size 260");
  spec = MinimalSpec();
  spec.mutable_parallelism()->set_tensor(8);
  spec.mutable_parallelism()->set_tensor_mode("3d");
  spec.mutable_training()->set_micro_batches(2);  // 2 samples each
  ExpectRejected(spec,
                 "spec.parallelism.tensor: 3-D tensor parallelism on a 2x2x2 cube needs "
                 "p^2 = 4 to divide the samples of a micro-batch");
  spec = MinimalSpec();
  spec.mutable_parallelism()->set_tensor(8);
  spec.mutable_parallelism()->set_tensor_mode("3d");
  spec.mutable_parallelism()->set_tensor_partitions(2);
  ExpectRejected(spec,
                 "spec.parallelism.tensor_partitions: must be 1 with "
                 "spec.parallelism.tensor_mode 3d");
  // Partitions 0 default the tune steps to 2: the refusal still names the
  // field the user set, not the default's.
  spec.mutable_parallelism()->set_tensor_partitions(0);
  ExpectRejected(spec,
                 "spec.parallelism.tensor_partitions: must be 1 with "
                 "spec.parallelism.tensor_mode 3d");
  spec.mutable_parallelism()->set_tensor_partitions(1);
  // Tuning needs partitions 0: said as the cube's rule, not as "needs
  // tensor_partitions 0", which the cube refuses in turn.
  spec.mutable_parallelism()->set_tensor_partitions_tune_steps(3);
  ExpectRejected(spec,
                 "spec.parallelism.tensor_partitions_tune_steps: must be 0 with "
                 "spec.parallelism.tensor_mode 3d");
  spec.mutable_parallelism()->clear_tensor_partitions_tune_steps();
  spec.mutable_parallelism()->set_tensor_compression("piecewise:bits=4");
  ExpectRejected(spec,
                 "spec.parallelism.tensor_compression: must be none with "
                 "spec.parallelism.tensor_mode 3d");
  spec.mutable_parallelism()->set_tensor_compression("none");
  // Token top-k on the stages' links: the cube's attention scores the
  // tokens as the 1-D ranks' does (CubeBlockUnit::TokenImportance).
  spec.mutable_compression()->set_forward("token_topk:keep=0.5");
  spec.mutable_compression()->set_backward("token_topk:keep=0.5");
  absl::StatusOr<ResolvedJobSpec> links = ResolveJobSpec(spec);
  ASSERT_TRUE(links.ok()) << links.status();
  EXPECT_EQ(links->spec.compression().forward(), "token_topk:keep=0.5");
  EXPECT_EQ(links->spec.parallelism().tensor_mode(), "3d");
  // D x P x T above the workers' bound names the tensor field.
  spec = MinimalSpec();
  spec.mutable_parallelism()->set_tensor(64);
  spec.mutable_parallelism()->set_tensor_mode("3d");
  spec.mutable_model()->set_n_head(4);
  spec.mutable_model()->set_d_model(32);
  spec.mutable_training()->set_batch_size(256);  // 16 samples per micro-batch
  spec.mutable_parallelism()->set_stages(2);
  spec.mutable_parallelism()->set_data(16);
  spec.mutable_training()->set_micro_batches(16);
  ExpectRejected(spec, "spec.parallelism.tensor: 16 replicas x 2 stages x 64 tensor ranks");
}

TEST(ResolveJobSpec, TensorCompression_DefaultNoneCodecsAcceptedBadOnesNamed) {
  v1::JobSpec spec = MinimalSpec();
  EXPECT_EQ(ResolveJobSpec(spec).value().tensor_compression, "none");
  spec.mutable_parallelism()->set_tensor_compression("token_topk:keep=0.5+piecewise:bits=3");
  ExpectRejected(spec, "spec.parallelism.tensor_compression: needs tensor parallelism");
  spec.mutable_parallelism()->set_tensor(2);
  EXPECT_EQ(ResolveJobSpec(spec).value().tensor_compression,
            "token_topk:keep=0.5+piecewise:bits=3");
  spec.mutable_parallelism()->set_tensor_compression("");
  EXPECT_EQ(ResolveJobSpec(spec).value().tensor_compression, "none");
  spec.mutable_parallelism()->set_tensor_compression("powersgd:rank=4");
  ExpectRejected(spec, "spec.parallelism.tensor_compression: \"powersgd:rank=4\" names powersgd");
  spec.mutable_parallelism()->set_tensor_compression("token_topk:keep=1.5");
  ExpectRejected(spec, "spec.parallelism.tensor_compression: token_topk: keep");
  spec.mutable_parallelism()->set_tensor_compression(std::string(300, 'x'));
  ExpectRejected(spec, "spec.parallelism.tensor_compression: ");
}

TEST(ResolveJobSpec, DataParallelCompression_DefaultNoneRankAndBadValuesNamed) {
  v1::JobSpec spec = MinimalSpec();
  EXPECT_EQ(ResolveJobSpec(spec).value().spec.compression().data_parallel().codec(), "none");
  spec.mutable_training()->set_micro_batches(4);
  spec.mutable_parallelism()->set_data(2);
  spec.mutable_compression()->mutable_data_parallel()->set_codec("powersgd:rank=2");
  spec.mutable_compression()->mutable_data_parallel()->add_stages(0);
  EXPECT_EQ(ResolveJobSpec(spec).value().data_parallel_powersgd_rank, 2);
  v1::JobSpec bad = spec;
  bad.mutable_compression()->mutable_data_parallel()->set_codec("token_topk:keep=0.5");
  ExpectRejected(bad,
                 "spec.compression.data_parallel.codec: \"token_topk:keep=0.5\" is not one "
                 "quantizer (fp16, bf16, linear:bits=N, piecewise:bits=N); an all-reduce "
                 "compresses with powersgd:rank=R or one of these quantizers");
  bad.mutable_compression()->mutable_data_parallel()->set_codec("fp16+piecewise:bits=3");
  ExpectRejected(bad, "spec.compression.data_parallel.codec: ");
  // A quantizer: kept as the codec's own spec, no rank.
  v1::JobSpec quantized = spec;
  quantized.mutable_compression()->mutable_data_parallel()->set_codec("piecewise:bits=3");
  const ResolvedJobSpec q = ResolveJobSpec(quantized).value();
  EXPECT_EQ(q.data_parallel_quantizer, "piecewise:bits=3");
  EXPECT_EQ(q.data_parallel_powersgd_rank, 0);
  EXPECT_EQ(ResolveJobSpec(spec).value().data_parallel_quantizer, "");
  bad = spec;
  bad.mutable_compression()->mutable_data_parallel()->set_codec("powersgd:rank=2000");
  ExpectRejected(bad, "spec.compression.data_parallel.codec: powersgd: rank 2000");
  bad = spec;
  bad.mutable_compression()->mutable_data_parallel()->add_stages(2);
  ExpectRejected(bad, "spec.compression.data_parallel.stages: stage 2 is repeated or not in");
  bad = spec;
  bad.mutable_parallelism()->set_data(1);
  ExpectRejected(bad, "spec.compression.data_parallel: needs data-parallel replicas");
  bad = spec;
  bad.mutable_compression()->mutable_data_parallel()->set_codec("none");
  ExpectRejected(bad, "spec.compression.data_parallel.stages: names stages but");
}

// One layer of d_model 14336 (2.47e9 parameters, within every model bound)
// on 8 replicas compressed with PowerSGD: mlp_0's checkpoint file holds its
// 8 d^2 + 7 d values 3 times (weights, m, v), 8 residuals of its two
// matrices and their warm starts, 72345706496 bytes, past the 64 GiB a
// worker reads back. Every checkpoint of such a job failed at the writer.
// CheckUnitFileSizes after ResolveJobSpec, as submit runs them.
absl::Status UnitFilesAtSubmit(const v1::JobSpec& spec) {
  absl::StatusOr<ResolvedJobSpec> resolved = ResolveJobSpec(spec);
  return resolved.ok() ? CheckUnitFileSizes(*resolved) : resolved.status();
}

void ExpectUnitFilesRejected(const v1::JobSpec& spec, const std::string& prefix) {
  const absl::Status status = UnitFilesAtSubmit(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StartsWith(status.message(), prefix))
      << "message: " << status.message() << "\nexpected prefix: " << prefix;
}

TEST(CheckUnitFileSizes, OverTheReadLimit_RejectedNamingDataParallelCompression) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_model()->set_n_layer(1);
  spec.mutable_model()->set_n_head(112);
  spec.mutable_model()->set_d_model(14336);
  spec.mutable_training()->set_seq_len(1024);
  spec.mutable_training()->set_batch_size(16);
  spec.mutable_training()->set_micro_batches(16);
  spec.mutable_parallelism()->set_data(8);
  spec.mutable_compression()->mutable_data_parallel()->set_codec("powersgd:rank=4");
  spec.mutable_checkpoint()->set_interval_steps(100);
  // ResolveJobSpec alone takes it: a job stored before the check (restored,
  // or resolved by a worker) runs on as it was.
  EXPECT_TRUE(ResolveJobSpec(spec).ok()) << ResolveJobSpec(spec).status();
  ExpectUnitFilesRejected(
      spec,
      "spec.compression.data_parallel: with checkpoints, unit mlp_0's file would hold "
      "72345706496 bytes of tensors (67.4 GiB: its weights, both AdamW moments and 8 "
      "replicas' error-feedback residuals of powersgd:rank=4), above the 68702699512 "
      "a worker reads back");
  // 4 replicas' residuals: 46039031808 bytes.
  v1::JobSpec fewer = spec;
  fewer.mutable_parallelism()->set_data(4);
  EXPECT_TRUE(UnitFilesAtSubmit(fewer).ok()) << UnitFilesAtSubmit(fewer);
  // Past kMaxFeedbackReplicasKept a checkpoint keeps their sum, one.
  v1::JobSpec summed = spec;
  summed.mutable_parallelism()->set_data(16);
  EXPECT_TRUE(UnitFilesAtSubmit(summed).ok()) << UnitFilesAtSubmit(summed);
  v1::JobSpec unsaved = spec;
  unsaved.mutable_checkpoint()->set_interval_steps(0);
  EXPECT_TRUE(UnitFilesAtSubmit(unsaved).ok()) << UnitFilesAtSubmit(unsaved);
  // Pinned stages (solver manual): only the compressed stage's units count.
  v1::JobSpec pinned = spec;
  v1::ParallelismSpec* p = pinned.mutable_parallelism();
  p->set_solver("manual");
  for (int begin : {0, 2}) {
    v1::ManualStage* stage = p->add_manual_stages();
    stage->set_forward_begin(begin);
    stage->set_forward_end(begin + 2);
    stage->set_backward_begin(begin);
    stage->set_backward_end(begin + 2);
  }
  pinned.mutable_compression()->mutable_data_parallel()->add_stages(0);  // embed, attn_0
  EXPECT_TRUE(UnitFilesAtSubmit(pinned).ok()) << UnitFilesAtSubmit(pinned);
  pinned.mutable_compression()->mutable_data_parallel()->set_stages(0, 1);  // mlp_0, head
  ExpectUnitFilesRejected(pinned,
                          "spec.compression.data_parallel: with checkpoints, unit mlp_0's file");
}

TEST(ResolveJobSpec, NegativeEvalInterval_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_training()->set_eval_interval(-1);
  ExpectRejected(spec, "spec.training.eval_interval: must be in [0, 100000000]");
}

// Fields with a default are not "required" when a given value is refused.
TEST(ResolveJobSpec, ZeroEvalWindows_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_training()->set_eval_windows(0);
  ExpectRejected(spec, "spec.training.eval_windows: must be >= 1, got 0");
  spec = MinimalSpec();
  spec.mutable_data()->set_synthetic_bytes(-5);
  ExpectRejected(spec, "spec.data.synthetic_bytes: must be >= 1, got -5");
  // Unused with a corpus file, but stored and shown: bounded all the same.
  const std::string corpus = TempPath("bounded_anyway.bin");
  ASSERT_TRUE(WriteUint16TokenFile(corpus, {1, 2, 3, 99}, /*with_header=*/false).ok());
  spec.mutable_data()->set_path(corpus);
  spec.mutable_data()->set_format("uint16");
  ExpectRejected(spec, "spec.data.synthetic_bytes: must be >= 1, got -5");
  spec = MinimalSpec();
  spec.mutable_training()->set_micro_batches(0);
  ExpectRejected(spec, "spec.training.micro_batches: must be >= 1, got 0");
}

TEST(ResolveJobSpec, EvalWithoutValidationSplit_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_training()->set_eval_interval(10);
  spec.mutable_data()->set_val_fraction(0);
  ExpectRejected(spec, "spec.training.eval_interval: needs a validation split");
}

TEST(ResolveJobSpec, CompressionCodecs_AcceptedAndKept) {
  v1::JobSpec spec = MinimalSpec();
  v1::CompressionSpec* c = spec.mutable_compression();
  c->set_forward("token_topk:keep=0.5+piecewise:bits=3");
  c->set_backward("powersgd:rank=4");
  c->set_error_feedback(true);
  c->set_epilogue_only(true);
  absl::StatusOr<ResolvedJobSpec> resolved = ResolveJobSpec(spec);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->spec.compression().forward(), "token_topk:keep=0.5+piecewise:bits=3");
  EXPECT_EQ(resolved->spec.compression().backward(), "powersgd:rank=4");
  EXPECT_TRUE(resolved->spec.compression().error_feedback());
  EXPECT_TRUE(resolved->spec.compression().epilogue_only());
}

TEST(ResolveJobSpec, EmptyCodec_MeansNone) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_compression()->set_forward("");
  absl::StatusOr<ResolvedJobSpec> resolved = ResolveJobSpec(spec);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->spec.compression().forward(), "none");
}

TEST(ResolveJobSpec, UnknownCodec_RejectedNamingTheField) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_compression()->set_forward("zstd");
  ExpectRejected(spec, "spec.compression.forward: ");
  absl::Status status = ResolveJobSpec(spec).status();
  EXPECT_TRUE(absl::StrContains(status.message(), "zstd")) << status;
}

TEST(ResolveJobSpec, BitsOutOfRange_RejectedNamingTheParameter) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_compression()->set_backward("piecewise:bits=12");
  ExpectRejected(spec, "spec.compression.backward: ");
  absl::Status status = ResolveJobSpec(spec).status();
  EXPECT_TRUE(absl::StrContains(status.message(), "bits")) << status;
}

TEST(ResolveJobSpec, RankZero_RejectedNamingTheParameter) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_compression()->set_backward("powersgd:rank=0");
  ExpectRejected(spec, "spec.compression.backward: ");
  absl::Status status = ResolveJobSpec(spec).status();
  EXPECT_TRUE(absl::StrContains(status.message(), "rank")) << status;
}

// Generated text's splits are known at submit: a validation split too
// short for one window is refused there, naming the field.
TEST(ResolveJobSpec, GeneratedSplitsTooShort_RejectedNamingTheField) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_data()->clear_path();
  spec.mutable_data()->set_synthetic_bytes(1000);
  spec.mutable_training()->set_seq_len(128);
  spec.mutable_model()->set_max_seq_len(128);
  spec.mutable_data()->set_val_fraction(0.1);  // 100 tokens < 129
  ExpectRejected(spec, "spec.data.val_fraction: 0.1 of 1000 generated bytes");
  spec.mutable_data()->set_val_fraction(0);
  spec.mutable_data()->set_synthetic_bytes(100);
  ExpectRejected(spec, "spec.data.synthetic_bytes: 100 bytes leave a train split of 100 tokens");
  spec.mutable_data()->set_synthetic_bytes(1000);
  EXPECT_TRUE(ResolveJobSpec(spec).ok()) << ResolveJobSpec(spec).status();
}

// A pipeline link's PowerSGD rank at d_model, or above it inside
// token_topk, makes factors that outgrow the tensor (and the encode cost
// grows with the rank squared): refused naming both. Below d_model too
// when its factors still outweigh the link's tensor: here [4, 8, 16], 32
// rows of 16, smaller only below rank 32 x 16 / 48 = 10.7 (less the
// header).
TEST(ResolveJobSpec, PowerSgdRankNotBelowDModel_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  const int d_model = spec.model().d_model();
  spec.mutable_compression()->set_forward("powersgd:rank=8");
  EXPECT_TRUE(CheckLinkCodecsSmaller(ResolveJobSpec(spec).value()).ok());
  // Resolved (a stored job of an earlier version still restores), refused
  // at submit.
  spec.mutable_compression()->set_forward(absl::StrCat("powersgd:rank=", d_model - 1));
  absl::StatusOr<ResolvedJobSpec> larger = ResolveJobSpec(spec);
  ASSERT_TRUE(larger.ok()) << larger.status();
  const absl::Status refused = CheckLinkCodecsSmaller(*larger);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(
      refused.message(),
      "spec.compression.forward: \"powersgd:rank=15\" sends 2914 bytes for each link "
      "tensor [4, 8, 16], more than its 2048 bytes in fp32"))
      << refused;
  spec.mutable_compression()->set_forward(absl::StrCat("powersgd:rank=", d_model));
  ExpectRejected(spec, absl::StrCat("spec.compression.forward: powersgd: rank ", d_model,
                                    " is not below d_model ", d_model));
  spec.mutable_compression()->set_forward("none");
  spec.mutable_compression()->set_backward(
      absl::StrCat("token_topk:keep=0.5+powersgd:rank=", d_model + 1));
  ExpectRejected(spec, "spec.compression.backward: powersgd: rank ");
}

TEST(ResolveJobSpec, ErrorFeedbackWithoutBackwardCodec_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_compression()->set_forward("fp16");
  spec.mutable_compression()->set_error_feedback(true);
  ExpectRejected(spec, "spec.compression.error_feedback: needs a backward codec");
}

TEST(ResolveJobSpec, EpilogueOnlyWithoutBackwardCodec_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_compression()->set_epilogue_only(true);
  ExpectRejected(spec, "spec.compression.epilogue_only: needs a backward codec");
}

TEST(JobSpecFromJson, CompressionFromJson_Parsed) {
  absl::StatusOr<v1::JobSpec> spec = JobSpecFromJson(
      R"({"compression": {"backward": "powersgd:rank=4", "errorFeedback": true,
                          "epilogue_only": true}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->compression().backward(), "powersgd:rank=4");
  EXPECT_TRUE(spec->compression().error_feedback());
  EXPECT_TRUE(spec->compression().epilogue_only());
}

TEST(ResolveJobSpec, AbsoluteOrEscapingOutputPath_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_output()->set_weights_path("/etc/x");
  ExpectRejected(spec, "spec.output.weights_path: must be a relative path");
  spec.mutable_output()->set_weights_path("../x");
  ExpectRejected(spec, "spec.output.weights_path: \".\" and \"..\" components are not allowed");
}

// The coordinator removes "<name>.tmp.<pid>.<n>" files as abandoned when
// a job writing <name> ends: no job's weights may be named like one.
TEST(ResolveJobSpec, OutputPathLikeATemporary_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_output()->set_weights_path("runs/w.tmp.1.1");
  ExpectRejected(spec,
                 "spec.output.weights_path: \"runs/w.tmp.1.1\" ends like a temporary file "
                 "(.tmp.N.M)");
  spec.mutable_output()->set_weights_path("runs.tmp.1.1/w");  // a directory may
  EXPECT_TRUE(ResolveJobSpec(spec).ok());
}

TEST(ResolveJobSpec, OutputPathIsDirectory_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_output()->set_weights_path(TempPath(""));
  ExpectRejected(spec, "spec.output.weights_path: ");
}

// A value just past a bound is printed so that it reads as past it.
TEST(ResolveJobSpec, ValuesJustPastABound_PrintedExactly) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_training()->set_grad_clip(1000001);
  ExpectRejected(spec, "spec.training.grad_clip: must be in [0, 1e6], got 1000001");
  spec = MinimalSpec();
  spec.mutable_training()->set_lr(0.001);
  spec.mutable_training()->set_min_lr(std::nextafter(0.001f, 1.0f));
  ExpectRejected(spec,
                 "spec.training.min_lr: must be in [0, spec.training.lr 0.001], got "
                 "0.0010000002");
}

// min_lr floors the cosine schedule: above 0 with the constant one (the
// default, given or not) it is refused naming both fields; 0, or cosine,
// passes.
TEST(CheckMinLrHasACosine, OnlyWithTheConstantScheduleAndAFloor) {
  v1::JobSpec spec;
  EXPECT_TRUE(CheckMinLrHasACosine(spec).ok());
  spec.mutable_training()->set_min_lr(1e-4f);
  for (const char* schedule : {"", "constant"}) {
    if (*schedule != '\0') spec.mutable_training()->set_lr_schedule(schedule);
    const absl::Status refused = CheckMinLrHasACosine(spec);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << schedule;
    EXPECT_TRUE(absl::StartsWith(refused.message(), "spec.training.min_lr: ")) << refused;
    EXPECT_TRUE(absl::StrContains(refused.message(), "spec.training.lr_schedule")) << refused;
  }
  spec.mutable_training()->set_lr_schedule("cosine");
  EXPECT_TRUE(CheckMinLrHasACosine(spec).ok());
}

// The unknown field is named as a path, as the other checks name fields
// (the BadRequest violation's field then is the field itself, not "spec").
TEST(JobSpecFromJson, UnknownField_RejectedNamingItsPath) {
  for (const auto& [json, message] : std::vector<std::pair<std::string, std::string>>{
           {R"({"model": {"nLayers": 2}})",
            "spec.model.nLayers: unknown field; did you mean nLayer? "
            "(proto/pipetrain/v1/job.proto lists JobSpec's fields)"},
           {R"({"bogus": 1})",
            "spec.bogus: unknown field (proto/pipetrain/v1/job.proto lists JobSpec's fields)"},
           {R"({"trainig": {}})", "spec.trainig: unknown field; did you mean training? "},
           {R"({"training": {"seq_lenn": 8}})",
            "spec.training.seq_lenn: unknown field; did you "
            "mean seqLen? "},
           {R"({"elastic": {"minWorkers": 1, "x_y": 2}})", "spec.elastic.x_y: unknown field"}}) {
    const absl::StatusOr<v1::JobSpec> spec = JobSpecFromJson(json);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << json;
    EXPECT_TRUE(absl::StartsWith(spec.status().message(), message)) << spec.status().message();
  }
}

TEST(JobSpecFromJson, EmptyText_SaysSo) {
  for (const char* json : {"", "  \n"}) {
    EXPECT_EQ(JobSpecFromJson(json).status().message(),
              "spec: the JSON text is empty; send a JobSpec object (docs/api.md), e.g. {}");
  }
}

TEST(JobSpecFromJson, WrongType_RejectedNamingTheFieldsPath) {
  // The parser says "(model.n_layer): invalid value ..."; the message names
  // it as the later checks name fields, so the BadRequest violation does.
  for (const auto& [json, prefix] : std::vector<std::pair<std::string, std::string>>{
           {R"({"model": {"nLayer": "two"}})", "spec.model.n_layer: invalid value"},
           {R"({"training": {"steps": 10.5}})", "spec.training.steps: "},
           {R"({"training": {"seed": "-1"}})", "spec.training.seed: "}}) {
    const absl::StatusOr<v1::JobSpec> spec = JobSpecFromJson(json);
    ASSERT_FALSE(spec.ok()) << json;
    EXPECT_TRUE(absl::StartsWith(spec.status().message(), prefix)) << spec.status().message();
  }
}

TEST(JobSpecFromJson, MalformedJson_Rejected) {
  absl::StatusOr<v1::JobSpec> spec = JobSpecFromJson(R"({"model": )");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(spec.status().message(), "spec: ")) << spec.status().message();
}

}  // namespace
}  // namespace pipetrain

namespace pipetrain {
namespace {

// Every documented bound (job_spec.h kMax...): the value at the bound is
// accepted, one beyond it is rejected naming the field and the limit.
TEST(ResolveJobSpecBounds, EveryBound_AtIsAcceptedBeyondIsRejected) {
  const std::vector<SpecBound> bounds = SpecBounds();
  EXPECT_EQ(bounds.size(), 17u);
  for (const SpecBound& b : bounds) {
    SCOPED_TRACE(b.field);
    absl::StatusOr<ResolvedJobSpec> ok = ResolveJobSpec(b.At());
    EXPECT_TRUE(ok.ok()) << ok.status();
    ExpectRejected(b.Beyond(), b.beyond_message);
  }
}

TEST(ResolveJobSpecBounds, DerivedLimits_Rejected) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_model()->set_n_layer(1000000000);
  ExpectRejected(spec, "spec.model.n_layer: 1000000000 exceeds the limit of 256");
  spec = MinimalSpec();  // 256 layers of d 8192: 206e9 parameters
  spec.mutable_model()->set_n_layer(256);
  spec.mutable_model()->set_d_model(8192);
  ExpectRejected(spec, "spec.model: the model has ");
  spec = MinimalSpec();
  spec.mutable_training()->set_seq_len(32768);
  spec.mutable_training()->set_batch_size(4096);
  spec.mutable_model()->set_max_seq_len(65536);
  ExpectRejected(spec, "spec.training.batch_size: batch_size * seq_len = 134217728 tokens");
  spec = MinimalSpec();
  spec.mutable_parallelism()->set_solver(std::string(1 << 20, 'z'));
  absl::Status status = ResolveJobSpec(spec).status();
  EXPECT_LT(status.message().size(), 400u) << "the echo of a client string is cut short";
}

// Job names are listed on every user's terminal (pipetrain jobs): no
// escape sequences, line breaks or bidirectional overrides; other Unicode
// is fine.
TEST(ResolveJobSpec, NameWithTerminalControls_InvalidArgumentAtItsByte) {
  v1::JobSpec spec = MinimalSpec();
  spec.set_name("r\xc3\xa9sum\xc3\xa9 \xe6\x97\xa5");
  EXPECT_TRUE(ResolveJobSpec(spec).ok());
  for (const auto& [name, at] : std::vector<std::pair<std::string, int>>{
           {"a\x1b]0;pwned\x07", 1}, {"run\r\nfake-line", 3}, {"x\xe2\x80\xae" "exe", 1}}) {
    spec.set_name(name);
    const absl::Status status = ResolveJobSpec(spec).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_EQ(status.message(),
              absl::StrCat("spec.name: has a control character at byte ", at,
                           " (escape sequences, line breaks and bidirectional overrides are not "
                           "allowed: others' terminals list the name)"));
  }
}

// A data path is logged by the coordinator and the workers: the same
// characters are refused as in a name.
TEST(ResolveJobSpec, DataPathWithTerminalControls_InvalidArgumentAtItsByte) {
  v1::JobSpec spec = MinimalSpec();
  spec.mutable_data()->set_path("corpora/r\xc3\xa9sum\xc3\xa9.txt");
  EXPECT_TRUE(ResolveJobSpec(spec).ok()) << ResolveJobSpec(spec).status();
  for (const auto& [path, at] :
       std::vector<std::pair<std::string, int>>{{"a\x1b[31m.txt", 1},
                                                {"x.txt\ny is not a readable file", 5},
                                                {"d/\xe2\x80\xaet.txt", 2}}) {
    spec.mutable_data()->set_path(path);
    const absl::Status status = ResolveJobSpec(spec).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << path;
    EXPECT_EQ(status.message(),
              absl::StrCat("spec.data.path: has a control character at byte ", at,
                           " (escape sequences, line breaks and bidirectional overrides are not "
                           "allowed: the path is logged)"));
  }
}

// Over gRPC a spec may carry fields this build does not know; they would
// be stored and served back with the job. Refused, naming the message.
TEST(ResolveJobSpec, UnknownFields_InvalidArgumentNamingTheMessage) {
  v1::JobSpec spec = MinimalSpec();
  spec.GetReflection()->MutableUnknownFields(&spec)->AddLengthDelimited(9999, std::string(64, 'x'));
  absl::Status status = ResolveJobSpec(spec).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "spec: has field number 9999, which this coordinator does not know (a newer "
            "client's field?); remove it");
  spec = MinimalSpec();
  v1::TrainingSpec* training = spec.mutable_training();
  training->GetReflection()->MutableUnknownFields(training)->AddVarint(77, 1);
  status = ResolveJobSpec(spec).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("spec.training: has field number 77"), std::string::npos)
      << status;
  // Parsed from the wire, as gRPC does.
  std::string wire = MinimalSpec().SerializeAsString();
  wire += std::string("\xf8\x9c\x04\x01");  // field 8655, varint 1
  v1::JobSpec parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire));
  EXPECT_EQ(ResolveJobSpec(parsed).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ResolveJobSpec, CheckpointAndElastic_BoundsNamed) {
  struct Case {
    std::function<void(v1::JobSpec*)> edit;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](v1::JobSpec* s) { s->mutable_checkpoint()->set_interval_steps(-1); },
       "spec.checkpoint.interval_steps"},
      {[](v1::JobSpec* s) { s->mutable_checkpoint()->set_interval_steps(1000001); },
       "spec.checkpoint.interval_steps"},
      {[](v1::JobSpec* s) { s->mutable_checkpoint()->set_keep(0); }, "spec.checkpoint.keep"},
      {[](v1::JobSpec* s) { s->mutable_checkpoint()->set_keep(101); }, "spec.checkpoint.keep"},
      {[](v1::JobSpec* s) { s->mutable_checkpoint()->set_dir("../x"); }, "spec.checkpoint.dir"},
      {[](v1::JobSpec* s) { s->mutable_checkpoint()->set_dir("/abs"); }, "spec.checkpoint.dir"},
      {[](v1::JobSpec* s) { s->mutable_init()->set_from("../weights.safetensors"); },
       "spec.init.from"},
      {[](v1::JobSpec* s) { s->mutable_training()->set_grad_clip(-1); }, "spec.training.grad_clip"},
      {[](v1::JobSpec* s) { s->mutable_training()->set_lr_schedule("linear"); },
       "spec.training.lr_schedule"},
      {[](v1::JobSpec* s) { s->mutable_training()->set_warmup_steps(-1); },
       "spec.training.warmup_steps"},
      {[](v1::JobSpec* s) { s->mutable_training()->set_warmup_steps(s->training().steps() + 1); },
       "spec.training.warmup_steps"},
      {[](v1::JobSpec* s) { s->mutable_training()->set_min_lr(1.0f); }, "spec.training.min_lr"},
      {[](v1::JobSpec* s) { s->mutable_elastic()->set_min_workers(0); },
       "spec.elastic.min_workers"},
      {[](v1::JobSpec* s) { s->mutable_elastic()->set_min_workers(3); },
       "spec.elastic.min_workers"},
      {[](v1::JobSpec* s) { s->mutable_elastic()->set_max_workers(1); },
       "spec.elastic.max_workers"},
      {[](v1::JobSpec* s) { s->mutable_elastic()->set_max_workers(7); },  // 6 units
       "spec.elastic.max_workers"},
  };
  for (const Case& c : cases) {
    v1::JobSpec spec = MinimalSpec();
    c.edit(&spec);
    absl::Status status = ResolveJobSpec(spec).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_TRUE(absl::StartsWith(status.message(), c.field + ":")) << status;
  }
  v1::JobSpec manual = MinimalSpec();
  manual.mutable_parallelism()->set_solver("manual");
  for (int s = 0; s < 2; ++s) {
    v1::ManualStage* m = manual.mutable_parallelism()->add_manual_stages();
    m->set_forward_begin(3 * s), m->set_forward_end(3 * s + 3);
    m->set_backward_begin(3 * s), m->set_backward_end(3 * s + 3);
  }
  absl::StatusOr<ResolvedJobSpec> pinned = ResolveJobSpec(manual);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  EXPECT_EQ(pinned->spec.elastic().min_workers(), 2);
  manual.mutable_elastic()->set_min_workers(1);
  EXPECT_TRUE(absl::StartsWith(ResolveJobSpec(manual).status().message(), "spec.elastic:"));
}

}  // namespace
}  // namespace pipetrain
