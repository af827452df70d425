#include "worker/cube/cube_blocks.h"

#include <climits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/gelu.h"
#include "worker/cube/cube_layernorm.h"
#include "worker/cube/cube_layout.h"
#include "worker/cube/cube_linear.h"

namespace pipetrain {
namespace {

enum class Kind { kAttention, kMlp };

const char* NameOf(Kind kind) { return kind == Kind::kAttention ? "CubeAttention" : "CubeMlp"; }

// The widths of a block's two linears: in d -> K, out K2 -> d.
struct Widths {
  int64_t k = 0, k2 = 0;
};
Widths WidthsOf(Kind kind, int64_t d) {
  return kind == Kind::kAttention ? Widths{3 * d, d} : Widths{4 * d, 4 * d};
}

// Validates the dims a block (with_rows) or its parameters (!with_rows,
// B and T unused) need.
absl::Status CheckDims(Kind kind, const CubeBlockDims& dims, int p, const CubeDirection& direction,
                       bool with_rows) {
  const char* what = NameOf(kind);
  RETURN_IF_ERROR(ValidateCube(p, direction, what));
  const int64_t pp = int64_t{p} * p;
  if (with_rows) {
    if (dims.batch <= 0 || dims.batch % pp != 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": batch (B) = ", dims.batch,
                                                     " must be a positive multiple of p^2 = ", pp,
                                                     " (each rank's rows must be whole samples)"));
    }
    if (dims.seq_len <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": seq_len (T) = ", dims.seq_len, " must be positive"));
    }
    if (dims.batch * dims.seq_len > INT_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": rows (B * T) = ", dims.batch * dims.seq_len, " exceed ", INT_MAX));
    }
  }
  if (dims.d_model <= 0 || dims.d_model % pp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": d_model (d) = ", dims.d_model,
                                                   " must be a positive multiple of p^2 = ", pp));
  }
  if (kind == Kind::kAttention) {
    if (dims.n_head <= 0 || dims.n_head % p != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": n_head = ", dims.n_head, " must be a positive multiple of p = ", p,
                       " (each rank's qkv columns must be whole heads)"));
    }
    if (dims.d_model % dims.n_head != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": d_model (d) = ", dims.d_model, " must be a multiple of n_head = ", dims.n_head));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSize(Kind kind, const char* name, size_t got, int64_t want) {
  if (static_cast<int64_t>(got) != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(NameOf(kind), ": ", name, " has ", got, " values, expected ", want));
  }
  return absl::OkStatus();
}

// Prefixes a sub-layer's error with the block and layer it came from.
absl::Status InLayer(Kind kind, const char* layer, absl::Status status) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(NameOf(kind), " ", layer, ": ", status.message()));
}

// Per-rank extents of a block.
struct Extents {
  int64_t m = 0;        // M = B * T
  int64_t rows = 0;     // M / p^2
  int64_t samples = 0;  // B / p^2
  int64_t dp = 0;       // d / p
  int64_t kp = 0;       // K / p
};
Extents ExtentsOf(Kind kind, const CubeBlockDims& dims, int p) {
  const int64_t pp = int64_t{p} * p;
  Extents e;
  e.m = dims.batch * dims.seq_len;
  e.rows = e.m / pp;
  e.samples = dims.batch / pp;
  e.dp = dims.d_model / p;
  e.kp = WidthsOf(kind, dims.d_model).k / p;
  return e;
}

