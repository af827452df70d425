// Unit "embed": x = wte[token] + wpe[position].
// Parameters: wte.weight [vocab, d] (tied with the head), wpe.weight
// [max_seq_len, d]. Saves nothing: backward needs only the tokens.
#ifndef PIPETRAIN_WORKER_MODEL_EMBED_UNIT_H_
#define PIPETRAIN_WORKER_MODEL_EMBED_UNIT_H_

#include "worker/model/unit.h"

namespace pipetrain {

class EmbedUnit : public Unit {
 public:
  EmbedUnit(const GptConfig& config, Backend* backend);
  Tensor Forward(const Tensor& x, const TokenBatch& batch, UnitContext* ctx) override;
  Tensor Backward(const Tensor& dy, const TokenBatch& batch, const UnitContext& ctx) override;

 private:
  GptConfig config_;
  Parameter* wte_;
  Parameter* wpe_;
};

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_EMBED_UNIT_H_
