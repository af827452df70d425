#include "worker/model/gpt_model.h"

#include <set>

#include "common/status_macros.h"

namespace pipetrain {

absl::StatusOr<std::unique_ptr<GptModel>> GptModel::Create(const GptConfig& config, uint64_t seed,
                                                           Backend* backend,
                                                           TensorParallelComm* tp) {
  RETURN_IF_ERROR(ValidateGptConfig(config));
  if (backend == nullptr) return absl::InvalidArgumentError("GptModel without a backend");
  if (tp != nullptr) RETURN_IF_ERROR(ValidateTensorParallel(config, tp->size()));
  std::unique_ptr<GptModel> model(new GptModel(config, backend));
  for (int i = 0; i < NumUnits(config); ++i) {
    model->units_.push_back(MakeUnit(config, i, backend, tp));
    InitializeParameters(model->units_.back().get(), seed);
  }
  // Tie the head's wte to embed's: both parameters view one value buffer,
  // but each keeps its own gradient until ReduceTiedGradients adds them. A
  // pipeline holds the two copies on different workers and forms the same
  // two-term sum, so it matches this model bitwise.
  model->embed_wte_ = pipetrain::FindParameter(*model->units_.front(), "wte.weight");
  model->head_wte_ = TieHeadToEmbedding(*model->units_.front(), *model->units_.back());
  std::set<std::string> seen;
  for (auto& unit : model->units_) {
    for (Parameter* p : unit->parameters()) {
      if (seen.insert(p->name).second) model->parameters_.push_back(p);
    }
  }
  return model;
}

Parameter* GptModel::FindParameter(const std::string& name) const {
  for (Parameter* p : parameters_) {
    if (p->name == name) return p;
  }
  return nullptr;
}

int64_t GptModel::num_parameters() const {
  int64_t n = 0;
  for (const Parameter* p : parameters_) n += p->value.numel();
  return n;
}

void GptModel::ZeroGrads() {
  for (auto& unit : units_) unit->ZeroGrads();  // includes the head's wte part
}

void GptModel::ReduceTiedGradients() {
  AddTiedGradient(backend_, embed_wte_, head_wte_->grad);
}

float GptModel::ForwardBackward(const TokenBatch& batch, float loss_scale) {
  return LossValue(backend_, ForwardBackwardDeferred(batch, loss_scale));
}

Tensor GptModel::ForwardBackwardDeferred(const TokenBatch& batch, float loss_scale) {
  std::vector<UnitContext> contexts(units_.size());
  Tensor x;
  for (size_t i = 0; i < units_.size(); ++i) x = units_[i]->Forward(x, batch, &contexts[i]);
  const Tensor loss = x;
  Tensor dy = Tensor::FromVector({1}, {loss_scale});
  for (size_t i = units_.size(); i-- > 0;) {
    dy = units_[i]->Backward(dy, batch, contexts[i]);
    contexts[i].Clear();  // free activations as soon as they are used
  }
  return loss;
}

float GptModel::Loss(const TokenBatch& batch) {
  UnitContext ctx;
  Tensor x;
  for (auto& unit : units_) x = unit->Forward(x, batch, &ctx);
  return LossValue(backend_, x);
}

}  // namespace pipetrain
