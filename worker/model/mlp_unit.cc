#include "worker/model/mlp_unit.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/layernorm.h"

namespace pipetrain {

MlpUnit::MlpUnit(const GptConfig& config, int layer, Backend* backend, TensorParallelComm* tp)
    : Unit(absl::StrCat("mlp_", layer), UnitKind::kMlp, backend, tp), config_(config) {
  using Split = ParameterShard::Split;
  const int64_t d = config.d_model;
  const std::string p = absl::StrCat("h.", layer, ".");
  const float residual_std = 0.02f / std::sqrt(2.0f * config.n_layer);
  ln_w_ = AddParameter(p + "ln_2.weight", {d}, ParamInit::kOnes, 0, false);
  ln_b_ = AddParameter(p + "ln_2.bias", {d}, ParamInit::kZeros, 0, false);
  fc_w_ = AddParameter(p + "mlp.c_fc.weight", {d, 4 * d}, ParamInit::kNormal, 0.02f, true,
                       Split::kColumns);
  fc_b_ = AddParameter(p + "mlp.c_fc.bias", {4 * d}, ParamInit::kZeros, 0, false, Split::kColumns);
  proj_w_ = AddParameter(p + "mlp.c_proj.weight", {4 * d, d}, ParamInit::kNormal, residual_std,
                         true, Split::kRows);
  proj_b_ = AddParameter(p + "mlp.c_proj.bias", {d}, ParamInit::kZeros, 0, false);
}

Tensor MlpUnit::Forward(const Tensor& x, const TokenBatch& batch, UnitContext* ctx) {
  const int B = batch.batch, T = batch.seq_len, d = config_.d_model;
  const int h = 4 * d / tp_size();  // this rank's hidden width
  const int n = B * T;
  Tensor ln_out = backend()->Empty({B, T, d});
  Tensor mean = backend()->Empty({n}), rstd = backend()->Empty({n});
  Tensor fc = backend()->Empty({B, T, h});
  Tensor act = backend()->Empty({B, T, h});
  Tensor y = backend()->Empty({B, T, d});
  // AccTFM's fine-grained pipeline, as in AttentionUnit::Forward.
  const int k = TensorParallelPartitions(B, /*forward=*/true);
  const int rows = B / k * T;
  const bool compress = TensorParallelCompresses();
  // Compressing: each row's kept flag, written as each partition's sum is
  // waited for (Unit::StartTensorParallelTokenSparseSum).
  Tensor kept = compress ? Tensor::Zeros({n}) : Tensor();
  const bool stream = TakeStreamOutput();  // AccTFM across units (unit.h)
  // Without a tensor-parallel group the residual joins c_proj's GEMM
  // (Backend::LinearForwardResidual); a group adds it once the parts are
  // summed, and so does compression (its token-sparse sum zeroes the
  // dropped rows, which must still carry their residual).
  const bool residual_in_proj = tp_size() == 1 && !stream && !compress;
  for (int j = 0; j < k; ++j) {
    const int64_t r = int64_t{j} * rows;  // the partition's first row
    ResolveInputRows(r, r + rows);
    backend()->LayerNormForward(x.data() + r * d, ln_w_->value.data(), ln_b_->value.data(), rows, d,
                                kLayerNormEps, ln_out.data() + r * d, mean.data() + r,
                                rstd.data() + r);
    // c_fc and its GELU (fused on a GPU).
    backend()->LinearGeluForward(ln_out.data() + r * d, fc_w_->value.data(), fc_b_->value.data(),
                                 rows, d, h, fc.data() + r * h, act.data() + r * h);
    // Row-parallel c_proj: rank 0 adds the bias, the group sums the parts.
    if (residual_in_proj) {
      backend()->LinearForwardResidual(act.data() + r * h, proj_w_->value.data(),
                                       proj_b_->value.data(), x.data() + r * d, rows, h, d,
                                       y.data() + r * d);
    } else {
      backend()->LinearForward(act.data() + r * h, proj_w_->value.data(),
                               tp_rank() == 0 ? proj_b_->value.data() : nullptr, rows, h, d,
                               y.data() + r * d);
    }
    Tensor part = y.Slice(int64_t{j} * (B / k), int64_t{j + 1} * (B / k));
    if (compress) {
      // The MLP has no attention matrix to rank tokens by (and its layer's
      // attention may run on another stage): it ranks them by the squared
      // norms of the ranks' partial outputs, summed over the group.
      StartTensorParallelTokenSparseSum(part, RowSquaredNorms(part), T, kept, r);
    } else {
      StartTensorParallelSum(part);
    }
    if (stream) AddPendingResidualRows(x, y, r, rows, d);  // the residual, once summed
  }
  ResolveAllInput();
  if (!stream) {
    WaitTensorParallelSums();
    if (!residual_in_proj) backend()->Add(y.data(), x.data(), y.numel(), y.data());
  }
  ctx->saved = {x, ln_out, mean, rstd, fc, act};
  if (compress) ctx->saved.push_back(kept);
  return y;
}

Tensor MlpUnit::Backward(const Tensor& dy, const TokenBatch& batch, const UnitContext& ctx) {
  const int B = batch.batch, T = batch.seq_len, d = config_.d_model;
  const int h = 4 * d / tp_size();
  const int n = B * T;
  const auto& s = ctx.saved;
  Tensor dact = backend()->Empty({B, T, h});
  Tensor dln = backend()->Empty({B, T, d});
  // Partitions as in Forward; the weight gradients add up over them.
  const int k = TensorParallelPartitions(B, /*forward=*/false);
  const int rows = B / k * T;
  const bool compress = TensorParallelCompresses() && s.size() > kKept;
  const bool stream = TakeStreamOutput();
  Tensor dx = backend()->Empty({B, T, d});
  for (int j = 0; j < k; ++j) {
    const int64_t r = int64_t{j} * rows;
    ResolveInputRows(r, r + rows);  // dy's rows
    // Compressed: the dropped tokens' gradient stops here, as in
    // AttentionUnit::Backward.
    const Tensor dy_kept =
        compress ? ZeroDroppedRows(dy.Slice(int64_t{j} * (B / k), int64_t{j + 1} * (B / k)),
                                   KeptRows(s[kKept], r, r + rows))
                 : Tensor();
    backend()->LinearBackward(s[kGeluOut].data() + r * h, proj_w_->value.data(),
                              compress ? dy_kept.data() : dy.data() + r * d, rows, h, d,
                              dact.data() + r * h, proj_w_->grad.data(), proj_b_->grad.data());
    // GELU backward in place: dact becomes dL/d(fc output).
    backend()->GeluBackward(s[kFcOut].data() + r * h, dact.data() + r * h, int64_t{rows} * h,
                            dact.data() + r * h);
    backend()->LinearBackward(s[kLnOut].data() + r * d, fc_w_->value.data(), dact.data() + r * h,
                              rows, d, h, dln.data() + r * d, fc_w_->grad.data(),
                              fc_b_->grad.data());
    Tensor part = dln.Slice(int64_t{j} * (B / k), int64_t{j + 1} * (B / k));
    // Each rank's part of dL/d(ln_2 output) (compressed: the kept tokens).
    if (compress) {
      StartTensorParallelMaskedSum(part, KeptRows(s[kKept], r, r + rows));
    } else {
      StartTensorParallelSum(part);
    }
    if (stream) {
      // Once these rows of dL/d(ln output) are summed: the LayerNorm's
      // backward over them and the residual.
      AddPendingLayerNormBackwardRows(s[kX], s[kLnMean], s[kLnRstd], dln, dx, dy, ln_w_, ln_b_, r,
                                      rows, d);
    }
  }
  ResolveAllInput();
  if (stream) return dx;
  WaitTensorParallelSums();
  // The LayerNorm's input gradient plus the residual path's dy, one op.
  backend()->LayerNormBackwardResidual(s[kX].data(), ln_w_->value.data(), s[kLnMean].data(),
                                       s[kLnRstd].data(), dln.data(), dy.data(), n, d, dx.data(),
                                       ln_w_->grad.data(), ln_b_->grad.data());
  return dx;
}

}  // namespace pipetrain
