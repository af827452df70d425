#include "worker/train/local_trainer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/data/corpus.h"
#include "worker/train/grad_clip.h"
#include "worker/train/lr_schedule.h"

namespace pipetrain {

absl::StatusOr<std::unique_ptr<LocalTrainer>> LocalTrainer::Create(const TrainConfig& config,
                                                                   const Dataset* dataset,
                                                                   Backend* backend) {
  RETURN_IF_ERROR(ValidateTrainConfig(config));
  if (dataset->seq_len() != config.seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("dataset seq_len ", dataset->seq_len(),
                                                   " != training seq_len ", config.seq_len));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<GptModel> model,
                   GptModel::Create(config.model, config.seed, backend));
  RETURN_IF_ERROR(backend->status());
  return std::unique_ptr<LocalTrainer>(new LocalTrainer(config, dataset, std::move(model)));
}

LocalTrainer::LocalTrainer(const TrainConfig& config, const Dataset* dataset,
                           std::unique_ptr<GptModel> model)
    : config_(config),
      dataset_(dataset),
      model_(std::move(model)),
      optimizer_(config.adam, config.decay, model_->backend()) {}

const std::string& LocalTrainer::corpus_sha256() {
  if (corpus_sha256_.empty()) corpus_sha256_ = CorpusSha256(dataset_->tokens());
  return corpus_sha256_;
}

absl::StatusOr<StepResult> LocalTrainer::Step() {
  const int64_t iteration = step();
  const int micro = config_.micro_batches;
  const int per_micro = config_.batch_size / micro;
  model_->ZeroGrads();
  // Read at the step's end: a device backend queues the micro-batches
  // without waiting for each loss.
  std::vector<Tensor> losses;
  for (int k = 0; k < micro; ++k) {
    TokenBatch batch = dataset_->TrainBatch(config_.seed, iteration, int64_t{k} * per_micro,
                                            per_micro);
    losses.push_back(model_->ForwardBackwardDeferred(batch, 1.0f / micro));
  }
  model_->ReduceTiedGradients();
  // No optimizer step (nor its step count) on a failed device's garbage.
  RETURN_IF_ERROR(model_->backend()->status());
  const std::vector<Parameter*> params = model_->parameters();
  // In parameter order, each parameter's squares alone (grad_clip.h).
  ClipGradientsByGlobalNorm(model_->backend(), params, config_.grad_clip);
  optimizer_.set_lr(LearningRate(config_, optimizer_.steps_taken()));
  optimizer_.Step(params);
  double loss_sum = 0.0;  // in micro-batch order
  for (const Tensor& loss : losses) loss_sum += LossValue(model_->backend(), loss);
  RETURN_IF_ERROR(model_->backend()->status());
  return StepResult{step(), static_cast<float>(loss_sum / micro)};
}

absl::StatusOr<float> LocalTrainer::Evaluate() {
  const int64_t windows = std::min<int64_t>(config_.eval_windows, dataset_->num_val_windows());
  if (windows == 0) {
    return absl::FailedPreconditionError(
        "no validation split: set a validation fraction > 0 or use a larger file");
  }
  const int per_batch = config_.batch_size / config_.micro_batches;
  double weighted = 0.0;
  for (int64_t first = 0; first < windows; first += per_batch) {
    const int count = static_cast<int>(std::min<int64_t>(per_batch, windows - first));
    weighted += static_cast<double>(model_->Loss(dataset_->ValBatch(first, count))) * count;
  }
  RETURN_IF_ERROR(model_->backend()->status());
  return static_cast<float>(weighted / windows);
}

}  // namespace pipetrain