absl::Status Forward(Kind kind, CubeComm& comm, const CubeDirection& direction,
                     const CubeBlockDims& dims, const CubeBlockParams& params,
                     absl::Span<const float> x, absl::Span<float> y, CubeBlockContext* ctx) {
  const int p = comm.p();
  RETURN_IF_ERROR(CheckDims(kind, dims, p, direction, /*with_rows=*/true));
  const Extents e = ExtentsOf(kind, dims, p);
  const Widths w = WidthsOf(kind, dims.d_model);
  RETURN_IF_ERROR(CheckSize(kind, "x", x.size(), e.rows * e.dp));
  RETURN_IF_ERROR(CheckSize(kind, "y", y.size(), e.rows * e.dp));
  const CubeDirection swapped = direction.Swapped();

  ctx->x.assign(x.begin(), x.end());  // before y is written: y may be x
  ctx->ln_out.resize(e.rows * e.dp);
  ctx->mean.resize(e.rows);
  ctx->rstd.resize(e.rows);
  RETURN_IF_ERROR(
      InLayer(kind, "ln",
              CubeLayerNormForward(comm, direction, {e.m, dims.d_model}, ctx->x, params.ln_weight,
                                   params.ln_bias, absl::MakeSpan(ctx->ln_out),
                                   absl::MakeSpan(ctx->mean), absl::MakeSpan(ctx->rstd))));
  // The first linear: d -> K in direction, out in swapped.
  ctx->hidden.resize(e.rows * e.kp);
  RETURN_IF_ERROR(
      InLayer(kind, kind == Kind::kAttention ? "c_attn" : "c_fc",
              CubeLinearForward(comm, direction, {e.m, dims.d_model, w.k, true}, ctx->ln_out,
                                params.in_weight, params.in_bias, absl::MakeSpan(ctx->hidden))));
  // The local part: whole samples and (attention) whole heads on this rank.
  if (kind == Kind::kAttention) {
    const int64_t heads = dims.n_head / p;
    ctx->act.resize(e.rows * e.dp);
    ctx->probs.resize(e.samples * heads * dims.seq_len * dims.seq_len);
    AttentionForward(ctx->hidden.data(), static_cast<int>(e.samples),
                     static_cast<int>(dims.seq_len), static_cast<int>(e.dp),
                     static_cast<int>(heads), ctx->act.data(), ctx->probs.data());
  } else {
    ctx->act.resize(e.rows * e.kp);
    ctx->probs.clear();
    GeluForward(ctx->hidden.data(), e.rows * e.kp, ctx->act.data());
  }
  // The second linear: K2 -> d in swapped, out back in direction.
  RETURN_IF_ERROR(InLayer(kind, "c_proj",
                          CubeLinearForward(comm, swapped, {e.m, w.k2, dims.d_model, true},
                                            ctx->act, params.out_weight, params.out_bias, y)));
  for (int64_t i = 0; i < e.rows * e.dp; ++i) y[i] += ctx->x[i];  // the residual
  return absl::OkStatus();
}

absl::Status Backward(Kind kind, CubeComm& comm, const CubeDirection& direction,
                      const CubeBlockDims& dims, const CubeBlockParams& params,
                      const CubeBlockContext& ctx, absl::Span<const float> dy, absl::Span<float> dx,
                      const CubeBlockGrads& grads) {
  const int p = comm.p();
  RETURN_IF_ERROR(CheckDims(kind, dims, p, direction, /*with_rows=*/true));
  const Extents e = ExtentsOf(kind, dims, p);
  const Widths w = WidthsOf(kind, dims.d_model);
  const int64_t act_width = kind == Kind::kAttention ? e.dp : e.kp;
  const int64_t heads = kind == Kind::kAttention ? dims.n_head / p : 0;
  RETURN_IF_ERROR(CheckSize(kind, "dy", dy.size(), e.rows * e.dp));
  RETURN_IF_ERROR(CheckSize(kind, "dx", dx.size(), e.rows * e.dp));
  RETURN_IF_ERROR(CheckSize(kind, "context x", ctx.x.size(), e.rows * e.dp));
  RETURN_IF_ERROR(CheckSize(kind, "context ln_out", ctx.ln_out.size(), e.rows * e.dp));
  RETURN_IF_ERROR(CheckSize(kind, "context mean", ctx.mean.size(), e.rows));
  RETURN_IF_ERROR(CheckSize(kind, "context rstd", ctx.rstd.size(), e.rows));
  RETURN_IF_ERROR(CheckSize(kind, "context hidden", ctx.hidden.size(), e.rows * e.kp));
  RETURN_IF_ERROR(CheckSize(kind, "context act", ctx.act.size(), e.rows * act_width));
  RETURN_IF_ERROR(CheckSize(kind, "context probs", ctx.probs.size(),
                            e.samples * heads * dims.seq_len * dims.seq_len));
  const CubeDirection swapped = direction.Swapped();

  std::vector<float> dact(e.rows * act_width);
  RETURN_IF_ERROR(InLayer(
      kind, "c_proj",
      CubeLinearBackward(comm, swapped, {e.m, w.k2, dims.d_model, true}, ctx.act, params.out_weight,
                         dy, absl::MakeSpan(dact), grads.out_weight, grads.out_bias)));
  std::vector<float> dhidden(e.rows * e.kp);
  if (kind == Kind::kAttention) {
    std::vector<float> scratch(dims.seq_len * dims.seq_len);
    AttentionBackward(ctx.hidden.data(), ctx.probs.data(), dact.data(), static_cast<int>(e.samples),
                      static_cast<int>(dims.seq_len), static_cast<int>(e.dp),
                      static_cast<int>(heads), dhidden.data(), scratch.data());
  } else {
    GeluBackward(ctx.hidden.data(), dact.data(), e.rows * e.kp, dhidden.data());
  }
  std::vector<float> dln(e.rows * e.dp);
  RETURN_IF_ERROR(InLayer(kind, kind == Kind::kAttention ? "c_attn" : "c_fc",
                          CubeLinearBackward(comm, direction, {e.m, dims.d_model, w.k, true},
                                             ctx.ln_out, params.in_weight, dhidden,
                                             absl::MakeSpan(dln), grads.in_weight, grads.in_bias)));
  RETURN_IF_ERROR(
      InLayer(kind, "ln",
              CubeLayerNormBackward(comm, direction, {e.m, dims.d_model}, ctx.x, params.ln_weight,
                                    ctx.mean, ctx.rstd, dln, dx, grads.ln_weight, grads.ln_bias)));
  for (int64_t i = 0; i < e.rows * e.dp; ++i) dx[i] += dy[i];  // the residual path
  return absl::OkStatus();
}

}  // namespace

