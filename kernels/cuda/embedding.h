// GPT-2 input embedding on the GPU, the CUDA twin of kernels/cpu/embedding.h:
//   out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :]
// Backward ACCUMULATES (scatter-add) into dwte and dwpe, as on the CPU: a
// token that occurs twice gets both gradients.
//
// Layouts as on the CPU, all device pointers: tokens [batch * seq_len] int32;
// wte, dwte [vocab, c]; wpe, dwpe [>= seq_len, c]; out, dout
// [batch * seq_len, c]. Outputs must not overlap inputs or each other.
// `vocab` (the rows of wte) is an argument here because the GPU cannot
// report a bad token id to the host cheaply: a token outside [0, vocab)
// turns its output row into NaN in the forward pass (instead of reading
// outside wte) and contributes nothing to dwte in the backward pass (its
// dwpe contribution stays). Callers validate tokens on the host, as
// worker/model/embed_unit.cc does.
//
// Results equal the CPU's bitwise: forward is one fp32 addition per element,
// and backward adds every gradient row in the CPU's order (token order),
// without atomics, so it is also deterministic run to run. The backward pass
// runs one block per row of wte and each block scans all batch * seq_len
// tokens, i.e. O(vocab * batch * seq_len) work: fine for tests and small
// vocabularies, slow for GPT-2's 50257 (a sort-by-token variant is the next
// step if it shows in profiles).
//
// The work is queued on `stream`; these return before it finishes.
// INVALID_ARGUMENT if batch < 0, seq_len < 0, c < 1 or vocab < 1; INTERNAL
// if a launch fails. batch * seq_len == 0 launches nothing. Thread-safe (no
// state).
#ifndef PIPETRAIN_KERNELS_CUDA_EMBEDDING_H_
#define PIPETRAIN_KERNELS_CUDA_EMBEDDING_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace pipetrain {

absl::Status EmbeddingForwardCuda(const int32_t* tokens, const float* wte, const float* wpe,
                                  int batch, int seq_len, int c, int vocab, float* out,
                                  cudaStream_t stream = nullptr);

absl::Status EmbeddingBackwardCuda(const int32_t* tokens, const float* dout, int batch,
                                   int seq_len, int c, int vocab, float* dwte, float* dwpe,
                                   cudaStream_t stream = nullptr);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_EMBEDDING_H_
