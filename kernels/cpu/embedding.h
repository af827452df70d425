// GPT-2 input embedding: out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :].
//
// tokens [batch*seq_len] int32 in [0, vocab); wte [vocab, c]; wpe [>= seq_len, c];
// out [batch*seq_len, c]. Backward ACCUMULATES into dwte and dwpe (scatter-add:
// a token that occurs twice gets both gradients).
#ifndef PIPETRAIN_KERNELS_CPU_EMBEDDING_H_
#define PIPETRAIN_KERNELS_CPU_EMBEDDING_H_

#include <cstdint>
#include <vector>

namespace pipetrain {

void EmbeddingForward(const int32_t* tokens, const float* wte, const float* wpe, int batch,
                      int seq_len, int c, float* out);

void EmbeddingBackward(const int32_t* tokens, const float* dout, int batch, int seq_len, int c,
                       float* dwte, float* dwpe);

// The rows of a token batch grouped by token id: the index with which the
// CUDA embedding backward (kernels/cuda/embedding.h) adds each token's
// gradient rows into its table row in the CPU's order, one token per thread
// block, instead of scanning the whole batch once per vocabulary row. Built
// on the host, where the token ids are, as one int32 array so that it
// crosses to a device in one copy. Layout of `index`, with G = groups:
//   index[0, G)            the token ids that occur, increasing
//   index[G, 2G + 1)       start: group g's rows are rows[start[g], start[g+1])
//   index[2G + 1, ...)     rows: row numbers (b * seq_len + t), grouped by
//                          token, increasing within a group
// Rows whose token lies outside [0, vocab) are left out and counted in
// `dropped` (EmbeddingBackward would write outside the table for them).
struct TokenRowGroups {
  int32_t groups = 0;
  int64_t dropped = 0;
  std::vector<int32_t> index;

  const int32_t* tokens() const { return index.data(); }
  const int32_t* starts() const { return index.data() + groups; }
  const int32_t* rows() const { return index.data() + 2 * static_cast<int64_t>(groups) + 1; }
};

// Requires 0 <= rows <= INT32_MAX (row numbers are int32) and vocab >= 0.
// O(rows log rows) time, independent of vocab.
TokenRowGroups GroupRowsByToken(const int32_t* tokens, int64_t rows, int vocab);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CPU_EMBEDDING_H_