std::vector<float> PermuteCubeAttentionColumns(const std::vector<float>& full, int64_t rows,
                                               int64_t d, int p, bool to_cube) {
  const int64_t cols = 3 * d;
  std::vector<float> out(full.size());
  for (int64_t c = 0; c < cols; ++c) {
    const int64_t u = CubeAttentionPermutedColumn(c, d, p);
    for (int64_t r = 0; r < rows; ++r) {
      if (to_cube) {
        out[r * cols + c] = full[r * cols + u];
      } else {
        out[r * cols + u] = full[r * cols + c];
      }
    }
  }
  return out;
}

namespace {

absl::StatusOr<CubeBlockTensors> Scatter(Kind kind, const CubeBlockTensors& full,
                                         const CubeBlockDims& dims, int p, const CubeCoord& coord,
                                         const CubeDirection& direction) {
  RETURN_IF_ERROR(CheckDims(kind, dims, p, direction, /*with_rows=*/false));
  const int64_t d = dims.d_model;
  const Widths w = WidthsOf(kind, d);
  RETURN_IF_ERROR(CheckSize(kind, "full ln_weight", full.ln_weight.size(), d));
  RETURN_IF_ERROR(CheckSize(kind, "full ln_bias", full.ln_bias.size(), d));
  RETURN_IF_ERROR(CheckSize(kind, "full in_weight", full.in_weight.size(), d * w.k));
  RETURN_IF_ERROR(CheckSize(kind, "full in_bias", full.in_bias.size(), w.k));
  RETURN_IF_ERROR(CheckSize(kind, "full out_weight", full.out_weight.size(), w.k2 * d));
  RETURN_IF_ERROR(CheckSize(kind, "full out_bias", full.out_bias.size(), d));
  const bool permute = kind == Kind::kAttention;
  const std::vector<float> in_weight =
      permute ? PermuteCubeAttentionColumns(full.in_weight, d, d, p, true) : full.in_weight;
  const std::vector<float> in_bias =
      permute ? PermuteCubeAttentionColumns(full.in_bias, 1, d, p, true) : full.in_bias;
  const CubeDirection swapped = direction.Swapped();
  CubeBlockTensors out;
  ASSIGN_OR_RETURN(out.ln_weight, ScatterCubeBlock(CubeOperand::kVector, full.ln_weight, 1, d, p,
                                                   coord, direction));
  ASSIGN_OR_RETURN(out.ln_bias,
                   ScatterCubeBlock(CubeOperand::kVector, full.ln_bias, 1, d, p, coord, direction));
  ASSIGN_OR_RETURN(out.in_weight,
                   ScatterCubeBlock(CubeOperand::kWeight, in_weight, d, w.k, p, coord, direction));
  ASSIGN_OR_RETURN(out.in_bias,
                   ScatterCubeBlock(CubeOperand::kVector, in_bias, 1, w.k, p, coord, swapped));
  ASSIGN_OR_RETURN(out.out_weight, ScatterCubeBlock(CubeOperand::kWeight, full.out_weight, w.k2, d,
                                                    p, coord, swapped));
  ASSIGN_OR_RETURN(out.out_bias, ScatterCubeBlock(CubeOperand::kVector, full.out_bias, 1, d, p,
                                                  coord, direction));
  return out;
}

absl::StatusOr<CubeBlockTensors> Gather(Kind kind, const std::vector<CubeBlockTensors>& blocks,
                                        const CubeBlockDims& dims, int p,
                                        const CubeDirection& direction) {
  RETURN_IF_ERROR(CheckDims(kind, dims, p, direction, /*with_rows=*/false));
  const int64_t d = dims.d_model;
  const Widths w = WidthsOf(kind, d);
  RETURN_IF_ERROR(CheckSize(kind, "blocks", blocks.size(), int64_t{p} * p * p));
  const auto field = [&](std::vector<float> CubeBlockTensors::*member) {
    std::vector<std::vector<float>> out;
    out.reserve(blocks.size());
    for (const CubeBlockTensors& b : blocks) out.push_back(b.*member);
    return out;
  };
  const CubeDirection swapped = direction.Swapped();
  CubeBlockTensors out;
  ASSIGN_OR_RETURN(out.ln_weight,
                   GatherCubeBlocks(CubeOperand::kVector, field(&CubeBlockTensors::ln_weight), 1, d,
                                    p, direction));
  ASSIGN_OR_RETURN(out.ln_bias,
                   GatherCubeBlocks(CubeOperand::kVector, field(&CubeBlockTensors::ln_bias), 1, d,
                                    p, direction));
  ASSIGN_OR_RETURN(out.in_weight,
                   GatherCubeBlocks(CubeOperand::kWeight, field(&CubeBlockTensors::in_weight), d,
                                    w.k, p, direction));
  ASSIGN_OR_RETURN(out.in_bias,
                   GatherCubeBlocks(CubeOperand::kVector, field(&CubeBlockTensors::in_bias), 1, w.k,
                                    p, swapped));
  ASSIGN_OR_RETURN(out.out_weight,
                   GatherCubeBlocks(CubeOperand::kWeight, field(&CubeBlockTensors::out_weight),
                                    w.k2, d, p, swapped));
  ASSIGN_OR_RETURN(out.out_bias,
                   GatherCubeBlocks(CubeOperand::kVector, field(&CubeBlockTensors::out_bias), 1, d,
                                    p, direction));
  if (kind == Kind::kAttention) {
    out.in_weight = PermuteCubeAttentionColumns(out.in_weight, d, d, p, false);
    out.in_bias = PermuteCubeAttentionColumns(out.in_bias, 1, d, p, false);
  }
  return out;
}

// Floats sent, per the counts of cube_vector.h, cube_testing.h and
// cube_linear.h.
struct SentModel {
  int p;
  CubeCoord coord;
  CubeDirection direction;
  bool diagonal() const { return coord[direction.input] == coord[direction.output]; }
  // An all-reduce of n floats along an axis where this rank is member c.
  int64_t AllReduce(int64_t n, int c) const {
    const int64_t own = n / p + (c < n % p ? 1 : 0);
    return n - own + (p - 1) * own;
  }
  // CubeVectorAllGather of length L (in direction or its swap: the roots
  // are the same diagonal ranks).
  int64_t VectorAllGather(int64_t length) const {
    return (p - 1) * length / (int64_t{p} * p) * (diagonal() ? 2 : 1);
  }
  // CubeVectorReduceGrad of length L in direction `d` (its all-reduce runs
  // along d.input).
  int64_t VectorReduceGrad(int64_t length, const CubeDirection& d) const {
    const int64_t piece = length / (int64_t{p} * p);
    return (p - 1) * piece + AllReduce(piece, coord[d.input]);
  }
};

CubeBlockSentFloats Sent(Kind kind, const CubeBlockDims& dims, int p, const CubeCoord& coord,
                         const CubeDirection& direction) {
  const SentModel s{p, coord, direction};
  const CubeDirection swapped = direction.Swapped();
  const int64_t d = dims.d_model, m = dims.batch * dims.seq_len, rows = m / (int64_t{p} * p);
  const Widths w = WidthsOf(kind, d);
  const CubeLinearSentFloats in = CubeLinearSent({m, d, w.k, true}, p);
  const CubeLinearSentFloats out = CubeLinearSent({m, w.k2, d, true}, p);
  const int c_out = coord[direction.output];
  CubeBlockSentFloats sent;
  // ln: gamma and beta gathered, the rows' sums and centred squares.
  sent.forward = 2 * s.VectorAllGather(d) + 2 * s.AllReduce(rows, c_out);
  sent.forward += in.forward + s.VectorAllGather(w.k);  // in's bias under swapped
  sent.forward += out.forward + s.VectorAllGather(d);   // out's bias under direction
  sent.backward = out.backward + s.VectorReduceGrad(d, direction);
  sent.backward += in.backward + s.VectorReduceGrad(w.k, swapped);
  // ln: gamma gathered, the packed row sums, dgamma and dbeta reduced.
  sent.backward +=
      s.VectorAllGather(d) + s.AllReduce(2 * rows, c_out) + 2 * s.VectorReduceGrad(d, direction);
  return sent;
}

}  // namespace

