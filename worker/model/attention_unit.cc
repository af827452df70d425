#include "worker/model/attention_unit.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/layernorm.h"

namespace pipetrain {

std::vector<float> AttentionColumnSums(const float* p, int64_t samples, int64_t H, int64_t T) {
  std::vector<double> sums(samples * T, 0.0);
  for (int64_t b = 0; b < samples; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t q = 0; q < T; ++q) {
        const float* row = p + ((b * H + h) * T + q) * T;
        for (int64_t t = 0; t < T; ++t) sums[b * T + t] += row[t];
      }
    }
  }
  return std::vector<float>(sums.begin(), sums.end());
}

AttentionUnit::AttentionUnit(const GptConfig& config, int layer, Backend* backend,
                             TensorParallelComm* tp)
    : Unit(absl::StrCat("attn_", layer), UnitKind::kAttention, backend, tp), config_(config) {
  using Split = ParameterShard::Split;
  const int64_t d = config.d_model;
  const std::string p = absl::StrCat("h.", layer, ".");
  const float residual_std = 0.02f / std::sqrt(2.0f * config.n_layer);
  ln_w_ = AddParameter(p + "ln_1.weight", {d}, ParamInit::kOnes, 0, false);
  ln_b_ = AddParameter(p + "ln_1.bias", {d}, ParamInit::kZeros, 0, false);
  qkv_w_ = AddParameter(p + "attn.c_attn.weight", {d, 3 * d}, ParamInit::kNormal, 0.02f, true,
                        Split::kColumns, 3);
  qkv_b_ = AddParameter(p + "attn.c_attn.bias", {3 * d}, ParamInit::kZeros, 0, false,
                        Split::kColumns, 3);
  proj_w_ = AddParameter(p + "attn.c_proj.weight", {d, d}, ParamInit::kNormal, residual_std, true,
                         Split::kRows);
  proj_b_ = AddParameter(p + "attn.c_proj.bias", {d}, ParamInit::kZeros, 0, false);
}

