// Unit "attn_i": y = x + c_proj(CausalSelfAttention(c_attn(ln_1(x)))).
// Parameters (Hugging Face names, Conv1D (in, out) layout):
//   h.i.ln_1.weight/bias [d], h.i.attn.c_attn.weight [d, 3d] / bias [3d],
//   h.i.attn.c_proj.weight [d, d] / bias [d].
// Tensor-parallel (tensor_parallel.h): rank r of T holds heads [r H/T,
// (r+1) H/T): c_attn's columns of those heads in q, k and v ([d, 3d/T]),
// c_proj's rows of them ([d/T, d]); the output is all-reduced before the
// residual, dL/d(ln_1 output) before the LayerNorm's backward. With the
// group's hybrid compression (acctfm.txt §4.3) the output's all-reduce
// keeps the tokens of highest An (TokenImportance, summed over the ranks)
// and the others' outputs are 0 (the residual passes them on); the
// backward sums the same tokens' gradients and drops the others'.
#ifndef PIPETRAIN_WORKER_MODEL_ATTENTION_UNIT_H_
#define PIPETRAIN_WORKER_MODEL_ATTENTION_UNIT_H_

#include <cstdint>
#include <vector>

#include "worker/model/unit.h"

namespace pipetrain {

class AttentionUnit : public Unit {
 public:
  AttentionUnit(const GptConfig& config, int layer, Backend* backend,
                TensorParallelComm* tp = nullptr);
  Tensor Forward(const Tensor& x, const TokenBatch& batch, UnitContext* ctx) override;
  Tensor Backward(const Tensor& dy, const TokenBatch& batch, const UnitContext& ctx) override;
  // Partitioned all-reduces stream into the next unit (Unit::set_stream_output).
  bool streams_tensor_parallel() const override { return true; }
  // An[b, t] = sum over heads h and queries q of probs[b, h, q, t]: how much
  // attention token t receives from the whole sequence (acctfm §4.3.1).
  // With a tensor-parallel group: the whole layer's An, over every rank's
  // heads (an all-reduce that every rank of the group calls for the same
  // unit and micro-batch; Unit::TokenImportance).
  std::vector<float> TokenImportance(const UnitContext& ctx) const override;
  void KeepTokenImportance() override { keep_probabilities_ = true; }

 private:
  // Slots of UnitContext::saved.
  // kKept (each row's kept flag, Unit::StartTensorParallelTokenSparseSum)
  // only when the group compresses.
  enum Slot { kX, kLnOut, kLnMean, kLnRstd, kQkv, kProbs, kAttOut, kNumSlots, kKept = kNumSlots };
  GptConfig config_;
  Parameter *ln_w_, *ln_b_, *qkv_w_, *qkv_b_, *proj_w_, *proj_b_;
  bool keep_probabilities_ = false;  // KeepTokenImportance
};

// An (acctfm.txt §4.3.1) of `samples` samples from host probabilities
// [samples, H, T, T] (rows are queries): per sample and key token t, the
// sum over the H heads and the T queries of probs[., h, q, t], summed in
// double and rounded once. Shared with the 3-D layout's attention
// (cube_units.h), whose ranks each hold some samples' and heads' part.
std::vector<float> AttentionColumnSums(const float* probs, int64_t samples, int64_t H, int64_t T);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_ATTENTION_UNIT_H_
