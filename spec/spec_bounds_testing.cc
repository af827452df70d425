#include "spec/spec_bounds_testing.h"

#include "spec/job_spec.h"

namespace pipetrain {

v1::JobSpec BoundsBaseSpec() {
  v1::JobSpec spec;
  spec.set_name("bounds");
  spec.mutable_model()->set_n_layer(2);
  spec.mutable_model()->set_n_head(2);
  spec.mutable_model()->set_d_model(16);
  spec.mutable_training()->set_seq_len(8);
  spec.mutable_training()->set_batch_size(4);
  spec.mutable_training()->set_steps(10);
  spec.mutable_parallelism()->set_stages(2);
  return spec;
}

v1::JobSpec SpecBound::At() const {
  v1::JobSpec spec = BoundsBaseSpec();
  set(spec, limit);
  return spec;
}

v1::JobSpec SpecBound::Beyond() const {
  v1::JobSpec spec = BoundsBaseSpec();
  set(spec, limit + 1);
  return spec;
}

// The model stays small so derived limits do not trip first.
std::vector<SpecBound> SpecBounds() {
  return {
      {"spec.model.n_layer", [](v1::JobSpec& s, int64_t v) { s.mutable_model()->set_n_layer(v); },
       kMaxLayers, "spec.model.n_layer: 257 exceeds the limit of 256"},
      {"spec.model.n_head",
       [](v1::JobSpec& s, int64_t v) {
         s.mutable_model()->set_n_head(v);
         s.mutable_model()->set_d_model(v == kMaxHeads ? 1024 : 2050);
       },
       kMaxHeads, "spec.model.n_head: 1025 exceeds the limit of 1024"},
      {"spec.model.d_model",
       [](v1::JobSpec& s, int64_t v) {
         s.mutable_model()->set_d_model(v);
         s.mutable_model()->set_n_layer(1);
       },
       kMaxDModel, "spec.model.d_model: 16385 exceeds the limit of 16384"},
      {"spec.training.seq_len",
       [](v1::JobSpec& s, int64_t v) {
         s.mutable_training()->set_seq_len(v);
         s.mutable_training()->set_batch_size(1);
         s.mutable_training()->set_micro_batches(1);
         // One head: 32768^2 attention scores a head fit under 2^31.
         s.mutable_model()->set_n_head(1);
       },
       kMaxTrainingSeqLen, "spec.training.seq_len: 32769 exceeds the limit of 32768"},
      {"spec.model.max_seq_len",
       [](v1::JobSpec& s, int64_t v) { s.mutable_model()->set_max_seq_len(v); }, kMaxSeqLen,
       "spec.model.max_seq_len: 65537 exceeds the limit of 65536"},
      {"spec.training.batch_size",
       [](v1::JobSpec& s, int64_t v) { s.mutable_training()->set_batch_size(v); }, kMaxBatchSize,
       "spec.training.batch_size: 65537 exceeds the limit of 65536"},
      {"spec.training.micro_batches",
       [](v1::JobSpec& s, int64_t v) {
         s.mutable_training()->set_batch_size(v == kMaxMicroBatches ? 4096 : 8194);
         s.mutable_training()->set_micro_batches(v);
       },
       kMaxMicroBatches, "spec.training.micro_batches: 4097 exceeds the limit of 4096"},
      {"spec.training.steps", [](v1::JobSpec& s, int64_t v) { s.mutable_training()->set_steps(v); },
       kMaxSteps, "spec.training.steps: 100000001 exceeds the limit of 100000000"},
      {"spec.training.eval_interval",
       [](v1::JobSpec& s, int64_t v) { s.mutable_training()->set_eval_interval(v); }, kMaxSteps,
       "spec.training.eval_interval: must be in [0, 100000000]"},
      {"spec.training.eval_windows",
       [](v1::JobSpec& s, int64_t v) { s.mutable_training()->set_eval_windows(v); },
       kMaxEvalWindows, "spec.training.eval_windows: 65537 exceeds the limit of 65536"},
      {"spec.data.synthetic_bytes",
       [](v1::JobSpec& s, int64_t v) { s.mutable_data()->set_synthetic_bytes(v); },
       kMaxSyntheticBytes, "spec.data.synthetic_bytes: 1073741825 exceeds the limit of 1073741824"},
      {"spec.parallelism.data",
       [](v1::JobSpec& s, int64_t v) {
         s.mutable_parallelism()->set_stages(1);
         s.mutable_training()->set_batch_size(1024);
         s.mutable_training()->set_micro_batches(1024);
         s.mutable_parallelism()->set_data(v);
       },
       kMaxStages, "spec.parallelism.data: 1025 exceeds the limit of 1024"},
      {"spec.parallelism.workers",
       [](v1::JobSpec& s, int64_t v) {  // data 0 (auto): 1024 workers as 256 x 4 and up
         s.mutable_parallelism()->set_stages(0);
         s.mutable_training()->set_batch_size(1024);
         s.mutable_training()->set_micro_batches(1024);
         s.mutable_parallelism()->set_data(0);
         s.mutable_parallelism()->set_workers(v);
       },
       kMaxStages, "spec.parallelism.workers: 1025 exceeds the limit of 1024"},
      {"spec.parallelism.stages",
       [](v1::JobSpec& s, int64_t v) {
         s.mutable_model()->set_n_layer(kMaxLayers);  // 514 units
         s.mutable_model()->set_d_model(2);
         s.mutable_model()->set_n_head(1);
         s.mutable_parallelism()->set_stages(v);
       },
       2 * kMaxLayers + 2, "spec.parallelism.stages: 515 stages but the model has only 514 units"},
      {"spec.name", [](v1::JobSpec& s, int64_t v) { s.set_name(std::string(v, 'n')); },
       kMaxJobNameBytes, "spec.name: 129 bytes exceeds the limit of 128"},
      {"spec.compression.forward",
       [](v1::JobSpec& s, int64_t v) {
         s.mutable_compression()->set_forward(v == kMaxCodecSpecBytes ? "fp16"
                                                                      : std::string(v, 'x'));
       },
       kMaxCodecSpecBytes, "spec.compression.forward: 257 bytes exceeds the limit of 256"},
      {"spec.scheduling.queue_timeout",
       [](v1::JobSpec& s, int64_t v) {
         s.mutable_scheduling()->mutable_queue_timeout()->set_seconds(v);
       },
       kMaxQueueTimeoutSeconds, "spec.scheduling.queue_timeout: must be in [1s, 604800s]"},
  };
}

}  // namespace pipetrain
