// Where a GPT-2 step's GEMM time goes, product by product: each of the
// model's matrix products, through the backend op the model calls for it,
// timed alone at the model's shape, with its rate:
//   - LinearForward with the bias (qkv), LinearGeluForward for the MLP's
//     first layer (its row includes the bias-GELU pass, fused on a GPU,
//     as the model runs it), LinearForwardResidual for the blocks' last
//     layers (attn.c_proj, mlp.c_proj), LinearBackward with the bias;
//   - LmHeadForward over the backend's padded logits, and
//     LmHeadLossBackward from what HeadLossForward keeps (on the CUDA
//     backend with bf16 copies: the products from the saved bf16
//     gradient; by default: the cross-entropy's backward pass, then the
//     products).
// The training-step benchmark prints it on a GPU, so one run shows which
// shapes fall short of the square-GEMM ceiling (the per-op table only sums
// a kind over layers).
#ifndef PIPETRAIN_WORKER_MODEL_MODEL_GEMM_PROBE_H_
#define PIPETRAIN_WORKER_MODEL_MODEL_GEMM_PROBE_H_

#include <string>
#include <vector>

#include "worker/model/backend.h"
#include "worker/model/gpt_config.h"

namespace pipetrain {

struct ModelGemmTiming {
  std::string name;    // e.g. "mlp.c_fc backward"
  std::string shape;   // e.g. "8192 x 768 -> 3072"
  double flops = 0;    // one call's: 2 n in out forward, twice that backward
  double seconds = 0;  // the fastest call, to the backend's Synchronize
};

// The 10 products of one block and the LM head (attention's qkv and
// output projections, the MLP's two layers, the head; forward and
// backward each) for `tokens` rows, on N(0, 1) inputs (a block of draws
// repeated), each the fastest of
// `reps` calls after one untimed call. Requires tokens >= 1, reps >= 1 and
// a valid config. Empty if the backend reports an error.
std::vector<ModelGemmTiming> MeasureModelGemms(Backend* backend, const GptConfig& config,
                                               int tokens, int reps);

}  // namespace pipetrain

#endif  // PIPETRAIN_WORKER_MODEL_MODEL_GEMM_PROBE_H_
