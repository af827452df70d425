// Vocabulary-parallel embedding and cross-entropy (Megatron-style tensor
// parallelism, acctfm.txt §3.2; DESIGN.md §12): each of T ranks holds rows
// [vocab_begin, vocab_end) of the token embedding wte, and the tied LM head
// computes only those columns of the logits. The kernels below are the
// per-rank halves; the caller sums their outputs over the ranks (an
// all-reduce) between the calls, so the full [n, vocab] logits never exist
// on one rank.
//
// Embedding: a rank's partial output is its own wte row for the tokens in
// its range and 0 for the others, plus wpe on the one rank that passes it.
// Summed over the ranks each element has at most two non-zero terms (its wte
// value and its wpe value), so the sum is exact in any order and equals
// EmbeddingForward's te + pe bit for bit. The backward visits rows in
// EmbeddingBackward's order, so dwte's slice and dwpe are bitwise that
// function's too.
//
// Cross-entropy over a split vocabulary, for n rows of local logits
// [n, local_vocab] (local_vocab = vocab_end - vocab_begin):
//   1. VocabSliceRowMax: each row's local maximum; the caller takes the
//      maximum over the ranks (M).
//   2. VocabSliceSoftmaxPartials: writes e = exp(logit - M) into `probs` and
//      per row the partial sum of e and, on the rank owning the row's
//      target, its logit minus M (0 elsewhere); the caller sums both over
//      the ranks (Z and target - M).
//   3. VocabSliceSoftmaxFinish: probs /= Z and returns the mean loss
//      (1/n) sum_i (log Z_i - (target_i - M_i)), accumulated in double as
//      SoftmaxCrossEntropyForward does.
//   Backward: VocabSliceCrossEntropyBackward, dlogits = (probs - onehot of
//   the targets in this range) * dloss / n.
// The loss equals the unsplit kernel's within rounding (Z is summed in
// another order); exp is FastExp, as there.
#ifndef PIPETRAIN_KERNELS_CPU_VOCAB_PARALLEL_H_
#define PIPETRAIN_KERNELS_CPU_VOCAB_PARALLEL_H_

#include <cstdint>

namespace pipetrain {

// out[row] = (tokens[row] in [vocab_begin, vocab_end) ? wte_slice[tokens[row]
// - vocab_begin] : 0) + (wpe ? wpe[t] : 0), row = b * seq_len + t. wte_slice
// [vocab_end - vocab_begin, c]; wpe [>= seq_len, c] or null; out
// [batch * seq_len, c].
void VocabSliceEmbeddingForward(const int32_t* tokens, const float* wte_slice, const float* wpe,
                                int batch, int seq_len, int c, int vocab_begin, int vocab_end,
                                float* out);

// ACCUMULATES dwte_slice[tokens[row] - vocab_begin] += dout[row] for the
// tokens in range and dwpe[t] += dout[row] for every row (dwpe may be null).
void VocabSliceEmbeddingBackward(const int32_t* tokens, const float* dout, int batch, int seq_len,
                                 int c, int vocab_begin, int vocab_end, float* dwte_slice,
                                 float* dwpe);

// row_max[i] = max_j logits[i, j] over the local_vocab columns (>= 1).
void VocabSliceRowMax(const float* logits, int n, int local_vocab, float* row_max);

// probs[i, j] = exp(logits[i, j] - global_max[i]); sum_exp[i] = sum_j of
// those; target_shifted[i] = logits[i, targets[i] - vocab_begin] -
// global_max[i] when targets[i] is in [vocab_begin, vocab_begin +
// local_vocab), else 0. probs may alias logits.
void VocabSliceSoftmaxPartials(const float* logits, const int32_t* targets, int n, int local_vocab,
                               int vocab_begin, const float* global_max, float* probs,
                               float* sum_exp, float* target_shifted);

// probs[i, :] /= total_sum_exp[i]; returns (1/n) sum_i (log total_sum_exp[i]
// - total_target_shifted[i]), the mean cross-entropy.
float VocabSliceSoftmaxFinish(const float* total_sum_exp, const float* total_target_shifted, int n,
                              int local_vocab, float* probs);

// dlogits = (probs - onehot(targets in range)) * dloss / n; may alias probs.
void VocabSliceCrossEntropyBackward(const float* probs, const int32_t* targets, int n,
                                    int local_vocab, int vocab_begin, float dloss, float* dlogits);

}  // namespace pipetrain

#endif  // PIPETRAIN_KERNELS_CPU_VOCAB_PARALLEL_H_
