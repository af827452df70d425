#include "worker/model/head_unit.h"

#include <algorithm>
#include <vector>

#include "common/logging.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/vocab_parallel.h"

namespace pipetrain {

HeadUnit::HeadUnit(const GptConfig& config, Backend* backend, TensorParallelComm* tp)
    : Unit("head", UnitKind::kHead, backend, tp), config_(config) {
  const int64_t d = config.d_model;
  ln_w_ = AddParameter("ln_f.weight", {d}, ParamInit::kOnes, 0, false);
  ln_b_ = AddParameter("ln_f.bias", {d}, ParamInit::kZeros, 0, false);
  wte_ = AddParameter("wte.weight", {config.vocab_size, d}, ParamInit::kNormal, 0.02f, true,
                      ParameterShard::Split::kRows);
}

Tensor HeadUnit::Forward(const Tensor& x, const TokenBatch& batch, UnitContext* ctx) {
  const int n = batch.batch * batch.seq_len, d = config_.d_model, V = config_.vocab_size;
  const int Vl = V / tp_size();  // this rank's vocabulary rows
  PT_CHECK(static_cast<int64_t>(batch.targets.size()) == n)
      << batch.targets.size() << " targets for " << n << " positions";
  for (int32_t t : batch.targets) PT_CHECK(t >= 0 && t < V) << "target " << t;
  Tensor ln_out = backend()->Empty({n, d});
  Tensor mean = backend()->Empty({n}), rstd = backend()->Empty({n});
  backend()->LayerNormForward(x.data(), ln_w_->value.data(), ln_b_->value.data(), n, d, kLayerNormEps,
                   ln_out.data(), mean.data(), rstd.data());
  // logits [n, Vl] = ln_out [n, d] * wte^T, rows of stride ld; then the
  // cross-entropy, which keeps what the backward needs (the backend may
  // turn the logits into probabilities in place). The split vocabulary's
  // host steps take packed rows.
  const int ld = LogitsLd();
  Tensor logits = backend()->Empty({n, ld});
  backend()->LmHeadForward(ln_out.data(), wte_->value.data(), n, d, Vl, ld, logits.data());
  // What the backward reads: the probabilities, or the backend's own form
  // of the loss's gradient (Backend::HeadLossForward).
  Tensor loss_state, loss;
  if (tp_size() > 1) {
    loss = Tensor::FromVector({1}, {SplitVocabCrossEntropy(logits, batch)});
    loss_state = std::move(logits);
  } else {
    loss = backend()->HeadLossForward(std::move(logits), batch.targets.data(), n, d, V, ld,
                                      &loss_state);
  }
  ctx->saved = {x, ln_out, mean, rstd, loss_state};
  return loss;
}

int HeadUnit::LogitsLd() const {
  const int local_vocab = config_.vocab_size / tp_size();
  return tp_size() > 1 ? local_vocab : backend()->LogitsRowStride(local_vocab);
}

float HeadUnit::SplitVocabCrossEntropy(Tensor& logits, const TokenBatch& batch) {
  const int n = batch.batch * batch.seq_len, T = tp_size();
  const int Vl = config_.vocab_size / T, begin = tp_rank() * Vl;
  Tensor host = backend()->Download(logits);  // the tensor itself on the CPU
  // Each row's maximum over the whole vocabulary: every rank's local maxima
  // gathered by a sum in which each slot has one non-zero term (exact).
  Tensor maxima = Tensor::Zeros({T, n});
  VocabSliceRowMax(host.data(), n, Vl, maxima.data() + int64_t{tp_rank()} * n);
  Tensor all_maxima = backend()->Upload(maxima);
  TensorParallelSum(all_maxima);
  maxima = backend()->Download(all_maxima);
  std::vector<float> global_max(maxima.data(), maxima.data() + n);
  for (int r = 1; r < T; ++r) {
    for (int i = 0; i < n; ++i) global_max[i] = std::max(global_max[i], maxima[int64_t{r} * n + i]);
  }
  // Z = sum of exp(logit - M) over the ranks, and the target's logit - M
  // (from the one rank that holds it), in one all-reduce of [2, n].
  Tensor partials = Tensor::Zeros({2, n});
  VocabSliceSoftmaxPartials(host.data(), batch.targets.data(), n, Vl, begin, global_max.data(),
                            host.data(), partials.data(), partials.data() + n);
  Tensor totals = backend()->Upload(partials);
  TensorParallelSum(totals);
  totals = backend()->Download(totals);
  const float loss = VocabSliceSoftmaxFinish(totals.data(), totals.data() + n, n, Vl, host.data());
  if (host.data() != logits.data()) backend()->CopyFromHost(host, &logits);
  return loss;
}

Tensor HeadUnit::Backward(const Tensor& dy, const TokenBatch& batch, const UnitContext& ctx) {
  const int n = batch.batch * batch.seq_len, d = config_.d_model, V = config_.vocab_size;
  const int Vl = V / tp_size();
  PT_CHECK(!dy.on_device() && dy.numel() == 1) << "head's dL/dloss must be a host [1] tensor";
  const auto& s = ctx.saved;
  const int ld = LogitsLd();
  // dln = dlogits * wte [n, d];  dwte += dlogits^T * ln_out [Vl, d].
  Tensor dln = backend()->Empty({n, d});
  if (tp_size() > 1) {
    const Tensor probs = backend()->Download(s[kLossState]);
    Tensor host = Tensor::Zeros({n, Vl});
    VocabSliceCrossEntropyBackward(probs.data(), batch.targets.data(), n, Vl, tp_rank() * Vl, dy[0],
                                   host.data());
    Tensor dlogits = backend()->Upload(host);
    backend()->LmHeadBackward(s[kLnOut].data(), wte_->value.data(), dlogits.data(), n, d, Vl, ld,
                              dln.data(), wte_->grad.data());
  } else {
    backend()->LmHeadLossBackward(s[kLossState], batch.targets.data(), dy[0], s[kLnOut].data(),
                                  wte_->value.data(), n, d, V, ld, dln.data(), wte_->grad.data());
  }
  TensorParallelSum(dln);  // each rank's vocabulary part of dL/d(ln_f output)
  Tensor dx = backend()->Empty({batch.batch, batch.seq_len, d});
  backend()->LayerNormBackward(s[kX].data(), ln_w_->value.data(), s[kLnMean].data(), s[kLnRstd].data(),
                    dln.data(), n, d, dx.data(), ln_w_->grad.data(), ln_b_->grad.data());
  return dx;
}

}  // namespace pipetrain
