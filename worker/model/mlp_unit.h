// Unit "mlp_i": y = x + c_proj(GELU(c_fc(ln_2(x)))), hidden size 4d.
// Parameters: h.i.ln_2.weight/bias [d], h.i.mlp.c_fc.weight [d, 4d] /
// bias [4d], h.i.mlp.c_proj.weight [4d, d] / bias [d].
// Tensor-parallel (tensor_parallel.h): rank r of T holds c_fc's columns
// [r 4d/T, (r+1) 4d/T) and c_proj's matching rows; the output is
// all-reduced before the residual, dL/d(ln_2 output) before the
// LayerNorm's backward. With the group's hybrid compression (acctfm.txt
// §4.3) only the tokens whose partial outputs have the largest squared
// norms summed over the ranks are all-reduced (the paper ranks tokens by
// attention, which an MLP does not have), the others' outputs are 0, and
// the backward sums the same tokens' gradients.
#ifndef PIPETRAIN_WORKER_MODEL_MLP_UNIT_H_
#define PIPETRAIN_WORKER_MODEL_MLP_UNIT_H_

#include "worker/model/unit.h"

namespace pipetrain {

class MlpUnit : public Unit {
 public:
  MlpUnit(const GptConfig& config, int layer, Backend* backend, TensorParallelComm* tp = nullptr);
  Tensor Forward(const Tensor& x, const TokenBatch& batch, UnitContext* ctx) override;
  Tensor Backward(const Tensor& dy, const TokenBatch& batch, const UnitContext& ctx) override;
  // Partitioned all-reduces stream into the next unit (Unit::set_stream_output).
  bool streams_tensor_parallel() const override { return true; }

 private:
  // kKept (each row's kept flag, Unit::StartTensorParallelTokenSparseSum)
  // only when the group compresses.
  enum Slot { kX, kLnOut, kLnMean, kLnRstd, kFcOut, kGeluOut, kNumSlots, kKept = kNumSlots };
  GptConfig config_;
  Parameter *ln_w_, *ln_b_, *fc_w_, *fc_b_, *proj_w_, *proj_b_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_MLP_UNIT_H_