Tensor AttentionUnit::Forward(const Tensor& x, const TokenBatch& batch, UnitContext* ctx) {
  const int B = batch.batch, T = batch.seq_len, d = config_.d_model;
  // This rank's heads and their width (all of them when whole).
  const int H = config_.n_head / tp_size(), dl = d / tp_size();
  const int n = B * T;
  Tensor ln_out = backend()->Empty({B, T, d});
  Tensor mean = backend()->Empty({n}), rstd = backend()->Empty({n});
  Tensor qkv = backend()->Empty({B, T, 3 * dl});
  Tensor att = backend()->Empty({B, T, dl});
  // AccTFM's fine-grained pipeline (acctfm.txt §4.2): the samples in k
  // partitions, partition j's all-reduce running while j + 1 computes.
  // Every op works on whole samples, so a partition is a run of rows.
  const int k = TensorParallelPartitions(B, /*forward=*/true);
  const int b = B / k, rows = b * T;
  const bool compress = TensorParallelCompresses();
  // The probabilities [B, H, T, T] when An is read (compressing, or
  // TokenImportance asked for), else what the backend's attention keeps
  // (Backend::AttentionSavedFloats), [B, per sample].
  const bool probabilities = compress || keep_probabilities_;
  Tensor saved = probabilities ? backend()->Empty({B, H, T, T})
                               : backend()->Empty({B, backend()->AttentionSavedFloats(
                                                          1, T, dl, H, /*probabilities=*/false)});
  const int64_t saved_per_part = backend()->AttentionSavedFloats(b, T, dl, H, probabilities);
  Tensor y = backend()->Empty({B, T, d});
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
    backend()->LinearForward(ln_out.data() + r * d, qkv_w_->value.data(), qkv_b_->value.data(),
                             rows, d, 3 * dl, qkv.data() + r * 3 * dl);
    backend()->AttentionForward(qkv.data() + r * 3 * dl, b, T, dl, H, probabilities,
                                att.data() + r * dl, saved.data() + j * saved_per_part);
    // Row-parallel c_proj: rank 0 adds the bias, the group sums the parts.
    if (residual_in_proj) {
      backend()->LinearForwardResidual(att.data() + r * dl, proj_w_->value.data(),
                                       proj_b_->value.data(), x.data() + r * d, rows, dl, d,
                                       y.data() + r * d);
    } else {
      backend()->LinearForward(att.data() + r * dl, proj_w_->value.data(),
                               tp_rank() == 0 ? proj_b_->value.data() : nullptr, rows, dl, d,
                               y.data() + r * d);
    }
    Tensor part = y.Slice(int64_t{j} * b, int64_t{j + 1} * b);
    if (compress) {
      // This rank's An of the partition's samples; the group sums them.
      const Tensor p = backend()->Download(saved.Slice(int64_t{j} * b, int64_t{j + 1} * b));
      StartTensorParallelTokenSparseSum(part, AttentionColumnSums(p.data(), b, H, T), T, kept, r);
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
  ctx->saved = {x, ln_out, mean, rstd, qkv, saved, att};
  if (compress) ctx->saved.push_back(kept);
  return y;
}

Tensor AttentionUnit::Backward(const Tensor& dy, const TokenBatch& batch, const UnitContext& ctx) {
  const int B = batch.batch, T = batch.seq_len, d = config_.d_model;
  const int H = config_.n_head / tp_size(), dl = d / tp_size();
  const int n = B * T;
  const auto& s = ctx.saved;
  Tensor datt = backend()->Empty({B, T, dl});
  Tensor dqkv = backend()->Empty({B, T, 3 * dl});
  Tensor dln = backend()->Empty({B, T, d});
  // The CPU kernel's work space; a device backend keeps its own.
  Tensor scratch = backend()->kind() == BackendKind::kCpu ? backend()->Empty({T, T}) : Tensor();
  // Partitions as in Forward; the weight gradients add up over them.
  const int k = TensorParallelPartitions(B, /*forward=*/false);
  const int b = B / k, rows = b * T;
  const bool compress = TensorParallelCompresses() && s.size() > kKept;
  const bool stream = TakeStreamOutput();
  // As Forward chose (a [B, H, T, T] tensor holds the probabilities).
  const bool probabilities = s[kProbs].shape().size() == 4;
  const int64_t saved_per_part = backend()->AttentionSavedFloats(b, T, dl, H, probabilities);
  Tensor dx = backend()->Empty({B, T, d});
  for (int j = 0; j < k; ++j) {
    const int64_t r = int64_t{j} * rows;
    ResolveInputRows(r, r + rows);  // dy's rows
    // Compressed: the forward's dropped tokens had output 0, so their
    // gradient stops here (the residual still carries dy). Per partition,
    // once its rows of a streamed dy are final.
    const Tensor dy_kept = compress ? ZeroDroppedRows(dy.Slice(int64_t{j} * b, int64_t{j + 1} * b),
                                                      KeptRows(s[kKept], r, r + rows))
                                    : Tensor();
    // dy is the same on every rank, so is the replicated bias's gradient.
    backend()->LinearBackward(s[kAttOut].data() + r * dl, proj_w_->value.data(),
                              compress ? dy_kept.data() : dy.data() + r * d, rows, dl, d,
                              datt.data() + r * dl, proj_w_->grad.data(), proj_b_->grad.data());
    backend()->AttentionBackward(s[kQkv].data() + r * 3 * dl, s[kAttOut].data() + r * dl,
                                 s[kProbs].data() + j * saved_per_part, probabilities,
                                 datt.data() + r * dl, b, T, dl, H, dqkv.data() + r * 3 * dl,
                                 scratch.is_null() ? nullptr : scratch.data());
    backend()->LinearBackward(s[kLnOut].data() + r * d, qkv_w_->value.data(),
                              dqkv.data() + r * 3 * dl, rows, d, 3 * dl, dln.data() + r * d,
                              qkv_w_->grad.data(), qkv_b_->grad.data());
    Tensor part = dln.Slice(int64_t{j} * b, int64_t{j + 1} * b);
    // Each rank's part of dL/d(ln_1 output); compressed, the forward's
    // tokens only (acctfm.txt §4.3.1).
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

std::vector<float> AttentionUnit::TokenImportance(const UnitContext& ctx) const {
  // Without KeepTokenImportance, Forward may have kept no probabilities.
  if (ctx.saved.size() < kNumSlots || ctx.saved[kProbs].shape().size() != 4) return {};
  // [B, H, T, T], rows are queries; a host copy when on a device.
  const Tensor probs = backend()->Download(ctx.saved[kProbs]);
  std::vector<float> sums =
      AttentionColumnSums(probs.data(), probs.shape()[0], probs.shape()[1], probs.shape()[2]);
  TensorParallelComm* tp = tensor_parallel();
  if (tp == nullptr) return sums;
  // A rank's heads only: the group's sum is the whole layer's An. The
  // comm takes tensors of the unit's backend (a CUDA comm downloads them,
  // which a host tensor fails), so the sums go up and come back.
  Tensor summed = backend()->Upload(Tensor::FromVector({static_cast<int64_t>(sums.size())}, sums));
  tp->AllReduceSum(summed);
  return backend()->Download(summed).ToVector();
}

}  // namespace pipetrain
