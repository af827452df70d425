// The whole GPT-2 model in one process: all 2L+2 units, the tied token
// embedding shared between embed and head, and a flat parameter list.
// This is what `pipetrain train-local` trains and what every pipeline run is
// checked against (DESIGN.md §4). All units live on one Backend.
//
// Not thread-safe.
#ifndef PIPETRAIN_WORKER_MODEL_GPT_MODEL_H_
#define PIPETRAIN_WORKER_MODEL_GPT_MODEL_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/unit.h"

namespace pipetrain {

class GptModel {
 public:
  // INVALID_ARGUMENT when the config is invalid. Parameters are initialised
  // from `seed` (see InitializeParameters) on `backend` (not null; it must
  // outlive the model). A device backend's errors show in its status().
  // With `tp` (it must outlive the model), this model is rank tp->rank() of
  // a tensor-parallel group: every unit is that rank's shard
  // (tensor_parallel.h), the ranks run the same calls in the same order, and
  // together they compute what the whole model does, within rounding;
  // INVALID_ARGUMENT naming the field when tp->size() does not split the
  // config.
  static absl::StatusOr<std::unique_ptr<GptModel>> Create(const GptConfig& config, uint64_t seed,
                                                          Backend* backend = CpuBackend(),
                                                          TensorParallelComm* tp = nullptr);

  const GptConfig& config() const { return config_; }
  Backend* backend() const { return backend_; }
  int num_units() const { return static_cast<int>(units_.size()); }
  Unit& unit(int i) { return *units_[i]; }

  // Every trainable tensor once, in unit order (the tied wte appears once, as
  // embed's, whose gradient is complete after ReduceTiedGradients). Pointers
  // stay valid for the model's life.
  const std::vector<Parameter*>& parameters() const { return parameters_; }
  Parameter* FindParameter(const std::string& name) const;  // nullptr if none
  int64_t num_parameters() const;
  void ZeroGrads();

  // Forward + backward of one micro-batch through all units. Gradients are
  // scaled by loss_scale (1/micro_batches for accumulation) and accumulate.
  // The tied embedding's two gradient parts stay separate until
  // ReduceTiedGradients. Returns the micro-batch's mean loss.
  float ForwardBackward(const TokenBatch& batch, float loss_scale);
  // ForwardBackward without waiting for the loss: it stays a [1] tensor on
  // the backend's device (LossValue in unit.h reads it), so a device
  // backend queues the whole step with no host synchronisation.
  Tensor ForwardBackwardDeferred(const TokenBatch& batch, float loss_scale);
  // wte.grad = (embedding part) + (head part); call once after the last
  // micro-batch, before the optimizer step.
  void ReduceTiedGradients();
  // Forward only; returns the mean loss.
  float Loss(const TokenBatch& batch);

 private:
  GptModel(const GptConfig& config, Backend* backend) : config_(config), backend_(backend) {}
  GptConfig config_;
  Backend* backend_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::vector<Parameter*> parameters_;
  Parameter* embed_wte_ = nullptr;  // the optimizer's copy of wte
  Parameter* head_wte_ = nullptr;   // shares the value; own gradient
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_GPT_MODEL_H_
