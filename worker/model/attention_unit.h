// Unit "attn_i": y = x + c_proj(CausalSelfAttention(c_attn(ln_1(x)))).
// Parameters (Hugging Face names, Conv1D (in, out) layout):
//   h.i.ln_1.weight/bias [d], h.i.attn.c_attn.weight [d, 3d] / bias [3d],
//   h.i.attn.c_proj.weight [d, d] / bias [d].
#ifndef PIPETRAIN_WORKER_MODEL_ATTENTION_UNIT_H_
#define PIPETRAIN_WORKER_MODEL_ATTENTION_UNIT_H_

#include "worker/model/unit.h"

namespace pipetrain {

class AttentionUnit : public Unit {
 public:
  AttentionUnit(const GptConfig& config, int layer, Backend* backend);
  Tensor Forward(const Tensor& x, const TokenBatch& batch, UnitContext* ctx) override;
  Tensor Backward(const Tensor& dy, const TokenBatch& batch, const UnitContext& ctx) override;
  // An[b, t] = sum over heads h and queries q of probs[b, h, q, t]: how much
  // attention token t receives from the whole sequence (acctfm §4.3.1).
  std::vector<float> TokenImportance(const UnitContext& ctx) const override;

 private:
  // Slots of UnitContext::saved.
  enum Slot { kX, kLnOut, kLnMean, kLnRstd, kQkv, kProbs, kAttOut, kNumSlots };
  GptConfig config_;
  Parameter *ln_w_, *ln_b_, *qkv_w_, *qkv_b_, *proj_w_, *proj_b_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_ATTENTION_UNIT_H_