int64_t CubeBlockContext::bytes() const {
  return static_cast<int64_t>(sizeof(float)) *
         static_cast<int64_t>(x.size() + ln_out.size() + mean.size() + rstd.size() + hidden.size() +
                              act.size() + probs.size());
}

absl::Status CubeAttentionForward(CubeComm& comm, const CubeDirection& direction,
                                  const CubeBlockDims& dims, const CubeBlockParams& params,
                                  absl::Span<const float> x, absl::Span<float> y,
                                  CubeBlockContext* ctx) {
  return Forward(Kind::kAttention, comm, direction, dims, params, x, y, ctx);
}

absl::Status CubeMlpForward(CubeComm& comm, const CubeDirection& direction,
                            const CubeBlockDims& dims, const CubeBlockParams& params,
                            absl::Span<const float> x, absl::Span<float> y, CubeBlockContext* ctx) {
  return Forward(Kind::kMlp, comm, direction, dims, params, x, y, ctx);
}

absl::Status CubeAttentionBackward(CubeComm& comm, const CubeDirection& direction,
                                   const CubeBlockDims& dims, const CubeBlockParams& params,
                                   const CubeBlockContext& ctx, absl::Span<const float> dy,
                                   absl::Span<float> dx, const CubeBlockGrads& grads) {
  return Backward(Kind::kAttention, comm, direction, dims, params, ctx, dy, dx, grads);
}

