// GPT-2 input embedding: out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :].
//
// tokens [batch*seq_len] int32 in [0, vocab); wte [vocab, c]; wpe [>= seq_len, c];
// out [batch*seq_len, c]. Backward ACCUMULATES into dwte and dwpe (scatter-add:
// a token that occurs twice gets both gradients).
#ifndef PIPETRAIN_KERNELS_CPU_EMBEDDING_H_
#define PIPETRAIN_KERNELS_CPU_EMBEDDING_H_

#include <cstdint>

namespace pipetrain {

void EmbeddingForward(const int32_t* tokens, const float* wte, const float* wpe, int batch,
                      int seq_len, int c, float* out);

void EmbeddingBackward(const int32_t* tokens, const float* dout, int batch, int seq_len, int c,
                       float* dwte, float* dwpe);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CPU_EMBEDDING_H_
