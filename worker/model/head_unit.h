// Unit "head": loss = mean CrossEntropy(ln_f(x) wte^T, targets).
// Parameters: ln_f.weight/bias [d] and wte.weight [vocab, d], the tied copy
// of the token embedding (GPT-2 ties the LM head to wte). In one process
// GptModel makes both units share one buffer; across workers each holds a
// copy and their gradients are summed before the optimizer step.
#ifndef PIPETRAIN_WORKER_MODEL_HEAD_UNIT_H_
#define PIPETRAIN_WORKER_MODEL_HEAD_UNIT_H_

#include "worker/model/unit.h"

namespace pipetrain {

class HeadUnit : public Unit {
 public:
  HeadUnit(const GptConfig& config, Backend* backend);
  Tensor Forward(const Tensor& x, const TokenBatch& batch, UnitContext* ctx) override;
  Tensor Backward(const Tensor& dy, const TokenBatch& batch, const UnitContext& ctx) override;

 private:
  enum Slot { kX, kLnOut, kLnMean, kLnRstd, kProbs, kNumSlots };
  GptConfig config_;
  Parameter *ln_w_, *ln_b_, *wte_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_HEAD_UNIT_H_
