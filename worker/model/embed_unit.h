// Unit "embed": x = wte[token] + wpe[position].
// Parameters: wte.weight [vocab, d] (tied with the head), wpe.weight
// [max_seq_len, d]. Saves nothing: backward needs only the tokens.
// Tensor-parallel (tensor_parallel.h): rank r of T holds wte's rows
// [r V/T, (r+1) V/T) and all of wpe; each rank embeds the tokens of its
// rows (0 for the others, wpe added on rank 0) and the group sums them,
// which is exact (kernels/cpu/vocab_parallel.h). Device backends run that
// step on the host for now (a copy of the slice each way).
#ifndef PIPETRAIN_WORKER_MODEL_EMBED_UNIT_H_
#define PIPETRAIN_WORKER_MODEL_EMBED_UNIT_H_

#include "worker/model/unit.h"

namespace pipetrain {

class EmbedUnit : public Unit {
 public:
  EmbedUnit(const GptConfig& config, Backend* backend, TensorParallelComm* tp = nullptr);
  Tensor Forward(const Tensor& x, const TokenBatch& batch, UnitContext* ctx) override;
  Tensor Backward(const Tensor& dy, const TokenBatch& batch, const UnitContext& ctx) override;

 private:
  // The tensor-parallel forward and backward (see the file comment).
  Tensor SplitVocabForward(const TokenBatch& batch);
  void SplitVocabBackward(const Tensor& dy, const TokenBatch& batch);

  GptConfig config_;
  Parameter* wte_;
  Parameter* wpe_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_EMBED_UNIT_H_
