// GPT-2 input embedding on the GPU, the CUDA twin of kernels/cpu/embedding.h:
//   out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :]
// Backward ACCUMULATES (scatter-add) into dwte and dwpe, as on the CPU: a
// token that occurs twice gets both gradients.
//
// Layouts as on the CPU, all device pointers: tokens [batch * seq_len] int32;
// wte, dwte [vocab, c]; wpe, dwpe [>= seq_len, c]; out, dout
// [batch * seq_len, c]. Outputs must not overlap inputs or each other.
//
// Forward: `vocab` (the rows of wte) is an argument because the GPU cannot
// report a bad token id to the host cheaply: a token outside [0, vocab)
// turns its output row into NaN (instead of reading outside wte). Callers
// validate tokens on the host, as worker/model/embed_unit.cc does.
//
// Backward takes, instead of the tokens, their rows grouped by token:
// `token_rows` is the device copy of GroupRowsByToken's index
// (kernels/cpu/embedding.h; built on the host, where the ids are) and
// `groups` its group count. One thread block per token that occurs adds
// that token's rows, so the work is O(batch * seq_len * c) whatever the
// vocabulary (one scan of the batch per vocabulary row would be
// O(vocab * batch * seq_len): ~50K scans of the batch for GPT-2). Rows the
// index left out (tokens outside the vocabulary) add nothing to dwte; their
// dwpe contribution stays. The index is trusted: its tokens must be rows
// of dwte and its rows rows of dout.
//
// Results equal the CPU's bitwise: forward is one fp32 addition per element,
// and backward adds every gradient row in the CPU's order (row order per
// token for dwte, batch order for dwpe) without atomics, so it is also
// deterministic run to run.
//
// The work is queued on `stream`; these return before it finishes.
// INVALID_ARGUMENT if batch < 0, seq_len < 0 or c < 1, for the forward if
// vocab < 1, for the backward if groups is outside [0, batch * seq_len] or
// batch * seq_len exceeds INT32_MAX (row numbers are int32); INTERNAL if a
// launch fails. batch * seq_len == 0 launches nothing. Thread-safe (no
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

absl::Status EmbeddingBackwardCuda(const int32_t* token_rows, int groups, const float* dout,
                                   int batch, int seq_len, int c, float* dwte, float* dwpe,
                                   cudaStream_t stream = nullptr);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CUDA_EMBEDDING_H_
