#include "worker/model/cube_units.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "worker/cube/cube_blocks.h"
#include "worker/cube/cube_layout.h"
#include "worker/model/attention_unit.h"
#include "worker/model/embed_unit.h"
#include "worker/model/head_unit.h"

namespace pipetrain {
namespace {

absl::Span<const float> Values(const Tensor& t) {
  return absl::Span<const float>(t.data(), static_cast<size_t>(t.numel()));
}
absl::Span<float> Values(Tensor& t) {
  return absl::Span<float>(t.data(), static_cast<size_t>(t.numel()));
}
absl::Span<float> Values(Parameter* p, bool grad) {
  Tensor& t = grad ? p->grad : p->value;
  return Values(t);
}
Tensor ToTensor(const std::vector<float>& values) {
  return Tensor::FromVector({static_cast<int64_t>(values.size())}, values);
}
std::vector<float> ToVector(const Tensor& t) {
  return t.numel() == 0 ? std::vector<float>() : t.ToVector();
}

}  // namespace

CubeBlockUnit::CubeBlockUnit(const GptConfig& config, int index, Backend* backend,
                             CubeUnitGroup* group)
    : Unit(UnitName(config, index), UnitKindAt(config, index), backend),
      config_(config),
      group_(group) {
  PT_CHECK(IsBlockUnitKind(kind()))
      << "a cube unit at index " << index << ", which is neither attention nor MLP";
  PT_CHECK(backend == CpuBackend()) << "3-D tensor parallelism runs on the CPU backend only";
  const int p = group->p();
  const absl::Status valid = ValidateCubeTensorParallel(config, p * p * p, int64_t{p} * p);
  PT_CHECK(valid.ok()) << valid;
  const int64_t d = config.d_model;
  const float residual_std = 0.02f / std::sqrt(2.0f * config.n_layer);
  // The six parameters in the Units' order (cube_blocks.h "Parameters"):
  // the blocks differ in their names, the first linear's width K (3d, 4d)
  // and c_attn's permuted columns.
  const bool attention = kind() == UnitKind::kAttention;
  const std::string prefix = absl::StrCat("h.", UnitLayer(config, index), ".");
  const std::string ln = prefix + (attention ? "ln_1" : "ln_2");
  const std::string in = prefix + (attention ? "attn.c_attn" : "mlp.c_fc");
  const std::string out = prefix + (attention ? "attn.c_proj" : "mlp.c_proj");
  const int64_t k = attention ? 3 * d : 4 * d;
  ln_w_ = AddCubeParameter(ln + ".weight", {d}, ParamInit::kOnes, 0, false, CubeOperand::kVector,
                           false, false);
  ln_b_ = AddCubeParameter(ln + ".bias", {d}, ParamInit::kZeros, 0, false, CubeOperand::kVector,
                           false, false);
  in_w_ = AddCubeParameter(in + ".weight", {d, k}, ParamInit::kNormal, 0.02f, true,
                           CubeOperand::kWeight, false, attention);
  in_b_ = AddCubeParameter(in + ".bias", {k}, ParamInit::kZeros, 0, false, CubeOperand::kVector,
                           true, attention);
  out_w_ = AddCubeParameter(out + ".weight", {attention ? d : k, d}, ParamInit::kNormal,
                            residual_std, true, CubeOperand::kWeight, true, false);
  out_b_ = AddCubeParameter(out + ".bias", {d}, ParamInit::kZeros, 0, false, CubeOperand::kVector,
                            false, false);
}

CubeBlockParams CubeBlockUnit::Params() {
  return {Values(ln_w_, false), Values(ln_b_, false),  Values(in_w_, false),
          Values(in_b_, false), Values(out_w_, false), Values(out_b_, false)};
}

Parameter* CubeBlockUnit::AddCubeParameter(const std::string& name, const Shape& shape,
                                           ParamInit init, float init_std, bool is_matrix,
                                           CubeOperand operand, bool swapped,
                                           bool attention_columns) {
  ParameterShard shard;
  shard.split = ParameterShard::Split::kCube;
  shard.cube_p = group_->p();
  shard.rank = CubeRankIndex(group_->comm().coord(), shard.cube_p);
  shard.ranks = shard.cube_p * shard.cube_p * shard.cube_p;
  shard.full_shape = shape;
  shard.cube_operand = operand;
  shard.cube_direction = swapped ? direction_.Swapped() : direction_;
  shard.cube_attention_columns = attention_columns;
  Parameter* p = AddParameter(name, ShardShape(shard), init, init_std, is_matrix);
  p->shard = shard;
  return p;
}

int64_t CubeBlockUnit::PaddedBatch(int64_t batch) const {
  const int64_t square = int64_t{group_->p()} * group_->p();
  return (batch + square - 1) / square * square;
}

Tensor CubeBlockUnit::CutBlock(const Tensor& x, int64_t batch, int64_t seq_len) {
  const int p = group_->p();
  const int64_t d = config_.d_model, padded = PaddedBatch(batch);
  Tensor block = Tensor::Zeros({padded / (p * p), seq_len, d / p});
  Tensor whole = x;
  if (padded != batch) {
    // Zero samples up to a multiple of p^2 (see PaddedBatch).
    whole = Tensor::Zeros({padded, seq_len, d});
    std::memcpy(whole.data(), x.data(), x.numel() * sizeof(float));
  }
  absl::StatusOr<std::vector<float>> cut =
      ScatterCubeBlock(CubeOperand::kActivation, Values(whole), padded * seq_len, d, p,
                       group_->comm().coord(), direction_);
  group_->Record(cut.status());
  if (cut.ok()) std::memcpy(block.data(), cut->data(), cut->size() * sizeof(float));
  return block;
}

Tensor CubeBlockUnit::GatherFull(const Tensor& block, int64_t batch, int64_t seq_len) {
  const int p = group_->p();
  const int64_t d = config_.d_model, cols = d / p, padded = PaddedBatch(batch);
  const int64_t rows = padded * seq_len / (p * p);  // the block's
  Tensor full = Tensor::Zeros({padded, seq_len, d});
  if (!group_->status().ok()) return full.Slice(0, batch);
  CubeComm& comm = group_->comm();
  // 1. Along the output axis: the p column blocks of this row block, as
  //    [p][rows][d / p], interleaved into [rows][d].
  std::vector<float> columns(static_cast<size_t>(p * rows * cols));
  absl::Status status = comm.AllGather(direction_.output, Values(block), absl::MakeSpan(columns));
  std::vector<float> row_block(static_cast<size_t>(rows * d));
  for (int o = 0; o < p; ++o) {
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(&row_block[r * d + o * cols], &columns[(o * rows + r) * cols],
                  cols * sizeof(float));
    }
  }
  // 2. Along the input axis: row blocks w p + a, a = 0..p-1, are adjacent.
  std::vector<float> rows_of_w(static_cast<size_t>(p * rows * d));
  if (status.ok()) status = comm.AllGather(direction_.input, row_block, absl::MakeSpan(rows_of_w));
  // 3. Along the weight axis: the p groups of p row blocks, in order.
  if (status.ok()) status = comm.AllGather(direction_.weight, rows_of_w, Values(full));
  group_->Record(status);
  if (!status.ok()) full.Fill(0.0f);
  return full.Slice(0, batch);  // without the padding samples
}

