// Unit "mlp_i": y = x + c_proj(GELU(c_fc(ln_2(x)))), hidden size 4d.
// Parameters: h.i.ln_2.weight/bias [d], h.i.mlp.c_fc.weight [d, 4d] /
// bias [4d], h.i.mlp.c_proj.weight [4d, d] / bias [d].
#ifndef PIPETRAIN_WORKER_MODEL_MLP_UNIT_H_
#define PIPETRAIN_WORKER_MODEL_MLP_UNIT_H_

#include "worker/model/unit.h"

namespace pipetrain {

class MlpUnit : public Unit {
 public:
  MlpUnit(const GptConfig& config, int layer, Backend* backend);
  Tensor Forward(const Tensor& x, const TokenBatch& batch, UnitContext* ctx) override;
  Tensor Backward(const Tensor& dy, const TokenBatch& batch, const UnitContext& ctx) override;

 private:
  enum Slot { kX, kLnOut, kLnMean, kLnRstd, kFcOut, kGeluOut, kNumSlots };
  GptConfig config_;
  Parameter *ln_w_, *ln_b_, *fc_w_, *fc_b_, *proj_w_, *proj_b_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_MLP_UNIT_H_
