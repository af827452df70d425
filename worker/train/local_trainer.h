// Single-process reference trainer: the whole model in one process, on one
// Backend (the CPU by default, or a GPU), gradient accumulation over
// micro-batches, AdamW, evaluation, checkpoints (checkpoint.h).
//
// Every distributed run is checked against this trainer (DESIGN.md §4): for
// iteration t the samples are dataset.TrainBatch(seed, t, ...), micro-batch k
// holds samples [k*mb, (k+1)*mb), and each micro-batch's loss gradient is
// scaled by 1/micro_batches, so the accumulated gradient is that of the mean
// loss over all batch_size * seq_len positions.
//
// Not thread-safe.
#ifndef PIPETRAIN_WORKER_TRAIN_LOCAL_TRAINER_H_
#define PIPETRAIN_WORKER_TRAIN_LOCAL_TRAINER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/data/dataset.h"
#include "worker/model/gpt_model.h"
#include "worker/train/adamw_optimizer.h"
#include "worker/train/train_config.h"

namespace pipetrain {

struct StepResult {
  int64_t step = 0;   // 1-based number of the step just taken
  float loss = 0.0f;  // mean training loss over the step's batch
};

class LocalTrainer {
 public:
  // Validates `config` (INVALID_ARGUMENT, see ValidateTrainConfig) and that
  // the dataset's seq_len equals config.seq_len. `dataset` and `backend`
  // must outlive the trainer. Initialises the model from config.seed.
  static absl::StatusOr<std::unique_ptr<LocalTrainer>> Create(const TrainConfig& config,
                                                              const Dataset* dataset,
                                                              Backend* backend = CpuBackend());

  // Runs one optimizer step (iteration step() of the data order). Fails
  // only on a device backend, with its error (backend.h); the model's state
  // is then unusable.
  absl::StatusOr<StepResult> Step();

  // Mean validation loss over the first min(eval_windows, available)
  // validation windows. FAILED_PRECONDITION when the dataset has no
  // validation split; a device backend's error.
  absl::StatusOr<float> Evaluate();

  int64_t step() const { return optimizer_.steps_taken(); }
  // CorpusSha256 of the dataset's tokens (train split, then val split):
  // what checkpoints record so that a resume reads the same tokens. Hashed
  // on the first call only (a large corpus takes seconds).
  const std::string& corpus_sha256();
  const Dataset& dataset() const { return *dataset_; }
  const TrainConfig& config() const { return config_; }
  GptModel& model() { return *model_; }
  AdamWOptimizer& optimizer() { return optimizer_; }

 private:
  LocalTrainer(const TrainConfig& config, const Dataset* dataset,
               std::unique_ptr<GptModel> model);
  TrainConfig config_;
  const Dataset* dataset_;
  std::unique_ptr<GptModel> model_;
  AdamWOptimizer optimizer_;
  std::string corpus_sha256_;  // empty until corpus_sha256() is called
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_TRAIN_LOCAL_TRAINER_H_
