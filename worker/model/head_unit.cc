#include "worker/model/head_unit.h"

#include "common/logging.h"
#include "kernels/cpu/layernorm.h"

namespace pipetrain {

HeadUnit::HeadUnit(const GptConfig& config, Backend* backend)
    : Unit("head", UnitKind::kHead, backend), config_(config) {
  const int64_t d = config.d_model;
  ln_w_ = AddParameter("ln_f.weight", {d}, ParamInit::kOnes, 0, false);
  ln_b_ = AddParameter("ln_f.bias", {d}, ParamInit::kZeros, 0, false);
  wte_ = AddParameter("wte.weight", {config.vocab_size, d}, ParamInit::kNormal, 0.02f, true);
}

Tensor HeadUnit::Forward(const Tensor& x, const TokenBatch& batch, UnitContext* ctx) {
  const int n = batch.batch * batch.seq_len, d = config_.d_model, V = config_.vocab_size;
  PT_CHECK(static_cast<int64_t>(batch.targets.size()) == n)
      << batch.targets.size() << " targets for " << n << " positions";
  for (int32_t t : batch.targets) PT_CHECK(t >= 0 && t < V) << "target " << t;
  Tensor ln_out = backend()->Empty({n, d});
  Tensor mean = backend()->Empty({n}), rstd = backend()->Empty({n});
  backend()->LayerNormForward(x.data(), ln_w_->value.data(), ln_b_->value.data(), n, d, kLayerNormEps,
                   ln_out.data(), mean.data(), rstd.data());
  // logits [n, V] = ln_out [n, d] * wte^T; then softmax in place into probs.
  Tensor probs = backend()->Empty({n, V});
  backend()->Sgemm(false, true, n, V, d, 1.0f, ln_out.data(), d, wte_->value.data(), d, 0.0f,
        probs.data(), V);
  float loss = backend()->SoftmaxCrossEntropyForward(probs.data(), batch.targets.data(), n, V,
                                          probs.data());
  ctx->saved = {x, ln_out, mean, rstd, probs};
  return Tensor::FromVector({1}, {loss});
}

Tensor HeadUnit::Backward(const Tensor& dy, const TokenBatch& batch, const UnitContext& ctx) {
  const int n = batch.batch * batch.seq_len, d = config_.d_model, V = config_.vocab_size;
  PT_CHECK(!dy.on_device() && dy.numel() == 1) << "head's dL/dloss must be a host [1] tensor";
  const auto& s = ctx.saved;
  Tensor dlogits = backend()->Empty({n, V});
  backend()->SoftmaxCrossEntropyBackward(s[kProbs].data(), batch.targets.data(), n, V, dy[0],
                              dlogits.data());
  // dln = dlogits * wte [n, d];  dwte += dlogits^T * ln_out [V, d].
  Tensor dln = backend()->Empty({n, d});
  backend()->Sgemm(false, false, n, d, V, 1.0f, dlogits.data(), V, wte_->value.data(), d, 0.0f,
        dln.data(), d);
  backend()->Sgemm(true, false, V, d, n, 1.0f, dlogits.data(), V, s[kLnOut].data(), d, 1.0f,
        wte_->grad.data(), d);
  Tensor dx = backend()->Empty({batch.batch, batch.seq_len, d});
  backend()->LayerNormBackward(s[kX].data(), ln_w_->value.data(), s[kLnMean].data(), s[kLnRstd].data(),
                    dln.data(), n, d, dx.data(), ln_w_->grad.data(), ln_b_->grad.data());
  return dx;
}

}  // namespace pipetrain