absl::Status CubeMlpBackward(CubeComm& comm, const CubeDirection& direction,
                             const CubeBlockDims& dims, const CubeBlockParams& params,
                             const CubeBlockContext& ctx, absl::Span<const float> dy,
                             absl::Span<float> dx, const CubeBlockGrads& grads) {
  return Backward(Kind::kMlp, comm, direction, dims, params, ctx, dy, dx, grads);
}

int64_t CubeAttentionPermutedColumn(int64_t column, int64_t d_model, int p) {
  const int64_t c = d_model / p;
  const int64_t g = column / (3 * c), s = (column % (3 * c)) / c, j = column % c;
  return s * d_model + g * c + j;
}

absl::StatusOr<CubeBlockTensors> ScatterCubeAttentionParams(const CubeBlockTensors& full,
                                                            const CubeBlockDims& dims, int p,
                                                            const CubeCoord& coord,
                                                            const CubeDirection& direction) {
  return Scatter(Kind::kAttention, full, dims, p, coord, direction);
}

absl::StatusOr<CubeBlockTensors> ScatterCubeMlpParams(const CubeBlockTensors& full,
                                                      const CubeBlockDims& dims, int p,
                                                      const CubeCoord& coord,
                                                      const CubeDirection& direction) {
  return Scatter(Kind::kMlp, full, dims, p, coord, direction);
}

absl::StatusOr<CubeBlockTensors> GatherCubeAttentionParams(
    const std::vector<CubeBlockTensors>& blocks, const CubeBlockDims& dims, int p,
    const CubeDirection& direction) {
  return Gather(Kind::kAttention, blocks, dims, p, direction);
}

absl::StatusOr<CubeBlockTensors> GatherCubeMlpParams(const std::vector<CubeBlockTensors>& blocks,
                                                     const CubeBlockDims& dims, int p,
                                                     const CubeDirection& direction) {
  return Gather(Kind::kMlp, blocks, dims, p, direction);
}

CubeBlockSentFloats CubeAttentionSent(const CubeBlockDims& dims, int p, const CubeCoord& coord,
                                      const CubeDirection& direction) {
  return Sent(Kind::kAttention, dims, p, coord, direction);
}

CubeBlockSentFloats CubeMlpSent(const CubeBlockDims& dims, int p, const CubeCoord& coord,
                                const CubeDirection& direction) {
  return Sent(Kind::kMlp, dims, p, coord, direction);
}

}  // namespace pipetrain
