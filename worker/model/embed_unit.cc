#include "worker/model/embed_unit.h"

#include "common/logging.h"
#include "kernels/cpu/vocab_parallel.h"

namespace pipetrain {

EmbedUnit::EmbedUnit(const GptConfig& config, Backend* backend, TensorParallelComm* tp)
    : Unit("embed", UnitKind::kEmbed, backend, tp), config_(config) {
  const int64_t d = config.d_model;
  wte_ = AddParameter("wte.weight", {config.vocab_size, d}, ParamInit::kNormal, 0.02f, true,
                      ParameterShard::Split::kRows);
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
  ctx->Clear();
  if (tp_size() > 1) return SplitVocabForward(batch);
  Tensor y = backend()->Empty({batch.batch, batch.seq_len, config_.d_model});
  backend()->EmbeddingForward(batch.inputs.data(), wte_->value.data(), wpe_->value.data(),
                              batch.batch, batch.seq_len, config_.d_model, config_.vocab_size,
                              y.data());
  return y;
}

Tensor EmbedUnit::SplitVocabForward(const TokenBatch& batch) {
  const int rows = config_.vocab_size / tp_size(), begin = tp_rank() * rows;
  // Host views (the tensors themselves on the CPU backend).
  const Tensor wte = backend()->Download(wte_->value);
  const Tensor wpe = backend()->Download(wpe_->value);
  Tensor y = Tensor::Zeros({batch.batch, batch.seq_len, config_.d_model});
  VocabSliceEmbeddingForward(batch.inputs.data(), wte.data(), tp_rank() == 0 ? wpe.data() : nullptr,
                             batch.batch, batch.seq_len, config_.d_model, begin, begin + rows,
                             y.data());
  Tensor out = backend()->Upload(y);
  TensorParallelSum(out);
  return out;
}

void EmbedUnit::SplitVocabBackward(const Tensor& dy, const TokenBatch& batch) {
  const int rows = config_.vocab_size / tp_size(), begin = tp_rank() * rows;
  const Tensor host_dy = backend()->Download(dy);
  Tensor dwte = backend()->Download(wte_->grad), dwpe = backend()->Download(wpe_->grad);
  VocabSliceEmbeddingBackward(batch.inputs.data(), host_dy.data(), batch.batch, batch.seq_len,
                              config_.d_model, begin, begin + rows, dwte.data(), dwpe.data());
  // On the CPU backend the host views are the gradients themselves.
  if (dwte.data() != wte_->grad.data()) backend()->CopyFromHost(dwte, &wte_->grad);
  if (dwpe.data() != wpe_->grad.data()) backend()->CopyFromHost(dwpe, &wpe_->grad);
}

Tensor EmbedUnit::Backward(const Tensor& dy, const TokenBatch& batch,
                           const UnitContext& /*ctx*/) {
  if (tp_size() > 1) {
    SplitVocabBackward(dy, batch);
    return Tensor();
  }
  backend()->EmbeddingBackward(batch.inputs.data(), dy.data(), batch.batch, batch.seq_len,
                               config_.d_model, config_.vocab_size, wte_->grad.data(),
                               wpe_->grad.data());
  return Tensor();
}

}  // namespace pipetrain