Tensor CubeBlockUnit::Forward(const Tensor& x, const TokenBatch& batch, UnitContext* ctx) {
  const int p = group_->p();
  const int64_t B = batch.batch, T = batch.seq_len, d = config_.d_model;
  const bool input_full = x.shape().back() == d;
  Tensor x_block = input_full ? CutBlock(x, B, T) : x;
  Tensor y = Tensor::Zeros({PaddedBatch(B) / (p * p), T, d / p});
  CubeBlockContext c;
  if (group_->status().ok()) {
    const CubeBlockDims dims{PaddedBatch(B), T, d, config_.n_head};
    const CubeBlockParams params = Params();
    group_->Record(kind() == UnitKind::kAttention
                       ? CubeAttentionForward(group_->comm(), direction_, dims, params,
                                              Values(x_block), Values(y), &c)
                       : CubeMlpForward(group_->comm(), direction_, dims, params, Values(x_block),
                                        Values(y), &c));
  }
  ctx->saved = {x_block,
                ToTensor(c.ln_out),
                ToTensor(c.mean),
                ToTensor(c.rstd),
                ToTensor(c.hidden),
                ToTensor(c.act),
                ToTensor(c.probs),
                Tensor::Filled({1}, input_full ? 1.0f : 0.0f),
                Tensor::Filled({1}, static_cast<float>(B))};
  return output_full_ ? GatherFull(y, B, T) : y;
}

