#include "worker/model/embed_unit.h"

#include "common/logging.h"

namespace pipetrain {

EmbedUnit::EmbedUnit(const GptConfig& config, Backend* backend)
    : Unit("embed", UnitKind::kEmbed, backend), config_(config) {
  const int64_t d = config.d_model;
  wte_ = AddParameter("wte.weight", {config.vocab_size, d}, ParamInit::kNormal, 0.02f, true);
  wpe_ = AddParameter("wpe.weight", {config.max_seq_len, d}, ParamInit::kNormal, 0.02f, true);
}

Tensor EmbedUnit::Forward(const Tensor& /*x*/, const TokenBatch& batch, UnitContext* ctx) {
  PT_CHECK(batch.seq_len <= config_.max_seq_len)
      << "seq_len " << batch.seq_len << " > max_seq_len " << config_.max_seq_len;
  PT_CHECK(static_cast<int64_t>(batch.inputs.size()) == int64_t{batch.batch} * batch.seq_len)
      << batch.inputs.size() << " token ids for " << batch.batch << " x " << batch.seq_len;
  for (int32_t token : batch.inputs) {
    PT_CHECK(token >= 0 && token < config_.vocab_size) << "token " << token;
  }
  Tensor y = backend()->Empty({batch.batch, batch.seq_len, config_.d_model});
  backend()->EmbeddingForward(batch.inputs.data(), wte_->value.data(), wpe_->value.data(),
                              batch.batch, batch.seq_len, config_.d_model, config_.vocab_size,
                              y.data());
  ctx->Clear();
  return y;
}

Tensor EmbedUnit::Backward(const Tensor& dy, const TokenBatch& batch,
                           const UnitContext& /*ctx*/) {
  backend()->EmbeddingBackward(batch.inputs.data(), dy.data(), batch.batch, batch.seq_len,
                               config_.d_model, config_.vocab_size, wte_->grad.data(),
                               wpe_->grad.data());
  return Tensor();
}

}  // namespace pipetrain
