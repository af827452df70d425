// Unit "head": loss = mean CrossEntropy(ln_f(x) wte^T, targets).
// Parameters: ln_f.weight/bias [d] and wte.weight [vocab, d], the tied copy
// of the token embedding (GPT-2 ties the LM head to wte). In one process
// GptModel makes both units share one buffer; across workers each holds a
// copy and their gradients are summed before the optimizer step.
// Tensor-parallel (tensor_parallel.h): rank r of T holds wte's rows
// [r V/T, (r+1) V/T), computes those logit columns only and the
// cross-entropy over the split vocabulary (kernels/cpu/vocab_parallel.h):
// all-reduces of per-row maxima, exp sums and target logits instead of the
// [n, V] logits; dL/d(ln_f output) is all-reduced in backward. The softmax
// steps run on the host for now (device backends copy the logits over).
#ifndef PIPETRAIN_WORKER_MODEL_HEAD_UNIT_H_
#define PIPETRAIN_WORKER_MODEL_HEAD_UNIT_H_

#include "worker/model/unit.h"

namespace pipetrain {

class HeadUnit : public Unit {
 public:
  HeadUnit(const GptConfig& config, Backend* backend, TensorParallelComm* tp = nullptr);
  Tensor Forward(const Tensor& x, const TokenBatch& batch, UnitContext* ctx) override;
  Tensor Backward(const Tensor& dy, const TokenBatch& batch, const UnitContext& ctx) override;

 private:
  // kLossState: what the backward reads of the loss, from
  // Backend::HeadLossForward (the probabilities, or a device backend's bf16
  // gradient), or the split vocabulary's probabilities.
  enum Slot { kX, kLnOut, kLnMean, kLnRstd, kLossState, kNumSlots };
  // The row stride of the logits, probabilities and their gradient: the
  // backend's (Backend::LogitsRowStride), or packed for a split vocabulary
  // (its softmax steps run on the host over packed rows).
  int LogitsLd() const;
  // The tensor-parallel cross-entropy of local logits [n, V/T], which it
  // turns into probabilities in place; returns the mean loss.
  float SplitVocabCrossEntropy(Tensor& logits, const TokenBatch& batch);
  GptConfig config_;
  Parameter *ln_w_, *ln_b_, *wte_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_HEAD_UNIT_H_