Tensor CubeBlockUnit::Backward(const Tensor& dy, const TokenBatch& batch, const UnitContext& ctx) {
  const int p = group_->p();
  const int64_t B = batch.batch, T = batch.seq_len, d = config_.d_model;
  const auto& s = ctx.saved;
  PT_CHECK(s.size() == kNumSlots) << name() << ": a context of " << s.size() << " tensors";
  const Tensor dy_block = dy.shape().back() == d ? CutBlock(dy, B, T) : dy;
  Tensor dx = Tensor::Zeros({PaddedBatch(B) / (p * p), T, d / p});
  if (group_->status().ok()) {
    CubeBlockContext c;
    c.x = ToVector(s[kX]);
    c.ln_out = ToVector(s[kLnOut]);
    c.mean = ToVector(s[kMean]);
    c.rstd = ToVector(s[kRstd]);
    c.hidden = ToVector(s[kHidden]);
    c.act = ToVector(s[kAct]);
    c.probs = ToVector(s[kProbs]);
    const CubeBlockDims dims{PaddedBatch(B), T, d, config_.n_head};
    const CubeBlockParams params = Params();
    const CubeBlockGrads grads{Values(ln_w_, true), Values(ln_b_, true),  Values(in_w_, true),
                               Values(in_b_, true), Values(out_w_, true), Values(out_b_, true)};
    group_->Record(kind() == UnitKind::kAttention
                       ? CubeAttentionBackward(group_->comm(), direction_, dims, params, c,
                                               Values(dy_block), Values(dx), grads)
                       : CubeMlpBackward(group_->comm(), direction_, dims, params, c,
                                         Values(dy_block), Values(dx), grads));
  }
  const bool input_full = s[kInputFull].data()[0] != 0.0f;
  return input_full ? GatherFull(dx, B, T) : dx;
}

std::vector<float> CubeBlockUnit::TokenImportance(const UnitContext& ctx) const {
  if (kind() != UnitKind::kAttention || !group_->status().ok()) return {};
  const auto& s = ctx.saved;
  PT_CHECK(s.size() == kNumSlots) << name() << ": a context of " << s.size() << " tensors";
  const int p = group_->p();
  // x's block is [padded B / p^2, T, d / p] in either case of the input.
  const int64_t samples = s[kX].shape()[0], T = s[kX].shape()[1];
  const int64_t heads = config_.n_head / p;
  const int64_t batch = static_cast<int64_t>(s[kBatch].data()[0]);
  PT_CHECK(s[kProbs].numel() == samples * heads * T * T)
      << name() << ": " << s[kProbs].numel() << " probabilities for " << samples << " samples, "
      << heads << " heads, " << T << " tokens";
  // cube_blocks.h: the attention runs on c_attn's output, in the
  // activation layout of direction_.Swapped(): its rows (samples) are
  // block coord[weight] * p + coord[output] of p^2, its columns (heads)
  // block coord[input] of p.
  std::vector<float> sums = AttentionColumnSums(s[kProbs].data(), samples, heads, T);
  CubeComm& comm = group_->comm();
  absl::Status status = comm.AllReduce(direction_.input, absl::MakeSpan(sums));
  // Row blocks w * p + o: those of one w are adjacent, in o order.
  std::vector<float> of_w(static_cast<size_t>(p) * sums.size());
  if (status.ok()) status = comm.AllGather(direction_.output, sums, absl::MakeSpan(of_w));
  std::vector<float> all(static_cast<size_t>(p) * of_w.size());
  if (status.ok()) status = comm.AllGather(direction_.weight, of_w, absl::MakeSpan(all));
  group_->Record(status);
  if (!status.ok()) return {};
  all.resize(static_cast<size_t>(batch * T));  // without the padding samples
  return all;
}

std::unique_ptr<Unit> MakeCubeTensorParallelUnit(const GptConfig& config, int index,
                                                 Backend* backend, CubeUnitGroup* group,
                                                 TensorParallelComm* tp) {
  PT_CHECK(group != nullptr && tp != nullptr) << "a cube unit without its groups";
  const int p = group->p();
  PT_CHECK(tp->size() == p * p * p)
      << "a 1-D group of " << tp->size() << " ranks for a cube of " << p << "^3";
  switch (UnitKindAt(config, index)) {
    case UnitKind::kEmbed:
      return std::make_unique<EmbedUnit>(config, backend, tp);
    case UnitKind::kHead:
      return std::make_unique<HeadUnit>(config, backend, tp);
    case UnitKind::kAttention:
    case UnitKind::kMlp:
      return std::make_unique<CubeBlockUnit>(config, index, backend, group);
  }
  return nullptr;
}

}  // namespace pipetrain
