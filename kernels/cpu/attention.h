// Causal multi-head self-attention core (between the qkv projection and the
// output projection of a GPT-2 block).
//
// qkv [batch, seq_len, 3c] holds q, k, v side by side (GPT-2's c_attn output
// order); heads split c into `heads` slices of head_dim = c / heads.
// Forward: per (batch, head), S = q k^T / sqrt(head_dim), masked so position
// t sees only positions <= t, P = softmax(S) row-wise, out = P v, written to
// out [batch, seq_len, c] (heads concatenated). P is stored in
// probs [batch, heads, seq_len, seq_len] (zeros above the diagonal) for the
// backward pass. Backward writes dqkv (all of it) from dout, qkv and probs.
// `scratch` needs seq_len * seq_len floats.
#ifndef PIPETRAIN_KERNELS_CPU_ATTENTION_H_
#define PIPETRAIN_KERNELS_CPU_ATTENTION_H_

#include <cstdint>

namespace pipetrain {

void AttentionForward(const float* qkv, int batch, int seq_len, int c, int heads, float* out,
                      float* probs);

void AttentionBackward(const float* qkv, const float* probs, const float* dout, int batch,
                       int seq_len, int c, int heads, float* dqkv, float* scratch);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CPU_ATTENTION_H_
